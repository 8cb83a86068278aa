// microbench/profiler.cpp — the measurement grid, the CPU runners (the executor's own kernels) and
// the validation cases (see profiler.h).
#include "microbench/profiler.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/cpu_features.h"
#include "executor/cpu/matmul.h"
#include "executor/cpu/ops.h"
#include "executor/cuda/cuda_device.h"
#include "executor/model/cpu_blocks.h"
#include "executor/model/moe_routing.h"
#include "executor/ops/op_table.h"
#include "microbench/bench_data.h"
#include "microbench/gpu_bench.h"

namespace shardwise {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
constexpr int kBurstCopies = 16;  // copies per burst row (a qwen30b layer's routed experts go as 24)

// ---- repeats -------------------------------------------------------------------------------------

struct Stat {
  double ms = 0, spread = 0;
  int repeats = 0;
};

struct Policy {
  int min_reps = 3, max_reps = 12;
  double min_total_ms = 20;
};

// A warm-up run, then repeats until min_reps and min_total_ms are reached (or max_reps); a noisy
// result (spread > 25%) gets one more round and the median over both.
Stat measure(const std::function<double()>& once, const Policy& p) {
  once();
  std::vector<double> t;
  double total = 0;
  auto round = [&] {
    const size_t start = t.size();
    while (static_cast<int>(t.size() - start) < p.max_reps) {
      const double ms = once();
      t.push_back(ms);
      total += ms;
      if (static_cast<int>(t.size() - start) >= p.min_reps && total >= p.min_total_ms) break;
    }
  };
  round();
  auto stats = [&] {
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    Stat r;
    r.ms = s[s.size() / 2];
    if (s.size() % 2 == 0) r.ms = 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
    r.spread = r.ms > 0 ? (s.back() - s.front()) / r.ms : 0;
    r.repeats = static_cast<int>(s.size());
    return r;
  };
  Stat r = stats();
  if (r.spread > 0.25 && t.size() < 40) {
    total = 0;
    round();
    r = stats();
  }
  return r;
}

// ---- random weights of every dtype ------------------------------------------------------------------

void fill_floats(float* v, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint64_t i = 0; i < n; ++i) v[i] = u(rng);
}
void fill_floats(std::vector<float>& v, uint64_t seed) {
  fill_floats(v.data(), v.size(), seed);
}

// A rotated weight set: copies of one matrix laid out back to back over a buffer larger than the LLC.
class WeightSet {
 public:
  WeightSet(uint64_t bytes, ThreadPool& pool) : buf_(bytes), pool_(pool) {
    madvise(buf_.data(), buf_.size(), MADV_HUGEPAGE);  // as the executor's weight buffers
  }
  void use(DType dt) {
    if (filled_ == static_cast<int>(dt)) return;
    fill_random(dt, buf_.data(), buf_.size(), 1000 + static_cast<uint64_t>(dt), pool_);
    filled_ = static_cast<int>(dt);
  }
  // The next copy of a matrix of `bytes` (whole blocks), rotating.
  const uint8_t* next(uint64_t bytes) {
    const uint64_t copies = std::max<uint64_t>(1, buf_.size() / bytes);
    const uint64_t i = (turn_++) % copies;
    return buf_.data() + i * bytes;
  }
  uint64_t size() const { return buf_.size(); }
  uint8_t* data() { return buf_.data(); }

 private:
  HostBuffer buf_;
  ThreadPool& pool_;
  int filled_ = -1;
  uint64_t turn_ = 0;
};

// ---- CPU runners (the executor's kernels) ------------------------------------------------------------

class CpuRunner {
 public:
  // Data is filled by the largest measuring pool itself: a second pool of as many threads would
  // spin its workers after each fill on the cores the measured threads need.
  CpuRunner(uint64_t weight_set_bytes, int max_threads)
      : fill_pool_(pool(max_threads)), weights_(weight_set_bytes, fill_pool_) {}

  ThreadPool& pool(int threads) {
    auto it = pools_.find(threads);
    if (it == pools_.end()) it = pools_.emplace(threads, std::make_unique<ThreadPool>(threads)).first;
    return *it->second;
  }

  // One timed sample (wall clock, ms per run). The pool's workers are woken first (untimed), as they
  // are between the blocks of a step: otherwise a short op would time their wake-up from sleep. A
  // short op is timed as a burst of back-to-back runs (matmuls on rotated weight copies), as the
  // blocks of a step follow each other, and the burst's time is divided by its runs: a one-off
  // hiccup of the machine (a descheduled worker costs ~0.5 ms on the GPU host) no longer decides a
  // 10 µs op's median. The burst size comes from the op's previous sample (the warm-up's).
  double once(const Op& op, int threads) {
    ThreadPool& p = pool(threads);
    cur_ = &p;
    const std::string key = std::to_string(threads) + "/" + op_shape_key(op);
    const auto prev = last_ms_.find(key);
    const int cap = max_burst(op.kind);
    reps_ = 1;
    if (prev != last_ms_.end() && prev->second > 0)
      reps_ = static_cast<int>(std::min<double>(cap, std::max(1.0, std::ceil(kBurstMs / prev->second))));
    double ms = 0;
    switch (op.kind) {
      case OpKind::Matmul:
        ms = matmul(op, p);
        break;
      case OpKind::Attention:
        ms = attention(op, p);
        break;
      case OpKind::MoeExperts:
        ms = moe(op, p);
        break;
      case OpKind::Norm:
        ms = norm(op);
        break;
      case OpKind::Rope:
        ms = rope_op(op);
        break;
      case OpKind::Elementwise:
        ms = elementwise(op);
        break;
      case OpKind::Embed:
        ms = embed(op);
        break;
      default:
        fail("profile: no CPU runner for ", op_kind_name(op.kind));
    }
    last_ms_[key] = ms;
    return ms;
  }

  // Streaming read of a buffer larger than the LLC with `threads` threads (GB/s).
  double dram_gbps(int threads) {
    ThreadPool& p = pool(threads);
    auto once = [&] {
      const auto t0 = Clock::now();
      read_weight_set(p);
      return ms_since(t0);
    };
    const Stat s = measure(once, {3, 6, 50});
    return static_cast<double>(weights_.size()) / (s.ms * 1e6);
  }

 private:
  static constexpr double kBurstMs = 3.0;  // a short op's burst lasts about this long
  // Ops that update their input in place (MoE adds to the residual, rope rotates, SwiGLU scales)
  // run few times per burst so their data stays in range; the others up to 64.
  static int max_burst(OpKind k) {
    return k == OpKind::MoeExperts || k == OpKind::Elementwise || k == OpKind::Rope ? 4 : 64;
  }

  // Wakes the pool's workers (untimed) right before the clock starts.
  Clock::time_point start() {
    if (cur_) cur_->run_on_all([](int) {});
    return Clock::now();
  }
  // Milliseconds per run of the burst started at t0.
  double per_run(Clock::time_point t0) const { return ms_since(t0) / reps_; }

  void ensure(std::vector<float>& v, uint64_t n, uint64_t seed) {
    if (v.size() < n) {
      v.resize(n);
      fill_floats(v, seed);
    }
  }
  // n cache elements of dt (f32, or f16 stored two to a float slot), random and finite.
  void ensure_kv(std::vector<float>& v, DType dt, uint64_t n, uint64_t seed) {
    const uint64_t floats = (dtype_row_bytes(dt, static_cast<int64_t>(n)) + sizeof(float) - 1) / sizeof(float);
    if (v.size() >= floats && kv_filled_[seed % 2] == static_cast<int>(dt)) return;
    v.resize(std::max<uint64_t>(v.size(), floats));
    fill_random(dt, reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float), seed, fill_pool_);
    kv_filled_[seed % 2] = static_cast<int>(dt);
  }

  double matmul(const Op& op, ThreadPool& p) {
    weights_.use(op.dtype);
    const uint64_t wb = static_cast<uint64_t>(op.rows) * dtype_row_bytes(op.dtype, op.cols);
    ensure(x_, static_cast<uint64_t>(op.tokens * op.cols), 1);
    ensure(y_, static_cast<uint64_t>(op.tokens * op.rows), 2);
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r)
      matmul_raw(op.dtype, weights_.next(wb), op.rows, op.cols, x_.data(), op.cols, op.tokens, y_.data(), op.rows, p);
    return per_run(t0);
  }

  // The caches a step attends over come from DRAM (every layer has its own, and gigabytes of other
  // data pass between two reads of one): K and V rotate over the weight set (> the LLC) like weights.
  // One fixed K/V pair reused rep after rep stayed in the LLC up to ~8K positions (33 MB): 1-thread
  // rows read 10 GB/s there against 5 GB/s at 32K, and a filled 16K cache in a real step ran 5 GB/s.
  // The cache's element type is op.dtype (f32 or f16: the KV cache types the executor keeps).
  double attention(const Op& op, ThreadPool& p) {
    const int64_t kvd = op.n_kv_heads * op.head_dim, qd = op.n_heads * op.head_dim;
    const int64_t kv_len = op.ctx + op.tokens;
    const uint64_t kv_bytes = static_cast<uint64_t>(kv_len) * dtype_row_bytes(op.dtype, kvd);
    const bool rotate = 2 * kv_bytes <= weights_.size();
    if (rotate) {
      weights_.use(op.dtype);
    } else {  // larger than half the set: one pair already exceeds the LLC
      ensure_kv(k_, op.dtype, static_cast<uint64_t>(kv_len * kvd), 3);
      ensure_kv(v_, op.dtype, static_cast<uint64_t>(kv_len * kvd), 4);
    }
    ensure(x_, static_cast<uint64_t>(op.tokens * qd), 1);
    ensure(y_, static_cast<uint64_t>(op.tokens * qd), 2);
    pos_.resize(static_cast<size_t>(op.tokens));
    for (int64_t t = 0; t < op.tokens; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(op.ctx + t);
    AttentionShape shape = head_major({op.n_heads, op.n_kv_heads, op.head_dim}, kv_len);  // as KvCache
    shape.kv_dtype = op.dtype;
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r) {
      const void* k = rotate ? static_cast<const void*>(weights_.next(kv_bytes)) : k_.data();
      const void* v = rotate ? static_cast<const void*>(weights_.next(kv_bytes)) : v_.data();
      shardwise::attention(x_.data(), op.tokens, pos_.data(), k, v, kv_len, shape, y_.data(), p);
    }
    return per_run(t0);
  }

  // The FFN block of a qwen3_moe layer with `tokens` routed uniformly at random (top_k of n_experts).
  // Each run reads its experts from DRAM, as a step does (every layer has its own experts and a step
  // passes gigabytes between two reads of one). Reused run after run, qwen30b's 8 decode experts (21 MB
  // at q4_0) and even its whole 340 MB expert set stayed in the GPU host's 300 MB L3 (validation:
  // -15...-69%); flushing them after each run (clflush) cost the profile 100 s. Instead the layer has
  // replicas over at least twice the weight set (> the LLC), each run takes the next replica and a
  // fresh routing (both untimed), and the replica's ExpertDeck labels the routing's experts (a run
  // reads only its own: with random labels the runs before it on the replica had left enough of them
  // in the L3 that the block ran 1.05-1.22x faster than in the study's steps): between two reads of
  // one expert's bytes pass the replicas' whole size, at least twice the weight set.
  double moe(const Op& op, ThreadPool& p) {
    const std::string key = std::to_string(static_cast<int>(op.dtype)) + "/" + std::to_string(op.n_experts) + "/" +
                            std::to_string(op.rows) + "/" + std::to_string(op.cols);
    if (key != moe_key_) {
      moe_buf_ = HostBuffer();
      moe_layers_.clear();
      const uint64_t one = static_cast<uint64_t>(op.rows) * dtype_row_bytes(op.dtype, op.cols);  // gate or up
      const uint64_t down = static_cast<uint64_t>(op.cols) * dtype_row_bytes(op.dtype, op.rows);
      const uint64_t per = static_cast<uint64_t>(op.n_experts);
      const uint64_t set = per * (2 * one + down);
      const uint64_t replicas = std::max<uint64_t>(1, (2 * weights_.size() + set - 1) / set);
      moe_buf_ = HostBuffer(replicas * set);
      fill_random(op.dtype, moe_buf_.data(), set, 77, fill_pool_);
      uint8_t* base = moe_buf_.data();
      fill_pool_.parallel_for(static_cast<int64_t>((replicas - 1) * 64), 1, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {  // replica 1 + i / 64, its (i % 64)-th 64th
          const uint64_t r = 1 + static_cast<uint64_t>(i) / 64, part = static_cast<uint64_t>(i) % 64;
          const uint64_t lo = set * part / 64, hi = set * (part + 1) / 64;
          std::memcpy(base + r * set + lo, base + lo, hi - lo);
        }
      });
      for (uint64_t r = 0; r < replicas; ++r) {
        LayerWeights l;
        l.ffn_norm.assign(static_cast<size_t>(op.cols), 1.0f);
        auto view = [&](uint64_t off, Shape s) {
          TensorView v;
          v.dtype = op.dtype;
          v.shape = std::move(s);
          v.nbytes = tensor_bytes(op.dtype, v.shape);
          v.data = base + r * set + off;
          return v;
        };
        l.gate_exps = view(0, {op.n_experts, op.rows, op.cols});
        l.up_exps = view(per * one, {op.n_experts, op.rows, op.cols});
        l.down_exps = view(2 * per * one, {op.n_experts, op.cols, op.rows});
        moe_layers_.push_back(std::move(l));
      }
      moe_decks_.clear();
      for (uint64_t r = 0; r < replicas; ++r) moe_decks_.emplace_back(op.n_experts, 31 + r);
      moe_key_ = key;
    }
    const ModelSpec spec = moe_block_spec(op);
    auto it = blocks_.find(&p);
    if (it == blocks_.end() || it->second.first != moe_key_) {
      blocks_.erase(&p);
      it = blocks_.emplace(&p, std::make_pair(moe_key_, std::make_unique<CpuBlocks>(spec, RopeStyle::Neox, p))).first;
    }
    std::vector<float> logits(static_cast<size_t>(op.tokens * op.n_experts));
    ensure(x_, static_cast<uint64_t>(op.tokens * op.cols), 1);
    double ms = 0;
    for (int r = 0; r < reps_; ++r) {
      fill_floats(logits, 5 + static_cast<uint64_t>(++moe_turn_));
      const size_t replica = static_cast<size_t>(moe_turn_ % moe_layers_.size());
      const MoeRouting routing = moe_decks_[replica].next(logits.data(), op.tokens, op.top_k);
      const LayerWeights& layer = moe_layers_[replica];
      const auto t0 = start();
      it->second.second->ffn(layer, x_.data(), op.tokens, &routing);
      ms += ms_since(t0);
    }
    ms /= reps_;
    fill_floats(x_.data(), static_cast<uint64_t>(op.tokens * op.cols), 1);  // keep the residual stream bounded
    return ms;
  }

  // Reads every float of the weight set (> the LLC) once with the pool's threads; returns their sum.
  double read_weight_set(ThreadPool& p) {
    weights_.use(DType::F32);
    const uint64_t n = weights_.size() / sizeof(float);
    const float* a = reinterpret_cast<const float*>(weights_.data());
    std::vector<double> sums(static_cast<size_t>(p.size()) * 8, 0.0);
    p.parallel_for(static_cast<int64_t>(n / 4096), 64, [&](int64_t b, int64_t e, int t) {
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b * 4096; i < e * 4096; i += 4) {
        s0 += a[i];
        s1 += a[i + 1];
        s2 += a[i + 2];
        s3 += a[i + 3];
      }
      sums[static_cast<size_t>(t) * 8] += s0 + s1 + s2 + s3;
    });
    double total = 0;
    for (double v : sums) total += v;
    return total;
  }

  // Norm: RMSNorm over rows of 4096 (the per-row width only changes the row count).
  double norm(const Op& op) {
    const int64_t dim = 4096, rows = std::max<int64_t>(1, op.elems / dim);
    ensure(x_, static_cast<uint64_t>(rows * dim), 1);
    ensure(y_, static_cast<uint64_t>(rows * dim), 2);
    ensure(w_, static_cast<uint64_t>(dim), 6);
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r) rms_norm(x_.data(), w_.data(), 1e-6f, y_.data(), rows, dim);
    return per_run(t0);
  }

  double rope_op(const Op& op) {
    const int64_t hd = 128, heads = 32, width = heads * hd;
    const int64_t n = std::max<int64_t>(1, op.elems / width);
    ensure(y_, static_cast<uint64_t>(n * width), 2);
    if (angles_.n_tokens != n) {
      pos_.resize(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(1000 + t);
      angles_.compute(pos_.data(), n, hd, 1e6);
    }
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r) rope(y_.data(), n, heads, hd, angles_, RopeStyle::Neox);
    const double ms = per_run(t0);
    fill_floats(y_.data(), static_cast<uint64_t>(n * width), 2);
    return ms;
  }

  double elementwise(const Op& op) {
    ensure(x_, static_cast<uint64_t>(op.elems), 1);
    ensure(y_, static_cast<uint64_t>(op.elems), 2);
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r) swiglu(y_.data(), x_.data(), op.elems);
    const double ms = per_run(t0);
    fill_floats(y_.data(), static_cast<uint64_t>(op.elems), 2);
    return ms;
  }

  double embed(const Op& op) {
    weights_.use(DType::F16);
    const int64_t h = 4096, n = std::max<int64_t>(1, op.elems / h);
    TensorView table;
    table.dtype = DType::F16;
    table.shape = {static_cast<int64_t>(std::min<uint64_t>(weights_.size() / (h * 2), 131072)), h};
    table.nbytes = tensor_bytes(DType::F16, table.shape);
    table.data = weights_.data();
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % table.shape[0]);
    ensure(y_, static_cast<uint64_t>(n * h), 2);
    const auto t0 = start();
    for (int r = 0; r < reps_; ++r) embed_rows(table, ids.data(), n, y_.data());
    return per_run(t0);
  }

  std::map<int, std::unique_ptr<ThreadPool>> pools_;  // by thread count; declared before its users
  ThreadPool& fill_pool_;
  WeightSet weights_;
  ThreadPool* cur_ = nullptr;
  std::vector<float> x_, y_, k_, v_, w_;
  int kv_filled_[2] = {-1, -1};  // the dtype k_ (seed 3) and v_ (seed 4) hold
  std::vector<int32_t> pos_;
  RopeAngles angles_;
  HostBuffer moe_buf_;  // the MoE layer's replicas, back to back
  std::string moe_key_;
  std::vector<LayerWeights> moe_layers_;  // views of the replicas
  std::vector<ExpertDeck> moe_decks_;     // which experts each replica's next run reads
  std::map<ThreadPool*, std::pair<std::string, std::unique_ptr<CpuBlocks>>> blocks_;
  uint64_t moe_turn_ = 0;
  int reps_ = 1;                                     // runs in the current burst
  std::unordered_map<std::string, double> last_ms_;  // the previous sample per op and thread count
};

// ---- the grid ----------------------------------------------------------------------------------------

Op matmul_op(DType dt, int64_t tokens, const MatrixShape& s) {
  Op op;
  op.kind = OpKind::Matmul;
  op.dtype = dt;
  op.tokens = tokens;
  op.rows = s.rows;
  op.cols = s.cols;
  return op;
}
// dt: the KV cache's element type (f32 or f16).
Op attention_op(DType dt, int64_t tokens, int64_t ctx, const AttentionLayout& l) {
  Op op;
  op.kind = OpKind::Attention;
  op.dtype = dt;
  op.tokens = tokens;
  op.ctx = ctx;
  op.n_heads = l.heads;
  op.n_kv_heads = l.kv_heads;
  op.head_dim = l.head_dim;
  return op;
}
Op vision_attention_op(int64_t tokens, int64_t segment, const AttentionLayout& l) {
  Op op = attention_op(DType::F32, tokens, segment, l);
  op.kind = OpKind::VisionAttention;
  return op;
}
Op moe_op(DType dt, int64_t tokens, const MoeShape& m) {
  Op op;
  op.kind = OpKind::MoeExperts;
  op.dtype = dt;
  op.tokens = tokens;
  op.rows = m.ffn;
  op.cols = m.hidden;
  op.n_experts = m.experts;
  op.top_k = m.top_k;
  return op;
}
// The step size at which a CPU MoE block's experts switch, on average, from the GEMV kernels to
// dequantise+sgemm (matmul_raw per expert: matmul_gemm_threshold() tokens each, a step of n tokens
// giving each expert n * top_k / n_experts). The per-token cost drops there (weights read once per
// expert, not once per 4 tokens), so a series that ends below it extrapolates the GEMV regime's cost
// into the GEMM one: qwen30b's 16-thread rows ended at 256 tokens (the 40 ms point limit) and its
// 512-token steps were predicted 1.7-1.8x their time (planner_accuracy_v8: Static at the prefill tier).
int64_t moe_gemm_anchor(const MoeShape& m) {
  return (matmul_gemm_threshold() * m.experts + m.top_k - 1) / m.top_k;
}
bool is_moe_gemm_anchor(const Op& op) {
  return op.kind == OpKind::MoeExperts && op.top_k > 0 &&
         op.tokens == moe_gemm_anchor({op.n_experts, op.top_k, op.rows, op.cols});
}
// A CPU MoE shape's token counts: the grid's, and its GEMM switch.
std::vector<int64_t> cpu_moe_tokens(const std::vector<int64_t>& grid, const MoeShape& m) {
  std::vector<int64_t> t = grid;
  const int64_t a = moe_gemm_anchor(m);
  if (!std::binary_search(t.begin(), t.end(), a)) t.insert(std::lower_bound(t.begin(), t.end(), a), a);
  return t;
}
Op simple_op(OpKind k, int64_t elems) {
  Op op;
  op.kind = k;
  op.tokens = std::max<int64_t>(1, elems / 4096);
  op.elems = elems;
  return op;
}

// The grid: the op table's timed shapes (executor/ops/op_table.h: the layers of the dense and the MoE
// model, or the quick grid's small shapes) and what the profiler measures them with.
struct Grid : PerfGrid {
  std::vector<uint64_t> copy_sizes;
  std::vector<uint64_t> burst_sizes;  // h2d bursts of kBurstCopies back-to-back copies (the routed experts' copies)
  uint64_t cpu_weight_set = 0, gpu_weight_set = 0;
  double point_limit_ms = 0;  // a shape's larger token counts are skipped past this
};

Grid make_grid(bool quick) {
  Grid g;
  static_cast<PerfGrid&>(g) = profile_grid(quick);
  if (quick) {
    g.copy_sizes = {1 << 16, 1 << 20, 1 << 24};
    g.burst_sizes = {1 << 20};
    g.cpu_weight_set = 48ull << 20;
    g.gpu_weight_set = 256ull << 20;
    g.point_limit_ms = 20;
  } else {
    g.copy_sizes = {1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1ull << 30};
    g.burst_sizes = {1 << 16, 1 << 18, 1 << 20, 1 << 22};
    g.cpu_weight_set = 768ull << 20;  // > 2x the GPU host's 300 MB L3
    g.gpu_weight_set = 2ull << 30;    // > 30x the H200's L2
    g.point_limit_ms = 40;            // keeps a full profile near its 3-minute target
  }
  return g;
}

std::string read_first(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      auto c = line.find(':');
      if (c == std::string::npos) continue;
      std::string v = line.substr(c + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

MachineFingerprint this_machine(bool with_gpu) {
  MachineFingerprint m;
  m.cpu_model = read_first("/proc/cpuinfo", "model name");
  if (m.cpu_model.empty()) m.cpu_model = "unknown CPU";
  m.cpu_cores = static_cast<int>(std::thread::hardware_concurrency());
  m.isa = isa_name(active_isa());
  m.dram_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  if (with_gpu && cuda_device_count() > 0) {
    const CudaDeviceInfo info = cuda_device_info(0);
    m.gpu_name = info.name;
    m.gpu_driver = info.driver_version;
    m.vram_bytes = info.total_bytes;
  }
  return m;
}

std::string hardware_difference(const MachineFingerprint& profile, const MachineFingerprint& here) {
  std::string d;
  if (profile.cpu_model != here.cpu_model)
    d = str_cat("CPU '", here.cpu_model, "' here, '", profile.cpu_model, "' in the profile");
  if (!profile.gpu_name.empty() && !here.gpu_name.empty() && profile.gpu_name != here.gpu_name)
    d += str_cat(d.empty() ? "" : "; ", "GPU '", here.gpu_name, "' here, '", profile.gpu_name, "' in the profile");
  return d;
}

namespace {

MachineFingerprint fingerprint(GpuBench* gpu) {
  MachineFingerprint m = this_machine(false);
  if (gpu) {
    m.gpu_name = gpu->name();
    m.gpu_driver = gpu->driver_version();
    m.vram_bytes = gpu->vram_bytes();
  }
  return m;
}

std::unique_ptr<GpuBench> open_gpu(const std::string& device, uint64_t set_bytes) {
  if (device == "cpu") return nullptr;
  if (device != "auto" && device != "cuda") fail("--device ", device, ": use auto, cuda or cpu");
  if (device == "auto" && cuda_device_count() == 0) return nullptr;
  return GpuBench::open(set_bytes);
}

std::vector<int> resolve_threads(std::vector<int> t) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (t.empty()) t = hw > 1 ? std::vector<int>{1, hw} : std::vector<int>{1};
  for (int x : t)
    if (x < 1 || x > 4096) fail("--threads ", x, " is out of range (1..4096)");
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

// Runs a list of ops on one backend, skipping a series' larger sizes once a point exceeds the limit.
struct Measurer {
  static constexpr double kAnchorLimits = 4;
  CpuRunner* cpu = nullptr;
  GpuBench* gpu = nullptr;
  Progress* progress = nullptr;
  double limit_ms = 60;
  Policy policy;

  // Measures ops in order; `series` gives each op's series key (ops of a series in ascending cost).
  void run(std::vector<OpSample>& out, const std::vector<Op>& ops, const std::vector<std::string>& series, Backend b,
           int threads, bool contention, double concurrent_gbps) {
    std::map<std::string, bool> skip;
    std::map<std::string, int64_t> layout_limit;  // attention: token count whose smallest context was too slow
    std::map<OpKind, double> seconds;             // where the profile's time goes, logged per block
    const auto block0 = Clock::now();
    struct Tally {
      std::map<OpKind, double>& s;
      OpKind k;
      Clock::time_point t0 = Clock::now();
      ~Tally() { s[k] += ms_since(t0) / 1e3; }
    };
    std::map<std::string, std::pair<double, double>> last;  // per series: the last measured (tokens, ms)
    for (size_t i = 0; i < ops.size(); ++i) {
      Tally tally{seconds, ops[i].kind};
      progress->add(1);
      const Op& op = ops[i];
      if (skip[series[i]]) {
        // A CPU MoE series past the limit still gets one run at its GEMM switch (is_moe_gemm_anchor)
        // where that costs at most kAnchorLimits point limits at the last point's time per token.
        const auto lp = last.find(series[i]);
        if (b != Backend::Cpu || !is_moe_gemm_anchor(op) || lp == last.end() || lp->second.first <= 0 ||
            lp->second.second / lp->second.first * static_cast<double>(op.tokens) > kAnchorLimits * limit_ms)
          continue;
        const double ms = first_run_ms([&] { return cpu->once(op, threads); }, limit_ms);
        out.push_back({b, threads, contention, concurrent_gbps, op, ms, 0, 1});
        continue;
      }
      const std::string layout = op.kind == OpKind::Attention ? series[i].substr(0, series[i].rfind("/t")) : "";
      if (!layout.empty() && layout_limit.count(layout) && op.tokens > layout_limit[layout]) continue;
      auto once = [&] { return b == Backend::Cpu ? cpu->once(op, threads) : gpu->time_op(op); };
      const double first = first_run_ms(once, limit_ms);
      last[series[i]] = {static_cast<double>(op.tokens), first};
      if (first > limit_ms) {  // too expensive to repeat: keep the single run, skip the larger ones
        OpSample s{b, b == Backend::Cpu ? threads : 0, contention, concurrent_gbps, op, first, 0, 1};
        out.push_back(s);
        skip[series[i]] = true;
        // The first (smallest) context of this token count was already too slow: larger token
        // counts of the layout would be slower still.
        if (!layout.empty() && (i == 0 || series[i - 1] != series[i]) && !layout_limit.count(layout))
          layout_limit[layout] = op.tokens;
        continue;
      }
      // GPU times (CUDA events) are stable: fewer milliseconds of repeats suffice.
      const Stat st =
          measure(once, b == Backend::Gpu ? Policy{policy.min_reps, policy.max_reps, policy.min_total_ms / 4} : policy);
      out.push_back(
          {b, b == Backend::Cpu ? threads : 0, contention, concurrent_gbps, op, st.ms, st.spread, st.repeats});
    }
    std::ostringstream line;
    line << "profile: " << (b == Backend::Cpu ? "cpu " : "gpu ");
    if (b == Backend::Cpu) line << threads << (threads == 1 ? " thread" : " threads");
    line << std::fixed << std::setprecision(2);  // seconds to the hundredth: a person reads this line
    line << (contention ? " under contention" : "") << ": " << ops.size() << " ops in " << ms_since(block0) / 1e3
         << " s (";
    const char* sep = "";
    for (const auto& [k, sec] : seconds) {
      line << sep << op_kind_name(k) << " " << sec << " s";
      sep = ", ";
    }
    line << ")";
    log_message(LogLevel::Info, line.str());
  }
};

std::string series_key(const Op& op) {
  std::ostringstream s;
  s << static_cast<int>(op.kind) << '/' << static_cast<int>(op.dtype) << '/' << op.rows << '/' << op.cols << '/'
    << op.n_experts << '/' << op.n_heads << '/' << op.n_kv_heads << '/' << op.head_dim;
  if (op.kind == OpKind::Attention) s << "/t" << op.tokens;     // attention series run over ctx
  if (op.kind == OpKind::VisionAttention) s << "/c" << op.ctx;  // vision attention series over rows
  return s.str();
}

// The KV cache types attention is measured over (the executor's: KvCache, the CUDA kernels; --kv-dtype's choices but
// bf16, which reads as many bytes as f16 and widens as cheaply).
constexpr DType kKvDtypes[] = {DType::F32, DType::F16, DType::Q8_0};

void op_lists(const Grid& g, Backend b, std::vector<Op>* ops) {
  const auto& toks = b == Backend::Cpu ? g.cpu_tokens : g.gpu_tokens;
  for (DType dt : profiled_dtypes())
    for (const MatrixShape& s : g.matrices)
      for (int64_t t : toks) ops->push_back(matmul_op(dt, t, s));
  for (DType kv : kKvDtypes)
    for (const AttentionLayout& l : g.attention)
      for (int64_t t : g.attention_tokens)
        for (int64_t c : g.contexts) {
          if (l.heads == l.kv_heads && c > 16384) continue;  // MHA caches of 64K positions: GBs, no new information
          ops->push_back(attention_op(kv, t, c, l));
        }
  for (DType dt : profiled_dtypes())
    for (const MoeShape& m : g.moe)
      for (int64_t t : b == Backend::Cpu ? cpu_moe_tokens(g.moe_tokens, m) : g.gpu_moe_tokens)
        ops->push_back(moe_op(dt, t, m));
  for (OpKind k : {OpKind::Norm, OpKind::Elementwise})
    for (int64_t e : g.elems) ops->push_back(simple_op(k, e));
  if (b == Backend::Cpu)
    for (OpKind k : {OpKind::Rope, OpKind::Embed})
      for (int64_t e : g.elems) ops->push_back(simple_op(k, e));
  if (b == Backend::Gpu)  // the vision encoder runs on the GPU (its CPU encode is a fallback, not planned)
    for (const AttentionLayout& l : g.vision_attention)
      for (int64_t seg : g.vision_segments)
        for (int64_t t : g.vision_tokens)
          if (t >= seg) ops->push_back(vision_attention_op(t, seg, l));
}

std::vector<Op> contention_ops(const Grid& g) {
  std::vector<Op> ops;
  for (DType dt : profiled_dtypes())
    for (const MatrixShape& s : g.contention_matrices)
      for (int64_t t : g.contention_tokens) ops.push_back(matmul_op(dt, t, s));
  for (DType dt : {DType::F16, DType::Q4_0})
    for (int64_t t : cpu_moe_tokens(g.moe_tokens, g.moe.front())) ops.push_back(moe_op(dt, t, g.moe.front()));
  for (int64_t t : g.attention_tokens)
    for (int64_t c : g.contexts)
      if (c <= 8192) ops.push_back(attention_op(DType::F32, t, c, g.attention.front()));
  return ops;
}

std::vector<std::string> keys_of(const std::vector<Op>& ops) {
  std::vector<std::string> k;
  for (const Op& op : ops) k.push_back(series_key(op));
  return k;
}

// DRAM bandwidth for each thread count, alone and (with a GPU) under copy traffic.
void measure_dram(ProfileDB& db, CpuRunner& cpu, GpuBench* gpu, const std::vector<int>& threads, Progress& progress) {
  for (int t : threads) {
    db.dram.push_back({t, false, 0, cpu.dram_gbps(t)});
    progress.add(1);
    if (gpu) {
      gpu->start_copy_traffic();
      const double bw = cpu.dram_gbps(t);
      const double rate = gpu->stop_copy_traffic();
      db.dram.push_back({t, true, rate, bw});
    }
    progress.add(1);
  }
}

// CPU ops alone at every thread count, then (with a GPU) the contention subset under copy traffic.
void measure_cpu_ops(ProfileDB& db, Measurer& m, GpuBench* gpu, const std::vector<int>& threads,
                     const std::vector<Op>& cpu_ops, const std::vector<Op>& cont) {
  const auto cpu_keys = keys_of(cpu_ops), cont_keys = keys_of(cont);
  for (int t : threads) m.run(db.ops, cpu_ops, cpu_keys, Backend::Cpu, t, false, 0);
  if (gpu)
    for (int t : threads) {
      // The traffic's rate is measured over the whole block; rows carry it.
      std::vector<OpSample> rows;
      gpu->start_copy_traffic();
      m.run(rows, cont, cont_keys, Backend::Cpu, t, true, 0);
      const double rate = gpu->stop_copy_traffic();
      for (auto& r : rows) r.concurrent_gbps = rate;
      db.ops.insert(db.ops.end(), rows.begin(), rows.end());
    }
}

// GPU kernels alone, then while all CPU threads stream DRAM; then sync, launch and copy-issue times.
void measure_gpu_ops(ProfileDB& db, Measurer& m, CpuRunner& cpu, GpuBench& gpu, int max_threads,
                     const std::vector<Op>& gpu_ops, const std::vector<Op>& gpu_cont, const std::vector<double>& caps) {
  m.run(db.ops, gpu_ops, keys_of(gpu_ops), Backend::Gpu, 0, false, 0);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) cpu.dram_gbps(max_threads);
  });
  std::vector<OpSample> rows;
  m.run(rows, gpu_cont, keys_of(gpu_cont), Backend::Gpu, 0, true, 0);
  stop.store(true);
  reader.join();
  db.ops.insert(db.ops.end(), rows.begin(), rows.end());
  db.sync_ms = measure([&] { return gpu.sync_ms(); }, {5, 50, 1}).ms;
  db.launch_ms = measure([&] { return gpu.launch_ms(); }, {5, 50, 1}).ms;
  // What the host spends enqueueing an MoE layer's expert copies as the runtime does (uncapped, and
  // paced under the smallest cap measured).
  db.copy_issue_ms = measure([&] { return gpu.copy_issue_ms(0, kBurstCopies); }, {5, 20, 1}).ms;
  for (double cap : caps)
    if (cap > 0 && db.paced_copy_issue_ms == 0)
      db.paced_copy_issue_ms = measure([&] { return gpu.copy_issue_ms(cap, kBurstCopies); }, {5, 20, 1}).ms;
}

// Copies: pinned at every cap, pageable uncapped, both directions; then bursts of back-to-back copies.
void measure_copies(ProfileDB& db, GpuBench& gpu, const Grid& g, const std::vector<double>& caps, Progress& progress) {
  const auto copies0 = Clock::now();
  for (Direction d : {Direction::HostToDevice, Direction::DeviceToHost}) {
    for (double cap : caps)
      for (uint64_t bytes : g.copy_sizes) {
        const Stat s = measure([&] { return gpu.time_copy(d, true, bytes, cap); }, {3, 10, 30});
        db.transfers.push_back({d, true, cap / 1e9, bytes, s.ms, s.spread, s.repeats});
        progress.add(1);
      }
    for (uint64_t bytes : g.copy_sizes) {
      const Stat s = measure([&] { return gpu.time_copy(d, false, bytes, 0); }, {3, 10, 30});
      db.transfers.push_back({d, false, 0, bytes, s.ms, s.spread, s.repeats});
      progress.add(1);
    }
  }
  for (uint64_t bytes : g.burst_sizes) {
    const Stat s =
        measure([&] { return gpu.time_copy_burst(Direction::HostToDevice, bytes, kBurstCopies); }, {3, 10, 30});
    TransferSample t{Direction::HostToDevice, true, 0, bytes, s.ms, s.spread, s.repeats};
    t.burst = kBurstCopies;
    db.transfers.push_back(t);
    progress.add(1);
  }
  char line[64];
  std::snprintf(line, sizeof line, "profile: copies in %.2f s", ms_since(copies0) / 1e3);
  log_message(LogLevel::Info, line);
}

}  // namespace

double first_run_ms(const std::function<double()>& once, double limit_ms) {
  const double first = once();
  return first > limit_ms ? std::min(first, once()) : first;
}

ProfileDB run_profile(const ProfileOptions& o) {
  const Grid g = make_grid(o.quick);
  const std::vector<int> threads = resolve_threads(o.threads);
  std::vector<double> caps = o.pcie_caps_bytes_per_s;
  if (caps.empty()) caps = {0};
  auto gpu = open_gpu(o.device, g.gpu_weight_set);
  const int max_threads = threads.back();
  CpuRunner cpu(g.cpu_weight_set, max_threads);

  ProfileDB db;
  db.device = gpu ? "cuda" : "cpu";
  db.machine = fingerprint(gpu.get());
  db.created = utc_now();
  db.git_rev = o.git_rev;
  db.quick = o.quick;
  if (gpu) db.copy_traffic = "h2d";  // GpuBench::start_copy_traffic
  db.threads = threads;
  for (double c : caps) db.pcie_caps_gbps.push_back(c / 1e9);

  std::vector<Op> cpu_ops, gpu_ops;
  op_lists(g, Backend::Cpu, &cpu_ops);
  if (gpu) op_lists(g, Backend::Gpu, &gpu_ops);
  const std::vector<Op> cont = contention_ops(g);
  std::vector<Op> gpu_cont;  // GPU kernels while the CPU streams DRAM: decode and a prefill size
  if (gpu)
    for (DType dt : {DType::F16, DType::Q4_0})
      for (const MatrixShape& s : g.contention_matrices)
        for (int64_t t : {int64_t(1), int64_t(256)}) gpu_cont.push_back(matmul_op(dt, t, s));
  const uint64_t copies =
      gpu ? static_cast<uint64_t>(g.copy_sizes.size() * (2 + 2 * caps.size()) + g.burst_sizes.size()) : 0;
  const uint64_t total =
      static_cast<uint64_t>(cpu_ops.size() * threads.size() + (gpu ? cont.size() * threads.size() : 0) +
                            gpu_ops.size() + gpu_cont.size()) +
      copies + threads.size() * 2;
  Progress progress(o.quick ? "profile (quick)" : "profile", total, o.progress);
  Measurer m{&cpu, gpu.get(), &progress, g.point_limit_ms, o.quick ? Policy{2, 6, 5} : Policy{3, 12, 12}};

  measure_dram(db, cpu, gpu.get(), threads, progress);
  measure_cpu_ops(db, m, gpu.get(), threads, cpu_ops, cont);
  if (gpu) {
    measure_gpu_ops(db, m, cpu, *gpu, max_threads, gpu_ops, gpu_cont, caps);
    measure_copies(db, *gpu, g, caps, progress);
  }
  progress.finish();
  fit_profile(db);
  return db;
}

// ---- machine check ---------------------------------------------------------------------------------

double MachineCheckRow::slowdown() const {
  if (profile_value <= 0 || measured_value <= 0) return 1;
  return is_rate ? profile_value / measured_value : measured_value / profile_value;
}

bool MachineCheck::within(double tolerance) const {
  return hardware_difference.empty() && max_slowdown <= 1 + tolerance && min_slowdown >= 1 / (1 + tolerance);
}

std::string MachineCheck::text() const {
  std::ostringstream os;
  os << "machine check against the profile (this machine / the profile's; > 1: slower here):\n";
  if (!hardware_difference.empty()) os << "  another machine: " << hardware_difference << "\n";
  for (const auto& [t, g] : slowdown_by_threads) {
    char head[96];
    std::snprintf(head, sizeof head, "  %d thread%s: %.3fx (geometric mean of its rows)", t, t == 1 ? "" : "s", g);
    os << head;
    const auto first = first_slowdown_by_threads.find(t);
    if (first != first_slowdown_by_threads.end()) {
      std::snprintf(head, sizeof head, ", measured again: the first time %.3fx", first->second);
      os << head;
    }
    os << "\n";
  }
  char line[256];
  for (const MachineCheckRow& r : rows) {
    std::snprintf(line, sizeof line, "  %-44s profile %10.4f %s  here %10.4f %s  %.3fx\n", r.what.c_str(),
                  r.profile_value, r.is_rate ? "GB/s" : "ms  ", r.measured_value, r.is_rate ? "GB/s" : "ms  ",
                  r.slowdown());
    os << line;
  }
  return os.str();
}

namespace {

// The check's rows at thread count t: DRAM read, and the profile's f16 matmul rows (alone, not under
// copy traffic) over the largest matrix at one token and at the largest token count under 300 ms.
std::vector<MachineCheckRow> check_rows(const ProfileDB& db, const Grid& g, CpuRunner& cpu, const Policy& pol, int t) {
  std::vector<MachineCheckRow> rows;
  for (const DramSample& d : db.dram)
    if (d.threads == t && !d.contention) {
      rows.push_back({str_cat("dram read t", t), t, d.gbps, cpu.dram_gbps(t), true});
      break;
    }
  const OpSample* gemv = nullptr;
  const OpSample* gemm = nullptr;
  for (const OpSample& s : db.ops) {
    if (s.backend != Backend::Cpu || s.contention || s.threads != t || s.op.kind != OpKind::Matmul ||
        s.op.dtype != DType::F16 || s.ms <= 0)
      continue;
    // The profile is input: only shapes the profiler's own runner can hold (its grid's always can).
    const uint64_t weight_bytes = static_cast<uint64_t>(s.op.rows) * static_cast<uint64_t>(s.op.cols) * 2;
    const uint64_t act_bytes = static_cast<uint64_t>(s.op.tokens) * static_cast<uint64_t>(s.op.rows + s.op.cols) * 4;
    if (weight_bytes > g.cpu_weight_set / 2 || act_bytes > (256ull << 20)) continue;
    const uint64_t w = static_cast<uint64_t>(s.op.rows) * static_cast<uint64_t>(s.op.cols);
    if (s.op.tokens == 1 && (!gemv || w > static_cast<uint64_t>(gemv->op.rows) * static_cast<uint64_t>(gemv->op.cols)))
      gemv = &s;
    if (s.op.tokens > 1 && s.ms < 300 &&
        (!gemm || s.op.tokens > gemm->op.tokens || (s.op.tokens == gemm->op.tokens && s.ms > gemm->ms)))
      gemm = &s;
  }
  for (const OpSample* s : {gemv, gemm}) {
    if (!s) continue;
    const Stat st = measure([&] { return cpu.once(s->op, t); }, pol);
    rows.push_back(
        {str_cat("cpu matmul f16 ", s->op.rows, "x", s->op.cols, " t", t, " x", s->op.tokens), t, s->ms, st.ms, false});
  }
  return rows;
}

double geometric_slowdown(const std::vector<MachineCheckRow>& rows) {
  double l = 0;
  for (const MachineCheckRow& r : rows) l += std::log(r.slowdown());
  return rows.empty() ? 1.0 : std::exp(l / static_cast<double>(rows.size()));
}

}  // namespace

MachineCheck check_machine(const ProfileDB& db, double tolerance, bool compare_gpu) {
  SW_CHECK(!db.threads.empty(), "machine check: the profile ", db.origin, " names no thread counts");
  const Grid g = make_grid(db.quick);
  const int max_threads = *std::max_element(db.threads.begin(), db.threads.end());
  SW_CHECK(max_threads >= 1 && max_threads <= 4096, "machine check: the profile's thread count ", max_threads,
           " is out of range");
  CpuRunner cpu(g.cpu_weight_set, max_threads);
  const Policy pol = db.quick ? Policy{2, 6, 5} : Policy{3, 12, 12};
  MachineCheck mc;
  mc.hardware_difference = hardware_difference(db.machine, this_machine(compare_gpu));
  std::map<int, std::vector<MachineCheckRow>> by_threads;
  for (int t : db.threads) {
    std::vector<MachineCheckRow> rows = check_rows(db, g, cpu, pol, t);
    if (rows.empty()) continue;
    const double first = geometric_slowdown(rows);
    if (tolerance > 0 && (first > 1 + tolerance || first < 1 / (1 + tolerance))) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      rows = check_rows(db, g, cpu, pol, t);
      mc.first_slowdown_by_threads[t] = first;
    }
    by_threads[t] = std::move(rows);
  }
  for (auto& [t, rows] : by_threads) mc.rows.insert(mc.rows.end(), rows.begin(), rows.end());
  SW_CHECK(!mc.rows.empty(), "machine check: the profile ", db.origin,
           " has no DRAM or f16 CPU matmul rows to compare with");
  mc.max_slowdown = 0;
  mc.min_slowdown = 1e300;
  for (const auto& [t, rows] : by_threads) {
    const double s = geometric_slowdown(rows);
    mc.slowdown_by_threads[t] = s;
    mc.max_slowdown = std::max(mc.max_slowdown, s);
    mc.min_slowdown = std::min(mc.min_slowdown, s);
  }
  return mc;
}

struct MachineProbe::Impl {
  const ProfileDB& db;
  Grid g;
  CpuRunner cpu;
  Impl(const ProfileDB& d, const Grid& grid, int max_threads) : db(d), g(grid), cpu(grid.cpu_weight_set, max_threads) {}
};

MachineProbe::MachineProbe(const ProfileDB& db) {
  SW_CHECK(!db.threads.empty(), "machine probe: the profile ", db.origin, " names no thread counts");
  const int max_threads = *std::max_element(db.threads.begin(), db.threads.end());
  SW_CHECK(max_threads >= 1 && max_threads <= 4096, "machine probe: the profile's thread count ", max_threads,
           " is out of range");
  impl_ = std::make_unique<Impl>(db, make_grid(db.quick), max_threads);
}

MachineProbe::~MachineProbe() = default;

double MachineProbe::slowdown(int threads) {
  if (std::find(impl_->db.threads.begin(), impl_->db.threads.end(), threads) == impl_->db.threads.end()) return 0;
  const std::vector<MachineCheckRow> rows = check_rows(impl_->db, impl_->g, impl_->cpu, Policy{2, 6, 5}, threads);
  return rows.empty() ? 0 : geometric_slowdown(rows);
}

// ---- validation --------------------------------------------------------------------------------------

double ValidationCase::rel_error() const {
  return measured_ms > 0 ? std::fabs(predicted_ms - measured_ms) / measured_ms : 0;
}

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

ValidationClass summarize(const std::string& name, const std::vector<const ValidationCase*>& cs) {
  ValidationClass c;
  c.op_class = name;
  c.cases = static_cast<int>(cs.size());
  std::vector<double> e;
  for (auto* x : cs) e.push_back(x->rel_error());
  c.median_error = percentile(e, 0.5);
  c.p90_error = percentile(e, 0.9);
  return c;
}

bool same_shape(const Op& a, const Op& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.tokens == b.tokens && a.rows == b.rows && a.cols == b.cols &&
         a.n_experts == b.n_experts && a.top_k == b.top_k && a.ctx == b.ctx && a.n_heads == b.n_heads &&
         a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim && a.elems == b.elems;
}

std::string label_of(const Op& op) {
  std::ostringstream s;
  switch (op.kind) {
    case OpKind::Matmul:
      s << dtype_name(op.dtype) << " " << op.rows << "x" << op.cols << " t" << op.tokens;
      break;
    case OpKind::MoeExperts:
      s << dtype_name(op.dtype) << " E" << op.n_experts << " k" << op.top_k << " " << op.rows << "x" << op.cols << " t"
        << op.tokens;
      break;
    case OpKind::Attention:
      s << op.n_heads << "/" << op.n_kv_heads << "x" << op.head_dim << " ctx" << op.ctx << " t" << op.tokens;
      break;
    case OpKind::VisionAttention:
      s << op.n_heads << "x" << op.head_dim << " segments of " << op.ctx << " t" << op.tokens;
      break;
    default:
      s << op.elems << " elems";
  }
  return s.str();
}

}  // namespace

std::string ValidationReport::text() const {
  std::ostringstream s;
  char line[256];
  s << "per op class (relative error |predicted - measured| / measured):\n";
  std::snprintf(line, sizeof line, "  %-28s %6s %10s %10s\n", "class", "cases", "median", "p90");
  s << line;
  for (const auto& c : classes) {
    std::snprintf(line, sizeof line, "  %-28s %6d %9.1f%% %9.1f%%\n", c.op_class.c_str(), c.cases, 100 * c.median_error,
                  100 * c.p90_error);
    s << line;
  }
  for (const auto* c : {&all_cpu, &all_gpu}) {
    if (c->cases == 0) continue;
    std::snprintf(line, sizeof line, "  %-28s %6d %9.1f%% %9.1f%%   (targets: median <= 10%%, p90 <= 25%%)\n",
                  c->op_class.c_str(), c->cases, 100 * c->median_error, 100 * c->p90_error);
    s << line;
  }
  if (!contention_with.empty()) {
    s << "CPU work while the copy engines stream (hybrid condition), median error: with contention data "
      << std::to_string(100 * contention_median_with).substr(0, 5) << "%, without "
      << std::to_string(100 * contention_median_without).substr(0, 5) << "%\n";
  }
  s << "cases:\n";
  for (const auto& c : cases) {
    std::snprintf(line, sizeof line, "  %-22s %-34s predicted %9.4f ms measured %9.4f ms  %+6.1f%%\n",
                  c.op_class.c_str(), c.label.c_str(), c.predicted_ms, c.measured_ms,
                  100 * (c.predicted_ms - c.measured_ms) / c.measured_ms);
    s << line;
  }
  for (size_t i = 0; i < contention_with.size(); ++i) {
    const auto& w = contention_with[i];
    std::snprintf(
        line, sizeof line, "  contention %-34s measured %9.4f ms  with %9.4f (%+5.1f%%)  without %9.4f (%+5.1f%%)\n",
        w.label.c_str(), w.measured_ms, w.predicted_ms, 100 * (w.predicted_ms - w.measured_ms) / w.measured_ms,
        contention_without[i].predicted_ms, 100 * (contention_without[i].predicted_ms - w.measured_ms) / w.measured_ms);
    s << line;
  }
  return s.str();
}

namespace {

// Other models' layers (nemo4b, qwen235b), token counts and a context the grid never has.
std::vector<Op> validation_ops(const ProfileDB& db, bool quick) {
  const ValidationGrid v = validation_grid(quick);
  std::vector<Op> ops;
  for (DType dt : v.dtypes)
    for (const MatrixShape& s : v.matrices)
      for (int64_t t : v.tokens) ops.push_back(matmul_op(dt, t, s));
  for (const AttentionLayout& l : v.attention)
    for (int64_t t : v.tokens)
      if (t <= 768) ops.push_back(attention_op(DType::F32, t, v.context, l));
  for (DType dt : {DType::F16, DType::Q4_0})
    for (const MoeShape& m : v.moe)
      for (int64_t t : v.tokens)
        if (t <= 768) ops.push_back(moe_op(dt, t, m));
  if (db.has_gpu())
    for (const AttentionLayout& l : v.vision_attention)
      for (const auto& [rows, segment] : v.vision_cases) ops.push_back(vision_attention_op(rows, segment, l));
  for (const Op& op : ops)
    for (const OpSample& s : db.ops)
      if (same_shape(op, s.op))
        fail("validation case ", label_of(op), " is in the profile's grid: it would not test anything");
  return ops;
}

// One validation: the models' predictions against cases measured here, or (rescoring) recorded.
struct ValidationRun {
  const ProfileOptions& o;
  const ProfileOptions::Recorded* rec;
  GpuBench* gpu;
  CpuRunner* cpu_runner;
  const CostModel& model;     // with contention data
  const CostModel& model_nc;  // without
  Policy pol;
  double limit;  // skip cases predicted to take longer than this per run
  Progress& progress;
  ValidationReport& r;

  void run_case(Backend b, int threads, const Op& op) {
    progress.add(1);
    ExecEnv env;
    env.backend = b;
    env.threads = threads;
    const double pred = model.op_ms(op, env);
    std::string cls = std::string(backend_name(b)) + " " + op_kind_name(op.kind);
    if (b == Backend::Cpu) cls += " t" + std::to_string(threads);
    double ms = 0;
    if (rec) {
      const auto it = rec->cases.find({cls, label_of(op)});
      if (it == rec->cases.end()) return;
      ms = it->second;
    } else {
      if (pred > limit) return;
      ms = measure([&] { return b == Backend::Cpu ? cpu_runner->once(op, threads) : gpu->time_op(op); }, pol).ms;
    }
    r.cases.push_back({cls, label_of(op), pred, ms});
    if (!o.progress && !rec)  // a log of each case as it ends: what was measured survives a failure later on
      std::fprintf(stderr, "validate: %s %s predicted %.4f ms measured %.4f ms\n", cls.c_str(), label_of(op).c_str(),
                   pred, ms);
  }

  // Hybrid condition: CPU matmuls and experts at the most threads while the copy engines stream weights,
  // predicted with and without the contention data.
  void run_contention(const std::vector<Op>& ops, int t) {
    std::vector<Op> hyb;
    for (const Op& op : ops)
      if ((op.kind == OpKind::Matmul || op.kind == OpKind::MoeExperts) && op.tokens <= 96) hyb.push_back(op);
    std::vector<std::pair<Op, Stat>> measured;
    if (gpu) gpu->start_copy_traffic();
    for (const Op& op : hyb) {
      progress.add(1);
      ExecEnv env{Backend::Cpu, t, 0};
      if (rec) {
        const auto it = rec->contention.find(
            {"cpu " + std::string(op_kind_name(op.kind)) + " t" + std::to_string(t), label_of(op)});
        if (it != rec->contention.end()) measured.emplace_back(op, Stat{it->second, 0, 0});
        continue;
      }
      if (model_nc.op_ms(op, env) > limit) continue;
      measured.emplace_back(op, measure([&] { return cpu_runner->once(op, t); }, pol));
      if (!o.progress)
        std::fprintf(stderr, "validate: under copy traffic %s measured %.4f ms\n", label_of(op).c_str(),
                     measured.back().second.ms);
    }
    const double rate = gpu ? gpu->stop_copy_traffic() : rec->contention_gbps;
    r.contention_gbps = rate;
    std::vector<double> ew, en;
    for (auto& [op, st] : measured) {
      ExecEnv env{Backend::Cpu, t, rate};
      const std::string cls = "cpu " + std::string(op_kind_name(op.kind)) + " t" + std::to_string(t);
      r.contention_with.push_back({cls, label_of(op), model.op_ms(op, env), st.ms});
      r.contention_without.push_back({cls, label_of(op), model_nc.op_ms(op, env), st.ms});
      ew.push_back(r.contention_with.back().rel_error());
      en.push_back(r.contention_without.back().rel_error());
    }
    r.contention_median_with = percentile(ew, 0.5);
    r.contention_median_without = percentile(en, 0.5);
  }
};

// The errors per op class, and over all CPU and all GPU cases.
void summarize_cases(ValidationReport& r) {
  std::map<std::string, std::vector<const ValidationCase*>> by;
  std::vector<const ValidationCase*> cpu_all, gpu_all;
  for (const auto& c : r.cases) {
    by[c.op_class].push_back(&c);
    (c.op_class.rfind("cpu", 0) == 0 ? cpu_all : gpu_all).push_back(&c);
  }
  for (auto& [k, v] : by) r.classes.push_back(summarize(k, v));
  r.all_cpu = summarize("all cpu", cpu_all);
  r.all_gpu = summarize("all gpu", gpu_all);
}

}  // namespace

ValidationReport validate_profile(const ProfileDB& db, const ProfileOptions& o) {
  const std::vector<Op> ops = validation_ops(db, o.quick);
  const Grid g = make_grid(o.quick);
  const ProfileOptions::Recorded* rec = o.recorded ? &*o.recorded : nullptr;
  // --device cpu validates the CPU rows only (e.g. a GPU profile on a machine without its GPU).
  // Rescoring measures nothing: no runner, and GPU cases wherever the recorded run had them.
  auto gpu = !rec && db.has_gpu() && o.device != "cpu" ? open_gpu("cuda", g.gpu_weight_set) : nullptr;
  const bool with_gpu = rec ? db.has_gpu() && o.device != "cpu" : gpu != nullptr;
  std::unique_ptr<CpuRunner> cpu_runner =
      rec ? nullptr : std::make_unique<CpuRunner>(o.quick ? (64ull << 20) : (768ull << 20), db.threads.back());
  MeasuredOptions mo;
  auto model = make_measured_cost_model(db, mo);
  mo.use_contention = false;
  auto model_nc = make_measured_cost_model(db, mo);

  ValidationReport r;
  const size_t n_total = ops.size() * (db.threads.size() + (with_gpu ? 1 : 0)) + (with_gpu ? ops.size() / 3 : 0);
  Progress progress("validate", n_total, o.progress && !rec);
  ValidationRun run{o,
                    rec,
                    gpu.get(),
                    cpu_runner.get(),
                    *model,
                    *model_nc,
                    o.quick ? Policy{2, 5, 5} : Policy{3, 8, 20},
                    o.quick ? 40.0 : 400.0,
                    progress,
                    r};
  for (int t : db.threads)
    for (const Op& op : ops)
      if (op.kind != OpKind::VisionAttention) run.run_case(Backend::Cpu, t, op);  // timed on the GPU only
  if (with_gpu)
    for (const Op& op : ops) run.run_case(Backend::Gpu, 0, op);
  if (!o.progress && gpu) std::fprintf(stderr, "validate: CPU work under copy traffic\n");
  if (with_gpu && (!rec || !rec->contention.empty())) run.run_contention(ops, db.threads.back());
  progress.finish();
  summarize_cases(r);
  return r;
}

}  // namespace shardwise

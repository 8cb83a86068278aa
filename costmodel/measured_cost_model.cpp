// costmodel/measured_cost_model.cpp — the CostModel that answers from a measured ProfileDB (see
// profile_db.h for the rules). Everything is indexed once in the constructor (classes by a packed
// key, shapes by a hash, per-token-count least-squares fits solved up front), so a query is a few
// hash lookups, binary searches and logarithms: the planner asks ~10^5 times per plan table.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "costmodel/profile_math.h"

namespace shardwise {
namespace {

using namespace profile_math;

uint64_t class_key(Backend b, OpKind k, DType d, int threads, bool contention) {
  return (static_cast<uint64_t>(b) << 60) | (static_cast<uint64_t>(contention) << 59) |
         (static_cast<uint64_t>(k) << 52) | (static_cast<uint64_t>(d) << 32) | static_cast<uint32_t>(threads);
}

// Every Op field but `tokens` that the kind uses; element-wise kinds have one curve in `elems`.
using ShapeKey = std::array<int64_t, 4>;
struct ShapeHash {
  size_t operator()(const ShapeKey& s) const {
    uint64_t h = 14695981039346656037ull;
    for (int64_t v : s) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};
ShapeKey shape_key(const Op& op) {
  switch (op.kind) {
    case OpKind::Matmul:
      return {op.rows, op.cols, 0, 0};
    case OpKind::MoeExperts:
      return {op.rows, op.cols, op.n_experts, op.top_k};
    case OpKind::Attention:
    case OpKind::VisionAttention:
      return {op.ctx, op.n_heads, op.n_kv_heads, op.head_dim};
    default:
      return {0, 0, 0, 0};
  }
}

// Routed tokens per distinct expert of an MoE step of n tokens under uniform random routing.
double uniform_tokens_per_expert(double n, const Op& moe) {
  return n * static_cast<double>(moe.top_k) /
         expected_distinct_experts(static_cast<int64_t>(n), moe.top_k, moe.n_experts);
}

// Log-log interpolation between (x1, y1) and (x2, y2).
double loglog(double x, double x1, double y1, double x2, double y2) {
  const double f = (std::log(x) - std::log(x1)) / (std::log(x2) - std::log(x1));
  return y1 * std::exp(f * (std::log(y2) - std::log(y1)));
}

// Measured times of one shape, ascending in x (tokens; elems for element-wise kinds).
struct Curve {
  Op proto;  // the shape (tokens of the first point)
  std::vector<double> x, ms;
  // x must lie in [x.front(), x.back()]; a measured x gives its time exactly.
  double at(double v) const {
    const size_t i = static_cast<size_t>(std::lower_bound(x.begin(), x.end(), v) - x.begin());
    if (x[i] == v) return ms[i];
    return loglog(v, x[i - 1], ms[i - 1], x[i], ms[i]);
  }
  bool covers(double v) const { return v >= x.front() && v <= x.back(); }
};

// ms = c + a·bytes + b·flops over the shapes measured at one token count, or c + max(a·bytes,
// b·flops) where that fits them better (shapes on both sides of the ridge at this count).
// GPU matmuls add d·cols: a GEMV launch gives each row to one warp, which walks the row serially,
// so with few rows per SM the time follows the row length more than the bytes (leave-one-shape-out
// on the H200 profile's GPU matmul rows: p90 error 27% -> 20%; no gain on the CPU rows).
struct TokenFit {
  double tokens, c, a, b;
  bool max_form;
  double d = 0;
  double at(const Op& op) const {
    Op q = op;
    q.tokens = static_cast<int64_t>(tokens);
    const double mem = a * op_bytes(q), comp = b * q.flops();
    return c + (max_form ? std::max(mem, comp) : mem + comp + d * static_cast<double>(op.cols));
  }
};

struct Class {
  bool by_elems = false;
  std::unordered_map<ShapeKey, Curve, ShapeHash> shapes;
  std::vector<TokenFit> token_fits;  // ascending tokens; only counts with >= 3 shapes and a fit
  RooflineFit fit;
  double concurrent_gbps = 0;  // contention classes: median PCIe rate the rows ran with

  // The largest token count measured for the op's shape (else for any shape at a fitted count); 0: none.
  double last_tokens(const Op& op) const {
    if (by_elems) return 0;
    auto it = shapes.find(shape_key(op));
    if (it != shapes.end()) return it->second.x.back();
    return token_fits.empty() ? 0.0 : token_fits.back().tokens;
  }

  double ms(const Op& op) const {
    if (by_elems) {
      const Curve& c = shapes.begin()->second;
      const double e = static_cast<double>(op.elems);
      if (c.covers(e)) return c.at(e);
      return roofline_ms(fit, op_bytes(op), op.flops());
    }
    const double n = static_cast<double>(op.tokens);
    // Between two measured token counts the ratio measured / fitted roofline is interpolated
    // (log-log), not the time itself: exact at the measured counts, and it follows the roofline's
    // bend where the op turns from memory- to compute-bound between them.
    auto roof = [&](double tokens) {
      Op q = op;
      q.tokens = static_cast<int64_t>(tokens);
      return roofline_ms(fit, op_bytes(q), q.flops());
    };
    auto between = [&](double x1, double y1, double x2, double y2) {
      const double r1 = roof(x1), r2 = roof(x2), rq = roof(n);
      if (r1 > 0 && r2 > 0 && rq > 0 && std::isfinite(r1) && std::isfinite(r2) && std::isfinite(rq))
        return rq * loglog(n, x1, y1 / r1, x2, y2 / r2);
      return loglog(n, x1, y1, x2, y2);
    };
    // Beyond the largest measured token count the ratio measured / fitted roofline at that count is
    // kept: the class's fit is a compromise over all its shapes, the largest point is this shape's.
    auto beyond = [&](double x, double y) {
      const double rx = roof(x), rq = roof(n);
      if (rx > 0 && rq > 0 && y > 0 && std::isfinite(rx) && std::isfinite(rq) && std::isfinite(y)) return rq * (y / rx);
      return roofline_ms(fit, op_bytes(op), op.flops());
    };
    auto it = shapes.find(shape_key(op));
    if (it != shapes.end() && it->second.covers(n)) {
      const Curve& c = it->second;
      const size_t i = static_cast<size_t>(std::lower_bound(c.x.begin(), c.x.end(), n) - c.x.begin());
      if (c.x[i] == n) return c.ms[i];
      return between(c.x[i - 1], c.ms[i - 1], c.x[i], c.ms[i]);
    }
    if (it != shapes.end() && n > it->second.x.back()) return beyond(it->second.x.back(), it->second.ms.back());
    if (!token_fits.empty() && n >= token_fits.front().tokens && n <= token_fits.back().tokens) {
      const auto hi = std::lower_bound(token_fits.begin(), token_fits.end(), n,
                                       [](const TokenFit& f, double v) { return f.tokens < v; });
      const double t2 = hi->at(op);
      if (hi->tokens == n) {
        if (t2 > 0 && std::isfinite(t2)) return t2;
      } else {
        const auto lo = hi - 1;
        const double t1 = lo->at(op);
        if (t1 > 0 && t2 > 0 && std::isfinite(t1) && std::isfinite(t2)) return between(lo->tokens, t1, hi->tokens, t2);
      }
    }
    if (!token_fits.empty() && n > token_fits.back().tokens)
      return beyond(token_fits.back().tokens, token_fits.back().at(op));
    return roofline_ms(fit, op_bytes(op), op.flops());
  }
};

// Measured copies of one (direction, pinned) under the model's cap, ascending in bytes.
struct CopyCurve {
  std::vector<double> bytes, ms;
  double cap_gbps = 0;  // uncapped rows held to the model's cap (0: none, or rows measured under it)
  double ms_at(double b) const {
    double t;
    const size_t n = bytes.size();
    if (b <= bytes.front()) {
      // Below the smallest size: the first segment's log-log slope, between flat (latency) and linear.
      double s = n > 1 ? std::log(ms[1] / ms[0]) / std::log(bytes[1] / bytes[0]) : 1.0;
      s = std::min(1.0, std::max(0.0, s));
      t = ms[0] * std::pow(b / bytes[0], s);
    } else if (b >= bytes.back()) {
      t = ms.back() * b / bytes.back();  // at the largest size's rate
    } else {
      const size_t i = static_cast<size_t>(std::lower_bound(bytes.begin(), bytes.end(), b) - bytes.begin());
      t = bytes[i] == b ? ms[i] : loglog(b, bytes[i - 1], ms[i - 1], bytes[i], ms[i]);
    }
    return cap_gbps > 0 ? std::max(t, b / (cap_gbps * 1e6)) : t;
  }
  double gbps() const { return bytes.back() / ms.back() / 1e6; }
};

// A sweep builds one model per configuration: say it once per process.
void warn_once(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(message).second) log_warn(message);
}

// Sorted (x, y) pairs with equal x merged by their geometric mean.
void sort_merge(std::vector<std::pair<double, double>>& v, std::vector<double>* xs, std::vector<double>* ys) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    double log_sum = 0;
    while (j < v.size() && v[j].first == v[i].first) log_sum += std::log(v[j++].second);
    xs->push_back(v[i].first);
    ys->push_back(j - i == 1 ? v[i].second : std::exp(log_sum / static_cast<double>(j - i)));
    i = j;
  }
}

class MeasuredCostModel : public CostModel {
 public:
  MeasuredCostModel(const ProfileDB& db, const MeasuredOptions& o)
      : origin_(db.origin.empty() ? std::string("(unnamed)") : db.origin),
        has_gpu_(db.has_gpu()),
        sync_ms_(db.sync_ms),
        launch_ms_(db.launch_ms),
        issue_ms_(db.copy_issue_ms),
        paced_issue_ms_(db.paced_copy_issue_ms),
        cap_gbps_(o.pcie_cap_bytes_per_s / 1e9),
        vram_(db.machine.vram_bytes) {
    if (!(o.pcie_cap_bytes_per_s >= 0) || !std::isfinite(o.pcie_cap_bytes_per_s)) fail("PCIe cap must not be negative");
    for (int t : db.threads) max_threads_ = std::max(max_threads_, t);
    describe_ =
        str_cat("profile ", db.machine.gpu_name.empty() || !has_gpu_ ? db.machine.cpu_model : db.machine.gpu_name, " (",
                profile_hash(db), ")");
    if (!has_gpu_ && o.gpu_fallback) {
      fallback_ = make_analytic_cost_model(*o.gpu_fallback, o.pcie_cap_bytes_per_s);
      vram_ = o.gpu_fallback->vram_bytes;
      describe_ += str_cat(" with the GPU of ", o.gpu_fallback->name, " (datasheet)");
      warn_once(str_cat("the profile ", origin_,
                        " was measured without a GPU: GPU ops and copies are predicted from the datasheet of ",
                        o.gpu_fallback->name, " (analytic, not measured)"));
    }
    index_ops(db, o.use_contention);
    if (has_gpu_) index_copies(db);
    if (has_gpu_ && o.use_contention) index_copy_contention(db);
  }

  // A weight type the profile did not measure (a block type newer than the profile, or one the GPU
  // kernels lack) is priced as the measured type of the nearest bits per weight: decode-sized steps
  // (kProxyBytesTokens tokens at most) read their weights once, so their time scales with the weight
  // bytes; larger steps keep the measured type's time (their arithmetic is the same).
  double op_ms(const Op& op, const ExecEnv& env) const override {
    const bool analytic = env.backend == Backend::Gpu && !has_gpu_;  // the datasheet model prices any type
    // Attention over a cache type the profile did not time (the profiler times f32, f16 and q8_0 caches; a
    // profile may hold fewer): bf16 and q8_0 caches are priced as over f16 where the profile has f16 rows
    // (bf16 reads the same bytes; q8_0 reads about half as many and dequantises as it reads: an estimate),
    // else as over f32 (at least twice the cache bytes: an upper bound for a step that streams its cache).
    // Said once.
    if (!analytic && op.kind == OpKind::Attention && op.dtype != DType::F32 &&
        !measured(env.backend, op.kind, op.dtype)) {
      const DType from = measured(env.backend, op.kind, DType::F16) ? DType::F16 : DType::F32;
      if (measured(env.backend, op.kind, from)) {
        warn_once(str_cat("the profile ", origin_, " has no ", backend_name(env.backend), " attention rows over a ",
                          dtype_name(op.dtype), " KV cache: priced from its ", dtype_name(from), " rows (",
                          from == DType::F32 ? "an upper bound" : "an estimate", "; re-run `shardwise profile` to ",
                          "measure them)"));
        Op p = op;
        p.dtype = from;
        return measured_op_ms(p, env);
      }
    }
    // A vision encoder's attention where the profile has no rows of its kernel (profiles older than
    // them): priced by the language model's attention rows over an f32 cache of the segment's length.
    if (!analytic && op.kind == OpKind::VisionAttention && !measured(env.backend, op.kind, DType::F32)) {
      warn_once(str_cat("the profile ", origin_, " has no ", backend_name(env.backend),
                        " vision attention rows: priced from its attention rows (re-run `shardwise profile` to ",
                        "measure them)"));
      Op p = op;
      p.kind = OpKind::Attention;
      p.dtype = DType::F32;
      return measured_op_ms(p, env);
    }
    if (!analytic && !sized_by_elems(op.kind) && dtype_is_quantized(op.dtype) &&
        !measured(env.backend, op.kind, op.dtype)) {
      const DType proxy = proxy_dtype(env.backend, op.kind, op.dtype);
      if (proxy != op.dtype) {
        Op p = op;
        p.dtype = proxy;
        const double t = measured_op_ms(p, env);
        return op.tokens <= kProxyBytesTokens ? t * op.weight_bytes() / p.weight_bytes() : t;
      }
    }
    return measured_op_ms(op, env);
  }

  static constexpr int64_t kProxyBytesTokens = 16;

  bool measured(Backend b, OpKind k, DType dt) const { return measured_.count(class_key(b, k, dt, 0, false)) != 0; }

  // The measured quantised type of (backend, kind) nearest in bits per weight (dt itself if none).
  DType proxy_dtype(Backend b, OpKind k, DType dt) const {
    DType best = dt;
    double gap = 1e9;
    for (DType c : kAllDTypes)
      if (dtype_is_quantized(c) && measured(b, k, c) &&
          std::fabs(dtype_bits_per_elem(c) - dtype_bits_per_elem(dt)) < gap) {
        gap = std::fabs(dtype_bits_per_elem(c) - dtype_bits_per_elem(dt));
        best = c;
      }
    return best;
  }

  double measured_op_ms(const Op& op, const ExecEnv& env) const {
    // Past the MoE rows' largest measured count (uniform routing, n_last tokens: d_last experts of
    // m_last tokens each), an expert's time at m tokens is the last row's per expert times how much
    // the expert's three matmuls (gate, up: rows x cols; down: cols x rows) grow from m_last to m
    // tokens in the profile's matmul rows: those measure the GEMM's efficiency rising with tokens,
    // which the MoE rows' roofline fit, kept from their last count, did not (qwen30b q4_0 on the
    // H200 host's 16 threads: rows to 512 tokens = 32 per expert; a 512-token step on 9.6 measured
    // experts runs 427 per expert and was predicted 1.6x its time: planner_accuracy_v9).
    if (op.kind == OpKind::MoeExperts && op.top_k > 0 && op.n_experts > 0) {
      const double d =
          op.active_experts > 0 ? op.active_experts : expected_distinct_experts(op.tokens, op.top_k, op.n_experts);
      const double m = std::max(1.0, static_cast<double>(op.tokens) * static_cast<double>(op.top_k) / d);
      auto past_rows = [&](double n_last) {
        return n_last >= 1 && m > uniform_tokens_per_expert(n_last, op) * (1 + 1e-9);
      };
      int t_lo = 0, t_hi = 0;
      if (between_thread_counts(op, env, &t_lo,
                                &t_hi)) {  // each profiled count with its own rows, then log-log in threads
        ExecEnv lo = env, hi = env;
        lo.threads = t_lo;
        hi.threads = t_hi;
        if (past_rows(moe_last_tokens(op, lo)) || past_rows(moe_last_tokens(op, hi)))
          return loglog(env.threads, t_lo, op_ms(op, lo), t_hi, op_ms(op, hi));
      }
      const double n_last = moe_last_tokens(op, env);
      if (past_rows(n_last)) {
        const double d_last = expected_distinct_experts(static_cast<int64_t>(n_last), op.top_k, op.n_experts);
        const double m_last = uniform_tokens_per_expert(n_last, op);
        const double c_last = expert_matmuls_ms(op, m_last, env), c_m = expert_matmuls_ms(op, m, env);
        if (c_last > 0 && c_m > 0 && std::isfinite(c_last) && std::isfinite(c_m)) {
          Op last = op;
          last.active_experts = 0;
          last.tokens = static_cast<int64_t>(n_last);
          return d * op_ms(last, env) / d_last * (c_m / c_last);
        }
      }
    }
    // The profile's MoE rows were measured with uniform random routing. A step whose routing was
    // measured to touch d experts runs d experts of m = n·k/d routed tokens each: the time of one
    // expert at m tokens comes from the uniform row whose tokens-per-expert is also m (its time over
    // its expected distinct experts; per-expert launches and GEMM efficiency included), times d.
    if (op.kind == OpKind::MoeExperts && op.active_experts > 0 && op.top_k > 0 && op.n_experts > 0) {
      const double d = op.active_experts, k = static_cast<double>(op.top_k);
      const double m = std::max(1.0, static_cast<double>(op.tokens) * k / d);
      double lo = 1, hi = 1;
      while (uniform_tokens_per_expert(hi, op) < m && hi < 1e9) hi *= 2;
      for (int i = 0; i < 60 && hi - lo > 0.5; ++i) {
        const double mid = 0.5 * (lo + hi);
        (uniform_tokens_per_expert(mid, op) < m ? lo : hi) = mid;
      }
      Op uniform = op;
      uniform.active_experts = 0;
      uniform.tokens = std::max<int64_t>(1, static_cast<int64_t>(std::llround(hi)));
      const double du = expected_distinct_experts(uniform.tokens, op.top_k, op.n_experts);
      return du > 0 ? d * op_ms(uniform, env) / du : op_ms(uniform, env);
    }
    const DType dt = class_dtype(op);
    if (env.backend == Backend::Gpu) {
      if (!has_gpu_) return gpu_fallback().op_ms(op, env);
      return find_class(Backend::Gpu, op.kind, dt, 0, false).ms(op);
    }
    auto fam = cpu_threads_.find(class_key(Backend::Cpu, op.kind, dt, 0, false));
    if (sized_by_elems(op.kind))
      for (OpKind proxy : {OpKind::Elementwise, OpKind::Norm, OpKind::Rope, OpKind::Embed})
        if (fam == cpu_threads_.end()) fam = cpu_threads_.find(class_key(Backend::Cpu, proxy, dt, 0, false));
    if (fam == cpu_threads_.end()) missing_class(Backend::Cpu, op.kind, dt);
    const std::vector<int>& T = fam->second;
    const int t = std::max(1, env.threads);
    if (t <= T.front()) return cpu_ms(op, dt, T.front(), env.concurrent_pcie_gbps);
    if (t >= T.back()) return cpu_ms(op, dt, T.back(), env.concurrent_pcie_gbps);
    const size_t i = static_cast<size_t>(std::lower_bound(T.begin(), T.end(), t) - T.begin());
    if (T[i] == t) return cpu_ms(op, dt, t, env.concurrent_pcie_gbps);
    return loglog(t, T[i - 1], cpu_ms(op, dt, T[i - 1], env.concurrent_pcie_gbps), T[i],
                  cpu_ms(op, dt, T[i], env.concurrent_pcie_gbps));
  }

  double transfer_ms(uint64_t bytes, Direction dir, bool pinned) const override {
    if (!has_gpu_) return gpu_fallback().transfer_ms(bytes, dir, pinned);
    if (bytes == 0) return 0;
    const CopyCurve& c = copy_curve(dir, pinned);
    const double b = static_cast<double>(bytes);
    // Below the smallest size measured under the cap, copies run unpaced (the executor holds only
    // copies of 64 KiB and more to the cap, the profiler's smallest size): the uncapped rows time them.
    const CopyCurve& u = unpaced_[dir == Direction::HostToDevice ? 0 : 1][pinned ? 0 : 1];
    if (c.cap_gbps == 0 && cap_gbps_ > 0 && !u.bytes.empty() && b < c.bytes.front()) return u.ms_at(b);
    return c.ms_at(b);
  }

  // Each copy of a burst at the profile's back-to-back time per copy (the copy engine's cost per
  // transfer included, the synchronisation's latency not), and never faster than all the bytes as one
  // copy (which also holds them to a cap). Without burst rows: one copy of all the bytes. (qwen30b's
  // routed experts go as 24 copies of ~0.9 MB per layer: 470 us measured where one 21 MB copy takes
  // 403.)
  double transfer_burst_ms(uint64_t bytes, int copies, Direction dir) const override {
    const double whole = transfer_ms(bytes, dir, true);
    const CopyCurve& b = bursts_[dir == Direction::HostToDevice ? 0 : 1];
    if (!has_gpu_ || copies <= 1 || b.bytes.empty() || bytes == 0) return whole;
    return std::max(whole, copies * b.ms_at(static_cast<double>(bytes) / copies));
  }

  double pcie_gbps(Direction dir) const override {
    if (!has_gpu_) return gpu_fallback().pcie_gbps(dir);
    return copy_curve(dir, true).gbps();
  }

  // The copy engines under CPU DRAM traffic: the profile's DRAM rows with copy traffic measured the
  // traffic's rate beside the CPU pool streaming DRAM; from the fewest threads to the most it fell by
  // s (H200 host: 98.1 -> 83.0 GB/s, s = 15%) while the pool read B_c (54.1 GB/s). A copy beside CPU
  // work reading b GB/s runs at its uncapped rate times 1 - s·min(1, b / B_c); a cap below that still
  // holds. (A Dynamic nemo8b decode's FFN copies ran at 0.91x their prediction beside CPU FFNs reading
  // ~39 GB/s.)
  double copy_slowdown(Direction dir, double cpu_dram_gbps) const override {
    if (!has_gpu_ || copy_drop_ <= 0 || copy_drop_cpu_gbps_ <= 0 || !(cpu_dram_gbps > 0)) return 1.0;
    const double f = 1.0 - copy_drop_ * std::min(1.0, cpu_dram_gbps / copy_drop_cpu_gbps_);
    const int d = dir == Direction::HostToDevice ? 0 : 1;
    const double free = uncapped_gbps_[d];
    const double now = copy_curve(dir, true).gbps();  // after the cap
    if (!(free > 0) || !(now > 0)) return 1.0 / f;
    return std::max(1.0, now / std::min(now, free * f));
  }

  double sync_ms() const override {
    if (!has_gpu_) return gpu_fallback().sync_ms();
    return sync_ms_;
  }
  double copy_issue_ms() const override {
    if (!has_gpu_) return gpu_fallback().copy_issue_ms();
    return cap_gbps_ > 0 ? paced_issue_ms_ : issue_ms_;
  }
  double launch_ms() const override {
    if (!has_gpu_) return gpu_fallback().launch_ms();
    return launch_ms_;
  }
  int max_threads() const override { return max_threads_; }
  uint64_t vram_bytes() const override { return vram_; }
  std::string describe() const override { return describe_; }

 private:
  // The largest uniform token count the profile measured for this MoE op on env's backend at
  // env.threads (a profiled count, or below the fewest / above the most); 0 when the rows do not say.
  double moe_last_tokens(const Op& op, const ExecEnv& env) const {
    const DType dt = class_dtype(op);
    int threads = 0;
    if (env.backend == Backend::Gpu) {
      if (!has_gpu_) return 0;
    } else {
      auto fam = cpu_threads_.find(class_key(Backend::Cpu, op.kind, dt, 0, false));
      if (fam == cpu_threads_.end()) return 0;
      threads = std::min(std::max(env.threads, fam->second.front()), fam->second.back());
    }
    auto it = classes_.find(class_key(env.backend, op.kind, dt, threads, false));
    return it == classes_.end() ? 0.0 : it->second.last_tokens(op);
  }

  // The profiled CPU thread counts around env.threads when it lies strictly between two, else false.
  bool between_thread_counts(const Op& op, const ExecEnv& env, int* lo, int* hi) const {
    if (env.backend != Backend::Cpu) return false;
    auto fam = cpu_threads_.find(class_key(Backend::Cpu, op.kind, class_dtype(op), 0, false));
    if (fam == cpu_threads_.end()) return false;
    const std::vector<int>& T = fam->second;
    const int t = std::max(1, env.threads);
    if (t <= T.front() || t >= T.back()) return false;
    const size_t i = static_cast<size_t>(std::lower_bound(T.begin(), T.end(), t) - T.begin());
    if (T[i] == t) return false;
    *lo = T[i - 1];
    *hi = T[i];
    return true;
  }

  // One expert's three matmuls at m tokens (log-log between the integer counts around m), from the
  // profile's matmul rows of the MoE's weight dtype; 0 where the profile has none.
  double expert_matmuls_ms(const Op& moe, double m, const ExecEnv& env) const {
    const DType dt = class_dtype(moe);
    if (env.backend == Backend::Gpu
            ? !has_gpu_ || !classes_.count(class_key(Backend::Gpu, OpKind::Matmul, dt, 0, false))
            : !cpu_threads_.count(class_key(Backend::Cpu, OpKind::Matmul, dt, 0, false)))
      return 0;
    auto at = [&](int64_t n) {
      Op gate;
      gate.kind = OpKind::Matmul;
      gate.dtype = moe.dtype;
      gate.tokens = n;
      gate.rows = moe.rows;
      gate.cols = moe.cols;
      Op down = gate;
      down.rows = moe.cols;
      down.cols = moe.rows;
      return 2 * op_ms(gate, env) + op_ms(down, env);
    };
    const double lo = std::max(1.0, std::floor(m)), hi = std::max(1.0, std::ceil(m));
    if (hi == lo) return at(static_cast<int64_t>(lo));
    return loglog(m, lo, at(static_cast<int64_t>(lo)), hi, at(static_cast<int64_t>(hi)));
  }

  const CostModel& gpu_fallback() const {
    if (!fallback_)
      fail("the profile ", origin_,
           " has no GPU rows (measured on a machine without a GPU): plan with --hw NAME or a GPU profile");
    return *fallback_;
  }

  [[noreturn]] void missing_class(Backend b, OpKind k, DType dt) const {
    std::string have;
    for (const auto& [key, c] : measured_)
      if (static_cast<Backend>(key >> 60) == b) {
        const std::string name = c;
        if (have.find(name) == std::string::npos) have += (have.empty() ? "" : ", ") + name;
      }
    fail("the profile ", origin_, " has no ", backend_name(b), " measurements of ", op_kind_name(k),
         sized_by_elems(k) ? "" : str_cat(" ", dtype_name(dt)), " (it measured: ", have.empty() ? "nothing" : have,
         "): re-run `shardwise profile` with a profiler that covers it, or plan a model whose dtypes were measured");
  }

  const Class& find_class(Backend b, OpKind k, DType dt, int threads, bool contention) const {
    auto it = classes_.find(class_key(b, k, dt, threads, contention));
    if (it != classes_.end()) return it->second;
    // The f32 streaming ops stand in for each other (the profiler times rope and embed on the CPU only).
    if (sized_by_elems(k))
      for (OpKind proxy : {OpKind::Elementwise, OpKind::Norm, OpKind::Rope, OpKind::Embed}) {
        it = classes_.find(class_key(b, proxy, dt, threads, contention));
        if (it != classes_.end()) return it->second;
      }
    missing_class(b, k, dt);
  }

  // CPU time with exactly `threads` (a profiled count) while copies move `concurrent_gbps` through
  // host DRAM. The CPU and the copy engines share the DRAM: a contention row read the op's bytes at
  // B_c = bytes / t_c while copies moved g_c beside it, so the DRAM served C = B_c + g_c; with g of
  // copies the op gets C - g: t(g) = max(t_alone, bytes / (C - g)), the contention row at g = g_c.
  // (A blend linear in g put a decode FFN under one-way streaming at 68 GB/s on the H200 host where
  // the executor's timeline measured 94, C ~ 148 GB/s both times.)
  double cpu_ms(const Op& op, DType dt, int threads, double concurrent_gbps) const {
    const double alone = find_class(Backend::Cpu, op.kind, dt, threads, false).ms(op);
    if (concurrent_gbps <= 0) return alone;
    auto it = classes_.find(class_key(Backend::Cpu, op.kind, dt, threads, true));
    if (it == classes_.end()) return alone;
    const Class& c = it->second;
    const double contended = c.ms(op);
    const double gb = op_bytes(op) / 1e9;
    if (c.concurrent_gbps <= 0 || gb <= 0 || !(contended > alone)) return std::max(alone, contended);
    const double g = std::min(concurrent_gbps, c.concurrent_gbps);
    const double dram_gbps = gb / (contended / 1e3) + c.concurrent_gbps;
    return std::max(alone, gb / (dram_gbps - g) * 1e3);
  }

  const CopyCurve& copy_curve(Direction dir, bool pinned) const {
    const CopyCurve& c = copies_[dir == Direction::HostToDevice ? 0 : 1][pinned ? 0 : 1];
    if (c.bytes.empty())
      fail("the profile ", origin_, " has no ", dir == Direction::HostToDevice ? "host-to-device" : "device-to-host",
           " copies measured", cap_gbps_ > 0 ? str_cat(" uncapped or at ", cap_gbps_, " GB/s") : "",
           ": re-run `shardwise profile` on the GPU machine");
    return c;
  }

  void index_ops(const ProfileDB& db, bool use_contention) {
    std::map<uint64_t, std::vector<const OpSample*>> rows;
    for (const OpSample& s : db.ops) {
      if (s.contention && (!use_contention || s.backend == Backend::Gpu))
        continue;  // GPU rows under DRAM load: not modelled
      if (s.backend == Backend::Gpu && !has_gpu_) continue;
      const DType dt = class_dtype(s.op);
      rows[class_key(s.backend, s.op.kind, dt, s.threads, s.contention)].push_back(&s);
      if (!s.contention) {
        const std::string name =
            sized_by_elems(s.op.kind) ? op_kind_name(s.op.kind) : str_cat(op_kind_name(s.op.kind), " ", dtype_name(dt));
        measured_[class_key(s.backend, s.op.kind, dt, 0, false)] = name;
      }
    }
    // The fits: those stored, else fitted now (a profile written without them).
    std::map<uint64_t, RooflineFit> fits;
    for (const RooflineFit& f : db.fits) fits[class_key(f.backend, f.kind, f.dtype, f.threads, f.contention)] = f;
    bool missing = false;
    for (const auto& r : rows) missing |= !fits.count(r.first);
    if (missing) {
      ProfileDB copy = db;
      fit_profile(copy);
      for (const RooflineFit& f : copy.fits)
        fits.emplace(class_key(f.backend, f.kind, f.dtype, f.threads, f.contention), f);
    }

    for (auto& [key, samples] : rows) {
      Class c;
      const OpSample& first = *samples.front();
      c.by_elems = sized_by_elems(first.op.kind);
      c.fit = fits.at(key);
      std::unordered_map<ShapeKey, std::vector<std::pair<double, double>>, ShapeHash> pts;
      std::vector<double> rates;
      for (const OpSample* s : samples) {
        const ShapeKey k = shape_key(s->op);
        if (!c.shapes.count(k)) c.shapes[k].proto = s->op;
        pts[k].emplace_back(static_cast<double>(c.by_elems ? s->op.elems : s->op.tokens), s->ms);
        rates.push_back(s->concurrent_gbps);
      }
      for (auto& [k, v] : pts) sort_merge(v, &c.shapes[k].x, &c.shapes[k].ms);
      std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
      c.concurrent_gbps = rates[rates.size() / 2];
      if (!c.by_elems) index_token_fits(c, first.backend == Backend::Gpu && first.op.kind == OpKind::Matmul);
      classes_.emplace(key, std::move(c));
      if (first.backend == Backend::Cpu && !first.contention) {
        auto& T = cpu_threads_[class_key(Backend::Cpu, first.op.kind, class_dtype(first.op), 0, false)];
        T.insert(std::lower_bound(T.begin(), T.end(), first.threads), first.threads);
      }
    }
  }

  // At every token count measured for >= 3 shapes: ms = c + a·bytes + b·flops, non-negative least
  // squares in relative error (weights 1/ms), columns scaled to [0, 1]; or the roofline form where
  // its relative error is smaller.
  static void index_token_fits(Class& c, bool row_length_term) {
    std::map<double, std::vector<std::pair<const Curve*, double>>> by_tokens;  // tokens -> (shape, ms)
    for (const auto& [k, curve] : c.shapes)
      for (size_t i = 0; i < curve.x.size(); ++i) by_tokens[curve.x[i]].emplace_back(&curve, curve.ms[i]);
    for (const auto& [n, pts] : by_tokens) {
      if (pts.size() < 3) continue;
      std::vector<double> B, F, K;
      double sb = 0, sf = 0, sk = 0;
      for (const auto& p : pts) {
        Op q = p.first->proto;
        q.tokens = static_cast<int64_t>(n);
        B.push_back(op_bytes(q));
        F.push_back(q.flops());
        K.push_back(static_cast<double>(q.cols));
        sb = std::max(sb, B.back());
        sf = std::max(sf, F.back());
        sk = std::max(sk, K.back());
      }
      if (sb <= 0 || sf <= 0) continue;
      const bool with_k = row_length_term && sk > 0 && pts.size() >= 4;
      Eigen::MatrixXd A(pts.size(), with_k ? 4 : 3);
      for (size_t i = 0; i < pts.size(); ++i) {
        const double w = 1.0 / pts[i].second;
        A(i, 0) = w;
        A(i, 1) = B[i] / sb * w;
        A(i, 2) = F[i] / sf * w;
        if (with_k) A(i, 3) = K[i] / sk * w;
      }
      const Nnls s = nnls_design(A, Eigen::VectorXd::Ones(pts.size()));
      std::vector<FitPoint> fp;
      for (size_t i = 0; i < pts.size(); ++i) fp.push_back({B[i], F[i], pts[i].second});
      const RooflineParams r = fit_roofline(fp);
      if (s.ok && s.objective <= r.rel_sse) {
        TokenFit f{n, s.x(0), s.x(1) / sb, s.x(2) / sf, false};
        if (with_k) f.d = s.x(3) / sk;
        c.token_fits.push_back(f);
      } else {
        c.token_fits.push_back({n, r.o, r.x, r.y, true});
      }
    }
  }

  void index_copies(const ProfileDB& db) {
    for (int d = 0; d < 2; ++d)
      for (int p = 0; p < 2; ++p) {
        const Direction dir = d == 0 ? Direction::HostToDevice : Direction::DeviceToHost;
        const bool pinned = p == 0;
        // Rows measured under this very cap, else the uncapped rows held to the cap.
        std::vector<std::pair<double, double>> capped, free;
        for (const TransferSample& t : db.transfers) {
          if (t.dir != dir || t.pinned != pinned || t.burst > 1) continue;
          if (cap_gbps_ > 0 && std::fabs(t.cap_gbps - cap_gbps_) <= 1e-3 * cap_gbps_)
            capped.emplace_back(static_cast<double>(t.bytes), t.ms);
          else if (t.cap_gbps == 0)
            free.emplace_back(static_cast<double>(t.bytes),
                              cap_gbps_ > 0 ? std::max(t.ms, static_cast<double>(t.bytes) / (cap_gbps_ * 1e6)) : t.ms);
        }
        auto& pts = capped.empty() ? free : capped;
        if (!pts.empty()) sort_merge(pts, &copies_[d][p].bytes, &copies_[d][p].ms);
        copies_[d][p].cap_gbps = capped.empty() ? cap_gbps_ : 0;
        if (!capped.empty()) {
          std::vector<std::pair<double, double>> plain;
          for (const TransferSample& t : db.transfers)
            if (t.dir == dir && t.pinned == pinned && t.cap_gbps == 0 && t.burst == 1)
              plain.emplace_back(static_cast<double>(t.bytes), t.ms);
          if (!plain.empty()) sort_merge(plain, &unpaced_[d][p].bytes, &unpaced_[d][p].ms);
        }
      }
    // The uncapped pinned rate of each direction (its largest copy).
    for (const TransferSample& t : db.transfers)
      if (t.pinned && t.cap_gbps == 0 && t.ms > 0 && t.burst == 1) {
        const int d = t.dir == Direction::HostToDevice ? 0 : 1;
        if (t.bytes >= uncapped_bytes_[d]) {
          uncapped_bytes_[d] = t.bytes;
          uncapped_gbps_[d] = static_cast<double>(t.bytes) / (t.ms * 1e6);
        }
      }
    // Back-to-back bursts (pinned, uncapped): time per copy by size.
    for (int d = 0; d < 2; ++d) {
      std::vector<std::pair<double, double>> pts;
      for (const TransferSample& t : db.transfers)
        if (t.burst > 1 && t.pinned && t.cap_gbps == 0 && (t.dir == Direction::HostToDevice) == (d == 0))
          pts.emplace_back(static_cast<double>(t.bytes), t.ms);
      if (!pts.empty()) sort_merge(pts, &bursts_[d].bytes, &bursts_[d].ms);
    }
    // Pageable copies not measured: the pinned ones (a pageable copy is never faster).
    for (int d = 0; d < 2; ++d)
      if (copies_[d][1].bytes.empty()) {
        copies_[d][1] = copies_[d][0];
        unpaced_[d][1] = unpaced_[d][0];
      }
  }

  void index_copy_contention(const ProfileDB& db) {
    const DramSample* lo = nullptr;
    const DramSample* hi = nullptr;
    for (const DramSample& d : db.dram) {
      if (!d.contention || !(d.concurrent_gbps > 0)) continue;
      if (!lo || d.threads < lo->threads) lo = &d;
      if (!hi || d.threads > hi->threads) hi = &d;
    }
    if (!lo || !hi || hi->threads <= lo->threads) return;
    copy_drop_ = std::max(0.0, 1.0 - hi->concurrent_gbps / lo->concurrent_gbps);
    copy_drop_cpu_gbps_ = hi->gbps;
  }

  std::string origin_;
  bool has_gpu_;
  double sync_ms_, launch_ms_;
  double issue_ms_, paced_issue_ms_;  // ProfileDB copy_issue_ms, paced_copy_issue_ms
  double cap_gbps_;
  uint64_t vram_;
  double uncapped_gbps_[2] = {0, 0};  // pinned, by direction
  uint64_t uncapped_bytes_[2] = {0, 0};
  double copy_drop_ = 0, copy_drop_cpu_gbps_ = 0;  // copy_slowdown's s and B_c
  int max_threads_ = 1;
  std::string describe_;
  std::unique_ptr<CostModel> fallback_;
  std::unordered_map<uint64_t, Class> classes_;
  std::unordered_map<uint64_t, std::vector<int>> cpu_threads_;  // profiled thread counts of each CPU class (alone)
  std::map<uint64_t, std::string> measured_;                    // class (threads 0, alone) -> "matmul q4_0"
  CopyCurve copies_[2][2];                                      // [h2d, d2h][pinned, pageable]
  CopyCurve unpaced_[2][2];  // with rows measured under the cap: the uncapped rows (copies below their sizes)
  CopyCurve bursts_[2];      // [h2d, d2h]: time per copy of back-to-back copies (pinned, uncapped); may be empty
};

}  // namespace

std::unique_ptr<CostModel> make_measured_cost_model(const ProfileDB& db, const MeasuredOptions& options) {
  return std::make_unique<MeasuredCostModel>(db, options);
}

}  // namespace shardwise

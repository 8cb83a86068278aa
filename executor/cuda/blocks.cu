// executor/cuda/blocks.cu — DeviceKernels on CUDA (see cuda_kernels.h): the transformer blocks
// composed from the kernel families of kernels.cuh, following cpu_blocks.cpp / llama.cpp /
// qwen3_moe.cpp step by step. Blocks go through the step's tokens in chunks sized to the workspace
// (every token's work is independent once K/V rows before it are in the cache, so chunking changes
// no number). Decode-sized steps use fused GEMV passes (q/k/v in one launch, gate/up with SwiGLU in
// one pass, MoE experts as tasks of one launch); MoE routing comes from the host and is uploaded
// through a pinned staging ring whose buffers are reused only after their copy has completed. At the
// end, the set-up's warm-up (cuda_kernels_warm_up): every kernel the blocks can launch, run once
// before the arena so that lazy module loading takes no device memory afterwards.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "executor/cpu/ops.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"
#include "executor/model/cpu_blocks.h"
#include "executor/traits.h"

namespace shardwise {

namespace cuda {
__device__ float g_zero_one[2] = {0.0f, 1.0f};
}  // namespace cuda

namespace {

using namespace cuda;

// Pinned host buffers for host -> device tables, used round-robin; a buffer is refilled only after
// the copy that last read it has completed (an event per buffer).
class PinnedRing {
 public:
  static constexpr int kSlots = 4;
  PinnedRing() = default;
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;
  ~PinnedRing() {
    for (Slot& s : slots_) {
      if (s.pending) cudaEventSynchronize(s.done);
      if (s.host) cudaFreeHost(s.host);
      if (s.done) cudaEventDestroy(s.done);
    }
  }
  void* acquire(uint64_t bytes, cudaStream_t stream) {
    current_ = next_;
    next_ = (next_ + 1) % kSlots;
    Slot& s = slots_[current_];
    if (!s.done) check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    settle(s);
    if (s.bytes < bytes) {
      if (s.host) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      grow(s, bytes);
    }
    return s.host;
  }
  // Every buffer (and its event) now, of at least `bytes`: part of the set-up, so that steps up to
  // that size never allocate pinned memory (whose device page tables count once the arena exists).
  void reserve(uint64_t bytes) {
    for (Slot& s : slots_) {
      if (!s.done) check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      if (s.bytes >= bytes) continue;
      settle(s);
      grow(s, bytes);
    }
  }
  // After the copy out of the buffer last acquired has been enqueued on `stream`.
  void submitted(cudaStream_t stream) {
    Slot& s = slots_[current_];
    check(cudaEventRecord(s.done, stream), "cudaEventRecord(staging)");
    s.pending = true;
  }

 private:
  struct Slot {
    void* host = nullptr;
    uint64_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  // Waits for the copy that last read the slot's buffer.
  static void settle(Slot& s) {
    if (!s.pending) return;
    check(cudaEventSynchronize(s.done), "cudaEventSynchronize(staging)");
    s.pending = false;
  }
  // A new buffer of at least `bytes` (powers of two from 64 KiB) in place of the slot's (settled) one.
  static void grow(Slot& s, uint64_t bytes) {
    if (s.host) {
      check(cudaFreeHost(s.host), "cudaFreeHost");
      s.host = nullptr;
      s.bytes = 0;
    }
    uint64_t cap = 64 << 10;
    while (cap < bytes) cap *= 2;
    check(cudaMallocHost(&s.host, cap), "cudaMallocHost(staging)");
    s.bytes = cap;
  }
  Slot slots_[kSlots];
  int next_ = 0, current_ = 0;
};

MatRef mat(const DevMat& m, int64_t rows, int64_t cols, const char* name) {
  SW_CHECK(m.data != nullptr, "CUDA blocks: weight ", name, " is not on the device");
  SW_CHECK(m.rows == rows && m.cols == cols, "CUDA blocks: weight ", name, " is ", m.rows, " x ", m.cols, ", expected ",
           rows, " x ", cols);
  MatRef r;
  r.dtype = m.dtype;
  r.data = m.data;
  r.rows = m.rows;
  r.cols = m.cols;
  return r;
}

// Workspace that one token of a block wants: its own buffers plus the matmul's split of x.
uint64_t split_bytes(DType dtype, int64_t cols) {
  return matmul_bytes_per_token(dtype, cols);
}

// The executor's traits tell the planner how this file runs a GPU step's attention (traits.h).
static_assert(kGemvMaxTokens == kGpuFusedQkvMaxTokens, "Q, K, V run as one batched GEMV up to this many tokens");

class WarmUp;

class CudaKernels : public DeviceKernels {
 public:
  CudaKernels(const ModelSpec& spec, RopeStyle rope, cudaStream_t stream, cublasHandle_t blas)
      : spec_(spec), rope_(rope) {
    SW_CHECK(blas != nullptr, "CUDA blocks: no cuBLAS handle");
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    void* consts = nullptr;
    check(cudaGetSymbolAddress(&consts, g_zero_one), "cudaGetSymbolAddress");
    ctx_.stream = stream;
    ctx_.blas = blas;
    ctx_.ws = &ws_;
    ctx_.sm_count = std::max(1, sms);
    ctx_.dev_zero_one = static_cast<const float*>(consts);
    eps_ = static_cast<float>(spec_.rms_norm_eps);
  }
  ~CudaKernels() override { cudaStreamSynchronize(ctx_.stream); }

  // Pinned staging for steps of up to n tokens (RoPE table, MoE routing tables), allocated now.
  void reserve_staging(int64_t n) {
    const uint64_t N = static_cast<uint64_t>(std::max<int64_t>(n, 1));
    const uint64_t K = static_cast<uint64_t>(std::max<int64_t>(1, spec_.num_experts_per_tok));
    const uint64_t rope = 2 * N * static_cast<uint64_t>(spec_.head_dim / 2) * sizeof(float);
    const uint64_t moe =
        spec_.is_moe() ? align_up((2 * N * K + N + 1) * sizeof(int32_t)) + N * K * sizeof(float) + 16 : 0;
    const uint64_t tables =
        spec_.is_moe() ? 3 * static_cast<uint64_t>(spec_.num_experts) * sizeof(const uint8_t*) : 0;  // ffn_routed
    staging_.reserve(std::max({rope, moe, tables}));
  }

  void set_workspace(uint8_t* dev, uint64_t bytes) override {
    ws_.reset(dev, bytes);
    step_ready_ = false;
    step_base_ = 0;
  }

  void prepare_segments(const std::vector<StepSegment>& segments) override {
    const int64_t n = segments_tokens(segments);
    // The CPU's own angle table (double-precision angles rounded to f32), so RoPE is bit-identical.
    const RopeAngles angles = step_rope_angles(spec_, segments);
    const int64_t half = spec_.head_dim / 2;
    ws_.release(0);
    float* table = ws_.take<float>(static_cast<uint64_t>(2 * n * half), "the step's RoPE angle table");
    const uint64_t bytes = static_cast<uint64_t>(2 * n * half) * sizeof(float);
    auto* host = static_cast<float*>(staging_.acquire(bytes, ctx_.stream));
    std::memcpy(host, angles.cos.data(), static_cast<size_t>(n * half) * sizeof(float));
    std::memcpy(host + n * half, angles.sin.data(), static_cast<size_t>(n * half) * sizeof(float));
    check(cudaMemcpyAsync(table, host, bytes, cudaMemcpyHostToDevice, ctx_.stream), "cudaMemcpyAsync(RoPE table)");
    staging_.submitted(ctx_.stream);
    rope_cos_ = table;
    rope_sin_ = table + n * half;
    segments_ = segments;
    n_step_ = n;
    step_base_ = ws_.mark();
    step_ready_ = true;
  }

  void kv_layout(const void* src, void* dst, int64_t capacity, int64_t p0, int64_t p1, bool to_positions) override {
    if (p1 == p0) return;
    cuda::kv_layout(ctx_, src, dst, capacity, static_cast<int32_t>(spec_.num_key_value_heads),
                    static_cast<int32_t>(spec_.head_dim), p0, p1, to_positions, kv_dtype_);
  }

  void set_kv_dtype(DType t) override {
    SW_CHECK(is_kv_dtype(t), "the CUDA kernels keep the KV cache in ", kKvDtypeNames, ", not ", dtype_name(t));
    check_kv_head_dim(t, spec_.head_dim, "the CUDA KV cache");
    kv_dtype_ = t;
  }

  void attention(const DevLayer& w, float* x, int64_t n, void* k_cache, void* v_cache) override {
    check_step(n, "attention");
    SW_CHECK(k_cache != nullptr && v_cache != nullptr, "CUDA attention: no KV cache");
    const int64_t H = spec_.hidden_size, QD = spec_.q_dim(), KVD = spec_.kv_dim(), W = QD + 2 * KVD;
    const Proj p = projections(w);
    const MatRef wo = mat(w.wo, H, QD, "attn_output");
    WorkspaceScope scope(ws_);
    const uint64_t per_token = 4 * static_cast<uint64_t>(H + W + QD) + 1024 +
                               std::max(p.split_bytes, split_bytes(wo.dtype, QD)) +
                               static_cast<uint64_t>(spec_.num_attention_heads) * (spec_.head_dim + 2) * 4;
    const uint64_t fixed = std::max(p.fixed_bytes, matmul_fixed_bytes(wo.dtype, wo.rows, wo.cols));
    const int64_t chunk = pick_chunk(n, per_token, fixed, "attention");
    float* xn = ws_.take<float>(static_cast<uint64_t>(chunk * H), "attention: normed x");
    float* qkv = ws_.take<float>(static_cast<uint64_t>(chunk * W), "attention: q, k, v");
    float* attn = ws_.take<float>(static_cast<uint64_t>(chunk * QD), "attention: output");
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t m = std::min(chunk, n - c0);
      rms_norm(ctx_, x + c0 * H, H, w.attn_norm, eps_, xn, H, m, H);
      project_qkv(p, xn, m, qkv);
      rope_qk(w, qkv, c0, m, k_cache, v_cache);
      // Each sequence's tokens over its own rows of the caches.
      for_pieces(c0, m, [&](int64_t t, int64_t len, int64_t pos, int64_t row0) {
        AttnArgs a;
        a.q = qkv + (t - c0) * W;
        a.q_stride = W;
        a.k = kv_row(k_cache, row0);
        a.v = kv_row(v_cache, row0);
        a.kv_stride = KVD;
        a.kv_dtype = kv_dtype_;
        a.out = attn + (t - c0) * QD;
        a.out_stride = QD;
        a.n = static_cast<int32_t>(len);
        a.pos_first = static_cast<int32_t>(pos);
        a.n_heads = static_cast<int32_t>(spec_.num_attention_heads);
        a.n_kv_heads = static_cast<int32_t>(spec_.num_key_value_heads);
        a.head_dim = static_cast<int32_t>(spec_.head_dim);
        cuda::attention(ctx_, a);
      });
      matmul(ctx_, wo, attn, QD, m, x + c0 * H, H, /*accumulate=*/true);
    }
  }

  void attention_pre(const DevLayer& w, const float* x, int64_t n, float* qkv) override {
    check_step(n, "attention_pre");
    const int64_t H = spec_.hidden_size, W = spec_.q_dim() + 2 * spec_.kv_dim();
    const Proj p = projections(w);
    WorkspaceScope scope(ws_);
    const int64_t chunk =
        pick_chunk(n, 4 * static_cast<uint64_t>(H) + 256 + p.split_bytes, p.fixed_bytes, "attention_pre");
    float* xn = ws_.take<float>(static_cast<uint64_t>(chunk * H), "attention_pre: normed x");
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t m = std::min(chunk, n - c0);
      rms_norm(ctx_, x + c0 * H, H, w.attn_norm, eps_, xn, H, m, H);
      project_qkv(p, xn, m, qkv + c0 * W);
      rope_qk(w, qkv + c0 * W, c0, m, nullptr, nullptr);
    }
  }

  void attention_post(const DevLayer& w, float* x, const float* attn, int64_t n) override {
    const int64_t H = spec_.hidden_size, QD = spec_.q_dim();
    const MatRef wo = mat(w.wo, H, QD, "attn_output");
    WorkspaceScope scope(ws_);
    matmul(ctx_, wo, attn, QD, n, x, H, /*accumulate=*/true);
  }

  void router(const DevLayer& w, const float* x, int64_t n, float* logits) override {
    SW_CHECK(spec_.is_moe(), "CUDA router: the model has no experts");
    const int64_t H = spec_.hidden_size, E = spec_.num_experts;
    const MatRef wr = mat(w.router, E, H, "ffn_gate_inp (router)");
    WorkspaceScope scope(ws_);
    const int64_t chunk = pick_chunk(n, 4 * static_cast<uint64_t>(H) + 256 + split_bytes(wr.dtype, H),
                                     matmul_fixed_bytes(wr.dtype, wr.rows, wr.cols), "router");
    float* xn = ws_.take<float>(static_cast<uint64_t>(chunk * H), "router: normed x");
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t m = std::min(chunk, n - c0);
      rms_norm(ctx_, x + c0 * H, H, w.ffn_norm, eps_, xn, H, m, H);
      matmul(ctx_, wr, xn, H, m, logits + c0 * E, E, /*accumulate=*/false);
    }
  }

  void ffn(const DevLayer& w, float* x, int64_t n, const MoeRouting* routing) override {
    if (n <= 0) return;
    if (spec_.is_moe()) {
      SW_CHECK(routing != nullptr, "MoE FFN block needs the tokens' routing");
      moe_ffn(w, x, n, *routing);
    } else {
      dense_ffn(w, x, n);
    }
  }

  // Where the routed kernels find expert e's matrices: at t* + e * s* when every matrix of a kind lies
  // evenly (s* > 0), else entry e of the pointer table t*; and whether every expert's matrix of a kind
  // can take the GEMV fast path.
  struct ExpertLookup {
    bool fast_gate = true, fast_up = true, fast_down = true, even = false;
    int64_t sg = 0, su = 0, sd = 0;
    const uint8_t *tg = nullptr, *tu = nullptr, *td = nullptr;
  };

  // The checks of device routing, and which experts' matrices are aligned for the fast path.
  void check_routed(const DevLayer& w, int64_t n, const float* logits, ExpertLookup& lk) const {
    const int64_t E = spec_.num_experts, K = spec_.num_experts_per_tok;
    SW_CHECK(spec_.is_moe(), "CUDA: device routing for a dense FFN");
    SW_CHECK(n <= kGemvMaxTokens, "CUDA MoE: device routing of ", n, " tokens (at most ", kGemvMaxTokens, ")");
    SW_CHECK(K >= 1 && K <= kMoeTopkMaxK && K <= E, "CUDA MoE: top-", K, " of ", E, " experts on the device");
    SW_CHECK(w.ffn_norm != nullptr && logits != nullptr,
             "CUDA MoE: ffn_norm or the router logits are not on the device");
    SW_CHECK(static_cast<int64_t>(w.gate_exp.size()) == E && static_cast<int64_t>(w.up_exp.size()) == E &&
                 static_cast<int64_t>(w.down_exp.size()) == E,
             "CUDA MoE: device routing needs every expert's matrices");
    auto entry_fast = [](DType t, const uint8_t* p) { return gemv_fast_aligned(t, p); };
    for (int64_t e = 0; e < E; ++e) {
      const size_t i = static_cast<size_t>(e);
      SW_CHECK(w.gate_exp[i] && w.up_exp[i] && w.down_exp[i], "CUDA MoE: expert ", e,
               " is not resident (device routing needs every expert)");
      lk.fast_gate = lk.fast_gate && entry_fast(w.gate_dtype, w.gate_exp[i]);
      lk.fast_up = lk.fast_up && entry_fast(w.up_dtype, w.up_exp[i]);
      lk.fast_down = lk.fast_down && entry_fast(w.down_dtype, w.down_exp[i]);
    }
  }

  // The experts' strides, or (not evenly laid out) their pointer tables, uploaded through pinned staging
  // into the workspace.
  void expert_tables(const DevLayer& w, ExpertLookup& lk) {
    const int64_t E = spec_.num_experts;
    // Evenly laid out experts: matrix e at v[0] + e * stride.
    auto stride_of = [&](const std::vector<const uint8_t*>& v) -> int64_t {
      if (E == 1) return 1;
      const int64_t s = v[1] - v[0];
      if (s <= 0) return 0;
      for (int64_t e = 2; e < E; ++e)
        if (v[static_cast<size_t>(e)] - v[0] != e * s) return 0;
      return s;
    };
    lk.sg = stride_of(w.gate_exp), lk.su = stride_of(w.up_exp), lk.sd = stride_of(w.down_exp);
    lk.even = lk.sg > 0 && lk.su > 0 && lk.sd > 0 && (lk.sg == lk.su || w.gate_dtype != w.up_dtype);
    lk.tg = w.gate_exp[0], lk.tu = w.up_exp[0], lk.td = w.down_exp[0];
    if (lk.even) return;
    const uint64_t tbytes = 3 * static_cast<uint64_t>(E) * sizeof(const uint8_t*);
    uint8_t* dtab = ws_.take<uint8_t>(tbytes, "MoE: expert tables");
    auto* host = static_cast<const uint8_t**>(staging_.acquire(tbytes, ctx_.stream));
    for (int64_t e = 0; e < E; ++e) {
      host[e] = w.gate_exp[static_cast<size_t>(e)];
      host[E + e] = w.up_exp[static_cast<size_t>(e)];
      host[2 * E + e] = w.down_exp[static_cast<size_t>(e)];
    }
    check(cudaMemcpyAsync(dtab, host, tbytes, cudaMemcpyHostToDevice, ctx_.stream),
          "cudaMemcpyAsync(MoE expert tables)");
    staging_.submitted(ctx_.stream);
    lk.tg = dtab;
    lk.tu = lk.tg + E * sizeof(const uint8_t*);
    lk.td = lk.tg + 2 * E * sizeof(const uint8_t*);
  }

  // The routed GEMV tasks, one per (token, chosen expert) slot i: gate (with up when fused) from xn into
  // h (and u), down from h into o, each finding its expert from ids[i].
  struct RoutedTasks {
    std::vector<GemvTask> gate, up, down;
  };
  RoutedTasks routed_tasks(const ExpertLookup& lk, bool fused, int64_t n, const int32_t* ids, const float* xn, float* h,
                           float* u, float* o) const {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size, K = spec_.num_experts_per_tok;
    RoutedTasks rt;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t i = t * K + j;
        GemvTask g;
        g.x = xn;
        g.ldx = H;
        g.rows = static_cast<int32_t>(F);
        g.cols = static_cast<int32_t>(H);
        g.nt = 1;
        g.tok[0] = static_cast<int32_t>(t);
        g.y = h + i * F;
        g.ldy = F;
        g.sel = ids + i;
        g.sel_stride = lk.even ? lk.sg : 0;
        g.w0 = lk.tg;
        g.w1 = fused ? lk.tu : nullptr;
        g.sel_fast = fused ? lk.fast_gate && lk.fast_up : lk.fast_gate;
        rt.gate.push_back(g);
        if (!fused) {
          GemvTask q = g;
          q.w0 = lk.tu;
          q.sel_stride = lk.even ? lk.su : 0;
          q.y = u + i * F;
          q.sel_fast = lk.fast_up;
          rt.up.push_back(q);
        }
        GemvTask d;
        d.x = h + i * F;
        d.ldx = F;
        d.rows = static_cast<int32_t>(H);
        d.cols = static_cast<int32_t>(F);
        d.nt = 1;
        d.y = o + i * H;
        d.ldy = H;
        d.sel = ids + i;
        d.sel_stride = lk.even ? lk.sd : 0;
        d.w0 = lk.td;
        d.sel_fast = lk.fast_down;
        rt.down.push_back(d);
      }
    return rt;
  }

  // Decode-sized MoE step routed on the device: top-k from the logits the router left there, then
  // gate/up (+SwiGLU) and down as GEMV tasks whose expert matrices the kernels find from the chosen
  // ids — at base + id * stride when the experts lie evenly (a pinned shard), else in pointer tables
  // uploaded through pinned staging — then the combine with the device-written table. Nothing
  // waits for the host.
  void ffn_routed(const DevLayer& w, float* x, int64_t n, const float* logits) override {
    if (n <= 0) return;
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size, E = spec_.num_experts,
                  K = spec_.num_experts_per_tok;
    ExpertLookup lk;
    check_routed(w, n, logits, lk);
    WorkspaceScope scope(ws_);
    const int64_t S = n * K;  // one slot per (token, chosen expert)
    expert_tables(w, lk);
    int32_t* ids = ws_.take<int32_t>(static_cast<uint64_t>(S), "MoE: routed experts");
    float* wts = ws_.take<float>(static_cast<uint64_t>(S), "MoE: routing weights");
    int32_t* off = ws_.take<int32_t>(static_cast<uint64_t>(n + 1), "MoE: combine offsets");
    int32_t* slot = ws_.take<int32_t>(static_cast<uint64_t>(S), "MoE: combine slots");
    float* xn = ws_.take<float>(static_cast<uint64_t>(n * H), "MoE: normed x");
    float* h = ws_.take<float>(static_cast<uint64_t>(S * F), "MoE: expert hidden");
    const bool fused = w.gate_dtype == w.up_dtype;
    float* u = fused ? nullptr : ws_.take<float>(static_cast<uint64_t>(S * F), "MoE: expert up");
    float* o = ws_.take<float>(static_cast<uint64_t>(S * H), "MoE: expert outputs");
    rms_norm(ctx_, x, H, w.ffn_norm, eps_, xn, H, n, H);
    MoeTopkArgs ta;
    ta.logits = logits;
    ta.n = static_cast<int32_t>(n);
    ta.n_experts = static_cast<int32_t>(E);
    ta.top_k = static_cast<int32_t>(K);
    ta.renormalize = spec_.norm_topk_prob;
    ta.ids = ids;
    ta.weights = wts;
    ta.off = off;
    ta.slot = slot;
    moe_topk(ctx_, ta);
    RoutedTasks rt = routed_tasks(lk, fused, n, ids, xn, h, u, o);
    if (fused) {
      gemv(ctx_, w.gate_dtype, GemvMode::SwiGLU, rt.gate.data(), static_cast<int>(rt.gate.size()));
    } else {
      gemv(ctx_, w.gate_dtype, GemvMode::Store, rt.gate.data(), static_cast<int>(rt.gate.size()));
      gemv(ctx_, w.up_dtype, GemvMode::Store, rt.up.data(), static_cast<int>(rt.up.size()));
      swiglu(ctx_, h, u, S, F, F);
    }
    gemv(ctx_, w.down_dtype, GemvMode::Store, rt.down.data(), static_cast<int>(rt.down.size()));
    combine_from_table(x, o, n, off, slot, wts);
  }

  // x[t] += token t's weighted expert outputs (rows of o), from a device table (see MoeCombineArgs).
  void combine_from_table(float* x, const float* o, int64_t n, const int32_t* off, const int32_t* slot,
                          const float* weight) {
    MoeCombineArgs c = combine_args(x, o, n);
    c.off = off;
    c.slot = slot;
    c.weight = weight;
    moe_combine(ctx_, c);
  }

  // The combine of n tokens' expert outputs o (rows of hidden width) into x; the table is the caller's.
  MoeCombineArgs combine_args(float* x, const float* o, int64_t n) const {
    const int64_t H = spec_.hidden_size;
    MoeCombineArgs c;
    c.x = x;
    c.ldx = H;
    c.out = o;
    c.ld_out = H;
    c.n = static_cast<int32_t>(n);
    c.width = static_cast<int32_t>(H);
    return c;
  }

  void add(float* x, const float* y, int64_t count) override { cuda::add(ctx_, x, y, count); }

  void output_rows(const float* out_norm, const DevMat& head, const float* x, const std::vector<int64_t>& rows,
                   float* logits, int64_t ld) override {
    const int64_t H = spec_.hidden_size, count = static_cast<int64_t>(rows.size());
    SW_CHECK(head.cols == H && head.rows >= 1, "CUDA output: the LM head piece is ", head.rows, " x ", head.cols);
    SW_CHECK(count >= 1 && ld >= head.rows, "CUDA output: ", count, " rows of logits ", ld, " apart");
    const MatRef hm = mat(head, head.rows, H, "output");
    WorkspaceScope scope(ws_);
    float* xn = ws_.take<float>(static_cast<uint64_t>(count * H), "output: normed rows");
    for (int64_t i = 0; i < count; ++i)
      rms_norm(ctx_, x + rows[static_cast<size_t>(i)] * H, H, out_norm, eps_, xn + i * H, H, 1, H);
    matmul(ctx_, hm, xn, H, count, logits, ld, /*accumulate=*/false);
  }

 private:
  struct Proj {
    MatRef q, k, v;
    uint64_t split_bytes = 0, fixed_bytes = 0;
  };

  Proj projections(const DevLayer& w) const {
    const int64_t H = spec_.hidden_size;
    Proj p;
    p.q = mat(w.wq, spec_.q_dim(), H, "attn_q");
    p.k = mat(w.wk, spec_.kv_dim(), H, "attn_k");
    p.v = mat(w.wv, spec_.kv_dim(), H, "attn_v");
    SW_CHECK(w.attn_norm != nullptr, "CUDA attention: attn_norm is not on the device");
    for (const MatRef* m : {&p.q, &p.k, &p.v}) {
      p.split_bytes = std::max(p.split_bytes, split_bytes(m->dtype, H));
      p.fixed_bytes = std::max(p.fixed_bytes, matmul_fixed_bytes(m->dtype, m->rows, m->cols));
    }
    return p;
  }

  // q, k, v of m normed rows into qkv rows [q | k | v]: one GEMV launch for decode-sized steps.
  void project_qkv(const Proj& p, const float* xn, int64_t m, float* qkv) {
    const int64_t H = spec_.hidden_size, QD = spec_.q_dim(), KVD = spec_.kv_dim(), W = QD + 2 * KVD;
    if (m <= kGemvMaxTokens && p.q.dtype == p.k.dtype && p.q.dtype == p.v.dtype) {
      GemvTask t[3];
      const MatRef* mats[3] = {&p.q, &p.k, &p.v};
      const int64_t offs[3] = {0, QD, QD + KVD};
      for (int i = 0; i < 3; ++i) {
        t[i].w0 = mats[i]->data;
        t[i].x = xn;
        t[i].ldx = H;
        t[i].y = qkv + offs[i];
        t[i].ldy = W;
        t[i].rows = static_cast<int32_t>(mats[i]->rows);
        t[i].cols = static_cast<int32_t>(H);
        t[i].nt = static_cast<int32_t>(m);
      }
      gemv(ctx_, p.q.dtype, GemvMode::Store, t, 3);
      return;
    }
    matmul(ctx_, p.q, xn, H, m, qkv, W, false);
    matmul(ctx_, p.k, xn, H, m, qkv + QD, W, false);
    matmul(ctx_, p.v, xn, H, m, qkv + QD + KVD, W, false);
  }

  // fn(t, len, pos, row0) for each sequence's part of the step's tokens [c0, c0 + m): tokens t .. t +
  // len - 1 at the sequence's positions pos .. , its cache rows from row0.
  template <typename Fn>
  void for_pieces(int64_t c0, int64_t m, Fn&& fn) const {
    for (const StepSegment& g : segments_) {
      const int64_t a = std::max(g.t0, c0), b = std::min(g.t0 + g.n, c0 + m);
      if (a < b) fn(a, b - a, g.pos0 + (a - g.t0), g.row0);
    }
  }

  // Tokens c0 .. c0 + m - 1 of the step (qkv holds their rows): q and k normed and roped, k and v
  // appended to the caches (when given) at each sequence's rows.
  void rope_qk(const DevLayer& w, float* qkv, int64_t c0, int64_t m, void* k_cache, void* v_cache) {
    const int64_t half = spec_.head_dim / 2, W = spec_.q_dim() + 2 * spec_.kv_dim();
    QkRopeArgs r;
    r.kv_dtype = kv_dtype_;
    r.stride = W;
    r.n_heads = static_cast<int32_t>(spec_.num_attention_heads);
    r.n_kv_heads = static_cast<int32_t>(spec_.num_key_value_heads);
    r.head_dim = static_cast<int32_t>(spec_.head_dim);
    if (spec_.has_qk_norm()) {
      SW_CHECK(w.q_norm != nullptr && w.k_norm != nullptr, "CUDA attention: q_norm/k_norm are not on the device");
      r.q_norm = w.q_norm;
      r.k_norm = w.k_norm;
    }
    if (spec_.has_qkv_bias()) {
      SW_CHECK(w.q_bias != nullptr && w.k_bias != nullptr && w.v_bias != nullptr,
               "CUDA attention: the q/k/v biases are not on the device");
      r.q_bias = w.q_bias;
      r.k_bias = w.k_bias;
      r.v_bias = w.v_bias;
    }
    r.eps = eps_;
    r.neox = rope_ == RopeStyle::Neox;
    for_pieces(c0, m, [&](int64_t t, int64_t len, int64_t pos, int64_t row0) {
      r.qkv = qkv + (t - c0) * W;
      r.n = static_cast<int32_t>(len);
      r.cos = rope_cos_ + t * half;
      r.sin = rope_sin_ + t * half;
      r.k_cache = k_cache ? kv_row(k_cache, row0) : nullptr;
      r.v_cache = v_cache ? kv_row(v_cache, row0) : nullptr;
      r.pos_first = static_cast<int32_t>(pos);
      qk_norm_rope(ctx_, r);
    });
  }

  void dense_ffn(const DevLayer& w, float* x, int64_t n) {
    const int64_t H = spec_.hidden_size, F = spec_.intermediate_size;
    const MatRef gate = mat(w.gate, F, H, "ffn_gate"), up = mat(w.up, F, H, "ffn_up"),
                 down = mat(w.down, H, F, "ffn_down");
    SW_CHECK(w.ffn_norm != nullptr, "CUDA FFN: ffn_norm is not on the device");
    WorkspaceScope scope(ws_);
    const uint64_t per_token =
        4 * static_cast<uint64_t>(H + 2 * F) + 1024 +
        std::max({split_bytes(gate.dtype, H), split_bytes(up.dtype, H), split_bytes(down.dtype, F)});
    const uint64_t fixed = std::max({matmul_fixed_bytes(gate.dtype, F, H), matmul_fixed_bytes(up.dtype, F, H),
                                     matmul_fixed_bytes(down.dtype, H, F)});
    const int64_t chunk = pick_chunk(n, per_token, fixed, "FFN");
    float* xn = ws_.take<float>(static_cast<uint64_t>(chunk * H), "FFN: normed x");
    float* g = ws_.take<float>(static_cast<uint64_t>(chunk * F), "FFN: gate");
    float* u = ws_.take<float>(static_cast<uint64_t>(chunk * F), "FFN: up");
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t m = std::min(chunk, n - c0);
      rms_norm(ctx_, x + c0 * H, H, w.ffn_norm, eps_, xn, H, m, H);
      if (gate.dtype == up.dtype && gemv_suits(m)) {  // gate, up and SwiGLU in one pass
        std::vector<GemvTask> tasks;
        add_tasks(&tasks, gate.data, up.data, xn, H, g, F, m, F, H);
        gemv(ctx_, gate.dtype, GemvMode::SwiGLU, tasks.data(), static_cast<int>(tasks.size()));
      } else {
        matmul(ctx_, gate, xn, H, m, g, F, false);
        matmul(ctx_, up, xn, H, m, u, F, false);
        swiglu(ctx_, g, u, m, F, F);
      }
      matmul(ctx_, down, g, F, m, x + c0 * H, H, /*accumulate=*/true);
    }
  }

  struct ExpertRun {
    int64_t expert = 0, slot = 0, m = 0;  // slots [slot, slot + m) hold its tokens, ascending
    const uint8_t *gate = nullptr, *up = nullptr, *down = nullptr;
  };

  // The active experts (ascending) with their tokens in [t0, t1).
  std::vector<ExpertRun> expert_runs(const DevLayer& w, const MoeRouting& r, int64_t n, int64_t t0, int64_t t1) const {
    std::vector<ExpertRun> runs;
    int64_t slot = 0;
    for (int64_t e = 0; e < spec_.num_experts; ++e) {
      const auto& toks = r.tokens_of_expert[static_cast<size_t>(e)];
      const auto lo =
          std::lower_bound(toks.begin(), toks.end(), t0, [](const RoutedToken& a, int64_t t) { return a.token < t; });
      const auto hi = std::lower_bound(lo, toks.end(), t1, [](const RoutedToken& a, int64_t t) { return a.token < t; });
      if (lo == hi) continue;
      auto ptr = [&](const std::vector<const uint8_t*>& v) {
        return static_cast<size_t>(e) < v.size() ? v[static_cast<size_t>(e)] : nullptr;
      };
      ExpertRun run;
      run.expert = e;
      run.slot = slot;
      run.m = static_cast<int64_t>(hi - lo);
      run.gate = ptr(w.gate_exp);
      run.up = ptr(w.up_exp);
      run.down = ptr(w.down_exp);
      SW_CHECK(run.gate && run.up && run.down, "MoE: expert ", e, " is routed to but its weights are not present");
      slot += run.m;
      runs.push_back(run);
    }
    (void)n;
    return runs;
  }

  void moe_ffn(const DevLayer& w, float* x, int64_t n, const MoeRouting& r) {
    const int64_t E = spec_.num_experts;
    SW_CHECK(static_cast<int64_t>(r.tokens_of_expert.size()) == E, "MoE routing has the wrong expert count");
    SW_CHECK(w.ffn_norm != nullptr, "CUDA MoE: ffn_norm is not on the device");
    int64_t entries = 0;
    for (const auto& toks : r.tokens_of_expert) {
      for (size_t i = 0; i < toks.size(); ++i) {
        SW_CHECK(toks[i].token >= 0 && toks[i].token < n, "MoE routing names token ", toks[i].token, " of ", n);
        SW_CHECK(i == 0 || toks[i - 1].token < toks[i].token, "MoE routing: an expert's tokens must be ascending");
      }
      entries += static_cast<int64_t>(toks.size());
    }
    if (n <= kGemvMaxTokens && entries <= kMoeInlineEntries)
      moe_decode(w, x, n, r);
    else
      moe_chunked(w, x, n, r);
  }

  // Decode-sized steps: no uploads. Gate/up (+SwiGLU) of every expert in one GEMV launch, down in
  // another, then the combine with its table inline in the kernel's parameters.
  void moe_decode(const DevLayer& w, float* x, int64_t n, const MoeRouting& r) {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size;
    const std::vector<ExpertRun> runs = expert_runs(w, r, n, 0, n);
    WorkspaceScope scope(ws_);
    int64_t slots = 0;
    for (const auto& run : runs) slots += run.m;
    float* xn = ws_.take<float>(static_cast<uint64_t>(n * H), "MoE: normed x");
    float* h = ws_.take<float>(static_cast<uint64_t>(std::max<int64_t>(slots, 1) * F), "MoE: expert hidden");
    float* u = nullptr;
    float* o = ws_.take<float>(static_cast<uint64_t>(std::max<int64_t>(slots, 1) * H), "MoE: expert outputs");
    rms_norm(ctx_, x, H, w.ffn_norm, eps_, xn, H, n, H);
    const bool fused = w.gate_dtype == w.up_dtype;
    if (!fused) u = ws_.take<float>(static_cast<uint64_t>(std::max<int64_t>(slots, 1) * F), "MoE: expert up");
    std::vector<GemvTask> gate_tasks, up_tasks, down_tasks;
    std::vector<std::vector<std::pair<int32_t, float>>> per_token(static_cast<size_t>(n));
    for (const auto& run : runs) {
      const auto& toks = r.tokens_of_expert[static_cast<size_t>(run.expert)];
      GemvTask t;
      t.x = xn;
      t.ldx = H;
      t.rows = static_cast<int32_t>(F);
      t.cols = static_cast<int32_t>(H);
      t.nt = static_cast<int32_t>(run.m);
      for (int64_t i = 0; i < run.m; ++i) {
        t.tok[i] = static_cast<int32_t>(toks[static_cast<size_t>(i)].token);
        per_token[static_cast<size_t>(toks[static_cast<size_t>(i)].token)].push_back(
            {static_cast<int32_t>(run.slot + i), toks[static_cast<size_t>(i)].weight});
      }
      t.y = h + run.slot * F;
      t.ldy = F;
      t.w0 = run.gate;
      t.w1 = run.up;
      gate_tasks.push_back(t);
      if (!fused) {
        t.w0 = run.up;
        t.w1 = nullptr;
        t.y = u + run.slot * F;
        up_tasks.push_back(t);
      }
      GemvTask d;
      d.w0 = run.down;
      d.x = h + run.slot * F;
      d.ldx = F;
      d.y = o + run.slot * H;
      d.ldy = H;
      d.rows = static_cast<int32_t>(H);
      d.cols = static_cast<int32_t>(F);
      d.nt = static_cast<int32_t>(run.m);
      down_tasks.push_back(d);
    }
    if (!runs.empty()) {
      if (fused) {
        gemv(ctx_, w.gate_dtype, GemvMode::SwiGLU, gate_tasks.data(), static_cast<int>(gate_tasks.size()));
      } else {
        for (auto& t : gate_tasks) t.w1 = nullptr;
        gemv(ctx_, w.gate_dtype, GemvMode::Store, gate_tasks.data(), static_cast<int>(gate_tasks.size()));
        gemv(ctx_, w.up_dtype, GemvMode::Store, up_tasks.data(), static_cast<int>(up_tasks.size()));
        swiglu(ctx_, h, u, slots, F, F);
      }
      gemv(ctx_, w.down_dtype, GemvMode::Store, down_tasks.data(), static_cast<int>(down_tasks.size()));
    }
    MoeCombineArgs c = combine_args(x, o, n);
    int32_t k = 0;
    for (int64_t t = 0; t < n; ++t) {
      c.inline_off[t] = k;
      for (const auto& e : per_token[static_cast<size_t>(t)]) {
        c.inline_slot[k] = e.first;
        c.inline_weight[k] = e.second;
        ++k;
      }
    }
    c.inline_off[n] = k;
    moe_combine(ctx_, c);
  }

  // Tokens per chunk of moe_chunked: as many as the workspace holds with every matrix's split (per
  // routed row where the experts run grouped, see run_chunk_experts), and at most 65535 routed rows per
  // launch.
  int64_t moe_chunk_tokens(const DevLayer& w, int64_t n, const MoeRouting& r) {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size,
                  K = std::max<int64_t>(1, spec_.num_experts_per_tok);
    // Tokens may be routed to more than top-k experts only by a foreign routing; size by the real count.
    int64_t max_per_token = K;
    {
      std::vector<int32_t> count(static_cast<size_t>(n), 0);
      for (const auto& toks : r.tokens_of_expert)
        for (const auto& t : toks)
          max_per_token = std::max<int64_t>(max_per_token, ++count[static_cast<size_t>(t.token)]);
    }
    const uint64_t slots = static_cast<uint64_t>(max_per_token);
    const uint64_t split =
        grouped_experts(w)
            ? slots * matmul_bytes_per_token(w.down_dtype, std::max(H, F))
            : std::max({split_bytes(w.gate_dtype, H), split_bytes(w.up_dtype, H), split_bytes(w.down_dtype, F)});
    const uint64_t per_token =
        4 * static_cast<uint64_t>(H) + 1024 + slots * (8 * static_cast<uint64_t>(H + F) + 16) + split;
    const uint64_t fixed = std::max({matmul_fixed_bytes(w.gate_dtype, F, H), matmul_fixed_bytes(w.up_dtype, F, H),
                                     matmul_fixed_bytes(w.down_dtype, H, F)}) +
                           4096;
    return std::min<int64_t>(pick_chunk(n, per_token, fixed, "MoE FFN"), 65535 / max_per_token);
  }

  // A chunk's routing on the device: gather index per slot, then per token its offset, slots and
  // weights in ascending expert order (see MoeCombineArgs).
  struct ChunkTables {
    int64_t slots = 0;
    const int32_t *gather = nullptr, *off = nullptr, *slot = nullptr;
    const float* weight = nullptr;
  };

  // Builds the chunk t0 .. t0 + m's tables on the host and uploads them through pinned staging.
  ChunkTables upload_chunk_tables(const MoeRouting& r, const std::vector<ExpertRun>& runs, int64_t t0, int64_t m) {
    int64_t slots = 0;
    for (const auto& run : runs) slots += run.m;
    std::vector<std::vector<std::pair<int32_t, float>>> per_token_entries(static_cast<size_t>(m));
    std::vector<int32_t> table(static_cast<size_t>(slots + (m + 1) + slots), 0);
    std::vector<float> weights(static_cast<size_t>(slots), 0.0f);
    int32_t* gather_idx = table.data();
    for (const auto& run : runs) {
      const auto& toks = r.tokens_of_expert[static_cast<size_t>(run.expert)];
      const auto lo =
          std::lower_bound(toks.begin(), toks.end(), t0, [](const RoutedToken& a, int64_t t) { return a.token < t; });
      for (int64_t i = 0; i < run.m; ++i) {
        const RoutedToken& rt = *(lo + i);
        gather_idx[run.slot + i] = static_cast<int32_t>(rt.token - t0);
        per_token_entries[static_cast<size_t>(rt.token - t0)].push_back(
            {static_cast<int32_t>(run.slot + i), rt.weight});
      }
    }
    int32_t* off = table.data() + slots;
    int32_t* slot_of = off + (m + 1);
    int32_t k = 0;
    for (int64_t t = 0; t < m; ++t) {
      off[t] = k;
      for (const auto& e : per_token_entries[static_cast<size_t>(t)]) {
        slot_of[k] = e.first;
        weights[static_cast<size_t>(k)] = e.second;
        ++k;
      }
    }
    off[m] = k;
    const uint64_t table_bytes = table.size() * sizeof(int32_t), weight_bytes = weights.size() * sizeof(float);
    uint8_t* dev_table = ws_.take<uint8_t>(align_up(table_bytes) + weight_bytes + 16, "MoE: routing tables");
    auto* host = static_cast<uint8_t*>(staging_.acquire(align_up(table_bytes) + weight_bytes + 16, ctx_.stream));
    std::memcpy(host, table.data(), table_bytes);
    if (weight_bytes) std::memcpy(host + align_up(table_bytes), weights.data(), weight_bytes);
    check(cudaMemcpyAsync(dev_table, host, align_up(table_bytes) + weight_bytes, cudaMemcpyHostToDevice, ctx_.stream),
          "cudaMemcpyAsync(MoE tables)");
    staging_.submitted(ctx_.stream);
    ChunkTables ct;
    ct.slots = slots;
    ct.gather = reinterpret_cast<const int32_t*>(dev_table);
    ct.off = ct.gather + slots;
    ct.slot = ct.off + (m + 1);
    ct.weight = reinterpret_cast<const float*>(dev_table + align_up(table_bytes));
    return ct;
  }

  // Whether a layer's experts run grouped: every expert matrix of a type quant_gemm computes, each kind in
  // one launch.
  static bool grouped_experts(const DevLayer& w) {
    return quant_gemm_computes(w.gate_dtype) && quant_gemm_computes(w.up_dtype) && quant_gemm_computes(w.down_dtype);
  }

  // Each expert's gate/up (+SwiGLU) into g and down into o over its gathered rows xe (`slots` rows).
  void run_chunk_experts(const DevLayer& w, const std::vector<ExpertRun>& runs, int64_t slots, const float* xe,
                         float* g, float* u, float* o) {
    if (grouped_experts(w))
      run_chunk_experts_grouped(w, runs, slots, xe, g, u, o);
    else
      run_chunk_experts_each(w, runs, xe, g, u, o);
  }

  // Quantised experts: experts with more than 8 rows as tasks of one tensor-core launch per matrix kind
  // over the chunk's split rows, the others as 8-row GEMV tasks; one SwiGLU over every row between.
  void run_chunk_experts_grouped(const DevLayer& w, const std::vector<ExpertRun>& runs, int64_t slots, const float* xe,
                                 float* g, float* u, float* o) {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size;
    std::vector<QuantGemmTask> gate, up, down;
    std::vector<GemvTask> gate_v, up_v, down_v;
    auto task = [](const uint8_t* m, int64_t slot, int64_t rows, float* y, int64_t ldy, int64_t m_rows) {
      QuantGemmTask t;
      t.w = m;
      t.x_row = slot;
      t.y = y + slot * ldy;
      t.ldy = ldy;
      t.rows = static_cast<int32_t>(rows);
      t.m = static_cast<int32_t>(m_rows);
      return t;
    };
    for (const auto& run : runs) {
      if (run.m <= kGemvMaxTokens) {
        add_tasks(&gate_v, run.gate, nullptr, xe + run.slot * H, H, g + run.slot * F, F, run.m, F, H);
        add_tasks(&up_v, run.up, nullptr, xe + run.slot * H, H, u + run.slot * F, F, run.m, F, H);
        add_tasks(&down_v, run.down, nullptr, g + run.slot * F, F, o + run.slot * H, H, run.m, H, F);
        continue;
      }
      gate.push_back(task(run.gate, run.slot, F, g, F, run.m));
      up.push_back(task(run.up, run.slot, F, u, F, run.m));
      down.push_back(task(run.down, run.slot, H, o, H, run.m));
    }
    if (!gate.empty()) {
      WorkspaceScope scope(ws_);
      const SplitRows xs = split_rows(ctx_, xe, H, slots, H);
      quant_gemm(ctx_, w.gate_dtype, xs, H, gate.data(), static_cast<int>(gate.size()), false);
      quant_gemm(ctx_, w.up_dtype, xs, H, up.data(), static_cast<int>(up.size()), false);
    }
    if (!gate_v.empty()) {
      gemv(ctx_, w.gate_dtype, GemvMode::Store, gate_v.data(), static_cast<int>(gate_v.size()));
      gemv(ctx_, w.up_dtype, GemvMode::Store, up_v.data(), static_cast<int>(up_v.size()));
    }
    swiglu(ctx_, g, u, slots, F, F);
    if (!down.empty()) {
      WorkspaceScope scope(ws_);
      const SplitRows gs = split_rows(ctx_, g, F, slots, F);
      quant_gemm(ctx_, w.down_dtype, gs, F, down.data(), static_cast<int>(down.size()), false);
    }
    if (!down_v.empty()) gemv(ctx_, w.down_dtype, GemvMode::Store, down_v.data(), static_cast<int>(down_v.size()));
  }

  // Float experts: those with few rows as 8-row GEMV tasks, many per launch (gate/up fused with SwiGLU);
  // the others as matmuls of their own.
  void run_chunk_experts_each(const DevLayer& w, const std::vector<ExpertRun>& runs, const float* xe, float* g,
                              float* u, float* o) {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size;
    const bool fuse = w.gate_dtype == w.up_dtype;
    std::vector<GemvTask> gate_up_tasks, down_tasks;
    for (const auto& run : runs) {
      if (fuse && gemv_suits(run.m)) {
        add_tasks(&gate_up_tasks, run.gate, run.up, xe + run.slot * H, H, g + run.slot * F, F, run.m, F, H);
        continue;
      }
      const MatRef gm{w.gate_dtype, run.gate, F, H}, um{w.up_dtype, run.up, F, H};
      matmul(ctx_, gm, xe + run.slot * H, H, run.m, g + run.slot * F, F, false);
      matmul(ctx_, um, xe + run.slot * H, H, run.m, u + run.slot * F, F, false);
      swiglu(ctx_, g + run.slot * F, u + run.slot * F, run.m, F, F);
    }
    if (!gate_up_tasks.empty())
      gemv(ctx_, w.gate_dtype, GemvMode::SwiGLU, gate_up_tasks.data(), static_cast<int>(gate_up_tasks.size()));
    for (const auto& run : runs) {
      if (gemv_suits(run.m)) {
        add_tasks(&down_tasks, run.down, nullptr, g + run.slot * F, F, o + run.slot * H, H, run.m, H, F);
        continue;
      }
      const MatRef dm{w.down_dtype, run.down, H, F};
      matmul(ctx_, dm, g + run.slot * F, F, run.m, o + run.slot * H, H, false);
    }
    if (!down_tasks.empty())
      gemv(ctx_, w.down_dtype, GemvMode::Store, down_tasks.data(), static_cast<int>(down_tasks.size()));
  }

  // Any step: tokens in chunks; per chunk the routed rows are gathered per expert (token lists
  // uploaded through pinned staging), each expert's gate/up/down run as matmuls over its rows, and
  // the weighted outputs are added to x in ascending expert order.
  void moe_chunked(const DevLayer& w, float* x, int64_t n, const MoeRouting& r) {
    const int64_t H = spec_.hidden_size, F = spec_.moe_intermediate_size;
    WorkspaceScope scope(ws_);
    const int64_t chunk = moe_chunk_tokens(w, n, r);
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t t1 = std::min(n, t0 + chunk), m = t1 - t0;
      WorkspaceScope chunk_scope(ws_);
      const std::vector<ExpertRun> runs = expert_runs(w, r, n, t0, t1);
      const ChunkTables ct = upload_chunk_tables(r, runs, t0, m);
      float* xn = ws_.take<float>(static_cast<uint64_t>(m * H), "MoE: normed x");
      const uint64_t s1 = static_cast<uint64_t>(std::max<int64_t>(ct.slots, 1));
      float* xe = ws_.take<float>(s1 * H, "MoE: gathered rows");
      float* g = ws_.take<float>(s1 * F, "MoE: expert gate");
      float* u = ws_.take<float>(s1 * F, "MoE: expert up");
      float* o = ws_.take<float>(s1 * H, "MoE: expert outputs");
      rms_norm(ctx_, x + t0 * H, H, w.ffn_norm, eps_, xn, H, m, H);
      if (ct.slots > 0) gather_rows(ctx_, xn, H, ct.gather, ct.slots, H, xe, H);
      run_chunk_experts(w, runs, ct.slots, xe, g, u, o);
      combine_from_table(x + t0 * H, o, m, ct.off, ct.slot, ct.weight);
    }
  }

  // Whether m rows are cheaper as GEMV passes than as a GEMM (as matmul decides).
  static bool gemv_suits(int64_t m) { return m <= kGemvMaxTokens; }
  // GEMV tasks of at most 8 consecutive rows of x (ldx) into rows of y (ldy).
  static void add_tasks(std::vector<GemvTask>* tasks, const uint8_t* w0, const uint8_t* w1, const float* x, int64_t ldx,
                        float* y, int64_t ldy, int64_t m, int64_t rows, int64_t cols) {
    for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxTokens) {
      GemvTask t;
      t.w0 = w0;
      t.w1 = w1;
      t.x = x + r0 * ldx;
      t.ldx = ldx;
      t.y = y + r0 * ldy;
      t.ldy = ldy;
      t.rows = static_cast<int32_t>(rows);
      t.cols = static_cast<int32_t>(cols);
      t.nt = static_cast<int32_t>(std::min<int64_t>(kGemvMaxTokens, m - r0));
      tasks->push_back(t);
    }
  }

  void check_step(int64_t n, const char* block) const {
    SW_CHECK(step_ready_, "CUDA ", block, ": prepare_step was not called after set_workspace for this step");
    SW_CHECK(n >= 1 && n <= n_step_, "CUDA ", block, ": ", n, " tokens but the step was prepared for ", n_step_);
  }

  // Tokens per chunk such that the chunk's buffers (per_token each) leave `fixed` bytes free. Chunks short
  // of n are balanced (equal, multiples of 64 where over 64), so a step is not one big chunk and a small
  // remainder that runs every matrix again.
  int64_t pick_chunk(int64_t n, uint64_t per_token, uint64_t fixed, const char* block) const {
    const uint64_t avail = ws_.available();
    const uint64_t align = 8 * 256;  // alignment of the buffers
    const uint64_t reserve = fixed + align;
    SW_CHECK(avail >= reserve + per_token, "CUDA ", block, ": the workspace is too small: one token needs ",
             reserve + per_token, " bytes, ", avail, " are free (give the blocks more scratch)");
    int64_t chunk = std::min<int64_t>(n, static_cast<int64_t>((avail - reserve) / per_token));
    chunk = std::min<int64_t>(chunk, 65535);
    if (chunk < n && chunk > 64) chunk = chunk / 64 * 64;
    chunk = std::max<int64_t>(chunk, 1);
    if (chunk < n) {  // the same number of chunks, as equal as the rounding allows (never larger)
      const int64_t pieces = (n + chunk - 1) / chunk;
      int64_t even = (n + pieces - 1) / pieces;
      if (chunk >= 64 && even > 64) even = (even + 63) / 64 * 64;
      chunk = std::min(chunk, even);
    }
    return chunk;
  }

  friend class WarmUp;

  ModelSpec spec_;
  RopeStyle rope_;
  float eps_ = 1e-5f;
  DType kv_dtype_ = DType::F32;  // the KV caches' element type (set_kv_dtype)

  // Row `row` of a K or V cache of kv_dtype_.
  void* kv_row(void* cache, int64_t row) const {
    return static_cast<uint8_t*>(cache) + row * static_cast<int64_t>(dtype_row_bytes(kv_dtype_, spec_.kv_dim()));
  }
  Ctx ctx_;
  Workspace ws_;
  PinnedRing staging_;
  bool step_ready_ = false;
  uint64_t step_base_ = 0;
  std::vector<StepSegment> segments_;
  int64_t n_step_ = 0;
  const float* rope_cos_ = nullptr;
  const float* rope_sin_ = nullptr;
};

// ---- warm-up (cuda_kernels_warm_up) -------------------------------------------------------------
// With lazy module loading, the first launch of each kernel (ours and cuBLAS's) makes the driver load
// it, growing its memory in 2 MiB steps; a kernel's first launch may also size the local-memory pool
// and cuBLAS does one-time set-up on first use of a configuration. The warm-up makes all of that
// happen before the arena: it runs the real blocks of a one-layer copy of the model (same family,
// head_dim, top-k, RoPE; its own matrix shapes when they are small, else shrunk ones) on every weight
// dtype, at token counts that take every branch of the blocks (GEMV token buckets, GEMM paths,
// decode/prefill attention with and without key splits, MoE decode and chunked paths with experts on
// both GEMV and GEMM), and then every launcher variant directly (so that what the blocks choose from
// data, such as alignment, the token bucket or the key splits, cannot leave a kernel out), plus
// matmul's exact cuBLAS calls (same handle, modes, transposes, types) on the blocks' matrix shapes,
// strides and output offsets for every token count 9..64 and some up to 256, with both cuBLAS
// workspace sizes that steps of small models get. cuBLAS picks its kernel by shape, so its coverage
// is exact only for these counts (and for the model's own shapes, i.e. models whose largest matrix is
// small); our kernels depend only on dtype, head_dim bucket and the variants swept, so they are all
// covered. All of it in one temporary cudaMalloc, freed before returning.

constexpr int64_t kWarmMaxElems = 256 * 1024;  // largest matrix run at the model's own shape (1 MiB as f32)
// Steps of the block runs, in order (positions accumulate): prefill with quantised GEMMs (> 32
// tokens), then every GEMV token bucket (1, 2, 3-4, 5-8), then f16/bf16/f32 GEMMs (9..32 tokens);
// 78 positions in all, so the later decode steps split the keys (> 64) and combine.
constexpr int64_t kWarmSteps[] = {33, 1, 2, 3, 5, 8, 9, 17};
constexpr int64_t kWarmMaxStep = 33;
constexpr int64_t kWarmKvRows = 88;  // >= the sum of kWarmSteps
// cuBLAS workspaces the GEMMs run with: those cuda_blas_workspace_bytes gives below 8 MiB (cuBLAS
// leaves out algorithms that need more workspace than it has, so its choices depend on the size).
constexpr uint64_t kBlasWorkspaces[] = {8ull << 20, 2ull << 20, 256ull << 10};  // descending
constexpr uint64_t kWarmBlasWorkspaces[] = {2ull << 20, 256ull << 10};
// Steps up to this many tokens find their pinned staging allocated at set-up.
constexpr int64_t kStagingReserveTokens = 512;

int64_t ffn_width(const ModelSpec& s) {
  return s.is_moe() ? s.moe_intermediate_size : s.intermediate_size;
}

int64_t largest_matrix(const ModelSpec& s) {
  const int64_t H = s.hidden_size;
  int64_t m = std::max({s.q_dim() * H, s.kv_dim() * H, ffn_width(s) * H});
  if (s.is_moe()) m = std::max(m, s.num_experts * H);
  return m;
}

// The one-layer model the warm-up runs: the model's own shapes when its largest matrix has at most
// kWarmMaxElems elements; else hidden and FFN widths above 384 become 256 + width % 256 (which keeps
// their divisibility by the 32- and 256-element quantised blocks and the 16-byte alignment of rows), at most 64
// experts, and if still too large one kv head (and at most 2 query heads). head_dim, top-k, family,
// eps and RoPE are always the model's: the kernels are instantiated per head_dim bucket and dtype.
ModelSpec warm_spec(const ModelSpec& s, bool* exact) {
  ModelSpec w = s;
  w.num_hidden_layers = 1;
  *exact = largest_matrix(s) <= kWarmMaxElems;
  if (*exact) return w;
  auto shrink = [](int64_t d) { return d <= 384 ? d : 256 + d % 256; };
  w.hidden_size = shrink(s.hidden_size);
  w.intermediate_size = shrink(s.intermediate_size);
  w.moe_intermediate_size = shrink(s.moe_intermediate_size);
  if (s.is_moe()) w.num_experts = std::min(s.num_experts, std::max<int64_t>(64, s.num_experts_per_tok));
  if (largest_matrix(w) > kWarmMaxElems) {
    const int64_t group = s.num_attention_heads / std::max<int64_t>(1, s.num_key_value_heads);
    w.num_key_value_heads = 1;
    w.num_attention_heads = std::max<int64_t>(1, std::min<int64_t>(group, 2));
    if (largest_matrix(w) > kWarmMaxElems) w.num_attention_heads = 1;
  }
  return w;
}

// A matrix of dtype t with `cols` columns, as a file can hold it (quantised blocks must divide the row).
DType fit(DType t, int64_t cols) {
  return dtype_is_quantized(t) && cols % dtype_block_elems(t) != 0 ? DType::F16 : t;
}

class WarmUp {
  // A matmul as the blocks call it: rows x cols, output rows ldy apart from y_offset on.
  struct Gemm {
    int64_t rows, cols, ldy, y_offset;
    bool operator==(const Gemm& o) const {
      return rows == o.rows && cols == o.cols && ldy == o.ldy && y_offset == o.y_offset;
    }
  };

 public:
  WarmUp(const ModelSpec& model, RopeStyle rope, cudaStream_t stream, cublasHandle_t blas, CudaWarmUpStats* st)
      : s_(warm_spec(model, &st->exact_shapes)), k_(s_, rope, stream, blas), st_(st) {
    const int64_t H = s_.hidden_size, QD = s_.q_dim(), KVD = s_.kv_dim(), F = ffn_width(s_), hd = s_.head_dim;
    const int64_t E = s_.is_moe() ? s_.num_experts : 1;
    SW_CHECK(H > 0 && QD > 0 && KVD > 0 && hd > 0 && F > 0 && E > 0, "warm-up: the model has an empty dimension");
    SW_CHECK(largest_matrix(s_) <= 4 * kWarmMaxElems, "warm-up: the model's shapes cannot be shrunk to a small copy");
    // The LM head only runs as a one-token GEMV, whose kernel does not depend on the row count.
    head_rows_ = std::max<int64_t>(1, std::min<int64_t>({s_.vocab_size, 256, kWarmMaxElems / H}));
    // The matmuls of the blocks as they call them (the LM head only ever runs as a one-token GEMV):
    // rows x cols, and where the output goes (q, k and v into rows of qkv, W apart; every other
    // output, MoE experts' too, into rows of its own width). Inputs are always rows of cols.
    const int64_t W = QD + 2 * KVD;
    const Gemm all[] = {{QD, H, W, 0},
                        {KVD, H, W, QD},
                        {KVD, H, W, QD + KVD},
                        {H, QD, H, 0},
                        {F, H, F, 0},
                        {H, F, H, 0},
                        {s_.is_moe() ? E : F, H, s_.is_moe() ? E : F, 0}};
    for (const Gemm& g : all)
      if (std::find(gemms_.begin(), gemms_.end(), g) == gemms_.end()) gemms_.push_back(g);
    int64_t widest = std::max<int64_t>(256, W);  // the GEMV sweep's matrices are 8 x 256
    for (const Gemm& g : gemms_) widest = std::max({widest, g.rows, g.cols});
    // Token counts of the cuBLAS sweep: every count up to 64 (steps of small tiers, their remainders,
    // MoE experts' row counts), then a few larger ones, as far as the temporary memory allows.
    sweep_tokens_ = std::max<int64_t>(kWarmMaxStep, std::min<int64_t>(256, kWarmMaxElems / widest));
    for (int64_t n = kGemvMaxTokens + 1; n <= 64; ++n)
      if (n <= sweep_tokens_) ladder_.push_back(n);
    for (int64_t n : {65, 80, 96, 112, 128, 129, 160, 192, 224, 256})
      if (n <= sweep_tokens_) ladder_.push_back(n);

    // Temporary workspace of the blocks: a step of kWarmMaxStep tokens in one chunk, and the matmul
    // sweep in one chunk (split activations for the largest token count).
    uint64_t sweep_ws = 0;
    for (const Gemm& g : gemms_)
      sweep_ws = std::max(sweep_ws, matmul_bytes_per_token(DType::BF16, g.cols) * static_cast<uint64_t>(sweep_tokens_));
    ws_bytes_ = align_up(std::max(cuda_kernels_workspace_bytes(s_, kWarmMaxStep), sweep_ws + 4096) + (256u << 10));
    const uint64_t T = kWarmMaxStep, f = sizeof(float);
    uint64_t total = 0;
    auto carve = [&total](uint64_t bytes) {
      const uint64_t off = total;
      total += align_up(std::max<uint64_t>(bytes, 256));
      return off;
    };
    const uint64_t o_blas = carve(kWarmBlasWorkspaces[0]);
    const uint64_t o_ws = carve(ws_bytes_);
    const uint64_t o_pool = carve(std::max<uint64_t>(
        {static_cast<uint64_t>(largest_matrix(s_)) * f, static_cast<uint64_t>(head_rows_ * H) * f, 64u << 10}));
    // Every norm and bias vector: the hidden width, a head, the q/k/v biases.
    const uint64_t o_norm = carve(static_cast<uint64_t>(std::max<int64_t>({H, hd, s_.q_dim(), s_.kv_dim(), 512})) * f);
    const uint64_t o_x = carve(T * static_cast<uint64_t>(H) * f);
    const uint64_t o_qkv = carve(T * static_cast<uint64_t>(W) * f);
    const uint64_t o_attn = carve(T * static_cast<uint64_t>(QD) * f);
    const uint64_t o_rlog = carve(T * static_cast<uint64_t>(E) * f);
    const uint64_t o_logits = carve(static_cast<uint64_t>(std::max<int64_t>(head_rows_, 64)) * f);
    const uint64_t o_kc = carve(static_cast<uint64_t>(kWarmKvRows * KVD) * f);
    const uint64_t o_vc = carve(static_cast<uint64_t>(kWarmKvRows * KVD) * f);
    const uint64_t o_sx = carve((static_cast<uint64_t>(sweep_tokens_ * widest) + 16) * f);
    const uint64_t o_sy = carve((static_cast<uint64_t>(sweep_tokens_ * widest) + 16) * f);
    const uint64_t o_aq = carve((kAttnRows * static_cast<uint64_t>(hd) + 16) * f);
    const uint64_t o_ak = carve(kAttnKeys * static_cast<uint64_t>(hd) * f);
    const uint64_t o_av = carve(kAttnKeys * static_cast<uint64_t>(hd) * f);
    const uint64_t o_ao = carve(kAttnRows * static_cast<uint64_t>(hd) * f);
    const uint64_t o_idx = carve(256);
    void* p = nullptr;  // the only allocation; the destructor frees it
    const cudaError_t e = cudaMalloc(&p, total);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("warm-up: cudaMalloc of ", total, " temporary bytes: ", cudaGetErrorString(e));
    }
    base_ = static_cast<uint8_t*>(p);
    total_ = total;
    st_->temp_bytes = total;
    blas_ws_ = base_ + o_blas;
    ws_ = base_ + o_ws;
    pool_ = base_ + o_pool;
    auto fl = [this](uint64_t off) { return reinterpret_cast<float*>(base_ + off); };
    norm_ = fl(o_norm), x_ = fl(o_x), qkv_ = fl(o_qkv), attn_ = fl(o_attn), rlog_ = fl(o_rlog), logits_ = fl(o_logits);
    kc_ = fl(o_kc), vc_ = fl(o_vc), sx_ = fl(o_sx), sy_ = fl(o_sy);
    aq_ = fl(o_aq), ak_ = fl(o_ak), av_ = fl(o_av), ao_ = fl(o_ao);
    idx_ = reinterpret_cast<int32_t*>(base_ + o_idx);
  }
  WarmUp(const WarmUp&) = delete;
  WarmUp& operator=(const WarmUp&) = delete;

  // The warm-up for the model of `k`, on its stream and cuBLAS handle (a kernels object of its own).
  static void run_for(const CudaKernels& k, CudaWarmUpStats* st) {
    WarmUp w(k.spec_, k.rope_, k.ctx_.stream, k.ctx_.blas, st);
    w.run();
  }
  ~WarmUp() {
    // Nothing may still use the buffer, and cuBLAS must not keep a pointer into it.
    cudaStreamSynchronize(k_.ctx_.stream);
    cublasSetWorkspace(k_.ctx_.blas, nullptr, 0);
    cublasSetPointerMode(k_.ctx_.blas, CUBLAS_POINTER_MODE_HOST);
    if (base_) cudaFree(base_);
  }

  void run() {
    check(cudaMemsetAsync(base_, 0, total_, k_.ctx_.stream), "cudaMemsetAsync(warm-up)");
    sweep_launchers();
    for (uint64_t blas_ws : kWarmBlasWorkspaces) {
      check_blas(cublasSetWorkspace(k_.ctx_.blas, blas_ws_, blas_ws), "cublasSetWorkspace(warm-up)");
      for (DType t : kAllDTypes) run_blocks(t);
      sweep_matmuls();
    }
    for (DType kv : kv_dtypes()) {  // the attention and RoPE kernels over the other cache types
      if (kv == DType::F32) continue;
      k_.set_kv_dtype(kv);
      run_blocks(DType::F32);
    }
    k_.set_kv_dtype(DType::F32);
    check(cudaStreamSynchronize(k_.ctx_.stream), "cudaStreamSynchronize(warm-up)");
    check(cudaGetLastError(), "a warm-up kernel");
  }

 private:
  static constexpr uint64_t kAttnRows = 9;    // attention sweep: up to 9 query rows (prefill)
  static constexpr uint64_t kAttnKeys = 112;  // and cache rows up to position 100 + 4

  bool rope_ok() const { return s_.head_dim % 2 == 0 && s_.head_dim <= 512; }
  // The cache types the model's head_dim allows (q8_0: a multiple of 32).
  std::vector<DType> kv_dtypes() const {
    std::vector<DType> t = {DType::F32, DType::F16, DType::BF16};
    if (s_.head_dim % kQK8_0 == 0) t.push_back(DType::Q8_0);
    return t;
  }
  bool attention_ok() const { return rope_ok() && attention_head_dim_supported(s_.head_dim); }

  DevMat matrix(DType t, int64_t rows, int64_t cols) const {
    DevMat m;
    m.dtype = fit(t, cols);
    m.rows = rows;
    m.cols = cols;
    m.data = pool_;
    return m;
  }

  // Every matrix of the layer in dtype t (where its row holds whole blocks), all reading the same
  // zeroed pool; every norm and bias the same zeroed vector (zeros stay finite through every block).
  DevLayer layer(DType t) const {
    const int64_t H = s_.hidden_size, QD = s_.q_dim(), KVD = s_.kv_dim(), F = ffn_width(s_);
    DevLayer w;
    w.attn_norm = w.q_norm = w.k_norm = w.ffn_norm = norm_;
    w.q_bias = w.k_bias = w.v_bias = norm_;
    w.wq = matrix(t, QD, H);
    w.wk = matrix(t, KVD, H);
    w.wv = matrix(t, KVD, H);
    w.wo = matrix(t, H, QD);
    if (s_.is_moe()) {
      w.router = matrix(t, s_.num_experts, H);
      w.gate_dtype = w.up_dtype = fit(t, H);
      w.down_dtype = fit(t, F);
      w.gate_exp.assign(static_cast<size_t>(s_.num_experts), pool_);
      w.up_exp.assign(static_cast<size_t>(s_.num_experts), pool_);
      w.down_exp.assign(static_cast<size_t>(s_.num_experts), pool_);
    } else {
      w.gate = matrix(t, F, H);
      w.up = matrix(t, F, H);
      w.down = matrix(t, H, F);
    }
    return w;
  }

  // Token t goes to expert 0 (so that one expert has every token: GEMM paths from 9 / 33 tokens) and
  // to top-k - 1 others in rotation (a few tokens each: the GEMV task paths).
  MoeRouting routing(int64_t n) const {
    const int64_t E = s_.num_experts, K = std::max<int64_t>(1, std::min(s_.num_experts_per_tok, E));
    MoeRouting r;
    r.tokens_of_expert.assign(static_cast<size_t>(E), {});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = j == 0 ? 0 : 1 + (t + j - 1) % (E - 1);
        r.tokens_of_expert[static_cast<size_t>(e)].push_back({t, 1.0f / static_cast<float>(K)});
        r.expert_ids.push_back(static_cast<int32_t>(e));
        r.weights.push_back(1.0f / static_cast<float>(K));
      }
    for (const auto& toks : r.tokens_of_expert) r.n_active_experts += toks.empty() ? 0 : 1;
    return r;
  }

  // The blocks as the runtime calls them, step after step, with every matrix in dtype t (the other
  // token counts of the GEMMs come from sweep_matmuls, with the blocks' strides and offsets).
  void run_blocks(DType t) {
    const DevLayer w = layer(t);
    int64_t pos = 0;
    for (int64_t n : kWarmSteps) {
      step(w, t, pos, n);
      pos += n;
    }
  }
  void step(const DevLayer& w, DType t, int64_t pos, int64_t n) {
    const int64_t H = s_.hidden_size;
    k_.set_workspace(ws_, ws_bytes_);
    k_.prepare_step(pos, n);
    if (attention_ok()) k_.attention(w, x_, n, kc_, vc_);
    if (rope_ok()) k_.attention_pre(w, x_, n, qkv_);
    k_.attention_post(w, x_, attn_, n);
    if (s_.is_moe()) {
      k_.router(w, x_, n, rlog_);
      const MoeRouting r = routing(n);
      k_.ffn(w, x_, n, &r);
    } else {
      k_.ffn(w, x_, n, nullptr);
    }
    k_.output(norm_, matrix(t, head_rows_, H), x_ + (n - 1) * H, logits_);
    ++st_->steps;
  }

  // matmul's cuBLAS paths on every matrix shape of the model, for every float dtype and a ladder of
  // token counts; the quantised kernels (one code path for every count above 8) once each.
  void sweep_matmuls() {
    k_.set_workspace(ws_, ws_bytes_);
    for (const Gemm& g : gemms_) {
      for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (int64_t n : ladder_) mm(t, g, n);
      for (DType t : {DType::Q8_0, DType::Q4_0})
        if (g.cols % dtype_block_elems(t) == 0) mm(t, g, kGemvMaxTokens + 1);
    }
  }
  void mm(DType t, const Gemm& g, int64_t n) {
    MatRef m;
    m.dtype = t;
    m.data = pool_;
    m.rows = g.rows;
    m.cols = g.cols;
    matmul(k_.ctx_, m, sx_, g.cols, n, sy_ + g.y_offset, g.ldy, /*accumulate=*/false);
    ++st_->matmuls;
  }

  // Every launcher variant whose choice depends on data rather than on the model's composition.
  void sweep_launchers() {
    k_.set_workspace(ws_, ws_bytes_);
    const Ctx& c = k_.ctx_;
    sweep_gemv(c);
    if (attention_ok()) sweep_attention(c);
    sweep_elementwise(c);
  }

  // GEMV: every dtype, the fast kernels for each token bucket, plain and fused SwiGLU, and the
  // generic kernel (x not 16-byte aligned).
  void sweep_gemv(const Ctx& c) {
    for (DType t : kAllDTypes) {
      GemvTask g;
      g.w0 = pool_;
      g.x = sx_;
      g.ldx = 256;
      g.y = sy_;
      g.ldy = 8;
      g.rows = 8;
      g.cols = 256;
      for (int nt : {1, 2, 4, 8})
        for (GemvMode mode : {GemvMode::Store, GemvMode::SwiGLU}) {
          g.nt = nt;
          g.w1 = mode == GemvMode::SwiGLU ? pool_ : nullptr;
          gemv(c, t, mode, &g, 1);
          ++st_->launches;
        }
      g.nt = 1;
      g.w1 = nullptr;
      g.x = sx_ + 1;
      gemv(c, t, GemvMode::Store, &g, 1);
      ++st_->launches;
    }
  }

  // Attention for the model's head_dim: decode with 1, 2 and 4 query rows per warp (one head, so
  // rows = tokens) past 64 keys (split keys, then the combine kernel) by the decode kernel the blocks
  // use, prefill; with aligned rows (the unguarded kernels when head_dim is 32/64/128/256) and with q
  // off by one float (guarded).
  void sweep_attention(const Ctx& c) {
    const int64_t hd = s_.head_dim;
    const bool padded = !(hd == 32 || hd == 64 || hd == 128 || hd == 256);
    for (int misalign : {0, 1}) {
      if (misalign && padded) break;  // padded head_dims only have the guarded kernels
      for (int n : {1, 2, 4, 9})
        for (DType kv : kv_dtypes()) {
          AttnArgs a;
          a.q = aq_ + misalign;
          a.q_stride = hd;
          a.k = ak_;
          a.v = av_;
          a.kv_stride = hd;
          a.out = ao_;
          a.out_stride = hd;
          a.n = n;
          a.pos_first = n <= kGemvMaxTokens ? 100 : 0;
          a.n_heads = 1;
          a.n_kv_heads = 1;
          a.head_dim = static_cast<int32_t>(hd);
          a.kv_dtype = kv;
          attention(c, a);
          ++st_->launches;
        }
    }
  }

  // The element-wise kernels (the blocks use them too; here regardless of the composition).
  void sweep_elementwise(const Ctx& c) {
    const int64_t H = s_.hidden_size;
    rms_norm(c, sx_, H, norm_, k_.eps_, sy_, H, 1, H);
    if (rope_ok()) {
      QkRopeArgs r;
      r.qkv = qkv_;
      r.stride = s_.q_dim() + 2 * s_.kv_dim();
      r.n = 1;
      r.n_heads = static_cast<int32_t>(s_.num_attention_heads);
      r.n_kv_heads = static_cast<int32_t>(s_.num_key_value_heads);
      r.head_dim = static_cast<int32_t>(s_.head_dim);
      r.q_norm = r.k_norm = norm_;
      r.eps = k_.eps_;
      r.cos = r.sin = norm_;
      r.k_cache = kc_;
      r.v_cache = vc_;
      for (DType kv : kv_dtypes()) {
        r.kv_dtype = kv;
        qk_norm_rope(c, r);
      }
    }
    swiglu(c, sy_, sx_, 1, 64, 64);
    add(c, sy_, sx_, 64);
    gather_rows(c, sx_, 64, idx_, 1, 64, sy_, 64);
    // A staged host cache's layout, both ways (bf16 and q8_0 rows move as 16-bit words, as f16's).
    for (DType kv : {DType::F32, DType::F16}) {
      kv_layout(c, sx_, sy_, 2, 1, 16, 0, 2, true, kv);
      kv_layout(c, sy_, sx_, 2, 1, 16, 0, 2, false, kv);
    }
    MoeCombineArgs m;  // inline table, then a device table (both empty: no entries)
    m.x = sy_;
    m.ldx = 64;
    m.out = sx_;
    m.ld_out = 64;
    m.n = 1;
    m.width = 64;
    moe_combine(c, m);
    m.off = idx_;
    m.slot = idx_;
    m.weight = reinterpret_cast<const float*>(idx_);
    moe_combine(c, m);
    MoeTopkArgs tk;  // device routing's top-k: 2 of 32 experts over one row of zeros
    tk.logits = sx_;
    tk.n = 1;
    tk.n_experts = 32;
    tk.top_k = 2;
    tk.ids = idx_ + 8;
    tk.weights = sy_;
    tk.off = idx_ + 16;
    tk.slot = idx_ + 24;
    moe_topk(c, tk);
    check(cudaMemcpyAsync(sy_, sx_, 256, cudaMemcpyDeviceToDevice, c.stream), "cudaMemcpyAsync(warm-up)");
    st_->launches += 12;
  }

  ModelSpec s_;
  CudaKernels k_;
  CudaWarmUpStats* st_;
  int64_t head_rows_ = 1, sweep_tokens_ = kWarmMaxStep;
  std::vector<Gemm> gemms_;
  std::vector<int64_t> ladder_;
  uint64_t ws_bytes_ = 0, total_ = 0;
  uint8_t* base_ = nullptr;
  uint8_t* blas_ws_ = nullptr;
  uint8_t* ws_ = nullptr;
  uint8_t* pool_ = nullptr;
  float *norm_ = nullptr, *x_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *rlog_ = nullptr, *logits_ = nullptr;
  float *kc_ = nullptr, *vc_ = nullptr, *sx_ = nullptr, *sy_ = nullptr;
  float *aq_ = nullptr, *ak_ = nullptr, *av_ = nullptr, *ao_ = nullptr;
  int32_t* idx_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceKernels> make_cuda_kernels(const ModelSpec& spec, RopeStyle rope, cudaStream_t compute,
                                                 cublasHandle_t blas) {
  return std::make_unique<CudaKernels>(spec, rope, compute, blas);
}

CudaWarmUpStats cuda_kernels_warm_up(DeviceKernels& kernels) {
  CudaWarmUpStats st;
  auto* k = dynamic_cast<CudaKernels*>(&kernels);
  if (k == nullptr) {
    st.error = "not the CUDA blocks of make_cuda_kernels";
    return st;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    WarmUp::run_for(*k, &st);
  } catch (const std::exception& e) {
    st.error = e.what();
  }
  try {
    k->reserve_staging(kStagingReserveTokens);
  } catch (const std::exception& e) {
    if (st.error.empty()) st.error = e.what();
  }
  st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

uint64_t cuda_blas_workspace_bytes(uint64_t bytes) {
  for (uint64_t w : kBlasWorkspaces)
    if (w <= bytes / 4) return w;
  return bytes / 4 / 256 * 256;  // a region below 1 MiB (never a planned step's: its scratch has more)
}

uint64_t cuda_kernels_workspace_bytes(const ModelSpec& s, int64_t n) {
  const uint64_t N = static_cast<uint64_t>(std::max<int64_t>(n, 1));
  const uint64_t H = static_cast<uint64_t>(s.hidden_size), QD = static_cast<uint64_t>(s.q_dim()),
                 KVD = static_cast<uint64_t>(s.kv_dim()), W = QD + 2 * KVD;
  const uint64_t F = static_cast<uint64_t>(s.is_moe() ? s.moe_intermediate_size : s.intermediate_size);
  const uint64_t K = static_cast<uint64_t>(s.is_moe() ? std::max<int64_t>(1, s.num_experts_per_tok) : 1);
  const uint64_t widest = std::max({H, QD, F});
  const uint64_t split = matmul_bytes_per_token(DType::BF16, static_cast<int64_t>(widest));  // the widest split
  const uint64_t rope = 2 * N * static_cast<uint64_t>(s.head_dim / 2) * 4 + 256;
  const uint64_t attn = N * (4 * (H + W + QD) + 1024 + split +
                             static_cast<uint64_t>(s.num_attention_heads) * static_cast<uint64_t>(s.head_dim + 2) * 4);
  const uint64_t ffn =
      s.is_moe() ? N * (4 * H + 1024 + K * (8 * (H + F) + 16) + split) : N * (4 * (H + 2 * F) + 1024 + split);
  const uint64_t fixed = 1024 + 128 * widest * 4 + 8 * 256;
  // Split-K partials of decode attention for 64 key ranges (with less room it splits less).
  const uint64_t partials = 64 * static_cast<uint64_t>(s.num_attention_heads) * static_cast<uint64_t>(s.head_dim + 2) *
                            4 * std::min<uint64_t>(N, 8);
  return rope + std::max(attn, ffn) + fixed + partials;
}

void cuda_matmul(const DevMat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                 uint8_t* workspace, uint64_t workspace_bytes, cudaStream_t stream, cublasHandle_t blas) {
  static float* consts = nullptr;
  if (!consts) {
    void* p = nullptr;
    check(cudaGetSymbolAddress(&p, g_zero_one), "cudaGetSymbolAddress");
    consts = static_cast<float*>(p);
  }
  Workspace ws;
  ws.reset(workspace, workspace_bytes);
  Ctx ctx;
  ctx.stream = stream;
  ctx.blas = blas;
  ctx.ws = &ws;
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  ctx.sm_count = std::max(1, sms);
  ctx.dev_zero_one = consts;
  MatRef m;
  m.dtype = w.dtype;
  m.data = w.data;
  m.rows = w.rows;
  m.cols = w.cols;
  matmul(ctx, m, x, ldx, n, y, ldy, accumulate);
}

}  // namespace shardwise

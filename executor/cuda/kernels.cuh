// executor/cuda/kernels.cuh — the launchers of the CUDA kernel families that blocks.cu composes into
// the model's blocks: GEMV (gemv.cu), matmul dispatch with exact cuBLAS GEMMs (gemm.cu), norms,
// RoPE and element-wise/MoE helpers (norm_rope.cu), attention (attention.cu). All launch on ctx.stream
// and take device temporaries only from ctx.ws. Activations and accumulation are f32 everywhere.
#pragma once

#include <cstdint>

#include "executor/cuda/cuda_common.cuh"

namespace shardwise {
namespace cuda {

// ---- GEMV (decode; gemv.cu) -------------------------------------------------------------------
constexpr int kGemvMaxTokens = 8;  // tokens per pass of a GEMV (the decode path: n <= 8)
constexpr int kGemvMaxTasks = 16;  // matrices per launch

enum class GemvMode : int32_t {
  Store = 0,       // y  = W x
  Accumulate = 1,  // y += W x
  SwiGLU = 2,      // y  = silu(W0 x) * (W1 x)   (gate and up of an FFN in one pass)
};

// One matrix-times-few-vectors product: y[t * ldy + r] (op)= sum_c W[r, c] * x[tok[t] * ldx + c].
struct GemvTask {
  const uint8_t* w0 = nullptr;  // (rows, cols), rows contiguous, of the launch's dtype
  const uint8_t* w1 = nullptr;  // SwiGLU only: the up matrix, same shape and dtype as w0 (the gate)
  const float* x = nullptr;
  float* y = nullptr;
  int64_t ldx = 0, ldy = 0;
  int32_t rows = 0, cols = 0, nt = 0;  // nt tokens, 1..kGemvMaxTokens
  int32_t tok[kGemvMaxTokens] = {0, 1, 2, 3, 4, 5, 6, 7};
  // Matrices chosen on the device (MoE experts routed there): when sel is set, the kernel uses matrix
  // e = *sel: at w0 + e * sel_stride (and w1 + e * sel_stride) when sel_stride > 0 (experts laid out
  // evenly, as a pinned shard holds them), else entry e of the device pointer tables w0 (and w1).
  // sel_fast says whether every candidate matrix meets the fast kernel's alignment.
  const int32_t* sel = nullptr;
  int64_t sel_stride = 0;
  bool sel_fast = false;
};

// Where a launch splits each row pair's columns among a block's warps (k-split, gemv.cu): Auto where the
// launch has few rows for the GPU (what the blocks use); Never and Always force one way (tests, benchmarks).
enum class GemvSplit { Auto, Never, Always };

// Runs `count` tasks of one dtype (any count; launches kGemvMaxTasks at a time).
void gemv(const Ctx& ctx, DType dtype, GemvMode mode, const GemvTask* tasks, int count,
          GemvSplit split = GemvSplit::Auto);

// Whether a matrix of this dtype at w meets the fast GEMV kernel's alignment (false: the dtype has no
// fast kernel, and its GEMVs take the generic one).
bool gemv_fast_aligned(DType dtype, const void* w);

// ---- quantised GEMM on tensor cores (quant_gemm.cu) ---------------------------------------------
// Activations as quant_gemm reads them: row t of x as x[t] * s_t = hi + lo, two f16 rows (s_t a power of
// two that puts the row's largest |value| just below 2^15; lo the remainder of hi, rounded: ~2^-22
// relative), and 1 / s_t. Taken from ctx.ws (split_rows_bytes).
struct SplitRows {
  __half* hi = nullptr;
  __half* lo = nullptr;
  float* inv_scale = nullptr;
  int64_t ld = 0;  // halves between rows (the columns, a multiple of 32)
  int64_t rows = 0;
};
uint64_t split_rows_bytes(int64_t rows, int64_t cols);
SplitRows split_rows(const Ctx& ctx, const float* x, int64_t ldx, int64_t rows, int64_t cols);

// One matrix of a quant_gemm launch: y[t * ldy + r] (+)= sum_c W[r, c] * x[x_row + t, c] for t < m, r < rows.
struct QuantGemmTask {
  const uint8_t* w = nullptr;  // rows x cols of the launch's dtype (q8_0 or q4_0)
  int64_t x_row = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int32_t rows = 0, m = 0;
};
// Every task's product, exact (f32 error, see quant_gemm.cu), in one launch per 64 tasks; tasks share the
// dtype, the columns and the split activations.
// Whether quant_gemm has a kernel for the dtype (q8_0, q4_0 and the K-quants).
bool quant_gemm_computes(DType dtype);
void quant_gemm(const Ctx& ctx, DType dtype, const SplitRows& x, int64_t cols, const QuantGemmTask* tasks, int count,
                bool accumulate);

// ---- matmul dispatch (gemm.cu) ----------------------------------------------------------------
struct MatRef {
  DType dtype = DType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// y[t * ldy + r] (+)= sum_c W[r, c] * x[t * ldx + c] for t < n. n <= 8: GEMV. Larger n, exact arithmetic:
// f32 weights: cuBLAS SGEMM (no TF32); f16: x split into two scaled f16 parts, two cuBLAS tensor-core
// GEMMs with f32 accumulation; bf16: x split into three bf16 parts, three GEMMs; q8_0/q4_0: x split
// (split_rows) and quant_gemm. Falls back to GEMV passes of 8 tokens when the workspace has no room for
// the split activations.
void matmul(const Ctx& ctx, const MatRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            bool accumulate);
// Workspace bytes per token that matmul wants for the split of x (0 for f32).
uint64_t matmul_bytes_per_token(DType dtype, int64_t cols);
// Workspace bytes matmul wants besides the per-token part (scalars).
uint64_t matmul_fixed_bytes(DType dtype, int64_t rows, int64_t cols);

// ---- norms, RoPE, element-wise, MoE helpers (norm_rope.cu) -------------------------------------
// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w for n rows of dim; y may alias x.
void rms_norm(const Ctx& ctx, const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int64_t n,
              int64_t dim);

// After the q/k/v projections: their biases (optional), per-head RMSNorm of q and k (optional), RoPE of q
// and k with the host-computed angle table; with a cache, k and v rows go to cache rows pos_first + t (k
// is then not written back to qkv), else k (and v, biased) stay in qkv.
struct QkRopeArgs {
  float* qkv = nullptr;  // [n, q_dim + 2 kv_dim], row stride `stride`
  int64_t stride = 0;
  int32_t n = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const float* q_norm = nullptr;  // [head_dim]; both null = no q/k norm
  const float* k_norm = nullptr;
  const float* q_bias = nullptr;  // [q_dim], [kv_dim], [kv_dim]; all null = no biases (qwen2 has them)
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  float eps = 0;
  const float* cos = nullptr;  // [n, head_dim / 2] for these tokens
  const float* sin = nullptr;
  bool neox = true;
  void* k_cache = nullptr;  // [capacity, kv_dim] of kv_dtype (null = no cache write)
  void* v_cache = nullptr;
  // f32, or f16 / bf16 (rounded to nearest even as they are stored), or q8_0 (each head's row quantised
  // as it is stored, head_dim a multiple of 32; the cache's element offsets count its values)
  DType kv_dtype = DType::F32;
  int32_t pos_first = 0;
};
void qk_norm_rope(const Ctx& ctx, const QkRopeArgs& a);

// x[i] += y[i] for i < n.
void add(const Ctx& ctx, float* x, const float* y, int64_t n);
// gate[i] = silu(gate[i]) * up[i] for rows x width (rows `ld` apart).
void swiglu(const Ctx& ctx, float* gate, const float* up, int64_t rows, int64_t width, int64_t ld);
// Positions [p0, p1) of a K or V cache of `capacity` positions, head-major [heads, capacity, hd] <->
// position-major [capacity, heads * hd] (to_positions: head-major src into position-major dst); elements
// of `dtype` (f32, f16 or bf16; q8_0: hd / 32 blocks per head row), copied as they are.
void kv_layout(const Ctx& ctx, const void* src, void* dst, int64_t capacity, int32_t heads, int32_t hd, int64_t p0,
               int64_t p1, bool to_positions, DType dtype);
// dst[i] = src[idx[i]] for n rows of width.
void gather_rows(const Ctx& ctx, const float* src, int64_t ld_src, const int32_t* idx, int64_t n, int64_t width,
                 float* dst, int64_t ld_dst);

// x[t] += sum over token t's experts (in ascending expert order) of weight * out[slot]; the sum is
// formed first, then added, as the CPU does. Table: entries [off[t], off[t+1]) of slot/weight.
constexpr int kMoeInlineEntries = 64;
struct MoeCombineArgs {
  float* x = nullptr;
  int64_t ldx = 0;
  const float* out = nullptr;  // [slots, width]
  int64_t ld_out = 0;
  int32_t n = 0, width = 0;
  // Either a device table (off: n + 1 ints, slot/weight: off[n] entries) or, when off == nullptr,
  // the inline table below (n <= kGemvMaxTokens, at most kMoeInlineEntries entries).
  const int32_t* off = nullptr;
  const int32_t* slot = nullptr;
  const float* weight = nullptr;
  int32_t inline_off[kGemvMaxTokens + 1] = {};
  int32_t inline_slot[kMoeInlineEntries] = {};
  float inline_weight[kMoeInlineEntries] = {};
};
void moe_combine(const Ctx& ctx, const MoeCombineArgs& a);

// Top-k routing on the device, as moe_routing.h on the host: per token, softmax over its router
// logits, the top_k largest (ties: lower expert first), weights renormalised when asked; the k
// experts are written in ascending expert order (the order the combine adds them, as the CPU
// does). Also writes the combine's table: off[t] = t * top_k (n + 1 entries), slot[i] = i.
struct MoeTopkArgs {
  const float* logits = nullptr;  // [n, n_experts]
  int32_t n = 0, n_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* ids = nullptr;    // [n, top_k]
  float* weights = nullptr;  // [n, top_k]
  int32_t* off = nullptr;    // [n + 1]
  int32_t* slot = nullptr;   // [n, top_k]
};
constexpr int kMoeTopkMaxK = 32;
void moe_topk(const Ctx& ctx, const MoeTopkArgs& a);

// ---- attention (attention.cu) -----------------------------------------------------------------
// Causal GQA attention of n queries (query t at position pos_first + t, attending cache rows
// 0 .. pos_first + t) over f32, f16, bf16 or q8_0 caches (read as f32: q8_0 blocks dequantised as they are
// loaded, head_dim a multiple of 32); scale 1/sqrt(head_dim); online softmax in f32. Decode-sized
// steps split the keys across warps (split-K) and combine; larger steps run flash-style tiles.
// Any head_dim of 1 .. kMaxAttentionHeadDim (kernels for 32/64/128/256, smaller head_dims padded
// with zeros); any pointer alignment and stride (16-byte aligned rows with head_dim in {32, 64, 128,
// 256} take the vectorised loads, head_dim % 4 == 0 with aligned rows float4 pieces, else scalars).
constexpr int kMaxAttentionHeadDim = 256;
// The split-K decode kernel (attention.cu): Block, a block of 8 pipelined warps per split, merged in shared
// memory; Warps, a pipelined warp per split. Auto (what the blocks use) takes Block, or Warps past two groups
// of 4 query rows per kv head, where it is faster.
enum class DecodeAttn : int32_t { Auto, Block, Warps };
struct AttnArgs {
  const float* q = nullptr;  // query t, head h at q + t * q_stride + h * head_dim
  int64_t q_stride = 0;
  const void* k = nullptr;  // cache row j at k + j * kv_stride elements (kv head g at + g * head_dim)
  const void* v = nullptr;  // (q8_0: element e in block e / 32; k and v point at a block)
  int64_t kv_stride = 0;
  DType kv_dtype = DType::F32;  // the cache's element type: f32, f16, bf16 or q8_0
  float* out = nullptr;         // [n, n_heads * head_dim], row stride out_stride
  int64_t out_stride = 0;
  int32_t n = 0, pos_first = 0;
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // Decode (n <= 8): the fewest keys one warp of a split-K decode kernel takes (0: the kernel's default:
  // about sqrt(context) for Warps, two steps of keys for Block). The kernel benchmark sweeps it; the
  // blocks leave it at 0.
  int32_t decode_min_keys = 0;
  // Decode kernel: Auto, or one forced (the GPU suite checks both, the kernel benchmark times them). The
  // block kernel loads cache rows before pos_first before it waits for the kernel launched just before it
  // (programmatic dependent launch): that kernel must not write those rows (the attention block's RoPE,
  // the kernel before, appends rows pos_first ..). Prefill steps ignore it.
  DecodeAttn decode_kernel = DecodeAttn::Auto;
};
void attention(const Ctx& ctx, const AttnArgs& a);
// Whether attention runs this head_dim (1 .. kMaxAttentionHeadDim).
bool attention_head_dim_supported(int64_t head_dim);

}  // namespace cuda
}  // namespace shardwise

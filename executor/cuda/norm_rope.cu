// executor/cuda/norm_rope.cu — RMSNorm, per-head q/k RMSNorm + RoPE (+ K/V cache rows), SwiGLU, row
// gathers and the deterministic MoE combine. Each mirrors the CPU op's arithmetic (executor/cpu/ops.cpp):
// x * scale * w in that order, RoPE's products and differences rounded separately (no FMA
// contraction) with the host's angle table, expert outputs summed in ascending expert order before
// the residual add. Only sums of squares differ in order from the CPU's SIMD dot.
#include <algorithm>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"

namespace shardwise {
namespace cuda {
namespace {

constexpr int kMaxHeadDim = 512;

__device__ float block_sum(float v, float* scratch /* [32] */) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();  // scratch may be reused by the caller
  return t;
}

// One block per row. Rows whose float4s fit kNormUnroll per thread (the launcher sizes the block so)
// are read once into registers, x and w together, so a thread's loads are all in flight at once: a
// decode step's norm is one row, and a loop of dependent loads made it ~11 us of DRAM round trips on
// the H200 (Nsight Compute). Other rows (odd sizes, misaligned,
// very wide) take the general loop.
constexpr int kNormUnroll = 4;

__device__ __forceinline__ float sum_sq(const float4& a) {
  return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
}

__global__ void rms_norm_kernel(const float* x, int64_t ldx, const float* __restrict__ w, float eps, float* y,
                                int64_t ldy, int dim) {
  pdl_begin();
  __shared__ float scratch[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * ldy;
  const int n4 = dim / 4, stride = static_cast<int>(blockDim.x);
  const bool vec =
      dim % 4 == 0 && n4 <= kNormUnroll * stride &&
      ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr) | reinterpret_cast<uintptr_t>(w)) & 15) == 0;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4 xv[kNormUnroll], wv[kNormUnroll];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormUnroll; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * stride;
      if (c < n4) {
        xv[i] = x4[c];
        wv[i] = w4[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kNormUnroll; ++i)
      if (static_cast<int>(threadIdx.x) + i * stride < n4) ss += sum_sq(xv[i]);
    ss = block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    float4* y4 = reinterpret_cast<float4*>(yr);
#pragma unroll
    for (int i = 0; i < kNormUnroll; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * stride;
      if (c < n4)
        y4[c] = make_float4(xv[i].x * scale * wv[i].x, xv[i].y * scale * wv[i].y, xv[i].z * scale * wv[i].z,
                            xv[i].w * scale * wv[i].w);
    }
    return;
  }
  float ss = 0.0f;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss = fmaf(xr[c], xr[c], ss);
  ss = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = xr[c] * scale * w[c];
}

// Block `block` of a q8_0 K or V cache from a warp, lane l holding its value l: the scale from the
// warp's absolute maximum, then each lane's code, with the operations of the host's quantiser
// (core/quants.cpp, ggml's quantize_row_q8_0_ref): d = amax / 127, q = roundf(x * (1 / d)), d stored
// as f16 rounded to nearest even. All 32 lanes must call it.
__device__ __forceinline__ void store_q8_0_warp(void* cache, int64_t block, int lane, float x) {
  const float amax = warp_max(fabsf(x));
  const float d = __fdiv_rn(amax, 127.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  BlockQ8_0* b = static_cast<BlockQ8_0*>(cache) + block;
  if (lane == 0) b->d = __half_as_ushort(__float2half_rn(d));
  b->qs[lane] = static_cast<int8_t>(roundf(__fmul_rn(x, id)));
}

// Element `at` of a K or V cache of f32, f16 or bf16 (rounded to nearest even); q8_0 caches are written
// a block per warp (store_q8_0_warp).
__device__ __forceinline__ void store_kv(void* cache, DType t, int64_t at, float v) {
  if (t == DType::F16)
    static_cast<__half*>(cache)[at] = __float2half_rn(v);
  else if (t == DType::BF16)
    static_cast<__nv_bfloat16*>(cache)[at] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(cache)[at] = v;
}

// Grid (tokens, head groups of 4); one warp per head: q heads, then k heads, then (with a cache or a v
// bias) v heads. A q8_0 cache's row of a head is quantised by its warp, a block of 32 at a time (head_dim
// a multiple of 32): the roped k values are gathered in the warp's buffer first.
__global__ void __launch_bounds__(128) qk_rope_kernel(const __grid_constant__ QkRopeArgs a) {
  pdl_begin();
  __shared__ float buf[4][kMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nh = a.n_heads, nkv = a.n_kv_heads, D = a.head_dim, half = D / 2;
  const int total = nh + nkv + (a.k_cache || a.v_bias ? nkv : 0);
  const int hh = blockIdx.y * 4 + warp;
  if (hh >= total) return;
  const int64_t t = blockIdx.x;
  const int64_t qd = static_cast<int64_t>(nh) * D, kvd = static_cast<int64_t>(nkv) * D;
  float* row = a.qkv + t * a.stride;
  const int64_t cache_row = (static_cast<int64_t>(a.pos_first) + t) * kvd;
  if (hh >= nh + nkv) {  // v head: biased, into the cache (or in place without one)
    const int g = hh - nh - nkv;
    float* src = row + qd + kvd + static_cast<int64_t>(g) * D;
    const int64_t at = cache_row + static_cast<int64_t>(g) * D;
    const float* vb = a.v_bias ? a.v_bias + static_cast<int64_t>(g) * D : nullptr;
    for (int d = lane; d < D; d += 32) {  // (q8_0: d - lane starts a block, and every lane takes part)
      const float v = vb ? __fadd_rn(src[d], vb[d]) : src[d];
      if (a.v_cache && a.kv_dtype == DType::Q8_0)
        store_q8_0_warp(a.v_cache, (at + d) / kQK8_0, lane, v);
      else if (a.v_cache)
        store_kv(a.v_cache, a.kv_dtype, at + d, v);
      else
        src[d] = v;
    }
    return;
  }
  const bool is_q = hh < nh;
  const int head = is_q ? hh : hh - nh;
  float* src = is_q ? row + static_cast<int64_t>(head) * D : row + qd + static_cast<int64_t>(head) * D;
  const float* nw = is_q ? a.q_norm : a.k_norm;
  const float* bias = is_q ? a.q_bias : a.k_bias;
  if (bias) bias += static_cast<int64_t>(head) * D;
  float* b = buf[warp];
  float ss = 0.0f;
  for (int d = lane; d < D; d += 32) {
    const float v = bias ? __fadd_rn(src[d], bias[d]) : src[d];
    b[d] = v;
    ss = fmaf(v, v, ss);
  }
  if (nw != nullptr) {
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(D) + a.eps);
    for (int d = lane; d < D; d += 32) b[d] = b[d] * scale * nw[d];
  }
  __syncwarp();
  const bool to_cache = !is_q && a.k_cache != nullptr;    // else in place
  const bool q8 = to_cache && a.kv_dtype == DType::Q8_0;  // roped values back into b, then quantised
  const int64_t at = cache_row + static_cast<int64_t>(head) * D;
  const float* cs = a.cos + t * half;
  const float* sn = a.sin + t * half;
  for (int p = lane; p < half; p += 32) {
    const int i0 = a.neox ? p : 2 * p;
    const int i1 = a.neox ? p + half : 2 * p + 1;
    const float x0 = b[i0], x1 = b[i1], c = cs[p], s = sn[p];
    const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    const float y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    if (q8) {  // each pair is read and written by one lane only
      b[i0] = y0;
      b[i1] = y1;
    } else if (to_cache) {
      store_kv(a.k_cache, a.kv_dtype, at + i0, y0);
      store_kv(a.k_cache, a.kv_dtype, at + i1, y1);
    } else {
      src[i0] = y0;
      src[i1] = y1;
    }
  }
  if (!q8) return;
  __syncwarp();
  for (int d = lane; d < D; d += 32) store_q8_0_warp(a.k_cache, (at + d) / kQK8_0, lane, b[d]);
}

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void swiglu_kernel(float* gate, const float* __restrict__ up, int64_t width, int64_t ld) {
  pdl_begin();
  const int64_t r = blockIdx.y;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < width;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[r * ld + c];
    gate[r * ld + c] = g / (1.0f + expf(-g)) * up[r * ld + c];
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ src, int64_t ld_src, const int32_t* __restrict__ idx,
                                   int64_t width, float* dst, int64_t ld_dst) {
  pdl_begin();
  const int64_t r = blockIdx.y;
  const float* s = src + static_cast<int64_t>(idx[r]) * ld_src;
  float* d = dst + r * ld_dst;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < width;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    d[c] = s[c];
}

// One thread per element of rows [p0, p1): grid (kv_dim blocks of 256, rows). T: the element's bits
// (float or uint16_t for f16), copied unchanged.
template <typename T>
__global__ void kv_layout_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t capacity, int32_t heads,
                                 int32_t hd, int64_t p0, bool to_positions) {
  pdl_begin();
  const int64_t p = p0 + blockIdx.y;
  const int64_t kvd = static_cast<int64_t>(heads) * hd;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < kvd;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = c / hd, d = c % hd;
    const int64_t head_at = (h * capacity + p) * hd + d, pos_at = p * kvd + c;
    if (to_positions)
      dst[pos_at] = src[head_at];
    else
      dst[head_at] = src[pos_at];
  }
}

__global__ void moe_combine_kernel(const __grid_constant__ MoeCombineArgs a) {
  pdl_begin();
  const int t = blockIdx.y;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= a.width) return;
  const bool dev = a.off != nullptr;
  const int e0 = dev ? a.off[t] : a.inline_off[t];
  const int e1 = dev ? a.off[t + 1] : a.inline_off[t + 1];
  float acc = 0.0f;
  for (int e = e0; e < e1; ++e) {
    const int slot = dev ? a.slot[e] : a.inline_slot[e];
    const float w = dev ? a.weight[e] : a.inline_weight[e];
    acc = __fadd_rn(acc, __fmul_rn(w, a.out[static_cast<int64_t>(slot) * a.ld_out + c]));
  }
  float* xp = a.x + static_cast<int64_t>(t) * a.ldx + c;
  *xp = __fadd_rn(*xp, acc);
}

// One warp per token: softmax over the logits in shared memory, then top_k rounds of a warp
// argmax (largest probability, lowest expert on ties), each removing its winner.
__global__ void __launch_bounds__(32) moe_topk_kernel(const MoeTopkArgs a) {
  pdl_begin();
  extern __shared__ float p[];
  __shared__ int32_t sel_id[kMoeTopkMaxK];
  __shared__ float sel_p[kMoeTopkMaxK];
  const int t = blockIdx.x, lane = threadIdx.x, E = a.n_experts, K = a.top_k;
  const float* l = a.logits + static_cast<int64_t>(t) * E;
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
  m = warp_max(m);
  float s = 0.0f;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(l[e] - m);
    p[e] = v;
    s += v;
  }
  s = warp_sum(s);
  for (int e = lane; e < E; e += 32) p[e] = p[e] / s;
  __syncwarp();
  for (int j = 0; j < K; ++j) {
    float best = -1.0f;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > best || (v == best && e < bi)) best = v, bi = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) best = ov, bi = oi;
    }
    if (lane == 0) {
      sel_id[j] = bi;
      sel_p[j] = best;
      p[bi] = -2.0f;  // below every probability: never picked again
    }
    __syncwarp();
  }
  if (lane != 0) return;
  float sum = 0.0f;
  for (int j = 0; j < K; ++j) sum += sel_p[j];  // in the host's order: descending probability
  for (int j = 1; j < K; ++j)                   // then ascending expert order
    for (int i = j; i > 0 && sel_id[i - 1] > sel_id[i]; --i) {
      const int32_t ti = sel_id[i];
      sel_id[i] = sel_id[i - 1];
      sel_id[i - 1] = ti;
      const float tp = sel_p[i];
      sel_p[i] = sel_p[i - 1];
      sel_p[i - 1] = tp;
    }
  for (int j = 0; j < K; ++j) {
    const int i = t * K + j;
    a.ids[i] = sel_id[j];
    a.weights[i] = a.renormalize ? sel_p[j] / sum : sel_p[j];
    a.slot[i] = i;
  }
  a.off[t] = t * K;
  if (t == a.n - 1) a.off[a.n] = a.n * K;
}

dim3 rows_grid(int64_t rows, int64_t width, int threads) {
  SW_CHECK(rows < 65536, "CUDA kernels: ", rows, " rows in one launch (at most 65535)");
  const int64_t bx = std::max<int64_t>(1, std::min<int64_t>(ceil_div(width, threads), 1024));
  return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(rows));
}

}  // namespace

bool pdl_enabled() {
  static const bool enabled = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

void rms_norm(const Ctx& ctx, const float* x, int64_t ldx, const float* w, float eps, float* y, int64_t ldy, int64_t n,
              int64_t dim) {
  if (n <= 0) return;
  SW_CHECK(w != nullptr, "CUDA rms_norm: the norm weight is not on the device");
  SW_CHECK(n < (int64_t(1) << 31) && dim < (int64_t(1) << 31), "CUDA rms_norm: too large");
  // Enough threads that a row's float4s fit kNormUnroll per thread (up to 16384 floats), at least 128.
  const int64_t per_pass = 4 * kNormUnroll;
  const int threads =
      static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(128, (dim + per_pass - 1) / per_pass + 31) / 32 * 32));
  launch_kernel("rms_norm kernel", rms_norm_kernel, dim3(static_cast<unsigned>(n)), dim3(threads), 0, ctx.stream, x,
                ldx, w, eps, y, ldy, static_cast<int>(dim));
}

void qk_norm_rope(const Ctx& ctx, const QkRopeArgs& a) {
  if (a.n <= 0) return;
  SW_CHECK(a.head_dim % 2 == 0 && a.head_dim <= kMaxHeadDim, "CUDA RoPE: head_dim ", a.head_dim,
           " is not supported (even, at most ", kMaxHeadDim, ")");
  SW_CHECK((a.q_norm == nullptr) == (a.k_norm == nullptr), "CUDA RoPE: q_norm and k_norm must both be given");
  SW_CHECK(a.cos != nullptr && a.sin != nullptr, "CUDA RoPE: no angle table (prepare_step was not called)");
  SW_CHECK((a.k_cache == nullptr) == (a.v_cache == nullptr), "CUDA RoPE: k and v caches go together");
  SW_CHECK(is_kv_dtype(a.kv_dtype), "CUDA RoPE: a ", dtype_name(a.kv_dtype), " cache");
  if (a.k_cache != nullptr) check_kv_head_dim(a.kv_dtype, a.head_dim, "CUDA RoPE");
  SW_CHECK((a.q_bias == nullptr) == (a.k_bias == nullptr) && (a.q_bias == nullptr) == (a.v_bias == nullptr),
           "CUDA RoPE: the q, k and v biases go together");
  const int total = a.n_heads + a.n_kv_heads + (a.k_cache || a.v_bias ? a.n_kv_heads : 0);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(ceil_div(total, 4)));
  launch_kernel("q/k norm + RoPE kernel", qk_rope_kernel, grid, dim3(128), 0, ctx.stream, a);
}

void add(const Ctx& ctx, float* x, const float* y, int64_t n) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>(1024, (n + 255) / 256);
  launch_kernel("add kernel", add_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, ctx.stream, x, y, n);
}

void swiglu(const Ctx& ctx, float* gate, const float* up, int64_t rows, int64_t width, int64_t ld) {
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const int64_t m = std::min<int64_t>(65535, rows - r0);
    launch_kernel("swiglu kernel", swiglu_kernel, rows_grid(m, width, 256), dim3(256), 0, ctx.stream, gate + r0 * ld,
                  up + r0 * ld, width, ld);
  }
}

void gather_rows(const Ctx& ctx, const float* src, int64_t ld_src, const int32_t* idx, int64_t n, int64_t width,
                 float* dst, int64_t ld_dst) {
  for (int64_t r0 = 0; r0 < n; r0 += 65535) {
    const int64_t m = std::min<int64_t>(65535, n - r0);
    launch_kernel("gather kernel", gather_rows_kernel, rows_grid(m, width, 256), dim3(256), 0, ctx.stream, src, ld_src,
                  idx + r0, width, dst + r0 * ld_dst, ld_dst);
  }
}

void kv_layout(const Ctx& ctx, const void* src, void* dst, int64_t capacity, int32_t heads, int32_t hd, int64_t p0,
               int64_t p1, bool to_positions, DType dtype) {
  SW_CHECK(0 <= p0 && p0 <= p1 && p1 <= capacity && heads > 0 && hd > 0, "kv_layout: positions [", p0, ", ", p1,
           ") of ", capacity);
  SW_CHECK(is_kv_dtype(dtype), "kv_layout: a ", dtype_name(dtype), " cache");
  check_kv_head_dim(dtype, hd, "kv_layout");
  // A q8_0 head row (hd / 32 blocks of 34 bytes) moves as 17 * hd / 32 16-bit words: the rows are
  // 2-byte aligned and only copied, never read.
  const int32_t words = dtype == DType::Q8_0 ? static_cast<int32_t>(dtype_row_bytes(dtype, hd) / 2) : hd;
  const int64_t width = static_cast<int64_t>(heads) * words;
  for (int64_t r0 = p0; r0 < p1; r0 += 65535) {
    const int64_t m = std::min<int64_t>(65535, p1 - r0);
    if (dtype != DType::F32)  // 16-bit elements (or words of q8_0 blocks)
      launch_kernel("kv layout kernel", kv_layout_kernel<uint16_t>, rows_grid(m, width, 256), dim3(256), 0, ctx.stream,
                    static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), capacity, heads, words, r0,
                    to_positions);
    else
      launch_kernel("kv layout kernel", kv_layout_kernel<float>, rows_grid(m, width, 256), dim3(256), 0, ctx.stream,
                    static_cast<const float*>(src), static_cast<float*>(dst), capacity, heads, hd, r0, to_positions);
  }
}

void moe_topk(const Ctx& ctx, const MoeTopkArgs& a) {
  if (a.n <= 0) return;
  SW_CHECK(a.n < (1 << 30) && a.top_k >= 1 && a.top_k <= kMoeTopkMaxK && a.top_k <= a.n_experts,
           "CUDA MoE top-k: ", a.top_k, " of ", a.n_experts, " experts (at most ", kMoeTopkMaxK, ")");
  SW_CHECK(a.n_experts <= 12288, "CUDA MoE top-k: ", a.n_experts, " experts do not fit shared memory");
  SW_CHECK(a.logits && a.ids && a.weights && a.off && a.slot, "CUDA MoE top-k: a buffer is missing");
  launch_kernel("MoE top-k kernel", moe_topk_kernel, dim3(static_cast<unsigned>(a.n)), dim3(32),
                static_cast<size_t>(a.n_experts) * sizeof(float), ctx.stream, a);
}

void moe_combine(const Ctx& ctx, const MoeCombineArgs& a) {
  if (a.n <= 0) return;
  SW_CHECK(a.n < 65536, "CUDA MoE combine: ", a.n, " tokens in one launch (at most 65535)");
  SW_CHECK(a.off != nullptr || a.n <= kGemvMaxTokens, "CUDA MoE combine: the inline table holds ", kGemvMaxTokens,
           " tokens");
  const dim3 grid(static_cast<unsigned>(ceil_div(a.width, 256)), static_cast<unsigned>(a.n));
  launch_kernel("MoE combine kernel", moe_combine_kernel, grid, dim3(256), 0, ctx.stream, a);
}

}  // namespace cuda

void cuda_rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim, cudaStream_t stream) {
  SW_CHECK(n >= 0 && dim > 0, "cuda_rms_norm: ", n, " rows of ", dim);
  cuda::Ctx ctx;  // the element-wise kernels need only the stream
  ctx.stream = stream;
  cuda::rms_norm(ctx, x, dim, w, eps, y, dim, n, dim);
}

void cuda_swiglu(float* gate, const float* up, int64_t n, int64_t width, cudaStream_t stream) {
  SW_CHECK(n >= 0 && width >= 0, "cuda_swiglu: ", n, " rows of ", width);
  if (n == 0 || width == 0) return;
  cuda::Ctx ctx;
  ctx.stream = stream;
  cuda::swiglu(ctx, gate, up, n, width, width);
}

}  // namespace shardwise

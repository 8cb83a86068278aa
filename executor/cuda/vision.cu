// executor/cuda/vision.cu — the vision encoder's operations (device/vision_kernels.h) on CUDA, enqueued on
// one stream: linear layers through the blocks' exact matmul (cuda_matmul) plus a bias kernel, RMSNorm
// through cuda_rms_norm, and kernels of their own for the 2-D rotate-half rotary, the gated activations,
// row permutations and bidirectional attention over variable-length segments. Everything is f32; the
// element-wise kernels index with 64 bits (rows up to 2^20 of up to 2^16 floats).
//
// Attention is flash-style: a block of 256 threads takes 64 query rows of one segment and one head and
// walks the segment's keys in tiles of 64 with an online softmax, so that no score matrix larger than
// 64 x 64 exists. The block's queries (pre-scaled by log2(e) / sqrt(head_dim), so that exp2 gives the
// softmax's exp), the key tile and the value tile sit in shared memory; thread (ty, tx) of the 16 x 16
// layout owns query rows 4ty .. 4ty + 3, computes their scores against keys tx + 16c (c < 4) from float4
// reads (the keys' rows padded by 4 floats, so a quarter-warp's reads hit distinct banks), reduces the
// rows' maxima and sums over the 16 lanes of its row group by shuffles, and keeps the output columns
// tx + 16c (c < D / 16) of its 4 rows in registers. The probabilities pass through shared memory
// (transposed, so a thread reads its 4 rows' weight of a key as one float4). Key and value tiles are
// copied asynchronously (cp.async), one shared buffer each: the next keys land while the block sums this
// tile's values, the next values while it computes the next scores. head_dims are padded to the kernels'
// D (32, 64, 80, 96, 128) with zeros, which change no score and no written output.
#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"
#include "executor/device/vision_kernels.h"

namespace shardwise {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // element-wise kernels

// Blocks of a grid-stride launch over `count` items, kThreads each (the loops cover the rest).
unsigned stride_blocks(int64_t count) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(count, kThreads), 65535)));
}

// ---- linear's bias ----------------------------------------------------------------------------------
__global__ void bias_add_kernel(float* y, int64_t ldy, const float* __restrict__ bias, int64_t rows, int64_t n) {
  pdl_begin();
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y)
    for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x)
      y[t * ldy + r] += bias[r];
}

// ---- rotary -------------------------------------------------------------------------------------------
// One thread per rotated pair (row t, head hh of the 2 * n_heads q and k heads, pair p): HF's rotate-half,
// x[p] * cos - x[p + half] * sin and x[p + half] * cos + x[p] * sin, each product rounded on its own (no
// FMA contraction), as the CPU's RoPE does.
__global__ void vision_rotary_kernel(float* qkv, const float* __restrict__ cos, const float* __restrict__ sin,
                                     int64_t pairs, int64_t heads2, int64_t half, int64_t row_stride) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = i % half, rest = i / half;
    const int64_t hh = rest % heads2, t = rest / heads2;
    float* v = qkv + t * row_stride + hh * 2 * half;
    const float c = cos[t * half + p], s = sin[t * half + p];
    const float x0 = v[p], x1 = v[p + half];
    v[p] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[p + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

// ---- activations --------------------------------------------------------------------------------------
// The CPU's formulas (HF's ACT2FN), in f32.
template <VisionAct A>
__device__ __forceinline__ float act(float x) {
  if constexpr (A == VisionAct::Silu) return x / (1.0f + expf(-x));
  if constexpr (A == VisionAct::Gelu) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  if constexpr (A == VisionAct::GeluTanh)
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  return x / (1.0f + expf(-1.702f * x));  // QuickGelu
}

template <VisionAct A>
__global__ void vision_act_kernel(float* gate, const float* __restrict__ up, int64_t count) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = act<A>(gate[i]);
    gate[i] = up ? g * up[i] : g;
  }
}

// ---- row permutations ---------------------------------------------------------------------------------
// One block per row i: gather copies src row index[i] to dst row i, scatter src row i to dst row index[i];
// in float4 pieces when every row is 16-byte aligned (vec4, uniform).
__global__ void permute_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ index,
                                    float* __restrict__ dst, int64_t width, bool scatter, bool vec4) {
  pdl_begin();
  const int64_t i = blockIdx.x, j = index[i];
  const float* s = src + (scatter ? i : j) * width;
  float* d = dst + (scatter ? j : i) * width;
  if (vec4) {
    const float4* s4 = reinterpret_cast<const float4*>(s);
    float4* d4 = reinterpret_cast<float4*>(d);
    for (int64_t c = threadIdx.x; c < width / 4; c += blockDim.x) d4[c] = s4[c];
    return;
  }
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

// ---- attention ----------------------------------------------------------------------------------------
constexpr int kAttnRows = 64;           // query rows per block (the CPU's query tile)
constexpr int kAttnKeys = 64;           // keys per shared-memory tile
constexpr int kAttnThreads = 256;       // 16 x 16: thread (ty, tx) owns query rows 4ty .. 4ty + 3
constexpr int kProbLd = kAttnRows + 4;  // the probability tile [key][row], padded against bank conflicts
static_assert(kAttnRows == 4 * (kAttnThreads / 16) && kAttnKeys == 4 * 16, "the thread layout covers the tiles");

struct VisionAttnArgs {
  const float* qkv;  // row t, head h: q at qkv + t * ld + h * hd, k n_heads * hd further, v as far again
  float* out;        // row t, head h at out + t * ld_out + h * hd
  const int32_t* cu_seqlens;
  int64_t ld, ld_out;
  int32_t n_heads, hd;
  float q_scale;  // log2(e) / sqrt(hd)
  bool vec4;      // qkv 16-byte aligned: rows load in float4 pieces (hd % 4 == 0 keeps every piece aligned)
};

// Shared memory of the kernel for padded head size D: queries and keys [64][D + 4] (the padding keeps a
// quarter-warp's float4 reads of rows tx, tx + 1, ... on distinct banks), values [64][D] (read along d),
// probabilities [64 keys][kProbLd].
template <int D>
struct AttnTile {
  static_assert(D % 16 == 0 && D <= kVisionMaxHeadDim, "D: a multiple of 16, at most the largest head_dim");
  static constexpr int kLd = D + 4;
  static constexpr int kCols = D / 16;  // output columns per thread
  static constexpr int kSmemFloats = kAttnRows * kLd + kAttnKeys * kLd + kAttnKeys * D + kAttnKeys * kProbLd;
  static constexpr int kMinBlocks = D <= 96 ? 2 : 1;  // blocks per SM that shared memory allows (H100/H200)
};

// Rows r0 .. r0 + 63 of one head (row r at src + r * ld, elements 0 .. hd - 1) into dst [64][LD], its first D
// floats per row, times mul; rows at or past `end` and elements at or past hd are 0 (so that padded keys and
// lanes add nothing: a NaN there would survive a zero weight). The queries' staging.
template <int D, int LD>
__device__ __forceinline__ void stage_rows(float* dst, const float* src, int64_t ld, int64_t r0, int64_t end, int hd,
                                           bool vec4, float mul) {
  constexpr int kQuads = D / 4;
  static_assert(kAttnRows * kQuads % kAttnThreads == 0, "every thread stages the same number of pieces");
#pragma unroll
  for (int it = 0; it < kAttnRows * kQuads / kAttnThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kAttnThreads;
    const int r = i / kQuads, d = (i % kQuads) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r0 + r < end && d < hd) {
      const float* p = src + (r0 + r) * ld + d;
      if (vec4)
        v = *reinterpret_cast<const float4*>(p);
      else
        v = make_float4(p[0], p[1], p[2], p[3]);
    }
    *reinterpret_cast<float4*>(dst + r * LD + d) = make_float4(v.x * mul, v.y * mul, v.z * mul, v.w * mul);
  }
}

// 16 bytes (or 4) from global to shared memory without passing through registers (cp.async, sm_80+): they
// land while the block computes; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void copy_async16(float* dst, const float* src, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void copy_async4(float* dst, const float* src, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// As stage_rows without the factor, asynchronously (one group once committed): rows past `end` and lanes
// past hd are zero-filled, reading from `src` itself, a valid address.
template <int D, int LD>
__device__ __forceinline__ void stage_rows_async(float* dst, const float* src, int64_t ld, int64_t r0, int64_t end,
                                                 int hd, bool vec4) {
  constexpr int kQuads = D / 4;
#pragma unroll
  for (int it = 0; it < kAttnRows * kQuads / kAttnThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kAttnThreads;
    const int r = i / kQuads, d = (i % kQuads) * 4;
    const bool in = r0 + r < end && d < hd;
    const float* p = in ? src + (r0 + r) * ld + d : src;
    if (vec4) {
      copy_async16(dst + r * LD + d, p, in ? 16 : 0);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) copy_async4(dst + r * LD + d + e, in ? p + e : src, in ? 4 : 0);
    }
  }
}

// s[r][c] = (scaled q of row 4ty + r) . (key tx + 16c of the tile), over the padded head.
template <int D>
__device__ __forceinline__ void tile_scores(const float* qs, const float* ks, int tx, int ty, float (&s)[4][4]) {
  constexpr int LD = AttnTile<D>::kLd;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) s[r][c] = 0.0f;
#pragma unroll
  for (int d = 0; d < D; d += 4) {
    float4 q[4], k[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) q[r] = *reinterpret_cast<const float4*>(qs + (4 * ty + r) * LD + d);
#pragma unroll
    for (int c = 0; c < 4; ++c) k[c] = *reinterpret_cast<const float4*>(ks + (tx + 16 * c) * LD + d);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float a = s[r][c];
        a = fmaf(q[r].x, k[c].x, a);
        a = fmaf(q[r].y, k[c].y, a);
        a = fmaf(q[r].z, k[c].z, a);
        s[r][c] = fmaf(q[r].w, k[c].w, a);
      }
  }
}

// One tile's online-softmax step for the thread's 4 rows: s (scores, log2 domain; -inf for keys past the
// segment) becomes the probabilities against the new running maximum m; the row group's maximum and sum
// come from its 16 lanes (xor offsets below 16 stay inside the group); l and the output acc are rescaled
// once per tile.
template <int C>
__device__ __forceinline__ void online_softmax(float (&s)[4][4], float (&m)[4], float (&l)[4], float (&acc)[4][C]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float mx = fmaxf(fmaxf(s[r][0], s[r][1]), fmaxf(s[r][2], s[r][3]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float mn = fmaxf(m[r], mx);
    const float alpha = exp2f(m[r] - mn);  // 0 at the first tile (m = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[r][c] = exp2f(s[r][c] - mn);
      sum += s[r][c];
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    l[r] = l[r] * alpha + sum;
    m[r] = mn;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] *= alpha;
  }
}

// acc[r][c] += sum over the tile's keys j of p[j][row 4ty + r] * v[j][tx + 16c]: the probabilities of the
// thread's 4 rows for a key as one float4 (a broadcast), the values along d (16 consecutive floats a row group).
template <int D>
__device__ __forceinline__ void add_values(const float* ps, const float* vs, int tx, int ty, float (&acc)[4][D / 16]) {
#pragma unroll 8
  for (int j = 0; j < kAttnKeys; ++j) {
    const float4 p = *reinterpret_cast<const float4*>(ps + j * kProbLd + 4 * ty);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      const float v = vs[j * D + tx + 16 * c];
      acc[0][c] = fmaf(p.x, v, acc[0][c]);
      acc[1][c] = fmaf(p.y, v, acc[1][c]);
      acc[2][c] = fmaf(p.z, v, acc[2][c]);
      acc[3][c] = fmaf(p.w, v, acc[3][c]);
    }
  }
}

// Grid (segment, query tile, head). A block whose tile starts past its segment's end (segments shorter
// than the longest) exits at once; the others run every key tile of the segment. The last key tile's keys
// past the segment's end get no weight (score -inf; their staged values are 0).
template <int D>
__global__ void __launch_bounds__(kAttnThreads, AttnTile<D>::kMinBlocks)
    vision_attention_kernel(const VisionAttnArgs a) {
  pdl_begin();
  using T = AttnTile<D>;
  constexpr int C = T::kCols;
  const int64_t s0 = a.cu_seqlens[blockIdx.x], s1 = a.cu_seqlens[blockIdx.x + 1];
  const int64_t q0 = s0 + static_cast<int64_t>(blockIdx.y) * kAttnRows;
  if (q0 >= s1) return;  // uniform over the block: before any barrier
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // every part starts at a multiple of 4 floats
  float* ks = qs + kAttnRows * T::kLd;
  float* vs = ks + kAttnKeys * T::kLd;
  float* ps = vs + kAttnKeys * D;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t head_off = static_cast<int64_t>(blockIdx.z) * a.hd;
  const int64_t width = static_cast<int64_t>(a.n_heads) * a.hd;
  const float* qsrc = a.qkv + head_off;
  const float* ksrc = qsrc + width;
  const float* vsrc = ksrc + width;
  stage_rows<D, T::kLd>(qs, qsrc, a.ld, q0, s1, a.hd, a.vec4, a.q_scale);

  float m[4], l[4], acc[4][C];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
  }
  // Key and value tiles arrive asynchronously, each while the block works on the other half of the tile
  // before: the next keys during this tile's weighted sum of values, the next values during its scores.
  // Groups in flight at the top of an iteration: this tile's keys, then its values.
  stage_rows_async<D, T::kLd>(ks, ksrc, a.ld, s0, s1, a.hd, a.vec4);
  copy_async_commit();
  stage_rows_async<D, D>(vs, vsrc, a.ld, s0, s1, a.hd, a.vec4);
  copy_async_commit();
  for (int64_t k0 = s0; k0 < s1; k0 += kAttnKeys) {
    const bool more = k0 + kAttnKeys < s1;
    copy_async_wait<1>();  // this tile's keys landed (its values may not have)
    __syncthreads();       // ... for every thread, and the queries (first tile)
    float s[4][4];
    tile_scores<D>(qs, ks, tx, ty, s);
    const int64_t keys = s1 - k0;  // >= 1: every tile has a key, so each row's maximum is finite
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (tx + 16 * c < keys) continue;
#pragma unroll
      for (int r = 0; r < 4; ++r) s[r][c] = -INFINITY;
    }
    online_softmax(s, m, l, acc);
#pragma unroll
    for (int c = 0; c < 4; ++c)
      *reinterpret_cast<float4*>(ps + (tx + 16 * c) * kProbLd + 4 * ty) =
          make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
    copy_async_wait<0>();  // this tile's values landed
    __syncthreads();       // probabilities and values visible; the keys are read
    if (more) stage_rows_async<D, T::kLd>(ks, ksrc, a.ld, k0 + kAttnKeys, s1, a.hd, a.vec4);
    copy_async_commit();  // (empty after the last tile: the counting stays the same)
    add_values<D>(ps, vs, tx, ty, acc);
    __syncthreads();  // values and probabilities read
    if (more) stage_rows_async<D, D>(vs, vsrc, a.ld, k0 + kAttnKeys, s1, a.hd, a.vec4);
    copy_async_commit();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t row = q0 + 4 * ty + r;
    if (row >= s1) continue;
    float* o = a.out + row * a.ld_out + head_off;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int d = tx + 16 * c;
      if (d < a.hd) o[d] = acc[r][c] / l[r];
    }
  }
}

// The kernel's padded head size for a head_dim (a multiple of 4, at most kVisionMaxHeadDim).
int padded_head_dim(int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 80 ? 80 : hd <= 96 ? 96 : 128;
}

template <int D>
void launch_attention(const VisionAttnArgs& a, dim3 grid, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(AttnTile<D>::kSmemFloats) * sizeof(float);
  // Above 48 KiB the kernel must be allowed its shared memory; the attribute belongs to the kernel on
  // the current device (setting it again is harmless, so it is set on every launch).
  check(cudaFuncSetAttribute(vision_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "cudaFuncSetAttribute(vision attention)");
  launch_kernel("vision attention kernel", vision_attention_kernel<D>, grid, dim3(kAttnThreads), smem, stream, a);
}

template <VisionAct A>
void launch_act(float* gate, const float* up, int64_t count, cudaStream_t stream) {
  launch_kernel("vision activation kernel", vision_act_kernel<A>, dim3(stride_blocks(count)), dim3(kThreads), 0, stream,
                gate, up, count);
}

// ---- the operations -----------------------------------------------------------------------------------
// The largest cuBLAS workspace the kernels give it (the warm-up's).
constexpr uint64_t kWarmBlasCap = uint64_t(2) << 20;

class CudaVisionKernels final : public VisionKernels {
 public:
  CudaVisionKernels(cudaStream_t stream, cublasHandle_t blas) : stream_(stream), blas_(blas) {}
  VisionWorkspace workspace(DType matrix_dtype) const override { return cuda_vision_workspace(matrix_dtype); }

  void set_workspace(uint8_t* dev, uint64_t bytes) override {
    SW_CHECK(dev != nullptr || bytes == 0, "CUDA vision kernels: a workspace of ", bytes, " bytes at null");
    // cublasSetStream gives the handle cuBLAS's own workspace back: the stream first, then ours (as matmul
    // sets the stream only when it differs, it then keeps it).
    cudaStream_t current = nullptr;
    check_blas(cublasGetStream(blas_, &current), "cublasGetStream");
    if (current != stream_) check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    // cuBLAS keeps at most the workspace its kernels were warmed with (kWarmBlasCap): a larger one may
    // pick other kernels, which would load inside an encode's arena. The rest holds the split rows.
    const uint64_t w = std::min(cuda_blas_workspace_bytes(bytes), kWarmBlasCap);
    check_blas(cublasSetWorkspace(blas_, w ? dev : nullptr, w), "cublasSetWorkspace");
    ws_ = dev ? dev + w : nullptr;
    ws_bytes_ = bytes - w;
    ws_set_ = true;
  }

  void linear(const DevMat& w, const float* bias, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
              bool accumulate) override {
    SW_CHECK(n >= 0, "CUDA vision linear: ", n, " tokens");
    SW_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
             "CUDA vision linear: weights of ", dtype_name(w.dtype), " (f32, f16 or bf16)");
    SW_CHECK(w.rows > 0 && w.cols > 0 && ldx >= w.cols && ldy >= w.rows, "CUDA vision linear: a ", w.rows, " x ",
             w.cols, " matrix with rows of x ", ldx, " and of y ", ldy, " floats apart");
    if (n == 0) return;
    SW_CHECK(w.data != nullptr && x != nullptr && y != nullptr, "CUDA vision linear: a null matrix or vector");
    SW_CHECK(ws_set_, "CUDA vision kernels: no workspace was set (call set_workspace first)");
    cuda_matmul(w, x, ldx, n, y, ldy, accumulate, ws_, ws_bytes_, stream_, blas_);
    if (bias == nullptr) return;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(w.rows, kThreads), 64)),
                    static_cast<unsigned>(std::min<int64_t>(n, 65535)));
    launch_kernel("vision bias kernel", bias_add_kernel, grid, dim3(kThreads), 0, stream_, y, ldy, bias, w.rows, n);
  }

  void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim) override {
    cuda_rms_norm(x, w, eps, y, n, dim, stream_);
  }

  void rotary(float* qkv, const float* cos, const float* sin, int64_t n, int64_t n_heads, int64_t head_dim) override {
    SW_CHECK(n >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "CUDA vision rotary: ", n, " rows of ",
             n_heads, " heads of ", head_dim, " (an even head_dim)");
    if (n == 0) return;
    SW_CHECK(qkv != nullptr && cos != nullptr && sin != nullptr, "CUDA vision rotary: a null buffer");
    const int64_t half = head_dim / 2, pairs = n * 2 * n_heads * half;
    launch_kernel("vision rotary kernel", vision_rotary_kernel, dim3(stride_blocks(pairs)), dim3(kThreads), 0, stream_,
                  qkv, cos, sin, pairs, 2 * n_heads, half, 3 * n_heads * head_dim);
  }

  void attention(const float* qkv, float* out, const int32_t* cu_seqlens, int64_t n_segments, int64_t max_len,
                 int64_t n_heads, int64_t head_dim) override {
    SW_CHECK(head_dim >= 4 && head_dim <= kVisionMaxHeadDim && head_dim % 4 == 0, "CUDA vision attention: head_dim ",
             head_dim, " (a multiple of 4, at most ", kVisionMaxHeadDim, ")");
    SW_CHECK(n_heads > 0 && n_heads <= 65535, "CUDA vision attention: ", n_heads, " heads (1 .. 65535)");
    SW_CHECK(n_segments >= 0 && n_segments < (int64_t(1) << 31) && max_len >= 0 && max_len < (int64_t(1) << 31),
             "CUDA vision attention: ", n_segments, " segments of up to ", max_len, " rows");
    const int64_t tiles = ceil_div(max_len, kAttnRows);
    SW_CHECK(tiles <= 65535, "CUDA vision attention: segments of ", max_len, " rows (at most ", 65535 * kAttnRows, ")");
    if (n_segments == 0 || max_len == 0) return;
    SW_CHECK(qkv != nullptr && out != nullptr && cu_seqlens != nullptr, "CUDA vision attention: a null buffer");
    VisionAttnArgs a;
    a.qkv = qkv;
    a.out = out;
    a.cu_seqlens = cu_seqlens;
    a.ld = 3 * n_heads * head_dim;
    a.ld_out = n_heads * head_dim;
    a.n_heads = static_cast<int32_t>(n_heads);
    a.hd = static_cast<int32_t>(head_dim);
    a.q_scale = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim)));
    a.vec4 = aligned16(qkv);
    const dim3 grid(static_cast<unsigned>(n_segments), static_cast<unsigned>(tiles), static_cast<unsigned>(n_heads));
    switch (padded_head_dim(head_dim)) {
      case 32:
        return launch_attention<32>(a, grid, stream_);
      case 64:
        return launch_attention<64>(a, grid, stream_);
      case 80:
        return launch_attention<80>(a, grid, stream_);
      case 96:
        return launch_attention<96>(a, grid, stream_);
      default:
        return launch_attention<128>(a, grid, stream_);
    }
  }

  void activation(VisionAct act, float* gate, const float* up, int64_t count) override {
    SW_CHECK(count >= 0, "CUDA vision activation: ", count, " values");
    if (count == 0) return;
    SW_CHECK(gate != nullptr, "CUDA vision activation: a null buffer");
    switch (act) {
      case VisionAct::Silu:
        return launch_act<VisionAct::Silu>(gate, up, count, stream_);
      case VisionAct::Gelu:
        return launch_act<VisionAct::Gelu>(gate, up, count, stream_);
      case VisionAct::GeluTanh:
        return launch_act<VisionAct::GeluTanh>(gate, up, count, stream_);
      case VisionAct::QuickGelu:
        return launch_act<VisionAct::QuickGelu>(gate, up, count, stream_);
    }
    fail("CUDA vision activation: unknown activation ", static_cast<int>(act));
  }

  void permute_rows(const float* src, const int32_t* index, float* dst, int64_t rows, int64_t width,
                    bool scatter) override {
    SW_CHECK(rows >= 0 && rows < (int64_t(1) << 31) && width >= 0, "CUDA vision permute_rows: ", rows, " rows of ",
             width);
    if (rows == 0 || width == 0) return;
    SW_CHECK(src != nullptr && index != nullptr && dst != nullptr, "CUDA vision permute_rows: a null buffer");
    SW_CHECK(src != dst, "CUDA vision permute_rows: in place (dst must not be src)");
    const bool vec4 = width % 4 == 0 && aligned16(src) && aligned16(dst);
    launch_kernel("vision permute kernel", permute_rows_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0,
                  stream_, src, index, dst, width, scatter, vec4);
  }

  // cuda_vision_warm_up's body (it catches what this throws).
  void warm_up(int64_t head_dim);

 private:
  cudaStream_t stream_;
  cublasHandle_t blas_;
  uint8_t* ws_ = nullptr;
  uint64_t ws_bytes_ = 0;
  bool ws_set_ = false;
};

// ---- warm-up --------------------------------------------------------------------------------------------
// Shapes of the warm-up: matrices of kWarmRows x kWarmCols (any dtype reads the same zeroed pool), up to
// kWarmTokens tokens; attention over segments {0, 100, 130} (two query tiles and key tiles, an uneven end)
// of kWarmHeads heads. Everything computes on zeros, which stay finite.
constexpr int64_t kWarmRows = 256, kWarmCols = 256, kWarmTokens = 128, kWarmHeads = 2, kWarmAttnRows = 130;
// Token counts of the GEMMs past kWarmTokens: an encode runs its layers over thousands of patches at once
// (a 1440p image: 18K; MLP pieces of up to 4096), for which cuBLAS picks other, larger-tile kernels; each
// loads at its first launch and must not do so inside an encode's arena.
constexpr int64_t kWarmGemmTokens[] = {160, 256, 512, 1024, 2048, 4096, 8192, 16384};
constexpr int64_t kWarmMaxGemmTokens = 16384;
// Workspace regions the linear sweep runs with: 32 MiB takes the largest GEMMs above in one piece, as a
// plan's workspace does; cuBLAS gets 2 MiB of 32 and 8 MiB (kWarmBlasCap) and 256 KiB of 1 MiB, and picks
// its kernels by its workspace too.
constexpr uint64_t kWarmRegions[] = {32ull << 20, 8ull << 20, 1ull << 20};

void CudaVisionKernels::warm_up(int64_t head_dim) {
  SW_CHECK(head_dim >= 4 && head_dim <= kVisionMaxHeadDim && head_dim % 4 == 0, "vision warm-up: head_dim ", head_dim,
           " (a multiple of 4, at most ", kVisionMaxHeadDim, ")");
  const uint64_t f = sizeof(float);
  const uint64_t qkv_floats = static_cast<uint64_t>(kWarmAttnRows * 3 * kWarmHeads * head_dim);
  const uint64_t act_floats = static_cast<uint64_t>(kWarmTokens * kWarmCols);
  const uint64_t gemm_floats = static_cast<uint64_t>(kWarmMaxGemmTokens * std::max(kWarmRows, kWarmCols));
  uint64_t total = 0;
  auto carve = [&total](uint64_t bytes) {
    const uint64_t off = total;
    total += align_up(bytes + 16);  // + 16: room for the misaligned variants
    return off;
  };
  const uint64_t o_ws = carve(kWarmRegions[0]);
  const uint64_t o_w = carve(static_cast<uint64_t>(kWarmRows * kWarmCols) * f);
  const uint64_t o_x = carve(gemm_floats * f);
  const uint64_t o_y = carve(gemm_floats * f);
  const uint64_t o_vec = carve(static_cast<uint64_t>(std::max(kWarmRows, kWarmCols)) * f);
  const uint64_t o_qkv = carve(qkv_floats * f);
  const uint64_t o_out = carve(qkv_floats * f);
  const uint64_t o_idx = carve(static_cast<uint64_t>(kWarmTokens) * sizeof(int32_t));
  const uint64_t o_cu = carve(3 * sizeof(int32_t));

  uint8_t* base = nullptr;
  check(cudaMalloc(&base, total), "cudaMalloc(vision warm-up)");
  struct Release {  // nothing may still use the buffer, and cuBLAS must not keep a pointer into it
    CudaVisionKernels* k;
    uint8_t* base;
    ~Release() {
      cudaStreamSynchronize(k->stream_);
      cublasSetWorkspace(k->blas_, nullptr, 0);
      cudaFree(base);
      k->ws_ = nullptr;
      k->ws_bytes_ = 0;
      k->ws_set_ = false;
    }
  } release{this, base};
  check(cudaMemsetAsync(base, 0, total, stream_), "cudaMemsetAsync(vision warm-up)");
  // The index tables: the identity permutation and the segment offsets, copied in order on the stream
  // (the host vectors outlive the synchronization at the end).
  std::vector<int32_t> identity(static_cast<size_t>(kWarmTokens));
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int32_t>(i);
  const std::vector<int32_t> cu = {0, 100, static_cast<int32_t>(kWarmAttnRows)};
  auto* idx = reinterpret_cast<int32_t*>(base + o_idx);
  auto* cu_dev = reinterpret_cast<int32_t*>(base + o_cu);
  check(cudaMemcpyAsync(idx, identity.data(), identity.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(vision warm-up)");
  check(cudaMemcpyAsync(cu_dev, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(vision warm-up)");
  float* x = reinterpret_cast<float*>(base + o_x);
  float* y = reinterpret_cast<float*>(base + o_y);
  float* vec = reinterpret_cast<float*>(base + o_vec);
  float* qkv = reinterpret_cast<float*>(base + o_qkv);
  float* out = reinterpret_cast<float*>(base + o_out);

  // linear: every weight dtype, the GEMV token buckets (1, 2, 3-4, 5-8) with aligned rows and the generic GEMV
  // (x off by one float), and GEMMs of a few token counts, under both cuBLAS workspaces; with a bias.
  for (uint64_t region : kWarmRegions) {
    set_workspace(base + o_ws, region);
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      const DevMat w{t, kWarmRows, kWarmCols, base + o_w};
      for (int64_t n : {1, 2, 3, 5, 9, 17, 33, 64, 128}) linear(w, vec, x, kWarmCols, n, y, kWarmRows, false);
      for (int64_t n : kWarmGemmTokens) linear(w, vec, x, kWarmCols, n, y, kWarmRows, false);
      linear(w, nullptr, x + 1, kWarmCols, 1, y, kWarmRows, true);
    }
  }
  rms_norm(x, vec, 1e-6f, y, kWarmTokens, kWarmCols);
  rms_norm(x + 1, vec, 1e-6f, y + 1, 3, kWarmCols - 2);  // rows not 16-byte aligned: the general loop
  // rotary and attention with the model's head_dim; attention also with qkv not 16-byte aligned.
  rotary(qkv, x, x, kWarmAttnRows, kWarmHeads, head_dim);  // x holds the 130 x 64 angle table
  attention(qkv, out, cu_dev, 2, 100, kWarmHeads, head_dim);
  attention(qkv + 1, out, cu_dev, 2, 100, kWarmHeads, head_dim);
  for (VisionAct a : {VisionAct::Silu, VisionAct::Gelu, VisionAct::GeluTanh, VisionAct::QuickGelu}) {
    activation(a, x, y, act_floats);
    activation(a, x, nullptr, act_floats);
  }
  for (bool scatter : {false, true}) {
    permute_rows(x, idx, y, kWarmTokens, kWarmCols, scatter);
    permute_rows(x, idx, y, kWarmTokens, kWarmCols - 1, scatter);  // rows not in float4 pieces
  }
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(vision warm-up)");
  check(cudaGetLastError(), "a vision warm-up kernel");
}

}  // namespace
}  // namespace cuda

std::unique_ptr<VisionKernels> make_cuda_vision_kernels(cudaStream_t compute, cublasHandle_t blas) {
  return std::make_unique<cuda::CudaVisionKernels>(compute, blas);
}

std::string cuda_vision_warm_up(VisionKernels& k, int64_t head_dim) {
  auto* v = dynamic_cast<cuda::CudaVisionKernels*>(&k);
  if (v == nullptr) return "not the CUDA vision kernels of make_cuda_vision_kernels";
  try {
    v->warm_up(head_dim);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace shardwise

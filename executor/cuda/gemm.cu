// executor/cuda/gemm.cu — the matmul dispatcher (see kernels.cuh): GEMV for decode-sized steps, and
// for prefill exact GEMMs through cuBLAS. Exact means no activation is rounded to 16 bits and no
// TF32: f16 weights multiply a two-part f16 split of x (x*s = hi + lo/2^12, s a power of two chosen
// on the device from max|x|, so neither part overflows or drowns in subnormals; the split error is
// ~2^-22 relative, the products are exact and summed in f32), bf16 weights a three-part bf16 split
// (bf16 has f32's range, so no scaling), f32 weights plain SGEMM, q8_0/q4_0 and the K-quants the
// tensor-core kernel of quant_gemm.cu over a per-row f16 split of x. Scales reach cuBLAS as device-side alphas, so
// nothing here waits for the GPU.
#include <algorithm>
#include <vector>

#include "executor/cuda/kernels.cuh"

namespace shardwise {
namespace cuda {
namespace {

constexpr float kLoScale = 4096.0f;  // 2^12: the f16 low part is stored scaled up

__global__ void absmax_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, unsigned* out) {
  const float* row = x + static_cast<int64_t>(blockIdx.y) * ldx;
  // |x| as bits: non-negative floats order as their bit patterns, and NaN sorts above inf.
  unsigned bits = 0;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bits = max(bits, __float_as_uint(row[c]) & 0x7fffffffu);
  __shared__ unsigned s[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned b = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) b = max(b, s[i]);
    atomicMax(out, b);
  }
}

// s = 2^(15 - e) with max|x| < 2^e, so |x * s| < 2^15 (f16 holds up to 65504).
__device__ __forceinline__ float split_scale(unsigned maxbits) {
  const float m = __uint_as_float(maxbits);
  if (!(m > 0.0f) || isinf(m) || isnan(m)) return 1.0f;
  int e = 0;
  frexpf(m, &e);
  return ldexpf(1.0f, min(max(15 - e, -100), 100));
}

__global__ void split_f16_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, const unsigned* maxbits,
                                 __half* hi, __half* lo, int64_t ldh, float* alphas) {
  const float s = split_scale(*maxbits);
  const int64_t t = blockIdx.y;
  if (t == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    alphas[0] = 1.0f / s;  // exact: s is a power of two
    alphas[1] = 1.0f / (s * kLoScale);
  }
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[t * ldx + c] * s;
    const __half h = __float2half_rn(v);
    const float r = v - __half2float(h);  // exact
    hi[t * ldh + c] = h;
    lo[t * ldh + c] = __float2half_rn(r * kLoScale);
  }
}

__global__ void split_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, __nv_bfloat16* p0,
                                  __nv_bfloat16* p1, __nv_bfloat16* p2, int64_t ldp) {
  const int64_t t = blockIdx.y;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[t * ldx + c];
    const __nv_bfloat16 a = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(a);  // exact
    const __nv_bfloat16 b = __float2bfloat16_rn(r1);
    const float r2 = r1 - __bfloat162float(b);  // exact
    p0[t * ldp + c] = a;
    p1[t * ldp + c] = b;
    p2[t * ldp + c] = __float2bfloat16_rn(r2);
  }
}

dim3 row_grid(int64_t rows, int64_t cols, int threads) {
  const int64_t bx = std::min<int64_t>(ceil_div(cols, threads), 64);
  SW_CHECK(rows < 65536, "CUDA matmul: row chunk of ", rows, " is too large for one launch");
  return dim3(static_cast<unsigned>(std::max<int64_t>(bx, 1)), static_cast<unsigned>(rows));
}

// Prepares the shared handle for our calls: our stream, device-side scalars, no TF32, no reduced
// precision in split-K reductions.
void blas_begin(const Ctx& ctx) {
  // cublasSetStream resets the handle's workspace to cuBLAS's own pool (a 32 MiB allocation outside
  // the arena): only set it when it differs (the device sets it once).
  cudaStream_t current = nullptr;
  check_blas(cublasGetStream(ctx.blas, &current), "cublasGetStream");
  if (current != ctx.stream) check_blas(cublasSetStream(ctx.blas, ctx.stream), "cublasSetStream");
  check_blas(cublasSetPointerMode(ctx.blas, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
  check_blas(cublasSetMathMode(ctx.blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
             "cublasSetMathMode");
}
void blas_end(const Ctx& ctx) {
  check_blas(cublasSetPointerMode(ctx.blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
}

// C[n, m] (ldc) = alpha * B[n, k] . A[m, k]^T + beta * C, row-major terms; A rows are k long.
void gemm_tn(const Ctx& ctx, int64_t m, int64_t n, int64_t k, const float* alpha, const void* a, cudaDataType at,
             int64_t lda, const void* b, cudaDataType bt, int64_t ldb, const float* beta, float* c, int64_t ldc) {
  SW_CHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31) && k < (int64_t(1) << 31) && lda < (int64_t(1) << 31) &&
               ldb < (int64_t(1) << 31) && ldc < (int64_t(1) << 31),
           "CUDA matmul: dimensions exceed cuBLAS's 32-bit range");
  check_blas(cublasGemmEx(ctx.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                          static_cast<int>(k), alpha, a, at, static_cast<int>(lda), b, bt, static_cast<int>(ldb), beta,
                          c, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

void gemv_passes(const Ctx& ctx, const MatRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                 bool accumulate) {
  std::vector<GemvTask> tasks;
  for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxTokens) {
    GemvTask t;
    t.w0 = w.data;
    t.x = x + t0 * ldx;
    t.y = y + t0 * ldy;
    t.ldx = ldx;
    t.ldy = ldy;
    t.rows = static_cast<int32_t>(w.rows);
    t.cols = static_cast<int32_t>(w.cols);
    t.nt = static_cast<int32_t>(std::min<int64_t>(kGemvMaxTokens, n - t0));
    tasks.push_back(t);
  }
  gemv(ctx, w.dtype, accumulate ? GemvMode::Accumulate : GemvMode::Store, tasks.data(), static_cast<int>(tasks.size()));
}

}  // namespace

uint64_t matmul_bytes_per_token(DType dtype, int64_t cols) {
  const uint64_t ld = align_up(static_cast<uint64_t>(cols), 8);
  switch (dtype) {
    case DType::F16:
    case DType::Q8_0:
    case DType::Q4_0:  // hi and lo (f16) and the row's scale
      return 2 * ld * 2 + 512;
    case DType::BF16:
      return 3 * ld * 2 + 768;
    default:  // quant_gemm's other types as q8_0/q4_0; none for the GEMV passes of the rest
      return quant_gemm_computes(dtype) ? 2 * ld * 2 + 512 : 0;
  }
}

uint64_t matmul_fixed_bytes(DType, int64_t, int64_t) {
  return 1024;
}

namespace {

// f16/bf16 weights: the activations split into f16 (hi + lo, scaled by their absolute maximum) or bf16
// (three parts) pieces, one cuBLAS GEMM per piece, in chunks of tokens the workspace holds; GEMV passes
// where fewer than 9 tokens fit.
void matmul_split(const Ctx& ctx, const MatRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                  bool accumulate, WorkspaceScope& scope) {
  Workspace& ws = *ctx.ws;
  const float* zero = ctx.dev_zero_one;
  const float* one = ctx.dev_zero_one + 1;
  const int64_t K = w.cols;
  const bool f16 = w.dtype == DType::F16;
  const int64_t ldp = static_cast<int64_t>(align_up(static_cast<uint64_t>(K), 8));
  float* scalars = ws.take<float>(4, "matmul scalars");  // [0] max bits, [1..2] alphas
  const uint64_t avail = ws.available();
  const uint64_t per_token = (f16 ? 2 : 3) * static_cast<uint64_t>(ldp) * 2 + 512;
  int64_t chunk = std::min<int64_t>(n, static_cast<int64_t>(avail / per_token));
  if (chunk <= kGemvMaxTokens) {  // no room to split: GEMV passes need no workspace
    ws.release(scope.saved);
    gemv_passes(ctx, w, x, ldx, n, y, ldy, accumulate);
    return;
  }
  chunk = std::min<int64_t>(chunk, 65535);
  __half* hi = nullptr;
  __half* lo = nullptr;
  __nv_bfloat16* p[3] = {nullptr, nullptr, nullptr};
  if (f16) {
    hi = ws.take<__half>(static_cast<uint64_t>(chunk * ldp), "f16 split of the activations");
    lo = ws.take<__half>(static_cast<uint64_t>(chunk * ldp), "f16 split of the activations");
  } else {
    for (auto& q : p) q = ws.take<__nv_bfloat16>(static_cast<uint64_t>(chunk * ldp), "bf16 split of the activations");
  }
  unsigned* maxbits = reinterpret_cast<unsigned*>(scalars);
  const float* alphas = scalars + 1;
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    const float* xc = x + t0 * ldx;
    float* yc = y + t0 * ldy;
    const dim3 grid = row_grid(m, K, 256);
    if (f16) {
      check(cudaMemsetAsync(maxbits, 0, sizeof(unsigned), ctx.stream), "cudaMemsetAsync");
      absmax_kernel<<<grid, 256, 0, ctx.stream>>>(xc, ldx, K, maxbits);
      check_launch("absmax kernel");
      split_f16_kernel<<<grid, 256, 0, ctx.stream>>>(xc, ldx, K, maxbits, hi, lo, ldp, scalars + 1);
      check_launch("f16 split kernel");
      blas_begin(ctx);
      gemm_tn(ctx, w.rows, m, K, alphas, w.data, CUDA_R_16F, K, hi, CUDA_R_16F, ldp, accumulate ? one : zero, yc, ldy);
      gemm_tn(ctx, w.rows, m, K, alphas + 1, w.data, CUDA_R_16F, K, lo, CUDA_R_16F, ldp, one, yc, ldy);
      blas_end(ctx);
    } else {
      split_bf16_kernel<<<grid, 256, 0, ctx.stream>>>(xc, ldx, K, p[0], p[1], p[2], ldp);
      check_launch("bf16 split kernel");
      blas_begin(ctx);
      gemm_tn(ctx, w.rows, m, K, one, w.data, CUDA_R_16BF, K, p[0], CUDA_R_16BF, ldp, accumulate ? one : zero, yc, ldy);
      gemm_tn(ctx, w.rows, m, K, one, w.data, CUDA_R_16BF, K, p[1], CUDA_R_16BF, ldp, one, yc, ldy);
      gemm_tn(ctx, w.rows, m, K, one, w.data, CUDA_R_16BF, K, p[2], CUDA_R_16BF, ldp, one, yc, ldy);
      blas_end(ctx);
    }
  }
}

// Weights of the types quant_gemm computes: x split per row (hi + lo f16, in chunks of tokens the workspace holds) and
// the tensor-core kernel; GEMV passes where fewer than 9 tokens fit.
void matmul_quant(const Ctx& ctx, const MatRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                  bool accumulate) {
  Workspace& ws = *ctx.ws;
  const int64_t K = w.cols;
  const uint64_t avail = ws.available();
  const uint64_t per_token = matmul_bytes_per_token(w.dtype, K);
  int64_t chunk = std::min<int64_t>(n, avail > 1024 ? static_cast<int64_t>((avail - 1024) / per_token) : 0);
  if (chunk <= kGemvMaxTokens) {
    gemv_passes(ctx, w, x, ldx, n, y, ldy, accumulate);
    return;
  }
  chunk = std::min<int64_t>(chunk, 65535);
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    WorkspaceScope scope(ws);
    const int64_t m = std::min(chunk, n - t0);
    const SplitRows xs = split_rows(ctx, x + t0 * ldx, ldx, m, K);
    QuantGemmTask t;
    t.w = w.data;
    t.y = y + t0 * ldy;
    t.ldy = ldy;
    t.rows = static_cast<int32_t>(w.rows);
    t.m = static_cast<int32_t>(m);
    quant_gemm(ctx, w.dtype, xs, K, &t, 1, accumulate);
  }
}

}  // namespace

void matmul(const Ctx& ctx, const MatRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            bool accumulate) {
  if (n <= 0 || w.rows <= 0) return;
  SW_CHECK(w.data != nullptr && x != nullptr && y != nullptr, "CUDA matmul: a null matrix or vector");
  SW_CHECK(w.cols > 0 && w.cols % dtype_block_elems(w.dtype) == 0 && w.rows < (int64_t(1) << 31) &&
               w.cols < (int64_t(1) << 31),
           "CUDA matmul: bad weight shape ", w.rows, " x ", w.cols, " for ", dtype_name(w.dtype));
  if (n <= kGemvMaxTokens) {
    gemv_passes(ctx, w, x, ldx, n, y, ldy, accumulate);
    return;
  }
  WorkspaceScope scope(*ctx.ws);
  switch (w.dtype) {
    case DType::F32: {
      const float* zero = ctx.dev_zero_one;
      const float* one = ctx.dev_zero_one + 1;
      blas_begin(ctx);
      gemm_tn(ctx, w.rows, n, w.cols, one, w.data, CUDA_R_32F, w.cols, x, CUDA_R_32F, ldx, accumulate ? one : zero, y,
              ldy);
      blas_end(ctx);
      return;
    }
    case DType::F16:
    case DType::BF16:
      matmul_split(ctx, w, x, ldx, n, y, ldy, accumulate, scope);
      return;
    default:  // quant_gemm's types; the others (q4_1, q5_0, q5_1, iq4_nl) GEMV passes
      if (quant_gemm_computes(w.dtype))
        matmul_quant(ctx, w, x, ldx, n, y, ldy, accumulate);
      else
        gemv_passes(ctx, w, x, ldx, n, y, ldy, accumulate);
      return;
  }
}

}  // namespace cuda
}  // namespace shardwise

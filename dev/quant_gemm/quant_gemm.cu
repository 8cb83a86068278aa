// dev/quant_gemm/quant_gemm.cu — lab: should prefill GEMMs of q8_0/q4_0 weights run through tensor cores?
//
// Two exact ways to compute y[t, r] = sum_c W[r, c] x[t, c] for a quantised W and f32 x (no rounding of
// x beyond ~2^-22, f32 accumulation):
//   f32    (what the product does) tiles of W dequantised to f32, one SGEMM per tile (no TF32)
//   f16x3  tiles of W and the activations each split into two f16 parts, w s = hi + lo / 2^12 (s a power
//          of two that brings the tile's largest weight to just below 2^15, so neither part overflows),
//          x s_x likewise, then three f16 GEMMs with f32 accumulation (hi.hi, lo.hi, hi.lo; lo.lo is
//          below 2^-22 of the product)
// Check, then time: each way against double dot products of the dequantised weights, every output of
// small odd shapes and block scales from 2e-5 to 3e4 (the f16 split must scale them into its range),
// then a sample of outputs of the timed shape; then the time of each way on the timed shape.
//
// Build: nvcc -O2 -std=c++17 -arch=sm_90 -o quant_gemm dev/quant_gemm/quant_gemm.cu -lcublas
// Usage: quant_gemm [ROWS COLS TOKENS]   (default 11520 4096 512: nemo8b's gate/up at a 512-token step)
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

enum class Q { Q8_0, Q4_0 };
const char* q_name(Q q) {
  return q == Q::Q8_0 ? "q8_0" : "q4_0";
}
int64_t block_bytes(Q q) {
  return q == Q::Q8_0 ? 34 : 18;
}  // per 32 weights: f16 scale, then codes
int64_t row_bytes(Q q, int64_t cols) {
  return cols / 32 * block_bytes(q);
}

constexpr int64_t kMaxTileRows = 8192;  // as the product's dequantised tiles
constexpr float kLoScale = 4096.0f;     // 2^12: the f16 low parts are stored scaled up
constexpr double kTol = 1e-5;           // |got - ref| / sum |terms|, as the GPU suite's matmul cases

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}
void blas_ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS %s: %s\n", what, cublasGetStatusString(s));
    std::exit(2);
  }
}

// ---- host: weights and reference ------------------------------------------------------------------

float half_bits_to_float(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}
uint16_t float_to_half_bits(float f) {
  return __half_raw(__float2half_rn(f)).x;
}

// Random codes and block scales of about `scale` / 127 (as quantising weights of magnitude `scale` gives).
std::vector<uint8_t> random_weights(Q q, int64_t rows, int64_t cols, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  std::vector<uint8_t> w(static_cast<size_t>(rows * row_bytes(q, cols)));
  for (size_t b = 0; b < w.size(); b += static_cast<size_t>(block_bytes(q))) {
    const uint16_t d = float_to_half_bits((rng() & 1 ? -1.0f : 1.0f) * scale * u(rng) / 127.0f);
    std::memcpy(&w[b], &d, 2);
    for (int64_t i = 2; i < block_bytes(q); ++i) w[b + static_cast<size_t>(i)] = static_cast<uint8_t>(rng());
  }
  return w;
}

float dequant_host(Q q, const uint8_t* row, int64_t c) {
  const uint8_t* blk = row + c / 32 * block_bytes(q);
  uint16_t d;
  std::memcpy(&d, blk, 2);
  const int j = static_cast<int>(c % 32);
  if (q == Q::Q8_0) return half_bits_to_float(d) * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  const int code = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
  return half_bits_to_float(d) * static_cast<float>(code - 8);
}

// Worst |got - ref| / sum_c |W[r, c] x[t, c]| over the outputs (t, r) given, in double, W dequantised
// (deq: rows x cols); NaN counts as inf.
double worst_error(const std::vector<float>& deq, int64_t cols, const std::vector<float>& x, int64_t rows,
                   const std::vector<float>& y, const std::vector<std::pair<int64_t, int64_t>>& outputs) {
  double worst = 0;
  for (const auto& [t, r] : outputs) {
    double acc = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double term =
          static_cast<double>(deq[static_cast<size_t>(r * cols + c)]) * x[static_cast<size_t>(t * cols + c)];
      acc += term;
      mag += std::fabs(term);
    }
    const double got = y[static_cast<size_t>(t * rows + r)];
    if (std::isnan(got)) return INFINITY;
    const double d = std::fabs(got - acc);
    if (d > 0) worst = std::max(worst, mag > 0 ? d / mag : INFINITY);
  }
  return worst;
}

// ---- device kernels -------------------------------------------------------------------------------

__device__ __forceinline__ float ld_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
template <Q T>
__device__ __forceinline__ float load_weight(const uint8_t* row, int64_t c) {
  const uint8_t* blk = row + (c / 32) * (T == Q::Q8_0 ? 34 : 18);
  const int j = static_cast<int>(c % 32);
  if constexpr (T == Q::Q8_0) return ld_half(blk) * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  const int code = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
  return ld_half(blk) * static_cast<float>(code - 8);
}

// Rows [0, gridDim.y) of a quantised matrix as f32.
template <Q T>
__global__ void dequant_rows_kernel(const uint8_t* __restrict__ w, int64_t rb, int64_t cols, float* out) {
  const int64_t r = blockIdx.y;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[r * cols + c] = load_weight<T>(w + r * rb, c);
}

// max |x| over rows [0, gridDim.y) as float bits (non-negative floats order as their bits).
__global__ void absmax_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, unsigned* out) {
  const float* row = x + static_cast<int64_t>(blockIdx.y) * ldx;
  unsigned bits = 0;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bits = max(bits, __float_as_uint(row[c]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0) atomicMax(out, bits);
}

// 2^(15 - e) with m < 2^e: |v * s| < 2^15 for |v| <= m (f16 holds up to 65504).
__device__ __forceinline__ float pow2_scale(float m) {
  if (!(m > 0.0f) || isinf(m) || isnan(m)) return 1.0f;
  int e = 0;
  frexpf(m, &e);
  return ldexpf(1.0f, min(max(15 - e, -100), 100));
}

// x s = hi + lo / 2^12 per element; alphas[0] = 1 / s, alphas[1] = 1 / (s 2^12).
__global__ void split_x_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, const unsigned* maxbits,
                               __half* hi, __half* lo, int64_t ldh, float* alphas) {
  const float s = pow2_scale(__uint_as_float(*maxbits));
  const int64_t t = blockIdx.y;
  if (t == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    alphas[0] = 1.0f / s;
    alphas[1] = 1.0f / (s * kLoScale);
  }
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[t * ldx + c] * s;
    const __half h = __float2half_rn(v);
    hi[t * ldh + c] = h;
    lo[t * ldh + c] = __float2half_rn((v - __half2float(h)) * kLoScale);  // exact
  }
}

// Largest |block scale| of rows [0, rows) as float bits: with the largest code it bounds every weight.
template <Q T>
__global__ void scale_absmax_kernel(const uint8_t* __restrict__ w, int64_t rb, int64_t blocks_per_row, int64_t rows,
                                    unsigned* out) {
  constexpr int64_t kBlock = T == Q::Q8_0 ? 34 : 18;
  unsigned bits = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * blocks_per_row;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bits = max(bits, __float_as_uint(fabsf(ld_half(w + (i / blocks_per_row) * rb + (i % blocks_per_row) * kBlock))));
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0) atomicMax(out, bits);
}

// A tile's rows as w s = hi + lo / 2^12 (scale x code has at most 18 significant bits: hi keeps 11, lo the
// rest, exactly except below f16's normal range, 2^-29 of the tile's largest weight); the tile's GEMM
// scalars from the activations': alphas_out[i] = alphas_x[i] / s.
template <Q T>
__global__ void split_w_kernel(const uint8_t* __restrict__ w, int64_t rb, int64_t cols, const unsigned* max_scale_bits,
                               float max_code, __half* hi, __half* lo, int64_t ldh, const float* alphas_x,
                               float* alphas_out) {
  const float s = pow2_scale(__uint_as_float(*max_scale_bits) * max_code);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    alphas_out[0] = alphas_x[0] / s;
    alphas_out[1] = alphas_x[1] / s;
  }
  const int64_t r = blockIdx.y;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = load_weight<T>(w + r * rb, c) * s;  // exact
    const __half h = __float2half_rn(v);
    hi[r * ldh + c] = h;
    lo[r * ldh + c] = __float2half_rn((v - __half2float(h)) * kLoScale);
  }
}

// ---- the two ways ---------------------------------------------------------------------------------

dim3 row_grid(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((cols + 255) / 256, 64))),
              static_cast<unsigned>(rows));
}

// C[n, m] (ldc) = alpha B[n, k] . A[m, k]^T + beta C, row-major terms, scalars in device memory.
void gemm_tn(cublasHandle_t h, int64_t m, int64_t n, int64_t k, const float* alpha, const void* a, cudaDataType at,
             int64_t lda, const void* b, cudaDataType bt, int64_t ldb, const float* beta, float* c, int64_t ldc) {
  blas_ok(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                       alpha, a, at, static_cast<int>(lda), b, bt, static_cast<int>(ldb), beta, c, CUDA_R_32F,
                       static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
}

// Device buffers for both ways at one shape (the largest tile and all tokens at once).
struct Work {
  int64_t rows = 0, cols = 0, n = 0, tile = 0, ldp = 0;
  float* deq = nullptr;                 // f32: [tile, cols]
  __half *xh = nullptr, *xl = nullptr;  // f16x3: [n, ldp] each
  __half *wh = nullptr, *wl = nullptr;  // f16x3: [tile, ldp] each
  float* scalars = nullptr;  // [0] x max bits, [1..2] x alphas, [3] scale max bits, [4..5] tile alphas, [6] 0, [7] 1
  Work(int64_t r, int64_t c, int64_t tokens) : rows(r), cols(c), n(tokens) {
    tile = std::min(rows, kMaxTileRows);
    ldp = (cols + 7) / 8 * 8;
    cuda_ok(cudaMalloc(&deq, static_cast<size_t>(tile * cols) * 4), "cudaMalloc");
    cuda_ok(cudaMalloc(&xh, static_cast<size_t>(n * ldp) * 2), "cudaMalloc");
    cuda_ok(cudaMalloc(&xl, static_cast<size_t>(n * ldp) * 2), "cudaMalloc");
    cuda_ok(cudaMalloc(&wh, static_cast<size_t>(tile * ldp) * 2), "cudaMalloc");
    cuda_ok(cudaMalloc(&wl, static_cast<size_t>(tile * ldp) * 2), "cudaMalloc");
    cuda_ok(cudaMalloc(&scalars, 8 * 4), "cudaMalloc");
    const float zero_one[2] = {0.0f, 1.0f};
    cuda_ok(cudaMemcpy(scalars + 6, zero_one, 8, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Work() {
    for (void* p : {static_cast<void*>(deq), static_cast<void*>(xh), static_cast<void*>(xl), static_cast<void*>(wh),
                    static_cast<void*>(wl), static_cast<void*>(scalars)})
      cudaFree(p);
  }
};

void run_f32(cublasHandle_t h, Q q, const uint8_t* w, const float* x, float* y, Work& k) {
  const int64_t rb = row_bytes(q, k.cols);
  for (int64_t r0 = 0; r0 < k.rows; r0 += k.tile) {
    const int64_t tr = std::min(k.tile, k.rows - r0);
    if (q == Q::Q8_0)
      dequant_rows_kernel<Q::Q8_0><<<row_grid(tr, k.cols), 256>>>(w + r0 * rb, rb, k.cols, k.deq);
    else
      dequant_rows_kernel<Q::Q4_0><<<row_grid(tr, k.cols), 256>>>(w + r0 * rb, rb, k.cols, k.deq);
    gemm_tn(h, tr, k.n, k.cols, k.scalars + 7, k.deq, CUDA_R_32F, k.cols, x, CUDA_R_32F, k.cols, k.scalars + 6, y + r0,
            k.rows);
  }
}

void run_f16x3(cublasHandle_t h, Q q, const uint8_t* w, const float* x, float* y, Work& k) {
  const int64_t rb = row_bytes(q, k.cols), blocks_per_row = k.cols / 32;
  unsigned* xmax = reinterpret_cast<unsigned*>(k.scalars);
  unsigned* dmax = reinterpret_cast<unsigned*>(k.scalars + 3);
  cuda_ok(cudaMemsetAsync(xmax, 0, 4), "cudaMemsetAsync");
  absmax_kernel<<<row_grid(k.n, k.cols), 256>>>(x, k.cols, k.cols, xmax);
  split_x_kernel<<<row_grid(k.n, k.cols), 256>>>(x, k.cols, k.cols, xmax, k.xh, k.xl, k.ldp, k.scalars + 1);
  for (int64_t r0 = 0; r0 < k.rows; r0 += k.tile) {
    const int64_t tr = std::min(k.tile, k.rows - r0);
    const uint8_t* wt = w + r0 * rb;
    const unsigned sblocks = static_cast<unsigned>(std::min<int64_t>(1024, (tr * blocks_per_row + 255) / 256));
    cuda_ok(cudaMemsetAsync(dmax, 0, 4), "cudaMemsetAsync");
    if (q == Q::Q8_0) {
      scale_absmax_kernel<Q::Q8_0><<<sblocks, 256>>>(wt, rb, blocks_per_row, tr, dmax);
      split_w_kernel<Q::Q8_0><<<row_grid(tr, k.cols), 256>>>(wt, rb, k.cols, dmax, 128.0f, k.wh, k.wl, k.ldp,
                                                             k.scalars + 1, k.scalars + 4);
    } else {
      scale_absmax_kernel<Q::Q4_0><<<sblocks, 256>>>(wt, rb, blocks_per_row, tr, dmax);
      split_w_kernel<Q::Q4_0>
          <<<row_grid(tr, k.cols), 256>>>(wt, rb, k.cols, dmax, 8.0f, k.wh, k.wl, k.ldp, k.scalars + 1, k.scalars + 4);
    }
    float* yt = y + r0;
    gemm_tn(h, tr, k.n, k.cols, k.scalars + 4, k.wh, CUDA_R_16F, k.ldp, k.xh, CUDA_R_16F, k.ldp, k.scalars + 6, yt,
            k.rows);
    gemm_tn(h, tr, k.n, k.cols, k.scalars + 5, k.wh, CUDA_R_16F, k.ldp, k.xl, CUDA_R_16F, k.ldp, k.scalars + 7, yt,
            k.rows);
    gemm_tn(h, tr, k.n, k.cols, k.scalars + 5, k.wl, CUDA_R_16F, k.ldp, k.xh, CUDA_R_16F, k.ldp, k.scalars + 7, yt,
            k.rows);
  }
}

using Way = void (*)(cublasHandle_t, Q, const uint8_t*, const float*, float*, Work&);
const struct {
  const char* name;
  Way run;
} kWays[] = {{"f32", run_f32}, {"f16x3", run_f16x3}};

// One shape: uploads, runs each way once and checks the outputs given (all when `outputs` is empty), then
// (iters > 0) times each way. Returns false when a check fails.
bool one_shape(cublasHandle_t h, Q q, int64_t rows, int64_t cols, int64_t n, float scale, int iters, int samples) {
  const std::vector<uint8_t> w = random_weights(q, rows, cols, scale, static_cast<uint32_t>(rows * 31 + cols + n));
  std::mt19937 rng(static_cast<uint32_t>(n * 7 + rows));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = u(rng);
  std::vector<float> deq(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      deq[static_cast<size_t>(r * cols + c)] = dequant_host(q, w.data() + r * row_bytes(q, cols), c);
  std::vector<std::pair<int64_t, int64_t>> outputs;
  if (samples == 0) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) outputs.emplace_back(t, r);
  } else {
    for (int i = 0; i < samples; ++i)
      outputs.emplace_back(static_cast<int64_t>(rng() % n), static_cast<int64_t>(rng() % rows));
  }
  uint8_t* dw = nullptr;
  float *dx = nullptr, *dy = nullptr;
  cuda_ok(cudaMalloc(&dw, w.size()), "cudaMalloc");
  cuda_ok(cudaMalloc(&dx, x.size() * 4), "cudaMalloc");
  cuda_ok(cudaMalloc(&dy, static_cast<size_t>(n * rows) * 4), "cudaMalloc");
  cuda_ok(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  Work k(rows, cols, n);
  bool ok = true;
  for (const auto& way : kWays) {
    cuda_ok(cudaMemset(dy, 0xFF, static_cast<size_t>(n * rows) * 4), "cudaMemset");  // NaN
    way.run(h, q, dw, dx, dy, k);
    std::vector<float> y(static_cast<size_t>(n * rows));
    cuda_ok(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    const double err = worst_error(deq, cols, x, rows, y, outputs);
    const bool pass = err <= kTol;
    ok = ok && pass;
    std::printf("check %-5s %s %5lld x %-5lld x %4lld tokens, scale %-7g: error %.2e %s\n", way.name, q_name(q),
                static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), scale, err,
                pass ? "ok" : "FAILED");
  }
  if (ok && iters > 0) {
    cudaEvent_t a, b;
    cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
    for (const auto& way : kWays) {
      way.run(h, q, dw, dx, dy, k);  // warm-up (cuBLAS's kernel choice, module loading)
      cuda_ok(cudaEventRecord(a), "cudaEventRecord");
      for (int i = 0; i < iters; ++i) way.run(h, q, dw, dx, dy, k);
      cuda_ok(cudaEventRecord(b), "cudaEventRecord");
      cuda_ok(cudaEventSynchronize(b), "cudaEventSynchronize");
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
      ms /= static_cast<float>(iters);
      std::printf("time  %-5s %s %5lld x %-5lld x %4lld tokens: %8.3f ms  %6.1f TFLOP/s\n", way.name, q_name(q),
                  static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), ms,
                  2.0 * static_cast<double>(rows * cols * n) / (ms * 1e-3) / 1e12);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 11520;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 512;
  if (rows < 1 || cols < 32 || cols % 32 != 0 || n < 1 || rows >= 65536 || n >= 65536) {
    std::fprintf(stderr,
                 "usage: quant_gemm [ROWS COLS TOKENS]  (COLS a multiple of 32; ROWS and TOKENS below 65536)\n");
    return 2;
  }
  cublasHandle_t h = nullptr;
  blas_ok(cublasCreate(&h), "cublasCreate");
  blas_ok(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
  // No TF32, no reduced precision in split-K reductions: both ways must stay exact.
  blas_ok(cublasSetMathMode(
              h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
          "cublasSetMathMode");
  bool ok = true;
  struct Shape {
    int64_t rows, cols, n;
  };
  for (Q q : {Q::Q8_0, Q::Q4_0}) {
    for (float scale : {0.5f, 2.0e-5f, 3.0e4f})
      for (const Shape& s : {Shape{37, 96, 33}, Shape{300, 256, 64}, Shape{129, 4096, 40}, Shape{1000, 544, 200}})
        ok = one_shape(h, q, s.rows, s.cols, s.n, scale, 0, 0) && ok;
    ok = one_shape(h, q, rows, cols, n, 0.1f, ok ? 10 : 0, 256) && ok;
  }
  cublasDestroy(h);
  std::printf(ok ? "all checks passed\n" : "a check FAILED: its timings are not printed\n");
  return ok ? 0 : 1;
}

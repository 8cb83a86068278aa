// executor/cpu/matmul.h — multi-threaded Y = X · Wᵀ for weights of any supported dtype.
// Small token counts (decode) use the SIMD GEMV kernels, which stream each weight byte once;
// larger counts dequantise tiles of W to f32 per thread (exact: f16/bf16/q8_0/q4_0 values are
// representable in f32) and multiply them with OpenBLAS sgemm. Accumulation is f32 throughout.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace shardwise {

class ThreadPool;

// Y[t, r] = sum_c W[r, c] * X[t, c] for W {rows, cols} (2-D view), X [n_tokens, cols] (row stride
// ldx), Y [n_tokens, rows] (row stride ldy).
void matmul(const TensorView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
            ThreadPool& pool);

// Same, for a block of rows given by pointer (e.g. one expert of a merged tensor).
void matmul_raw(DType dtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t ldx, int64_t n_tokens,
                float* y, int64_t ldy, ThreadPool& pool);

// Token count from which the GEMM path is used (GEMV below it). Exposed for benchmarks.
int64_t matmul_gemm_threshold();

}  // namespace shardwise

// executor/cpu/matmul.cpp — threading and the GEMM path for matmul.h.
#include "executor/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"

extern "C" void openblas_set_num_threads(int);

namespace shardwise {
namespace {

// Each pool thread calls single-threaded sgemm on its own tile; OpenBLAS must not spawn threads of
// its own on top of ours.
void init_blas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Below this many tokens the GEMV kernels (weights read at their stored precision, several passes
// of kGemvMaxTokens over L2-resident row blocks) beat dequantise-then-sgemm. On the GPU machine's CPU
// at 1 thread, f16 1024x4096: 4 tokens by GEMV 1.04 ms, 8 tokens by sgemm 4.9 ms, 32 tokens 8.7 ms
// (GEMV passes: ~8.3), 64 tokens 12.2 ms (~16.6).
constexpr int64_t kGemmThreshold = 32;
constexpr uint64_t kGemvBlockBytes = 256 << 10;  // weight rows per block for multi-pass GEMV (L2)
constexpr int64_t kMaxTileRows = 64;             // weight rows dequantised per tile (64 x 4096 f32 = 1 MiB)
constexpr int64_t kTileTokens = 1024;            // tokens per sgemm call

thread_local std::vector<float> t_tile;

}  // namespace

int64_t matmul_gemm_threshold() {
  return kGemmThreshold;
}

void matmul_raw(DType dtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t ldx, int64_t n_tokens,
                float* y, int64_t ldy, ThreadPool& pool) {
  if (rows == 0 || n_tokens == 0) return;
  const CpuKernels& k = cpu_kernels();
  const uint64_t row_bytes = dtype_row_bytes(dtype, cols);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (n_tokens < kGemmThreshold) {
    GemvFn gemv = k.gemv[kernel_slot(dtype)];
    // parallel_for cuts about 4 chunks per thread; 16 rows at least keeps the per-chunk cost small.
    const int64_t grain = 16;
    // More tokens than one pass takes: every pass over a block of rows small enough to stay in L2,
    // so that only the first pass reads the block from DRAM.
    const int64_t block =
        n_tokens <= kGemvMaxTokens ? rows : std::max<int64_t>(1, static_cast<int64_t>(kGemvBlockBytes / row_bytes));
    pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int) {
      for (int64_t b0 = r0; b0 < r1; b0 += block) {
        const int64_t b1 = std::min(r1, b0 + block);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemvMaxTokens) {
          const int nt = static_cast<int>(std::min<int64_t>(kGemvMaxTokens, n_tokens - t0));
          gemv(w, row_bytes, cols, b0, b1, x + t0 * ldx, ldx, nt, y + t0 * ldy, ldy);
        }
      }
    });
    return;
  }
  init_blas_once();
  DequantFn deq = k.dequant[kernel_slot(dtype)];
  // At least two tiles per thread (MoE experts have few rows), 16..64 rows each.
  const int64_t per_thread = (rows + 2 * pool.size() - 1) / (2 * pool.size());
  const int64_t tile_rows = std::max<int64_t>(16, std::min<int64_t>(kMaxTileRows, (per_thread + 15) / 16 * 16));
  const int64_t n_tiles = (rows + tile_rows - 1) / tile_rows;
  pool.parallel_for(n_tiles, 1, [&](int64_t tile0, int64_t tile1, int) {
    std::vector<float>& tile = t_tile;
    if (tile.size() < static_cast<size_t>(tile_rows * cols)) tile.resize(static_cast<size_t>(kMaxTileRows * cols));
    for (int64_t ti = tile0; ti < tile1; ++ti) {
      const int64_t r0 = ti * tile_rows, nr = std::min(tile_rows, rows - r0);
      if (dtype == DType::F32) {
        // f32 weights need no conversion: multiply in place.
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
          const int64_t nt = std::min(kTileTokens, n_tokens - t0);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt), static_cast<int>(nr),
                      static_cast<int>(cols), 1.0f, x + t0 * ldx, static_cast<int>(ldx),
                      reinterpret_cast<const float*>(wb + static_cast<uint64_t>(r0) * row_bytes),
                      static_cast<int>(cols), 0.0f, y + t0 * ldy + r0, static_cast<int>(ldy));
        }
        continue;
      }
      for (int64_t r = 0; r < nr; ++r)
        deq(wb + static_cast<uint64_t>(r0 + r) * row_bytes, tile.data() + r * cols, cols);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
        const int64_t nt = std::min(kTileTokens, n_tokens - t0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt), static_cast<int>(nr),
                    static_cast<int>(cols), 1.0f, x + t0 * ldx, static_cast<int>(ldx), tile.data(),
                    static_cast<int>(cols), 0.0f, y + t0 * ldy + r0, static_cast<int>(ldy));
      }
    }
  });
}

void matmul(const TensorView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y, int64_t ldy,
            ThreadPool& pool) {
  SW_CHECK(w.shape.size() == 2, "matmul: weight must be 2-D, got ", shape_str(w.shape));
  matmul_raw(w.dtype, w.data, w.shape[0], w.shape[1], x, ldx, n_tokens, y, ldy, pool);
}

}  // namespace shardwise

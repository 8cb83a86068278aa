// dev/kquant_gemv/bench.cpp — the CPU GEMV of the K-quants against q4_0/q8_0: each kernel of every SIMD
// level is first checked against the reference (dequantize_row, then an f64 dot), then timed (best of 20
// calls) on one thread over a 2048 x 4096 matrix. See README.md for the command and the answer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "executor/cpu/kernels.h"

using namespace shardwise;

int main() {
  const int64_t rows = 2048, cols = 4096;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(cols * 4), y(rows * 4), row(cols);
  for (auto& v : x) v = u(rng);
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const uint64_t rb = dtype_row_bytes(t, cols);
    std::vector<uint8_t> w(rb * rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& v : row) v = u(rng);
      quantize_row(t, row.data(), w.data() + r * rb, cols);
    }
    std::vector<double> ref(rows);  // token 0 through the reference
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t, w.data() + r * rb, row.data(), cols);
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * x[c];
      ref[r] = s;
    }
    for (const CpuKernels* k : {scalar_kernels(), avx2_kernels(), avx512_kernels()}) {
      if (!k || !cpu_kernels_for(k->isa)) continue;
      const GemvFn f = k->gemv[kernel_slot(t)];
      f(w.data(), rb, cols, 0, rows, x.data(), cols, 1, y.data(), rows);
      double worst = 0;
      for (int64_t r = 0; r < rows; ++r) worst = std::max(worst, std::fabs(y[r] - ref[r]) / (1e-3 + std::fabs(ref[r])));
      for (int nt : {1, 4}) {
        double best = 1e9;
        for (int it = 0; it < 20; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          f(w.data(), rb, cols, 0, rows, x.data(), cols, nt, y.data(), rows);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("%-5s %-7s nt %d: %7.3f ms  %5.1f GB/s of weights  (check: max rel err %.1e)\n", dtype_name(t),
                    isa_name(k->isa), nt, best * 1e3, static_cast<double>(rb * rows) / best / 1e9, worst);
      }
    }
  }
}

// dev/kquant_gemv/bench.cpp — the CPU GEMV of the K-quants against q4_0/q8_0: each kernel of every SIMD
// level is first checked against the reference (dequantize_row, then an f64 dot), then timed (best of 20
// calls) on one thread over a 2048 x 4096 matrix. With `--threads N`: instead, the best level's kernel over
// a matrix of ~2 GB (far beyond L3) split by rows among N threads, against a plain read of the same bytes by
// N threads (the DRAM bound), best of 5. See README.md for the commands and the answer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "executor/cpu/kernels.h"

using namespace shardwise;

namespace {

constexpr DType kTypes[] = {DType::Q4_0, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of `reps` runs of fn(i) on n threads, each thread i its own share.
template <class Fn>
double best_parallel(int n, int reps, Fn fn) {
  double best = 1e9;
  for (int it = 0; it < reps; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) ts.emplace_back(fn, i);
    for (auto& t : ts) t.join();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

void check_and_time(const std::vector<float>& x) {
  const int64_t rows = 2048, cols = 4096;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> y(rows * 4), row(cols);
  for (DType t : kTypes) {
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
          best = std::min(best, seconds_since(t0));
        }
        std::printf("%-5s %-7s nt %d: %7.3f ms  %5.1f GB/s of weights  (check: max rel err %.1e)\n", dtype_name(t),
                    isa_name(k->isa), nt, best * 1e3, static_cast<double>(rb * rows) / best / 1e9, worst);
      }
    }
  }
}

// One token through ~2 GB of each type on n threads, next to n threads reading the same bytes.
void dram(int n, const std::vector<float>& x) {
  const int64_t cols = 4096;
  const CpuKernels* k = nullptr;
  for (const CpuKernels* c : {scalar_kernels(), avx2_kernels(), avx512_kernels()})
    if (c && cpu_kernels_for(c->isa)) k = c;
  for (DType t : kTypes) {
    const uint64_t rb = dtype_row_bytes(t, cols);
    const int64_t rows = static_cast<int64_t>((2ull << 30) / rb) / n * n;
    std::vector<uint8_t> w(rb * rows);
    std::mt19937 rng(2);
    for (size_t i = 0; i < w.size(); i += 4096) {  // page by page: distinct pages, valid scales (f16 below 1)
      const uint32_t v = static_cast<uint32_t>(rng()) & 0x37373737u;
      for (size_t j = i; j < std::min(w.size(), i + 4096); j += 4)
        std::memcpy(&w[j], &v, std::min<size_t>(4, w.size() - j));
    }
    std::vector<float> y(rows);
    const GemvFn f = k->gemv[kernel_slot(t)];
    const int64_t share = rows / n;
    const double gemv_s = best_parallel(
        n, 5, [&](int i) { f(w.data(), rb, cols, i * share, (i + 1) * share, x.data(), cols, 1, y.data(), rows); });
    std::vector<uint64_t> sums(n);
    const uint64_t words = w.size() / 8 / n;
    const double read_s = best_parallel(n, 5, [&](int i) {
      const uint64_t* p = reinterpret_cast<const uint64_t*>(w.data()) + i * words;
      uint64_t s = 0;
      for (uint64_t j = 0; j < words; ++j) s += p[j];
      sums[i] = s;
    });
    const double gb = static_cast<double>(w.size()) / 1e9;
    std::printf("%-5s %-7s %2d threads: GEMV %6.1f GB/s, read %6.1f GB/s: %3.0f%% of the read\n", dtype_name(t),
                isa_name(k->isa), n, gb / gemv_s, gb / read_s, 100.0 * read_s / gemv_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(4096 * 4);
  for (auto& v : x) v = u(rng);
  if (argc == 3 && std::strcmp(argv[1], "--threads") == 0)
    dram(std::max(1, std::atoi(argv[2])), x);
  else
    check_and_time(x);
}

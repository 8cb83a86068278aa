// microbench/cpu_kernels_bench.cpp — throughput of the CPU matmul path (executor/cpu) on the shapes of
// the op table's timed models (executor/ops/op_table.h: nemo8b dense, qwen30b MoE): (a) decode GEMV (1
// token) and (b) prefill GEMM (kPrefillTokens) through matmul() with T threads on the dense model's FFN
// shapes, rotating over a weight set larger than L3 so that (a) measures DRAM bandwidth; (c) each
// single-threaded GEMV and dequant kernel at every ISA level on an L2-resident row set. Every
// benchmark checks its result before timing (against the op's f64 reference, op_reference.h, within
// the op table's tolerance; the MoE block against the scalar kernels) and fails if it is wrong.
// Reported: weight bytes/s (bytes_per_second in binary units, weight_bytes in SI units: 90G/s is
// 90 GB/s), FLOP/s ("FLOPS"), threads used; roofline_stream_read is the plain streaming read of the
// same kind of weight set, the bound for decode_gemv; (d) attention() decode and prefill with T threads
// (the dense model's heads; FLOPS and kv_bytes: K and V bytes of the cache read per call); (e) the MoE FFN
// block of one decode token (the MoE model's experts and dtype: qwen30b's 8 of 128 experts of 768x2048,
// q4_0) through CpuBlocks::ffn, weight bytes of the routed experts per second, to read against
// decode_gemv's rate; (f) greedy sampling of one token's logits (Sampler::sample, a vocabulary of each
// model's size), checked against a plain first-maximum loop.
//
// Flags of this binary, beside Google Benchmark's --benchmark_* (the effective values are printed in the
// run's context):
//   --threads=LIST         thread counts for (a) and (b), comma-separated; default "1,<hw threads>"
//   --weight-set-mb=N      size of the rotated weight set of (a) and (b) in MiB; default 640
//                          (the GPU host's L3 is 300 MB: smaller sets measure the cache)
//   --hugepages            madvise(MADV_HUGEPAGE) on the weight set (as the executor's weight buffers do)
//   --gemv-prefetch=BYTES  how far ahead the GEMV kernels prefetch weights (0 = none; default
//                          kGemvPrefetchBytes), to find a machine's best distance
// Environment:
//   SHARDWISE_ISA                  scalar|avx2|avx512: caps the level matmul() dispatches to in (a), (b)
//   OPENBLAS_CORETYPE              (OpenBLAS's own) the sgemm kernel set of (b). OpenBLAS 0.3.21 does not
//                                  recognise the GPU host's Xeon and falls back to "Prescott" (SSE3); like
//                                  the CLI, this binary re-executes itself with SkylakeX/Haswell then
//                                  (executor/cpu/blas_env.h); the context line openblas_core shows the set.
// Quick smoke run: shardwise_bench_cpu --benchmark_min_time=0.01
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_buffer.h"
#include "core/thread_pool.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/blas_env.h"
#include "executor/cpu/cpu_features.h"
#include "executor/cpu/kernels.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_blocks.h"
#include "executor/model/moe_routing.h"
#include "executor/ops/op_table.h"
#include "executor/reference/op_reference.h"
#include "executor/session/sampling.h"
#include "microbench/bench_data.h"

extern "C" char* openblas_get_corename(void);

namespace sw = shardwise;
using sw::DType;

namespace {

// ---- configuration -----------------------------------------------------------------------------------

struct Config {
  std::vector<int> threads;
  int64_t weight_set_mb = 640;
  bool hugepages = false;
};
Config g_cfg;

[[noreturn]] void bad_flag(const std::string& arg, const char* expected) {
  std::fprintf(stderr, "error: %s: expected %s\n", arg.c_str(), expected);
  std::exit(2);
}

// A whole number from lo to hi (decimal digits, nothing else) after a flag's '='.
int64_t flag_count(const std::string& arg, size_t at, int64_t lo, int64_t hi, const char* expected) {
  const std::string v = arg.substr(at);
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) bad_flag(arg, expected);
  const int64_t n = std::stoll(v);
  if (n < lo || n > hi) bad_flag(arg, expected);
  return n;
}

// This binary's flags (see the top), taken out of argv; the rest is Google Benchmark's.
Config read_config(int* argc, char** argv) {
  Config c;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto is = [&](const char* flag) { return a.rfind(flag, 0) == 0; };
    if (is("--threads=")) {
      std::stringstream ss(a.substr(10));
      std::string item;
      while (std::getline(ss, item, ','))
        c.threads.push_back(
            static_cast<int>(flag_count("--threads=" + item, 10, 1, 4096, "thread counts, comma-separated")));
      if (c.threads.empty()) bad_flag(a, "thread counts, comma-separated");
    } else if (is("--weight-set-mb=")) {
      c.weight_set_mb = flag_count(a, 16, 1, int64_t(1) << 20, "MiB from 1 to 1048576");
    } else if (a == "--hugepages") {
      c.hugepages = true;
    } else if (is("--gemv-prefetch=")) {
      sw::set_gemv_prefetch_bytes(flag_count(a, 16, 0, sw::kGemvPrefetchMax, "bytes from 0 to 1048576"));
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  if (c.threads.empty()) {
    c.threads = {1};
    if (sw::hardware_threads() > 1) c.threads.push_back(sw::hardware_threads());
  }
  return c;
}

// ---- random data -------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One row of random non-zero weights built from random bits (fast enough for GBs): float types get
// magnitudes in [2^-4, 2), quantised blocks a scale of about 2^-7 and random codes.
void fill_row(DType t, uint8_t* dst, int64_t cols, uint64_t seed) {
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  switch (t) {
    case DType::F32:
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t u = splitmix64(s);
        const uint32_t bits = static_cast<uint32_t>((u >> 63) << 31 | (123 + (u >> 32) % 5) << 23 | (u & 0x7FFFFF));
        std::memcpy(dst + 4 * c, &bits, 4);
      }
      return;
    case DType::F16:
    case DType::BF16:
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t u = splitmix64(s);
        const uint16_t bits = t == DType::F16
                                  ? static_cast<uint16_t>((u >> 63) << 15 | (11 + (u >> 32) % 5) << 10 | (u & 0x3FF))
                                  : static_cast<uint16_t>((u >> 63) << 15 | (123 + (u >> 32) % 5) << 7 | (u & 0x7F));
        std::memcpy(dst + 2 * c, &bits, 2);
      }
      return;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::IQ4_NL:
    case DType::Q5_0: {  // a scale, then codes: random bits
      const int64_t bb = sw::dtype_block_bytes(t);
      for (int64_t b = 0; b < cols / 32; ++b) {
        uint8_t* blk = dst + b * bb;
        for (int64_t j = 2; j < bb; j += 8) {
          const uint64_t u = splitmix64(s);
          std::memcpy(blk + j, &u, static_cast<size_t>(std::min<int64_t>(8, bb - j)));
        }
        const uint64_t u = splitmix64(s);
        const uint16_t d = static_cast<uint16_t>((u >> 63) << 15 | 8u << 10 | (u & 0x3FF));  // ±2^-7 * (1 + m)
        std::memcpy(blk, &d, 2);
      }
      return;
    }
    default: {  // the other block types: random values of magnitude < 2^-3 through the reference quantiser
      std::vector<float> v(static_cast<size_t>(cols));
      for (float& x : v) x = static_cast<float>(static_cast<int64_t>(splitmix64(s) >> 40) - (1 << 23)) * 0x1p-26f;
      sw::quantize_row(t, v.data(), dst, cols);
      return;
    }
  }
}

std::vector<float> random_activations(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    const float f = static_cast<float>(splitmix64(s) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    x = f != 0.0f ? f : 0.5f;
  }
  return v;
}

// ---- thread pools and the rotated weight set ---------------------------------------------------------

// One pool at a time, so that idle workers of another size never compete with the measured ones.
sw::ThreadPool& pool_of(int threads) {
  static std::unique_ptr<sw::ThreadPool> pool;
  if (!pool || pool->size() != threads) {
    pool.reset();
    pool = std::make_unique<sw::ThreadPool>(threads);
  }
  return *pool;
}

// n matrices of one dtype and shape, >= --weight-set-mb together, filled in parallel
// (first touch by many threads). Benchmarks are registered grouped by (dtype, shape), so a set is
// built once per group and the previous one is freed first.
struct WeightSet {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  uint64_t row_bytes = 0, matrix_bytes = 0, stride = 0;
  int n = 0;
  sw::HostBuffer buf;
  const uint8_t* matrix(int i) const { return buf.data() + static_cast<uint64_t>(i) * stride; }
};

WeightSet& weight_set(DType t, int64_t rows, int64_t cols) {
  static WeightSet ws;
  if (ws.n > 0 && ws.dtype == t && ws.rows == rows && ws.cols == cols) return ws;
  ws.buf = sw::HostBuffer();
  ws.n = 0;
  ws.dtype = t;
  ws.rows = rows;
  ws.cols = cols;
  ws.row_bytes = sw::dtype_row_bytes(t, cols);
  ws.matrix_bytes = ws.row_bytes * static_cast<uint64_t>(rows);
  ws.stride = (ws.matrix_bytes + 4095) / 4096 * 4096;
  const uint64_t set_bytes = static_cast<uint64_t>(g_cfg.weight_set_mb) << 20;
  const int n = static_cast<int>(std::max<uint64_t>(1, (set_bytes + ws.matrix_bytes - 1) / ws.matrix_bytes));
  ws.buf = sw::HostBuffer(ws.stride * static_cast<uint64_t>(n));
  if (g_cfg.hugepages) ::madvise(ws.buf.data(), ws.buf.size(), MADV_HUGEPAGE);
  sw::ThreadPool& pool = pool_of(sw::hardware_threads());
  pool.parallel_for(static_cast<int64_t>(n) * rows, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t m = i / rows, r = i % rows;
      fill_row(t, ws.buf.data() + static_cast<uint64_t>(m) * ws.stride + static_cast<uint64_t>(r) * ws.row_bytes, cols,
               static_cast<uint64_t>(i) + 1);
    }
  });
  ws.n = n;
  return ws;
}

// ---- check before timing -----------------------------------------------------------------------------

// Compares y (tokens `check_tokens`, rows sampled evenly, at most 64) with the f64 reference within the
// op table's matmul tolerance. Returns "" or a description of the error.
std::string check_against_reference(DType t, const uint8_t* w, uint64_t row_bytes, int64_t rows, int64_t cols,
                                    const float* x, int64_t ldx, const float* y, int64_t ldy,
                                    const std::vector<int64_t>& check_tokens) {
  const sw::Tolerance tol = sw::tolerance(sw::OpId::Matmul);
  std::set<int64_t> sample;
  for (int64_t i = 0; i < 64; ++i) sample.insert(rows > 1 ? i * (rows - 1) / 63 : 0);
  for (int64_t r : sample) {
    for (int64_t tok : check_tokens) {
      const sw::OpReference ref =
          sw::reference_matmul(t, w + static_cast<uint64_t>(r) * row_bytes, row_bytes, 1, cols, x + tok * ldx, ldx, 1);
      const float got = y[tok * ldy + r];
      if (!(sw::excess(got, ref.y[0], ref.mag[0], tol) <= 1.0))
        return sw::str_cat(sw::dtype_name(t), " row ", r, " token ", tok, ": got ", got, ", reference ", ref.y[0],
                           " (tolerance ", tol.bound(ref.mag[0]), ")");
    }
  }
  return "";
}

// Benchmarks are re-entered for each iteration-count estimate; the check runs on the first entry.
bool first_entry(const std::string& key) {
  static std::set<std::string> seen;
  return seen.insert(key).second;
}

void set_counters(benchmark::State& state, uint64_t weight_bytes, double flops, int threads) {
  const double it = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(weight_bytes));
  // bytes_per_second is printed in binary units (G = 2^30); weight_bytes in SI units (G = 10^9).
  state.counters["weight_bytes"] =
      benchmark::Counter(it * static_cast<double>(weight_bytes), benchmark::Counter::kIsRate);
  state.counters["FLOPS"] = benchmark::Counter(it * flops, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// ---- (a) decode GEMV and (b) prefill GEMM through matmul() ---------------------------------------------

// The dense model's FFN matrices (nemo8b, hidden 4096, FFN 11520: gate/up {11520, 4096}, down {4096, 11520}).
std::vector<sw::MatrixShape> ffn_shapes() {
  const sw::ModelSpec dense = sw::perf_dense_model();
  return {sw::layer_matrix(dense, "gate_up"), sw::layer_matrix(dense, "down")};
}

void bm_matmul(benchmark::State& state, const std::string& key, DType t, sw::MatrixShape shape, int64_t n_tokens,
               int threads) {
  WeightSet& ws = weight_set(t, shape.rows, shape.cols);
  sw::ThreadPool& pool = pool_of(threads);
  const std::vector<float> x = random_activations(n_tokens * shape.cols, 7);
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows), std::nanf(""));
  if (first_entry(key)) {
    sw::matmul_raw(t, ws.matrix(0), shape.rows, shape.cols, x.data(), shape.cols, n_tokens, y.data(), shape.rows, pool);
    std::vector<int64_t> tokens = {0};
    if (n_tokens > 1) tokens.insert(tokens.end(), {n_tokens / 2, n_tokens - 1});
    const std::string err = check_against_reference(t, ws.matrix(0), ws.row_bytes, shape.rows, shape.cols, x.data(),
                                                    shape.cols, y.data(), shape.rows, tokens);
    if (!err.empty()) {
      state.SkipWithError(("matmul result differs from the reference: " + err).c_str());
      return;
    }
  }
  int i = 0;
  for (auto _ : state) {
    sw::matmul_raw(t, ws.matrix(i), shape.rows, shape.cols, x.data(), shape.cols, n_tokens, y.data(), shape.rows, pool);
    benchmark::ClobberMemory();
    if (++i == ws.n) i = 0;
  }
  set_counters(state, ws.matrix_bytes, 2.0 * static_cast<double>(n_tokens) * shape.rows * shape.cols, threads);
  state.counters["weight_set_MiB"] = static_cast<double>(ws.n * ws.matrix_bytes) / (1 << 20);
}

// Roofline for (a): a plain AVX2 streaming read of the same weight set, each thread one contiguous
// part, so that decode_gemv bytes/s can be read as a fraction of what this machine's DRAM delivers.
void bm_stream_read(benchmark::State& state, int threads) {
  const sw::MatrixShape gate_up = ffn_shapes().front();
  WeightSet& ws = weight_set(DType::F32, gate_up.rows, gate_up.cols);
  sw::ThreadPool& pool = pool_of(threads);
  std::vector<float> sums(static_cast<size_t>(threads) * 16);
  int i = 0;
  for (auto _ : state) {
    const uint8_t* base = ws.matrix(i);
    const uint64_t n_vec = ws.matrix_bytes / 32;
    pool.run_on_all([&](int t) {
      // Four streams per thread, as the GEMV kernels read four rows at a time.
      const uint64_t v0 = n_vec * static_cast<uint64_t>(t) / threads, v1 = n_vec * (t + 1ull) / threads;
      const uint64_t q = (v1 - v0) / 4;
      const auto* p = reinterpret_cast<const float*>(base) + v0 * 8;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (uint64_t v = 0; v < q; ++v) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + v * 8));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + (q + v) * 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + (2 * q + v) * 8));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + (3 * q + v) * 8));
      }
      for (uint64_t v = v0 + 4 * q; v < v1; ++v)
        a0 = _mm256_add_ps(a0, _mm256_load_ps(reinterpret_cast<const float*>(base) + v * 8));
      _mm256_storeu_ps(&sums[static_cast<size_t>(t) * 16], _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    });
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
    if (++i == ws.n) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(ws.matrix_bytes));
  state.counters["weight_bytes"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * ws.matrix_bytes, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
  state.counters["weight_set_MiB"] = static_cast<double>(ws.n * ws.matrix_bytes) / (1 << 20);
}

// ---- (c) single-thread kernels per ISA level, L2-resident ------------------------------------------------

// Rows of the dense model's hidden size (nemo8b: 4096).
int64_t kernel_cols() {
  static const int64_t cols = sw::perf_dense_model().hidden_size;
  return cols;
}
constexpr uint64_t kL2SetBytes = 1 << 20;  // weights per kernel benchmark (the Xeon's L2 is 2 MB per core)

int64_t l2_rows(DType t) {
  const uint64_t rb = sw::dtype_row_bytes(t, kernel_cols());
  return std::max<int64_t>(4, static_cast<int64_t>(kL2SetBytes / rb) / 4 * 4);
}

std::vector<uint8_t> l2_weights(DType t, int64_t rows) {
  const uint64_t rb = sw::dtype_row_bytes(t, kernel_cols());
  std::vector<uint8_t> w(rb * static_cast<uint64_t>(rows));
  for (int64_t r = 0; r < rows; ++r) fill_row(t, w.data() + r * rb, kernel_cols(), 1000 + static_cast<uint64_t>(r));
  return w;
}

void bm_kernel_gemv(benchmark::State& state, const std::string& key, sw::Isa isa, DType t, int nt) {
  const sw::CpuKernels* k = sw::cpu_kernels_for(isa);
  const int64_t rows = l2_rows(t), cols = kernel_cols();
  const uint64_t rb = sw::dtype_row_bytes(t, cols);
  const std::vector<uint8_t> w = l2_weights(t, rows);
  const std::vector<float> x = random_activations(nt * cols, 11);
  std::vector<float> y(static_cast<size_t>(nt * rows), std::nanf(""));
  const sw::GemvFn gemv = k->gemv[sw::kernel_slot(t)];
  if (first_entry(key)) {
    gemv(w.data(), rb, cols, 0, rows, x.data(), cols, nt, y.data(), rows);
    std::vector<int64_t> tokens;
    for (int tok = 0; tok < nt; ++tok) tokens.push_back(tok);
    const std::string err =
        check_against_reference(t, w.data(), rb, rows, cols, x.data(), cols, y.data(), rows, tokens);
    if (!err.empty()) {
      state.SkipWithError((std::string(sw::isa_name(isa)) + " gemv differs from the reference: " + err).c_str());
      return;
    }
  }
  for (auto _ : state) {
    gemv(w.data(), rb, cols, 0, rows, x.data(), cols, nt, y.data(), rows);
    benchmark::ClobberMemory();
  }
  set_counters(state, rb * static_cast<uint64_t>(rows), 2.0 * static_cast<double>(nt) * rows * cols, 1);
}

// The same kernel on T threads at once, each on its own L2-resident rows: the compute bound of
// decode_gemv with every core busy (all-core clocks), to set against roofline_stream_read.
void bm_kernel_gemv_allcores(benchmark::State& state, const std::string& key, sw::Isa isa, DType t, int threads) {
  const sw::CpuKernels* k = sw::cpu_kernels_for(isa);
  const int64_t rows = l2_rows(t), cols = kernel_cols();
  const uint64_t rb = sw::dtype_row_bytes(t, cols);
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::vector<float>> y;
  for (int i = 0; i < threads; ++i) {
    w.push_back(l2_weights(t, rows));
    y.emplace_back(static_cast<size_t>(rows), std::nanf(""));
  }
  const std::vector<float> x = random_activations(cols, 11);
  const sw::GemvFn gemv = k->gemv[sw::kernel_slot(t)];
  sw::ThreadPool& pool = pool_of(threads);
  if (first_entry(key)) {
    gemv(w[0].data(), rb, cols, 0, rows, x.data(), cols, 1, y[0].data(), rows);
    const std::string err =
        check_against_reference(t, w[0].data(), rb, rows, cols, x.data(), cols, y[0].data(), rows, {0});
    if (!err.empty()) {
      state.SkipWithError((std::string(sw::isa_name(isa)) + " gemv differs from the reference: " + err).c_str());
      return;
    }
  }
  for (auto _ : state) {
    pool.run_on_all([&](int i) { gemv(w[i].data(), rb, cols, 0, rows, x.data(), cols, 1, y[i].data(), rows); });
    benchmark::ClobberMemory();
  }
  set_counters(state, rb * static_cast<uint64_t>(rows) * threads, 2.0 * static_cast<double>(rows) * cols * threads,
               threads);
}

void bm_kernel_dequant(benchmark::State& state, const std::string& key, sw::Isa isa, DType t) {
  const sw::CpuKernels* k = sw::cpu_kernels_for(isa);
  const int64_t rows = 64, cols = kernel_cols();  // one matmul tile (64 rows) of f32 output: 1 MiB
  const uint64_t rb = sw::dtype_row_bytes(t, cols);
  const std::vector<uint8_t> w = l2_weights(t, rows);
  std::vector<float> out(static_cast<size_t>(rows * cols), std::nanf(""));
  const sw::DequantFn deq = k->dequant[sw::kernel_slot(t)];
  if (first_entry(key)) {
    for (int64_t r = 0; r < rows; ++r) {
      deq(w.data() + r * rb, out.data() + r * cols, cols);
      const sw::OpReference ref = sw::reference_dequant(t, w.data() + r * rb, cols);
      if (!sw::compare_to_reference(out.data() + r * cols, ref, sw::tolerance(sw::OpId::Dequant)).ok()) {
        state.SkipWithError(
            sw::str_cat(sw::isa_name(isa), " dequant ", sw::dtype_name(t), " row ", r, " is not bit-exact").c_str());
        return;
      }
    }
  }
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) deq(w.data() + r * rb, out.data() + r * cols, cols);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(rb) * rows);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows * cols);
  state.counters["threads"] = 1;
}

// ---- (d) attention (executor/cpu/attention.h) ------------------------------------------------------------
// The dense model's heads (nemo8b: 32 query heads, 8 KV heads, head_dim 128). decode: 1 query at the end
// of a ctx-row cache; prefill: kPrefillTokens new queries at the cache's last positions (causal). FLOPS
// counts 4 * head_dim per (query head, attended key) (QK^T and PV); kv_bytes is the K and V rows read
// once per KV head.

struct AttnCase {
  const char* name;
  int64_t n_tokens, ctx;
};
const AttnCase kAttnCases[] = {{"decode", 1, 4096}, {"decode", 1, 32768}, {"prefill", sw::kPrefillTokens, 4096}};

void bm_attention(benchmark::State& state, const std::string& key, AttnCase c, int threads) {
  const sw::AttentionLayout l = sw::attention_layout(sw::perf_dense_model());
  const int64_t hd = l.head_dim, kvs = l.kv_heads * hd, qd = l.heads * hd;
  sw::ThreadPool& pool = pool_of(threads);
  const std::vector<float> q = random_activations(c.n_tokens * qd, 21);
  const std::vector<float> k = random_activations(c.ctx * kvs, 22);
  const std::vector<float> v = random_activations(c.ctx * kvs, 23);
  std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
  double keys = 0;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    pos[t] = static_cast<int32_t>(c.ctx - c.n_tokens + t);
    keys += pos[t] + 1.0;
  }
  std::vector<float> out(q.size(), std::nanf(""));
  const sw::AttentionShape shape = sw::head_major({l.heads, l.kv_heads, hd}, c.ctx);  // as the host KV cache
  if (first_entry(key)) {  // every head of the first and the last query against the reference
    sw::attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), c.ctx, shape, out.data(), pool);
    const sw::Tolerance tol = sw::tolerance(sw::OpId::Attention);
    for (int64_t t : {int64_t{0}, c.n_tokens - 1}) {
      const sw::OpReference ref = sw::reference_attention(q.data() + t * qd, 1, &pos[t], k.data(), v.data(), shape);
      const sw::RefCheck rc = sw::compare_to_reference(out.data() + t * qd, ref, tol);
      if (!rc.ok()) {
        state.SkipWithError(
            sw::str_cat("attention token ", t, ": ", sw::describe(rc, out.data() + t * qd, ref, tol)).c_str());
        return;
      }
    }
  }
  for (auto _ : state) {
    sw::attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), c.ctx, shape, out.data(), pool);
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(state.iterations());
  const double kv_bytes = 2.0 * static_cast<double>(c.ctx) * kvs * 4;
  state.SetBytesProcessed(static_cast<int64_t>(it * kv_bytes));
  state.counters["kv_bytes"] = benchmark::Counter(it * kv_bytes, benchmark::Counter::kIsRate);
  state.counters["FLOPS"] = benchmark::Counter(it * 4.0 * l.heads * hd * keys, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// The MoE model's FFN block as a profiler op (qwen30b: 8 of 128 experts of 768x2048, q4_0), one token.
sw::Op moe_decode_op() {
  const sw::ModelSpec moe = sw::perf_moe_model();
  const sw::MoeShape m = sw::moe_shape(moe);
  sw::Op op;
  op.kind = sw::OpKind::MoeExperts;
  op.dtype = moe.dtype;
  op.rows = m.ffn;
  op.cols = m.hidden;
  op.n_experts = m.experts;
  op.top_k = m.top_k;
  op.tokens = 1;
  return op;
}

// The MoE block on this ISA against the scalar kernels for one routing: empty when they agree.
std::string moe_block_vs_scalar(sw::CpuBlocks& blocks, const sw::LayerWeights& w, const std::vector<float>& x,
                                const sw::MoeRouting& r) {
  std::vector<float> a(x), b(x);
  blocks.ffn(w, a.data(), 1, &r);
  const sw::Isa was = sw::active_isa();
  sw::set_isa_cap(sw::Isa::Scalar);
  blocks.ffn(w, b.data(), 1, &r);
  sw::set_isa_cap(was);
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  if (err <= 1e-4 * mag + 1e-6) return "";
  return sw::str_cat("MoE block differs from the scalar kernels: max |diff| ", err, " of ", mag);
}

// (e) One decode token through the MoE FFN block of the MoE model, a fresh random routing each
// iteration over the next of five replicas of the layer, its experts labelled by the replica's
// ExpertDeck (the experts of a step come from DRAM, as in a real step: a single 340 MB set of qwen30b's
// stays largely in the GPU host's 300 MB L3).
void bm_moe_decode(benchmark::State& state, const std::string& key, int threads, int cpu_experts = 0) {
  const sw::Op op = moe_decode_op();
  const sw::ModelSpec spec = sw::moe_block_spec(op);
  sw::ThreadPool& pool = pool_of(threads);
  const uint64_t one = static_cast<uint64_t>(op.rows) * sw::dtype_row_bytes(op.dtype, op.cols);
  const uint64_t down = static_cast<uint64_t>(op.cols) * sw::dtype_row_bytes(op.dtype, op.rows);
  const uint64_t E = static_cast<uint64_t>(op.n_experts), set = E * (2 * one + down);
  constexpr int kReplicas = 5;  // 1.7 GB, shared by the thread counts
  static sw::HostBuffer experts;
  if (experts.size() == 0) {
    experts = sw::HostBuffer(kReplicas * set);
    sw::fill_random(op.dtype, experts.data(), experts.size(), 91, pool);
  }
  std::vector<sw::LayerWeights> layers(kReplicas);
  std::vector<sw::ExpertDeck> decks;
  for (int r = 0; r < kReplicas; ++r) {
    sw::LayerWeights& w = layers[static_cast<size_t>(r)];
    w.ffn_norm.assign(static_cast<size_t>(op.cols), 1.0f);
    auto view = [&](uint64_t off, sw::Shape sh) {
      sw::TensorView v;
      v.dtype = op.dtype;
      v.shape = std::move(sh);
      v.nbytes = sw::tensor_bytes(op.dtype, v.shape);
      v.data = experts.data() + static_cast<uint64_t>(r) * set + off;
      return v;
    };
    w.gate_exps = view(0, {op.n_experts, op.rows, op.cols});
    w.up_exps = view(E * one, {op.n_experts, op.rows, op.cols});
    w.down_exps = view(2 * E * one, {op.n_experts, op.cols, op.rows});
    decks.emplace_back(op.n_experts, 41 + static_cast<uint64_t>(r));
  }
  sw::CpuBlocks blocks(spec, sw::RopeStyle::Neox, pool);
  std::vector<float> x = random_activations(op.cols, 5), logits(static_cast<size_t>(op.n_experts));
  uint64_t seed = 1, turn = 0;
  size_t replica = 0;  // of the last routing
  auto routing = [&] {
    for (auto& l : logits) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      l = static_cast<float>(seed >> 40) / static_cast<float>(1 << 24);
    }
    replica = static_cast<size_t>(turn++ % kReplicas);
    return decks[replica].next(logits.data(), 1, op.top_k);
  };
  if (first_entry(key)) {  // the block on this ISA against the scalar kernels
    const sw::MoeRouting r = routing();
    const std::string diff = moe_block_vs_scalar(blocks, layers[replica], x, r);
    if (!diff.empty()) {
      state.SkipWithError(diff.c_str());
      return;
    }
  }
  std::vector<float> xi(x), partial(x.size());
  for (auto _ : state) {
    state.PauseTiming();
    const sw::MoeRouting r = routing();
    // A CPU share of a split layer (Dynamic): cpu_experts of the token's top_k, the rest on the GPU.
    const sw::MoeRouting share = cpu_experts > 0 ? sw::split_routing(r, cpu_experts, op.top_k).cpu : sw::MoeRouting{};
    std::copy(x.begin(), x.end(), xi.begin());
    const sw::LayerWeights& w = layers[replica];
    state.ResumeTiming();
    if (cpu_experts > 0)
      blocks.moe_share(w, xi.data(), 1, share, partial.data());
    else
      blocks.ffn(w, xi.data(), 1, &r);
    benchmark::ClobberMemory();
  }
  const int64_t k = cpu_experts > 0 ? cpu_experts : op.top_k;
  const uint64_t touched = static_cast<uint64_t>(k) * (2 * one + down);
  set_counters(state, touched, 2.0 * 3.0 * static_cast<double>(k) * op.rows * op.cols, threads);
  // The simulator times a share of c experts as c / top_k of the block (beyond its fixed part): this
  // row's time against that, per expert.
  state.counters["experts"] = static_cast<double>(k);
}

// (f) Greedy sampling (no penalty) of a vocabulary of `vocab` logits, normal-distributed, the maximum
// somewhere in the middle.
void bm_greedy_sample(benchmark::State& state, int64_t vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (float& v : logits) v = dist(rng);
  logits[static_cast<size_t>(vocab / 2 + 17)] = 100.0f;
  size_t first = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[first]) first = i;
  sw::SamplingParams p;
  p.greedy = true;
  sw::Sampler sampler(p);
  const std::vector<int32_t> history;
  if (sampler.sample(logits.data(), vocab, history) != static_cast<int32_t>(first)) {
    state.SkipWithError("greedy sampling picked another token than the first maximum");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits.data(), vocab, history));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * vocab * static_cast<int64_t>(sizeof(float)));
}

// SwiGLU at one level over n values, checked against the reference before timing.
void bm_kernel_swiglu(benchmark::State& state, const std::string& key, sw::Isa isa, int64_t n) {
  const sw::CpuKernels* k = sw::cpu_kernels_for(isa);
  std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 2001 - 1000) / 250.0f;
    u[static_cast<size_t>(i)] = 1.0f;
  }
  if (first_entry(key)) {
    std::vector<float> once(g);
    k->swiglu(once.data(), u.data(), n);
    const sw::OpReference ref = sw::reference_swiglu(g.data(), u.data(), n);
    const sw::Tolerance tol = sw::tolerance(sw::OpId::Swiglu);
    const sw::RefCheck rc = sw::compare_to_reference(once.data(), ref, tol);
    if (!rc.ok()) {
      state.SkipWithError(sw::str_cat(sw::isa_name(isa), " swiglu: ", sw::describe(rc, once.data(), ref, tol)).c_str());
      return;
    }
  }
  for (auto _ : state) {
    k->swiglu(g.data(), u.data(), n);  // silu is a contraction towards [-0.28, x]: values stay finite
    benchmark::DoNotOptimize(g.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// (f) greedy sampling at each model's vocabulary; (e) the MoE model's decode block and a split layer's
// CPU shares.
void register_sampling_and_moe() {
  for (const sw::ModelSpec& spec : {sw::perf_dense_model(), sw::perf_moe_model()}) {
    const int64_t vocab = spec.vocab_size;
    const std::string name = sw::str_cat("greedy_sample/vocab:", vocab);
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
      bm_greedy_sample(st, vocab);
    })->Unit(benchmark::kMicrosecond);
  }
  const sw::Op op = moe_decode_op();
  const std::string shape =
      sw::str_cat(sw::dtype_name(op.dtype), "/", op.n_experts, "x", op.rows, "x", op.cols, "_top", op.top_k);
  for (int threads : g_cfg.threads) {
    const std::string name = sw::str_cat("moe_decode/", shape, "/tokens:1/threads:", threads);
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_moe_decode(st, name, threads); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    // A split layer's CPU share (Dynamic decode): 1, 2 and 5 of the token's 8 experts.
    for (int c : {1, 2, 5}) {
      const std::string share = sw::str_cat("moe_share/", shape, "/tokens:1/cpu_experts:", c, "/threads:", threads);
      benchmark::RegisterBenchmark(share.c_str(), [=](benchmark::State& st) { bm_moe_decode(st, share, threads, c); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

// (d) attention; (a) and (b), grouped by (dtype, shape) so each weight set is built once (the roofline
// reads the f32 gate_up set, so it runs in that group).
void register_attention_and_matmul() {
  const sw::AttentionLayout l = sw::attention_layout(sw::perf_dense_model());
  for (const AttnCase& c : kAttnCases) {
    for (int threads : g_cfg.threads) {
      const std::string name = sw::str_cat("attention/", c.name, "/heads:", l.heads, "x", l.kv_heads, "x", l.head_dim,
                                           "/tokens:", c.n_tokens, "/ctx:", c.ctx, "/threads:", threads);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_attention(st, name, c, threads); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  const std::vector<sw::MatrixShape> shapes = ffn_shapes();
  for (DType t : sw::weight_dtypes()) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const sw::MatrixShape s = shapes[i];
      if (t == DType::F32 && i == 0) {
        for (int threads : g_cfg.threads) {
          const std::string name = sw::str_cat("roofline_stream_read/threads:", threads);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm_stream_read(st, threads); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
      for (int64_t n_tokens : {int64_t{1}, sw::kPrefillTokens}) {
        for (int threads : g_cfg.threads) {
          const std::string name =
              sw::str_cat(n_tokens == 1 ? "decode_gemv/" : "prefill_gemm/", sw::dtype_name(t), "/", s.role, "_", s.rows,
                          "x", s.cols, "/tokens:", n_tokens, "/threads:", threads);
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) { bm_matmul(st, name, t, s, n_tokens, threads); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

// (c) every level this CPU and build offer.
void register_kernels() {
  const sw::MoeShape moe = sw::moe_shape(sw::perf_moe_model());
  const int64_t dense_ffn = sw::perf_dense_model().intermediate_size;
  const int max_threads = *std::max_element(g_cfg.threads.begin(), g_cfg.threads.end());
  for (sw::Isa isa : {sw::Isa::Scalar, sw::Isa::Avx2, sw::Isa::Avx512}) {
    if (!sw::cpu_kernels_for(isa)) continue;
    for (DType t : sw::weight_dtypes()) {
      for (int nt : {1, sw::kGemvMaxTokens}) {
        const std::string name =
            sw::str_cat("kernel_gemv/", sw::isa_name(isa), "/", sw::dtype_name(t), "/", kernel_cols(), "cols/nt:", nt);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          bm_kernel_gemv(st, name, isa, t, nt);
        })->Unit(benchmark::kMicrosecond);
      }
    }
    if (isa != sw::Isa::Scalar && max_threads > 1) {
      for (DType t : sw::weight_dtypes()) {
        const std::string name = sw::str_cat("kernel_gemv_allcores/", sw::isa_name(isa), "/", sw::dtype_name(t), "/",
                                             kernel_cols(), "cols/nt:1/threads:", max_threads);
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& st) { bm_kernel_gemv_allcores(st, name, isa, t, max_threads); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
    // SwiGLU of the MoE model's routed experts (qwen30b: 8 x 768) and of one decode token's dense FFN
    // (nemo8b: 11520).
    for (int64_t n : {moe.top_k * moe.ffn, dense_ffn}) {
      const std::string name = sw::str_cat("kernel_swiglu/", sw::isa_name(isa), "/", n);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        bm_kernel_swiglu(st, name, isa, n);
      })->Unit(benchmark::kMicrosecond);
    }
    for (DType t : sw::weight_dtypes()) {
      if (t == DType::F32) continue;  // a memcpy
      const std::string name =
          sw::str_cat("kernel_dequant/", sw::isa_name(isa), "/", sw::dtype_name(t), "/64x", kernel_cols());
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        bm_kernel_dequant(st, name, isa, t);
      })->Unit(benchmark::kMicrosecond);
    }
  }
}

void register_all() {
  register_sampling_and_moe();
  register_attention_and_matmul();
  register_kernels();
}

}  // namespace

int main(int argc, char** argv) {
  sw::ensure_fast_blas(argv);
  g_cfg = read_config(&argc, argv);
  std::string threads;
  for (int t : g_cfg.threads) threads += (threads.empty() ? "" : ",") + std::to_string(t);
  benchmark::AddCustomContext("shardwise_bench_threads", threads);
  benchmark::AddCustomContext("shardwise_weight_set_mb", std::to_string(g_cfg.weight_set_mb));
  benchmark::AddCustomContext("shardwise_hugepages", g_cfg.hugepages ? "1" : "0");
  benchmark::AddCustomContext("shardwise_gemv_prefetch_bytes", std::to_string(sw::gemv_prefetch_bytes()));
  benchmark::AddCustomContext("shardwise_cpu_max_isa", sw::isa_name(sw::cpu_max_isa()));
  benchmark::AddCustomContext("shardwise_matmul_isa", sw::isa_name(sw::cpu_kernels().isa));
  benchmark::AddCustomContext("shardwise_gemm_threshold_tokens", std::to_string(sw::matmul_gemm_threshold()));
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

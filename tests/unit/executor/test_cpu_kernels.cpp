// tests/unit/executor/test_cpu_kernels.cpp — every CPU kernel (kernels.h) at every ISA level this
// host and build offer, and the threaded matmul() driver, against double-precision references
// computed from core's dequantize_row (the reference path). A level the host lacks is reported
// with a WARN line ("... not tested"); SHARDWISE_ISA caps the levels tested, as it caps dispatch.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/cpu_features.h"
#include "executor/cpu/kernels.h"
#include "executor/cpu/ops.h"
#include "executor/cpu/matmul.h"
#include "test_util.h"

namespace shardwise {
namespace {

const DType kDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// f32 accumulation of exactly-converted weights: rounding grows with the magnitudes summed, so the
// bound is relative to sum |w * x|, not to the (possibly cancelling) result.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// SHARDWISE_ISA as cpu_features.cpp reads it (unset or unknown = no cap).
Isa env_isa_cap() {
  const char* e = std::getenv("SHARDWISE_ISA");
  if (!e) return Isa::Avx512;
  const std::string v = e;
  if (v == "scalar") return Isa::Scalar;
  if (v == "avx2") return Isa::Avx2;
  return Isa::Avx512;
}

Isa min_isa(Isa a, Isa b) {
  return static_cast<int>(a) < static_cast<int>(b) ? a : b;
}

// Restores "no programmatic cap" when a test that moves it ends (also on failure).
struct IsaCapGuard {
  ~IsaCapGuard() { set_isa_cap(Isa::Avx512); }
};

// The kernel tables under test: every level the CPU and build offer, up to SHARDWISE_ISA. Levels
// left out are reported, so a run on a host without AVX-512 says so instead of passing silently.
std::vector<const CpuKernels*> levels_under_test() {
  std::vector<const CpuKernels*> out;
  for (Isa isa : kIsas) {
    const CpuKernels* k = cpu_kernels_for(isa);
    if (!k) {
      WARN(isa_name(isa) << " kernels not available on this CPU/build (cpu max: " << isa_name(cpu_max_isa())
                         << "): not tested");
      continue;
    }
    if (static_cast<int>(isa) > static_cast<int>(env_isa_cap())) {
      WARN(isa_name(isa) << " kernels capped by SHARDWISE_ISA: not tested");
      continue;
    }
    REQUIRE(k->isa == isa);
    out.push_back(k);
  }
  return out;
}

std::mt19937& rng() {
  static std::mt19937 g(20261129u);
  return g;
}

float uniform(float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng());
}

// Random finite non-zero-ish values with magnitudes that vary by block (so a kernel applying the
// wrong block's scale or reading the wrong column is caught).
std::vector<float> random_values(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += 32) {
    const float scale = std::ldexp(1.0f, static_cast<int>(uniform(-3.0f, 3.0f)));
    for (int64_t i = b; i < std::min(n, b + 32); ++i) {
      float x = uniform(-1.0f, 1.0f);
      if (std::fabs(x) < 1e-3f) x = 0.5f;
      v[static_cast<size_t>(i)] = x * scale;
    }
  }
  return v;
}

// One row of n elements in dtype t: float types converted from random values, quantised types as
// random raw blocks (every code, including Q8_0's -128 that the quantiser never emits).
void random_row(DType t, int64_t n, uint8_t* dst) {
  if (!dtype_is_quantized(t)) {
    const std::vector<float> v = random_values(n);
    quantize_row(t, v.data(), dst, n);
    return;
  }
  const int64_t bb = dtype_block_bytes(t);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t b = 0; b < n / 32; ++b) {
    uint8_t* blk = dst + b * bb;
    const uint16_t d = f32_to_f16(uniform(0.001f, 0.05f) * (byte(rng()) & 1 ? 1.0f : -1.0f));
    std::memcpy(blk, &d, 2);
    for (int64_t j = 2; j < bb; ++j) blk[j] = static_cast<uint8_t>(byte(rng()));
  }
}

// A weight matrix with a row stride of row_bytes (>= the natural size; the gap is filled with 0xFF,
// which decodes to NaN in every dtype, so a kernel that reads past a row's end is caught).
struct Weights {
  DType dtype;
  int64_t rows, cols;
  uint64_t row_bytes;
  std::vector<uint8_t> storage;
  std::vector<float> deq;                                     // (rows, cols), from core's dequantize_row
  const uint8_t* data() const { return storage.data() + 4; }  // deliberately not 32-byte aligned
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint64_t pad_bytes) {
  Weights w{t, rows, cols, dtype_row_bytes(t, cols) + pad_bytes, {}, {}};
  w.storage.assign(4 + static_cast<size_t>(rows) * w.row_bytes + 64, 0xFF);
  w.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.storage.data() + 4 + r * w.row_bytes;
    random_row(t, cols, row);
    dequantize_row(t, row, w.deq.data() + r * cols, cols);
  }
  return w;
}

// Activations: n_tokens rows of `cols` values, row stride ldx > cols; the gap holds NaN.
std::vector<float> make_x(int64_t n_tokens, int64_t cols, int64_t ldx) {
  std::vector<float> x(static_cast<size_t>(n_tokens * ldx + 1), kNaN);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const std::vector<float> v = random_values(cols);
    std::copy(v.begin(), v.end(), x.begin() + 1 + t * ldx);
  }
  return x;  // data starts at x.data() + 1 (not vector-aligned)
}

// Compares y (row stride ldy) with the double reference for rows [r0, r1) and checks that every
// other element of y is still NaN. Returns the number of mismatches; describes the first one.
int64_t compare_with_reference(const Weights& w, const float* x, int64_t ldx, int64_t n_tokens, int64_t r0, int64_t r1,
                               const std::vector<float>& y, int64_t ldy, std::string* first) {
  int64_t bad = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(t * ldy + r)];
      if (r < r0 || r >= r1) {
        if (!std::isnan(got)) {
          if (bad++ == 0) *first = str_cat("wrote outside its range: y[", t, "][", r, "] = ", got);
        }
        continue;
      }
      const float* wr = w.deq.data() + r * w.cols;
      const float* xt = x + t * ldx;
      double ref = 0.0, mag = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const double p = static_cast<double>(wr[c]) * static_cast<double>(xt[c]);
        ref += p;
        mag += std::fabs(p);
      }
      const double tol = kAtol + kRtol * mag;
      if (!(std::fabs(static_cast<double>(got) - ref) <= tol)) {
        if (bad++ == 0) *first = str_cat("y[", t, "][", r, "] = ", got, ", reference ", ref, " (tolerance ", tol, ")");
      }
    }
  }
  return bad;
}

// One gemv call with fresh activations, poisoned output and strides larger than needed.
void check_gemv(const CpuKernels& k, const Weights& w, int nt, int64_t r0, int64_t r1) {
  const int64_t ldx = w.cols + 13, ldy = w.rows + 5;
  const std::vector<float> xbuf = make_x(nt, w.cols, ldx);
  const float* x = xbuf.data() + 1;
  std::vector<float> y(static_cast<size_t>(nt * ldy), kNaN);
  k.gemv[kernel_slot(w.dtype)](w.data(), w.row_bytes, w.cols, r0, r1, x, ldx, nt, y.data(), ldy);
  std::string first;
  const int64_t bad = compare_with_reference(w, x, ldx, nt, r0, r1, y, ldy, &first);
  INFO(isa_name(k.isa) << " gemv " << dtype_name(w.dtype) << " rows " << w.rows << " cols " << w.cols << " row_bytes "
                       << w.row_bytes << " nt " << nt << " range [" << r0 << ", " << r1 << "): " << first);
  CHECK(bad == 0);
}

std::string hex_bits(const float* v, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    s += str_cat(std::hex, u, " ");
  }
  return s;
}

// Dequantised values must equal core's bit for bit (NaNs only need to stay NaN) and nothing past n
// may be written.
void check_dequant(const CpuKernels& k, DType t, const uint8_t* src, int64_t n) {
  std::vector<float> ref(static_cast<size_t>(n));
  dequantize_row(t, src, ref.data(), n);
  std::vector<float> got(static_cast<size_t>(n + 8), kNaN);
  k.dequant[kernel_slot(t)](src, got.data(), n);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = std::isnan(ref[i]) ? std::isnan(got[i]) : std::memcmp(&ref[i], &got[i], 4) == 0;
    if (!same && bad++ == 0) first = i;
  }
  for (int64_t i = n; i < n + 8; ++i)
    if (!std::isnan(got[i]) && bad++ == 0) first = i;
  INFO(isa_name(k.isa) << " dequant " << dtype_name(t) << " n " << n << " first mismatch at " << first
                       << (first >= 0 && first < n
                               ? " got " + hex_bits(&got[first], 1) + "want " + hex_bits(&ref[first], 1)
                               : std::string()));
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("gemv kernels match the double reference at every ISA level", "[cpu_kernels][gemv]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  const int64_t kCols[] = {32, 96, 4096 + 32, 11520};
  const int64_t kRows[] = {1, 7, 111, 500};
  for (DType t : kDTypes) {
    for (int64_t cols : kCols) {
      for (int64_t rows : kRows) {
        // Padded row strides on some shapes (contiguous on the rest, as matmul() passes them).
        const uint64_t pad = (cols <= 96 || rows == 7) ? 3 * static_cast<uint64_t>(dtype_block_bytes(t)) : 0;
        const Weights w = make_weights(t, rows, cols, pad);
        for (const CpuKernels* k : levels) {
          for (int nt = 1; nt <= kGemvMaxTokens; ++nt) {
            check_gemv(*k, w, nt, 0, rows);
            if (rows > 2) check_gemv(*k, w, nt, rows / 3, rows - 1);  // r0 > 0, r1 < rows
          }
        }
      }
    }
  }
}

TEST_CASE("gemv handles float rows whose length is not a multiple of the vector width", "[cpu_kernels][gemv]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t cols : {1, 7, 9, 17, 33, 1001}) {
      const Weights w = make_weights(t, 9, cols, 6);
      for (const CpuKernels* k : levels)
        for (int nt = 1; nt <= kGemvMaxTokens; ++nt) check_gemv(*k, w, nt, 1, 9);
    }
  }
}

TEST_CASE("gemv results do not depend on the weight prefetch distance", "[cpu_kernels][gemv]") {
  struct Restore {
    int64_t was = set_gemv_prefetch_bytes(-1);
    ~Restore() { set_gemv_prefetch_bytes(was); }
  } restore;
  CHECK(gemv_prefetch_bytes() == kGemvPrefetchBytes);
  CHECK(set_gemv_prefetch_bytes(64) == kGemvPrefetchBytes);
  CHECK(gemv_prefetch_bytes() == 64);
  CHECK_THROWS_AS(set_gemv_prefetch_bytes(kGemvPrefetchMax + 1), Error);
  CHECK(gemv_prefetch_bytes() == 64);
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (DType t : kDTypes) {
    // Short rows (the distance wraps into the next group at once) and long ones; a row range that
    // ends before the matrix does, so prefetches run past the rows the call reads.
    for (int64_t cols : {int64_t{64}, int64_t{4096 + 32}}) {
      const Weights w = make_weights(t, 37, cols, 0);
      const int64_t ldx = cols + 5, ldy = w.rows;
      for (int nt : {1, kGemvMaxTokens}) {
        const std::vector<float> xbuf = make_x(nt, cols, ldx);
        const float* x = xbuf.data() + 1;
        for (const CpuKernels* k : levels) {
          std::vector<float> base;
          for (int64_t d : {int64_t{0}, int64_t{64}, kGemvPrefetchBytes, kGemvPrefetchMax}) {
            set_gemv_prefetch_bytes(d);
            std::vector<float> y(static_cast<size_t>(nt * ldy), kNaN);
            k->gemv[kernel_slot(t)](w.data(), w.row_bytes, cols, 3, 30, x, ldx, nt, y.data(), ldy);
            std::string first;
            INFO(isa_name(k->isa) << " " << dtype_name(t) << " cols " << cols << " nt " << nt << " distance " << d);
            CHECK(compare_with_reference(w, x, ldx, nt, 3, 30, y, ldy, &first) == 0);
            if (base.empty()) base = y;
            else CHECK(std::memcmp(base.data(), y.data(), y.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("dequant kernels are bit-exact with core's dequantize_row", "[cpu_kernels][dequant]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (DType t : kDTypes) {
    for (int64_t n : {32, 96, 4096 + 32, 11520}) {
      // Fresh data per level, not vector-aligned (2-byte aligned: core's reference reads f16 scales and
      // values as uint16_t).
      std::vector<uint8_t> src(dtype_row_bytes(t, n) + 2);
      for (const CpuKernels* k : levels) {
        random_row(t, n, src.data() + 2);
        check_dequant(*k, t, src.data() + 2, n);
      }
    }
    if (!dtype_is_quantized(t)) {
      for (int64_t n : {1, 7, 9, 31, 33, 1001}) {
        std::vector<uint8_t> src(dtype_row_bytes(t, n) + 2);
        for (const CpuKernels* k : levels) {
          random_row(t, n, src.data() + 2);
          check_dequant(*k, t, src.data() + 2, n);
        }
      }
    }
  }
}

TEST_CASE("f16 and bf16 dequant are exact for every bit pattern", "[cpu_kernels][dequant]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);  // zeros, subnormals, inf, NaN
  for (const CpuKernels* k : levels) {
    check_dequant(*k, DType::F16, reinterpret_cast<const uint8_t*>(all.data()), 65536);
    check_dequant(*k, DType::BF16, reinterpret_cast<const uint8_t*>(all.data()), 65536);
  }
}

TEST_CASE("axpy and dot_f32 match the double reference", "[cpu_kernels][f32]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (const CpuKernels* k : levels) {
    for (int64_t n : {1, 7, 8, 31, 33, 4097, 11520}) {
      const std::vector<float> x = random_values(n + 1), y0 = random_values(n + 1);
      const float a = uniform(-2.0f, 2.0f);
      std::vector<float> y(y0.begin(), y0.end());
      y.push_back(kNaN);  // guard: must not be touched
      k->axpy(a, x.data() + 1, y.data() + 1, n);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double ref = static_cast<double>(y0[i + 1]) + static_cast<double>(a) * x[i + 1];
        const double tol = 1e-6 * (std::fabs(static_cast<double>(a) * x[i + 1]) + std::fabs(y0[i + 1]));
        if (!(std::fabs(y[i + 1] - ref) <= tol)) ++bad;
      }
      INFO(isa_name(k->isa) << " axpy n " << n);
      CHECK(bad == 0);
      CHECK(y[0] == y0[0]);
      CHECK(std::isnan(y[n + 1]));

      const std::vector<float> b = random_values(n + 1);
      double ref = 0.0, mag = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(x[i + 1]) * b[i + 1];
        mag += std::fabs(static_cast<double>(x[i + 1]) * b[i + 1]);
      }
      const float got = k->dot_f32(x.data() + 1, b.data() + 1, n);
      INFO(isa_name(k->isa) << " dot_f32 n " << n << " got " << got << " reference " << ref);
      CHECK(std::fabs(got - ref) <= kAtol + kRtol * mag);
    }
  }
}

TEST_CASE("swiglu matches the double reference at every ISA level, tails and large |gate| included", "[cpu_kernels][f32]") {
  for (const CpuKernels* k : levels_under_test()) {
    for (int64_t n : {1, 7, 8, 15, 16, 17, 33, 4097, 11520}) {
      std::vector<float> g0 = random_values(n + 1), u = random_values(n + 1);
      for (auto& v : g0) v *= 12.0f;  // sigmoid's both tails
      if (n > 8) {
        g0[1] = 95.0f;  // exp(-g) below the f32 range / exp(g) above it
        g0[2] = -95.0f;
        g0[3] = 0.0f;
        g0[4] = -0.0f;
      }
      std::vector<float> g(g0);
      g.push_back(kNaN);  // guard: must not be touched
      k->swiglu(g.data() + 1, u.data() + 1, n);
      int64_t bad = 0;
      for (int64_t i = 1; i <= n; ++i) {
        const double x = g0[static_cast<size_t>(i)];
        const double ref = x / (1.0 + std::exp(-x)) * u[static_cast<size_t>(i)];
        if (!(std::fabs(g[static_cast<size_t>(i)] - ref) <= 1e-6 * std::fabs(ref) + 1e-30)) ++bad;
      }
      INFO(isa_name(k->isa) << " swiglu n " << n);
      CHECK(bad == 0);
      CHECK(g[0] == g0[0]);
      CHECK(std::isnan(g[static_cast<size_t>(n + 1)]));
    }
  }
  // The pool form splits long rows and gives the same values.
  ThreadPool pool(2);
  const int64_t n = 100003;
  std::vector<float> a = random_values(n), b(a), u = random_values(n);
  swiglu(a.data(), u.data(), n);
  swiglu(b.data(), u.data(), n, pool);
  CHECK(a == b);
}

TEST_CASE("matmul() matches the reference on the GEMV and GEMM paths", "[cpu_kernels][matmul]") {
  IsaCapGuard guard;
  const std::vector<const CpuKernels*> levels = levels_under_test();
  ThreadPool pool(2);
  const int64_t thr = matmul_gemm_threshold();
  REQUIRE(thr > 1);
  // GEMV below the threshold (several kGemvMaxTokens chunks included), GEMM from it on.
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, thr - 1, thr, thr + 1, 33, 130};
  struct Shape2 {
    int64_t rows, cols;
  };
  for (const CpuKernels* k : levels) {
    REQUIRE(set_isa_cap(k->isa) == k->isa);
    REQUIRE(cpu_kernels().isa == k->isa);
    for (DType t : kDTypes) {
      for (Shape2 s : {Shape2{131, 1056}, Shape2{500, 96}}) {
        const Weights w = make_weights(t, s.rows, s.cols, 0);
        TensorView view;
        view.dtype = t;
        view.shape = {s.rows, s.cols};
        view.data = w.data();
        view.nbytes = static_cast<uint64_t>(s.rows) * w.row_bytes;
        for (int64_t nt : tokens) {
          const int64_t ldx = s.cols + 5, ldy = s.rows + 3;
          const std::vector<float> xbuf = make_x(nt, s.cols, ldx);
          const float* x = xbuf.data() + 1;
          std::vector<float> y(static_cast<size_t>(nt * ldy), kNaN);
          matmul(view, x, ldx, nt, y.data(), ldy, pool);
          std::string first;
          const int64_t bad = compare_with_reference(w, x, ldx, nt, 0, s.rows, y, ldy, &first);
          INFO(isa_name(k->isa) << " matmul " << dtype_name(t) << " rows " << s.rows << " cols " << s.cols << " tokens "
                                << nt << (nt < thr ? " (gemv path): " : " (gemm path): ") << first);
          CHECK(bad == 0);
        }
      }
    }
  }
}

// ---- attention() (executor/cpu/attention.h) against a double-precision reference ----------------------

struct AttnCase {
  int64_t heads, kv_heads, hd, n_tokens, pos0, kv_len;  // queries at pos0 .. pos0 + n_tokens - 1
};

// f64 softmax(q k^T / sqrt(hd)) v for every (token, head), plus the magnitude that f32 rounding is
// relative to: sum_j p_j |v_j[d]| / l (the weighted sum) times 1 + max_j sum_e |q_e k_j[e]| / sqrt(hd)
// (a score's rounding, relative to its magnitude, scales p_j by 1 + that error).
void attention_ref(const AttnCase& c, const std::vector<float>& q, const std::vector<int32_t>& pos,
                   const std::vector<float>& k, const std::vector<float>& v, std::vector<double>& out,
                   std::vector<double>& mag) {
  const int64_t hd = c.hd, group = c.heads / c.kv_heads, kvs = c.kv_heads * hd;
  out.assign(static_cast<size_t>(c.n_tokens * c.heads * hd), 0.0);
  mag = out;
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / group, n = pos[t] + 1;
      const float* qv = &q[(t * c.heads + h) * hd];
      std::vector<double> sc(static_cast<size_t>(n));
      double m = -INFINITY, l = 0.0, smag = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0.0, a = 0.0;
        for (int64_t e = 0; e < hd; ++e) {
          d += static_cast<double>(qv[e]) * k[j * kvs + g * hd + e];
          a += std::fabs(static_cast<double>(qv[e]) * k[j * kvs + g * hd + e]);
        }
        sc[j] = d / std::sqrt(static_cast<double>(hd));
        smag = std::max(smag, a / std::sqrt(static_cast<double>(hd)));
        m = std::max(m, sc[j]);
      }
      double* o = &out[(t * c.heads + h) * hd];
      double* mg = &mag[(t * c.heads + h) * hd];
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(sc[j] - m);
        l += p;
        for (int64_t e = 0; e < hd; ++e) {
          o[e] += p * v[j * kvs + g * hd + e];
          mg[e] += p * std::fabs(v[j * kvs + g * hd + e]);
        }
      }
      for (int64_t e = 0; e < hd; ++e) {
        o[e] /= l;
        mg[e] *= (1.0 + smag) / l;
      }
    }
}

// Runs attention() at every ISA level on `threads` threads and compares with the reference.
// Cache rows at and beyond the last query's position are NaN: they must never be read into a result.
void check_attention(const AttnCase& c, int threads) {
  const int64_t hd = c.hd, kvs = c.kv_heads * hd;
  std::vector<float> q = random_values(c.n_tokens * c.heads * hd);
  for (float& x : q) x *= 2.0f;  // sharper softmax
  std::vector<float> k = random_values(c.kv_len * kvs), v = random_values(c.kv_len * kvs);
  std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
  for (int64_t t = 0; t < c.n_tokens; ++t) pos[t] = static_cast<int32_t>(c.pos0 + t);
  for (int64_t j = c.pos0 + c.n_tokens; j < c.kv_len; ++j)
    for (int64_t e = 0; e < kvs; ++e) k[j * kvs + e] = v[j * kvs + e] = kNaN;
  std::vector<double> ref, mag;
  attention_ref(c, q, pos, k, v, ref, mag);
  ThreadPool pool(threads);
  IsaCapGuard guard;
  for (const CpuKernels* kern : levels_under_test()) {
    set_isa_cap(kern->isa);
    std::vector<float> out(q.size(), kNaN);
    attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), c.kv_len, {c.heads, c.kv_heads, hd}, out.data(),
              pool);
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double err = std::fabs(out[i] - ref[i]) / (kRtol * mag[i] + kAtol);
      if (!(err <= worst)) {
        worst = err;
        worst_i = i;
      }
    }
    INFO(isa_name(kern->isa) << " heads " << c.heads << "/" << c.kv_heads << " head_dim " << hd << " tokens "
                             << c.n_tokens << " at " << c.pos0 << " kv_len " << c.kv_len << " threads " << threads
                             << ": element " << worst_i << " got " << out[worst_i] << " reference " << ref[worst_i]
                             << " (error / tolerance " << worst << ")");
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("attention matches the double reference for every head_dim and GQA group", "[cpu_kernels][attention]") {
  // head_dim 8 .. 128 (below, at and between vector widths); groups 1..8 (and odd head counts).
  const int64_t hds[] = {8, 16, 24, 32, 40, 48, 64, 128};
  const int64_t groups[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 5}, {6, 2}, {7, 1}, {8, 1}, {12, 3}};
  for (int64_t hd : hds)
    for (const auto& g : groups) check_attention({g[0], g[1], hd, 3, 0, 3}, 2);
}

TEST_CASE("attention: prefill chunks at positions not starting at 0", "[cpu_kernels][attention]") {
  check_attention({8, 2, 64, 37, 0, 37}, 3);       // prompt, causal inside one chunk
  check_attention({6, 3, 48, 21, 50, 71}, 2);      // second chunk over a cached prefix
  check_attention({4, 1, 24, 100, 129, 300}, 4);   // many token blocks; cache longer than used
  check_attention({32, 8, 128, 70, 1000, 1070}, 3);  // nemo8b-like heads
  check_attention({3, 3, 16, 9, 4000, 4009}, 1);   // short chunk over a long cache: key range split
}

TEST_CASE("attention: decode over long contexts with many threads", "[cpu_kernels][attention]") {
  for (int threads : {1, 2, 5, 16}) {
    check_attention({32, 8, 128, 1, 4999, 5000}, threads);
    check_attention({7, 1, 40, 2, 9000, 9100}, threads);
  }
  check_attention({2, 2, 8, 1, 20000, 20001}, 3);
  check_attention({8, 1, 128, 1, 511, 512}, 4);  // exactly one split chunk
  check_attention({8, 1, 128, 1, 512, 513}, 4);  // one key into the second chunk
}

TEST_CASE("attention results do not depend on the thread count", "[cpu_kernels][attention]") {
  const AttnCase c{8, 2, 64, 5, 3000, 3005};
  const int64_t hd = c.hd, kvs = c.kv_heads * hd;
  const std::vector<float> q = random_values(c.n_tokens * c.heads * hd), k = random_values(c.kv_len * kvs),
                           v = random_values(c.kv_len * kvs);
  std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
  for (int64_t t = 0; t < c.n_tokens; ++t) pos[t] = static_cast<int32_t>(c.pos0 + t);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<float> out(q.size(), kNaN);
    attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), c.kv_len, {c.heads, c.kv_heads, hd}, out.data(),
              pool);
    if (first.empty())
      first = out;
    else
      CHECK(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)) == 0);
  }
}

// The host KV cache keeps each KV head's rows contiguous (head_major) with a capacity beyond the
// filled positions; attention over that layout must give the same bits as over rows side by side.
TEST_CASE("attention: head-major caches give the same results as rows of all heads side by side",
          "[cpu_kernels][attention]") {
  struct Case {
    int64_t heads, kv_heads, hd, n_tokens, pos0, capacity;
  };
  for (const Case& c : {Case{32, 8, 128, 1, 3000, 4096}, Case{8, 2, 40, 37, 0, 64}, Case{6, 3, 48, 21, 50, 100},
                        Case{7, 1, 24, 2, 9000, 9002}, Case{4, 4, 8, 5, 600, 605}}) {
    const int64_t hd = c.hd, kvs = c.kv_heads * hd, kv_len = c.pos0 + c.n_tokens;
    const std::vector<float> q = random_values(c.n_tokens * c.heads * hd), k = random_values(kv_len * kvs),
                             v = random_values(kv_len * kvs);
    // The same keys and values, head-major over `capacity` positions; the rows past kv_len are NaN.
    std::vector<float> kh(static_cast<size_t>(c.kv_heads * c.capacity * hd), kNaN), vh(kh.size(), kNaN);
    for (int64_t g = 0; g < c.kv_heads; ++g)
      for (int64_t j = 0; j < kv_len; ++j)
        for (int64_t e = 0; e < hd; ++e) {
          kh[static_cast<size_t>((g * c.capacity + j) * hd + e)] = k[static_cast<size_t>(j * kvs + g * hd + e)];
          vh[static_cast<size_t>((g * c.capacity + j) * hd + e)] = v[static_cast<size_t>(j * kvs + g * hd + e)];
        }
    std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
    for (int64_t t = 0; t < c.n_tokens; ++t) pos[t] = static_cast<int32_t>(c.pos0 + t);
    ThreadPool pool(3);
    std::vector<float> side(q.size(), kNaN), major(q.size(), kNaN);
    const AttentionShape shape{c.heads, c.kv_heads, hd};
    attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), kv_len, shape, side.data(), pool);
    attention(q.data(), c.n_tokens, pos.data(), kh.data(), vh.data(), kv_len, head_major(shape, c.capacity),
              major.data(), pool);
    INFO("heads " << c.heads << "/" << c.kv_heads << " head_dim " << hd << " tokens " << c.n_tokens << " at " << c.pos0);
    CHECK(std::all_of(side.begin(), side.end(), [](float x) { return std::isfinite(x); }));
    CHECK(std::memcmp(side.data(), major.data(), side.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("set_isa_cap caps active_isa() and the dispatched table", "[cpu_kernels][isa]") {
  IsaCapGuard guard;
  const Isa env = env_isa_cap();
  INFO("cpu max " << isa_name(cpu_max_isa()) << ", SHARDWISE_ISA cap " << isa_name(env));
  CHECK(set_isa_cap(Isa::Avx512) == min_isa(cpu_max_isa(), env));
  for (Isa cap : kIsas) {
    const Isa expect = min_isa(min_isa(cpu_max_isa(), env), cap);
    CHECK(set_isa_cap(cap) == expect);
    CHECK(active_isa() == expect);
    // cpu_kernels() serves the capped level (or the next lower one compiled in).
    CHECK(static_cast<int>(cpu_kernels().isa) <= static_cast<int>(expect));
    if (cpu_kernels_for(expect) != nullptr) CHECK(cpu_kernels().isa == expect);
  }
}

// Run in a child process by the test below, with SHARDWISE_ISA set: the variable is read once per
// process, so only a fresh process shows its effect.
TEST_CASE("isa probe (child process of the SHARDWISE_ISA test)", "[.][isa_probe]") {
  const Isa expect = min_isa(cpu_max_isa(), env_isa_cap());
  INFO("SHARDWISE_ISA=" << (std::getenv("SHARDWISE_ISA") ? std::getenv("SHARDWISE_ISA") : "(unset)"));
  CHECK(active_isa() == expect);
  if (cpu_kernels_for(expect) != nullptr) CHECK(cpu_kernels().isa == expect);
  CHECK(set_isa_cap(Isa::Avx512) == expect);  // a programmatic cap cannot raise the level
}

TEST_CASE("SHARDWISE_ISA caps active_isa() in a fresh process", "[cpu_kernels][isa]") {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(len > 0);
  self[len] = '\0';
  for (const char* v : {"scalar", "avx2", "avx512"}) {
    std::string out;
    const int rc = test::run_command(str_cat("SHARDWISE_ISA=", v, " '", self, "' '[isa_probe]'"), &out);
    INFO("SHARDWISE_ISA=" << v << ":\n" << out);
    CHECK(rc == 0);
  }
}

}  // namespace shardwise

// tests/unit/executor/test_cpu_kernels.cpp — every case of the op table (executor/ops/op_table.h) on
// the CPU kernels (kernels.h) at every ISA level this host and build offer, and on the threaded
// matmul() driver, against the f64 references (executor/reference/op_reference.h); then what is not an
// op x shape sweep: the prefetch distance, every f16/bf16 bit pattern, thread-count and cache-layout
// independence of attention, ISA dispatch. A level the host lacks is reported with a WARN line
// ("... not tested"); SHARDWISE_ISA caps the levels tested, as it caps dispatch.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
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
#include "executor/cpu/matmul.h"
#include "executor/cpu/ops.h"
#include "executor/ops/op_table.h"
#include "executor/reference/op_reference.h"
#include "test_util.h"

namespace shardwise {
namespace {

const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kRopeTheta = 1e6;  // nemo8b's and qwen3's

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
  const int64_t be = dtype_block_elems(t), bb = dtype_block_bytes(t);
  std::uniform_int_distribution<int> byte(0, 255);
  auto random_f16 = [&] { return f32_to_f16(uniform(0.001f, 0.05f) * (byte(rng()) & 1 ? 1.0f : -1.0f)); };
  for (int64_t b = 0; b < n / be; ++b) {
    uint8_t* blk = dst + b * bb;
    if (be == kQK_K) {
      // The K-quants: the reference quantiser's blocks of values at a scale of their own, so scales,
      // minimums and codes all vary (random bytes would make NaN of the f16 scales and minimums).
      const float a = uniform(0.05f, 2.0f);
      std::vector<float> v(static_cast<size_t>(be));
      for (float& x : v) x = uniform(-a, a);
      quantize_block(t, v.data(), blk);
      continue;
    }
    // The 32-element blocks: every code pattern, a scale (and for q4_1/q5_1 a minimum) of sane size.
    for (int64_t j = 0; j < bb; ++j) blk[j] = static_cast<uint8_t>(byte(rng()));
    const uint16_t d = random_f16();
    std::memcpy(blk, &d, 2);
    if (t == DType::Q4_1 || t == DType::Q5_1) {
      const uint16_t m = random_f16();
      std::memcpy(blk + 2, &m, 2);
    }
  }
}

// A weight matrix with a row stride of row_bytes (>= the natural size; the gap is filled with 0xFF,
// which decodes to NaN in every dtype, so a kernel that reads past a row's end is caught).
struct Weights {
  DType dtype;
  int64_t rows, cols;
  uint64_t row_bytes;
  std::vector<uint8_t> storage;
  const uint8_t* data() const { return storage.data() + 4; }  // deliberately not 32-byte aligned
};

Weights make_weights(DType t, int64_t rows, int64_t cols, uint64_t pad_bytes) {
  Weights w{t, rows, cols, dtype_row_bytes(t, cols) + pad_bytes, {}};
  w.storage.assign(4 + static_cast<size_t>(rows) * w.row_bytes + 64, 0xFF);
  for (int64_t r = 0; r < rows; ++r) random_row(t, cols, w.storage.data() + 4 + r * w.row_bytes);
  return w;
}

// The same rows without the gaps (as matmul() reads a TensorView).
Weights contiguous(const Weights& w) {
  Weights c{w.dtype, w.rows, w.cols, dtype_row_bytes(w.dtype, w.cols), {}};
  c.storage.assign(4 + static_cast<size_t>(w.rows) * c.row_bytes + 64, 0xFF);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(c.storage.data() + 4 + r * c.row_bytes, w.data() + r * w.row_bytes, c.row_bytes);
  return c;
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

// Compares y (row stride ldy) with the reference for rows [r0, r1) and checks that every other element
// of y is still NaN. Returns the number of mismatches; describes the first one.
int64_t compare_rows(const OpCase& c, const OpReference& ref, int64_t r0, int64_t r1, const std::vector<float>& y,
                     int64_t ldy, std::string* first) {
  int64_t bad = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(t * ldy + r)];
      if (r < r0 || r >= r1) {
        if (!std::isnan(got) && bad++ == 0) *first = str_cat("wrote outside its range: y[", t, "][", r, "] = ", got);
        continue;
      }
      const size_t i = static_cast<size_t>(t * c.rows + r);
      if (!(excess(got, ref.y[i], ref.mag[i], c.tol) <= 1.0) && bad++ == 0)
        *first = str_cat("y[", t, "][", r, "] = ", got, ", reference ", ref.y[i], " (tolerance ",
                         c.tol.bound(ref.mag[i]), ")");
    }
  }
  return bad;
}

// One GEMV kernel call over rows [r0, r1), into poisoned output with strides larger than needed.
void check_gemv(const CpuKernels& k, const OpCase& c, const Weights& w, const float* x, int64_t ldx,
                const OpReference& ref, int64_t r0, int64_t r1) {
  const int64_t ldy = w.rows + 5;
  std::vector<float> y(static_cast<size_t>(c.tokens * ldy), kNaN);
  k.gemv[kernel_slot(w.dtype)](w.data(), w.row_bytes, w.cols, r0, r1, x, ldx, static_cast<int>(c.tokens), y.data(),
                               ldy);
  std::string first;
  const int64_t bad = compare_rows(c, ref, r0, r1, y, ldy, &first);
  INFO(isa_name(k.isa) << " gemv " << c.label() << " row_bytes " << w.row_bytes << " range [" << r0 << ", " << r1
                       << "): " << first);
  CHECK(bad == 0);
}

// matmul() with the ISA capped at k's level (GEMV below matmul_gemm_threshold() tokens, GEMM from it on).
void check_matmul_driver(const CpuKernels& k, const OpCase& c, const Weights& w, const float* x, int64_t ldx,
                         const OpReference& ref, ThreadPool& pool) {
  REQUIRE(set_isa_cap(k.isa) == k.isa);
  REQUIRE(cpu_kernels().isa == k.isa);
  TensorView view;
  view.dtype = w.dtype;
  view.shape = {w.rows, w.cols};
  view.data = w.data();
  view.nbytes = static_cast<uint64_t>(w.rows) * w.row_bytes;
  const int64_t ldy = w.rows + 3;
  std::vector<float> y(static_cast<size_t>(c.tokens * ldy), kNaN);
  matmul(view, x, ldx, c.tokens, y.data(), ldy, pool);
  std::string first;
  const int64_t bad = compare_rows(c, ref, 0, w.rows, y, ldy, &first);
  INFO(isa_name(k.isa) << " matmul() " << c.label()
                       << (c.tokens < matmul_gemm_threshold() ? " (gemv path): " : " (gemm path): ") << first);
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

// Dequantised values must equal the reference (core's) bit for bit (NaNs only need to stay NaN) and
// nothing past n may be written.
void check_dequant(const CpuKernels& k, DType t, const uint8_t* src, int64_t n) {
  const OpReference ref = reference_dequant(t, src, n);
  std::vector<float> got(static_cast<size_t>(n + 8), kNaN);
  k.dequant[kernel_slot(t)](src, got.data(), n);
  const Tolerance exact{0, 0, true};
  const RefCheck rc = compare_to_reference(got.data(), ref, exact);
  int64_t past = 0;
  for (int64_t i = n; i < n + 8; ++i) past += std::isnan(got[static_cast<size_t>(i)]) ? 0 : 1;
  const std::vector<float> want(ref.y.begin(), ref.y.end());
  INFO(isa_name(k.isa) << " dequant " << dtype_name(t) << " n " << n << " first mismatch at " << rc.first
                       << (rc.first >= 0 ? " got " + hex_bits(&got[static_cast<size_t>(rc.first)], 1) + "want " +
                                               hex_bits(&want[static_cast<size_t>(rc.first)], 1)
                                         : std::string())
                       << "; " << past << " written past the end");
  CHECK(rc.bad == 0);
  CHECK(past == 0);
}

// The rows' padding of a matmul case's weights: short float rows of any length get 6 bytes (rows only
// 2-byte aligned), small matrices and 7-row ones three blocks; the rest are contiguous, as matmul()
// passes them.
uint64_t row_padding(const OpCase& c) {
  if (c.cols % 32 != 0) return 6;
  if (c.cols <= 96 || c.rows == 7) return 3 * static_cast<uint64_t>(dtype_block_bytes(c.dtype));
  return 0;
}

}  // namespace

TEST_CASE("op table: matmul cases on the GEMV kernels at every ISA level and through matmul()",
          "[cpu_kernels][matmul]") {
  IsaCapGuard guard;
  const std::vector<const CpuKernels*> levels = levels_under_test();
  ThreadPool pool(2);
  const std::vector<OpCase> cases = check_cases(OpId::Matmul);
  // Cases come grouped by dtype and shape: one weight matrix per group, and activations and their
  // reference for the group's largest token count, whose first rows serve the smaller counts.
  std::unique_ptr<Weights> w, flat;
  std::vector<float> xbuf;
  OpReference ref;
  const int64_t ldx_pad = 13;
  for (size_t i = 0; i < cases.size(); ++i) {
    const OpCase& c = cases[i];
    if (!w || w->dtype != c.dtype || w->rows != c.rows || w->cols != c.cols) {
      w = std::make_unique<Weights>(make_weights(c.dtype, c.rows, c.cols, row_padding(c)));
      flat = std::make_unique<Weights>(contiguous(*w));
      int64_t most = c.tokens;
      for (size_t j = i;
           j < cases.size() && cases[j].dtype == c.dtype && cases[j].rows == c.rows && cases[j].cols == c.cols; ++j)
        most = std::max(most, cases[j].tokens);
      xbuf = make_x(most, c.cols, c.cols + ldx_pad);
      ref = reference_matmul(c.dtype, w->data(), w->row_bytes, c.rows, c.cols, xbuf.data() + 1, c.cols + ldx_pad, most);
    }
    const float* x = xbuf.data() + 1;
    const int64_t ldx = c.cols + ldx_pad;
    for (const CpuKernels* k : levels) {
      if (c.tokens <= kGemvMaxTokens) {  // the kernel itself: the whole matrix and row ranges inside it
        check_gemv(*k, c, *w, x, ldx, ref, 0, c.rows);
        if (c.rows > 1) check_gemv(*k, c, *w, x, ldx, ref, 1, c.rows);               // r0 > 0
        if (c.rows > 2) check_gemv(*k, c, *w, x, ldx, ref, c.rows / 3, c.rows - 1);  // r0 > 0, r1 < rows
      }
      // matmul() differs between levels only in the kernels it calls, which the lines above test on
      // every shape: it runs at every level on matrices of up to 2^18 weights, on the rest at the
      // highest level.
      if (c.rows * c.cols <= (int64_t{1} << 18) || k == levels.back())
        check_matmul_driver(*k, c, *flat, x, ldx, ref, pool);
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
  for (DType t : weight_dtypes()) {
    // Short rows (the distance wraps into the next group at once) and long ones; a row range that
    // ends before the matrix does, so prefetches run past the rows the call reads.
    for (int64_t cols : {int64_t{256}, int64_t{4096 + 256}}) {
      const Weights w = make_weights(t, 37, cols, 0);
      const int64_t ldx = cols + 5, ldy = w.rows;
      for (int nt : {1, kGemvMaxTokens}) {
        const std::vector<float> xbuf = make_x(nt, cols, ldx);
        const float* x = xbuf.data() + 1;
        OpCase c;
        c.op = OpId::Matmul;
        c.dtype = t;
        c.rows = w.rows;
        c.cols = cols;
        c.tokens = nt;
        c.tol = tolerance(OpId::Matmul);
        const OpReference ref = reference_matmul(t, w.data(), w.row_bytes, w.rows, cols, x, ldx, nt);
        for (const CpuKernels* k : levels) {
          std::vector<float> base;
          for (int64_t d : {int64_t{0}, int64_t{64}, kGemvPrefetchBytes, kGemvPrefetchMax}) {
            set_gemv_prefetch_bytes(d);
            std::vector<float> y(static_cast<size_t>(nt * ldy), kNaN);
            k->gemv[kernel_slot(t)](w.data(), w.row_bytes, cols, 3, 30, x, ldx, nt, y.data(), ldy);
            std::string first;
            INFO(isa_name(k->isa) << " " << dtype_name(t) << " cols " << cols << " nt " << nt << " distance " << d);
            CHECK(compare_rows(c, ref, 3, 30, y, ldy, &first) == 0);
            if (base.empty())
              base = y;
            else
              CHECK(std::memcmp(base.data(), y.data(), y.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("op table: dequant cases are bit-exact with the reference at every ISA level", "[cpu_kernels][dequant]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (const OpCase& c : check_cases(OpId::Dequant)) {
    // Fresh data per level, not vector-aligned (2-byte aligned: core's reference reads f16 scales and
    // values as uint16_t).
    std::vector<uint8_t> src(dtype_row_bytes(c.dtype, c.cols) + 2);
    for (const CpuKernels* k : levels) {
      random_row(c.dtype, c.cols, src.data() + 2);
      check_dequant(*k, c.dtype, src.data() + 2, c.cols);
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

TEST_CASE("op table: axpy and dot_f32 cases match the reference at every ISA level", "[cpu_kernels][f32]") {
  const std::vector<const CpuKernels*> levels = levels_under_test();
  for (const OpCase& c : check_cases(OpId::Axpy)) {
    const int64_t n = c.cols;
    for (const CpuKernels* k : levels) {
      const std::vector<float> x = random_values(n + 1), y0 = random_values(n + 1);
      const float a = uniform(-2.0f, 2.0f);
      std::vector<float> y(y0.begin(), y0.end());
      y.push_back(kNaN);  // guard: must not be touched
      k->axpy(a, x.data() + 1, y.data() + 1, n);
      const OpReference ref = reference_axpy(a, x.data() + 1, y0.data() + 1, n);
      const RefCheck rc = compare_to_reference(y.data() + 1, ref, c.tol);
      INFO(isa_name(k->isa) << " " << c.label() << ": " << describe(rc, y.data() + 1, ref, c.tol));
      CHECK(rc.ok());
      CHECK(y[0] == y0[0]);
      CHECK(std::isnan(y[static_cast<size_t>(n + 1)]));
    }
  }
  for (const OpCase& c : check_cases(OpId::Dot)) {
    const int64_t n = c.cols;
    for (const CpuKernels* k : levels) {
      const std::vector<float> a = random_values(n + 1), b = random_values(n + 1);
      const float got = k->dot_f32(a.data() + 1, b.data() + 1, n);
      const OpReference ref = reference_dot(a.data() + 1, b.data() + 1, n);
      INFO(isa_name(k->isa) << " " << c.label() << " got " << got << " reference " << ref.y[0]);
      CHECK(compare_to_reference(&got, ref, c.tol).ok());
    }
  }
}

TEST_CASE("op table: swiglu cases match the reference at every ISA level, tails and large |gate| included",
          "[cpu_kernels][f32]") {
  for (const CpuKernels* k : levels_under_test()) {
    for (const OpCase& c : check_cases(OpId::Swiglu)) {
      // Rows side by side behind a leading guard, the kernel called per row (its tails at the row's
      // length), a NaN guard after the last row.
      const int64_t n = c.cols, total = c.rows * n;
      std::vector<float> g0 = random_values(total + 1), u = random_values(total + 1);
      for (auto& v : g0) v *= 12.0f;  // sigmoid's both tails
      if (n > 8) {
        g0[1] = 95.0f;  // exp(-g) below the f32 range / exp(g) above it
        g0[2] = -95.0f;
        g0[3] = 0.0f;
        g0[4] = -0.0f;
      }
      std::vector<float> g(g0);
      g.push_back(kNaN);
      for (int64_t r = 0; r < c.rows; ++r) k->swiglu(g.data() + 1 + r * n, u.data() + 1 + r * n, n);
      const OpReference ref = reference_swiglu(g0.data() + 1, u.data() + 1, total);
      const RefCheck rc = compare_to_reference(g.data() + 1, ref, c.tol);
      INFO(isa_name(k->isa) << " " << c.label() << ": " << describe(rc, g.data() + 1, ref, c.tol));
      CHECK(rc.ok());
      CHECK(g[0] == g0[0]);
      CHECK(std::isnan(g[static_cast<size_t>(total + 1)]));
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

TEST_CASE("op table: rms_norm cases match the reference at every ISA level", "[cpu_kernels][f32]") {
  IsaCapGuard guard;
  for (const CpuKernels* k : levels_under_test()) {
    REQUIRE(set_isa_cap(k->isa) == k->isa);
    for (const OpCase& c : check_cases(OpId::RmsNorm)) {
      const std::vector<float> x = random_values(c.rows * c.cols), w = random_values(c.cols);
      std::vector<float> y(x.size() + 1, kNaN), inplace(x);
      rms_norm(x.data(), w.data(), 1e-5f, y.data(), c.rows, c.cols);
      rms_norm(inplace.data(), w.data(), 1e-5f, inplace.data(), c.rows, c.cols);  // y may alias x
      const OpReference ref = reference_rms_norm(x.data(), w.data(), 1e-5f, c.rows, c.cols);
      const RefCheck rc = compare_to_reference(y.data(), ref, c.tol);
      INFO(isa_name(k->isa) << " " << c.label() << ": " << describe(rc, y.data(), ref, c.tol));
      CHECK(rc.ok());
      CHECK(std::isnan(y.back()));
      CHECK(std::memcmp(inplace.data(), y.data(), x.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("op table: rope cases match the reference in both pairings", "[cpu_kernels][f32]") {
  for (const OpCase& c : check_cases(OpId::Rope)) {
    for (RopeStyle style : {RopeStyle::Neox, RopeStyle::Normal}) {
      const int64_t width = c.heads * c.head_dim, stride = width + 3;  // rows of the fused qkv: wider than the heads
      const std::vector<float> x = random_values(c.tokens * width);
      std::vector<float> rows(static_cast<size_t>(c.tokens * stride), kNaN);
      for (int64_t t = 0; t < c.tokens; ++t)
        std::copy(x.begin() + t * width, x.begin() + (t + 1) * width, rows.begin() + t * stride);
      std::vector<int32_t> pos(static_cast<size_t>(c.tokens));
      for (int64_t t = 0; t < c.tokens; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(c.pos0 + t);
      RopeAngles angles;
      angles.compute(pos.data(), c.tokens, c.head_dim, kRopeTheta);
      rope(rows.data(), c.tokens, c.heads, c.head_dim, angles, style, stride);
      std::vector<float> got(x.size());
      bool gap_untouched = true;
      for (int64_t t = 0; t < c.tokens; ++t) {
        std::copy(rows.begin() + t * stride, rows.begin() + t * stride + width, got.begin() + t * width);
        for (int64_t i = width; i < stride; ++i) gap_untouched &= std::isnan(rows[static_cast<size_t>(t * stride + i)]);
      }
      const OpReference ref = reference_rope(x.data(), pos.data(), c.tokens, c.heads, c.head_dim, kRopeTheta, style);
      const RefCheck rc = compare_to_reference(got.data(), ref, c.tol);
      INFO(c.label() << (style == RopeStyle::Neox ? " neox: " : " normal: ") << describe(rc, got.data(), ref, c.tol));
      CHECK(rc.ok());
      CHECK(gap_untouched);
    }
  }
}

namespace {

// A case's inputs and reference, kept while cases differ only in their threads. Cache rows at and
// beyond the last query's position are NaN: they must never be read into a result. k and v are the
// values the caches hold (a q8_0 cache's dequantised), k_bits and v_bits the caches in the case's type.
struct AttnData {
  OpCase shape;
  std::vector<float> q, k, v;
  std::vector<uint8_t> k_bits, v_bits;
  std::vector<int32_t> pos;
  OpReference ref;
};

bool same_attention(const OpCase& a, const OpCase& b) {
  return a.heads == b.heads && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.tokens == b.tokens &&
         a.pos0 == b.pos0 && a.kv_len == b.kv_len && a.dtype == b.dtype;
}

void make_attention_data(const OpCase& c, AttnData* d) {
  const int64_t hd = c.head_dim, kvs = c.kv_heads * hd;
  d->shape = c;
  d->q = random_values(c.tokens * c.heads * hd);
  for (float& x : d->q) x *= 2.0f;  // sharper softmax
  d->k = random_values(c.kv_len * kvs);
  d->v = random_values(c.kv_len * kvs);
  d->pos.resize(static_cast<size_t>(c.tokens));
  for (int64_t t = 0; t < c.tokens; ++t) d->pos[static_cast<size_t>(t)] = static_cast<int32_t>(c.pos0 + t);
  d->k_bits = test::kv_cache_of(c.dtype, d->k, kvs, c.pos0 + c.tokens);
  d->v_bits = test::kv_cache_of(c.dtype, d->v, kvs, c.pos0 + c.tokens);
  d->ref =
      reference_attention(d->q.data(), c.tokens, d->pos.data(), d->k.data(), d->v.data(), {c.heads, c.kv_heads, hd});
}

// attention() at every ISA level on the case's threads against the reference.
void check_attention(const OpCase& c, const AttnData& d) {
  AttentionShape shape{c.heads, c.kv_heads, c.head_dim};
  shape.kv_dtype = c.dtype;
  ThreadPool pool(c.threads > 0 ? c.threads : 2);
  IsaCapGuard guard;
  for (const CpuKernels* kern : levels_under_test()) {
    set_isa_cap(kern->isa);
    std::vector<float> out(d.q.size(), kNaN);
    attention(d.q.data(), c.tokens, d.pos.data(), d.k_bits.data(), d.v_bits.data(), c.kv_len, shape, out.data(), pool);
    const RefCheck rc = compare_to_reference(out.data(), d.ref, c.tol);
    INFO(isa_name(kern->isa) << " " << c.label() << " on " << pool.size()
                             << " threads: " << describe(rc, out.data(), d.ref, c.tol));
    CHECK(rc.ok());
  }
}

}  // namespace

TEST_CASE("op table: attention cases match the reference at every ISA level", "[cpu_kernels][attention]") {
  AttnData d;
  for (const OpCase& c : check_cases(OpId::Attention)) {
    if (d.q.empty() || !same_attention(d.shape, c)) make_attention_data(c, &d);
    check_attention(c, d);
  }
}

TEST_CASE("attention results do not depend on the thread count", "[cpu_kernels][attention]") {
  const int64_t heads = 8, kv_heads = 2, hd = 64, n = 5, pos0 = 3000, kv_len = 3005, kvs = kv_heads * hd;
  const std::vector<float> q = random_values(n * heads * hd), k = random_values(kv_len * kvs),
                           v = random_values(kv_len * kvs);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + t);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<float> out(q.size(), kNaN);
    attention(q.data(), n, pos.data(), k.data(), v.data(), kv_len, {heads, kv_heads, hd}, out.data(), pool);
    if (first.empty())
      first = out;
    else
      CHECK(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)) == 0);
  }
}

// A batch of sequences in one call (decode tokens and a prefill chunk, short and long contexts, some
// splitting their key ranges) gives every sequence the bits it gets alone.
TEST_CASE("attention_segments: each sequence of a batch gets the bits of attention() alone",
          "[cpu_kernels][attention]") {
  const int64_t heads = 8, kv_heads = 2, hd = 64, kvs = kv_heads * hd;
  struct Seq {
    int64_t n, pos0;
  };
  const std::vector<Seq> seqs = {{1, 3000}, {7, 0}, {1, 40}, {1, 1600}, {12, 900}};
  int64_t total = 0;
  for (const Seq& q : seqs) total += q.n;
  const std::vector<float> q = random_values(total * heads * hd);
  std::vector<std::vector<float>> k, v;
  std::vector<int32_t> pos;
  std::vector<AttentionSegment> segs;
  for (const Seq& sq : seqs) {
    k.push_back(random_values((sq.pos0 + sq.n) * kvs));
    v.push_back(random_values((sq.pos0 + sq.n) * kvs));
    segs.push_back({static_cast<int64_t>(pos.size()), sq.n, k.back().data(), v.back().data(), sq.pos0 + sq.n});
    for (int64_t t = 0; t < sq.n; ++t) pos.push_back(static_cast<int32_t>(sq.pos0 + t));
  }
  const AttentionShape shape{heads, kv_heads, hd};
  ThreadPool pool(3);
  std::vector<float> batched(q.size(), kNaN), alone(q.size(), kNaN);
  attention_segments(q.data(), pos.data(), segs, shape, batched.data(), pool);
  const int64_t qs = heads * hd;
  for (const AttentionSegment& g : segs)
    attention(q.data() + g.t0 * qs, g.n, pos.data() + g.t0, g.k, g.v, g.kv_len, shape, alone.data() + g.t0 * qs, pool);
  CHECK(std::all_of(alone.begin(), alone.end(), [](float x) { return std::isfinite(x); }));
  CHECK(std::memcmp(batched.data(), alone.data(), alone.size() * sizeof(float)) == 0);
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
    INFO("heads " << c.heads << "/" << c.kv_heads << " head_dim " << hd << " tokens " << c.n_tokens << " at "
                  << c.pos0);
    CHECK(std::all_of(side.begin(), side.end(), [](float x) { return std::isfinite(x); }));
    CHECK(std::memcmp(side.data(), major.data(), side.size() * sizeof(float)) == 0);
    // The reference reads the head-major layout too.
    const OpReference ref =
        reference_attention(q.data(), c.n_tokens, pos.data(), kh.data(), vh.data(), head_major(shape, c.capacity));
    CHECK(compare_to_reference(major.data(), ref, tolerance(OpId::Attention)).ok());
  }
}

// A 16-bit cache's rows are widened to f32 as they are loaded, a q8_0 cache's tiles dequantised (exactly)
// to f32 rows, and everything after is the f32 code: at every ISA level, attention over f16, bf16 or
// q8_0 K and V gives the bits of attention over f32 copies of the same rounded (dequantised) values, in
// both layouts, with head_dim tails (8, 24, 40, 100; q8_0 takes the head_dims of whole blocks, 32 to
// 128), split key ranges and partial key tiles, and stays within the attention tolerance of the f64
// reference over those values.
TEST_CASE(
    "attention: f16, bf16 and q8_0 caches give the bits of f32 caches holding the same values, at every ISA level",
    "[cpu_kernels][attention][kv_f16]") {
  struct Case {
    int64_t heads, kv_heads, hd, n_tokens, pos0, capacity;
  };
  IsaCapGuard guard;
  for (DType kv : {DType::F16, DType::BF16, DType::Q8_0})
    for (const Case& c : {Case{8, 2, 64, 1, 1500, 0}, Case{8, 2, 40, 37, 0, 64}, Case{6, 3, 24, 5, 700, 800},
                          Case{4, 1, 100, 3, 20, 0}, Case{4, 4, 8, 9, 600, 609}, Case{32, 8, 128, 2, 90, 128},
                          Case{6, 2, 96, 21, 50, 100}, Case{4, 1, 32, 1, 700, 0}}) {
      if (c.hd % dtype_block_elems(kv) != 0) continue;  // q8_0: head_dims of whole blocks only
      const int64_t hd = c.hd, kv_len = c.pos0 + c.n_tokens;
      const int64_t rows = c.capacity > 0 ? c.kv_heads * c.capacity : kv_len * c.kv_heads;  // KV rows of hd
      const std::vector<float> q = random_values(c.n_tokens * c.heads * hd);
      std::vector<float> k = random_values(rows * hd), v = random_values(rows * hd);
      for (float& x : k) x *= 3.0f;  // sharper softmax
      // The caches, and in k and v the same values in f32.
      const std::vector<uint8_t> kh = test::kv_cache_of(kv, k, hd, rows), vh = test::kv_cache_of(kv, v, hd, rows);
      std::vector<int32_t> pos(static_cast<size_t>(c.n_tokens));
      for (int64_t t = 0; t < c.n_tokens; ++t) pos[t] = static_cast<int32_t>(c.pos0 + t);
      AttentionShape shape{c.heads, c.kv_heads, hd};
      if (c.capacity > 0) shape = head_major(shape, c.capacity);
      AttentionShape half = shape;
      half.kv_dtype = kv;
      const OpReference ref = reference_attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), shape);
      ThreadPool pool(2);
      for (const CpuKernels* kern : levels_under_test()) {
        set_isa_cap(kern->isa);
        std::vector<float> f32(q.size(), kNaN), f16(q.size(), kNaN);
        attention(q.data(), c.n_tokens, pos.data(), k.data(), v.data(), kv_len, shape, f32.data(), pool);
        attention(q.data(), c.n_tokens, pos.data(), kh.data(), vh.data(), kv_len, half, f16.data(), pool);
        INFO(isa_name(kern->isa) << " " << dtype_name(kv) << " heads " << c.heads << "/" << c.kv_heads << " head_dim "
                                 << hd << " tokens " << c.n_tokens << " at " << c.pos0 << " capacity " << c.capacity);
        CHECK(std::all_of(f16.begin(), f16.end(), [](float x) { return std::isfinite(x); }));
        CHECK(std::memcmp(f32.data(), f16.data(), f32.size() * sizeof(float)) == 0);
        CHECK(compare_to_reference(f16.data(), ref, tolerance(OpId::Attention)).ok());
      }
    }
}

TEST_CASE(
    "attention: a cache type other than f32, f16, bf16 or q8_0 is an error, as a q8_0 cache of a head_dim "
    "not a multiple of 32",
    "[cpu_kernels][attention][kv_f16]") {
  const std::vector<float> q = random_values(48), kv = random_values(48);
  const int32_t pos = 0;
  std::vector<float> out(48);
  ThreadPool pool(1);
  AttentionShape shape{1, 1, 8};
  shape.kv_dtype = DType::Q4_0;
  CHECK_THROWS_WITH(attention(q.data(), 1, &pos, kv.data(), kv.data(), 1, shape, out.data(), pool),
                    Catch::Matchers::Contains("q4_0"));
  shape.head_dim = 48;
  shape.kv_dtype = DType::Q8_0;
  CHECK_THROWS_WITH(attention(q.data(), 1, &pos, kv.data(), kv.data(), 1, shape, out.data(), pool),
                    Catch::Matchers::Contains("q8_0") && Catch::Matchers::Contains("head_dim is 48") &&
                        Catch::Matchers::Contains("multiple of 32"));
  shape.kv_dtype = DType::F16;
  CHECK_THROWS_WITH(reference_attention(q.data(), 1, &pos, kv.data(), kv.data(), shape),
                    Catch::Matchers::Contains("f32"));
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

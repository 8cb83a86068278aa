// executor/cpu/kernels_scalar.cpp — portable kernels: the fallback level and the baseline that the
// SIMD levels are compared with. Plain loops with f32 accumulation. Also the level dispatcher and the
// GEMV prefetch distance's setting (kernels.h).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

template <DType T>
void gemv_scalar(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                 int nt, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(T, static_cast<const uint8_t*>(w) + static_cast<uint64_t>(r) * row_bytes, row.data(), cols);
    for (int t = 0; t < nt; ++t) {
      const float* xt = x + t * ldx;
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) acc += row[c] * xt[c];
      y[t * ldy + r] = acc;
    }
  }
}

template <DType T>
void dequant_scalar(const void* src, float* dst, int64_t n) {
  dequantize_row(T, src, dst, n);
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Attention tile kernel (kernels_attention.h) on one-lane "vectors".
struct ScalarAttn {
  using V = float;
  static constexpr int kW = 1, kKB = 1, kCH = 1;
  static V zero() { return 0.0f; }
  static V load(const float* p) { return *p; }
  static V loadm(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static V loadh(const uint16_t* p) { return f16_to_f32(*p); }
  static V loadhm(const uint16_t* p, int n) { return n > 0 ? f16_to_f32(*p) : 0.0f; }
  static V loadb(const uint16_t* p) { return bf16_to_f32(*p); }
  static V loadbm(const uint16_t* p, int n) { return n > 0 ? bf16_to_f32(*p) : 0.0f; }
  static void store(float* p, V v) { *p = v; }
  static void storem(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  static V set1(float x) { return x; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return a > b ? a : b; }
  // Always fused: whether the compiler contracts a * b + c may differ between the f32 and f16 row
  // instantiations, which must give the same bits for the same values.
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V exp(V x) { return std::exp(x); }
  static float exp1(float x) { return std::exp(x); }
  static float hsum(V v) { return v; }
  static float hmax(V v) { return v; }
  static void reduce(const V* a, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = a[i];
  }
};

}  // namespace
}  // namespace shardwise

#include "executor/cpu/kernels_attention.h"

namespace shardwise {
namespace {

void attn_scalar(const AttnArgs& a) {
  attn_impl::attn<ScalarAttn>(a);
}

void swiglu_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

const CpuKernels kScalar = {
    Isa::Scalar,
    {gemv_scalar<DType::F32>, gemv_scalar<DType::F16>, gemv_scalar<DType::BF16>, gemv_scalar<DType::Q8_0>,
     gemv_scalar<DType::Q4_0>, gemv_scalar<DType::Q4_1>, gemv_scalar<DType::Q5_0>, gemv_scalar<DType::Q5_1>,
     gemv_scalar<DType::IQ4_NL>, gemv_scalar<DType::Q2_K>, gemv_scalar<DType::Q3_K>, gemv_scalar<DType::Q4_K>,
     gemv_scalar<DType::Q5_K>, gemv_scalar<DType::Q6_K>},
    {dequant_scalar<DType::F32>, dequant_scalar<DType::F16>, dequant_scalar<DType::BF16>, dequant_scalar<DType::Q8_0>,
     dequant_scalar<DType::Q4_0>, dequant_scalar<DType::Q4_1>, dequant_scalar<DType::Q5_0>, dequant_scalar<DType::Q5_1>,
     dequant_scalar<DType::IQ4_NL>, dequant_scalar<DType::Q2_K>, dequant_scalar<DType::Q3_K>,
     dequant_scalar<DType::Q4_K>, dequant_scalar<DType::Q5_K>, dequant_scalar<DType::Q6_K>},
    axpy_scalar,
    dot_scalar,
    attn_scalar,
    swiglu_scalar,
};

}  // namespace

const CpuKernels* scalar_kernels() {
  return &kScalar;
}

namespace {

std::atomic<int64_t> g_prefetch_override{-1};

}  // namespace

int64_t gemv_prefetch_bytes() {
  const int64_t set = g_prefetch_override.load(std::memory_order_relaxed);
  return set >= 0 ? set : kGemvPrefetchBytes;
}

int64_t set_gemv_prefetch_bytes(int64_t bytes) {
  SW_CHECK(bytes <= kGemvPrefetchMax, "GEMV prefetch distance ", bytes, " bytes is over ", kGemvPrefetchMax);
  const int64_t old = gemv_prefetch_bytes();
  g_prefetch_override.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
  return old;
}

const CpuKernels* cpu_kernels_for(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(cpu_max_isa())) return nullptr;
  switch (isa) {
    case Isa::Scalar:
      return scalar_kernels();
    case Isa::Avx2:
      return avx2_kernels();
    case Isa::Avx512:
      return avx512_kernels();
  }
  return nullptr;
}

const CpuKernels& cpu_kernels() {
  for (int level = static_cast<int>(active_isa()); level >= 0; --level)
    if (const CpuKernels* k = cpu_kernels_for(static_cast<Isa>(level))) return *k;
  return *scalar_kernels();
}

}  // namespace shardwise

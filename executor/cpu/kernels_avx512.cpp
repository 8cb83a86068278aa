// executor/cpu/kernels_avx512.cpp — AVX-512 (F/BW/VL/DQ) kernels, 16 f32 lanes; compiled with
// SHARDWISE_AVX512_FLAGS and selected only when CPUID reports AVX-512 (cpu_features.cpp).
// Same structure as kernels_avx2.cpp (read that file's notes); differences: 16 lanes, 32 registers
// allow R = 4 rows for every token count, float-row tails use masked loads, and Q4_0 nibbles are
// decoded by a 16-entry table lookup (vpermps) instead of the bias trick.
// Everything here is in an anonymous namespace and uses no inline functions from shared headers:
// an out-of-line copy compiled with AVX-512 flags could otherwise be picked by the linker for
// callers on hosts without AVX-512.
// GCC 12 warns about the deliberately undefined pass-through operand inside several AVX-512
// intrinsics (GCC bug 105593, fixed in 13); the warning is attributed to the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "executor/cpu/kernels.h"
#include "executor/cpu/kernels_blocks.h"

namespace shardwise {
namespace {

constexpr int kLanes = 16;

// Weight prefetch of the GEMV kernels: see kernels_avx2.cpp.
template <int R>
inline void prefetch_ahead(const uint8_t* p, int64_t off, int64_t row_bytes, int64_t d) {
  const int64_t ahead = off + d >= row_bytes ? d + (R - 1) * row_bytes : d;
  // As an address, not a pointer: the target may lie past the caller's buffer (a prefetch never faults).
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead)),
               _MM_HINT_T0);
}

// The first n (< 16) lanes.
inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// GCC 12's _mm512_reduce_add_ps trips -Wuninitialized; this sums the 256-bit halves, then 128, ...
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m256 h = _mm512_castps512_ps256(v);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// ---- float weight types: load kLanes elements starting at column c as f32 --------------------------

struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 load(const uint8_t* row, int64_t c) { return _mm512_loadu_ps(row + 4 * c); }
  // First n (< kLanes) elements, the rest zero; masked lanes are not read.
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) { return _mm512_maskz_loadu_ps(m, row + 4 * c); }
};

struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 load(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const uint8_t* row, int64_t c) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t c, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * c));
  }
};

template <class L, int R, int NT, int U>
inline void gemv_float_rows(const uint8_t* w, uint64_t row_bytes, int64_t cols, const float* x, int64_t ldx, float* y,
                            int64_t ldy, int64_t ahead) {
  const int64_t pf = ahead / R, rb = static_cast<int64_t>(row_bytes);
  __m512 acc[U][R][NT];
#pragma GCC unroll 16
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) acc[u][r][t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + U * kLanes <= cols; c += U * kLanes) {
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) {
      __m512 xv[NT];
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x + t * ldx + c + u * kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if (pf > 0 && (u * kLanes * L::kBytes) % 64 == 0) {
          const int64_t off = (c + u * kLanes) * L::kBytes;
          prefetch_ahead<R>(w + r * rb + off, off, rb, pf);
        }
        const __m512 wv = L::load(w + r * row_bytes, c + u * kLanes);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[u][r][t] = _mm512_fmadd_ps(wv, xv[t], acc[u][r][t]);
      }
    }
  }
  for (; c + kLanes <= cols; c += kLanes) {
    __m512 xv[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 wv = L::load(w + r * row_bytes, c);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) acc[0][r][t] = _mm512_fmadd_ps(wv, xv[t], acc[0][r][t]);
    }
  }
  if (c < cols) {
    const __mmask16 m = tail_mask(cols - c);
    __m512 xv[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 wv = L::load_tail(w + r * row_bytes, c, m);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) acc[0][r][t] = _mm512_fmadd_ps(wv, xv[t], acc[0][r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      __m512 a = acc[0][r][t];
#pragma GCC unroll 16
      for (int u = 1; u < U; ++u) a = _mm512_add_ps(a, acc[u][r][t]);
      y[t * ldy + r] = hsum(a);
    }
  }
}

template <class L, int NT>
void gemv_float_nt(const uint8_t* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x,
                   int64_t ldx, float* y, int64_t ldy) {
  // Accumulators: U*R*NT <= 16 of the 32 zmm registers.
  constexpr int R = 4;
  constexpr int U = NT == 1 ? 2 : 1;
  const int64_t ahead = gemv_prefetch_bytes();
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    gemv_float_rows<L, R, NT, U>(w + r * row_bytes, row_bytes, cols, x, ldx, y + r, ldy, ahead);
  for (; r < r1; ++r) gemv_float_rows<L, 1, NT, 2>(w + r * row_bytes, row_bytes, cols, x, ldx, y + r, ldy, ahead);
}

template <class L>
void gemv_float(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                int nt, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, uint64_t, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t);
  static constexpr Fn kByTokens[kGemvMaxTokens] = {gemv_float_nt<L, 1>, gemv_float_nt<L, 2>, gemv_float_nt<L, 3>,
                                                   gemv_float_nt<L, 4>};
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int t0 = 0; t0 < nt; t0 += kGemvMaxTokens) {
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    const int n = nt - t0 < kGemvMaxTokens ? nt - t0 : kGemvMaxTokens;
    kByTokens[n - 1](wb, row_bytes, cols, r0, r1, xt, ldx, yt, ldy);
  }
}

// ---- quantised weight types: decode one 32-element block into 2 vectors of unscaled values ----------

struct DecodeQ8_0 {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static void decode(const uint8_t* blk, __m512 q[2]) {
    const uint8_t* qs = blk + 2;
    q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
    q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
  }
};

// Byte j holds element j (low nibble) and j + 16 (high nibble). Widened to 32-bit lanes, a byte
// indexes a 16-entry table of the floats q - 8 directly: vpermps reads only the low 4 bits of each
// index, so the low nibble needs no mask, and the high nibble one shift. (3 shuffle-port uops and one
// shift per block, against an and, a shift, two conversions and the bias otherwise.)
struct DecodeQ4_0 {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
  static void decode(const uint8_t* blk, __m512 q[2]) {
    const __m512 values = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f, 3.0f,
                                         4.0f, 5.0f, 6.0f, 7.0f);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    q[0] = _mm512_permutexvar_ps(v, values);
    q[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), values);
  }
};

// Block scales are converted kScaleChunk at a time: 16-bit scalar moves into a small array, then
// one vector conversion per row, so that the block loop reads each scale with a broadcast load
// (one scale converted per block in registers costs three shuffle-port uops, the port the decode
// also needs).
// The moves for the next chunk are issued before the current chunk's blocks and converted after
// them: a vector load right after the 16-bit stores could not be forwarded from them and would stall.
constexpr int kScaleChunk = 16;

template <class D, int R>
inline void stage_scales(const uint8_t* w, uint64_t row_bytes, int64_t b0, int nb, uint16_t (*dh)[kScaleChunk]) {
  // volatile: left alone, GCC assembles these moves in registers with vpinsrw, on the shuffle port.
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const uint8_t* p = w + r * row_bytes + b0 * D::kBlockBytes;
    volatile uint16_t* out = dh[r];
    for (int j = 0; j < nb; ++j) {
      uint16_t h;
      std::memcpy(&h, p + j * D::kBlockBytes, 2);
      out[j] = h;
    }
  }
}

template <int R>
inline void convert_scales(uint16_t (*dh)[kScaleChunk], float (*ds)[kScaleChunk]) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    _mm512_store_ps(ds[r], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dh[r]))));
}

template <class D, int R, int NT>
inline void gemv_quant_rows(const uint8_t* w, uint64_t row_bytes, int64_t n_blocks, const float* x, int64_t ldx,
                            float* y, int64_t ldy, int64_t ahead) {
  const int64_t pf = ahead / R, rb = static_cast<int64_t>(row_bytes);
  alignas(64) uint16_t dh[R][kScaleChunk] = {};
  alignas(64) float ds[2][R][kScaleChunk];  // this chunk's scales and the next one's
  __m512 acc[R][NT];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  auto chunk_blocks = [n_blocks](int64_t b0) {
    return static_cast<int>(n_blocks - b0 < kScaleChunk ? n_blocks - b0 : kScaleChunk);
  };
  if (n_blocks > 0) {
    stage_scales<D, R>(w, row_bytes, 0, chunk_blocks(0), dh);
    convert_scales<R>(dh, ds[0]);
  }
  int cur = 0;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kScaleChunk, cur ^= 1) {
    const int nb = chunk_blocks(b0);
    const bool more = b0 + kScaleChunk < n_blocks;
    if (more) stage_scales<D, R>(w, row_bytes, b0 + kScaleChunk, chunk_blocks(b0 + kScaleChunk), dh);
    for (int j = 0; j < nb; ++j) {
      const int64_t b = b0 + j;
      const float* xb = x + b * 32;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = w + r * row_bytes + b * D::kBlockBytes;
        if (pf > 0) prefetch_ahead<R>(blk, b * D::kBlockBytes, rb, pf);
        __m512 q[2];
        D::decode(blk, q);
        const __m512 d = _mm512_set1_ps(ds[cur][r][j]);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
          const float* xt = xb + t * ldx;
          __m512 p = _mm512_mul_ps(q[0], _mm512_loadu_ps(xt));
          p = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(xt + 16), p);
          acc[r][t] = _mm512_fmadd_ps(p, d, acc[r][t]);
        }
      }
    }
    if (more) convert_scales<R>(dh, ds[cur ^ 1]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = hsum(acc[r][t]);
}

template <class D, int NT>
void gemv_quant_nt(const uint8_t* w, uint64_t row_bytes, int64_t n_blocks, int64_t r0, int64_t r1, const float* x,
                   int64_t ldx, float* y, int64_t ldy) {
  constexpr int R = 4;
  const int64_t ahead = gemv_prefetch_bytes();
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    gemv_quant_rows<D, R, NT>(w + r * row_bytes, row_bytes, n_blocks, x, ldx, y + r, ldy, ahead);
  for (; r < r1; ++r) gemv_quant_rows<D, 1, NT>(w + r * row_bytes, row_bytes, n_blocks, x, ldx, y + r, ldy, ahead);
}

template <class D>
void gemv_quant(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                int nt, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, uint64_t, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t);
  static constexpr Fn kByTokens[kGemvMaxTokens] = {gemv_quant_nt<D, 1>, gemv_quant_nt<D, 2>, gemv_quant_nt<D, 3>,
                                                   gemv_quant_nt<D, 4>};
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t n_blocks = cols / 32;
  for (int t0 = 0; t0 < nt; t0 += kGemvMaxTokens) {
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    const int n = nt - t0 < kGemvMaxTokens ? nt - t0 : kGemvMaxTokens;
    kByTokens[n - 1](wb, row_bytes, n_blocks, r0, r1, xt, ldx, yt, ldy);
  }
}

// ---- dequantisation (bit-exact with core's dequantize_row) -------------------------------------------

void dequant_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}

template <class L>
void dequant_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(dst + i + k * kLanes, L::load(s, i + k * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(dst + i, L::load(s, i));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, L::load_tail(s, i, m));
  }
}

template <class D>
void dequant_quant(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = s + b * D::kBlockBytes;
    __m512 q[2];
    D::decode(blk, q);
    const __m512 d = _mm512_set1_ps(half_to_float(blk));
    _mm512_storeu_ps(dst + b * 32, _mm512_mul_ps(q[0], d));
    _mm512_storeu_ps(dst + b * 32 + 16, _mm512_mul_ps(q[1], d));
  }
}

// ---- f32 vector helpers -----------------------------------------------------------------------------

void axpy_avx512(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      float* yk = y + i + k * kLanes;
      _mm512_storeu_ps(yk, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i + k * kLanes), _mm512_loadu_ps(yk)));
    }
  }
  for (; i + kLanes <= n; i += kLanes)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + k * kLanes), _mm512_loadu_ps(b + i + k * kLanes), acc[k]);
  }
  for (; i + kLanes <= n; i += kLanes) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc[0]);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc[1]);
  }
  return hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// ---- attention tile kernel (kernels_attention.h) ------------------------------------------------------

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial, about
// 1 ulp); scalef gives 0 for x below the f32 range (and for -inf).
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201E-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, fx);
}

struct Avx512Attn {
  using V = __m512;
  static constexpr int kW = kLanes, kKB = 4, kCH = 4;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V loadm(const float* p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static V loadh(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V loadhm(const uint16_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p)); }
  // bf16: the high half of an f32, widened and shifted into place (exact).
  static V loadb(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V loadbm(const uint16_t* p, int n) { return widen_bf16(_mm256_maskz_loadu_epi16(tail_mask(n), p)); }
  static V widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void storem(float* p, V v, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V exp(V x) { return exp512(x); }
  static float exp1(float x) { return _mm512_cvtss_f32(exp512(_mm512_set1_ps(x))); }
  static float hsum(V v) { return shardwise::hsum(v); }
  static float hmax(V v) {
    v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m256 h = _mm512_castps512_ps256(v);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[i] = hsum(a[i]); 16 vectors are reduced together (transposing adds, then one permute).
  static void reduce(const V* a, int n, float* out) {
    if (n != 16) {
      for (int i = 0; i < n; ++i) out[i] = hsum(a[i]);
      return;
    }
    V b[8], c[4];
    for (int k = 0; k < 8; ++k)
      b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; ++k)
      c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                           _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
    const V t0 = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    const V t1 = _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
    const V r = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
    // lane 4m + p holds the sum of a[4p + m]
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, r));
  }
};

// The K-quants' GEMV (kernels_kquants.h) on 16 lanes.
struct Avx512KQuant {
  using V = __m512;
  using VI = __m512i;
  static constexpr int kW = kLanes;
  static constexpr bool kTable16 = true;  // table16: a 16-entry lookup
  static V table16(V table, VI idx) { return _mm512_permutexvar_ps(idx, table); }
  static VI u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // A run's 16 bytes in every 128-bit quarter, and quarter q shifted by 8q more: lane 4q + i holds byte 4i + q
  // (one load that fills the lanes, and one shift, where widening takes a shuffle).
  static constexpr bool kRunOrder = false;
  static VI bytes(const uint8_t* p, int n) {
    const __m512i quarters = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i by = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    return _mm512_srlv_epi32(quarters, _mm512_add_epi32(by, _mm512_set1_epi32(n)));
  }
  // out[4q + i] = x[4i + q]: a 4 x 4 transpose, its own inverse.
  static void permute_run(const float* x, float* out) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(x)));
  }
  static VI shl(VI v, int n) { return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static VI and_(VI v, int mask) { return _mm512_and_si512(v, _mm512_set1_epi32(mask)); }
  static VI or_(VI a, VI b) { return _mm512_or_si512(a, b); }
  static V to_f(VI v) { return _mm512_cvtepi32_ps(v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static float hsum(V v) { return shardwise::hsum(v); }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
};

}  // namespace
}  // namespace shardwise

#include "executor/cpu/kernels_attention.h"
#include "executor/cpu/kernels_kquants.h"

namespace shardwise {
namespace {

void attn_avx512(const AttnArgs& a) {
  attn_impl::attn<Avx512Attn>(a);
}

// silu(g) * u with sigmoid(g) = (g < 0 ? e : 1) / (1 + e), e = exp(-|g|): the exponent stays <= 0
// (exp512's domain) and nothing overflows for large |g|.
inline __m512 swiglu512(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 s = _mm512_div_ps(_mm512_mask_blend_ps(neg, one, e), _mm512_add_ps(one, e));
  return _mm512_mul_ps(_mm512_mul_ps(g, s), u);
}

void swiglu_avx512(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    _mm512_storeu_ps(gate + i, swiglu512(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(gate + i, m, swiglu512(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

const CpuKernels kAvx512 = {
    Isa::Avx512,
    {gemv_float<LoadF32>, gemv_float<LoadF16>, gemv_float<LoadBF16>, gemv_quant<DecodeQ8_0>, gemv_quant<DecodeQ4_0>,
     SHARDWISE_BLOCK_GEMVS(dot_avx512), SHARDWISE_KQUANT_GEMVS(Avx512KQuant)},
    {dequant_f32, dequant_float<LoadF16>, dequant_float<LoadBF16>, dequant_quant<DecodeQ8_0>, dequant_quant<DecodeQ4_0>,
     SHARDWISE_BLOCK_DEQUANTS},
    axpy_avx512,
    dot_avx512,
    attn_avx512,
    swiglu_avx512,
};

}  // namespace

const CpuKernels* avx512_kernels() {
  return &kAvx512;
}

}  // namespace shardwise

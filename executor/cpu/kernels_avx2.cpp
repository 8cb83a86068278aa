// executor/cpu/kernels_avx2.cpp — AVX2+FMA+F16C kernels (the baseline SIMD level, 8 f32 lanes).
// The GEMV kernels are bandwidth kernels: each weight chunk is loaded and converted to f32 once and
// FMA'd against all nt activation vectors; R rows are processed together so that activation loads
// are shared and R*nt independent accumulators hide FMA latency. Quantised blocks accumulate an
// unscaled partial dot product and apply the block scale with one FMA per block. Activations stay
// f32 (never quantised), so results match an f32 reference to rounding.
// kernels_avx512.cpp mirrors this file at 16 lanes; keep the two in step.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "executor/cpu/kernels.h"
#include "executor/cpu/kernels_blocks.h"

namespace shardwise {
namespace {

constexpr int kLanes = 8;

// Weight prefetch of the GEMV kernels. A kernel reads R rows (row_bytes apart) side by side, then
// the next R rows: each row's reads continue in the same row of the next group. The piece at p,
// `off` bytes into its row, prefetches d = gemv_prefetch_bytes() / R further along that path, i.e.
// the group's reads run gemv_prefetch_bytes() ahead in all. The hardware prefetchers see R short
// interleaved streams that restart at every group and ramp up too late for short rows (a q4_0
// expert row is 1152 bytes); a distance within the row only (1024 bytes, before) left the decode
// q4_0 GEMV from DRAM at half its speed in cache. The last group's prefetches run past its rows,
// into memory the caller's next rows usually are (the next chunk of the same matrix).
template <int R>
inline void prefetch_ahead(const uint8_t* p, int64_t off, int64_t row_bytes, int64_t d) {
  const int64_t ahead = off + d >= row_bytes ? d + (R - 1) * row_bytes : d;
  // As an address, not a pointer: the target may lie past the caller's buffer (a prefetch never faults).
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead)),
               _MM_HINT_T0);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
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
  static __m256 load(const uint8_t* row, int64_t c) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c); }
  static float load1(const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  }
};

struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
  static float load1(const uint8_t* row, int64_t c) { return half_to_float(row + 2 * c); }
};

// bf16 is the high half of an f32: widen to 32 bits and shift into place (exact).
struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m256 load(const uint8_t* row, int64_t c) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float load1(const uint8_t* row, int64_t c) {
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// R rows starting at `w` (row stride row_bytes) times NT activation rows; U vectors per step per
// (row, token) so that NT == 1 still has U*R independent FMA chains. y points at the first row.
template <class L, int R, int NT, int U>
inline void gemv_float_rows(const uint8_t* w, uint64_t row_bytes, int64_t cols, const float* x, int64_t ldx, float* y,
                            int64_t ldy, int64_t ahead) {
  const int64_t pf = ahead / R, rb = static_cast<int64_t>(row_bytes);
  __m256 acc[U][R][NT];
#pragma GCC unroll 16
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) acc[u][r][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + U * kLanes <= cols; c += U * kLanes) {
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) {
      __m256 xv[NT];
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + c + u * kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if (pf > 0 && (u * kLanes * L::kBytes) % 64 == 0) {
          const int64_t off = (c + u * kLanes) * L::kBytes;
          prefetch_ahead<R>(w + r * rb + off, off, rb, pf);
        }
        const __m256 wv = L::load(w + r * row_bytes, c + u * kLanes);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[u][r][t] = _mm256_fmadd_ps(wv, xv[t], acc[u][r][t]);
      }
    }
  }
  for (; c + kLanes <= cols; c += kLanes) {
    __m256 xv[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 wv = L::load(w + r * row_bytes, c);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) acc[0][r][t] = _mm256_fmadd_ps(wv, xv[t], acc[0][r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
      __m256 a = acc[0][r][t];
#pragma GCC unroll 16
      for (int u = 1; u < U; ++u) a = _mm256_add_ps(a, acc[u][r][t]);
      float s = hsum(a);
      for (int64_t cc = c; cc < cols; ++cc) s += L::load1(w + r * row_bytes, cc) * x[t * ldx + cc];
      y[t * ldy + r] = s;
    }
  }
}

template <class L, int NT>
void gemv_float_nt(const uint8_t* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x,
                   int64_t ldx, float* y, int64_t ldy) {
  // Accumulators: U*R*NT <= 8 of the 16 ymm registers.
  constexpr int R = NT <= 2 ? 4 : 2;
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

// ---- quantised weight types -------------------------------------------------------------------------
// decode() gives the 32 values of a block as 4 vectors, unscaled. Q4_0's decode_biased() gives q + 8
// (the stored nibble) instead: the kernel subtracts 8 * x once per call (see gemv_quant), which saves
// four integer subtractions per block and row.

struct DecodeQ8_0 {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static constexpr bool kBiased = false;
  static void decode(const uint8_t* blk, __m256 q[4]) {
    const uint8_t* qs = blk + 2;
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * k))));
  }
  static void decode_biased(const uint8_t* blk, __m256 q[4]) {
    decode(blk, q);
  }
};

// Byte j holds element j (low nibble) and element j + 16 (high nibble). Widening bytes 0..7 and
// 8..15 to 32-bit lanes first lets one AND / one shift extract each half without shuffles.
struct DecodeQ4_0 {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr bool kBiased = true;
  static void decode_biased(const uint8_t* blk, __m256 q[4]) {
    const uint8_t* qs = blk + 2;
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const __m256i m = _mm256_set1_epi32(0x0F);
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(v0, m));
    q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(v1, m));
    q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
    q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
  }
  static void decode(const uint8_t* blk, __m256 q[4]) {
    decode_biased(blk, q);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) q[k] = _mm256_sub_ps(q[k], _mm256_set1_ps(8.0f));
  }
};

// Block scales are converted kScaleChunk at a time: 16-bit scalar moves into a small array, then
// two vector conversions per row, so that the block loop reads each scale with a broadcast load
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
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(ds[r], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh[r]))));
    _mm256_store_ps(ds[r] + 8, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh[r] + 8))));
  }
}

// xs (when D::kBiased): per token t and block b, 8 lanes holding 8 * (x[32b + i] + x[32b + 8 + i] +
// x[32b + 16 + i] + x[32b + 24 + i]), so that a fused multiply-subtract of the biased values against
// x yields (q - 8) * x summed by lane.
template <class D, int R, int NT>
inline void gemv_quant_rows(const uint8_t* w, uint64_t row_bytes, int64_t n_blocks, const float* x, int64_t ldx,
                            const float* xs, float* y, int64_t ldy, int64_t ahead) {
  const int64_t pf = ahead / R, rb = static_cast<int64_t>(row_bytes);
  alignas(64) uint16_t dh[R][kScaleChunk] = {};
  alignas(64) float ds[2][R][kScaleChunk];  // this chunk's scales and the next one's
  __m256 acc[R][NT];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
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
        __m256 q[4];
        if constexpr (D::kBiased)
          D::decode_biased(blk, q);
        else
          D::decode(blk, q);
        const __m256 d = _mm256_set1_ps(ds[cur][r][j]);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) {
          const float* xt = xb + t * ldx;
          __m256 p;
          if constexpr (D::kBiased)
            p = _mm256_fmsub_ps(q[0], _mm256_loadu_ps(xt), _mm256_load_ps(xs + (t * n_blocks + b) * kLanes));
          else
            p = _mm256_mul_ps(q[0], _mm256_loadu_ps(xt));
          p = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xt + 8), p);
          p = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xt + 16), p);
          p = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xt + 24), p);
          acc[r][t] = _mm256_fmadd_ps(p, d, acc[r][t]);
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
                   int64_t ldx, const float* xs, float* y, int64_t ldy) {
  constexpr int R = NT <= 2 ? 4 : 2;
  const int64_t ahead = gemv_prefetch_bytes();
  int64_t r = r0;
  for (; r + R <= r1; r += R)
    gemv_quant_rows<D, R, NT>(w + r * row_bytes, row_bytes, n_blocks, x, ldx, xs, y + r, ldy, ahead);
  for (; r < r1; ++r) gemv_quant_rows<D, 1, NT>(w + r * row_bytes, row_bytes, n_blocks, x, ldx, xs, y + r, ldy, ahead);
}

// Per-thread scratch for the xs sums: grows to the largest call, freed at thread exit.
struct XsScratch {
  float* data = nullptr;
  int64_t floats = 0;
  ~XsScratch() { _mm_free(data); }
  float* get(int64_t n) {
    if (floats < n) {
      _mm_free(data);
      data = static_cast<float*>(_mm_malloc(static_cast<size_t>(n) * sizeof(float), 64));
      floats = data ? n : 0;
      if (!data) throw std::bad_alloc();
    }
    return data;
  }
};
thread_local XsScratch t_xs;

const float* bias_sums(const float* x, int64_t ldx, int nt, int64_t n_blocks) {
  float* xs = t_xs.get(nt * n_blocks * kLanes);
  const __m256 e8 = _mm256_set1_ps(8.0f);
  for (int t = 0; t < nt; ++t)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* xb = x + t * ldx + b * 32;
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
      _mm256_store_ps(xs + (t * n_blocks + b) * kLanes, _mm256_mul_ps(e8, s));
    }
  return xs;
}

template <class D>
void gemv_quant(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                int nt, float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, uint64_t, int64_t, int64_t, int64_t, const float*, int64_t, const float*, float*,
                      int64_t);
  static constexpr Fn kByTokens[kGemvMaxTokens] = {gemv_quant_nt<D, 1>, gemv_quant_nt<D, 2>, gemv_quant_nt<D, 3>,
                                                   gemv_quant_nt<D, 4>};
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t n_blocks = cols / 32;
  for (int t0 = 0; t0 < nt; t0 += kGemvMaxTokens) {
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    const int n = std::min(nt - t0, kGemvMaxTokens);
    const float* xs = D::kBiased ? bias_sums(xt, ldx, n, n_blocks) : nullptr;
    kByTokens[n - 1](wb, row_bytes, n_blocks, r0, r1, xt, ldx, xs, yt, ldy);
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
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(dst + i + k * kLanes, L::load(s, i + k * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(dst + i, L::load(s, i));
  for (; i < n; ++i) dst[i] = L::load1(s, i);
}

template <class D>
void dequant_quant(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = s + b * D::kBlockBytes;
    __m256 q[4];
    D::decode(blk, q);
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(dst + b * 32 + k * kLanes, _mm256_mul_ps(q[k], d));
  }
}

// ---- f32 vector helpers -----------------------------------------------------------------------------

void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      float* yk = y + i + k * kLanes;
      _mm256_storeu_ps(yk, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i + k * kLanes), _mm256_loadu_ps(yk)));
    }
  }
  for (; i + kLanes <= n; i += kLanes)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + k * kLanes), _mm256_loadu_ps(b + i + k * kLanes), acc[k]);
  }
  for (; i + kLanes <= n; i += kLanes) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ---- attention tile kernel (kernels_attention.h) ------------------------------------------------------

// exp(x) for x <= 0 (Cephes expf, about 1 ulp); x is clamped at -87 (result ~1e-38, not 0).
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct Avx2Attn {
  using V = __m256;
  static constexpr int kW = kLanes, kKB = 2, kCH = 2;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V loadm(const float* p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
  static V loadh(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // AVX2 has no masked 16-bit load: the n halves go through a zeroed buffer (head_dim tails only).
  static V loadhm(const uint16_t* p, int n) {
    alignas(16) uint16_t h[kLanes] = {};
    std::memcpy(h, p, static_cast<size_t>(n) * 2);
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
  }
  // bf16: the high half of an f32, widened and shifted into place (exact).
  static V loadb(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static V loadbm(const uint16_t* p, int n) {
    alignas(16) uint16_t h[kLanes] = {};
    std::memcpy(h, p, static_cast<size_t>(n) * 2);
    return loadb(h);
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void storem(float* p, V v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V exp(V x) { return exp256(x); }
  static float exp1(float x) { return _mm256_cvtss_f32(exp256(_mm256_set1_ps(x))); }
  static float hsum(V v) { return shardwise::hsum(v); }
  static float hmax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[i] = hsum(a[i]); 8 vectors are reduced together with horizontal adds.
  static void reduce(const V* a, int n, float* out) {
    if (n != 8) {
      for (int i = 0; i < n; ++i) out[i] = hsum(a[i]);
      return;
    }
    const V u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const V u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
  }
};

// The K-quants' GEMV (kernels_kquants.h) on 8 lanes.
struct Avx2KQuant {
  using V = __m256;
  using VI = __m256i;
  static constexpr int kW = kLanes;
  static constexpr bool kTable16 = false;  // table16: a 16-entry lookup
  static VI u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static constexpr bool kRunOrder = true;
  static VI bytes(const uint8_t* p, int n) { return _mm256_srl_epi32(u8(p), _mm_cvtsi32_si128(n)); }
  static VI shl(VI v, int n) { return _mm256_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static VI and_(VI v, int mask) { return _mm256_and_si256(v, _mm256_set1_epi32(mask)); }
  static VI or_(VI a, VI b) { return _mm256_or_si256(a, b); }
  static V to_f(VI v) { return _mm256_cvtepi32_ps(v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
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

void attn_avx2(const AttnArgs& a) {
  attn_impl::attn<Avx2Attn>(a);
}

// silu(g) * u with sigmoid(g) = (g < 0 ? e : 1) / (1 + e), e = exp(-|g|) (exp256's domain).
inline __m256 swiglu256(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g)));
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 s = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
  return _mm256_mul_ps(_mm256_mul_ps(g, s), u);
}

void swiglu_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    _mm256_storeu_ps(gate + i, swiglu256(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i m = lane_mask(static_cast<int>(n - i));
    _mm256_maskstore_ps(gate + i, m, swiglu256(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

const CpuKernels kAvx2 = {
    Isa::Avx2,
    {gemv_float<LoadF32>, gemv_float<LoadF16>, gemv_float<LoadBF16>, gemv_quant<DecodeQ8_0>, gemv_quant<DecodeQ4_0>,
     SHARDWISE_BLOCK_GEMVS(dot_avx2), SHARDWISE_KQUANT_GEMVS(Avx2KQuant)},
    {dequant_f32, dequant_float<LoadF16>, dequant_float<LoadBF16>, dequant_quant<DecodeQ8_0>, dequant_quant<DecodeQ4_0>,
     SHARDWISE_BLOCK_DEQUANTS},
    axpy_avx2,
    dot_avx2,
    attn_avx2,
    swiglu_avx2,
};

}  // namespace

const CpuKernels* avx2_kernels() {
  return &kAvx2;
}

}  // namespace shardwise

// executor/cpu/kernels_attention.h — the attention tile kernel (CpuKernels::attn), written once as a
// template over a per-ISA SIMD traits struct T and included by kernels_scalar/avx2/avx512.cpp, each of
// which defines its traits first. Everything is in an anonymous namespace (as the AVX-512 file's notes
// require: no inline code shared between files compiled with different flags).
//
// One call runs the online softmax of nr query rows (the GQA group's heads of a few tokens, all on
// the same KV head) over keys [j_begin, j_end) in tiles of kAttnKeyTile keys. Per tile:
//   S = Q K^T       register-tiled RB rows x KB keys, f32 FMAs along head_dim, then a transposing
//                   horizontal reduction of the RB*KB accumulators;
//   P = exp(S*scale - m_new), running max m, sum l, correction exp(m_old - m_new);
//   O = O * corr + P V  register-tiled RB rows x CH vectors of head_dim, broadcast P, FMAs.
// Each K and V row is read once per tile for all nr rows.
//
// Traits T provide: V (vector type), kW (lanes), kKB (keys per S block), kCH (vectors per PV block),
// zero, load, loadm (first n < kW lanes, rest 0), loadh, loadhm (the same from f16 elements, widened),
// store, storem, set1, add, mul, max, fma(a, b, c) = a * b + c, hmax, hsum, exp (for x <= 0; large
// negative x gives ~0), reduce(acc, n, out) (out[i] = hsum(acc[i]) for i < n).
// K and V rows are read through a row policy R (RowsF32 / RowsF16 / RowsBF16: the cache's element type
// E, its bytes, and load/loadm of E into f32 vectors); everything after the load is the same f32 code.
// A q8_0 cache's tile is first dequantised to f32 rows (exact) and then read through RowsF32.
#pragma once

#include <cmath>
#include <cstdint>

#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

namespace attn_impl {

constexpr int kRB = 4;  // query rows per register block

inline int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// K/V rows stored as f32.
template <class T>
struct RowsF32 {
  using E = float;
  static constexpr int kBytes = 4;
  static typename T::V load(const E* p) { return T::load(p); }
  static typename T::V loadm(const E* p, int n) { return T::loadm(p, n); }
};

// K/V rows stored as IEEE f16 (uint16_t bits), widened to f32 on load.
template <class T>
struct RowsF16 {
  using E = uint16_t;
  static constexpr int kBytes = 2;
  static typename T::V load(const E* p) { return T::loadh(p); }
  static typename T::V loadm(const E* p, int n) { return T::loadhm(p, n); }
};

// K/V rows stored as bfloat16 (uint16_t bits), widened to f32 on load.
template <class T>
struct RowsBF16 {
  using E = uint16_t;
  static constexpr int kBytes = 2;
  static typename T::V load(const E* p) { return T::loadb(p); }
  static typename T::V loadm(const E* p, int n) { return T::loadbm(p, n); }
};

// The K and V rows of the next tile are prefetched while this tile's are read (pf: that tile's offset
// in elements of `bytes` bytes, 0 for none), one prefetch per 64-byte line: consecutive keys are a
// whole cache row apart (ld elements: every KV head of a position), a stride the hardware prefetchers
// do not follow across pages, so without it each key's first line is a DRAM round trip (decode
// attention over a long host cache read its KV at about half the bandwidth of a streaming read).
template <int bytes>
inline void prefetch_line(const void* p, int64_t pf) {
  __builtin_prefetch(
      reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(pf) * unsigned(bytes)), 0,
      3);
}

// s[i * kAttnKeyTile + kk + j] = q_i . k_{kk+j} for RB rows, KB keys.
template <class T, class R, int RB, int KB>
inline void scores_block(const float* const* q, const typename R::E* k, int64_t ld, int64_t hd, float* s, int64_t kk,
                         int64_t pf) {
  using V = typename T::V;
  constexpr int W = T::kW;
  V acc[RB * KB];
#pragma GCC unroll 32
  for (int i = 0; i < RB * KB; ++i) acc[i] = T::zero();
  const typename R::E* kr[KB];
#pragma GCC unroll 8
  for (int j = 0; j < KB; ++j) kr[j] = k + (kk + j) * ld;
  int64_t d = 0;
  for (; d + W <= hd; d += W) {
    V qv[RB];
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) qv[i] = T::load(q[i] + d);
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j) {
      if (pf != 0 && (d * R::kBytes) % 64 == 0) prefetch_line<R::kBytes>(kr[j] + d, pf);
      const V kv = R::load(kr[j] + d);
#pragma GCC unroll 8
      for (int i = 0; i < RB; ++i) acc[i * KB + j] = T::fma(qv[i], kv, acc[i * KB + j]);
    }
  }
  if (d < hd) {
    const int n = static_cast<int>(hd - d);
    V qv[RB];
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) qv[i] = T::loadm(q[i] + d, n);
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j) {
      const V kv = R::loadm(kr[j] + d, n);
#pragma GCC unroll 8
      for (int i = 0; i < RB; ++i) acc[i * KB + j] = T::fma(qv[i], kv, acc[i * KB + j]);
    }
  }
  float out[RB * KB];
  T::reduce(acc, RB * KB, out);
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < KB; ++j) s[i * kAttnKeyTile + kk + j] = out[i * KB + j];
}

// S for RB rows over keys [0, nk) of the tile.
template <class T, class R, int RB>
inline void scores_rows(const float* const* q, const typename R::E* k, int64_t ld, int64_t hd, int64_t nk, float* s,
                        int64_t pf) {
  constexpr int KB = T::kKB;
  int64_t kk = 0;
  for (; kk + KB <= nk; kk += KB) scores_block<T, R, RB, KB>(q, k, ld, hd, s, kk, pf);
  for (; kk < nk; ++kk) scores_block<T, R, RB, 1>(q, k, ld, hd, s, kk, pf);
}

// o_i[d0 .. d0 + CH*W (or n lanes of one vector)) = o_i * corr_i + sum_j p_i[j] v_j, for RB rows.
template <class T, class R, int RB, int CH, bool kTail>
inline void pv_block(const float* p, const float* corr, const typename R::E* v, int64_t ld, int64_t nk, float* const* o,
                     int64_t d0, int n, int64_t pf) {
  using V = typename T::V;
  constexpr int W = T::kW;
  V acc[RB][CH];
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i) {
    const V c = T::set1(corr[i]);
#pragma GCC unroll 8
    for (int c2 = 0; c2 < CH; ++c2)
      acc[i][c2] = T::mul(c, kTail ? T::loadm(o[i] + d0, n) : T::load(o[i] + d0 + c2 * W));
  }
  for (int64_t j = 0; j < nk; ++j) {
    V vv[CH];
#pragma GCC unroll 8
    for (int c2 = 0; c2 < CH; ++c2) {
      if (pf != 0 && ((d0 + c2 * W) * R::kBytes) % 64 == 0) prefetch_line<R::kBytes>(v + j * ld + d0 + c2 * W, pf);
      vv[c2] = kTail ? R::loadm(v + j * ld + d0, n) : R::load(v + j * ld + d0 + c2 * W);
    }
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) {
      const V pv = T::set1(p[i * kAttnKeyTile + j]);
#pragma GCC unroll 8
      for (int c2 = 0; c2 < CH; ++c2) acc[i][c2] = T::fma(pv, vv[c2], acc[i][c2]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i)
#pragma GCC unroll 8
    for (int c2 = 0; c2 < CH; ++c2) {
      if (kTail)
        T::storem(o[i] + d0, acc[i][c2], n);
      else
        T::store(o[i] + d0 + c2 * W, acc[i][c2]);
    }
}

template <class T, class R, int RB>
inline void pv_rows(const float* p, const float* corr, const typename R::E* v, int64_t ld, int64_t nk, int64_t hd,
                    float* const* o, int64_t pf) {
  constexpr int W = T::kW, CH = T::kCH;
  int64_t d = 0;
  for (; d + CH * W <= hd; d += CH * W) pv_block<T, R, RB, CH, false>(p, corr, v, ld, nk, o, d, W, pf);
  for (; d + W <= hd; d += W) pv_block<T, R, RB, 1, false>(p, corr, v, ld, nk, o, d, W, pf);
  if (d < hd) pv_block<T, R, RB, 1, true>(p, corr, v, ld, nk, o, d, static_cast<int>(hd - d), pf);
}

// Running max, correction and probabilities of one row over its nv valid keys of the tile (s holds
// the raw dot products; p[nv, nk_pad) is zeroed).
template <class T>
inline void softmax_row(float* s, int64_t nv, int64_t nk_pad, float scale, float* m, float* l, float* corr) {
  using V = typename T::V;
  constexpr int W = T::kW;
  if (nv <= 0) {
    *corr = 1.0f;
    for (int64_t j = 0; j < nk_pad; ++j) s[j] = 0.0f;
    return;
  }
  const V vs = T::set1(scale);
  V vmax = T::set1(-INFINITY);
  int64_t j = 0;
  for (; j + W <= nv; j += W) {
    const V x = T::mul(T::load(s + j), vs);
    T::store(s + j, x);
    vmax = T::max(vmax, x);
  }
  float tmax = T::hmax(vmax);
  for (; j < nv; ++j) {
    s[j] *= scale;
    tmax = s[j] > tmax ? s[j] : tmax;
  }
  const float m_old = *m, m_new = m_old > tmax ? m_old : tmax;
  const V neg_m = T::set1(-m_new);
  V vsum = T::zero();
  j = 0;
  for (; j + W <= nv; j += W) {
    const V e = T::exp(T::add(T::load(s + j), neg_m));
    T::store(s + j, e);
    vsum = T::add(vsum, e);
  }
  float tile_sum = T::hsum(vsum);
  if (j < nv) {
    const int n = static_cast<int>(nv - j);
    float tmp[T::kW];
    T::store(tmp, T::exp(T::add(T::loadm(s + j, n), neg_m)));
    for (int i = 0; i < n; ++i) {
      s[j + i] = tmp[i];
      tile_sum += tmp[i];
    }
  }
  const float c = m_old == -INFINITY ? 0.0f : T::exp1(m_old - m_new);
  *l = *l * c + tile_sum;
  *corr = c;
  *m = m_new;
  for (j = nv; j < nk_pad; ++j) s[j] = 0.0f;
}

// One tile of keys [j0, j0 + nk) for every row: k and v point at key j0's row (keys ld elements apart),
// pf_next is the next tile's offset to prefetch (0: none); o are the rows' accumulators and corr room
// for their corrections. Always inlined: the f32 instance has two callers (attn_rows, attn_rows_q8), and
// called out of line it ran a 512-token prefill ~10% slower.
template <class T, class R>
__attribute__((always_inline)) inline void attn_tile(const AttnArgs& a, const typename R::E* k, const typename R::E* v,
                                                     int64_t ld, int64_t j0, int64_t nk, int64_t pf_next,
                                                     float* const* o, float* corr) {
  const int nr = a.nr;
  const int64_t hd = a.hd;
  float* const s = a.scratch;  // nr * kAttnKeyTile
  for (int r = 0; r < nr; r += kRB) {
    // The next tile's rows are prefetched by the first row block only (the others read this tile's
    // rows again from cache).
    const int64_t pf = r == 0 ? pf_next : 0;
    const int rb = static_cast<int>(imin(kRB, nr - r));
    int64_t nkb = 0;  // keys any row of the block attends
    for (int i = 0; i < rb; ++i) nkb = imax(nkb, imin(nk, a.limit[r + i] - j0));
    if (nkb <= 0) {
      for (int i = 0; i < rb; ++i) corr[r + i] = 1.0f;
      continue;
    }
    float* sb = s + r * kAttnKeyTile;
    if (rb == kRB)
      scores_rows<T, R, kRB>(a.q + r, k, ld, hd, nkb, sb, pf);
    else
      for (int i = 0; i < rb; ++i)
        scores_rows<T, R, 1>(a.q + r + i, k, ld, hd, nkb, sb + i * kAttnKeyTile, i == 0 ? pf : 0);
    for (int i = 0; i < rb; ++i) {
      const int64_t nv = imax(0, imin(nk, a.limit[r + i] - j0));
      softmax_row<T>(sb + i * kAttnKeyTile, nv, nkb, a.scale, a.m + r + i, a.l + r + i, corr + r + i);
    }
    if (rb == kRB)
      pv_rows<T, R, kRB>(sb, corr + r, v, ld, nkb, hd, o + r, pf);
    else
      for (int i = 0; i < rb; ++i)
        pv_rows<T, R, 1>(sb + i * kAttnKeyTile, corr + r + i, v, ld, nkb, hd, o + r + i, i == 0 ? pf : 0);
  }
}

// The keys the rows attend: [j_begin, min(j_end, largest limit)).
inline int64_t keys_end(const AttnArgs& a) {
  int64_t max_limit = 0;
  for (int r = 0; r < a.nr; ++r) max_limit = imax(max_limit, a.limit[r]);
  return imin(a.j_end, max_limit);
}

template <class T, class R>
void attn_rows(const AttnArgs& a) {
  using E = typename R::E;
  const int64_t ld = a.ld;
  float corr[kAttnMaxRows];
  float* o[kAttnMaxRows];
  for (int r = 0; r < a.nr; ++r) o[r] = a.acc + r * a.hd;
  const int64_t j_end = keys_end(a);
  for (int64_t j0 = a.j_begin; j0 < j_end; j0 += kAttnKeyTile) {
    const int64_t nk = imin(kAttnKeyTile, j_end - j0);
    const int64_t pf_next = j0 + kAttnKeyTile < j_end ? kAttnKeyTile * ld : 0;
    attn_tile<T, R>(a, static_cast<const E*>(a.k) + j0 * ld, static_cast<const E*>(a.v) + j0 * ld, ld, j0, nk, pf_next,
                    o, corr);
  }
}

// Keys [j0, j0 + nk) of a q8_0 cache (key j's row of hd values from block j * ld / 32) into f32 rows of
// hd, side by side, by the ISA's Q8_0 dequantiser (bit-exact with dequantize_row: each value d * q,
// exact in f32), so the tile is read as an f32 cache holding those values would be read.
inline void dequant_q8_tile(const AttnArgs& a, const void* cache, int64_t j0, int64_t nk, float* out) {
  const auto* blocks = static_cast<const BlockQ8_0*>(cache);
  for (int64_t j = 0; j < nk; ++j) a.dequant_q8_0(blocks + (j0 + j) * a.ld / kQK8_0, out + j * a.hd, a.hd);
}

// A q8_0 cache: each tile's K and V rows dequantised into a.kv_tile, then the f32 tile code over them,
// so the result is the bits of attention over an f32 cache holding the dequantised values.
template <class T>
void attn_rows_q8(const AttnArgs& a) {
  float corr[kAttnMaxRows];
  float* o[kAttnMaxRows];
  for (int r = 0; r < a.nr; ++r) o[r] = a.acc + r * a.hd;
  float* const kt = a.kv_tile;
  float* const vt = a.kv_tile + kAttnKeyTile * a.hd;
  const int64_t j_end = keys_end(a);
  for (int64_t j0 = a.j_begin; j0 < j_end; j0 += kAttnKeyTile) {
    const int64_t nk = imin(kAttnKeyTile, j_end - j0);
    dequant_q8_tile(a, a.k, j0, nk, kt);
    dequant_q8_tile(a, a.v, j0, nk, vt);
    attn_tile<T, RowsF32<T>>(a, kt, vt, a.hd, j0, nk, 0, o, corr);
  }
}

// The tile kernel over the cache's element type.
template <class T>
void attn(const AttnArgs& a) {
  if (a.kv_dtype == DType::F16)
    attn_rows<T, RowsF16<T>>(a);
  else if (a.kv_dtype == DType::BF16)
    attn_rows<T, RowsBF16<T>>(a);
  else if (a.kv_dtype == DType::Q8_0)
    attn_rows_q8<T>(a);
  else
    attn_rows<T, RowsF32<T>>(a);
}

}  // namespace attn_impl
}  // namespace
}  // namespace shardwise

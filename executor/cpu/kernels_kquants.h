// executor/cpu/kernels_kquants.h — the GEMV of the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K), written once
// as a template over a per-ISA SIMD traits struct S and included by kernels_avx2/avx512.cpp after their
// traits. Everything is in an anonymous namespace (each file compiles its own copy with its flags).
//
// A 256-element super-block is 16 runs of 16 elements, each run under one group scale d and one offset m
// (value = d * code - m; groups of 32 span two runs). Per super-block the 16 (d, m) pairs are decoded
// once, in scalar code; per run the codes are widened from their bytes to 32-bit lanes, shifted and
// masked into place, converted to floats, turned into weights by one fused multiply-subtract and
// multiplied into every token's accumulator. The weights differ from the reference's dequantisation
// only by that fused rounding (exactly none for q3_K and q6_K, whose offsets are multiples of d); sums
// are f32, as in every GEMV.
//
// S provides: V (f32 vector of kW = 8 or 16 lanes), VI (i32 vector of kW lanes), u8(p) (kW bytes
// widened to i32), srl(v, n), shl(v, n) (shifts by a run-time count), and_(v, mask), or_(a, b), to_f(v),
// set1, load, zero, add, fma(a, b, c) = a * b + c, fmsub(a, b, c) = a * b - c, hsum, half(p) (the f16 at p).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

namespace kquant_impl {

constexpr int kRun = 16;  // elements under one (d, m)

// The 16 runs' scales d and offsets m of one super-block (straight-line code: no branches per group).
template <DType T, class S>
void run_scales(const uint8_t* blk, float* d, float* m) {
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const float dd = S::half(blk), dmin = S::half(blk + 2);
    const uint8_t* q = blk + 4;  // groups g < 4: q[g], q[g + 4]; g >= 4 also the top bits of q[g - 4], q[g]
    for (int g = 0; g < 4; ++g) {
      d[2 * g] = d[2 * g + 1] = dd * static_cast<float>(q[g] & 63);
      m[2 * g] = m[2 * g + 1] = dmin * static_cast<float>(q[g + 4] & 63);
    }
    for (int g = 4; g < 8; ++g) {
      d[2 * g] = d[2 * g + 1] = dd * static_cast<float>((q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4));
      m[2 * g] = m[2 * g + 1] = dmin * static_cast<float>((q[g + 4] >> 4) | ((q[g] >> 6) << 4));
    }
  } else if constexpr (T == DType::Q6_K) {  // codes 0..63 stand for code - 32
    const float dd = S::half(blk + 208);
    for (int k = 0; k < 16; ++k) {
      d[k] = dd * static_cast<float>(static_cast<int8_t>(blk[192 + k]));
      m[k] = 32.0f * d[k];
    }
  } else if constexpr (T == DType::Q2_K) {
    const float dd = S::half(blk + 80), dmin = S::half(blk + 82);
    for (int k = 0; k < 16; ++k) {
      d[k] = dd * static_cast<float>(blk[k] & 0x0F);
      m[k] = dmin * static_cast<float>(blk[k] >> 4);
    }
  } else {  // Q3_K: codes 0..7 stand for code - 4
    const float dd = S::half(blk + 108);
    const uint8_t* s = blk + 96;
    for (int k = 0; k < 16; ++k) {
      const int lo = k < 8 ? (s[k] & 0x0F) : (s[k - 8] >> 4);
      d[k] = dd * static_cast<float>((lo | (((s[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32);
      m[k] = 4.0f * d[k];
    }
  }
}

// The codes of elements [16k + 16/kW * v ... ) of run k (v < kRun / kW) as floats.
template <DType T, class S>
typename S::V run_codes(const uint8_t* blk, int k, int v) {
  const int o = v * S::kW;                                     // the vector's first element within the run
  const int h = k / 8, s = (k % 8) / 2, u = k % 2, g = k / 2;  // runs 8h + 2s + u; groups of 32: g
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const uint8_t* qs = blk + (T == DType::Q4_K ? 16 : 48) + 32 * (g / 2) + 16 * u + o;
    typename S::VI q = S::and_(S::srl(S::u8(qs), 4 * (g % 2)), 0x0F);
    if constexpr (T == DType::Q5_K) q = S::or_(q, S::shl(S::and_(S::srl(S::u8(blk + 16 + 16 * u + o), g), 1), 4));
    return S::to_f(q);
  } else if constexpr (T == DType::Q6_K) {
    const typename S::VI lo = S::and_(S::srl(S::u8(blk + 64 * h + 32 * (s % 2) + 16 * u + o), 4 * (s / 2)), 0x0F);
    const typename S::VI hi = S::and_(S::srl(S::u8(blk + 128 + 32 * h + 16 * u + o), 2 * s), 3);
    return S::to_f(S::or_(lo, S::shl(hi, 4)));
  } else if constexpr (T == DType::Q2_K) {
    return S::to_f(S::and_(S::srl(S::u8(blk + 16 + 32 * h + 16 * u + o), 2 * s), 3));
  } else {  // Q3_K: 2 low bits, and the high bit of hmask that adds 4
    const typename S::VI lo = S::and_(S::srl(S::u8(blk + 32 + 32 * h + 16 * u + o), 2 * s), 3);
    const typename S::VI hb = S::and_(S::srl(S::u8(blk + 16 * u + o), 4 * h + s), 1);
    return S::to_f(S::or_(lo, S::shl(hb, 2)));
  }
}

// Four accumulators per token, run k adding into acc[t][k % 4]: one chain of fused multiply-adds would
// wait on its own latency (one run every 4 cycles, half the speed).
constexpr int kChains = 4;

template <DType T, class S, int NT>
void gemv_rows(const uint8_t* w, uint64_t row_bytes, int64_t n_super, int64_t r0, int64_t r1, const float* x,
               int64_t ldx, float* y, int64_t ldy) {
  using V = typename S::V;
  constexpr int kV = kRun / S::kW;
  const int64_t bb = dtype_block_bytes(T);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + static_cast<uint64_t>(r) * row_bytes;
    V acc[NT][kChains];
    for (int t = 0; t < NT; ++t)
      for (int c = 0; c < kChains; ++c) acc[t][c] = S::zero();
    for (int64_t b = 0; b < n_super; ++b) {
      const uint8_t* blk = row + b * bb;
      float d[16], m[16];
      run_scales<T, S>(blk, d, m);
      const float* xb = x + b * kQK_K;
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        const V dv = S::set1(d[k]), mv = S::set1(m[k]);
#pragma GCC unroll 2
        for (int v = 0; v < kV; ++v) {
          const V wv = S::fmsub(run_codes<T, S>(blk, k, v), dv, mv);
          const float* xv = xb + k * kRun + v * S::kW;
          for (int t = 0; t < NT; ++t) acc[t][k % kChains] = S::fma(wv, S::load(xv + t * ldx), acc[t][k % kChains]);
        }
      }
    }
    for (int t = 0; t < NT; ++t)
      y[t * ldy + r] = S::hsum(S::add(S::add(acc[t][0], acc[t][1]), S::add(acc[t][2], acc[t][3])));
  }
}

template <DType T, class S>
void gemv(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx, int nt,
          float* y, int64_t ldy) {
  using Fn = void (*)(const uint8_t*, uint64_t, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t);
  static constexpr Fn kByTokens[kGemvMaxTokens] = {gemv_rows<T, S, 1>, gemv_rows<T, S, 2>, gemv_rows<T, S, 3>,
                                                   gemv_rows<T, S, 4>};
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int t0 = 0; t0 < nt; t0 += kGemvMaxTokens) {
    const int n = nt - t0 < kGemvMaxTokens ? nt - t0 : kGemvMaxTokens;
    kByTokens[n - 1](wb, row_bytes, cols / kQK_K, r0, r1, x + t0 * ldx, ldx, y + t0 * ldy, ldy);
  }
}

}  // namespace kquant_impl
}  // namespace
}  // namespace shardwise

// The kernel-table entries of the K-quants for traits S, in kAllDTypes' order.
#define SHARDWISE_KQUANT_GEMVS(S)                                                                          \
  kquant_impl::gemv<DType::Q2_K, S>, kquant_impl::gemv<DType::Q3_K, S>, kquant_impl::gemv<DType::Q4_K, S>, \
      kquant_impl::gemv<DType::Q5_K, S>, kquant_impl::gemv<DType::Q6_K, S>

// executor/cpu/kernels_kquants.h — the GEMV of the K-quants (q2_K, q3_K, q4_K, q5_K, q6_K), written once
// as a template over a per-ISA SIMD traits struct S and included by kernels_avx2/avx512.cpp after their
// traits. Everything is in an anonymous namespace (each file compiles its own copy with its flags).
//
// A 256-element super-block is 16 runs of 16 elements, each run under one group scale d and one offset m
// (value = d * code - m; groups of 32 span two runs). Per super-block the (d, m) pairs are decoded once
// (the packed bytes unpacked by word operations, converted and scaled as vectors); per run the codes are put in
// 32-bit lanes (S::bytes), shifted and masked into place, converted to floats, turned into weights by one fused
// multiply-subtract and multiplied into every token's accumulator. With AVX-512 the lanes come in a transposed order
// (the activations are permuted to match, once per call) and the masks and converts are table lookups (use_table,
// use_split_lookup). The weights differ from the reference's dequantisation only by the fused rounding (exactly none
// for q3_K and q6_K, whose offsets are multiples of d); sums are f32, as in every GEMV.
//
// S provides: V (f32 vector of kW = 8 or 16 lanes), VI (i32 vector of kW lanes), u8(p) (kW bytes widened to i32, in
// order), bytes(p, n) (kW bytes of a run from p, each shifted right by n bits, one per 32-bit lane, in S's lane order),
// shl(v, n) (a shift by a run-time count), and_(v, mask), or_(a, b), to_f(v), set1, load, store, zero, add, sub, mul,
// fma(a, b, c) = a * b + c, fmsub(a, b, c) = a * b - c, hsum, half(p) (the f16 at p); kRunOrder: whether bytes' lanes
// hold a run's elements in their order (else permute_run(x, out) puts 16 activations in the lanes' order: see gemv).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {

namespace kquant_impl {

constexpr int kRun = 16;  // elements under one (d, m)

// 16 small integers (bytes, minus `bias`) times f, as floats: kW lanes at a time.
template <class S>
void scale_bytes(const uint8_t* b, float bias, float f, float* out) {
  for (int i = 0; i < 16; i += S::kW)
    S::store(out + i, S::mul(S::sub(S::to_f(S::u8(b + i)), S::set1(bias)), S::set1(f)));
}

// Where run k finds its scale in d and its offset in m (run_scales' layout).
template <DType T>
constexpr int d_index(int k) {
  return T == DType::Q4_K || T == DType::Q5_K ? k / 2 : k;  // one scale per group of 32
}
template <DType T>
constexpr int m_index(int k) {
  return T == DType::Q4_K || T == DType::Q5_K ? 8 + k / 2 : k;  // the mins follow the 8 scales
}

// One super-block's scales into d and offsets into m (value = d * code - m), at d_index/m_index of each
// run: the packed bytes unpacked with word operations, then converted and scaled as vectors.
template <DType T, class S>
void run_scales(const uint8_t* blk, float* d, float* m) {
  uint8_t b[16];
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    // 6-bit scales of groups 0..3 in the low bits of bytes 0..3, their mins in bytes 4..7; groups 4..7
    // have their low four bits in the nibbles of bytes 8..11 and their top two in the top bits of 0..7.
    uint32_t u[4];
    std::memcpy(u, blk + 4, 12);
    const uint32_t m6 = 0x3F3F3F3Fu, m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    const uint32_t sc[2] = {u[0] & m6, (u[2] & m4) | (((u[0] >> 6) & m2) << 4)};
    const uint32_t mn[2] = {u[1] & m6, ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4)};
    std::memcpy(b, sc, 8);
    std::memcpy(b + 8, mn, 8);
    scale_bytes<S>(b, 0.0f, S::half(blk), d);      // d[0..7]: the groups' scales
    scale_bytes<S>(b, 0.0f, S::half(blk + 2), m);  // m[8..15]: their mins
  } else if constexpr (T == DType::Q6_K) {         // signed scales; codes 0..63 stand for code - 32
    uint64_t u[2];
    std::memcpy(u, blk + 192, 16);
    u[0] ^= 0x8080808080808080ull, u[1] ^= 0x8080808080808080ull;  // + 128
    std::memcpy(b, u, 16);
    scale_bytes<S>(b, 128.0f, S::half(blk + 208), d);
    for (int k = 0; k < 16; k += S::kW) S::store(m + k, S::mul(S::load(d + k), S::set1(32.0f)));
  } else if constexpr (T == DType::Q2_K) {  // scale in the low nibble, min in the high one
    uint64_t u[2], lo[2], hi[2];
    std::memcpy(u, blk, 16);
    for (int i = 0; i < 2; ++i) lo[i] = u[i] & 0x0F0F0F0F0F0F0F0Full, hi[i] = (u[i] >> 4) & 0x0F0F0F0F0F0F0F0Full;
    std::memcpy(b, lo, 16);
    scale_bytes<S>(b, 0.0f, S::half(blk + 80), d);
    std::memcpy(b, hi, 16);
    scale_bytes<S>(b, 0.0f, S::half(blk + 82), m);
  } else {  // Q3_K: 6-bit scales biased by 32 (low nibbles in bytes 0..7, top bits in 8..11); codes 0..7 stand for code
            // - 4
    uint32_t u[3], o[4];
    std::memcpy(u, blk + 96, 12);
    const uint32_t m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    o[0] = (u[0] & m4) | ((u[2] & m2) << 4);
    o[1] = (u[1] & m4) | (((u[2] >> 2) & m2) << 4);
    o[2] = ((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4);
    o[3] = ((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4);
    std::memcpy(b, o, 16);
    scale_bytes<S>(b, 32.0f, S::half(blk + 108), d);
    for (int k = 0; k < 16; k += S::kW) S::store(m + k, S::mul(S::load(d + k), S::set1(4.0f)));
  }
}

// The codes of elements [16k + 16/kW * v ... ) of run k (v < kRun / kW) as floats.
template <DType T, class S>
typename S::V run_codes(const uint8_t* blk, int k, int v) {
  const int o = v * S::kW;                                     // the vector's first element within the run
  const int h = k / 8, s = (k % 8) / 2, u = k % 2, g = k / 2;  // runs 8h + 2s + u; groups of 32: g
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const uint8_t* qs = blk + (T == DType::Q4_K ? 16 : 48) + 32 * (g / 2) + 16 * u + o;
    typename S::VI q = S::and_(S::bytes(qs, 4 * (g % 2)), 0x0F);
    if constexpr (T == DType::Q5_K) q = S::or_(q, S::shl(S::and_(S::bytes(blk + 16 + 16 * u + o, g), 1), 4));
    return S::to_f(q);
  } else if constexpr (T == DType::Q6_K) {
    const typename S::VI lo = S::and_(S::bytes(blk + 64 * h + 32 * (s % 2) + 16 * u + o, 4 * (s / 2)), 0x0F);
    const typename S::VI hi = S::and_(S::bytes(blk + 128 + 32 * h + 16 * u + o, 2 * s), 3);
    return S::to_f(S::or_(lo, S::shl(hi, 4)));
  } else if constexpr (T == DType::Q2_K) {
    return S::to_f(S::and_(S::bytes(blk + 16 + 32 * h + 16 * u + o, 2 * s), 3));
  } else {  // Q3_K: 2 low bits, and the high bit of hmask that adds 4
    const typename S::VI lo = S::and_(S::bytes(blk + 32 + 32 * h + 16 * u + o, 2 * s), 3);
    const typename S::VI hb = S::and_(S::bytes(blk + 16 * u + o, 4 * h + s), 1);
    return S::to_f(S::or_(lo, S::shl(hb, 2)));
  }
}

// Where S looks up 16-entry tables (AVX-512's permute), q4_K and q2_K take each run's weights from a table
// of its 16 possible values, d * code - m, indexed by the code's bits: one permute in place of a mask, a
// convert and a fused multiply-subtract (the same values: the table is made by that multiply-subtract).
template <DType T, class S>
constexpr bool use_table() {
  return S::kTable16 && (T == DType::Q4_K || T == DType::Q2_K);
}
// The codes the table entries stand for: the low 4 bits of the index (q2_K: its low 2).
template <DType T, class S>
typename S::V table_codes() {
  alignas(64) static constexpr float kNibble[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  alignas(64) static constexpr float kCrumb[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  return S::load(T == DType::Q4_K ? kNibble : kCrumb);
}
// The index vector of run k, piece v: the code in its low bits, other bits above (the lookup ignores them).
template <DType T, class S>
typename S::VI run_index(const uint8_t* blk, int k, int v) {
  const int o = v * S::kW, h = k / 8, s = (k % 8) / 2, u = k % 2, g = k / 2;
  if constexpr (T == DType::Q4_K)
    return S::bytes(blk + 16 + 32 * (g / 2) + 16 * u + o, 4 * (g % 2));
  else
    return S::bytes(blk + 16 + 32 * h + 16 * u + o, 2 * s);
}

// Where S looks up 16-entry tables, q3_K, q5_K and q6_K take each code as the sum of two lookups of constant tables,
// one indexed by its low bits and one by its high bits, each index straight from the shifted bytes (the lookup ignores
// the bits above): two lookups and an add in place of two masks, a shift, an or and a convert. The sums are small
// integers, exact in f32, and q3_K's and q6_K's come with their bias taken off (code - 4, code - 32), so that one
// multiply by d gives the weight exactly as the reference does.
template <DType T, class S>
constexpr bool use_split_lookup() {
  return S::kTable16 && (T == DType::Q3_K || T == DType::Q5_K || T == DType::Q6_K);
}
// The two tables: the low bits' values (less the bias) and the high bits' (the code's high part).
template <DType T, class S>
void split_tables(typename S::V* lo, typename S::V* hi) {
  alignas(64) static constexpr float kQ6Lo[16] = {-32, -31, -30, -29, -28, -27, -26, -25,
                                                  -24, -23, -22, -21, -20, -19, -18, -17};
  alignas(64) static constexpr float kQ6Hi[16] = {0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48};
  alignas(64) static constexpr float kQ5Lo[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  alignas(64) static constexpr float kQ5Hi[16] = {0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16, 0, 16};
  alignas(64) static constexpr float kQ3Lo[16] = {-4, -3, -2, -1, -4, -3, -2, -1, -4, -3, -2, -1, -4, -3, -2, -1};
  alignas(64) static constexpr float kQ3Hi[16] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
  *lo = S::load(T == DType::Q6_K ? kQ6Lo : T == DType::Q5_K ? kQ5Lo : kQ3Lo);
  *hi = S::load(T == DType::Q6_K ? kQ6Hi : T == DType::Q5_K ? kQ5Hi : kQ3Hi);
}
// Run k, piece v: the code (q6_K, q3_K: less the bias) from the two tables.
template <DType T, class S>
typename S::V split_code(const uint8_t* blk, int k, int v, typename S::V lo, typename S::V hi) {
  const int o = v * S::kW, h = k / 8, s = (k % 8) / 2, u = k % 2, g = k / 2;
  if constexpr (T == DType::Q5_K)
    return S::add(S::table16(lo, S::bytes(blk + 48 + 32 * (g / 2) + 16 * u + o, 4 * (g % 2))),
                  S::table16(hi, S::bytes(blk + 16 + 16 * u + o, g)));
  else if constexpr (T == DType::Q6_K)
    return S::add(S::table16(lo, S::bytes(blk + 64 * h + 32 * (s % 2) + 16 * u + o, 4 * (s / 2))),
                  S::table16(hi, S::bytes(blk + 128 + 32 * h + 16 * u + o, 2 * s)));
  else
    return S::add(S::table16(lo, S::bytes(blk + 32 + 32 * h + 16 * u + o, 2 * s)),
                  S::table16(hi, S::bytes(blk + 16 * u + o, 4 * h + s)));
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
    typename S::V lo_table = S::zero(), hi_table = S::zero();
    if constexpr (use_split_lookup<T, S>()) split_tables<T, S>(&lo_table, &hi_table);
    for (int64_t b = 0; b < n_super; ++b) {
      const uint8_t* blk = row + b * bb;
      float d[16], m[16];
      run_scales<T, S>(blk, d, m);
      const float* xb = x + b * kQK_K;
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        const V dv = S::set1(d[d_index<T>(k)]), mv = S::set1(m[m_index<T>(k)]);
        V table = dv;
        if constexpr (use_table<T, S>()) table = S::fmsub(table_codes<T, S>(), dv, mv);
#pragma GCC unroll 2
        for (int v = 0; v < kV; ++v) {
          V wv;
          if constexpr (use_table<T, S>())
            wv = S::table16(table, run_index<T, S>(blk, k, v));
          else if constexpr (use_split_lookup<T, S>() && T == DType::Q5_K)
            wv = S::fmsub(split_code<T, S>(blk, k, v, lo_table, hi_table), dv, mv);
          else if constexpr (use_split_lookup<T, S>())
            wv = S::mul(split_code<T, S>(blk, k, v, lo_table, hi_table), dv);
          else
            wv = S::fmsub(run_codes<T, S>(blk, k, v), dv, mv);
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
  if constexpr (!S::kRunOrder) {
    // The activations in the lanes' order, once per call: the call's rows (a chunk of matmul's) all read this
    // copy, so that no lane is moved per weight.
    thread_local std::vector<float> permuted;
    if (permuted.size() < static_cast<size_t>(nt * cols)) permuted.resize(static_cast<size_t>(nt * cols));
    for (int t = 0; t < nt; ++t)
      for (int64_t c = 0; c < cols; c += kRun) S::permute_run(x + t * ldx + c, permuted.data() + t * cols + c);
    x = permuted.data();
    ldx = cols;
  }
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

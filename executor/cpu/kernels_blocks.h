// executor/cpu/kernels_blocks.h — the CPU GEMV for the 32-element block types without a kernel of their
// own (Q4_1, Q5_0, Q5_1, IQ4_NL): each weight block is dequantised by the reference (core/quants.cpp,
// whose loops the compiler vectorises) into an f32 buffer that stays in L1, then dotted with every
// token's activations by the level's f32 dot product; and every block type's dequantisation (the
// reference's). Included by each level's kernel file.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
// Anonymous: every level's file compiles its own copy with its own ISA flags (see kernels_avx512.cpp).
namespace {
namespace blocks_impl {

template <DType T, float (*Dot)(const float*, const float*, int64_t)>
void gemv_blocks(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t ldx,
                 int nt, float* y, int64_t ldy) {
  const int64_t be = dtype_block_elems(T), bb = dtype_block_bytes(T);
  alignas(64) float buf[kQK_K];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + static_cast<uint64_t>(r) * row_bytes;
    float acc[kGemvMaxTokens] = {};
    for (int64_t c = 0; c < cols; c += be) {
      dequantize_block(T, row + (c / be) * bb, buf);
      for (int t = 0; t < nt; ++t) acc[t] += Dot(buf, x + t * ldx + c, be);
    }
    for (int t = 0; t < nt; ++t) y[t * ldy + r] = acc[t];
  }
}

template <DType T>
void dequant_blocks(const void* src, float* dst, int64_t n) {
  dequantize_row(T, src, dst, n);
}

}  // namespace blocks_impl
}  // namespace
}  // namespace shardwise

// The kernel-table entries of the 32-element block types without a kernel of their own, in kAllDTypes'
// order (q4_1, q5_0, q5_1, iq4_nl; the K-quants follow: kernels_kquants.h, or SHARDWISE_KQUANT_GENERIC).
#define SHARDWISE_BLOCK_GEMVS(DOT)                                                        \
  blocks_impl::gemv_blocks<DType::Q4_1, DOT>, blocks_impl::gemv_blocks<DType::Q5_0, DOT>, \
      blocks_impl::gemv_blocks<DType::Q5_1, DOT>, blocks_impl::gemv_blocks<DType::IQ4_NL, DOT>
#define SHARDWISE_BLOCK_DEQUANTS                                                            \
  blocks_impl::dequant_blocks<DType::Q4_1>, blocks_impl::dequant_blocks<DType::Q5_0>,       \
      blocks_impl::dequant_blocks<DType::Q5_1>, blocks_impl::dequant_blocks<DType::IQ4_NL>, \
      blocks_impl::dequant_blocks<DType::Q2_K>, blocks_impl::dequant_blocks<DType::Q3_K>,   \
      blocks_impl::dequant_blocks<DType::Q4_K>, blocks_impl::dequant_blocks<DType::Q5_K>,   \
      blocks_impl::dequant_blocks<DType::Q6_K>

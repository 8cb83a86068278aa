// executor/cpu/kernels.h — the per-ISA CPU kernel table (ggml-backend style: a struct of function
// pointers, one instance per SIMD level) and the dispatcher that picks one at run time.
// Kernels are single-threaded; threading is the caller's (matmul.h). Every entry is tested
// against the scalar reference in core/dtype.h on odd sizes at every ISA level the host offers.
// Weights are used at their stored precision; accumulation is f32.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "executor/cpu/cpu_features.h"

namespace shardwise {

// Dot products of weight rows [r0, r1) with nt (1..kGemvMaxTokens) activation vectors:
//   y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c]
// W rows are `row_bytes` apart and hold `cols` elements of the kernel's dtype
// (cols is a multiple of the block size).
using GemvFn = void (*)(const void* w, uint64_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const float* x,
                        int64_t ldx, int nt, float* y, int64_t ldy);
constexpr int kGemvMaxTokens = 4;

// How far ahead of their reads the GEMV kernels prefetch weights, in bytes of the order they read
// them (kernels_avx2.cpp says how): kGemvPrefetchBytes, unless set_gemv_prefetch_bytes (tests, and the
// CPU benchmark's --gemv-prefetch for measuring a machine) sets another distance (0 = none, at most
// kGemvPrefetchMax; a negative value goes back to the default); it returns the old value.
constexpr int64_t kGemvPrefetchBytes = 8192;
constexpr int64_t kGemvPrefetchMax = 1 << 20;
int64_t gemv_prefetch_bytes();
int64_t set_gemv_prefetch_bytes(int64_t bytes);

// Attention tile kernel (attention.cpp drives it; kernels_attention.h implements it). Online softmax of
// nr (<= kAttnMaxRows) query rows that share one KV head over keys [j_begin, j_end), in tiles of
// kAttnKeyTile keys: row r attends keys j < limit[r] (causal), scores are (q_r . k_j) * scale, and the
// running max m[r], sum l[r] and unnormalised output acc[r * hd ..] (f32) are updated in place
// (start from m = -inf, l = 0, acc = 0; the result is acc / l). K and V rows are stored as kv_dtype
// (f32; f16 or bf16 widened to f32 as they are loaded; q8_0 blocks dequantised to f32 a tile at a time,
// exactly: an int8 times an f16 scale); queries, scores and accumulators are f32.
constexpr int kAttnMaxRows = 64;
constexpr int64_t kAttnKeyTile = 64;
// Converts n elements (a multiple of the block size) to f32.
using DequantFn = void (*)(const void* src, float* dst, int64_t n);
struct AttnArgs {
  const float* const* q;  // nr query rows of hd floats
  const int64_t* limit;   // nr key limits
  int nr;
  const void* k;                // key j at element j * ld of k (elements of kv_dtype; q8_0: block j * ld / 32)
  const void* v;                // value j at element j * ld of v
  int64_t ld;                   // in elements (q8_0: a multiple of 32, as hd)
  DType kv_dtype = DType::F32;  // F32, F16, BF16 or Q8_0
  int64_t j_begin, j_end;
  int64_t hd;
  float scale;
  float* m;
  float* l;
  float* acc;
  float* scratch;                    // nr * kAttnKeyTile floats
  float* kv_tile = nullptr;          // q8_0 caches: 2 * kAttnKeyTile * hd floats (a tile's K and V rows in f32)
  DequantFn dequant_q8_0 = nullptr;  // q8_0 caches: the ISA's Q8_0 dequantiser (CpuKernels::dequant)
};
using AttnFn = void (*)(const AttnArgs& a);

struct CpuKernels {
  Isa isa;
  GemvFn gemv[kNumDTypes];        // indexed by kernel_slot(dtype)
  DequantFn dequant[kNumDTypes];  // indexed by kernel_slot(dtype)
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // sum_i a[i] * b[i]
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  AttnFn attn;
  // gate[i] = silu(gate[i]) * up[i] (vector exp: ~1 ulp from std::exp)
  void (*swiglu)(float* gate, const float* up, int64_t n);
};

// A dtype's index in kAllDTypes (core/dtype.h), which orders the kernel tables.
inline int kernel_slot(DType t) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kAllDTypes[i] == t) return i;
  return 0;
}

// Kernel tables per level; the AVX2/AVX-512 ones return nullptr when not compiled in.
const CpuKernels* scalar_kernels();
const CpuKernels* avx2_kernels();
const CpuKernels* avx512_kernels();

// The table for active_isa() (falls back to lower levels when one is missing).
const CpuKernels& cpu_kernels();
// The table for a given level (nullptr when this build or CPU lacks it).
const CpuKernels* cpu_kernels_for(Isa isa);

}  // namespace shardwise

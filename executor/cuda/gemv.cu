// executor/cuda/gemv.cu — decode GEMV for every weight dtype: y = W x for up to 8 token vectors,
// weights read once at their stored precision, products and sums in f32 (no activation rounding).
// Each warp owns 2 rows of each matrix (2 x 2 for the fused gate/up SwiGLU pass) so that every
// activation load from L1 serves several rows; lanes read consecutive 16-byte pieces (f32/f16/bf16)
// or consecutive 4/8-element pieces of GGUF blocks (q8_0/q4_0: 2-byte loads, since blocks of 34/18
// bytes are only 2-byte aligned), so every warp load is coalesced. Quantised codes become floats
// by the exponent trick (2^23 + byte as bits, minus the bias), which is exact and cheaper than I2F.
// Several matrices (q/k/v, MoE experts) go in one launch as tasks, so small matrices still fill the GPU.
// A launch with few rows for the GPU (fewer warps than half its slots) splits each row pair's columns
// among the block's warps instead (k-split), each warp's partial sums added in warp order through shared
// memory: 4x the weight bytes in flight per row, for o and down projections of 4096 rows.
#include <algorithm>
#include <cstdint>

#include "executor/cuda/kernels.cuh"

namespace shardwise {
namespace cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kRows = 2;   // rows per warp, per matrix
constexpr int kFastRowsPerBlock = kWarps * kRows;
constexpr int kGenericRowsPerBlock = kWarps;  // generic kernel: one row per warp

struct TaskDev {
  const uint8_t* w0;
  const uint8_t* w1;
  const float* x;
  float* y;
  int64_t row_bytes, ldx, ldy;
  int32_t rows, cols, nt, pad;
  int32_t tok[kGemvMaxTokens];
  const int32_t* sel;  // set: matrix *sel, at w0/w1 + *sel * sel_stride, or from the tables w0/w1
  int64_t sel_stride;
};

struct Batch {
  int32_t count, mode;
  int32_t ksplit;  // the block's warps share its kRows rows (per matrix), each a quarter of the columns
  int32_t block_begin[kGemvMaxTasks + 1];
  TaskDev task[kGemvMaxTasks];
};
static_assert(sizeof(Batch) < 4000, "GEMV batch must fit the 4 KB kernel parameter space");

// The task's matrices: its own, or the entries its selector picks from device tables.
__device__ __forceinline__ void task_matrices(const TaskDev& tk, const uint8_t** w0, const uint8_t** w1) {
  if (tk.sel == nullptr) {
    *w0 = tk.w0;
    *w1 = tk.w1;
    return;
  }
  const int e = *tk.sel;
  if (tk.sel_stride > 0) {
    *w0 = tk.w0 + static_cast<int64_t>(e) * tk.sel_stride;
    *w1 = tk.w1 + static_cast<int64_t>(e) * tk.sel_stride;
    return;
  }
  *w0 = reinterpret_cast<const uint8_t* const*>(tk.w0)[e];
  *w1 = reinterpret_cast<const uint8_t* const*>(tk.w1)[e];
}

__device__ __forceinline__ int find_task(const Batch& b) {
  int ti = 0;
  while (ti + 1 < b.count && static_cast<int>(blockIdx.x) >= b.block_begin[ti + 1]) ++ti;
  return ti;
}

__device__ __forceinline__ float silu_mul(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ void store_out(int mode, float* p, float a0, float a1) {
  if (mode == static_cast<int>(GemvMode::Store))
    *p = a0;
  else if (mode == static_cast<int>(GemvMode::Accumulate))
    *p = *p + a0;
  else
    *p = silu_mul(a0, a1);
}

__device__ __forceinline__ void unpack_f16x8(const uint4& w, float* f) {
  const uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&v[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ void unpack_bf16x8(const uint4& w, float* f) {
  const uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(v[i] << 16);
    f[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
  }
}

// One lane's piece of a weight row per dtype: the raw bytes (loaded first, so that several pieces
// are in flight), then their elements as floats and the x elements they multiply.
template <DType T>
struct Piece;

template <>
struct Piece<DType::F16> {
  static constexpr int kElems = 8;  // 16 bytes
  static constexpr bool kScaled = false;
  uint4 raw;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float& d) const {
    unpack_f16x8(raw, w);
    d = 1.0f;
  }
};
template <>
struct Piece<DType::BF16> {
  static constexpr int kElems = 8;
  static constexpr bool kScaled = false;
  uint4 raw;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float& d) const {
    unpack_bf16x8(raw, w);
    d = 1.0f;
  }
};
template <>
struct Piece<DType::F32> {
  static constexpr int kElems = 4;
  static constexpr bool kScaled = false;
  uint4 raw;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float& d) const {
    w[0] = __uint_as_float(raw.x);
    w[1] = __uint_as_float(raw.y);
    w[2] = __uint_as_float(raw.z);
    w[3] = __uint_as_float(raw.w);
    d = 1.0f;
  }
};
// q8_0: 4 codes of a 34-byte block (8 pieces per block), read as two 2-byte loads (blocks are only
// 2-byte aligned), plus the block's f16 scale.
template <>
struct Piece<DType::Q8_0> {
  static constexpr int kElems = 4;
  static constexpr bool kScaled = true;
  uint32_t d_bits, q;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 3) * 34;
    const int k = u & 7;
    d_bits = ld_u16(bp);
    q = ld_u16(bp + 2 + 4 * k) | (ld_u16(bp + 4 + 4 * k) << 16);
  }
  __device__ __forceinline__ void unpack(float* w, float& d) const {
    const uint32_t b = q ^ 0x80808080u;  // signed codes biased to q + 128 for the exponent trick
    w[0] = byte_magic<0>(b) - (kMagic + 128.0f);
    w[1] = byte_magic<1>(b) - (kMagic + 128.0f);
    w[2] = byte_magic<2>(b) - (kMagic + 128.0f);
    w[3] = byte_magic<3>(b) - (kMagic + 128.0f);
    d = f16_bits_to_float(d_bits);
  }
};
// q4_0: 4 bytes of an 18-byte block (4 pieces per block) = elements 4k..4k+3 (low nibbles) and
// 16+4k..16+4k+3 (high nibbles).
template <>
struct Piece<DType::Q4_0> {
  static constexpr int kElems = 8;
  static constexpr bool kScaled = true;
  uint32_t d_bits, q;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 2) * 18;
    const int k = u & 3;
    d_bits = ld_u16(bp);
    q = ld_u16(bp + 2 + 4 * k) | (ld_u16(bp + 4 + 4 * k) << 16);
  }
  __device__ __forceinline__ void unpack(float* w, float& d) const {
    const uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    w[0] = byte_magic<0>(lo) - (kMagic + 8.0f);
    w[1] = byte_magic<1>(lo) - (kMagic + 8.0f);
    w[2] = byte_magic<2>(lo) - (kMagic + 8.0f);
    w[3] = byte_magic<3>(lo) - (kMagic + 8.0f);
    w[4] = byte_magic<0>(hi) - (kMagic + 8.0f);
    w[5] = byte_magic<1>(hi) - (kMagic + 8.0f);
    w[6] = byte_magic<2>(hi) - (kMagic + 8.0f);
    w[7] = byte_magic<3>(hi) - (kMagic + 8.0f);
    d = f16_bits_to_float(d_bits);
  }
};

// The x elements that piece u multiplies (16-byte loads; x rows are 16-byte aligned).
template <DType T>
__device__ __forceinline__ void load_x(const float* x, int u, float* xv) {
  if constexpr (T == DType::Q4_0) {
    const float* xb = x + static_cast<int64_t>(u >> 2) * 32 + 4 * (u & 3);
    const float4 a = __ldg(reinterpret_cast<const float4*>(xb));
    const float4 c = __ldg(reinterpret_cast<const float4*>(xb + 16));
    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = c.x, xv[5] = c.y, xv[6] = c.z, xv[7] = c.w;
  } else {
    constexpr int E = Piece<T>::kElems;
    const float4* xp = reinterpret_cast<const float4*>(x + static_cast<int64_t>(u) * E);
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      const float4 a = __ldg(xp + i);
      xv[4 * i] = a.x, xv[4 * i + 1] = a.y, xv[4 * i + 2] = a.z, xv[4 * i + 3] = a.w;
    }
  }
}

// Pieces per row in flight per step of the fast path, for NT tokens through M matrices.
__host__ __device__ constexpr int gemv_unroll(int nt, int m) {
  return nt * m <= 2 ? 4 : 2;
}

// The weight pieces of one step of the fast path: kUnroll per row, clamped to the row (always valid).
template <typename P, int U, int M>
__device__ __forceinline__ void load_pieces(P (&pc)[U][M][kRows], const uint8_t* const (&wr)[M][kRows], int u0,
                                            int units) {
#pragma unroll
  for (int i = 0; i < U; ++i) {
    const int u = min(u0 + 32 * i, units - 1);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) pc[i][m][r].load(wr[m][r], u);
  }
}

// The weight rows of the warp's kRows rows of each matrix (rows past the end repeat the last row).
template <int M>
__device__ __forceinline__ void weight_rows(const TaskDev& tk, int row0, const uint8_t* (&wr)[M][kRows]) {
  const uint8_t *mw0, *mw1;
  task_matrices(tk, &mw0, &mw1);
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      wr[m][r] = (m == 0 ? mw0 : mw1) + static_cast<int64_t>(min(row0 + r, tk.rows - 1)) * tk.row_bytes;
}

// k-split: lane 0 of each warp puts the warp's sums in `part`, visible to the block after the barrier.
template <int NT, int M>
__device__ __forceinline__ void stash_warp_sums(float (&part)[kWarps][M][kRows][NT], int warp, int lane,
                                                const float (&acc)[M][kRows][NT]) {
  if (lane == 0)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) part[warp][m][r][t] = acc[m][r][t];
  __syncthreads();
}

// k-split: the warps' partial sums, added in warp order (the same result on every run).
template <int NT, int M>
__device__ __forceinline__ void add_warp_sums(const float (&part)[kWarps][M][kRows][NT], float (&acc)[M][kRows][NT]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float s = part[0][m][r][t];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) s += part[w][m][r][t];
        acc[m][r][t] = s;
      }
}

// Lane 0 writes the rows that exist for the nt tokens (the mode decides store, add or SwiGLU).
template <int NT, int M>
__device__ __forceinline__ void store_gemv_rows(const Batch& b, const TaskDev& tk, int row0, int nt, int lane,
                                                const float (&acc)[M][kRows][NT]) {
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + r;
      if (row >= tk.rows) break;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) store_out(b.mode, tk.y + static_cast<int64_t>(t) * tk.ldy + row, acc[0][r][t], acc[M - 1][r][t]);
    }
  }
}

// Fast path: rows 16-byte aligned for f32/f16/bf16 (cols a multiple of 4/8), 2-byte aligned blocks
// for q8_0/q4_0, x rows 16-byte aligned. Each step issues the weight loads of kUnroll pieces per row
// (clamped to the row, so always valid) before any arithmetic, to keep enough bytes in flight.
template <DType T, int NT, int M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const __grid_constant__ Batch b) {
  using P = Piece<T>;
  constexpr int E = P::kElems;
  // Pieces per row in flight. 8 for one vector through one matrix measured slower in the whole model
  // (nemo8b 170-173 against 175-179 tokens/s, qwen30b 250-252 against 263-270).
  constexpr int kUnroll = gemv_unroll(NT, M);
  const int ti = find_task(b);
  const TaskDev& tk = b.task[ti];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool ks = b.ksplit != 0;
  // k-split: every warp of the block on the same rows (so a block leaves, or stays, as a whole), warp w
  // from piece 32 * kUnroll * w in steps of the block's.
  const int row0 = ks ? (static_cast<int>(blockIdx.x) - b.block_begin[ti]) * kRows
                      : ((static_cast<int>(blockIdx.x) - b.block_begin[ti]) * kWarps + warp) * kRows;
  if (row0 >= tk.rows) {
    pdl_begin();
    return;
  }
  const int first = lane + (ks ? 32 * kUnroll * warp : 0);
  const int stride = 32 * kUnroll * (ks ? kWarps : 1);
  const int nt = tk.nt;
  // Weights named directly are loaded before waiting for the kernel before this one (programmatic
  // dependent launch), so the first loads overlap its tail; a selector is that kernel's output.
  const bool early = tk.sel == nullptr;
  if (!early) pdl_wait();

  const uint8_t* wr[M][kRows];
  weight_rows<M>(tk, row0, wr);
  const float* xr[NT];  // tokens past nt repeat the first
#pragma unroll
  for (int t = 0; t < NT; ++t) xr[t] = tk.x + static_cast<int64_t>(tk.tok[t < nt ? t : 0]) * tk.ldx;
  float acc[M][kRows][NT];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[m][r][t] = 0.0f;

  const int units = tk.cols / E;
  P pc[kUnroll][M][kRows];
  if (units > 0) load_pieces<P, kUnroll, M>(pc, wr, first, units);  // the first step's weights
  if (early) pdl_wait();
  // Unpack and multiply inline: as a helper, ptxas scheduled six instances differently (bf16, one token,
  // one matrix: 1000 instructions instead of 1016).
  for (int u0 = first; u0 < units; u0 += stride) {
    if (u0 != first) load_pieces<P, kUnroll, M>(pc, wr, u0, units);
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int u = u0 + 32 * i;
      if (u >= units) break;
      float w[M][kRows][E], d[M][kRows];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < kRows; ++r) pc[i][m][r].unpack(w[m][r], d[m][r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          float xv[E];
          load_x<T>(xr[t], u, xv);
#pragma unroll
          for (int m = 0; m < M; ++m)
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              if constexpr (P::kScaled) {  // block sum first, then its scale
                float s = w[m][r][0] * xv[0];
#pragma unroll
                for (int e = 1; e < E; ++e) s = fmaf(w[m][r][e], xv[e], s);
                acc[m][r][t] = fmaf(d[m][r], s, acc[m][r][t]);
              } else {
#pragma unroll
                for (int e = 0; e < E; ++e) acc[m][r][t] = fmaf(w[m][r][e], xv[e], acc[m][r][t]);
              }
            }
        }
      }
    }
  }

  // The next kernel is scheduled only now: triggered at the start, its blocks took SM slots while this
  // loop still ran (a 4096 x 11520 f16 GEMV back to back 36.7 us against 28.1 triggered here).
  pdl_trigger();
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[m][r][t] = warp_sum(acc[m][r][t]);
  if (ks) {
    __shared__ float part[kWarps][M][kRows][NT];
    stash_warp_sums<NT, M>(part, warp, lane, acc);
    if (warp != 0) return;
    add_warp_sums<NT, M>(part, acc);
  }
  store_gemv_rows<NT, M>(b, tk, row0, nt, lane, acc);
}

// Any dtype, any alignment (odd shapes): one row per warp, element loads, tokens at run time.
template <DType T>
__global__ void __launch_bounds__(kWarps * 32) gemv_generic_kernel(const __grid_constant__ Batch b) {
  pdl_begin();
  const int ti = find_task(b);
  const TaskDev& tk = b.task[ti];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = (static_cast<int>(blockIdx.x) - b.block_begin[ti]) * kWarps + warp;
  if (row >= tk.rows) return;
  const bool two = b.mode == static_cast<int>(GemvMode::SwiGLU);
  const uint8_t *mw0, *mw1;
  task_matrices(tk, &mw0, &mw1);
  const uint8_t* r0 = mw0 + static_cast<int64_t>(row) * tk.row_bytes;
  const uint8_t* r1 = two ? mw1 + static_cast<int64_t>(row) * tk.row_bytes : r0;
  const int nt = tk.nt;
  float acc0[kGemvMaxTokens], acc1[kGemvMaxTokens];
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) acc0[t] = acc1[t] = 0.0f;
  for (int c = lane; c < tk.cols; c += 32) {
    const float w0 = load_weight(T, r0, c);
    const float w1 = two ? load_weight(T, r1, c) : 0.0f;
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < nt) {
        const float xv = tk.x[static_cast<int64_t>(tk.tok[t]) * tk.ldx + c];
        acc0[t] = fmaf(w0, xv, acc0[t]);
        acc1[t] = fmaf(w1, xv, acc1[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) {
    if (t < nt) {
      const float a0 = warp_sum(acc0[t]);
      const float a1 = two ? warp_sum(acc1[t]) : 0.0f;
      if (lane == 0) store_out(b.mode, tk.y + static_cast<int64_t>(t) * tk.ldy + row, a0, a1);
    }
  }
}

template <DType T, int M>
void launch_fast(int nt_max, const Batch& b, int blocks, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  if (nt_max <= 1)
    launch_kernel("GEMV kernel", gemv_kernel<T, 1, M>, grid, block, 0, s, b);
  else if (nt_max <= 2)
    launch_kernel("GEMV kernel", gemv_kernel<T, 2, M>, grid, block, 0, s, b);
  else if (nt_max <= 4)
    launch_kernel("GEMV kernel", gemv_kernel<T, 4, M>, grid, block, 0, s, b);
  else
    launch_kernel("GEMV kernel", gemv_kernel<T, 8, M>, grid, block, 0, s, b);
}

// The block types without a fast kernel (q4_1, q5_0, q5_1, iq4_nl, the K-quants): the generic kernel.
template <DType T>
void launch_generic(const Batch& b, int blocks, cudaStream_t s) {
  launch_kernel("GEMV kernel", gemv_generic_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, s, b);
}

template <DType T>
void launch(bool fast, bool two, int nt_max, const Batch& b, int blocks, cudaStream_t s) {
  if (!fast)
    launch_kernel("GEMV kernel", gemv_generic_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, s,
                  b);
  else if (two)
    launch_fast<T, 2>(nt_max, b, blocks, s);
  else
    launch_fast<T, 1>(nt_max, b, blocks, s);
}

bool has_fast_kernel(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Q8_0 ||
         dtype == DType::Q4_0;
}

bool fast_path_ok(DType dtype, const GemvTask& t, bool two) {
  if (!has_fast_kernel(dtype) || !aligned16(t.x) || t.ldx % 4 != 0) return false;
  const uint64_t row_bytes = dtype_row_bytes(dtype, t.cols);
  if (t.sel) {  // the caller checked the tables' entries
    const bool rows_ok = dtype_is_quantized(dtype) || row_bytes % 16 == 0;
    return t.sel_fast && rows_ok;
  }
  switch (dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return row_bytes % 16 == 0 && aligned16(t.w0) && (!two || aligned16(t.w1));
    case DType::Q8_0:
    case DType::Q4_0:  // 2-byte loads: blocks are 2-byte aligned when the base is
      return (reinterpret_cast<uintptr_t>(t.w0) & 1u) == 0 && (!two || (reinterpret_cast<uintptr_t>(t.w1) & 1u) == 0);
    default:  // no fast kernel for the other block types yet
      return false;
  }
}

// Elements per lane piece of the fast path.
int piece_elems(DType dtype) {
  switch (dtype) {
    case DType::F16:
      return Piece<DType::F16>::kElems;
    case DType::BF16:
      return Piece<DType::BF16>::kElems;
    case DType::Q4_0:
      return Piece<DType::Q4_0>::kElems;
    case DType::F32:
      return Piece<DType::F32>::kElems;
    case DType::Q8_0:
      return Piece<DType::Q8_0>::kElems;
    default:
      return 1;
  }
}

// One launch of the kernel for the dtype (fast or generic, see fast_path_ok).
void launch_dtype(DType dtype, bool fast, bool two, int nt_max, const Batch& b, int nb, cudaStream_t s) {
  switch (dtype) {
    case DType::F32:
      launch<DType::F32>(fast, two, nt_max, b, nb, s);
      break;
    case DType::F16:
      launch<DType::F16>(fast, two, nt_max, b, nb, s);
      break;
    case DType::BF16:
      launch<DType::BF16>(fast, two, nt_max, b, nb, s);
      break;
    case DType::Q8_0:
      launch<DType::Q8_0>(fast, two, nt_max, b, nb, s);
      break;
    case DType::Q4_0:
      launch<DType::Q4_0>(fast, two, nt_max, b, nb, s);
      break;
    case DType::Q4_1:
      launch_generic<DType::Q4_1>(b, nb, s);
      break;
    case DType::Q5_0:
      launch_generic<DType::Q5_0>(b, nb, s);
      break;
    case DType::Q5_1:
      launch_generic<DType::Q5_1>(b, nb, s);
      break;
    case DType::IQ4_NL:
      launch_generic<DType::IQ4_NL>(b, nb, s);
      break;
    case DType::Q2_K:
      launch_generic<DType::Q2_K>(b, nb, s);
      break;
    case DType::Q3_K:
      launch_generic<DType::Q3_K>(b, nb, s);
      break;
    case DType::Q4_K:
      launch_generic<DType::Q4_K>(b, nb, s);
      break;
    case DType::Q5_K:
      launch_generic<DType::Q5_K>(b, nb, s);
      break;
    case DType::Q6_K:
      launch_generic<DType::Q6_K>(b, nb, s);
      break;
  }
}

}  // namespace

void gemv(const Ctx& ctx, DType dtype, GemvMode mode, const GemvTask* tasks, int count, GemvSplit split) {
  const bool two = mode == GemvMode::SwiGLU;
  for (int i0 = 0; i0 < count; i0 += kGemvMaxTasks) {
    const int cnt = std::min(kGemvMaxTasks, count - i0);
    bool fast = true;
    int nt_max = 1;
    for (int i = 0; i < cnt; ++i) {
      const GemvTask& t = tasks[i0 + i];
      SW_CHECK(t.nt >= 1 && t.nt <= kGemvMaxTokens, "CUDA gemv: ", t.nt, " tokens (1..", kGemvMaxTokens, " per pass)");
      SW_CHECK(t.w0 != nullptr && t.x != nullptr && t.y != nullptr && (!two || t.w1 != nullptr),
               "CUDA gemv: a task is missing its matrix or vectors");
      SW_CHECK(t.rows >= 0 && t.cols > 0 && t.cols % dtype_block_elems(dtype) == 0, "CUDA gemv: ", t.cols,
               " columns do not hold whole ", dtype_name(dtype), " blocks");
      fast = fast && fast_path_ok(dtype, t, two);
      nt_max = std::max(nt_max, static_cast<int>(t.nt));
    }
    Batch b{};
    b.count = cnt;
    b.mode = static_cast<int32_t>(mode);
    if (fast) {
      int64_t warps = 0, min_units = INT64_MAX;
      for (int i = 0; i < cnt; ++i) {
        warps += ceil_div(tasks[i0 + i].rows, kRows);
        min_units = std::min<int64_t>(min_units, tasks[i0 + i].cols / piece_elems(dtype));
      }
      const int unroll = gemv_unroll(nt_max, two ? 2 : 1);  // as the kernel's (nt_max <= its NT, same side of 2)
      // Auto: launches with fewer row-pair warps than half the GPU's warp slots (32 per SM) and rows long
      // enough for every warp of a block to have a step of pieces.
      b.ksplit =
          split == GemvSplit::Always || (split == GemvSplit::Auto && warps < static_cast<int64_t>(ctx.sm_count) * 32 &&
                                         min_units >= static_cast<int64_t>(kWarps) * 32 * unroll);
    }
    const int rows_per_block = !fast ? kGenericRowsPerBlock : b.ksplit ? kRows : kFastRowsPerBlock;
    int64_t blocks = 0;
    for (int i = 0; i < cnt; ++i) {
      const GemvTask& t = tasks[i0 + i];
      TaskDev& d = b.task[i];
      d.w0 = t.w0;
      d.w1 = two ? t.w1 : t.w0;
      d.x = t.x;
      d.y = t.y;
      d.row_bytes = static_cast<int64_t>(dtype_row_bytes(dtype, t.cols));
      d.ldx = t.ldx;
      d.ldy = t.ldy;
      d.rows = t.rows;
      d.cols = t.cols;
      d.nt = t.nt;
      d.sel = t.sel;
      d.sel_stride = t.sel_stride;
      for (int k = 0; k < kGemvMaxTokens; ++k) d.tok[k] = t.tok[k];
      b.block_begin[i] = static_cast<int32_t>(blocks);
      blocks += ceil_div(t.rows, rows_per_block);
    }
    b.block_begin[cnt] = static_cast<int32_t>(blocks);
    SW_CHECK(blocks < (int64_t(1) << 31), "CUDA gemv: too many rows in one launch");
    if (blocks == 0) continue;
    const int nb = static_cast<int>(blocks);
    launch_dtype(dtype, fast, two, nt_max, b, nb, ctx.stream);
    check_launch("gemv kernel");
  }
}

}  // namespace cuda
}  // namespace shardwise

// executor/cuda/gemv.cu — decode GEMV for every weight dtype: y = W x for up to 8 token vectors,
// weights read once at their stored precision, products and sums in f32 (no activation rounding).
// Each warp owns 2 rows of each matrix (2 x 2 for the fused gate/up SwiGLU pass) so that every
// activation load from L1 serves several rows; lanes read consecutive 16-byte pieces (f32/f16/bf16)
// or consecutive 4/8-element pieces of GGUF blocks (q8_0/q4_0: 2-byte loads, since blocks of 34/18
// bytes are only 2-byte aligned; K-quants: 16 elements of a 256-element block in four runs of 4 that
// each share one sub-block scale), so every warp load is coalesced. Quantised codes become floats
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
  static constexpr int kRuns = 0;   // no scales
  static constexpr bool kMins = false;
  uint4 raw;
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return static_cast<int64_t>(u) * kElems + 4 * i; }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float*, float*) const { unpack_f16x8(raw, w); }
};
template <>
struct Piece<DType::BF16> {
  static constexpr int kElems = 8;
  static constexpr int kRuns = 0;  // no scales
  static constexpr bool kMins = false;
  uint4 raw;
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return static_cast<int64_t>(u) * kElems + 4 * i; }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float*, float*) const { unpack_bf16x8(raw, w); }
};
template <>
struct Piece<DType::F32> {
  static constexpr int kElems = 4;
  static constexpr int kRuns = 0;  // no scales
  static constexpr bool kMins = false;
  uint4 raw;
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return static_cast<int64_t>(u) * kElems + 4 * i; }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    raw = ld_stream_v4(row + static_cast<int64_t>(u) * 16);
  }
  __device__ __forceinline__ void unpack(float* w, float*, float*) const {
    w[0] = __uint_as_float(raw.x);
    w[1] = __uint_as_float(raw.y);
    w[2] = __uint_as_float(raw.z);
    w[3] = __uint_as_float(raw.w);
  }
};
// q8_0: 4 codes of a 34-byte block (8 pieces per block), read as two 2-byte loads (blocks are only
// 2-byte aligned), plus the block's f16 scale.
template <>
struct Piece<DType::Q8_0> {
  static constexpr int kElems = 4;
  static constexpr int kRuns = 1;  // one scale for the piece
  static constexpr bool kMins = false;
  uint32_t d_bits, q;
  __device__ __forceinline__ static int64_t x_group(int u, int) { return static_cast<int64_t>(u) * 4; }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 3) * 34;
    const int k = u & 7;
    d_bits = ld_u16(bp);
    q = ld_u16(bp + 2 + 4 * k) | (ld_u16(bp + 4 + 4 * k) << 16);
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float*) const {
    const uint32_t b = q ^ 0x80808080u;  // signed codes biased to q + 128 for the exponent trick
    w[0] = byte_magic<0>(b) - (kMagic + 128.0f);
    w[1] = byte_magic<1>(b) - (kMagic + 128.0f);
    w[2] = byte_magic<2>(b) - (kMagic + 128.0f);
    w[3] = byte_magic<3>(b) - (kMagic + 128.0f);
    d[0] = f16_bits_to_float(d_bits);
  }
};
// q4_0: 4 bytes of an 18-byte block (4 pieces per block) = elements 4k..4k+3 (low nibbles) and
// 16+4k..16+4k+3 (high nibbles).
template <>
struct Piece<DType::Q4_0> {
  static constexpr int kElems = 8;
  static constexpr int kRuns = 1;  // one scale for the piece
  static constexpr bool kMins = false;
  uint32_t d_bits, q;
  __device__ __forceinline__ static int64_t x_group(int u, int i) {  // low nibbles, then high ones
    return static_cast<int64_t>(u >> 2) * 32 + 4 * (u & 3) + 16 * i;
  }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 2) * 18;
    const int k = u & 3;
    d_bits = ld_u16(bp);
    q = ld_u16(bp + 2 + 4 * k) | (ld_u16(bp + 4 + 4 * k) << 16);
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float*) const {
    const uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    w[0] = byte_magic<0>(lo) - (kMagic + 8.0f);
    w[1] = byte_magic<1>(lo) - (kMagic + 8.0f);
    w[2] = byte_magic<2>(lo) - (kMagic + 8.0f);
    w[3] = byte_magic<3>(lo) - (kMagic + 8.0f);
    w[4] = byte_magic<0>(hi) - (kMagic + 8.0f);
    w[5] = byte_magic<1>(hi) - (kMagic + 8.0f);
    w[6] = byte_magic<2>(hi) - (kMagic + 8.0f);
    w[7] = byte_magic<3>(hi) - (kMagic + 8.0f);
    d[0] = f16_bits_to_float(d_bits);
  }
};

// The K-quants: piece u is 16 elements of block u / 16 in four runs of 4 (x_group), each run inside one
// sub-block. unpack gives the codes (integers, exact as floats) and each run's scale and, where the type
// has one, its min: the kernel adds scale * sum(code * x) - min * sum(x) per run.
// Element runs of a piece over 2 x 128 halves (q6_K, q2_K, q3_K): lane k of a block's 16 takes
// positions l..l+3 (l = 4 (k % 8)) of half k / 8, at offsets 0, 32, 64 and 96 within the half.
__device__ __forceinline__ int64_t half_run(int u, int i) {
  const int k = u & 15;
  return static_cast<int64_t>(u >> 4) * 256 + 128 * (k >> 3) + 4 * (k & 7) + 32 * i;
}
// Four codes (bytes of c, minus `bias`) as floats.
__device__ __forceinline__ void codes4(uint32_t c, float bias, float* w) {
  w[0] = byte_magic<0>(c) - (kMagic + bias);
  w[1] = byte_magic<1>(c) - (kMagic + bias);
  w[2] = byte_magic<2>(c) - (kMagic + bias);
  w[3] = byte_magic<3>(c) - (kMagic + bias);
}

// q4_K (144-byte blocks: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles): piece k
// of a block reads 8 bytes of the 32 that hold sub-blocks 2j (low nibbles) and 2j + 1 (high), and the
// block's 16-byte head (d, dmin, scales) in one load.
template <>
struct Piece<DType::Q4_K> {
  static constexpr int kElems = 16, kRuns = 4;
  static constexpr bool kMins = true;
  static constexpr int kBlockBytes = 144, kQsOffset = 16;
  uint4 head;  // d | dmin << 16, then the 12 scale bytes
  uint2 q;
  int j;
  __device__ __forceinline__ static int64_t x_group(int u, int i) {  // runs b, b + 4, 32 + b, 36 + b
    const int k = u & 15;
    return static_cast<int64_t>(u >> 4) * 256 + 64 * (k >> 2) + 8 * (k & 3) + 4 * (i & 1) + 32 * (i >> 1);
  }
  __device__ __forceinline__ const uint8_t* load_head(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 4) * kBlockBytes;
    j = (u & 15) >> 2;
    head = __ldg(reinterpret_cast<const uint4*>(bp));
    return bp;
  }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = load_head(row, u);
    q = __ldg(reinterpret_cast<const uint2*>(bp + kQsOffset + 32 * j + 8 * (u & 3)));
  }
  // Sub-block g's scale times d and min times dmin (get_scale_min_k4 of the reference): bytes g & 3 of
  // the three scale words, picked by shifts and selects (a run-time index into an array of registers
  // would put it in local memory).
  __device__ __forceinline__ void scale_min(int g, float& dl, float& ml) const {
    const int sh = 8 * (g & 3);
    const uint32_t a = (head.y >> sh) & 0xFF, b = (head.z >> sh) & 0xFF, c = (head.w >> sh) & 0xFF;
    const bool low = g < 4;
    const uint32_t s = low ? a & 63 : (c & 0x0F) | ((a >> 6) << 4);
    const uint32_t m = low ? b & 63 : (c >> 4) | ((b >> 6) << 4);
    dl = __fmul_rn(f16_bits_to_float(head.x & 0xFFFF), static_cast<float>(s));
    ml = __fmul_rn(f16_bits_to_float(head.x >> 16), static_cast<float>(m));
  }
  // Codes of the runs (sub-blocks 2j, 2j, 2j + 1, 2j + 1) and their scales and mins.
  __device__ __forceinline__ void finish(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, float* w, float* d,
                                         float* mn) const {
    codes4(c0, 0.0f, w);
    codes4(c1, 0.0f, w + 4);
    codes4(c2, 0.0f, w + 8);
    codes4(c3, 0.0f, w + 12);
    scale_min(2 * j, d[0], mn[0]);
    scale_min(2 * j + 1, d[2], mn[2]);
    d[1] = d[0], mn[1] = mn[0], d[3] = d[2], mn[3] = mn[2];
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float* mn) const {
    const uint32_t n = 0x0F0F0F0Fu;
    finish(q.x & n, q.y & n, (q.x >> 4) & n, (q.y >> 4) & n, w, d, mn);
  }
};

// q5_K (176-byte blocks): q4_K's layout with the fifth bits in 32 bytes before the nibbles; bit 2j of
// byte l belongs to element l of sub-block 2j, bit 2j + 1 to sub-block 2j + 1.
template <>
struct Piece<DType::Q5_K> : Piece<DType::Q4_K> {
  static constexpr int kBlockBytes = 176, kQsOffset = 48;
  uint2 h;
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 4) * kBlockBytes;
    j = (u & 15) >> 2;
    head = __ldg(reinterpret_cast<const uint4*>(bp));
    q = __ldg(reinterpret_cast<const uint2*>(bp + kQsOffset + 32 * j + 8 * (u & 3)));
    h = __ldg(reinterpret_cast<const uint2*>(bp + 16 + 8 * (u & 3)));
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float* mn) const {
    const int s = 2 * j;
    const uint32_t n = 0x0F0F0F0Fu, m = 0x01010101u;
    finish((q.x & n) | (((h.x >> s) & m) << 4), (q.y & n) | (((h.y >> s) & m) << 4),
           ((q.x >> 4) & n) | (((h.x >> (s + 1)) & m) << 4), ((q.y >> 4) & n) | (((h.y >> (s + 1)) & m) << 4), w, d,
           mn);
  }
};

// q6_K (210-byte blocks, 2-byte aligned: 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed
// scales of 16 elements, d last): in half h, byte l of the low nibbles holds elements l (low) and
// 64 + l (high), byte 32 + l elements 32 + l and 96 + l; byte l of the highs their top two bits.
template <>
struct Piece<DType::Q6_K> {
  static constexpr int kElems = 16, kRuns = 4;
  static constexpr bool kMins = false;
  uint32_t a, b, hb, d_bits;
  int32_t sc[4];
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return half_run(u, i); }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 4) * 210;
    const int k = u & 15, h = k >> 3, l = 4 * (k & 7);
    a = ld_u16(bp + 64 * h + l) | (ld_u16(bp + 64 * h + l + 2) << 16);
    b = ld_u16(bp + 64 * h + 32 + l) | (ld_u16(bp + 64 * h + 34 + l) << 16);
    hb = ld_u16(bp + 128 + 32 * h + l) | (ld_u16(bp + 130 + 32 * h + l) << 16);
    const int8_t* s = reinterpret_cast<const int8_t*>(bp + 192 + 8 * h + (l >> 4));
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = __ldg(s + 2 * i);
    d_bits = ld_u16(bp + 208);
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float*) const {
    const uint32_t n = 0x0F0F0F0Fu, t = 0x03030303u;
    codes4((a & n) | ((hb & t) << 4), 32.0f, w);
    codes4((b & n) | (((hb >> 2) & t) << 4), 32.0f, w + 4);
    codes4(((a >> 4) & n) | (((hb >> 4) & t) << 4), 32.0f, w + 8);
    codes4(((b >> 4) & n) | (((hb >> 6) & t) << 4), 32.0f, w + 12);
    const float dd = f16_bits_to_float(d_bits);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = __fmul_rn(dd, static_cast<float>(sc[i]));
  }
};

// q2_K (84-byte blocks: 16 scale/min bytes of 16 elements, 64 bytes of 2-bit codes, d, dmin): in half
// h, bits 2s of byte l hold element 32s + l.
template <>
struct Piece<DType::Q2_K> {
  static constexpr int kElems = 16, kRuns = 4;
  static constexpr bool kMins = true;
  uint32_t q, dm, s0, s1;
  int shift;
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return half_run(u, i); }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 4) * 84;
    const int k = u & 15, h = k >> 3, l = 4 * (k & 7);
    q = __ldg(reinterpret_cast<const uint32_t*>(bp + 16 + 32 * h + l));
    // Sub-blocks 8h + 2s + l / 16: bytes l / 16 and 2 + l / 16 of each word.
    s0 = __ldg(reinterpret_cast<const uint32_t*>(bp + 8 * h));
    s1 = __ldg(reinterpret_cast<const uint32_t*>(bp + 8 * h + 4));
    shift = 8 * (l >> 4);
    dm = __ldg(reinterpret_cast<const uint32_t*>(bp + 80));
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float* mn) const {
    const float dd = f16_bits_to_float(dm & 0xFFFF), dmin = f16_bits_to_float(dm >> 16);
    const uint32_t scs[4] = {s0 >> shift, s0 >> (shift + 16), s1 >> shift, s1 >> (shift + 16)};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      d[s] = __fmul_rn(dd, static_cast<float>(scs[s] & 0x0F));
      mn[s] = __fmul_rn(dmin, static_cast<float>((scs[s] >> 4) & 0x0F));
      codes4((q >> (2 * s)) & 0x03030303u, 0.0f, w + 4 * s);
    }
  }
};

// q3_K (110-byte blocks, 2-byte aligned: 32 bytes of high-bit masks, 64 of 2-bit codes, 12 of packed
// 6-bit scales, d): element 32s + l of half h is code (byte l >> 2s) & 3, minus 4 unless bit 4h + s of
// mask byte l is set.
template <>
struct Piece<DType::Q3_K> {
  static constexpr int kElems = 16, kRuns = 4;
  static constexpr bool kMins = false;
  uint32_t q, m, sc[3], d_bits;
  int h, l16;
  __device__ __forceinline__ static int64_t x_group(int u, int i) { return half_run(u, i); }
  __device__ __forceinline__ void load(const uint8_t* row, int u) {
    const uint8_t* bp = row + static_cast<int64_t>(u >> 4) * 110;
    const int k = u & 15, l = 4 * (k & 7);
    h = k >> 3;
    l16 = l >> 4;
    q = ld_u16(bp + 32 + 32 * h + l) | (ld_u16(bp + 34 + 32 * h + l) << 16);
    m = ld_u16(bp + l) | (ld_u16(bp + l + 2) << 16);
#pragma unroll
    for (int i = 0; i < 3; ++i) sc[i] = ld_u16(bp + 96 + 4 * i) | (ld_u16(bp + 98 + 4 * i) << 16);
    d_bits = ld_u16(bp + 108);
  }
  // Sub-block g's signed 6-bit scale: low four bits in byte g (g < 8) or the high half of byte g - 8,
  // top two in byte 8 + g % 4 at bit 2 (g / 4); words picked by selects, not run-time indices.
  __device__ __forceinline__ int scale(int g) const {
    const uint32_t word = (g & 4) ? sc[1] : sc[0];
    const uint32_t byte = (word >> (8 * (g & 3))) & 0xFF;
    const uint32_t lo = g < 8 ? (byte & 0x0F) : (byte >> 4);
    const uint32_t hi = (sc[2] >> (8 * (g & 3) + 2 * (g >> 2))) & 3;
    return static_cast<int>(lo | (hi << 4)) - 32;
  }
  __device__ __forceinline__ void unpack(float* w, float* d, float*) const {
    const float dd = f16_bits_to_float(d_bits);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      d[s] = __fmul_rn(dd, static_cast<float>(scale(8 * h + 2 * s + l16)));
      codes4(((q >> (2 * s)) & 0x03030303u) | (((m >> (4 * h + s)) & 0x01010101u) << 2), 4.0f, w + 4 * s);
    }
  }
};

// The x elements that piece u multiplies: runs of 4 (16-byte loads; x rows are 16-byte aligned).
template <DType T>
__device__ __forceinline__ void load_x(const float* x, int u, float* xv) {
  constexpr int E = Piece<T>::kElems;
#pragma unroll
  for (int i = 0; i < E / 4; ++i) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + Piece<T>::x_group(u, i)));
    xv[4 * i] = a.x, xv[4 * i + 1] = a.y, xv[4 * i + 2] = a.z, xv[4 * i + 3] = a.w;
  }
}

// The sums of x over each run of a piece (for the mins of the K-quants).
template <int E, int R>
__device__ __forceinline__ void x_run_sums(const float (&xv)[E], float (&sx)[R]) {
#pragma unroll
  for (int q = 0; q < R; ++q) {
    float s = xv[q * (E / R)];
#pragma unroll
    for (int e = 1; e < E / R; ++e) s += xv[q * (E / R) + e];
    sx[q] = s;
  }
}

// acc += the piece's weights times x: plain products, or per run its code sum times the run's scale
// (minus its min times the run's x sum).
template <typename P, int E, int R>
__device__ __forceinline__ void multiply_piece(const float (&w)[E], const float (&d)[R], const float (&mn)[R],
                                               const float (&xv)[E], const float (&sx)[R], float& acc) {
  if constexpr (P::kRuns == 0) {
#pragma unroll
    for (int e = 0; e < E; ++e) acc = fmaf(w[e], xv[e], acc);
  } else {
    constexpr int L = E / R;  // elements per run
#pragma unroll
    for (int q = 0; q < R; ++q) {
      float s = w[q * L] * xv[q * L];
#pragma unroll
      for (int e = 1; e < L; ++e) s = fmaf(w[q * L + e], xv[q * L + e], s);
      acc = fmaf(d[q], s, acc);
      if constexpr (P::kMins) acc = fmaf(-mn[q], sx[q], acc);
    }
  }
}

// Pieces per row in flight per step of the fast path, for NT tokens through M matrices; half as many
// of the 16-element pieces (K-quants), whose codes, scales and mins would otherwise take the registers of
// half the warps.
__host__ __device__ constexpr int gemv_unroll(int nt, int m, int elems) {
  return (nt * m <= 2 ? 4 : 2) / (elems >= 16 ? 2 : 1);
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
  constexpr int R = P::kRuns > 0 ? P::kRuns : 1;
  // Pieces per row in flight. 8 for one vector through one matrix measured slower in the whole model
  // (nemo8b 170-173 against 175-179 tokens/s, qwen30b 250-252 against 263-270).
  constexpr int kUnroll = gemv_unroll(NT, M, E);
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
      float w[M][kRows][E], d[M][kRows][R], mn[M][kRows][R];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < kRows; ++r) pc[i][m][r].unpack(w[m][r], d[m][r], mn[m][r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t < nt) {
          float xv[E], sx[R];
          load_x<T>(xr[t], u, xv);
          if constexpr (P::kMins) x_run_sums<E, R>(xv, sx);
#pragma unroll
          for (int m = 0; m < M; ++m)
#pragma unroll
            for (int r = 0; r < kRows; ++r) multiply_piece<P>(w[m][r], d[m][r], mn[m][r], xv, sx, acc[m][r][t]);
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

// The types with a fast kernel (a Piece): all but q4_1, q5_0, q5_1 and iq4_nl, which take the generic one.
constexpr bool has_piece(DType t) {
  return !(t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL);
}

template <DType T>
void launch(bool fast, bool two, int nt_max, const Batch& b, int blocks, cudaStream_t s) {
  if constexpr (has_piece(T)) {
    if (fast) {
      if (two)
        launch_fast<T, 2>(nt_max, b, blocks, s);
      else
        launch_fast<T, 1>(nt_max, b, blocks, s);
      return;
    }
  }
  launch_kernel("GEMV kernel", gemv_generic_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, s, b);
}

bool fast_path_ok(DType dtype, const GemvTask& t, bool two) {
  if (!aligned16(t.x) || t.ldx % 4 != 0) return false;
  if (t.sel) {  // the caller checked the tables' entries
    const uint64_t row_bytes = dtype_row_bytes(dtype, t.cols);
    const bool rows_ok = dtype_is_quantized(dtype) || row_bytes % 16 == 0;
    return has_piece(dtype) && t.sel_fast && rows_ok;
  }
  if (!dtype_is_quantized(dtype) && dtype_row_bytes(dtype, t.cols) % 16 != 0) return false;
  return gemv_fast_aligned(dtype, t.w0) && (!two || gemv_fast_aligned(dtype, t.w1));
}

// Elements per lane piece of the fast path (I walks kAllDTypes to the dtype's template).
template <int I = 0>
int piece_elems(DType dtype) {
  if constexpr (I < kNumDTypes) {
    constexpr DType T = kAllDTypes[I];
    if (dtype != T) return piece_elems<I + 1>(dtype);
    if constexpr (has_piece(T)) return Piece<T>::kElems;
  }
  return 1;
}

// One launch of the kernel for the dtype (fast or generic, see fast_path_ok).
template <int I = 0>
void launch_dtype(DType dtype, bool fast, bool two, int nt_max, const Batch& b, int nb, cudaStream_t s) {
  if constexpr (I < kNumDTypes) {
    constexpr DType T = kAllDTypes[I];
    if (dtype == T)
      launch<T>(fast, two, nt_max, b, nb, s);
    else
      launch_dtype<I + 1>(dtype, fast, two, nt_max, b, nb, s);
  }
}

}  // namespace

bool gemv_fast_aligned(DType dtype, const void* w) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(w);
  switch (dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_K:  // 8-byte loads at 8-byte offsets of 16-byte multiples
    case DType::Q5_K:
      return (p & 15u) == 0;
    case DType::Q2_K:  // 4-byte loads, blocks of 84 bytes
      return (p & 3u) == 0;
    case DType::Q8_0:  // 2-byte loads: blocks are 2-byte aligned when the base is
    case DType::Q4_0:
    case DType::Q6_K:
    case DType::Q3_K:
      return (p & 1u) == 0;
    default:  // no fast kernel
      return false;
  }
}

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
      // As the kernel's (nt_max <= its NT, same side of 2).
      const int unroll = gemv_unroll(nt_max, two ? 2 : 1, piece_elems(dtype));
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

// executor/cuda/quant_gemm.cu — prefill GEMMs of quantised weights (q8_0, q4_0 and the K-quants) on tensor
// cores, exact, and many matrices (a layer's routed experts) in one launch.
//
// Why it is exact: a weight is d * q, d its block's f16 scale and q a small integer (q4_0: -8..7, q8_0:
// -128..127), which f16 holds exactly. Each activation row t is split once as x[t] * s_t = hi + lo (two
// f16 values; s_t a power of two that puts the row's largest |value| just below 2^15; lo is what hi
// left, itself rounded: ~2^-22 relative). The tensor cores multiply q by hi and by lo — products exact,
// summed in f32 over the block's 32 columns — then the block's sum is scaled by d in f32 and added to
// the output's f32 accumulator, and the output is scaled back by 1 / s_t (exact). So the error is that
// of an f32 dot product, as in the f32 reference, and no weight is ever widened to f32 in memory.
// The K-quants are the same with runs of 16 or 32 columns under one scale d (q2_K, q3_K, q6_K: 16; q4_K,
// q5_K: 32) and, for q2_K, q4_K and q5_K, a min m (weight d * q - m): per run the block sum is scaled by
// d, and m times the run's sum of hi + lo (each token's, summed once per stage) is taken off.
//
// Tiles: 128 weight rows x 64 activation rows per block of 8 warps (4 x 2, each 32 x 32 as 2 x 4 mma.sync
// m16n8k16 tiles, fragments read with ldmatrix), 64 columns (two quantised blocks) per stage, the next
// stage's global loads in registers while the tensor cores work on the current one. The tile's height
// halves the activation bytes each weight row costs (hi + lo: 4 bytes per activation, the largest
// stream); at most 128 registers per thread keep two blocks (16 warps) on an SM. Tasks (matrix, its
// activation rows, its output) are flattened into one grid; a block finds its task by binary search.
// The decoding of the weights (codes, run scales and mins) also compiles for the host: quant_gemm_decode_row,
// which a unit test checks against dequantize_row for every type and alignment without a GPU.
#include <algorithm>
#include <cstring>
#include <vector>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "shardwise's CUDA kernels need sm_80 or newer (mma.sync m16n8k16 with f16 inputs)"
#endif

namespace shardwise {
namespace cuda {
namespace {

constexpr int kBM = 128;           // weight rows per block
constexpr int kBN = 64;            // activation rows (tokens) per block
constexpr int kBK = 64;            // columns per stage: two quantised blocks
constexpr int kLds = kBK + 8;      // halves per shared row: 36 words, so 8 rows of 16 bytes hit 32 banks
constexpr int kWarpsM = kBM / 32;  // warps along the weight rows (each 32 x 32)
constexpr int kThreads = 32 * kWarpsM * (kBN / 32);
constexpr int kMaxTasks = 64;  // tasks per launch (kernel parameters are limited to 4 KB)
static_assert(kThreads == 2 * kBM && kThreads == 4 * kBN,
              "a thread loads half a weight row's and a quarter of "
              "an activation row's stage");

struct TaskDev {
  const uint8_t* w;
  float* y;
  int64_t x_row, ldy;
  int32_t rows, m;
};

struct Batch {
  int32_t count, accumulate;
  int64_t cols, row_bytes, ld;
  const __half* hi;
  const __half* lo;
  const float* inv_scale;
  int32_t tile_begin[kMaxTasks + 1];
  TaskDev task[kMaxTasks];
};
static_assert(sizeof(Batch) < 4000, "quantised GEMM batch must fit the 4 KB kernel parameter space");

__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 matrices of 16-bit values from shared memory: lanes 8j..8j+7 give the addresses of matrix
// j's rows (16 bytes each); r[j] is then the lane's pair of matrix j (row lane / 4, columns 2 (lane % 4)).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The weights' decoding below (codes, scales and mins of a share) also runs on the host, where
// quant_gemm_decode_row checks it against the reference dequantisation without a GPU: loads through the
// read-only cache on the device, plain loads on the host.
#define QG_HD __host__ __device__ __forceinline__
// A T at p (aligned for T): through the read-only cache on the device, a plain load on the host.
template <typename T>
QG_HD T load_as(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const T*>(p));
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
QG_HD uint32_t load_u16(const uint8_t* p) {
  return load_as<unsigned short>(p);
}
QG_HD uint32_t load_u32(const uint8_t* p) {
  return load_as<uint32_t>(p);
}
QG_HD uint4 load_u128(const uint8_t* p) {
  return load_as<uint4>(p);
}
// The 4 bytes from 2 bytes into `lo` on (lo's upper half, then next's lower half).
QG_HD uint32_t join_halves(uint32_t lo, uint32_t next) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, next, 16);
#else
  return (lo >> 16) | (next << 16);
#endif
}
QG_HD float half_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Two codes as an f16 pair: 1024 + code is exact in f16 (its ulp there is 1), minus the bias.
QG_HD uint32_t codes_to_half2(uint32_t c0, uint32_t c1, float bias) {
  const uint32_t bits = 0x64006400u | c0 | (c1 << 16);
  __half2 h = *reinterpret_cast<const __half2*>(&bits);
  h = __hsub2(h, __float2half2_rn(1024.0f + bias));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16-bit word i of words packed two to a register (i known at compile time).
QG_HD uint32_t word16(const uint32_t* w, int i) {
  return (w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
}

// Register i of w[N] for an i known only at run time, by selection (indexing registers at run time would
// put the array in local memory).
template <int N>
QG_HD uint32_t select_reg(const uint32_t (&w)[N], int i) {
  uint32_t r = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) r = j == i ? w[j] : r;
  return r;
}

// A row of 32 f16 codes (16 registers) into shared memory as four 16-byte stores.
QG_HD void store_row32(__half* row, const uint32_t (&c)[16]) {
  uint4* r = reinterpret_cast<uint4*>(row);
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = make_uint4(c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]);
}

// N 16-bit words at p, packed two to a register into w[N / 2]: 16-byte loads where p is 16-byte aligned
// (q4_K and q5_K blocks in an aligned row), 4-byte loads where it is 4-byte aligned (q2_K), else (q6_K, q3_K,
// q4_0, q8_0: 2-byte aligned blocks) the N / 2 + 1 aligned words around the bytes joined by funnel shifts.
// The first of those words starts 2 bytes before p and the last ends 2 bytes past p + 2N, each an aligned
// word that holds bytes of the range, so on the same page (never a fault); the 4 extra bytes are not used.
// Past a matrix's last byte they fall in its allocation's padding (device allocations start 256-byte aligned).
template <int N>
QG_HD void load_words(const uint8_t* p, uint32_t* w) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (N % 8 == 0 && (at & 15) == 0) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const uint4 v = load_u128(p + 16 * j);
      w[4 * j] = v.x, w[4 * j + 1] = v.y, w[4 * j + 2] = v.z, w[4 * j + 3] = v.w;
    }
  } else if ((at & 3) == 0) {
#pragma unroll
    for (int j = 0; j < N / 2; ++j) w[j] = load_u32(p + 4 * j);
  } else {
    const uint8_t* q = p - 2;
    uint32_t prev = load_u32(q);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const uint32_t next = load_u32(q + 4 * (j + 1));
      w[j] = join_halves(prev, next);
      prev = next;
    }
  }
}

// One thread's share of a stage's weights: row tid / 2 of the tile, quantised block tid % 2 of the
// stage (its scale bits and its 16 or 32 code bytes, packed two 16-bit words to a register).
template <DType T>
struct WeightShare {
  static constexpr int kRunLen = 32;  // columns under one scale
  static constexpr bool kMins = false;
  static constexpr int kWords = T == DType::Q4_0 ? 8 : 16;  // 16-bit words of codes
  static constexpr int kBlockBytes = T == DType::Q4_0 ? 18 : 34;
  uint32_t d = 0;
  uint32_t v[kWords / 2];
  // Stage s's block `half` of the weight row.
  QG_HD void load(const uint8_t* wrow, int64_t s, int half, bool valid) {
    const uint8_t* blk = wrow + (2 * s + half) * kBlockBytes;
    if (!valid) {
      d = 0;
#pragma unroll
      for (int i = 0; i < kWords / 2; ++i) v[i] = T == DType::Q4_0 ? 0x88888888u : 0u;  // codes of 0
      return;
    }
    d = load_u16(blk);
    load_words<kWords>(blk + 2, v);
  }
  // Writes the block's 32 codes as f16 into a shared row, and its scale (applied after the block's sum) as
  // run `half` of the stage's row lr.
  QG_HD void store(__half* row, float (*d_s)[kBM], float (*)[kBM], int lr, int half) const {
    uint32_t r[16];
    if (T == DType::Q4_0) {
      // Byte j (j < 16): element j in its low nibble, element j + 16 in its high one.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t w = word16(v, i);  // bytes 2i, 2i + 1
        r[i] = codes_to_half2(w & 0xFu, (w >> 8) & 0xFu, 8.0f);
        r[8 + i] = codes_to_half2((w >> 4) & 0xFu, (w >> 12) & 0xFu, 8.0f);
      }
    } else {
      // int8 codes, offset by 128 so that they are 0..255.
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t w = word16(v, i) ^ 0x8080u;
        r[i] = codes_to_half2(w & 0xFFu, (w >> 8) & 0xFFu, 128.0f);
      }
    }
    store_row32(row, r);
    d_s[half][lr] = half_bits_to_float(d);
  }
};
// The K-quants: stage s covers columns 64 (s % 4) .. + 64 of super-block s / 4, and a thread's half its
// 32-column group g = 2 (s % 4) + half. Raw bytes are loaded as packed 16-bit words (the blocks of q6_K and
// q3_K are only 2-byte aligned; load_words uses wider loads where it can): `a` the codes' low bits, `b` their
// high bits (q5_K, q6_K, q3_K), `h` the bytes of the scales the group needs and the super-block's d (and dmin):
//   q4_K, q5_K: d, dmin, the 12 scale bytes   q6_K: the two runs' scales, d
//   q2_K: the two runs' scale/min bytes, d; dmin   q3_K: the 12 scale bytes, d
template <DType T>
struct KShare {
  static constexpr bool kGroupScales = T == DType::Q4_K || T == DType::Q5_K;  // else one per 16 columns
  static constexpr int kRunLen = kGroupScales ? 32 : 16;
  static constexpr bool kMins = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q2_K;
  static constexpr bool kHigh = T == DType::Q5_K || T == DType::Q6_K || T == DType::Q3_K;
  static constexpr int kBlockBytes = T == DType::Q2_K   ? 84
                                     : T == DType::Q3_K ? 110
                                     : T == DType::Q4_K ? 144
                                     : T == DType::Q5_K ? 176
                                                        : 210;
  static constexpr int kHead = T == DType::Q6_K ? 1 : T == DType::Q2_K ? 2 : 4;  // registers of h
  uint32_t a[8], b[kHigh ? 8 : 1], h[kHead];
  int g = 0;

  // Byte offsets of the group's code bytes (low bits, high bits).
  QG_HD static int low_offset(int g) {
    const int half = g / 4;  // 128-column half of the super-block (q2_K, q3_K, q6_K)
    if constexpr (T == DType::Q4_K) return 16 + 32 * (g / 2);
    if constexpr (T == DType::Q5_K) return 48 + 32 * (g / 2);
    if constexpr (T == DType::Q6_K) return 64 * half + 32 * (g % 2);
    if constexpr (T == DType::Q2_K) return 16 + 32 * half;
    return 32 + 32 * half;  // Q3_K
  }
  QG_HD static int high_offset(int g) {
    if constexpr (T == DType::Q5_K) return 16;
    if constexpr (T == DType::Q6_K) return 128 + 32 * (g / 4);
    return 0;  // Q3_K: the high-bit masks
  }
  QG_HD void load(const uint8_t* wrow, int64_t s, int half, bool valid) {
    g = static_cast<int>(2 * (s & 3)) + half;
    if (!valid) {  // codes and scales of 0
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = 0;
#pragma unroll
      for (int i = 0; i < (kHigh ? 8 : 1); ++i) b[i] = T == DType::Q3_K ? 0xFFFFFFFFu : 0u;  // q3_K: set = no -4
#pragma unroll
      for (int i = 0; i < kHead; ++i) h[i] = 0;
      return;
    }
    const uint8_t* blk = wrow + (s >> 2) * kBlockBytes;
    load_words<16>(blk + low_offset(g), a);
    if constexpr (kHigh) load_words<16>(blk + high_offset(g), b);
    if constexpr (kGroupScales) {
      load_words<8>(blk, h);
    } else if constexpr (T == DType::Q6_K) {
      h[0] = load_u16(blk + 192 + 2 * g) | (load_u16(blk + 208) << 16);
    } else if constexpr (T == DType::Q2_K) {
      h[0] = load_u16(blk + 2 * g) | (load_u16(blk + 80) << 16);
      h[1] = load_u16(blk + 82);
    } else {  // Q3_K
#pragma unroll
      for (int i = 0; i < 3; ++i) h[i] = load_u16(blk + 96 + 4 * i) | (load_u16(blk + 98 + 4 * i) << 16);
      h[3] = load_u16(blk + 108);
    }
  }
  // Byte k of h (k may be known only at run time).
  QG_HD uint32_t head_byte(int k) const {
    return (select_reg(h, k >> 2) >> (8 * (k & 3))) & 0xFF;
  }
  // Code pair i of the group (elements 2i, 2i + 1) and its bias, as the reference decodes them.
  QG_HD uint32_t codes(int i) const {
    const uint32_t lo = word16(a, i);
    if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
      const int sh = 4 * (g % 2);
      uint32_t c0 = (lo >> sh) & 0xF, c1 = (lo >> (8 + sh)) & 0xF;
      if constexpr (T == DType::Q5_K) {
        const uint32_t hi = word16(b, i);
        c0 |= ((hi >> g) & 1) << 4, c1 |= ((hi >> (8 + g)) & 1) << 4;
      }
      return codes_to_half2(c0, c1, 0.0f);
    } else if constexpr (T == DType::Q6_K) {  // low nibble of 64 columns, top two bits of 32
      const int sl = 4 * ((g % 4) / 2), shh = 2 * (g % 4);
      const uint32_t hi = word16(b, i);
      const uint32_t c0 = ((lo >> sl) & 0xF) | (((hi >> shh) & 3) << 4);
      const uint32_t c1 = ((lo >> (8 + sl)) & 0xF) | (((hi >> (8 + shh)) & 3) << 4);
      return codes_to_half2(c0, c1, 32.0f);
    } else if constexpr (T == DType::Q2_K) {
      const int sh = 2 * (g % 4);
      return codes_to_half2((lo >> sh) & 3, (lo >> (8 + sh)) & 3, 0.0f);
    } else {  // Q3_K: 2 low bits, and the mask bit g that cancels the -4
      const int sh = 2 * (g % 4);
      const uint32_t hi = word16(b, i);
      const uint32_t c0 = ((lo >> sh) & 3) | (((hi >> g) & 1) << 2);
      const uint32_t c1 = ((lo >> (8 + sh)) & 3) | (((hi >> (8 + g)) & 1) << 2);
      return codes_to_half2(c0, c1, 4.0f);
    }
  }
  // The scale (and min) of the group's run r (r < 32 / kRunLen), with the reference's f32 roundings.
  QG_HD void run_scale(int r, float* d, float* m) const {
    if constexpr (kGroupScales) {  // get_scale_min_k4 over the 12 bytes after d and dmin
      uint32_t sc, mn;
      if (g < 4) {
        sc = head_byte(4 + g) & 63;
        mn = head_byte(8 + g) & 63;
      } else {
        sc = (head_byte(8 + g) & 0xF) | ((head_byte(g) >> 6) << 4);
        mn = (head_byte(8 + g) >> 4) | ((head_byte(4 + g) >> 6) << 4);
      }
      *d = half_bits_to_float(h[0] & 0xFFFF) * static_cast<float>(sc);
      *m = half_bits_to_float(h[0] >> 16) * static_cast<float>(mn);
    } else if constexpr (T == DType::Q6_K) {
      *d = half_bits_to_float(h[0] >> 16) * static_cast<float>(static_cast<int8_t>(head_byte(r)));
      *m = 0.0f;
    } else if constexpr (T == DType::Q2_K) {
      const uint32_t sb = head_byte(r);
      *d = half_bits_to_float(h[0] >> 16) * static_cast<float>(sb & 0xF);
      *m = half_bits_to_float(h[1]) * static_cast<float>(sb >> 4);
    } else {  // Q3_K: run k = 2g + r of the super-block
      const int k = 2 * g + r;
      const uint32_t low = k < 8 ? (head_byte(k) & 0xF) : (head_byte(k - 8) >> 4);
      const uint32_t top = (head_byte(8 + k % 4) >> (2 * (k / 4))) & 3;
      *d = half_bits_to_float(h[3]) * static_cast<float>(static_cast<int>(low | (top << 4)) - 32);
      *m = 0.0f;
    }
  }
  // The group's 32 codes as f16 into a shared row; its runs' scales (and mins) at runs 32 / kRunLen * half...
  QG_HD void store(__half* row, float (*d_s)[kBM], float (*m_s)[kBM], int lr, int half) const {
    uint32_t c[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) c[i] = codes(i);
    store_row32(row, c);
    constexpr int kRuns = 32 / kRunLen;
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      float d, m;
      run_scale(r, &d, &m);
      d_s[kRuns * half + r][lr] = d;
      if constexpr (kMins) m_s[kRuns * half + r][lr] = m;
    }
  }
};
template <>
struct WeightShare<DType::Q2_K> : KShare<DType::Q2_K> {};
template <>
struct WeightShare<DType::Q3_K> : KShare<DType::Q3_K> {};
template <>
struct WeightShare<DType::Q4_K> : KShare<DType::Q4_K> {};
template <>
struct WeightShare<DType::Q5_K> : KShare<DType::Q5_K> {};
template <>
struct WeightShare<DType::Q6_K> : KShare<DType::Q6_K> {};

// One thread's share of a stage's activations: row tid / 4, columns 16 * (tid % 4) .. + 16, hi and lo.
struct XShare {
  uint4 hi[2], lo[2];
  __device__ __forceinline__ void load(const __half* h, const __half* l, bool valid) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      hi[i] = valid ? *reinterpret_cast<const uint4*>(h + 8 * i) : make_uint4(0, 0, 0, 0);
      lo[i] = valid ? *reinterpret_cast<const uint4*>(l + 8 * i) : make_uint4(0, 0, 0, 0);
    }
  }
  __device__ __forceinline__ void store(__half* h, __half* l) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      *reinterpret_cast<uint4*>(h + 8 * i) = hi[i];
      *reinterpret_cast<uint4*>(l + 8 * i) = lo[i];
    }
  }
  // The sums of hi + lo over the runs of RunLen columns of the stage, as xsum_s[run][xr] (for the mins of the
  // K-quants). A run of 32 columns is two quarters: the lanes tid and tid ^ 1 add their sums. Every lane of
  // the warp calls it.
  template <int RunLen>
  __device__ __forceinline__ void store_sums(float (*xsum_s)[kBN], int xr, int quarter) const {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t hw[4] = {hi[i].x, hi[i].y, hi[i].z, hi[i].w}, lw[4] = {lo[i].x, lo[i].y, lo[i].z, lo[i].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&hw[k]));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&lw[k]));
        sum += (a.x + b.x) + (a.y + b.y);
      }
    }
    if constexpr (RunLen == 16) {
      xsum_s[quarter][xr] = sum;
    } else {
      static_assert(RunLen == 32, "runs of 16 or 32 columns");
      const float other = __shfl_xor_sync(0xffffffffu, sum, 1);
      if ((quarter & 1) == 0) xsum_s[quarter / 2][xr] = sum + other;
    }
  }
};

__device__ __forceinline__ int find_task(const Batch& b) {
  int lo = 0, hi = b.count - 1;
  const int blk = static_cast<int>(blockIdx.x);
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.tile_begin[mid] <= blk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The stage in shared memory (64 columns), run by run (RunLen columns under one scale): per 16 x 8 tile of
// the warp, the sum of codes times hi and times lo over the run on the tensor cores, then times the rows'
// scales d into acc, less the rows' mins m times the tokens' sums of hi + lo over the run (Mins).
template <int RunLen, bool Mins>
__device__ __forceinline__ void mma_stage(const __half* a_s, const __half* xh_s, const __half* xl_s,
                                          const float (*d_s)[kBM], const float (*m_s)[kBM], const float (*xsum_s)[kBN],
                                          int wm, int wn, int lane, float (&acc)[2][4][4]) {
  constexpr int kSteps = RunLen / 16;
  const int g = lane >> 2, tig = lane & 3;
  // ldmatrix addresses: the weight tile's rows lane % 16, columns 8 (lane / 16) on; the activations' rows
  // lane % 8, columns 8 ((lane / 8) % 2) on, of hi (lanes 0-15) or lo (16-31).
  const __half* a_lane = a_s + (wm + (lane & 15)) * kLds + 8 * (lane >> 4);
  const __half* x_lane = (lane < 16 ? xh_s : xl_s) + (wn + (lane & 7)) * kLds + 8 * ((lane >> 3) & 1);
#pragma unroll 1
  for (int run = 0; run < kBK / RunLen; ++run) {
    uint32_t a[kSteps][2][4];
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(a[ks][mi], a_lane + mi * 16 * kLds + run * RunLen + ks * 16);
    float d[2][2], m[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        d[mi][j] = d_s[run][wm + mi * 16 + g + 8 * j];
        m[mi][j] = Mins ? m_s[run][wm + mi * 16 + g + 8 * j] : 0.0f;
      }
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      uint32_t x[kSteps][4];  // hi, hi (+8 columns), lo, lo (+8 columns)
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) ldmatrix_x4(x[ks], x_lane + ni * 8 * kLds + run * RunLen + ks * 16);
      float s0 = 0.0f, s1 = 0.0f;
      if constexpr (Mins) {
        const int t = wn + ni * 8 + 2 * tig;
        s0 = xsum_s[run][t], s1 = xsum_s[run][t + 1];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          mma16816(blk, a[ks][mi], x[ks][0], x[ks][1]);
          mma16816(blk, a[ks][mi], x[ks][2], x[ks][3]);
        }
        // Accumulator rows g and g + 8 of the 16-row tile are weight rows; columns 2 tig and 2 tig + 1 tokens.
        float* c = acc[mi][ni];
        c[0] = fmaf(d[mi][0], blk[0], c[0]);
        c[1] = fmaf(d[mi][0], blk[1], c[1]);
        c[2] = fmaf(d[mi][1], blk[2], c[2]);
        c[3] = fmaf(d[mi][1], blk[3], c[3]);
        if constexpr (Mins) {
          c[0] = fmaf(-m[mi][0], s0, c[0]);
          c[1] = fmaf(-m[mi][0], s1, c[1]);
          c[2] = fmaf(-m[mi][1], s0, c[2]);
          c[3] = fmaf(-m[mi][1], s1, c[3]);
        }
      }
    }
  }
}

template <DType T>
__global__ void __launch_bounds__(kThreads, 2) quant_gemm_kernel(const Batch b) {
  __shared__ __align__(16) __half a_s[kBM * kLds];
  __shared__ __align__(16) __half xh_s[kBN * kLds];
  __shared__ __align__(16) __half xl_s[kBN * kLds];
  __shared__ float d_s[4][kBM], m_s[4][kBM];  // per run of the stage (2 of 32 columns, or 4 of 16)
  __shared__ float xsum_s[4][kBN];
  pdl_begin();

  const int ti = find_task(b);
  const TaskDev& tk = b.task[ti];
  const int row_tiles = (tk.rows + kBM - 1) / kBM;
  const int local = static_cast<int>(blockIdx.x) - b.tile_begin[ti];
  const int r0 = (local % row_tiles) * kBM, t0 = (local / row_tiles) * kBN;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = (warp % kWarpsM) * 32, wn = (warp / kWarpsM) * 32;
  const int64_t nblk = b.cols / 32;

  // The thread's loads: half `half` of weight row r0 + lr's stage, quarter `quarter` of activation row t0 + xr's.
  const int lr = tid >> 1, half = tid & 1, xr = tid >> 2, quarter = tid & 3;
  const bool w_row_ok = r0 + lr < tk.rows, x_row_ok = t0 + xr < tk.m;
  const uint8_t* wrow = tk.w + static_cast<int64_t>(w_row_ok ? r0 + lr : 0) * b.row_bytes;
  const int64_t xoff = (tk.x_row + (x_row_ok ? t0 + xr : 0)) * b.ld + 16 * quarter;

  using W = WeightShare<T>;
  W ws;
  XShare xs;
  auto load_stage = [&](int64_t s) {
    ws.load(wrow, s, half, w_row_ok && 2 * s + half < nblk);
    xs.load(b.hi + xoff + s * kBK, b.lo + xoff + s * kBK, x_row_ok && 2 * s + quarter / 2 < nblk);
  };

  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.0f;

  const int64_t stages = (nblk + 1) / 2;
  load_stage(0);
  for (int64_t s = 0; s < stages; ++s) {
    __syncthreads();  // the last stage's fragments are read
    ws.store(a_s + lr * kLds + 32 * half, d_s, m_s, lr, half);
    xs.store(xh_s + xr * kLds + 16 * quarter, xl_s + xr * kLds + 16 * quarter);
    if constexpr (W::kMins) xs.store_sums<W::kRunLen>(xsum_s, xr, quarter);
    __syncthreads();
    if (s + 1 < stages) load_stage(s + 1);  // in flight while the tensor cores work
    mma_stage<W::kRunLen, W::kMins>(a_s, xh_s, xl_s, d_s, m_s, xsum_s, wm, wn, lane, acc);
  }

  // Accumulator element (i, j): weight row g (+8 for j >= 2), activation row 2 tig + (j & 1).
  const int g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = r0 + wm + mi * 16 + g + (j >= 2 ? 8 : 0);
        const int t = t0 + wn + ni * 8 + 2 * tig + (j & 1);
        if (r >= tk.rows || t >= tk.m) continue;
        float* out = tk.y + static_cast<int64_t>(t) * tk.ldy + r;
        const float v = acc[mi][ni][j] * b.inv_scale[tk.x_row + t];
        *out = b.accumulate ? *out + v : v;
      }
}

// Row t: s = 2^(15 - e) with max|x[t]| < 2^e (1 for a zero or non-finite maximum), hi = f16(x s),
// lo = f16(x s - hi), inv_scale = 1 / s.
__global__ void split_rows_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, __half* hi, __half* lo,
                                  int64_t ld, float* inv_scale) {
  pdl_begin();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * ldx;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(row[c]));
  __shared__ float part[32];
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) m = fmaxf(m, part[i]);
  float s = 1.0f;
  if (m > 0.0f && !isinf(m) && !isnan(m)) {
    int e = 0;
    frexpf(m, &e);
    s = ldexpf(1.0f, min(max(15 - e, -100), 100));
  }
  __half* h = hi + static_cast<int64_t>(blockIdx.x) * ld;
  __half* l = lo + static_cast<int64_t>(blockIdx.x) * ld;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = row[c] * s;
    const __half a = __float2half_rn(v);
    h[c] = a;
    l[c] = __float2half_rn(v - __half2float(a));  // v - a is exact
  }
  if (threadIdx.x == 0) inv_scale[blockIdx.x] = 1.0f / s;
}

// The kernel of the dtype (I walks the types quant_gemm computes).
constexpr DType kQuantGemmTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q2_K, DType::Q3_K,
                                     DType::Q4_K, DType::Q5_K, DType::Q6_K};
template <int I = 0>
void launch_for(DType dtype, dim3 grid, const Batch& b, cudaStream_t stream) {
  if constexpr (I < static_cast<int>(sizeof(kQuantGemmTypes) / sizeof(kQuantGemmTypes[0]))) {
    constexpr DType T = kQuantGemmTypes[I];
    if (dtype == T)
      launch_kernel("quantised GEMM kernel", quant_gemm_kernel<T>, grid, dim3(kThreads), 0, stream, b);
    else
      launch_for<I + 1>(dtype, grid, b, stream);
  }
}

// quant_gemm_decode_row for one type: each stage's shares loaded and stored as the kernel does (as row 0 of
// the tile), then d * code - m per column from the stored codes and run scales.
template <DType T>
void decode_row_as(const uint8_t* row, int64_t cols, float* out) {
  using W = WeightShare<T>;
  std::vector<float> scales(2 * 4 * kBM);
  auto* d_s = reinterpret_cast<float(*)[kBM]>(scales.data());
  auto* m_s = reinterpret_cast<float(*)[kBM]>(scales.data() + 4 * kBM);
  __half codes[kBK];
  const int64_t nblk = cols / 32;
  for (int64_t s = 0; 2 * s < nblk; ++s)
    for (int half = 0; half < 2 && 2 * s + half < nblk; ++half) {
      W ws;
      ws.load(row, s, half, true);
      ws.store(codes + 32 * half, d_s, m_s, 0, half);
      for (int c = 32 * half; c < 32 * half + 32; ++c) {
        const int run = c / W::kRunLen;
        out[kBK * s + c] = d_s[run][0] * __half2float(codes[c]) - (W::kMins ? m_s[run][0] : 0.0f);
      }
    }
}
template <int I = 0>
void decode_row_for(DType dtype, const uint8_t* row, int64_t cols, float* out) {
  if constexpr (I < static_cast<int>(sizeof(kQuantGemmTypes) / sizeof(kQuantGemmTypes[0]))) {
    if (dtype == kQuantGemmTypes[I])
      decode_row_as<kQuantGemmTypes[I]>(row, cols, out);
    else
      decode_row_for<I + 1>(dtype, row, cols, out);
  }
}

}  // namespace

void quant_gemm_decode_row(DType dtype, const uint8_t* row, int64_t cols, float* out) {
  SW_CHECK(quant_gemm_computes(dtype) && cols > 0 && cols % dtype_block_elems(dtype) == 0,
           "quant_gemm_decode_row: ", cols, " columns of ", dtype_name(dtype));
  decode_row_for(dtype, row, cols, out);
}

bool quant_gemm_computes(DType dtype) {
  for (DType t : kQuantGemmTypes)
    if (t == dtype) return true;
  return false;
}

uint64_t split_rows_bytes(int64_t rows, int64_t cols) {
  const uint64_t r = static_cast<uint64_t>(std::max<int64_t>(rows, 1));
  return 2 * align_up(r * static_cast<uint64_t>(cols) * 2) + align_up(r * 4) + 3 * 256;
}

SplitRows split_rows(const Ctx& ctx, const float* x, int64_t ldx, int64_t rows, int64_t cols) {
  SW_CHECK(cols > 0 && cols % 32 == 0 && rows >= 1 && rows < (int64_t(1) << 31), "CUDA quantised GEMM: cannot split ",
           rows, " rows of ", cols, " columns");
  SplitRows s;
  s.rows = rows;
  s.ld = cols;
  const uint64_t elems = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  s.hi = ctx.ws->take<__half>(elems, "split activations (hi)");
  s.lo = ctx.ws->take<__half>(elems, "split activations (lo)");
  s.inv_scale = ctx.ws->take<float>(static_cast<uint64_t>(rows), "split activations (scales)");
  launch_kernel("split rows kernel", split_rows_kernel, dim3(static_cast<unsigned>(rows)), dim3(256), 0, ctx.stream, x,
                ldx, cols, s.hi, s.lo, s.ld, s.inv_scale);
  return s;
}

void quant_gemm(const Ctx& ctx, DType dtype, const SplitRows& x, int64_t cols, const QuantGemmTask* tasks, int count,
                bool accumulate) {
  SW_CHECK(quant_gemm_computes(dtype), "CUDA quantised GEMM: no kernel for ", dtype_name(dtype), " weights");
  SW_CHECK(cols > 0 && cols % dtype_block_elems(dtype) == 0 && cols == x.ld, "CUDA quantised GEMM: ", cols,
           " columns against split activations of ", x.ld);
  for (int i0 = 0; i0 < count; i0 += kMaxTasks) {
    Batch b;
    std::memset(&b, 0, sizeof b);
    b.accumulate = accumulate ? 1 : 0;
    b.cols = cols;
    b.row_bytes = static_cast<int64_t>(dtype_row_bytes(dtype, cols));
    b.ld = x.ld;
    b.hi = x.hi;
    b.lo = x.lo;
    b.inv_scale = x.inv_scale;
    int64_t tiles = 0;
    for (int i = i0; i < std::min(count, i0 + kMaxTasks); ++i) {
      const QuantGemmTask& t = tasks[i];
      if (t.rows <= 0 || t.m <= 0) continue;
      SW_CHECK(t.w && t.y && t.x_row >= 0 && t.x_row + t.m <= x.rows && t.ldy >= t.rows,
               "CUDA quantised GEMM: a task outside its activations or output");
      TaskDev& d = b.task[b.count];
      d.w = t.w;
      d.y = t.y;
      d.x_row = t.x_row;
      d.ldy = t.ldy;
      d.rows = t.rows;
      d.m = t.m;
      b.tile_begin[b.count] = static_cast<int32_t>(tiles);
      tiles += ceil_div(t.rows, kBM) * ceil_div(t.m, kBN);
      SW_CHECK(tiles < (int64_t(1) << 31), "CUDA quantised GEMM: too many tiles for one launch");
      ++b.count;
    }
    if (b.count == 0) continue;
    b.tile_begin[b.count] = static_cast<int32_t>(tiles);
    launch_for(dtype, dim3(static_cast<unsigned>(tiles)), b, ctx.stream);
  }
}

}  // namespace cuda
}  // namespace shardwise

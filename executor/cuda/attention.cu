// executor/cuda/attention.cu — causal GQA attention over f32, f16, bf16 or q8_0 KV caches, computed in f32
// (no tensor cores: TF32 or f16 scores would break the 1e-4 logits contract; a 16-bit or q8_0 cache rounds
// only what is stored, as the CPU's does). Every kernel is compiled for each cache type (KT: float, __half,
// __nv_bfloat16 or BlockQ8_0, whose blocks are dequantised as they are loaded: Q8Rows). The score matrix
// is never materialised: both kernels keep a running max, sum and output per query row (online softmax).
//  - Decode (n <= 8): lanes hold a contiguous slice of head_dim, so K and V rows are read with
//    coalesced vector loads; a warp takes a group of <= 4 query rows of one kv head over a range of
//    keys, and the keys of a long context are split (split-K) into ranges whose partial (max, sum,
//    output) a second kernel combines (a block per query row: threads over splits, then over
//    head_dim). Two kernels, both pipelined (the next keys' loads issued before the current ones' math:
//    a warp's loop is otherwise a chain of DRAM round trips, at 1K context 16 of ~1 us): a block of 8
//    warps per split, each over 1/8 of its keys, their states merged in shared memory, so that a warp's
//    chain is ~2 steps long and there are fewer partials to combine; and, for steps of more than two
//    groups of 4 query rows per kv head, a warp per split.
//  - Prefill: 64 query rows (tokens x heads of one kv group) per block of 256 threads; K (transposed)
//    and V tiles in shared memory; each thread owns a 4 x 4 (or 4 x 2) tile of scores and a 4 x D/16
//    tile of the output. Long contexts with few query tiles are split over keys as above.
// Every head_dim from 1 to 256 runs: the kernels are compiled for D = 32, 64, 128 and 256 and a
// head_dim hd runs with the next D, the elements hd .. D-1 of q, k and v read as 0 (so scores and
// outputs are unchanged) and outputs beyond hd never written. The FULL variant (hd == D with 16-byte
// aligned q/k/v rows) keeps the plain vector loads; the other variant guards its loads, in float4
// pieces when hd % 4 == 0 and the rows are 16-byte aligned (a uniform flag), element by element
// otherwise (per-head offsets h * hd are then not 16-byte aligned). A 16-bit cache's rows are read in
// pieces of 4 values (8 bytes), so its rows need 8-byte alignment where f32 rows need 16 (q8_0 rows: 2, the
// block's).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/kernels.cuh"

namespace shardwise {
namespace cuda {
namespace {

constexpr int kDecodeWarps = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct KArgs {
  const float* q;
  int64_t q_stride;
  const void* k;  // rows of the kernels' KT (KvRows<KT>)
  const void* v;
  int64_t kv_stride;
  float* out;
  int64_t out_stride;
  float* part_o;   // [splits][n * n_heads][hd]    (split-K only)
  float* part_ml;  // [splits][n * n_heads][2]: running max, sum
  int32_t n, pos_first, n_heads, n_kv_heads, group;
  int32_t n_splits, keys_per_split;
  int32_t hd;    // the real head_dim (<= the kernel's D)
  int32_t vec4;  // non-FULL variant: hd % 4 == 0 and q/k/v rows aligned for 4-element pieces
  float scale;
};

template <int C>
__device__ __forceinline__ void load_vec(const float* p, float* v) {
  if constexpr (C % 4 == 0) {
#pragma unroll
    for (int i = 0; i < C; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + i);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  } else if constexpr (C == 2) {
    const float2 f = *reinterpret_cast<const float2*>(p);
    v[0] = f.x;
    v[1] = f.y;
  } else {
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = p[i];
  }
}

// 4 floats of a head row, elements d0 .. d0 + 3 (p points at element d0); elements at or beyond hd
// read as 0. FULL: all in range and 16-byte aligned. vec4 (then hd % 4 == 0 and d0 % 4 == 0): the 4
// are all in or all out, and 16-byte aligned.
template <bool FULL>
__device__ __forceinline__ float4 load4(const float* p, int d0, int hd, bool vec4) {
  if constexpr (FULL) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    if (vec4) return d0 < hd ? *reinterpret_cast<const float4*>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 r;
    r.x = d0 < hd ? p[0] : 0.0f;
    r.y = d0 + 1 < hd ? p[1] : 0.0f;
    r.z = d0 + 2 < hd ? p[2] : 0.0f;
    r.w = d0 + 3 < hd ? p[3] : 0.0f;
    return r;
  }
}

// C consecutive floats of a head row starting at element d0 (p points at it), as load4.
template <int C, bool FULL>
__device__ __forceinline__ void load_head(const float* p, int d0, int hd, bool vec4, float* v) {
  if constexpr (FULL) {
    load_vec<C>(p, v);
  } else if constexpr (C % 4 == 0) {
#pragma unroll
    for (int i = 0; i < C; i += 4) {
      const float4 f = load4<false>(p + i, d0 + i, hd, vec4);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = d0 + i < hd ? p[i] : 0.0f;
  }
}

// The same loads from a 16-bit cache (f16 or bf16): 4 values (8 bytes) at a time, widened to f32. Wide<H>
// names the type's pairs and widenings; it is empty for float, so these overloads never take f32 rows.
template <typename H>
struct Wide {};
template <>
struct Wide<__half> {
  using H2 = __half2;
  __device__ static float one(__half x) { return __half2float(x); }
  __device__ static float2 two(__half2 x) { return __half22float2(x); }
};
template <>
struct Wide<__nv_bfloat16> {
  using H2 = __nv_bfloat162;
  __device__ static float one(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static float2 two(__nv_bfloat162 x) { return __bfloat1622float2(x); }
};

template <typename H, typename H2 = typename Wide<H>::H2>
__device__ __forceinline__ float4 wide4_at(const H* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  H2 lo, hi;
  memcpy(&lo, &u.x, 4);
  memcpy(&hi, &u.y, 4);
  const float2 a = Wide<H>::two(lo), b = Wide<H>::two(hi);
  return make_float4(a.x, a.y, b.x, b.y);
}

template <int C, typename H, typename H2 = typename Wide<H>::H2>
__device__ __forceinline__ void load_vec(const H* p, float* v) {
  if constexpr (C % 4 == 0) {
#pragma unroll
    for (int i = 0; i < C; i += 4) {
      const float4 f = wide4_at(p + i);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  } else if constexpr (C == 2) {
    const float2 f = Wide<H>::two(*reinterpret_cast<const H2*>(p));
    v[0] = f.x;
    v[1] = f.y;
  } else {
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = Wide<H>::one(p[i]);
  }
}

template <bool FULL, typename H, typename = typename Wide<H>::H2>
__device__ __forceinline__ float4 load4(const H* p, int d0, int hd, bool vec4) {
  if constexpr (FULL) {
    return wide4_at(p);
  } else {
    if (vec4) return d0 < hd ? wide4_at(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 r;
    r.x = d0 < hd ? Wide<H>::one(p[0]) : 0.0f;
    r.y = d0 + 1 < hd ? Wide<H>::one(p[1]) : 0.0f;
    r.z = d0 + 2 < hd ? Wide<H>::one(p[2]) : 0.0f;
    r.w = d0 + 3 < hd ? Wide<H>::one(p[3]) : 0.0f;
    return r;
  }
}

template <int C, bool FULL, typename H, typename = typename Wide<H>::H2>
__device__ __forceinline__ void load_head(const H* p, int d0, int hd, bool vec4, float* v) {
  if constexpr (FULL) {
    load_vec<C>(p, v);
  } else if constexpr (C % 4 == 0) {
#pragma unroll
    for (int i = 0; i < C; i += 4) {
      const float4 f = load4<false>(p + i, d0 + i, hd, vec4);
      v[i] = f.x;
      v[i + 1] = f.y;
      v[i + 2] = f.z;
      v[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = d0 + i < hd ? Wide<H>::one(p[i]) : 0.0f;
  }
}

// A q8_0 cache's rows: a row pointer is element e of the cache, in block e / 32 (an f16 scale d and 32
// int8 codes q), read as d * q (exact in f32, as the CPU dequantises). Offsets (kv head g at g * hd, key
// j at j * kv_stride, a lane's slice) count elements as for the other caches; the C <= 8 values of one
// read never straddle a block, as they start at a multiple of C and hd and the strides are multiples
// of 32 (the host checks). Elements at or beyond hd (padded head_dims) read as 0: hd is a multiple of
// 4, so a read is all in or all out.
struct Q8Rows {
  const BlockQ8_0* base;
  int64_t e;
  __device__ Q8Rows operator+(int64_t n) const { return {base, e + n}; }
};

template <int C>
__device__ __forceinline__ void load_vec(Q8Rows p, float* v) {
  const BlockQ8_0& b = p.base[p.e / kQK8_0];
  const float d = __half2float(__ushort_as_half(b.d));
  const int o = static_cast<int>(p.e % kQK8_0);
#pragma unroll
  for (int i = 0; i < C; ++i) v[i] = __fmul_rn(d, static_cast<float>(b.qs[o + i]));
}

template <bool FULL>
__device__ __forceinline__ float4 load4(Q8Rows p, int d0, int hd, bool) {
  if (!FULL && d0 >= hd) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float v[4];
  load_vec<4>(p, v);
  return make_float4(v[0], v[1], v[2], v[3]);
}

template <int C, bool FULL>
__device__ __forceinline__ void load_head(Q8Rows p, int d0, int hd, bool, float* v) {
  if (FULL || d0 < hd) {
    load_vec<C>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = 0.0f;
  }
}

// The kernels' view of a cache of KT (float, __half, __nv_bfloat16: a pointer; BlockQ8_0: Q8Rows).
template <typename KT>
struct KvRows {
  using Ptr = const KT*;
  __device__ static Ptr at(const void* p) { return static_cast<Ptr>(p); }
};
template <>
struct KvRows<BlockQ8_0> {
  using Ptr = Q8Rows;
  __device__ static Ptr at(const void* p) { return {static_cast<const BlockQ8_0*>(p), 0}; }
};

// Query row i of kv group g (rows of a group: token-major, then the group's heads).
__device__ __forceinline__ void row_of(const KArgs& a, int g, int i, int& t, int& h) {
  t = i / a.group;
  h = g * a.group + i % a.group;
}

// A decode warp's running state per query row: max, sum and output slice, all empty.
template <int RB, int C>
__device__ __forceinline__ void init_decode_state(float (&m)[RB], float (&l)[RB], float (&o)[RB][C]) {
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) o[r][c] = 0.0f;
  }
}

// Writes a decode warp's rows (elements d0 .. d0 + C - 1 of each, those below hd): the normalised
// output when there is one split, else the split's partial output, max and sum for the combine kernel.
template <int RB, int C, bool FULL>
__device__ __forceinline__ void store_decode_rows(const KArgs& a, int split, int lane, int d0, int hd,
                                                  const int (&pos)[RB], const int (&t_of)[RB], const int (&h_of)[RB],
                                                  const int (&row_id)[RB], const float (&m)[RB], const float (&l)[RB],
                                                  const float (&o)[RB][C]) {
  const int rows_all = a.n * a.n_heads;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (pos[r] < 0) continue;
    if (a.n_splits == 1) {
      const float inv = 1.0f / l[r];
      float* op = a.out + static_cast<int64_t>(t_of[r]) * a.out_stride + static_cast<int64_t>(h_of[r]) * hd + d0;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (FULL || d0 + c < hd) op[c] = o[r][c] * inv;
    } else {
      const int64_t pr = static_cast<int64_t>(split) * rows_all + row_id[r];
      float* op = a.part_o + pr * hd + d0;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (FULL || d0 + c < hd) op[c] = o[r][c];
      if (lane == 0) {
        a.part_ml[pr * 2] = m[r];
        a.part_ml[pr * 2 + 1] = l[r];
      }
    }
  }
}

// A decode warp's query rows (RB of kv group g from row i0): positions (-1 past the last row), row ids,
// token and head of each, the lane's slice of each q row; returns the largest position.
template <int D, int RB, bool FULL>
__device__ __forceinline__ int load_decode_rows(const KArgs& a, int g, int i0, int d0, int hd, bool vec4,
                                                float (&q)[RB][D / 32], int (&pos)[RB], int (&row_id)[RB],
                                                int (&t_of)[RB], int (&h_of)[RB]) {
  constexpr int C = D / 32;
  const int rows_g = a.n * a.group;
  int max_pos = -1;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    const int i = i0 + r;
    if (i < rows_g) {
      row_of(a, g, i, t_of[r], h_of[r]);
      pos[r] = a.pos_first + t_of[r];
      row_id[r] = t_of[r] * a.n_heads + h_of[r];
      load_head<C, FULL>(a.q + static_cast<int64_t>(t_of[r]) * a.q_stride + static_cast<int64_t>(h_of[r]) * hd + d0, d0,
                         hd, vec4, q[r]);
    } else {
      pos[r] = -1;
      row_id[r] = t_of[r] = h_of[r] = 0;
#pragma unroll
      for (int c = 0; c < C; ++c) q[r][c] = 0.0f;
    }
    max_pos = max(max_pos, pos[r]);
  }
  return max_pos;
}

// Keys per step of a decode warp. 8 (4 at head_dim 256) measured slower than this: 56 vs 44 us at 4K
// context, n = 1, on the H200.
__host__ __device__ constexpr int keys_per_step(int d) {
  return d / 32 >= 8 ? 2 : 4;
}
template <int D>
__host__ __device__ constexpr int decode_keys_per_step() {
  return keys_per_step(D);
}

// K and V rows (this lane's slice) of keys j .. j + U - 1 of kv group g; past j_end the last key again
// (loaded, never used).
template <int D, bool FULL, typename KT>
__device__ __forceinline__ void load_key_rows(const KArgs& a, int g, int d0, int hd, bool vec4, int j, int j_end,
                                              float (&kr)[decode_keys_per_step<D>()][D / 32],
                                              float (&vr)[decode_keys_per_step<D>()][D / 32]) {
  constexpr int C = D / 32;
  constexpr int U = decode_keys_per_step<D>();
  const typename KvRows<KT>::Ptr kb = KvRows<KT>::at(a.k) + static_cast<int64_t>(g) * hd + d0;
  const typename KvRows<KT>::Ptr vb = KvRows<KT>::at(a.v) + static_cast<int64_t>(g) * hd + d0;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t jj = min(j + u, j_end - 1);
    load_head<C, FULL>(kb + jj * a.kv_stride, d0, hd, vec4, kr[u]);
    load_head<C, FULL>(vb + jj * a.kv_stride, d0, hd, vec4, vr[u]);
  }
}

// One warp's keys j_begin .. j_end - 1 of kv group g folded into its rows' running max m, sum l and
// output slice o (online softmax). The next step's K/V loads are issued before this step's math, and
// kr/vr hold the first step's keys on entry when first_loaded (else they are loaded here).
template <int D, int RB, bool FULL, typename KT>
__device__ __forceinline__ void decode_warp_keys(const KArgs& a, int g, int d0, int hd, bool vec4, int j_begin,
                                                 int j_end, const float (&q)[RB][D / 32], const int (&pos)[RB],
                                                 float (&m)[RB], float (&l)[RB], float (&o)[RB][D / 32],
                                                 float (&kr)[decode_keys_per_step<D>()][D / 32],
                                                 float (&vr)[decode_keys_per_step<D>()][D / 32], bool first_loaded) {
  constexpr int C = D / 32;
  constexpr int U = decode_keys_per_step<D>();
  if (!first_loaded && j_begin < j_end) load_key_rows<D, FULL, KT>(a, g, d0, hd, vec4, j_begin, j_end, kr, vr);
  for (int j = j_begin; j < j_end; j += U) {
    float kn[U][C], vn[U][C];  // the next keys, in flight during this step's math
    load_key_rows<D, FULL, KT>(a, g, d0, hd, vec4, j + U < j_end ? j + U : j, j_end, kn, vn);
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      float s[U];
      float mx = m[r];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float d = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) d = fmaf(q[r][c], kr[u][c], d);
        d = warp_sum(d) * a.scale;
        s[u] = (j + u < j_end && j + u <= pos[r]) ? d : kNegInf;
        mx = fmaxf(mx, s[u]);
      }
      if (mx == kNegInf) continue;         // nothing visible to this row yet (warp-uniform)
      const float corr = expf(m[r] - mx);  // 0 on the first keys (m = -inf)
      float psum = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) o[r][c] *= corr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float p = expf(s[u] - mx);
        psum += p;
#pragma unroll
        for (int c = 0; c < C; ++c) o[r][c] = fmaf(p, vr[u][c], o[r][c]);
      }
      l[r] = l[r] * corr + psum;
      m[r] = mx;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        kr[u][c] = kn[u][c];
        vr[u][c] = vn[u][c];
      }
  }
}

// Warp kernel (DecodeAttn::Warps): each warp is one split.
template <int D, int RB, bool FULL, typename KT>
__global__ void __launch_bounds__(kDecodeWarps * 32) attn_decode_kernel(const KArgs a) {
  pdl_begin();
  constexpr int C = D / 32;  // head_dim elements per lane (of the padded D)
  const int hd = FULL ? D : a.hd;
  const bool vec4 = a.vec4 != 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d0 = lane * C;  // this lane's first element
  const int split = blockIdx.x * kDecodeWarps + warp;
  if (split >= a.n_splits) return;
  const int g = blockIdx.y;

  float q[RB][C];
  int pos[RB], row_id[RB], t_of[RB], h_of[RB];
  const int max_pos = load_decode_rows<D, RB, FULL>(a, g, blockIdx.z * RB, d0, hd, vec4, q, pos, row_id, t_of, h_of);
  const int j_begin = split * a.keys_per_split;
  const int j_end = min(j_begin + a.keys_per_split, max_pos + 1);
  float m[RB], l[RB], o[RB][C];
  init_decode_state<RB, C>(m, l, o);
  float kr[decode_keys_per_step<D>()][C], vr[decode_keys_per_step<D>()][C];
  decode_warp_keys<D, RB, FULL, KT>(a, g, d0, hd, vec4, j_begin, j_end, q, pos, m, l, o, kr, vr, false);
  store_decode_rows<RB, C, FULL>(a, split, lane, d0, hd, pos, t_of, h_of, row_id, m, l, o);
}

// Block kernel (DecodeAttn::Block): a block of kBlockWarps warps is one split; its warps take
// consecutive key ranges of keys_per_split / kBlockWarps each (pipelined), and their states are merged in
// shared memory (in warp order) before the split's partial (or, with one split, the output) is written.
// A split's keys are then read by 8 warps at once, ~2 steps of keys each: a warp's chain of DRAM round
// trips is 2 long where the warp kernels' is ~sqrt(context) / 4, and the combine has fewer splits.
constexpr int kBlockWarps = 8;

template <int D, int RB, bool FULL, typename KT>
__global__ void __launch_bounds__(kBlockWarps * 32) attn_decode_block_kernel(const KArgs a) {
  constexpr int C = D / 32;
  constexpr int U = decode_keys_per_step<D>();
  __shared__ float sh_o[kBlockWarps][RB][D];
  __shared__ float sh_m[kBlockWarps][RB], sh_l[kBlockWarps][RB];
  const int hd = FULL ? D : a.hd;
  const bool vec4 = a.vec4 != 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d0 = lane * C;
  const int split = blockIdx.x, g = blockIdx.y, i0 = blockIdx.z * RB;
  const int rows_g = a.n * a.group;
  // The last position this block's rows see (its last row's token), from the arguments alone.
  const int max_pos = a.pos_first + (min(i0 + RB, rows_g) - 1) / a.group;
  const int per_warp = a.keys_per_split / kBlockWarps;  // a multiple of the keys per step (host side)
  const int j_begin = split * a.keys_per_split + warp * per_warp;
  const int j_end = min(j_begin + per_warp, max_pos + 1);
  // Early loads: the first step's keys, when all of them precede this step's tokens, are cache rows no
  // kernel of this step writes (the kernel before this one, RoPE, appends rows pos_first ..), so they
  // are loaded before waiting for that kernel (programmatic dependent launch): their DRAM round trip
  // overlaps its run instead of following it.
  float kr[U][C], vr[U][C];
  const bool early = j_begin < j_end && j_begin + U <= a.pos_first;
  if (early) load_key_rows<D, FULL, KT>(a, g, d0, hd, vec4, j_begin, j_end, kr, vr);
  pdl_begin();

  float q[RB][C];
  int pos[RB], row_id[RB], t_of[RB], h_of[RB];
  load_decode_rows<D, RB, FULL>(a, g, i0, d0, hd, vec4, q, pos, row_id, t_of, h_of);
  float m[RB], l[RB], o[RB][C];
  init_decode_state<RB, C>(m, l, o);
  decode_warp_keys<D, RB, FULL, KT>(a, g, d0, hd, vec4, j_begin, j_end, q, pos, m, l, o, kr, vr, early);
#pragma unroll
  for (int r = 0; r < RB; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) sh_o[warp][r][d0 + c] = o[r][c];
    if (lane == 0) {
      sh_m[warp][r] = m[r];
      sh_l[warp][r] = l[r];
    }
  }
  __syncthreads();
  const int rows_all = a.n * a.n_heads;
  for (int e = threadIdx.x; e < RB * D; e += kBlockWarps * 32) {
    const int r = e / D, d = e % D;
    if (i0 + r >= rows_g || d >= hd) continue;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kBlockWarps; ++w) mx = fmaxf(mx, sh_m[w][r]);
    float sum = 0.0f, acc = 0.0f;
    if (mx != kNegInf) {
#pragma unroll
      for (int w = 0; w < kBlockWarps; ++w) {
        const float mw = sh_m[w][r];
        if (mw == kNegInf) continue;  // a warp that saw no key of this row adds nothing
        const float f = expf(mw - mx);
        sum = fmaf(sh_l[w][r], f, sum);
        acc = fmaf(sh_o[w][r][d], f, acc);
      }
    }
    int t, h;
    row_of(a, g, i0 + r, t, h);
    if (a.n_splits == 1) {
      a.out[static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(h) * hd + d] = acc * (1.0f / sum);
    } else {
      const int64_t pr = static_cast<int64_t>(split) * rows_all + t * a.n_heads + h;
      a.part_o[pr * hd + d] = acc;
      if (d == 0) {
        a.part_ml[pr * 2] = mx;
        a.part_ml[pr * 2 + 1] = sum;
      }
    }
  }
}

template <int D>
struct Prefill {
  static constexpr int MQ = 64;                 // query rows per block
  static constexpr int BK = D <= 64 ? 64 : 32;  // keys per tile
  static constexpr int MQP = MQ + 4;            // padded strides (16-byte aligned rows)
  static constexpr int BKP = BK + 4;
  static constexpr int KC = BK / 16;  // keys per thread in the score tile
  static constexpr int DC = D / 16;   // output columns per thread
  static constexpr int kSmemFloats = D * MQP + D * BKP + BK * D + BK * MQP;
  // Output column c of thread tx: interleaved by 64 so that a quarter-warp's float4 reads of V are
  // conflict-free.
  __device__ static int col(int tx, int c) { return DC >= 4 ? (c / 4) * 64 + tx * 4 + (c % 4) : tx * DC + c; }
};

// The block's 64 query rows, transposed into Qs [D][MQP]; rows past the step's end read as 0.
template <int D, bool FULL>
__device__ __forceinline__ void stage_prefill_queries(const KArgs& a, int g, int i_base, int hd, bool vec4, int tid,
                                                      float* Qs) {
  using P = Prefill<D>;
  const int rows_g = a.n * a.group;
  for (int e = tid; e < P::MQ * (D / 4); e += 256) {
    const int i = e % P::MQ, d4 = e / P::MQ, gi = i_base + i;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (gi < rows_g) {
      int t, h;
      row_of(a, g, gi, t, h);
      v = load4<FULL>(a.q + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(h) * hd + 4 * d4, 4 * d4, hd,
                      vec4);
    }
    Qs[(4 * d4 + 0) * P::MQP + i] = v.x;
    Qs[(4 * d4 + 1) * P::MQP + i] = v.y;
    Qs[(4 * d4 + 2) * P::MQP + i] = v.z;
    Qs[(4 * d4 + 3) * P::MQP + i] = v.w;
  }
}

// The positions of the thread's 4 query rows (-1 past the step's rows).
__device__ __forceinline__ void prefill_row_positions(const KArgs& a, int i_base, int ty, int (&pos)[4]) {
  const int rows_g = a.n * a.group;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int gi = i_base + ty * 4 + ii;
    pos[ii] = gi < rows_g ? a.pos_first + gi / a.group : -1;
  }
}

// The key tile kt .. kt + BK - 1 into Ks (transposed) and Vs; keys from k_end on read as 0.
template <int D, bool FULL, typename KT>
__device__ __forceinline__ void stage_prefill_kv(const KArgs& a, typename KvRows<KT>::Ptr kg,
                                                 typename KvRows<KT>::Ptr vg, int kt, int k_end, int hd, bool vec4,
                                                 int tid, float* Ks, float* Vs) {
  using P = Prefill<D>;
  // K tile, transposed. A warp reads 16 keys x 32 bytes (full sectors) and stores 16 consecutive
  // keys for two rows of d, 16 banks apart: conflict-free.
  for (int e = tid; e < P::BK * D / 4; e += 256) {
    const int lane5 = e & 31, hi = e >> 5;
    const int j = (lane5 & 15) + 16 * (hi % (P::BK / 16));
    const int d4 = (lane5 >> 4) + 2 * (hi / (P::BK / 16));
    const int key = kt + j;
    float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (key < k_end) kv = load4<FULL>(kg + static_cast<int64_t>(key) * a.kv_stride + 4 * d4, 4 * d4, hd, vec4);
    Ks[(4 * d4 + 0) * P::BKP + j] = kv.x;
    Ks[(4 * d4 + 1) * P::BKP + j] = kv.y;
    Ks[(4 * d4 + 2) * P::BKP + j] = kv.z;
    Ks[(4 * d4 + 3) * P::BKP + j] = kv.w;
  }
  for (int e = tid; e < P::BK * D / 4; e += 256) {
    const int j = e / (D / 4), d4 = e % (D / 4);
    const int key = kt + j;
    float4 vv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (key < k_end) vv = load4<FULL>(vg + static_cast<int64_t>(key) * a.kv_stride + 4 * d4, 4 * d4, hd, vec4);
    *reinterpret_cast<float4*>(Vs + j * D + 4 * d4) = vv;
  }
}

// The thread's 4 x KC tile of raw scores q . k over the staged tiles.
template <int D>
__device__ __forceinline__ void prefill_scores(const float* Qs, const float* Ks, int tx, int ty,
                                               float (&s)[4][Prefill<D>::KC]) {
  using P = Prefill<D>;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int jj = 0; jj < P::KC; ++jj) s[ii][jj] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) {
    const float4 qv = *reinterpret_cast<const float4*>(Qs + d * P::MQP + ty * 4);
    const float qa[4] = {qv.x, qv.y, qv.z, qv.w};
    float kk[P::KC];
    load_vec<P::KC>(Ks + d * P::BKP + tx * P::KC, kk);
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < P::KC; ++jj) s[ii][jj] = fmaf(qa[ii], kk[jj], s[ii][jj]);
  }
}

template <int D, bool FULL>
__device__ __forceinline__ void store_prefill_rows(const KArgs& a, int g, int split, int i_base, int tx, int ty, int hd,
                                                   const int (&pos)[4], const float (&m)[4], const float (&l)[4],
                                                   const float (&o)[4][Prefill<D>::DC]) {
  using P = Prefill<D>;
  const int rows_all = a.n * a.n_heads;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    if (pos[ii] < 0) continue;
    int t, h;
    row_of(a, g, i_base + ty * 4 + ii, t, h);
    if (a.n_splits == 1) {
      const float inv = 1.0f / l[ii];
      float* op = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(h) * hd;
#pragma unroll
      for (int c = 0; c < P::DC; ++c)
        if (FULL || P::col(tx, c) < hd) op[P::col(tx, c)] = o[ii][c] * inv;
    } else {
      const int64_t pr = static_cast<int64_t>(split) * rows_all + t * a.n_heads + h;
      float* op = a.part_o + pr * hd;
#pragma unroll
      for (int c = 0; c < P::DC; ++c)
        if (FULL || P::col(tx, c) < hd) op[P::col(tx, c)] = o[ii][c];
      if (tx == 0) {
        a.part_ml[pr * 2] = m[ii];
        a.part_ml[pr * 2 + 1] = l[ii];
      }
    }
  }
}

template <int D, bool FULL, typename KT>
__global__ void __launch_bounds__(256) attn_prefill_kernel(const KArgs a) {
  pdl_begin();
  using P = Prefill<D>;
  const int hd = FULL ? D : a.hd;
  const bool vec4 = a.vec4 != 0;
  extern __shared__ float4 smem_raw[];
  float* Qs = reinterpret_cast<float*>(smem_raw);  // [D][MQP]  transposed queries
  float* Ks = Qs + D * P::MQP;                     // [D][BKP]  transposed keys
  float* Vs = Ks + D * P::BKP;                     // [BK][D]
  float* Ps = Vs + P::BK * D;                      // [BK][MQP] probabilities, transposed
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int g = blockIdx.y, split = blockIdx.z;
  const int rows_g = a.n * a.group;
  const int i_base = blockIdx.x * P::MQ;

  stage_prefill_queries<D, FULL>(a, g, i_base, hd, vec4, tid, Qs);
  int pos[4];
  prefill_row_positions(a, i_base, ty, pos);
  const int last_row = min(i_base + P::MQ, rows_g) - 1;
  const int max_pos = a.pos_first + last_row / a.group;
  const int k_begin = split * a.keys_per_split;
  const int k_end = min(k_begin + a.keys_per_split, max_pos + 1);

  float m[4], l[4], o[4][P::DC];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    m[ii] = kNegInf;
    l[ii] = 0.0f;
#pragma unroll
    for (int c = 0; c < P::DC; ++c) o[ii][c] = 0.0f;
  }
  const typename KvRows<KT>::Ptr kg = KvRows<KT>::at(a.k) + static_cast<int64_t>(g) * hd;
  const typename KvRows<KT>::Ptr vg = KvRows<KT>::at(a.v) + static_cast<int64_t>(g) * hd;
  __syncthreads();

  for (int kt = k_begin; kt < k_end; kt += P::BK) {
    stage_prefill_kv<D, FULL, KT>(a, kg, vg, kt, k_end, hd, vec4, tid, Ks, Vs);
    __syncthreads();
    float s[4][P::KC];
    prefill_scores<D>(Qs, Ks, tx, ty, s);
    // Online softmax over the tile: mask and scale the scores, update each row's max and sum (over its 16
    // threads), rescale o, write P transposed to Ps. Inline, as is P V below: as helpers, D = 256 took 137
    // registers instead of 130.
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      float tmax = kNegInf;
#pragma unroll
      for (int jj = 0; jj < P::KC; ++jj) {
        const int key = kt + tx * P::KC + jj;
        s[ii][jj] = (key < k_end && key <= pos[ii]) ? s[ii][jj] * a.scale : kNegInf;
        tmax = fmaxf(tmax, s[ii][jj]);
      }
#pragma unroll
      for (int o2 = 8; o2 > 0; o2 >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
      const float mnew = fmaxf(m[ii], tmax);
      float corr = 1.0f, psum = 0.0f, p[P::KC];
      if (mnew == kNegInf) {
#pragma unroll
        for (int jj = 0; jj < P::KC; ++jj) p[jj] = 0.0f;
      } else {
        corr = expf(m[ii] - mnew);
#pragma unroll
        for (int jj = 0; jj < P::KC; ++jj) {
          p[jj] = expf(s[ii][jj] - mnew);
          psum += p[jj];
        }
      }
#pragma unroll
      for (int o2 = 8; o2 > 0; o2 >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o2);
      l[ii] = l[ii] * corr + psum;
      m[ii] = mnew;
#pragma unroll
      for (int c = 0; c < P::DC; ++c) o[ii][c] *= corr;
#pragma unroll
      for (int jj = 0; jj < P::KC; ++jj) Ps[(tx * P::KC + jj) * P::MQP + ty * 4 + ii] = p[jj];
    }
    __syncthreads();
    // o += P V: the thread's 4 rows times its DC output columns.
#pragma unroll 4
    for (int j = 0; j < P::BK; ++j) {
      const float4 pv = *reinterpret_cast<const float4*>(Ps + j * P::MQP + ty * 4);
      const float pa[4] = {pv.x, pv.y, pv.z, pv.w};
      float vv[P::DC];
      if constexpr (P::DC >= 4) {
#pragma unroll
        for (int c4 = 0; c4 < P::DC / 4; ++c4) load_vec<4>(Vs + j * D + c4 * 64 + tx * 4, vv + 4 * c4);
      } else {
        load_vec<P::DC>(Vs + j * D + tx * P::DC, vv);
      }
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int c = 0; c < P::DC; ++c) o[ii][c] = fmaf(pa[ii], vv[c], o[ii][c]);
    }
    __syncthreads();
  }
  store_prefill_rows<D, FULL>(a, g, split, i_base, tx, ty, hd, pos, m, l, o);
}

// One block per (token, head): merges the splits' partial maxima, sums and outputs. Threads go over the
// splits for the maximum; then each warp takes every kCombineWarps-th split, its lanes over head_dim
// (<= 8 elements each), so a warp's loads of one split are independent of the last split's; the warps'
// sums are added in shared memory.
constexpr int kCombineWarps = 4;
constexpr int kCombineThreads = kCombineWarps * 32;
constexpr int kCombineElems = kMaxAttentionHeadDim / 32;  // head_dim elements per lane

__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(const KArgs a) {
  pdl_begin();
  __shared__ float red[kCombineWarps];
  __shared__ float o_sh[kCombineWarps][kMaxAttentionHeadDim];
  const int hd = a.hd, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x;
  const int t = row / a.n_heads, h = row % a.n_heads;
  const int64_t rows_all = static_cast<int64_t>(a.n) * a.n_heads;
  float mx = kNegInf;
  for (int s = tid; s < a.n_splits; s += kCombineThreads) mx = fmaxf(mx, a.part_ml[(s * rows_all + row) * 2]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();  // red is reused below

  float acc[kCombineElems], lsum = 0.0f;
#pragma unroll
  for (int i = 0; i < kCombineElems; ++i) acc[i] = 0.0f;
#pragma unroll 2
  for (int s = warp; s < a.n_splits; s += kCombineWarps) {
    const int64_t pr = s * rows_all + row;
    const float* po = a.part_o + pr * hd;
    float v[kCombineElems];
#pragma unroll
    for (int i = 0; i < kCombineElems; ++i) v[i] = lane + 32 * i < hd ? po[lane + 32 * i] : 0.0f;
    const float ms = a.part_ml[pr * 2];
    if (ms == kNegInf) continue;  // a split that saw no key adds nothing (uniform over the warp)
    const float w = expf(ms - mx);
    lsum = fmaf(a.part_ml[pr * 2 + 1], w, lsum);
#pragma unroll
    for (int i = 0; i < kCombineElems; ++i) acc[i] = fmaf(v[i], w, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < kCombineElems; ++i)
    if (lane + 32 * i < hd) o_sh[warp][lane + 32 * i] = acc[i];
  if (lane == 0) red[warp] = lsum;
  __syncthreads();
  float l = red[0];
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w) l += red[w];
  const float inv = 1.0f / l;
  float* op = a.out + static_cast<int64_t>(t) * a.out_stride + static_cast<int64_t>(h) * hd;
  for (int d = tid; d < hd; d += kCombineThreads) {
    float o = o_sh[0][d];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) o += o_sh[w][d];
    op[d] = o * inv;
  }
}

template <int D, int RB, bool FULL, typename KT>
void launch_decode(const KArgs& k, int row_groups, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(ceil_div(k.n_splits, kDecodeWarps)), static_cast<unsigned>(k.n_kv_heads),
                  static_cast<unsigned>(row_groups));
  launch_kernel("attention decode kernel", attn_decode_kernel<D, RB, FULL, KT>, grid, dim3(kDecodeWarps * 32), 0, s, k);
}

template <int D, int RB, bool FULL, typename KT>
void launch_decode_block(const KArgs& k, int row_groups, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(k.n_splits), static_cast<unsigned>(k.n_kv_heads),
                  static_cast<unsigned>(row_groups));
  launch_kernel("attention decode kernel", attn_decode_block_kernel<D, RB, FULL, KT>, grid, dim3(kBlockWarps * 32), 0,
                s, k);
}

// The block kernel or the warp kernel, with rb query rows per group.
template <int D, bool FULL, typename KT>
void decode_rb(DecodeAttn kernel, int rb, const KArgs& k, int row_groups, cudaStream_t s) {
  if (kernel == DecodeAttn::Block) {
    if (rb == 1)
      launch_decode_block<D, 1, FULL, KT>(k, row_groups, s);
    else if (rb == 2)
      launch_decode_block<D, 2, FULL, KT>(k, row_groups, s);
    else
      launch_decode_block<D, 4, FULL, KT>(k, row_groups, s);
    return;
  }
  if (rb == 1)
    launch_decode<D, 1, FULL, KT>(k, row_groups, s);
  else if (rb == 2)
    launch_decode<D, 2, FULL, KT>(k, row_groups, s);
  else
    launch_decode<D, 4, FULL, KT>(k, row_groups, s);
}

template <int D, typename KT>
void decode_d(bool full, DecodeAttn kernel, int rb, const KArgs& k, int row_groups, cudaStream_t s) {
  if (full)
    decode_rb<D, true, KT>(kernel, rb, k, row_groups, s);
  else
    decode_rb<D, false, KT>(kernel, rb, k, row_groups, s);
}

template <int D, bool FULL, typename KT>
void launch_prefill(const KArgs& k, cudaStream_t s) {
  const int smem = Prefill<D>::kSmemFloats * 4;
  // The attribute belongs to the kernel on the current device: set it once per device (per
  // instantiation; setting it again would be harmless).
  static std::atomic<uint64_t> attr_set{0};  // bit per device id < 64
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit == 0 || (attr_set.load(std::memory_order_acquire) & bit) == 0) {
    check(cudaFuncSetAttribute(attn_prefill_kernel<D, FULL, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute(attention prefill)");
    attr_set.fetch_or(bit, std::memory_order_release);
  }
  const int rows_g = k.n * k.group;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows_g, Prefill<D>::MQ)), static_cast<unsigned>(k.n_kv_heads),
                  static_cast<unsigned>(k.n_splits));
  launch_kernel("attention prefill kernel", attn_prefill_kernel<D, FULL, KT>, grid, dim3(256),
                static_cast<size_t>(smem), s, k);
}

template <int D, typename KT>
void prefill_d(bool full, const KArgs& k, cudaStream_t s) {
  if (full)
    launch_prefill<D, true, KT>(k, s);
  else
    launch_prefill<D, false, KT>(k, s);
}

// The kernels' padded head size for a head_dim of 1 .. 256.
int padded_head_dim(int hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
}

// The kernels' arguments before the split: pointers, strides, shape, load variant and scale.
KArgs kernel_args(const AttnArgs& a, int hd, bool full, bool rows16) {
  KArgs k{};
  k.q = a.q;
  k.q_stride = a.q_stride;
  k.k = a.k;
  k.v = a.v;
  k.kv_stride = a.kv_stride;
  k.out = a.out;
  k.out_stride = a.out_stride;
  k.n = a.n;
  k.pos_first = a.pos_first;
  k.n_heads = a.n_heads;
  k.n_kv_heads = a.n_kv_heads;
  k.group = a.n_heads / a.n_kv_heads;
  k.hd = hd;
  k.vec4 = (!full && hd % 4 == 0 && rows16) ? 1 : 0;
  k.scale = 1.0f / sqrtf(static_cast<float>(hd));  // as the CPU: 1 / sqrt(float(head_dim))
  return k;
}

// How the keys are split: the number of splits and the keys of each.
struct KeySplit {
  int64_t splits = 1, keys_per_split = 0;
};

// The block decode kernel: blocks (splits x kv heads x row groups) up to two per SM, each warp at least
// two steps of keys (decode_min_keys, when set, instead); fewer splits where the workspace cannot hold
// their partials (`fit` splits of `per_split` bytes).
KeySplit block_decode_split(const Ctx& ctx, const AttnArgs& a, int D, int64_t kv_len, int64_t row_groups,
                            uint64_t available, uint64_t per_split) {
  const int64_t step = keys_per_step(D);
  const int64_t want =
      std::max<int64_t>(1, ceil_div(static_cast<int64_t>(ctx.sm_count) * 2, a.n_kv_heads * row_groups));
  int64_t per_warp =
      std::max<int64_t>(a.decode_min_keys > 0 ? a.decode_min_keys : 2 * step, ceil_div(kv_len, want * kBlockWarps));
  per_warp = ceil_div(per_warp, step) * step;
  int64_t splits = ceil_div(kv_len, per_warp * kBlockWarps);
  if (splits > 1) {
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(available / per_split));
    if (splits > fit) {
      per_warp = ceil_div(ceil_div(kv_len, fit * kBlockWarps), step) * step;
      splits = ceil_div(kv_len, per_warp * kBlockWarps);
    }
  }
  SW_CHECK(per_warp * kBlockWarps < (int64_t(1) << 31), "CUDA attention: too many keys per split");
  return {splits, per_warp * kBlockWarps};
}

// The warp decode kernel and prefill: enough warps (decode) or blocks (prefill) to fill the GPU, each
// split at least min_keys keys, as many splits as the workspace holds.
KeySplit grid_split(const Ctx& ctx, const AttnArgs& a, bool decode, int64_t kv_len, int64_t rows_g, int64_t row_groups,
                    uint64_t available, uint64_t per_split) {
  int64_t base_units = 0, min_keys = 0;
  if (decode) {
    base_units = static_cast<int64_t>(a.n_kv_heads) * row_groups;  // warps per split
    // A warp's loop grows with its keys and the combine with the splits (keys x splits = context):
    // about sqrt(context) of each (the warp kernel: 32 keys best at 1K, 18 us against 21 at 64; 64 at
    // 4K, 34 us against 43 at 32 and 39 at 128).
    min_keys = a.decode_min_keys > 0
                   ? a.decode_min_keys
                   : std::max<int64_t>(16, static_cast<int64_t>(std::sqrt(static_cast<double>(kv_len))));
  } else {
    base_units = ceil_div(rows_g, Prefill<64>::MQ) * a.n_kv_heads;  // blocks per split
    min_keys = 256;
  }
  const int64_t target = decode ? static_cast<int64_t>(ctx.sm_count) * 16 : static_cast<int64_t>(ctx.sm_count) * 2;
  int64_t splits = std::max<int64_t>(1, std::min(ceil_div(target, base_units), ceil_div(kv_len, min_keys)));
  splits = std::min<int64_t>(splits, 65535);
  if (splits > 1) splits = std::min<int64_t>(splits, static_cast<int64_t>(available / per_split));
  if (splits < 1) splits = 1;
  const int64_t step = decode ? 4 : 64;
  const int64_t kps = ceil_div(ceil_div(kv_len, splits), step) * step;
  return {ceil_div(kv_len, kps), kps};
}

// The decode or prefill kernel for head size D and cache type KT, then (split keys only) the combine kernel.
template <typename KT>
void launch_attention(const Ctx& ctx, const KArgs& k, int D, bool full, bool decode, DecodeAttn kernel, int rb,
                      int64_t row_groups, int64_t rows_all) {
  if (decode) {
    switch (D) {
      case 32:
        decode_d<32, KT>(full, kernel, rb, k, static_cast<int>(row_groups), ctx.stream);
        break;
      case 64:
        decode_d<64, KT>(full, kernel, rb, k, static_cast<int>(row_groups), ctx.stream);
        break;
      case 128:
        decode_d<128, KT>(full, kernel, rb, k, static_cast<int>(row_groups), ctx.stream);
        break;
      default:
        decode_d<256, KT>(full, kernel, rb, k, static_cast<int>(row_groups), ctx.stream);
        break;
    }
    check_launch("attention decode kernel");
  } else {
    switch (D) {
      case 32:
        prefill_d<32, KT>(full, k, ctx.stream);
        break;
      case 64:
        prefill_d<64, KT>(full, k, ctx.stream);
        break;
      case 128:
        prefill_d<128, KT>(full, k, ctx.stream);
        break;
      default:
        prefill_d<256, KT>(full, k, ctx.stream);
        break;
    }
    check_launch("attention prefill kernel");
  }
  if (k.n_splits > 1) {
    SW_CHECK(rows_all < (int64_t(1) << 31), "CUDA attention: too many rows");
    launch_kernel("attention combine kernel", attn_combine_kernel, dim3(static_cast<unsigned>(rows_all)),
                  dim3(kCombineThreads), 0, ctx.stream, k);
  }
}

}  // namespace

bool attention_head_dim_supported(int64_t hd) {
  return hd >= 1 && hd <= kMaxAttentionHeadDim;
}

void attention(const Ctx& ctx, const AttnArgs& a) {
  if (a.n <= 0) return;
  const int hd = a.head_dim;
  SW_CHECK(attention_head_dim_supported(hd), "CUDA attention: head_dim ", hd, " is not supported (1 to ",
           kMaxAttentionHeadDim, ")");
  SW_CHECK(a.n_heads > 0 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "CUDA attention: ", a.n_heads,
           " heads are not a multiple of ", a.n_kv_heads, " kv heads");
  SW_CHECK(a.q != nullptr && a.k != nullptr && a.v != nullptr && a.out != nullptr, "CUDA attention: a null pointer");
  SW_CHECK(is_kv_dtype(a.kv_dtype), "CUDA attention: a ", dtype_name(a.kv_dtype), " KV cache is not supported (",
           kKvDtypeNames, ")");
  check_kv_head_dim(a.kv_dtype, hd, "CUDA attention");
  SW_CHECK(a.kv_stride % dtype_block_elems(a.kv_dtype) == 0, "CUDA attention: a ", dtype_name(a.kv_dtype),
           " cache's rows must be whole blocks apart");
  const int D = padded_head_dim(hd);
  // Vector loads need q/k/v rows aligned for 4-element pieces (16 bytes of f32, 8 of f16/bf16; q8_0 blocks
  // are read a scale and bytes at a time: 2) and per-head offsets (h * hd, hd % 4 == 0); outputs are
  // stored element by element (no alignment needed). Anything else takes the guarded loads.
  const uintptr_t kv_align = a.kv_dtype == DType::F32 ? 16 : a.kv_dtype == DType::Q8_0 ? 2 : 8;
  const auto kv_aligned = [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % kv_align == 0; };
  SW_CHECK(a.kv_dtype != DType::Q8_0 || (kv_aligned(a.k) && kv_aligned(a.v)),
           "CUDA attention: a q8_0 cache must start on a 2-byte boundary (its blocks' f16 scales)");
  const bool rows16 =
      aligned16(a.q) && kv_aligned(a.k) && kv_aligned(a.v) && a.q_stride % 4 == 0 && a.kv_stride % 4 == 0;
  const bool full = hd == D && rows16;
  const int64_t kv_len = static_cast<int64_t>(a.pos_first) + a.n;
  SW_CHECK(kv_len < (int64_t(1) << 31) && static_cast<int64_t>(a.n) * a.n_heads < (int64_t(1) << 31),
           "CUDA attention: too many positions");
  KArgs k = kernel_args(a, hd, full, rows16);

  const bool decode = a.n <= kGemvMaxTokens;
  DecodeAttn kernel = a.decode_kernel == DecodeAttn::Auto ? DecodeAttn::Block : a.decode_kernel;
  const int64_t rows_g = static_cast<int64_t>(a.n) * k.group;
  const int64_t rows_all = static_cast<int64_t>(a.n) * a.n_heads;
  const uint64_t per_split = static_cast<uint64_t>(rows_all) * static_cast<uint64_t>(hd + 2) * 4 + 512;
  Workspace& ws = *ctx.ws;
  WorkspaceScope scope(ws);
  int rb = 4;
  int64_t row_groups = 0;
  if (decode) {
    rb = rows_g >= 4 ? 4 : (rows_g >= 2 ? 2 : 1);
    row_groups = ceil_div(rows_g, rb);
    // More than two row groups (tokens x group > 8): the block kernel is slower than the warp kernel
    // there (n = 8 at 4K context: 89 against 81 us).
    if (a.decode_kernel == DecodeAttn::Auto && row_groups > 2) kernel = DecodeAttn::Warps;
  }
  const KeySplit ks = decode && kernel == DecodeAttn::Block
                          ? block_decode_split(ctx, a, D, kv_len, row_groups, ws.available(), per_split)
                          : grid_split(ctx, a, decode, kv_len, rows_g, row_groups, ws.available(), per_split);
  SW_CHECK(ks.splits <= 65535, "CUDA attention: too many splits");
  k.n_splits = static_cast<int32_t>(ks.splits);
  k.keys_per_split = static_cast<int32_t>(ks.keys_per_split);
  if (ks.splits > 1) {
    k.part_o = ws.take<float>(static_cast<uint64_t>(ks.splits * rows_all * hd), "attention split partials");
    k.part_ml = ws.take<float>(static_cast<uint64_t>(ks.splits * rows_all * 2), "attention split partials");
  }
  SW_CHECK(a.n_kv_heads < 65536 && row_groups < 65536, "CUDA attention: too many heads or rows for one launch");
  if (a.kv_dtype == DType::F16)
    launch_attention<__half>(ctx, k, D, full, decode, kernel, rb, row_groups, rows_all);
  else if (a.kv_dtype == DType::BF16)
    launch_attention<__nv_bfloat16>(ctx, k, D, full, decode, kernel, rb, row_groups, rows_all);
  else if (a.kv_dtype == DType::Q8_0)
    launch_attention<BlockQ8_0>(ctx, k, D, full, decode, kernel, rb, row_groups, rows_all);
  else
    launch_attention<float>(ctx, k, D, full, decode, kernel, rb, row_groups, rows_all);
}

}  // namespace cuda

void cuda_attention(const float* q, const void* k_cache, const void* v_cache, float* out, int64_t n, int64_t pos_first,
                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint8_t* workspace, uint64_t workspace_bytes,
                    cudaStream_t stream, DType kv_dtype) {
  SW_CHECK(n >= 0 && pos_first >= 0 && pos_first + n < (int64_t(1) << 31), "cuda_attention: positions ", pos_first,
           " + ", n, " out of range");
  SW_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads < 65536 && n_kv_heads < 65536 && head_dim > 0 &&
               head_dim <= cuda::kMaxAttentionHeadDim,
           "cuda_attention: bad shape: ", n_heads, " heads, ", n_kv_heads, " kv heads, head_dim ", head_dim);
  if (n == 0) return;
  cuda::Workspace ws;
  ws.reset(workspace, workspace != nullptr ? workspace_bytes : 0);
  cuda::Ctx ctx;  // as the blocks build theirs (blocks.cu); attention needs no cuBLAS
  ctx.stream = stream;
  ctx.ws = &ws;
  int dev = 0, sms = 0;
  cuda::check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  ctx.sm_count = std::max(1, sms);
  cuda::AttnArgs a;
  a.q = q;
  a.q_stride = n_heads * head_dim;
  a.k = k_cache;
  a.v = v_cache;
  a.kv_stride = n_kv_heads * head_dim;
  a.out = out;
  a.out_stride = n_heads * head_dim;
  a.n = static_cast<int32_t>(n);
  a.pos_first = static_cast<int32_t>(pos_first);
  a.n_heads = static_cast<int32_t>(n_heads);
  a.n_kv_heads = static_cast<int32_t>(n_kv_heads);
  a.head_dim = static_cast<int32_t>(head_dim);
  a.kv_dtype = kv_dtype;
  cuda::attention(ctx, a);
}

}  // namespace shardwise

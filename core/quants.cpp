// core/quants.cpp — reference (de)quantisation of one block of each GGUF block type (dtype.h).
// Dequantisation uses the same f32 operations, in the same order, as ggml's dequantize_row_* and
// gguf-py's dequantize_blocks, so values are bit-identical; this file is compiled without FMA
// contraction for that reason. Quantisation follows ggml's reference quantisers (what llama-quantize
// runs without an importance matrix): the scale searches below are those algorithms, written out.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace shardwise {

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

// Round to nearest, ties to even, through the f32 mantissa (ggml's nearest_int; |x| < 2^22).
int nearest_int(float x) {
  float v = x + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

constexpr float kGroupMaxEps = 1e-15f;

// ---- dequantisation ---------------------------------------------------------------------------------

void nibbles_32(const uint8_t* qs, int* q) {  // element j < 16: low nibble of qs[j]; j + 16: high nibble
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}

void fifth_bits_32(const uint8_t* qh4, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  for (int j = 0; j < 32; ++j) q[j] |= static_cast<int>((qh >> j) & 1u) << 4;
}

// The 6-bit scale and minimum of group j of a Q4_K/Q5_K block (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The signed 6-bit scale of group j of a Q3_K block.
int q3k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// The K-quants below walk their blocks in runs of 16 contiguous elements that share a group scale and a
// bit position (element 128h + 32s + 16u + l, l < 16), so the compiler vectorises the inner loops.
void dequant_q2_k(const BlockQ2_K& b, float* y) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int u = 0; u < 2; ++u) {
        const int g = 8 * h + 2 * s + u;
        const float dl = d * static_cast<float>(b.scales[g] & 0x0F);
        const float ml = dmin * static_cast<float>(b.scales[g] >> 4);
        const uint8_t* q = b.qs + 32 * h + 16 * u;
        float* out = y + 16 * g;
        for (int l = 0; l < 16; ++l) out[l] = dl * static_cast<float>((q[l] >> (2 * s)) & 3) - ml;
      }
}

void dequant_q3_k(const BlockQ3_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int u = 0; u < 2; ++u) {
        const int g = 8 * h + 2 * s + u, bit = 4 * h + s;
        const float dl = d * static_cast<float>(q3k_scale(b.scales, g));
        const uint8_t* q = b.qs + 32 * h + 16 * u;
        const uint8_t* hm = b.hmask + 16 * u;
        float* out = y + 16 * g;
        for (int l = 0; l < 16; ++l)
          out[l] = dl * static_cast<float>(((q[l] >> (2 * s)) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4));
      }
}

void dequant_q45_k(const uint16_t dh, const uint16_t dminh, const uint8_t* scales, const uint8_t* qs, const uint8_t* qh,
                   float* y) {
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    scale_min_k4(g, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = 4 * (g % 2);
    float* out = y + 32 * g;
    if (qh) {
      for (int l = 0; l < 32; ++l)
        out[l] = d1 * static_cast<float>(((q[l] >> shift) & 0x0F) | (((qh[l] >> g) & 1) << 4)) - m1;
    } else {
      for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>((q[l] >> shift) & 0x0F) - m1;
    }
  }
}

void dequant_q6_k(const BlockQ6_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int u = 0; u < 2; ++u) {
        const int g = 8 * h + 2 * s + u;
        const float dl = d * static_cast<float>(b.scales[g]);
        const uint8_t* ql = b.ql + 64 * h + 32 * (s % 2) + 16 * u;
        const uint8_t* qh = b.qh + 32 * h + 16 * u;
        const int lshift = 4 * (s / 2), hshift = 2 * s;
        float* out = y + 16 * g;
        for (int l = 0; l < 16; ++l)
          out[l] = dl * static_cast<float>((((ql[l] >> lshift) & 0x0F) | (((qh[l] >> hshift) & 3) << 4)) - 32);
      }
}

// ---- quantisation: the 32-element types ---------------------------------------------------------------

void quant_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
}

float signed_absmax(const float* x, int n) {  // the value of largest magnitude, with its sign
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quant_q4_0(const float* x, BlockQ4_0& b) {
  const float d = signed_absmax(x, 32) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min<int>(15, static_cast<int8_t>(x[j] * id + 8.5f));
    const int q1 = std::min<int>(15, static_cast<int8_t>(x[16 + j] * id + 8.5f));
    b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

void min_max(const float* x, int n, float* mn, float* mx) {
  *mn = x[0];
  *mx = x[0];
  for (int j = 1; j < n; ++j) {
    *mn = std::min(*mn, x[j]);
    *mx = std::max(*mx, x[j]);
  }
}

void quant_q4_1(const float* x, BlockQ4_1& b) {
  float mn, mx;
  min_max(x, 32, &mn, &mx);
  const float d = (mx - mn) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  b.m = f32_to_f16(mn);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min<int>(15, static_cast<int8_t>((x[j] - mn) * id + 0.5f));
    const int q1 = std::min<int>(15, static_cast<int8_t>((x[16 + j] - mn) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// Q5_0 / Q5_1 codes of 32 values (already offset and scaled by `code`) into nibbles and fifth bits.
template <class Code>
void pack_5bit(const Code& code, uint8_t* qs, uint8_t* qh4) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = code(j), q1 = code(16 + j);
    qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(qh4, &qh, 4);
}

void quant_q5_0(const float* x, BlockQ5_0& b) {
  const float d = signed_absmax(x, 32) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  pack_5bit([&](int j) { return std::min<int>(31, static_cast<int8_t>(x[j] * id + 16.5f)); }, b.qs, b.qh);
}

void quant_q5_1(const float* x, BlockQ5_1& b) {
  float mn, mx;
  min_max(x, 32, &mn, &mx);
  const float d = (mx - mn) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  b.m = f32_to_f16(mn);
  pack_5bit([&](int j) { return static_cast<int>(static_cast<uint8_t>((x[j] - mn) * id + 0.5f)); }, b.qs, b.qh);
}

// IQ4_NL: the scale that maps the block's largest magnitude to the table's (-127), each value to its
// nearest table entry. Valid blocks, but not llama.cpp's: its quantiser also searches nearby scales.
void quant_iq4_nl(const float* x, BlockIQ4_NL& b) {
  const float d = signed_absmax(x, 32) / static_cast<float>(kIq4nlValues[0]);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b.d = f32_to_f16(d);
  auto code = [&](float v) {
    int best = 0;
    for (int i = 1; i < 16; ++i)
      if (std::fabs(v * id - kIq4nlValues[i]) < std::fabs(v * id - kIq4nlValues[best])) best = i;
    return best;
  };
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(code(x[j]) | (code(x[16 + j]) << 4));
}

}  // namespace

// ---- the K-quants' scale searches (ggml's make_qx_quants, make_q3_quants, make_qkx2_quants) -----------

namespace kq {

// Symmetric codes in [-nmax, nmax) for n values with an RMSE-weighted scale search (rmse_type 1: weights
// x^2), ggml's make_qx_quants without an importance matrix; L gets the codes + nmax.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  auto code = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))); };
  float iscale = -static_cast<float>(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale, i);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale, i);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + code(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's search: codes in [-nmax, nmax) refined one at a time (ggml's make_q3_quants with do_rmse).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(x, n);
  if (std::fabs(max) < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float iscale = -static_cast<float>(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * static_cast<float>(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * static_cast<float>(L[i]) * static_cast<float>(L[i]);
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * static_cast<float>(new_l);
          sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

// Asymmetric codes in [0, nmax] with a weighted least-squares search over scale and minimum (ggml's
// make_qkx2_quants); returns the scale, *the_min the (non-negative) minimum to subtract.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *the_min = -min;
    return 0.0f;
  }
  auto err = [&](float scale, float mn, const uint8_t* q) {
    float e = 0;
    for (int i = 0; i < n; ++i) {
      float diff = scale * static_cast<float>(q[i]) + mn - x[i];
      diff = use_mad ? std::fabs(diff) : diff * diff;
      e += weights[i] * diff;
    }
    return e;
  };
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i)
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min)))));
  float best_error = err(scale, min, L);
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * static_cast<float>(l);
      sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
      sum_xl += w * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      const float cur_error = err(this_scale, this_min, Laux);
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Q2_K: 16 groups of 16, 2-bit codes with a minimum, 4-bit group scales and minimums.
void quant_q2_k(const float* x, BlockQ2_K& y) {
  uint8_t L[kQK_K], Laux[16];
  float weights[16], mins[16], scales[16];
  const float q4scale = 15.0f;
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  std::memset(y.scales, 0, sizeof y.scales);
  y.d = f32_to_f16(0.0f);
  y.dmin = f32_to_f16(0.0f);
  if (max_scale > 0) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < 16; ++j) y.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
    y.d = f32_to_f16(max_scale / q4scale);
  }
  if (max_min > 0) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < 16; ++j) y.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
    y.dmin = f32_to_f16(max_min / q4scale);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = f16_to_f32(y.d) * static_cast<float>(y.scales[j] & 0x0F);
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(y.dmin) * static_cast<float>(y.scales[j] >> 4);
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<uint8_t>(std::max(0, std::min(3, nearest_int((x[16 * j + i] + dm) / d))));
  }
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      y.qs[j / 4 + l] =
          static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q3_K: 16 groups of 16, 3-bit symmetric codes, 6-bit signed group scales.
void quant_q3_k(const float* x, BlockQ3_K& y) {
  int8_t L[kQK_K];
  float scales[16];
  for (int j = 0; j < 16; ++j) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
  const float max_scale = signed_absmax(scales, 16);
  std::memset(y.scales, 0, sizeof y.scales);
  y.d = f32_to_f16(0.0f);
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      int l = std::max(-32, std::min(31, nearest_int(iscale * scales[j]))) + 32;
      if (j < 8)
        y.scales[j] = static_cast<uint8_t>(l & 0x0F);
      else
        y.scales[j - 8] |= static_cast<uint8_t>((l & 0x0F) << 4);
      l >>= 4;
      y.scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
    }
    y.d = f32_to_f16(1 / iscale);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = f16_to_f32(y.d) * static_cast<float>(q3k_scale(y.scales, j));
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(std::max(-4, std::min(3, nearest_int(x[16 * j + i] / d))) + 4);
  }
  std::memset(y.hmask, 0, sizeof y.hmask);
  for (int j = 0; j < kQK_K; ++j) {
    if (L[j] > 3) {
      y.hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
      L[j] = static_cast<int8_t>(L[j] - 4);
    }
  }
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      y.qs[j / 4 + l] =
          static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q4_K / Q5_K: 8 groups of 32, codes in [0, nmax] with a minimum; 6-bit group scales and minimums
// packed into 12 bytes. Returns the codes in L.
void quant_q45_k(const float* x, int nmax, float rmin, int nstep, uint16_t* dh, uint16_t* dminh, uint8_t* packed,
                 uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_min * mins[j])));
  }
  pack_scales_k4(ls, lm, packed);
  *dh = f32_to_f16(max_scale / 63.0f);
  *dminh = f32_to_f16(max_min / 63.0f);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, packed, &sc, &m);
    const float d = f16_to_f32(*dh) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(*dminh) * static_cast<float>(m);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int((x[32 * j + i] + dm) / d))));
  }
}

void quant_q4_k(const float* x, BlockQ4_K& y) {
  uint8_t L[kQK_K];
  quant_q45_k(x, 15, -1.0f, 20, &y.d, &y.dmin, y.scales, L);
  for (int j = 0; j < kQK_K; j += 64)
    for (int l = 0; l < 32; ++l) y.qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
}

void quant_q5_k(const float* x, BlockQ5_K& y) {
  uint8_t L[kQK_K];
  quant_q45_k(x, 31, -0.5f, 15, &y.d, &y.dmin, y.scales, L);
  std::memset(y.qh, 0, sizeof y.qh);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQK_K; n += 64) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        y.qh[j] |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        y.qh[j] |= m2;
      }
      y.qs[n / 2 + j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
  }
}

// Q6_K: 16 groups of 16, 6-bit symmetric codes, int8 group scales.
void quant_q6_k(const float* x, BlockQ6_K& y) {
  int8_t L[kQK_K];
  float scales[16];
  for (int ib = 0; ib < 16; ++ib) scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
  const float max_scale = signed_absmax(scales, 16);
  if (std::fabs(max_scale) < kGroupMaxEps) {
    std::memset(&y, 0, sizeof y);
    y.d = f32_to_f16(0.0f);
    return;
  }
  const float iscale = -128.0f / max_scale;
  y.d = f32_to_f16(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) y.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    const float d = f16_to_f32(y.d) * static_cast<float>(y.scales[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * j + i] / d))) + 32);
  }
  for (int j = 0; j < kQK_K; j += 128) {
    uint8_t* ql = y.ql + j / 2;
    uint8_t* qh = y.qh + j / 4;
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                   ((L[j + l + 96] >> 4) << 6));
    }
  }
}

}  // namespace kq

void pack_scales_k4(const uint8_t* sc, const uint8_t* m, uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = sc[j];
    packed[j + 4] = m[j];
  }
  for (int j = 4; j < 8; ++j) {
    packed[j + 4] = static_cast<uint8_t>((sc[j] & 0x0F) | ((m[j] & 0x0F) << 4));
    packed[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    packed[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
  }
}

void quantize_block(DType t, const float* x, void* block) {
  switch (t) {
    case DType::Q8_0:
      return quant_q8_0(x, *static_cast<BlockQ8_0*>(block));
    case DType::Q4_0:
      return quant_q4_0(x, *static_cast<BlockQ4_0*>(block));
    case DType::Q4_1:
      return quant_q4_1(x, *static_cast<BlockQ4_1*>(block));
    case DType::Q5_0:
      return quant_q5_0(x, *static_cast<BlockQ5_0*>(block));
    case DType::Q5_1:
      return quant_q5_1(x, *static_cast<BlockQ5_1*>(block));
    case DType::IQ4_NL:
      return quant_iq4_nl(x, *static_cast<BlockIQ4_NL*>(block));
    case DType::Q2_K:
      return kq::quant_q2_k(x, *static_cast<BlockQ2_K*>(block));
    case DType::Q3_K:
      return kq::quant_q3_k(x, *static_cast<BlockQ3_K*>(block));
    case DType::Q4_K:
      return kq::quant_q4_k(x, *static_cast<BlockQ4_K*>(block));
    case DType::Q5_K:
      return kq::quant_q5_k(x, *static_cast<BlockQ5_K*>(block));
    case DType::Q6_K:
      return kq::quant_q6_k(x, *static_cast<BlockQ6_K*>(block));
    default:
      fail("quantize_block: ", dtype_name(t), " is not a block type");
  }
}

void dequantize_block(DType t, const void* block, float* y) {
  int q[32];
  switch (t) {
    case DType::Q8_0: {
      const auto& b = *static_cast<const BlockQ8_0*>(block);
      const float d = f16_to_f32(b.d);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
      return;
    }
    case DType::Q4_0: {
      const auto& b = *static_cast<const BlockQ4_0*>(block);
      const float d = f16_to_f32(b.d);
      nibbles_32(b.qs, q);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - 8) * d;
      return;
    }
    case DType::Q4_1: {
      const auto& b = *static_cast<const BlockQ4_1*>(block);
      const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
      nibbles_32(b.qs, q);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]) + m;
      return;
    }
    case DType::Q5_0: {
      const auto& b = *static_cast<const BlockQ5_0*>(block);
      const float d = f16_to_f32(b.d);
      nibbles_32(b.qs, q);
      fifth_bits_32(b.qh, q);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j] - 16);
      return;
    }
    case DType::Q5_1: {
      const auto& b = *static_cast<const BlockQ5_1*>(block);
      const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
      nibbles_32(b.qs, q);
      fifth_bits_32(b.qh, q);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]) + m;
      return;
    }
    case DType::IQ4_NL: {
      const auto& b = *static_cast<const BlockIQ4_NL*>(block);
      const float d = f16_to_f32(b.d);
      nibbles_32(b.qs, q);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(kIq4nlValues[q[j]]);
      return;
    }
    case DType::Q2_K:
      return dequant_q2_k(*static_cast<const BlockQ2_K*>(block), y);
    case DType::Q3_K:
      return dequant_q3_k(*static_cast<const BlockQ3_K*>(block), y);
    case DType::Q4_K: {
      const auto& b = *static_cast<const BlockQ4_K*>(block);
      return dequant_q45_k(b.d, b.dmin, b.scales, b.qs, nullptr, y);
    }
    case DType::Q5_K: {
      const auto& b = *static_cast<const BlockQ5_K*>(block);
      return dequant_q45_k(b.d, b.dmin, b.scales, b.qs, b.qh, y);
    }
    case DType::Q6_K:
      return dequant_q6_k(*static_cast<const BlockQ6_K*>(block), y);
    default:
      fail("dequantize_block: ", dtype_name(t), " is not a block type");
  }
}

}  // namespace shardwise

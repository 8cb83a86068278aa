// executor/reference/op_reference.cpp — the ops' f64 references (see op_reference.h).
#include "executor/reference/op_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

// The references' inner loops read what the op's shape says the kernel under test reads too, where the
// sanitizer build checks it; unchecked here, they run several times faster in that build (the sanitizers
// would keep their partial sums in memory and check every access and every pointer step).
#if defined(__SANITIZE_ADDRESS__)
#define SW_REFERENCE_LOOP __attribute__((no_sanitize("address", "undefined")))
#else
#define SW_REFERENCE_LOOP
#endif

namespace shardwise {

namespace {

// sum_i a[i] b[i] and sum_i |a[i] b[i]| in double, in L independent partial sums: the order of a double
// sum of f32 products does not matter at f32's tolerances, and one sum's dependency chain would make the
// references the slowest part of the tests.
template <int L>
SW_REFERENCE_LOOP void dot_lanes(const float* a, const float* b, int64_t n, double* dot, double* mag) {
  double s[L] = {}, m[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int u = 0; u < L; ++u) {
      const double p = static_cast<double>(a[i + u]) * static_cast<double>(b[i + u]);
      s[u] += p;
      m[u] += std::fabs(p);
    }
  for (; i < n; ++i) {
    const double p = static_cast<double>(a[i]) * static_cast<double>(b[i]);
    s[0] += p;
    m[0] += std::fabs(p);
  }
  for (int u = 1; u < L; ++u) {
    s[0] += s[u];
    m[0] += m[u];
  }
  *dot = s[0];
  *mag = m[0];
}

// Many lanes for long rows (matmul), few for short ones (attention's heads), where the lanes' set-up
// and reduction would cost more than the products.
SW_REFERENCE_LOOP void dot_and_magnitude(const float* a, const float* b, int64_t n, double* dot, double* mag) {
  if (n >= 512)
    dot_lanes<32>(a, b, n, dot, mag);
  else
    dot_lanes<8>(a, b, n, dot, mag);
}

}  // namespace

OpReference reference_matmul(DType dtype, const void* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                             int64_t ldx, int64_t n) {
  OpReference ref;
  ref.y.assign(static_cast<size_t>(n * rows), 0.0);
  ref.mag.assign(ref.y.size(), 0.0);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(dtype, static_cast<const uint8_t*>(w) + static_cast<uint64_t>(r) * row_bytes, row.data(), cols);
    for (int64_t t = 0; t < n; ++t)
      dot_and_magnitude(row.data(), x + t * ldx, cols, &ref.y[static_cast<size_t>(t * rows + r)],
                        &ref.mag[static_cast<size_t>(t * rows + r)]);
  }
  return ref;
}

namespace {

// o[e] = sum_j p[j] v_j[e] and mg[e] = sum_j p[j] |v_j[e]| over the keys' rows v_j = v + j * row_stride.
SW_REFERENCE_LOOP void weighted_sum(const double* p, int64_t keys, const float* v, int64_t row_stride, int64_t hd,
                                    double* o, double* mg) {
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * row_stride;
    for (int64_t e = 0; e < hd; ++e) {
      o[e] += p[j] * static_cast<double>(vj[e]);
      mg[e] += p[j] * std::fabs(static_cast<double>(vj[e]));
    }
  }
}

}  // namespace

OpReference reference_attention(const float* q, int64_t n, const int32_t* positions, const float* k, const float* v,
                                const AttentionShape& shape) {
  SW_CHECK(shape.kv_dtype == DType::F32,
           "reference_attention: the caches must be f32 (widen or dequantise other types first)");
  const int64_t hd = shape.head_dim, heads = shape.n_heads, group = shape.n_heads / shape.n_kv_heads;
  const int64_t row_stride = shape.kv_row_stride > 0 ? shape.kv_row_stride : shape.n_kv_heads * hd;
  const int64_t head_stride = shape.kv_row_stride > 0 ? shape.kv_head_stride : hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  OpReference ref;
  ref.y.assign(static_cast<size_t>(n * heads * hd), 0.0);
  ref.mag.assign(ref.y.size(), 0.0);
  std::vector<double> p;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* kh = k + (h / group) * head_stride;
      const float* qv = q + (t * heads + h) * hd;
      const int64_t keys = static_cast<int64_t>(positions[t]) + 1;
      p.assign(static_cast<size_t>(keys), 0.0);
      double mx = -INFINITY, smag = 0.0, l = 0.0;
      for (int64_t j = 0; j < keys; ++j) {  // the scores, then p_j = exp(s_j - max s)
        double d = 0.0, a = 0.0;
        dot_and_magnitude(qv, kh + j * row_stride, hd, &d, &a);
        p[static_cast<size_t>(j)] = d * scale;
        smag = std::max(smag, a * scale);
        mx = std::max(mx, d * scale);
      }
      for (double& pj : p) {
        pj = std::exp(pj - mx);
        l += pj;
      }
      double* o = &ref.y[static_cast<size_t>((t * heads + h) * hd)];
      double* mg = &ref.mag[static_cast<size_t>((t * heads + h) * hd)];
      weighted_sum(p.data(), keys, v + (h / group) * head_stride, row_stride, hd, o, mg);
      for (int64_t e = 0; e < hd; ++e) {
        o[e] /= l;
        mg[e] *= (1.0 + smag) / l;
      }
    }
  return ref;
}

OpReference reference_rms_norm(const float* x, const float* w, double eps, int64_t rows, int64_t dim) {
  OpReference ref;
  ref.y.resize(static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) ref.y[static_cast<size_t>(r * dim + i)] = xr[i] * scale * w[i];
  }
  ref.mag = ref.y;
  for (double& m : ref.mag) m = std::fabs(m);
  return ref;
}

OpReference reference_rope(const float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                           double theta, RopeStyle style) {
  const int64_t half = head_dim / 2, width = heads * head_dim;
  OpReference ref;
  ref.y.assign(x, x + n * width);
  ref.mag.assign(ref.y.size(), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            positions[t] * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const int64_t base = t * width + h * head_dim;
        const int64_t ia = base + (style == RopeStyle::Neox ? i : 2 * i);
        const int64_t ib = base + (style == RopeStyle::Neox ? i + half : 2 * i + 1);
        const double a = x[ia], b = x[ib], c = std::cos(angle), s = std::sin(angle);
        ref.y[static_cast<size_t>(ia)] = a * c - b * s;
        ref.y[static_cast<size_t>(ib)] = b * c + a * s;
        ref.mag[static_cast<size_t>(ia)] = ref.mag[static_cast<size_t>(ib)] = std::fabs(a) + std::fabs(b);
      }
  return ref;
}

OpReference reference_swiglu(const float* gate, const float* up, int64_t n) {
  OpReference ref;
  ref.y.resize(static_cast<size_t>(n));
  ref.mag.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    ref.y[static_cast<size_t>(i)] = g / (1.0 + std::exp(-g)) * static_cast<double>(up[i]);
    ref.mag[static_cast<size_t>(i)] = std::fabs(ref.y[static_cast<size_t>(i)]);
  }
  return ref;
}

OpReference reference_axpy(float a, const float* x, const float* y, int64_t n) {
  OpReference ref;
  ref.y.resize(static_cast<size_t>(n));
  ref.mag.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double ax = static_cast<double>(a) * x[i];
    ref.y[static_cast<size_t>(i)] = static_cast<double>(y[i]) + ax;
    ref.mag[static_cast<size_t>(i)] = std::fabs(ax) + std::fabs(static_cast<double>(y[i]));
  }
  return ref;
}

OpReference reference_dot(const float* a, const float* b, int64_t n) {
  double s = 0.0, m = 0.0;
  dot_and_magnitude(a, b, n, &s, &m);
  return {{s}, {m}};
}

OpReference reference_dequant(DType dtype, const void* src, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  dequantize_row(dtype, static_cast<const uint8_t*>(src), f.data(), n);
  return {std::vector<double>(f.begin(), f.end()), std::vector<double>(f.size(), 0.0)};
}

double excess(float got, double ref, double mag, const Tolerance& tol) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (tol.exact) {
    const float want = static_cast<float>(ref);
    if (std::isnan(want)) return std::isnan(got) ? 0.0 : kInf;
    return std::memcmp(&want, &got, sizeof(float)) == 0 ? 0.0 : kInf;
  }
  const double d = std::fabs(static_cast<double>(got) - ref);
  if (d == 0) return 0.0;
  const double bound = tol.bound(mag);
  return bound > 0 && !std::isnan(d) ? d / bound : kInf;
}

RefCheck compare_to_reference(const float* got, const OpReference& ref, const Tolerance& tol) {
  RefCheck c;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double e = excess(got[i], ref.y[i], ref.mag.empty() ? 0.0 : ref.mag[i], tol);
    if (!(e <= 1.0) && c.bad++ == 0) c.first = static_cast<int64_t>(i);
    if (!(e <= c.worst)) {
      c.worst = e;
      c.worst_at = static_cast<int64_t>(i);
    }
  }
  return c;
}

std::string describe(const RefCheck& c, const float* got, const OpReference& ref, const Tolerance& tol) {
  if (c.worst_at < 0) return "every element matches exactly";
  const size_t i = static_cast<size_t>(c.first >= 0 ? c.first : c.worst_at);
  const double mag = ref.mag.empty() ? 0.0 : ref.mag[i];
  return str_cat(c.bad, " of ", ref.y.size(), " elements outside the tolerance; element ", i, ": got ", got[i],
                 ", reference ", ref.y[i], " (tolerance ", tol.exact ? 0.0 : tol.bound(mag), "); worst excess ",
                 c.worst, " at ", c.worst_at);
}

}  // namespace shardwise

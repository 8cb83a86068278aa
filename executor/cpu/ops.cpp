// executor/cpu/ops.cpp — element-wise CPU ops (see ops.h).
#include "executor/cpu/ops.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"

namespace shardwise {

void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n_rows, int64_t dim) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = cpu_kernels().dot_f32(xr, xr, dim);
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void rms_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* w, float eps) {
  rms_norm(x, w, eps, x, n_tokens * n_heads, head_dim);
}

void RopeAngles::compute(const int32_t* positions, int64_t n, int64_t head_dim, double theta) {
  n_tokens = n;
  half = head_dim / 2;
  cos.resize(static_cast<size_t>(n * half));
  sin.resize(static_cast<size_t>(n * half));
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      cos[t * half + i] = static_cast<float>(std::cos(angle));
      sin[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void RopeAngles::compute_sections(const int64_t* pos3, int64_t n, int64_t head_dim, double theta,
                                  const std::vector<int64_t>& sections) {
  n_tokens = n;
  half = head_dim / 2;
  SW_CHECK(sections.size() == 3 && sections[0] >= 0 && sections[1] >= 0 && sections[2] >= 0 &&
               sections[0] + sections[1] + sections[2] == half,
           "M-RoPE: the sections do not split the head's ", half, " rotary pairs");
  cos.resize(static_cast<size_t>(n * half));
  sin.resize(static_cast<size_t>(n * half));
  std::vector<double> inv_freq(static_cast<size_t>(half));
  std::vector<int> section(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    section[i] = i < sections[0] ? 0 : i < sections[0] + sections[1] ? 1 : 2;
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos3[3 * t + section[i]]) * inv_freq[i];
      cos[t * half + i] = static_cast<float>(std::cos(angle));
      sin[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const RopeAngles& angles, RopeStyle style,
          int64_t row_stride) {
  const int64_t half = head_dim / 2;
  if (row_stride == 0) row_stride = n_heads * head_dim;
  SW_CHECK(angles.half == half && angles.n_tokens >= n_tokens, "rope: angle table does not match the step");
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* cs = angles.cos.data() + t * half;
    const float* sn = angles.sin.data() + t * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      if (style == RopeStyle::Neox) {
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cs[i] - b * sn[i];
          v[i + half] = b * cs[i] + a * sn[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * cs[i] - b * sn[i];
          v[2 * i + 1] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

void swiglu(float* gate, const float* up, int64_t n) {
  cpu_kernels().swiglu(gate, up, n);
}

void swiglu(float* gate, const float* up, int64_t n, ThreadPool& pool) {
  constexpr int64_t kGrain = 16384;  // ~5 us of work per chunk: below that one thread does it all
  if (n < 2 * kGrain || pool.size() <= 1) return swiglu(gate, up, n);
  pool.parallel_for(n, kGrain, [&](int64_t a, int64_t b, int) { cpu_kernels().swiglu(gate + a, up + a, b - a); });
}

void softmax(float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void add_inplace(float* y, const float* x, int64_t n) {
  cpu_kernels().axpy(1.0f, x, y, n);
}

void embed_rows(const TensorView& table, const int32_t* tokens, int64_t n, float* out) {
  const int64_t vocab = table.shape.at(0), dim = table.shape.at(1);
  const DequantFn deq = cpu_kernels().dequant[kernel_slot(table.dtype)];
  for (int64_t t = 0; t < n; ++t) {
    SW_CHECK(tokens[t] >= 0 && tokens[t] < vocab, "token id ", tokens[t], " is out of range [0, ", vocab, ")");
    deq(table.row(tokens[t]), out + t * dim, dim);
  }
}

}  // namespace shardwise

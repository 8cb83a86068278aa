// executor/cpu/attention.cpp — tiled online-softmax attention (see attention.h).
#include "executor/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/kernels.h"

namespace shardwise {
namespace {
constexpr int64_t kKeyTile = 128;
}

void attention(const float* q, int64_t n_tokens, const int32_t* positions, const float* k, const float* v,
               int64_t kv_len, const AttentionShape& s, float* out, ThreadPool& pool) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const int64_t q_stride = s.n_heads * hd, kv_stride = s.n_kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t t = 0; t < n_tokens; ++t)
    SW_CHECK(positions[t] >= 0 && positions[t] < kv_len, "attention: position ", positions[t],
             " outside the cache (", kv_len, " rows)");
  const CpuKernels& kern = cpu_kernels();
  pool.parallel_for(n_tokens * s.n_heads, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> scores(kKeyTile), acc(static_cast<size_t>(hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / s.n_heads, h = i % s.n_heads, g = h / group;
      const float* qv = q + t * q_stride + h * hd;
      const int64_t n_keys = positions[t] + 1;
      float m = -INFINITY, l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyTile) {
        const int64_t nj = std::min(kKeyTile, n_keys - j0);
        float tile_max = -INFINITY;
        for (int64_t j = 0; j < nj; ++j) {
          scores[j] = kern.dot_f32(qv, k + (j0 + j) * kv_stride + g * hd, hd) * scale;
          tile_max = std::max(tile_max, scores[j]);
        }
        const float m_new = std::max(m, tile_max);
        const float correction = std::exp(m - m_new);  // 0 on the first tile (m = -inf)
        l *= correction;
        for (int64_t d = 0; d < hd; ++d) acc[d] *= correction;
        for (int64_t j = 0; j < nj; ++j) {
          const float p = std::exp(scores[j] - m_new);
          l += p;
          kern.axpy(p, v + (j0 + j) * kv_stride + g * hd, acc.data(), hd);
        }
        m = m_new;
      }
      float* o = out + t * q_stride + h * hd;
      const float inv = 1.0f / l;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
    }
  });
}

}  // namespace shardwise

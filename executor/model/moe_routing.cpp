// executor/model/moe_routing.cpp — top-k routing (see moe_routing.h).
#include "executor/model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace shardwise {

MoeRouting route_tokens(const float* logits, int64_t n, int64_t E, int64_t k, bool renormalize) {
  MoeRouting r;
  r.tokens_of_expert.resize(static_cast<size_t>(E));
  r.expert_ids.resize(static_cast<size_t>(n * k));
  r.weights.resize(static_cast<size_t>(n * k));
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    float m = -INFINITY;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, l[e]);
    float s = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - m);
      s += p[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] /= s;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += p[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      const float w = renormalize ? p[idx[j]] / sum : p[idx[j]];
      r.expert_ids[t * k + j] = idx[j];
      r.weights[t * k + j] = w;
      r.tokens_of_expert[static_cast<size_t>(idx[j])].push_back({t, w});
    }
  }
  for (const auto& v : r.tokens_of_expert) r.n_active_experts += v.empty() ? 0 : 1;
  return r;
}

}  // namespace shardwise

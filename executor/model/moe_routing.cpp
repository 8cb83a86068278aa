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
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
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

MoeSplit split_routing(const MoeRouting& r, int64_t cpu_experts, int64_t top_k) {
  MoeSplit s;
  const size_t E = r.tokens_of_expert.size();
  s.cpu.tokens_of_expert.resize(E);
  s.gpu.tokens_of_expert.resize(E);
  int64_t pairs = 0;
  for (const auto& v : r.tokens_of_expert) pairs += static_cast<int64_t>(v.size());
  const int64_t k = std::max<int64_t>(1, top_k), c = std::clamp<int64_t>(cpu_experts, 0, k);
  // The CPU's share of the pairs, rounded to the nearest (one token: exactly c of its k experts).
  const int64_t want = (pairs * c + k / 2) / k;
  int64_t taken = 0;
  for (size_t e = 0; e < E; ++e) {
    const auto& v = r.tokens_of_expert[e];
    if (v.empty()) continue;
    const bool cpu = taken < want;
    (cpu ? s.cpu : s.gpu).tokens_of_expert[e] = v;
    (cpu ? s.cpu : s.gpu).n_active_experts += 1;
    if (cpu) taken += static_cast<int64_t>(v.size());
  }
  return s;
}

}  // namespace shardwise

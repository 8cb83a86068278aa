// executor/model/qwen3_moe.cpp — the routed-experts FFN of qwen3_moe on the CPU: softmax router,
// top-k (optionally renormalised), SwiGLU experts, weighted sum in ascending expert order.
#include <algorithm>
#include <numeric>

#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_model.h"
#include "executor/model/moe_routing.h"

namespace shardwise {

void CpuModel::moe_ffn(const LayerWeights& lw, const float* xn, int64_t n, float* out) {
  const ModelSpec& sp = w_.spec;
  const int64_t H = sp.hidden_size, E = sp.num_experts, F = sp.moe_intermediate_size;
  s_.router.resize(static_cast<size_t>(n * E));
  matmul(lw.router, xn, H, n, s_.router.data(), E, pool_);
  const MoeRouting routing = route_tokens(s_.router.data(), n, E, sp.num_experts_per_tok, sp.norm_topk_prob);

  std::fill(out, out + n * H, 0.0f);
  const uint64_t gate_bytes = tensor_bytes(lw.gate_exps.dtype, {F, H});
  const uint64_t up_bytes = tensor_bytes(lw.up_exps.dtype, {F, H});
  const uint64_t down_bytes = tensor_bytes(lw.down_exps.dtype, {H, F});
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t m = static_cast<int64_t>(toks.size());
    s_.expert_in.resize(static_cast<size_t>(m * H));
    s_.gate.resize(static_cast<size_t>(m * F));
    s_.up.resize(static_cast<size_t>(m * F));
    s_.expert_out.resize(static_cast<size_t>(m * H));
    for (int64_t i = 0; i < m; ++i)
      std::copy(xn + toks[i].token * H, xn + (toks[i].token + 1) * H, s_.expert_in.begin() + i * H);
    const auto* g = static_cast<const uint8_t*>(lw.gate_exps.data) + static_cast<uint64_t>(e) * gate_bytes;
    const auto* u = static_cast<const uint8_t*>(lw.up_exps.data) + static_cast<uint64_t>(e) * up_bytes;
    const auto* d = static_cast<const uint8_t*>(lw.down_exps.data) + static_cast<uint64_t>(e) * down_bytes;
    matmul_raw(lw.gate_exps.dtype, g, F, H, s_.expert_in.data(), H, m, s_.gate.data(), F, pool_);
    matmul_raw(lw.up_exps.dtype, u, F, H, s_.expert_in.data(), H, m, s_.up.data(), F, pool_);
    swiglu(s_.gate.data(), s_.up.data(), m * F);
    matmul_raw(lw.down_exps.dtype, d, H, F, s_.gate.data(), F, m, s_.expert_out.data(), H, pool_);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + toks[i].token * H;
      const float* y = s_.expert_out.data() + i * H;
      const float wgt = toks[i].weight;
      for (int64_t c = 0; c < H; ++c) o[c] += wgt * y[c];
    }
  }
}

}  // namespace shardwise

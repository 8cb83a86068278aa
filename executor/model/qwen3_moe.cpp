// executor/model/qwen3_moe.cpp — the routed-experts FFN of qwen3_moe on the CPU: for each expert in
// ascending order, its tokens' SwiGLU FFN, added with the routing weight.
#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_blocks.h"

namespace shardwise {

void CpuBlocks::moe_ffn(const LayerWeights& w, const float* xn, int64_t n, const MoeRouting& routing, float* out) {
  const int64_t H = spec_.hidden_size, E = spec_.num_experts, F = spec_.moe_intermediate_size;
  SW_CHECK(static_cast<int64_t>(routing.tokens_of_expert.size()) == E, "MoE routing has the wrong expert count");
  std::fill(out, out + n * H, 0.0f);
  const uint64_t gate_bytes = tensor_bytes(w.gate_exps.dtype, {F, H});
  const uint64_t up_bytes = tensor_bytes(w.up_exps.dtype, {F, H});
  const uint64_t down_bytes = tensor_bytes(w.down_exps.dtype, {H, F});
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routing.tokens_of_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const uint8_t* g = !w.gate_exp.empty() ? w.gate_exp[static_cast<size_t>(e)]
                                           : static_cast<const uint8_t*>(w.gate_exps.data) + static_cast<uint64_t>(e) * gate_bytes;
    const uint8_t* u = !w.up_exp.empty() ? w.up_exp[static_cast<size_t>(e)]
                                         : static_cast<const uint8_t*>(w.up_exps.data) + static_cast<uint64_t>(e) * up_bytes;
    const uint8_t* d = !w.down_exp.empty() ? w.down_exp[static_cast<size_t>(e)]
                                           : static_cast<const uint8_t*>(w.down_exps.data) + static_cast<uint64_t>(e) * down_bytes;
    SW_CHECK(g && u && d, "MoE: expert ", e, " is routed to but its weights are not present");
    const int64_t m = static_cast<int64_t>(toks.size());
    expert_in_.resize(static_cast<size_t>(m * H));
    gate_.resize(static_cast<size_t>(m * F));
    up_.resize(static_cast<size_t>(m * F));
    expert_out_.resize(static_cast<size_t>(m * H));
    for (int64_t i = 0; i < m; ++i) {
      SW_CHECK(toks[i].token >= 0 && toks[i].token < n, "MoE routing names token ", toks[i].token, " of ", n);
      std::copy(xn + toks[i].token * H, xn + (toks[i].token + 1) * H, expert_in_.begin() + i * H);
    }
    matmul_raw(w.gate_exps.dtype, g, F, H, expert_in_.data(), H, m, gate_.data(), F, pool_);
    matmul_raw(w.up_exps.dtype, u, F, H, expert_in_.data(), H, m, up_.data(), F, pool_);
    swiglu(gate_.data(), up_.data(), m * F);
    matmul_raw(w.down_exps.dtype, d, H, F, gate_.data(), F, m, expert_out_.data(), H, pool_);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + toks[i].token * H;
      const float* y = expert_out_.data() + i * H;
      const float wgt = toks[i].weight;
      for (int64_t c = 0; c < H; ++c) o[c] += wgt * y[c];
    }
  }
}

}  // namespace shardwise

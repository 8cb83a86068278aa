// executor/model/moe_routing.h — top-k expert routing shared by every backend and the reference:
// softmax over the router logits, the k largest (ties: lower expert index first), renormalised
// to sum 1 when the model asks for it. Computed in f32 on the host; deterministic.
#pragma once

#include <cstdint>
#include <vector>

namespace shardwise {

struct RoutedToken {
  int64_t token;
  float weight;
};

struct MoeRouting {
  // For each expert, the tokens routed to it (ascending token order) with their weights.
  std::vector<std::vector<RoutedToken>> tokens_of_expert;
  // For each token, its k experts (descending probability) and weights.
  std::vector<int32_t> expert_ids;  // [n, k]
  std::vector<float> weights;       // [n, k]
  int64_t n_active_experts = 0;
};

MoeRouting route_tokens(const float* router_logits, int64_t n_tokens, int64_t n_experts, int64_t top_k,
                        bool renormalize);

// An MoE layer split between the CPU and the GPU (a plan's moe_cpu_share / moe_gpu_share, cpu_experts
// of top_k per token): the active experts in ascending order, the CPU taking whole experts from the
// first until it holds cpu_experts / top_k of the (token, expert) pairs (for one token: its first
// cpu_experts experts by index); the GPU the rest. Only tokens_of_expert and n_active_experts are
// set in the parts (each token has some of its k experts in each). The planner and the runtime
// must agree on this rule: it is the only place it is written.
struct MoeSplit {
  MoeRouting cpu, gpu;
};
MoeSplit split_routing(const MoeRouting& r, int64_t cpu_experts, int64_t top_k);

}  // namespace shardwise

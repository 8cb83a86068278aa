// planner/executor_traits.h — what a plan depends on of the executor that runs it, as plain data: the
// executor provides the values for a model (executor/traits.h: executor_traits) and whoever plans passes
// them in PlannerConfig::executor. The planner sizes and prices plans by these facts and never
// re-derives them; a plan made with other traits may be refused by the executor (a scratch region too
// small, a step routed on the device beyond its limit).
#pragma once

#include <algorithm>
#include <cstdint>

namespace shardwise {

struct ExecutorTraits {
  // GPU steps of at most this many tokens project Q, K and V as one batched matmul when the three
  // weights share a dtype (one op instead of three); 0: never.
  int64_t gpu_fused_qkv_max_tokens = 0;
  // Steps of at most this many tokens route an MoE layer on the GPU when its attention (which computes
  // the router logits) and its FFN run there with every expert resident: no router-logits copy and no
  // host round trip. Larger steps, streamed experts and CPU FFNs route on the host. 0: never.
  int64_t device_routing_max_tokens = 0;
  // The plan's scratch region for a step of n tokens (the step's device activations, the kernels'
  // temporaries and library workspace): scratch_fixed_bytes + n * scratch_bytes_per_token.
  uint64_t scratch_fixed_bytes = 0;
  uint64_t scratch_bytes_per_token = 0;
  // Copies one streamed routed MoE expert takes: its gate, up and down as 1 to 3 (strided) copies.
  int expert_copies = 3;
  // Sequences a step may run at once (a batched engine's slots): each one ending in a step gets a row
  // of logits in the scratch, one row of which scratch_fixed_bytes holds.
  int64_t output_rows = 1;
  uint64_t output_row_bytes = 0;

  uint64_t scratch_bytes(int64_t n) const {
    const int64_t extra_rows = std::max<int64_t>(0, std::min(n, output_rows) - 1);
    return scratch_fixed_bytes + static_cast<uint64_t>(n) * scratch_bytes_per_token +
           static_cast<uint64_t>(extra_rows) * output_row_bytes;
  }
  // Unset traits (a default-constructed struct) describe no executor: the planner refuses them.
  bool set() const { return scratch_fixed_bytes > 0; }
};

}  // namespace shardwise

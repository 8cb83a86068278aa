// executor/traits.cpp — the executor's traits for a model (see traits.h).
#include "executor/traits.h"

#include <algorithm>

namespace shardwise {
namespace {

// The runtime's scratch region for a step: f32 activations per token, f32 values whatever the step, and
// the kernels' temporaries.
struct Scratch {
  uint64_t floats_per_token = 0, fixed_floats = 0, workspace_bytes = 0;
};

Scratch scratch_of(const ModelSpec& s) {
  const uint64_t H = static_cast<uint64_t>(s.hidden_size), QD = static_cast<uint64_t>(s.q_dim()),
                 KVD = static_cast<uint64_t>(s.kv_dim());
  const uint64_t ffn = s.is_moe() ? static_cast<uint64_t>(s.num_experts_per_tok * s.moe_intermediate_size)
                                  : static_cast<uint64_t>(s.intermediate_size);
  Scratch r;
  // x, normed x, FFN/attention output; q, attention output; k, v; gate and up; MoE gathers k copies.
  r.floats_per_token = 3 * H + 2 * QD + 2 * KVD + 2 * ffn;
  // MoE: k gathered copies, router logits, and a split layer's CPU share (plan.h moe_gpu_share).
  if (s.is_moe())
    r.floats_per_token += static_cast<uint64_t>(s.num_experts_per_tok) * H + static_cast<uint64_t>(s.num_experts) + H;
  // Flash-attention tiles: 64 queries x 128 keys x heads of scores and partial sums.
  r.fixed_floats += 64ull * 128ull * static_cast<uint64_t>(s.num_attention_heads) * 2;
  r.fixed_floats += static_cast<uint64_t>(s.vocab_size);       // one row of logits
  r.floats_per_token += static_cast<uint64_t>(s.num_experts);  // router logits
  r.fixed_floats += H;                                         // the LM head's norm
  // Library workspace and kernel temporaries (e.g. a dequantised weight tile): 32 MiB for real
  // models, less for small ones.
  const uint64_t widest =
      static_cast<uint64_t>(std::max({s.intermediate_size, s.moe_intermediate_size, s.q_dim(), s.hidden_size}));
  r.workspace_bytes = std::min<uint64_t>(32ull << 20, std::max<uint64_t>(1ull << 20, 64 * widest * H * 4 / 16));
  return r;
}

}  // namespace

ExecutorTraits executor_traits(const ModelSpec& spec, int expert_copies, int sequences) {
  ExecutorTraits t;
  t.gpu_fused_qkv_max_tokens = kGpuFusedQkvMaxTokens;
  t.device_routing_max_tokens = kDeviceRoutingMaxTokens;
  const Scratch s = scratch_of(spec);
  t.scratch_bytes_per_token = s.floats_per_token * 4;
  t.scratch_fixed_bytes = s.fixed_floats * 4 + s.workspace_bytes + 16 * 256;  // + alignment of the runtime's buffers
  t.expert_copies = expert_copies;
  t.output_rows = std::max(1, sequences);
  t.output_row_bytes = static_cast<uint64_t>(spec.vocab_size) * 4;
  return t;
}

}  // namespace shardwise

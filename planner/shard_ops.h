// planner/shard_ops.h — what the planner prices shards by: the ops each shard runs for a step of n
// tokens (which the cost model times), the bytes of a step's FFN reads and of the activations that
// cross between host and device. The shards themselves are planner/shard_layout.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_spec.h"
#include "costmodel/cost_model.h"
#include "planner/shard_layout.h"

namespace shardwise {

// Ops of one step of n new tokens attending over `keys` cached keys (including the new ones).
// Attention is split where the cache may live elsewhere: `pre` (norm, Q/K/V, q/k norms, RoPE,
// router), `core` (scores, softmax, values over the cache) and `post` (O projection, residual).
// pre_gpu is `pre` as the GPU runs it: q/k norms and RoPE (with the K/V cache write) are one kernel,
// and a step of at most `fused_qkv_max_tokens` tokens (ExecutorTraits::gpu_fused_qkv_max_tokens)
// projects Q, K and V in one batched matmul when their dtypes agree. The CPU computes them one by one.
struct AttentionOps {
  std::vector<Op> pre, pre_gpu, core, post;
};
AttentionOps attention_ops(const ModelSpec& spec, const ShardSet& set, int layer, int64_t n, int64_t keys,
                           DType kv_dtype, int64_t fused_qkv_max_tokens);
// active_experts: MoE distinct experts per layer the step touches (0 = the uniform expectation).
std::vector<Op> ffn_ops(const ModelSpec& spec, const ShardSet& set, int layer, int64_t n, double active_experts = 0);
// Bytes of an FFN shard a step of n tokens actually reads: MoE steps touch only the routed experts
// (min(E, n·k) at most; expected: active_experts where the routing was measured, else
// E·(1−(1−k/E)^n)); dense steps read the whole shard.
uint64_t ffn_bytes_touched(const ModelSpec& spec, const Shard& ffn, int64_t n, bool worst_case,
                           double active_experts = 0);
// The LM head runs for the last token only (a step returns one row of logits).
std::vector<Op> output_ops(const ModelSpec& spec, const ShardSet& set);
std::vector<Op> embed_ops(const ModelSpec& spec, int64_t n);

// Bytes of the f32 activations exchanged between devices.
uint64_t residual_bytes(const ModelSpec& spec, int64_t n);  // x: n x hidden
uint64_t qkv_bytes(const ModelSpec& spec, int64_t n);       // q, k, v of n tokens
uint64_t attn_out_bytes(const ModelSpec& spec, int64_t n);  // n x q_dim
uint64_t logits_bytes(const ModelSpec& spec);               // one row of vocab

}  // namespace shardwise

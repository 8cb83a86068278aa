// planner/shards.h — a model cut into sub-layer shards of uniform arithmetic intensity
// (DESIGN.md §2): per layer an attention shard (attention norm, Q/K/V/O, q/k norms and, for MoE,
// the FFN norm and the router, so a step knows which experts it needs before fetching them), an FFN shard (FFN norm and gate/up/down, or all experts of the layer) and a KV shard
// (the layer's cache at the context capacity); plus the output shard (final norm + LM head) and the
// embedding table (always on the host). Also the ops each shard runs for a step of n tokens, which
// the cost model times.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "costmodel/cost_model.h"

namespace shardwise {

enum class ShardKind { Attention, Ffn, Kv, Output, Embedding };
const char* shard_kind_name(ShardKind k);

struct Shard {
  int id = 0;
  ShardKind kind = ShardKind::Attention;
  int layer = -1;            // -1 for output and embedding
  uint64_t bytes = 0;        // weight bytes (KV: cache bytes at the context capacity)
  uint64_t expert_base = 0;    // MoE FFN: where the experts start in the shard's region
  uint64_t expert_stride = 0;  // MoE FFN: bytes per expert
  std::vector<std::string> tensors;  // canonical tensor names (empty for KV)
  std::string name() const;  // "L3.attn", "L3.ffn", "L3.kv", "output", "embedding"
};

struct ShardSet {
  std::vector<Shard> shards;  // index = id
  int n_layers = 0;
  std::vector<int> attention, ffn, kv;  // shard id per layer
  int output = -1, embedding = -1;
  const Shard& at(int id) const { return shards.at(static_cast<size_t>(id)); }
};

// Storage dtypes of real files can differ from the spec's rule (e.g. a q8_0 file keeping some
// tensors in f16); this map (canonical name -> dtype) overrides the rule where given.
using TensorDtypes = std::map<std::string, DType>;

// kv_dtype is the cache element type (f32 keeps results exact against an f32 reference).
ShardSet make_shards(const ModelSpec& spec, int64_t ctx, DType kv_dtype, const TensorDtypes* dtypes = nullptr);

// Where each tensor of a shard sits inside the shard's region of VRAM (its pinned place or a
// stream slot): tensors in the shard's order, each at a 256-byte aligned offset. The experts of an
// MoE FFN shard follow, expert by expert: expert j's gate, up and down at expert_base +
// j * expert_stride + {0, expert_up_offset, expert_down_offset}; a slot holding only the routed experts
// packs them the same way (j = their rank among the routed experts).
constexpr uint64_t kShardAlign = 256;
struct ShardTensorPlace {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
struct ShardLayout {
  std::vector<ShardTensorPlace> tensors;  // non-expert tensors
  int64_t n_experts = 0;                  // MoE FFN shards only
  uint64_t expert_base = 0;               // offset of expert 0 (after the non-expert tensors)
  uint64_t expert_stride = 0;             // bytes per expert (gate + up + down, aligned)
  uint64_t expert_up_offset = 0, expert_down_offset = 0;  // within one expert's block
  DType gate_dtype = DType::F32, up_dtype = DType::F32, down_dtype = DType::F32;
  uint64_t bytes = 0;  // the whole shard's region
  const ShardTensorPlace* find(const std::string& name) const;
};
// Every shard's layout, indexed by shard id (KV shards: empty).
std::vector<ShardLayout> shard_layouts(const ModelSpec& spec, const ShardSet& set, const TensorDtypes* dtypes = nullptr);

// Ops of one step of n new tokens attending over `keys` cached keys (including the new ones).
// Attention is split where the cache may live elsewhere: `pre` (norm, Q/K/V, q/k norms, RoPE,
// router), `core` (scores, softmax, values over the cache) and `post` (O projection, residual).
// pre_gpu is `pre` as the GPU runs it: q/k norms and RoPE (with the K/V cache write) are one kernel,
// and a step of at most kGpuFusedQkvTokens tokens projects Q, K and V in one batched GEMV when their
// dtypes agree (executor/cuda). The CPU computes them one by one.
struct AttentionOps {
  std::vector<Op> pre, pre_gpu, core, post;
};
constexpr int64_t kGpuFusedQkvTokens = 8;
AttentionOps attention_ops(const ModelSpec& spec, const ShardSet& set, int layer, int64_t n, int64_t keys,
                           DType kv_dtype);
// active_experts: MoE distinct experts per layer the step touches (0 = the uniform expectation).
std::vector<Op> ffn_ops(const ModelSpec& spec, const ShardSet& set, int layer, int64_t n, double active_experts = 0);
// Bytes of an FFN shard a step of n tokens actually reads: MoE steps touch only the routed experts
// (min(E, n·k) at most; expected: active_experts where the routing was measured, else
// E·(1−(1−k/E)^n)); dense steps read the whole shard.
uint64_t ffn_bytes_touched(const ModelSpec& spec, const Shard& ffn, int64_t n, bool worst_case, double active_experts = 0);
// The LM head runs for the last token only (a step returns one row of logits).
std::vector<Op> output_ops(const ModelSpec& spec, const ShardSet& set);
std::vector<Op> embed_ops(const ModelSpec& spec, int64_t n);

// Bytes of the f32 activations exchanged between devices.
uint64_t residual_bytes(const ModelSpec& spec, int64_t n);        // x: n x hidden
uint64_t qkv_bytes(const ModelSpec& spec, int64_t n);             // q, k, v of n tokens
uint64_t attn_out_bytes(const ModelSpec& spec, int64_t n);        // n x q_dim
uint64_t logits_bytes(const ModelSpec& spec);                     // one row of vocab
// GPU working memory for a step of n tokens (activations, one layer at a time, attention tiles,
// library workspace).
uint64_t gpu_scratch_bytes(const ModelSpec& spec, int64_t n);

}  // namespace shardwise

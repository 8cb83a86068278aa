// planner/shard_layout.h — the layout contract between planner and executor (DESIGN.md §4): a model
// cut into sub-layer shards of uniform arithmetic intensity (DESIGN.md §2) — per layer an attention
// shard (attention norm, Q/K/V/O, q/k norms and, for MoE, the FFN norm and the router, so a step knows
// which experts it needs before fetching them), an FFN shard (FFN norm and gate/up/down, or all experts
// of the layer) and a KV shard (the layer's cache at the context capacity); plus the output shard
// (final norm + LM head) and the embedding table (always on the host) — and where each tensor of a
// shard sits in the shard's region of VRAM. Plain data over core only: the executor lays weights out by
// it; what the planner prices shards by is in planner/shard_ops.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/model_spec.h"

namespace shardwise {

enum class ShardKind { Attention, Ffn, Kv, Output, Embedding };
const char* shard_kind_name(ShardKind k);

struct Shard {
  int id = 0;
  ShardKind kind = ShardKind::Attention;
  int layer = -1;                    // -1 for output and embedding
  uint64_t bytes = 0;                // weight bytes (KV: cache bytes at the context capacity)
  uint64_t expert_base = 0;          // MoE FFN: where the experts start in the shard's region
  uint64_t expert_stride = 0;        // MoE FFN: bytes per expert
  std::vector<std::string> tensors;  // canonical tensor names (empty for KV)
  std::string name() const;          // "L3.attn", "L3.ffn", "L3.kv", "output", "embedding"
};

// Storage dtypes of real files can differ from the spec's rule (e.g. a Q4_K_M file keeps ffn_down of some
// layers in q6_K); this map (canonical name -> dtype) overrides the rule where given.
using TensorDtypes = std::map<std::string, DType>;

// A layer's matrix types as stored: the file's where the map gives them, else the spec's rule (gate, up
// and down are the dense FFN's or the experts').
struct LayerTypes {
  DType q = DType::F32, k = DType::F32, v = DType::F32, o = DType::F32;
  DType gate = DType::F32, up = DType::F32, down = DType::F32;
};

struct ShardSet {
  std::vector<Shard> shards;       // index = id
  std::vector<LayerTypes> types;   // per layer, what the planner prices each matrix at
  DType output_type = DType::F32;  // the LM head's (the token embedding's when tied)
  DType kv_dtype = DType::F32;     // the KV cache's element type
  int n_layers = 0;
  std::vector<int> attention, ffn, kv;  // shard id per layer
  int output = -1, embedding = -1;
  const Shard& at(int id) const { return shards.at(static_cast<size_t>(id)); }
};

// kv_dtype is the cache element type (f32 keeps results exact against an f32 reference; a KV shard holds
// ctx rows of K and V, dtype_row_bytes(kv_dtype, kv_dim) each: q8_0, (head_dim / 32) * 34 bytes per
// head, and head_dim must be a multiple of 32).
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
  std::vector<ShardTensorPlace> tensors;                  // non-expert tensors
  int64_t n_experts = 0;                                  // MoE FFN shards only
  uint64_t expert_base = 0;                               // offset of expert 0 (after the non-expert tensors)
  uint64_t expert_stride = 0;                             // bytes per expert (gate + up + down, aligned)
  uint64_t expert_up_offset = 0, expert_down_offset = 0;  // within one expert's block
  DType gate_dtype = DType::F32, up_dtype = DType::F32, down_dtype = DType::F32;
  uint64_t bytes = 0;  // the whole shard's region
  const ShardTensorPlace* find(const std::string& name) const;
};
// Every shard's layout, indexed by shard id (KV shards: empty).
std::vector<ShardLayout> shard_layouts(const ModelSpec& spec, const ShardSet& set,
                                       const TensorDtypes* dtypes = nullptr);

}  // namespace shardwise

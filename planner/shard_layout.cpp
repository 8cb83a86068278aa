// planner/shard_layout.cpp — shard grouping and shard layouts (see shard_layout.h).
#include "planner/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace shardwise {

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::Attention:
      return "attn";
    case ShardKind::Ffn:
      return "ffn";
    case ShardKind::Kv:
      return "kv";
    case ShardKind::Output:
      return "output";
    case ShardKind::Embedding:
      return "embedding";
  }
  return "?";
}

std::string Shard::name() const {
  if (layer < 0) return shard_kind_name(kind);
  return "L" + std::to_string(layer) + "." + shard_kind_name(kind);
}

namespace {
uint64_t align_shard(uint64_t x) {
  return (x + kShardAlign - 1) / kShardAlign * kShardAlign;
}
}  // namespace

const ShardTensorPlace* ShardLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

using TensorDescs = std::map<std::string, TensorDesc>;

TensorDescs descs_of(const ModelSpec& spec) {
  TensorDescs descs;
  for (const TensorDesc& t : spec.tensors()) descs[t.name] = t;
  return descs;
}

// One shard's layout over the spec's tensors indexed by name (indexed once for all shards: building
// the index per shard was most of the planner's time).
ShardLayout layout_from(const ModelSpec& spec, const TensorDescs& descs, const Shard& shard,
                        const TensorDtypes* dtypes) {
  ShardLayout L;
  auto dtype_of = [&](const TensorDesc& d) {
    if (dtypes) {
      auto it = dtypes->find(d.name);
      if (it != dtypes->end()) return it->second;
    }
    return d.dtype;
  };
  uint64_t off = 0;
  std::vector<const TensorDesc*> experts;
  for (const std::string& name : shard.tensors) {
    const TensorDesc& d = descs.at(name);
    if (d.kind == TensorKind::MoeGate || d.kind == TensorKind::MoeUp || d.kind == TensorKind::MoeDown) {
      experts.push_back(&d);
      continue;
    }
    ShardTensorPlace p;
    p.name = name;
    // Vectors (norms) are always stored as f32 on the device.
    p.dtype = d.shape.size() <= 1 ? DType::F32 : dtype_of(d);
    p.shape = d.shape;
    p.bytes = tensor_bytes(p.dtype, d.shape);
    p.offset = off;
    off += align_shard(p.bytes);
    L.tensors.push_back(std::move(p));
  }
  if (!experts.empty()) {
    SW_CHECK(experts.size() == 3, "shard ", shard.name(), ": expected gate, up and down expert tensors");
    L.n_experts = spec.num_experts;
    uint64_t within = 0;
    for (const TensorDesc* d : experts) {
      const DType dt = dtype_of(*d);
      const Shape one(d->shape.begin() + 1, d->shape.end());
      const uint64_t b = align_shard(tensor_bytes(dt, one));
      if (d->kind == TensorKind::MoeGate) L.gate_dtype = dt;
      if (d->kind == TensorKind::MoeUp) {
        L.up_dtype = dt;
        L.expert_up_offset = within;
      }
      if (d->kind == TensorKind::MoeDown) {
        L.down_dtype = dt;
        L.expert_down_offset = within;
      }
      within += b;
    }
    L.expert_stride = within;
    off = align_shard(off);
    L.expert_base = off;
    off += static_cast<uint64_t>(L.n_experts) * L.expert_stride;
  }
  L.bytes = align_shard(off);
  return L;
}

// The stored type of a matrix into set.types / set.output_type.
void record_type(const ModelSpec& spec, const TensorDesc& t, const TensorDtypes* dtypes, ShardSet& set) {
  DType dt = t.dtype;
  if (dtypes) {
    const auto it = dtypes->find(t.name);
    if (it != dtypes->end()) dt = it->second;
  }
  if (t.kind == TensorKind::Output || (t.kind == TensorKind::TokenEmbd && spec.tie_word_embeddings)) {
    set.output_type = dt;
    return;
  }
  if (t.layer < 0) return;
  LayerTypes& L = set.types[static_cast<size_t>(t.layer)];
  switch (t.kind) {
    case TensorKind::AttnQ:
      L.q = dt;
      break;
    case TensorKind::AttnK:
      L.k = dt;
      break;
    case TensorKind::AttnV:
      L.v = dt;
      break;
    case TensorKind::AttnOut:
      L.o = dt;
      break;
    case TensorKind::FfnGate:
    case TensorKind::MoeGate:
      L.gate = dt;
      break;
    case TensorKind::FfnUp:
    case TensorKind::MoeUp:
      L.up = dt;
      break;
    case TensorKind::FfnDown:
    case TensorKind::MoeDown:
      L.down = dt;
      break;
    default:
      break;
  }
}

}  // namespace

std::vector<ShardLayout> shard_layouts(const ModelSpec& spec, const ShardSet& set, const TensorDtypes* dtypes) {
  const TensorDescs descs = descs_of(spec);
  std::vector<ShardLayout> out;
  out.reserve(set.shards.size());
  for (const Shard& s : set.shards) out.push_back(layout_from(spec, descs, s, dtypes));
  return out;
}

ShardSet make_shards(const ModelSpec& spec, int64_t ctx, DType kv_dtype, const TensorDtypes* dtypes) {
  SW_CHECK(ctx >= 1, "context must be at least 1 token");
  check_kv_head_dim(kv_dtype, spec.head_dim, "planner");
  ShardSet set;
  set.n_layers = static_cast<int>(spec.num_hidden_layers);
  set.kv_dtype = kv_dtype;
  set.types.assign(static_cast<size_t>(set.n_layers), LayerTypes{});
  set.attention.assign(set.n_layers, -1);
  set.ffn.assign(set.n_layers, -1);
  set.kv.assign(set.n_layers, -1);
  auto add = [&](ShardKind kind, int layer) -> Shard& {
    Shard s;
    s.id = static_cast<int>(set.shards.size());
    s.kind = kind;
    s.layer = layer;
    set.shards.push_back(s);
    return set.shards.back();
  };
  for (int l = 0; l < set.n_layers; ++l) {
    set.attention[l] = add(ShardKind::Attention, l).id;
    set.ffn[l] = add(ShardKind::Ffn, l).id;
    Shard& kv = add(ShardKind::Kv, l);
    kv.bytes = static_cast<uint64_t>(ctx) * 2 * dtype_row_bytes(kv_dtype, spec.kv_dim());
    set.kv[l] = kv.id;
  }
  set.output = add(ShardKind::Output, -1).id;
  set.embedding = add(ShardKind::Embedding, -1).id;
  for (const TensorDesc& t : spec.tensors()) {
    record_type(spec, t, dtypes, set);
    int id = -1;
    switch (t.kind) {
      case TensorKind::TokenEmbd:
        id = set.embedding;
        break;
      case TensorKind::OutputNorm:
      case TensorKind::Output:
        id = set.output;
        break;
      case TensorKind::AttnNorm:
      case TensorKind::AttnQ:
      case TensorKind::AttnK:
      case TensorKind::AttnV:
      case TensorKind::AttnOut:
      case TensorKind::AttnQNorm:
      case TensorKind::AttnKNorm:
      case TensorKind::AttnQBias:
      case TensorKind::AttnKBias:
      case TensorKind::AttnVBias:
      case TensorKind::MoeRouter:
        id = set.attention[t.layer];
        break;
      case TensorKind::FfnNorm:
        // MoE: the router (attention shard) needs the normed input, so routing is known before the
        // experts' weights are fetched; the experts need it too, so both shards carry this small
        // vector. Dense: the norm stays with its FFN.
        if (spec.is_moe()) set.shards[static_cast<size_t>(set.ffn[t.layer])].tensors.push_back(t.name);
        id = spec.is_moe() ? set.attention[t.layer] : set.ffn[t.layer];
        break;
      default:
        id = set.ffn[t.layer];
    }
    set.shards[id].tensors.push_back(t.name);
  }
  // A tied LM head reads the embedding table: the output shard needs its own copy of those bytes.
  if (spec.tie_word_embeddings) set.shards[set.output].tensors.push_back("token_embd.weight");
  const TensorDescs descs = descs_of(spec);
  for (Shard& s : set.shards) {
    if (s.kind == ShardKind::Kv) continue;
    const ShardLayout L = layout_from(spec, descs, s, dtypes);
    s.bytes = L.bytes;
    s.expert_base = L.expert_base;
    s.expert_stride = L.expert_stride;
  }
  return set;
}

}  // namespace shardwise

// planner/shards.cpp — shard grouping and per-shard ops (see shards.h).
#include "planner/shards.h"

#include <algorithm>

#include "core/error.h"

namespace shardwise {

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::Attention: return "attn";
    case ShardKind::Ffn: return "ffn";
    case ShardKind::Kv: return "kv";
    case ShardKind::Output: return "output";
    case ShardKind::Embedding: return "embedding";
  }
  return "?";
}

std::string Shard::name() const {
  if (layer < 0) return shard_kind_name(kind);
  return "L" + std::to_string(layer) + "." + shard_kind_name(kind);
}

namespace {
uint64_t align_shard(uint64_t x) { return (x + kShardAlign - 1) / kShardAlign * kShardAlign; }
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
ShardLayout layout_from(const ModelSpec& spec, const TensorDescs& descs, const Shard& shard, const TensorDtypes* dtypes) {
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
  ShardSet set;
  set.n_layers = static_cast<int>(spec.num_hidden_layers);
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
    int id = -1;
    switch (t.kind) {
      case TensorKind::TokenEmbd: id = set.embedding; break;
      case TensorKind::OutputNorm:
      case TensorKind::Output: id = set.output; break;
      case TensorKind::AttnNorm: case TensorKind::AttnQ: case TensorKind::AttnK: case TensorKind::AttnV:
      case TensorKind::AttnOut: case TensorKind::AttnQNorm: case TensorKind::AttnKNorm: case TensorKind::MoeRouter:
        id = set.attention[t.layer];
        break;
      case TensorKind::FfnNorm:
        // MoE: the router (attention shard) needs the normed input, so routing is known before the
        // experts' weights are fetched; the experts need it too, so both shards carry this small
        // vector. Dense: the norm stays with its FFN.
        if (spec.is_moe()) set.shards[static_cast<size_t>(set.ffn[t.layer])].tensors.push_back(t.name);
        id = spec.is_moe() ? set.attention[t.layer] : set.ffn[t.layer];
        break;
      default: id = set.ffn[t.layer];
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

namespace {

Op matmul(DType dt, int64_t n, int64_t rows, int64_t cols) {
  Op op;
  op.kind = OpKind::Matmul;
  op.dtype = dt;
  op.tokens = n;
  op.rows = rows;
  op.cols = cols;
  return op;
}

Op simple(OpKind kind, int64_t n, int64_t elems) {
  Op op;
  op.kind = kind;
  op.tokens = n;
  op.elems = elems;
  return op;
}

DType dtype_of(const ModelSpec& spec, TensorKind kind, const Shape& shape) { return spec.tensor_dtype(kind, shape); }

}  // namespace

AttentionOps attention_ops(const ModelSpec& s, const ShardSet&, int, int64_t n, int64_t keys, DType kv_dtype) {
  AttentionOps a;
  const int64_t H = s.hidden_size, QD = s.q_dim(), KVD = s.kv_dim();
  const DType dq = dtype_of(s, TensorKind::AttnQ, {QD, H}), dk = dtype_of(s, TensorKind::AttnK, {KVD, H}),
              dv = dtype_of(s, TensorKind::AttnV, {KVD, H});
  a.pre.push_back(simple(OpKind::Norm, n, n * H));
  a.pre.push_back(matmul(dq, n, QD, H));
  a.pre.push_back(matmul(dk, n, KVD, H));
  a.pre.push_back(matmul(dv, n, KVD, H));
  if (s.has_qk_norm()) a.pre.push_back(simple(OpKind::Norm, n, n * (QD + KVD)));
  a.pre.push_back(simple(OpKind::Rope, n, n * (QD + KVD)));
  a.pre_gpu.push_back(simple(OpKind::Norm, n, n * H));
  if (n <= kGpuFusedQkvTokens && dq == dk && dq == dv) {
    a.pre_gpu.push_back(matmul(dq, n, QD + 2 * KVD, H));
  } else {
    a.pre_gpu.push_back(matmul(dq, n, QD, H));
    a.pre_gpu.push_back(matmul(dk, n, KVD, H));
    a.pre_gpu.push_back(matmul(dv, n, KVD, H));
  }
  a.pre_gpu.push_back(simple(OpKind::Rope, n, n * (QD + KVD)));  // q/k norms inside
  Op core;
  core.kind = OpKind::Attention;
  core.dtype = kv_dtype;
  core.tokens = n;
  core.ctx = keys;
  core.n_heads = s.num_attention_heads;
  core.n_kv_heads = s.num_key_value_heads;
  core.head_dim = s.head_dim;
  a.core.push_back(core);
  a.post.push_back(matmul(dtype_of(s, TensorKind::AttnOut, {H, QD}), n, H, QD));
  a.post.push_back(simple(OpKind::Elementwise, n, n * H));
  if (s.is_moe()) {  // the router belongs to the attention shard (its output feeds the experts)
    a.post.push_back(simple(OpKind::Norm, n, n * H));
    a.post.push_back(matmul(DType::F32, n, s.num_experts, H));
  }
  return a;
}

std::vector<Op> ffn_ops(const ModelSpec& s, const ShardSet&, int, int64_t n, double active_experts) {
  std::vector<Op> ops;
  const int64_t H = s.hidden_size;
  if (!s.is_moe()) ops.push_back(simple(OpKind::Norm, n, n * H));
  if (s.is_moe()) {
    Op e;
    e.kind = OpKind::MoeExperts;
    e.dtype = dtype_of(s, TensorKind::MoeUp, {s.num_experts, s.moe_intermediate_size, H});
    e.tokens = n;
    e.rows = s.moe_intermediate_size;
    e.cols = H;
    e.n_experts = s.num_experts;
    e.top_k = s.num_experts_per_tok;
    e.active_experts = active_experts;
    // One op: the profiler's MoE rows time the whole block, its SwiGLU and combine included (an
    // element-wise op on top counted them twice: ~0.18 ms per CPU layer for one qwen30b token at 16
    // threads, the single-threaded SwiGLU row, in planner_accuracy_v3's Static misses).
    ops.push_back(e);
  } else {
    const int64_t F = s.intermediate_size;
    ops.push_back(matmul(dtype_of(s, TensorKind::FfnGate, {F, H}), n, F, H));
    ops.push_back(matmul(dtype_of(s, TensorKind::FfnUp, {F, H}), n, F, H));
    ops.push_back(simple(OpKind::Elementwise, n, n * F));
    ops.push_back(matmul(dtype_of(s, TensorKind::FfnDown, {H, F}), n, H, F));
    ops.push_back(simple(OpKind::Elementwise, n, n * H));
  }
  return ops;
}

uint64_t ffn_bytes_touched(const ModelSpec& s, const Shard& ffn, int64_t n, bool worst_case, double active_experts) {
  if (!s.is_moe()) return ffn.bytes;
  const double e = worst_case         ? static_cast<double>(std::min<int64_t>(s.num_experts, n * s.num_experts_per_tok))
                   : active_experts > 0 ? active_experts
                                        : expected_distinct_experts(n, s.num_experts_per_tok, s.num_experts);
  return ffn.expert_base + static_cast<uint64_t>(static_cast<double>(ffn.expert_stride) * e + 0.5);
}

std::vector<Op> output_ops(const ModelSpec& s, const ShardSet&) {
  const TensorKind head = s.tie_word_embeddings ? TensorKind::TokenEmbd : TensorKind::Output;
  return {simple(OpKind::Norm, 1, s.hidden_size),
          matmul(dtype_of(s, head, {s.vocab_size, s.hidden_size}), 1, s.vocab_size, s.hidden_size)};
}

std::vector<Op> embed_ops(const ModelSpec& s, int64_t n) { return {simple(OpKind::Embed, n, n * s.hidden_size)}; }

uint64_t residual_bytes(const ModelSpec& s, int64_t n) { return static_cast<uint64_t>(n * s.hidden_size) * 4; }
uint64_t qkv_bytes(const ModelSpec& s, int64_t n) { return static_cast<uint64_t>(n * (s.q_dim() + 2 * s.kv_dim())) * 4; }
uint64_t attn_out_bytes(const ModelSpec& s, int64_t n) { return static_cast<uint64_t>(n * s.q_dim()) * 4; }
uint64_t logits_bytes(const ModelSpec& s) { return static_cast<uint64_t>(s.vocab_size) * 4; }

uint64_t gpu_scratch_bytes(const ModelSpec& s, int64_t n) {
  const uint64_t N = static_cast<uint64_t>(n);
  const uint64_t H = static_cast<uint64_t>(s.hidden_size), QD = static_cast<uint64_t>(s.q_dim()),
                 KVD = static_cast<uint64_t>(s.kv_dim());
  const uint64_t ffn = s.is_moe() ? static_cast<uint64_t>(s.num_experts_per_tok * s.moe_intermediate_size)
                                  : static_cast<uint64_t>(s.intermediate_size);
  // x, normed x, FFN/attention output; q, attention output; k, v; gate and up; MoE gathers k copies.
  uint64_t floats = N * (3 * H + 2 * QD + 2 * KVD + 2 * ffn);
  // MoE: k gathered copies, router logits, and a split layer's CPU share (plan.h moe_gpu_share).
  if (s.is_moe()) floats += N * static_cast<uint64_t>(s.num_experts_per_tok) * H + N * static_cast<uint64_t>(s.num_experts) + N * H;
  // Flash-attention tiles: 64 queries x 128 keys x heads of scores and partial sums.
  floats += 64ull * 128ull * static_cast<uint64_t>(s.num_attention_heads) * 2;
  floats += static_cast<uint64_t>(s.vocab_size);  // one row of logits
  floats += N * static_cast<uint64_t>(s.num_experts) + H;  // router logits, the LM head's norm
  // Library workspace and kernel temporaries (e.g. a dequantised weight tile): 32 MiB for real
  // models, less for small ones.
  const uint64_t widest = static_cast<uint64_t>(std::max({s.intermediate_size, s.moe_intermediate_size, s.q_dim(), s.hidden_size}));
  const uint64_t workspace = std::min<uint64_t>(32ull << 20, std::max<uint64_t>(1ull << 20, 64 * widest * H * 4 / 16));
  return floats * 4 + workspace + 16 * 256;  // + alignment of the runtime's buffers
}

}  // namespace shardwise

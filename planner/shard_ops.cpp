// planner/shard_ops.cpp — the ops and bytes the planner prices shards by (see shard_ops.h).
#include "planner/shard_ops.h"

#include <algorithm>

namespace shardwise {

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

// The stored types of a layer's matrices (make_shards recorded them); the spec's rule for a shard set
// made without (planner tests). MoE experts are priced at the up matrices' type.
LayerTypes layer_types(const ModelSpec& s, const ShardSet& set, int layer) {
  if (layer >= 0 && static_cast<size_t>(layer) < set.types.size()) return set.types[static_cast<size_t>(layer)];
  const int64_t H = s.hidden_size, QD = s.q_dim(), KVD = s.kv_dim();
  const int64_t F = s.is_moe() ? s.moe_intermediate_size : s.intermediate_size;
  const Shape up = s.is_moe() ? Shape{s.num_experts, F, H} : Shape{F, H};
  const Shape down = s.is_moe() ? Shape{s.num_experts, H, F} : Shape{H, F};
  LayerTypes t;
  t.q = s.tensor_dtype(TensorKind::AttnQ, layer, {QD, H});
  t.k = s.tensor_dtype(TensorKind::AttnK, layer, {KVD, H});
  t.v = s.tensor_dtype(TensorKind::AttnV, layer, {KVD, H});
  t.o = s.tensor_dtype(TensorKind::AttnOut, layer, {H, QD});
  t.gate = s.tensor_dtype(s.is_moe() ? TensorKind::MoeGate : TensorKind::FfnGate, layer, up);
  t.up = s.tensor_dtype(s.is_moe() ? TensorKind::MoeUp : TensorKind::FfnUp, layer, up);
  t.down = s.tensor_dtype(s.is_moe() ? TensorKind::MoeDown : TensorKind::FfnDown, layer, down);
  return t;
}

}  // namespace

AttentionOps attention_ops(const ModelSpec& s, const ShardSet& S, int layer, int64_t n, int64_t keys, DType kv_dtype,
                           int64_t fused_qkv_max_tokens) {
  AttentionOps a;
  const int64_t H = s.hidden_size, QD = s.q_dim(), KVD = s.kv_dim();
  const LayerTypes types = layer_types(s, S, layer);
  const DType dq = types.q, dk = types.k, dv = types.v;
  a.pre.push_back(simple(OpKind::Norm, n, n * H));
  a.pre.push_back(matmul(dq, n, QD, H));
  a.pre.push_back(matmul(dk, n, KVD, H));
  a.pre.push_back(matmul(dv, n, KVD, H));
  if (s.has_qk_norm()) a.pre.push_back(simple(OpKind::Norm, n, n * (QD + KVD)));
  a.pre.push_back(simple(OpKind::Rope, n, n * (QD + KVD)));
  a.pre_gpu.push_back(simple(OpKind::Norm, n, n * H));
  if (n <= fused_qkv_max_tokens && dq == dk && dq == dv) {
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
  a.post.push_back(matmul(types.o, n, H, QD));
  a.post.push_back(simple(OpKind::Elementwise, n, n * H));
  if (s.is_moe()) {  // the router belongs to the attention shard (its output feeds the experts)
    a.post.push_back(simple(OpKind::Norm, n, n * H));
    a.post.push_back(matmul(DType::F32, n, s.num_experts, H));
  }
  return a;
}

std::vector<Op> ffn_ops(const ModelSpec& s, const ShardSet& S, int layer, int64_t n, double active_experts) {
  std::vector<Op> ops;
  const int64_t H = s.hidden_size;
  if (!s.is_moe()) ops.push_back(simple(OpKind::Norm, n, n * H));
  if (s.is_moe()) {
    Op e;
    e.kind = OpKind::MoeExperts;
    e.dtype = layer_types(s, S, layer).up;
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
    const LayerTypes types = layer_types(s, S, layer);
    ops.push_back(matmul(types.gate, n, F, H));
    ops.push_back(matmul(types.up, n, F, H));
    ops.push_back(simple(OpKind::Elementwise, n, n * F));
    ops.push_back(matmul(types.down, n, H, F));
    ops.push_back(simple(OpKind::Elementwise, n, n * H));
  }
  return ops;
}

uint64_t ffn_bytes_touched(const ModelSpec& s, const Shard& ffn, int64_t n, bool worst_case, double active_experts) {
  if (!s.is_moe()) return ffn.bytes;
  const double e = worst_case ? static_cast<double>(std::min<int64_t>(s.num_experts, n * s.num_experts_per_tok))
                   : active_experts > 0 ? active_experts
                                        : expected_distinct_experts(n, s.num_experts_per_tok, s.num_experts);
  return ffn.expert_base + static_cast<uint64_t>(static_cast<double>(ffn.expert_stride) * e + 0.5);
}

std::vector<Op> output_ops(const ModelSpec& s, const ShardSet& S) {
  const TensorKind head = s.tie_word_embeddings ? TensorKind::TokenEmbd : TensorKind::Output;
  const DType dt = !S.types.empty() ? S.output_type : s.tensor_dtype(head, -1, {s.vocab_size, s.hidden_size});
  return {simple(OpKind::Norm, 1, s.hidden_size), matmul(dt, 1, s.vocab_size, s.hidden_size)};
}

std::vector<Op> embed_ops(const ModelSpec& s, int64_t n) {
  return {simple(OpKind::Embed, n, n * s.hidden_size)};
}

uint64_t residual_bytes(const ModelSpec& s, int64_t n) {
  return static_cast<uint64_t>(n * s.hidden_size) * 4;
}
uint64_t qkv_bytes(const ModelSpec& s, int64_t n) {
  return static_cast<uint64_t>(n * (s.q_dim() + 2 * s.kv_dim())) * 4;
}
uint64_t attn_out_bytes(const ModelSpec& s, int64_t n) {
  return static_cast<uint64_t>(n * s.q_dim()) * 4;
}
uint64_t logits_bytes(const ModelSpec& s) {
  return static_cast<uint64_t>(s.vocab_size) * 4;
}

}  // namespace shardwise

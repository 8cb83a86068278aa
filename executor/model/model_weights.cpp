// executor/model/model_weights.cpp — per-layer arrangement of a WeightSource.
#include "executor/model/model_weights.h"

#include "core/error.h"

namespace shardwise {
namespace {

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(shape_elems(v.shape)));
  dequantize_row(v.dtype, v.data, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

}  // namespace

ModelWeights ModelWeights::from_source(const WeightSource& src) {
  ModelWeights m;
  m.spec = src.spec();
  m.rope_style = src.rope_style();
  m.token_embd = src.tensor("token_embd.weight");
  m.output_norm = to_f32(src.tensor("output_norm.weight"));
  m.output = m.spec.tie_word_embeddings ? m.token_embd : src.tensor("output.weight");
  for (int64_t l = 0; l < m.spec.num_hidden_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto t = [&](const char* n) { return src.tensor(p + n + ".weight"); };
    LayerWeights lw;
    lw.attn_norm = to_f32(t("attn_norm"));
    lw.wq = t("attn_q");
    lw.wk = t("attn_k");
    lw.wv = t("attn_v");
    lw.wo = t("attn_output");
    if (m.spec.has_qkv_bias()) {
      lw.q_bias = to_f32(src.tensor(p + "attn_q.bias"));
      lw.k_bias = to_f32(src.tensor(p + "attn_k.bias"));
      lw.v_bias = to_f32(src.tensor(p + "attn_v.bias"));
    }
    if (m.spec.has_qk_norm()) {
      lw.q_norm = to_f32(t("attn_q_norm"));
      lw.k_norm = to_f32(t("attn_k_norm"));
    }
    lw.ffn_norm = to_f32(t("ffn_norm"));
    if (m.spec.is_moe()) {
      lw.router = t("ffn_gate_inp");
      lw.gate_exps = t("ffn_gate_exps");
      lw.up_exps = t("ffn_up_exps");
      lw.down_exps = t("ffn_down_exps");
    } else {
      lw.ffn_gate = t("ffn_gate");
      lw.ffn_up = t("ffn_up");
      lw.ffn_down = t("ffn_down");
    }
    m.layers.push_back(std::move(lw));
  }
  return m;
}

}  // namespace shardwise

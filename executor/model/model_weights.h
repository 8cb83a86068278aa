// executor/model/model_weights.h — a WeightSource's tensors arranged per layer for execution.
// Matrices stay views of the source's memory (no copy, stored precision); the small 1-D norm
// weights are converted to f32 once. The source must outlive this object.
#pragma once

#include <vector>

#include "core/weight_source.h"

namespace shardwise {

struct LayerWeights {
  std::vector<float> attn_norm;   // [hidden]
  TensorView wq;                  // (q_dim, hidden)
  TensorView wk;                  // (kv_dim, hidden)
  std::vector<float> q_norm;      // [head_dim] (qwen3 families; empty otherwise)
  std::vector<float> k_norm;      // [head_dim]
  std::vector<float> q_bias;      // [q_dim] (qwen2; empty otherwise)
  std::vector<float> k_bias;      // [kv_dim]
  std::vector<float> v_bias;      // [kv_dim]
  TensorView wv;                  // (kv_dim, hidden)
  TensorView wo;                  // (hidden, q_dim)
  std::vector<float> ffn_norm;    // [hidden]
  TensorView ffn_gate, ffn_up;    // (ffn, hidden)            dense layers
  TensorView ffn_down;            // (hidden, ffn)            dense layers
  TensorView router;              // (n_experts, hidden)      MoE layers
  TensorView gate_exps, up_exps;  // (n_experts, expert_ffn, hidden)
  TensorView down_exps;           // (n_experts, hidden, expert_ffn)
  // Optional per-expert matrices (e.g. only the routed experts copied into a stream slot); when
  // non-empty they replace slices of the merged tensors above (nullptr = expert not present).
  std::vector<const uint8_t*> gate_exp, up_exp, down_exp;
};

struct ModelWeights {
  ModelSpec spec;
  RopeStyle rope_style = RopeStyle::Neox;
  TensorView token_embd;           // (vocab, hidden)
  std::vector<float> output_norm;  // [hidden]
  TensorView output;               // (vocab, hidden); the embedding table when tied
  std::vector<LayerWeights> layers;

  static ModelWeights from_source(const WeightSource& source);
};

}  // namespace shardwise

// core/model_spec.h — the shape of a model: family, dimensions, and every tensor it has, with
// bytes and FLOPs per tensor (what the planner groups into shards).
// Specs come from configs/models/*.yaml (keys mirror HF config.json, docs/DESIGN.md §6), from an HF
// config.json (transformers 4.x and 5.x spellings) or from GGUF metadata. This header knows nothing
// about where weights are stored; see weight_source.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant_mix.h"
#include "core/tensor.h"

namespace shardwise {

enum class Family {
  Llama,     // Llama / Mistral / Minitron: GQA attention, SwiGLU FFN
  Qwen3,     // Llama + per-head RMSNorm on q and k
  Qwen3Moe,  // Qwen3 attention + softmax-routed top-k experts
  Qwen2,     // Llama + biases on the q, k and v projections (Qwen2 / Qwen2.5, the Qwen2.5-VL language model)
};
const char* family_name(Family f);  // "llama", "qwen3", "qwen3_moe", "qwen2"
Family parse_family(const std::string& name, const std::string& context);

// How RoPE pairs dimensions. HF checkpoints rotate halves (NeoX style) for all three families;
// llama.cpp's converter reorders llama Q/K rows so that adjacent pairs (Normal) give the same result.
enum class RopeStyle { Normal, Neox };

enum class TensorKind : int {
  TokenEmbd,
  OutputNorm,
  Output,
  AttnNorm,
  AttnQ,
  AttnK,
  AttnV,
  AttnOut,
  AttnQNorm,
  AttnKNorm,
  FfnNorm,
  FfnGate,
  FfnUp,
  FfnDown,
  MoeRouter,
  MoeGate,
  MoeUp,
  MoeDown,    // MoeGate/Up/Down: experts merged, shape {E, out, in}
  AttnQBias,  // qwen2: the q, k and v projections' biases, {q_dim} / {kv_dim}
  AttnKBias,
  AttnVBias,
};
const char* tensor_kind_name(TensorKind k);
// The canonical (llama.cpp GGUF) name of a tensor: "blk.3.attn_q.weight", "blk.3.attn_q.bias",
// "output_norm.weight" (layer -1).
std::string tensor_name(TensorKind k, int layer);

struct TensorDesc {
  std::string name;  // canonical name = llama.cpp's GGUF name, e.g. "blk.3.attn_q.weight"
  TensorKind kind;
  int layer;    // -1 for tensors outside the layers
  Shape shape;  // row-major, outermost first
  DType dtype;  // storage dtype under the spec's dtype rule (see ModelSpec::tensor_dtype)
  uint64_t bytes;
  // Multiply-add FLOPs for one token through this tensor (2 per weight of a matmul). For merged
  // expert tensors: the FLOPs of the experts one token is routed to (top-k of E).
  double flops_per_token;
};

// The most layers a spec may have (validate() refuses more: far above any real model).
constexpr int64_t kMaxLayers = 4096;

struct ModelSpec {
  std::string name = "model";
  Family family = Family::Llama;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;           // may differ from hidden_size / num_attention_heads
  int64_t intermediate_size = 0;  // dense FFN width (unused by MoE layers)
  int64_t vocab_size = 0;
  int64_t num_experts = 0;            // MoE only
  int64_t num_experts_per_tok = 0;    // MoE only (top-k)
  int64_t moe_intermediate_size = 0;  // MoE only: FFN width of one expert
  bool norm_topk_prob = true;         // MoE only: renormalise the top-k routing weights
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;  // 0 = unknown
  DType dtype = DType::F16;             // dtype of matrix weights (norms and router stay f32)
  QuantMix mix = QuantMix::Pure;        // llama-quantize's mix of types around `dtype` (core/quant_mix.h)
  // Multimodal RoPE (Qwen2-VL family): the rotary pairs of a head split into sections rotated by a token's
  // temporal, height and width positions (vision/mrope.h); empty = plain RoPE. Text alone is plain RoPE.
  std::vector<int64_t> mrope_section;
  bool vision_tower = false;  // the checkpoint also holds a vision encoder (read by vision/, not here)

  bool has_qk_norm() const { return family == Family::Qwen3 || family == Family::Qwen3Moe; }
  bool has_qkv_bias() const { return family == Family::Qwen2; }
  bool is_moe() const { return family == Family::Qwen3Moe; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Throws Error("<context>: field: what is wrong") for missing, inconsistent or absurd values.
  void validate(const std::string& context) const;

  // Storage dtype of a tensor (layer -1 outside the layers) under llama.cpp's rules: vectors and the MoE
  // router are f32; matrices take `dtype`, or the mix's type (quant_mix.h), with llama.cpp's fallback
  // when a block does not divide the row (f16 at the end).
  DType tensor_dtype(TensorKind kind, int layer, const Shape& shape) const;

  std::vector<TensorDesc> tensors() const;
  uint64_t total_bytes() const;
  uint64_t n_params() const;
  // KV cache bytes per token (all layers, K and V) for a given cache element type.
  uint64_t kv_bytes_per_token(DType kv_dtype = DType::F32) const;
};

// Loads a spec from a YAML file (configs/models/*.yaml format). Throws Error naming file and field.
ModelSpec load_spec_yaml(const std::string& path);
ModelSpec parse_spec_yaml_text(const std::string& text, const std::string& context);
// Builds a spec from the text of an HF config.json.
ModelSpec spec_from_hf_config_json(const std::string& json_text, const std::string& context);
// Builtin specs: configs/models/<name>.yaml embedded in the binary (nemo4b, nemo8b, qwen30b, qwen235b,
// tiny shapes). Throws Error listing the known names.
ModelSpec builtin_spec(const std::string& name);
std::vector<std::string> builtin_spec_names();
// A builtin name, or a path to a .yaml file or an HF config.json.
ModelSpec resolve_spec(const std::string& name_or_path);

// Serialises the spec as YAML (the same keys the loader reads).
std::string spec_to_yaml(const ModelSpec& spec);

}  // namespace shardwise

// core/model_spec.cpp — ModelSpec: validation, tensor list, and loading from YAML / HF config.json.
#include "core/model_spec.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/builtin_yaml.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/yaml_util.h"

namespace shardwise {

namespace {

constexpr int64_t kMaxDim = int64_t(1) << 24;  // 16M: far above any real width
constexpr int64_t kMaxExperts = 65536;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::Llama:
      return "llama";
    case Family::Qwen3:
      return "qwen3";
    case Family::Qwen3Moe:
      return "qwen3_moe";
    case Family::Qwen2:
      return "qwen2";
  }
  return "?";
}

Family parse_family(const std::string& name, const std::string& context) {
  if (name == "llama" || name == "mistral") return Family::Llama;
  if (name == "qwen3") return Family::Qwen3;
  if (name == "qwen3_moe" || name == "qwen3moe") return Family::Qwen3Moe;
  if (name == "qwen2") return Family::Qwen2;
  fail(context, ": unknown model family/architecture '", name,
       "' (supported: llama (also mistral), qwen2, qwen3, qwen3_moe)");
}

const char* tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::TokenEmbd:
      return "token_embd";
    case TensorKind::OutputNorm:
      return "output_norm";
    case TensorKind::Output:
      return "output";
    case TensorKind::AttnNorm:
      return "attn_norm";
    case TensorKind::AttnQ:
      return "attn_q";
    case TensorKind::AttnK:
      return "attn_k";
    case TensorKind::AttnV:
      return "attn_v";
    case TensorKind::AttnOut:
      return "attn_output";
    case TensorKind::AttnQNorm:
      return "attn_q_norm";
    case TensorKind::AttnKNorm:
      return "attn_k_norm";
    case TensorKind::FfnNorm:
      return "ffn_norm";
    case TensorKind::FfnGate:
      return "ffn_gate";
    case TensorKind::FfnUp:
      return "ffn_up";
    case TensorKind::FfnDown:
      return "ffn_down";
    case TensorKind::MoeRouter:
      return "ffn_gate_inp";
    case TensorKind::MoeGate:
      return "ffn_gate_exps";
    case TensorKind::MoeUp:
      return "ffn_up_exps";
    case TensorKind::MoeDown:
      return "ffn_down_exps";
    case TensorKind::AttnQBias:
      return "attn_q_bias";
    case TensorKind::AttnKBias:
      return "attn_k_bias";
    case TensorKind::AttnVBias:
      return "attn_v_bias";
  }
  return "?";
}

std::string tensor_name(TensorKind k, int layer) {
  std::string base = tensor_kind_name(k), suffix = ".weight";
  if (k == TensorKind::AttnQBias || k == TensorKind::AttnKBias || k == TensorKind::AttnVBias) {
    base.resize(base.size() - 5);  // "attn_q_bias" -> "attn_q"
    suffix = ".bias";
  }
  return (layer < 0 ? "" : "blk." + std::to_string(layer) + ".") + base + suffix;
}

void ModelSpec::validate(const std::string& ctx) const {
  auto dim = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail(ctx, ": ", field, " = ", v, " is out of range [", lo, ", ", hi, "]");
  };
  dim("hidden_size", hidden_size, 1, kMaxDim);
  dim("num_hidden_layers", num_hidden_layers, 1, kMaxLayers);
  dim("num_attention_heads", num_attention_heads, 1, 65536);
  dim("num_key_value_heads", num_key_value_heads, 1, num_attention_heads);
  dim("head_dim", head_dim, 2, 65536);
  dim("vocab_size", vocab_size, 1, kMaxDim);
  if (num_attention_heads % num_key_value_heads != 0)
    fail(ctx, ": num_attention_heads (", num_attention_heads, ") must be a multiple of num_key_value_heads (",
         num_key_value_heads, ")");
  if (head_dim % 2 != 0) fail(ctx, ": head_dim = ", head_dim, " must be even for RoPE");
  if (q_dim() > kMaxDim) fail(ctx, ": num_attention_heads * head_dim = ", q_dim(), " is absurd");
  if (is_moe()) {
    dim("num_experts", num_experts, 1, kMaxExperts);
    dim("num_experts_per_tok", num_experts_per_tok, 1, num_experts);
    dim("moe_intermediate_size", moe_intermediate_size, 1, kMaxDim);
  } else {
    dim("intermediate_size", intermediate_size, 1, kMaxDim);
  }
  if (!(rope_theta > 0) || rope_theta > 1e12) fail(ctx, ": rope_theta = ", rope_theta, " must be positive");
  if (!mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t v : mrope_section) sum += v >= 0 && v <= head_dim ? v : head_dim + 1;
    if (mrope_section.size() != 3 || sum != head_dim / 2)
      fail(ctx, ": mrope_section must be 3 sections adding up to head_dim / 2 = ", head_dim / 2);
    // A GGUF writes M-RoPE as llama.cpp's qwen2vl architecture: qwen2's layers.
    if (family != Family::Qwen2)
      fail(ctx, ": mrope_section is for the qwen2 family (Qwen2-VL's language model), not ", family_name(family));
  }
  if (!(rms_norm_eps > 0) || rms_norm_eps > 1) fail(ctx, ": rms_norm_eps = ", rms_norm_eps, " must be in (0, 1]");
  // Total size guard: 2^50 bytes would be a petabyte model; anything near that is corrupt metadata.
  double params = static_cast<double>(hidden_size) * static_cast<double>(vocab_size) * 2 +
                  static_cast<double>(num_hidden_layers) * static_cast<double>(hidden_size) *
                      (2.0 * static_cast<double>(q_dim() + kv_dim()) +
                       3.0 * static_cast<double>(is_moe() ? num_experts * moe_intermediate_size : intermediate_size));
  if (params > 1e14) fail(ctx, ": the dimensions describe ", params, " parameters, which is absurd");
}

DType ModelSpec::tensor_dtype(TensorKind kind, int layer, const Shape& shape) const {
  return mix_tensor_dtype(*this, mix, dtype, kind, layer, shape);
}

std::vector<TensorDesc> ModelSpec::tensors() const {
  std::vector<TensorDesc> out;
  auto add = [&](TensorKind kind, int layer, Shape shape, double flops_per_token) {
    TensorDesc d;
    d.kind = kind;
    d.layer = layer;
    d.name = tensor_name(kind, layer);
    d.shape = std::move(shape);
    d.dtype = tensor_dtype(kind, layer, d.shape);
    d.bytes = tensor_bytes(d.dtype, d.shape);
    d.flops_per_token = flops_per_token;
    out.push_back(std::move(d));
  };
  auto mm = [](int64_t rows, int64_t cols) { return 2.0 * static_cast<double>(rows) * static_cast<double>(cols); };
  const int64_t H = hidden_size;
  add(TensorKind::TokenEmbd, -1, {vocab_size, H}, 0.0);
  for (int l = 0; l < static_cast<int>(num_hidden_layers); ++l) {
    add(TensorKind::AttnNorm, l, {H}, 0.0);
    add(TensorKind::AttnQ, l, {q_dim(), H}, mm(q_dim(), H));
    add(TensorKind::AttnK, l, {kv_dim(), H}, mm(kv_dim(), H));
    add(TensorKind::AttnV, l, {kv_dim(), H}, mm(kv_dim(), H));
    if (has_qkv_bias()) {
      add(TensorKind::AttnQBias, l, {q_dim()}, 0.0);
      add(TensorKind::AttnKBias, l, {kv_dim()}, 0.0);
      add(TensorKind::AttnVBias, l, {kv_dim()}, 0.0);
    }
    if (has_qk_norm()) {
      add(TensorKind::AttnQNorm, l, {head_dim}, 0.0);
      add(TensorKind::AttnKNorm, l, {head_dim}, 0.0);
    }
    add(TensorKind::AttnOut, l, {H, q_dim()}, mm(H, q_dim()));
    add(TensorKind::FfnNorm, l, {H}, 0.0);
    if (is_moe()) {
      const int64_t E = num_experts, F = moe_intermediate_size;
      const double k = static_cast<double>(num_experts_per_tok);
      add(TensorKind::MoeRouter, l, {E, H}, mm(E, H));
      add(TensorKind::MoeGate, l, {E, F, H}, k * mm(F, H));
      add(TensorKind::MoeUp, l, {E, F, H}, k * mm(F, H));
      add(TensorKind::MoeDown, l, {E, H, F}, k * mm(H, F));
    } else {
      const int64_t F = intermediate_size;
      add(TensorKind::FfnGate, l, {F, H}, mm(F, H));
      add(TensorKind::FfnUp, l, {F, H}, mm(F, H));
      add(TensorKind::FfnDown, l, {H, F}, mm(H, F));
    }
  }
  add(TensorKind::OutputNorm, -1, {H}, 0.0);
  if (!tie_word_embeddings) add(TensorKind::Output, -1, {vocab_size, H}, mm(vocab_size, H));
  return out;
}

uint64_t ModelSpec::total_bytes() const {
  uint64_t b = 0;
  for (const auto& t : tensors()) b += t.bytes;
  return b;
}

uint64_t ModelSpec::n_params() const {
  uint64_t n = 0;
  for (const auto& t : tensors()) n += static_cast<uint64_t>(shape_elems(t.shape));
  return n;
}

uint64_t ModelSpec::kv_bytes_per_token(DType kv_dtype) const {
  return static_cast<uint64_t>(num_hidden_layers) * 2 * dtype_row_bytes(kv_dtype, kv_dim());
}

// ---------------------------------------------------------------------------------------------
// YAML

namespace {

template <typename T>
T yaml_get(const YAML::Node& root, const char* key, const std::string& ctx, bool required, T fallback) {
  YAML::Node n = root[key];
  if (!n || n.IsNull()) {
    if (required) fail(ctx, ": missing required field '", key, "'");
    return fallback;
  }
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    fail(ctx, ": field '", key, "' has an invalid value '", e.c_str(), "'");
  }
}

const char* kKnownYamlKeys[] = {
    "name",
    "family",
    "dtype",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
    "mrope_section",
    "description",
};

// mrope_section: HF's rope_scaling.mrope_section (Qwen2-VL family), a list of 3 whole numbers; validate()
// checks that they add up to head_dim / 2.
std::vector<int64_t> yaml_mrope_section(const YAML::Node& root, const std::string& ctx) {
  const YAML::Node n = root["mrope_section"];
  if (!n || n.IsNull()) return {};
  if (!n.IsSequence() || n.size() != 3) fail(ctx, ": field 'mrope_section' must be a list of 3 integers");
  std::vector<int64_t> out;
  for (const auto& v : n) {
    try {
      out.push_back(v.as<int64_t>());
    } catch (const YAML::Exception&) {
      YAML::Emitter e;
      e << YAML::Flow << v;
      fail(ctx, ": field 'mrope_section' holds '", e.c_str(), "', not an integer");
    }
  }
  return out;
}

}  // namespace

ModelSpec parse_spec_yaml_text(const std::string& text, const std::string& ctx) {
  const YAML::Node root = load_yaml(text, ctx);  // duplicate and non-scalar keys refused there
  if (!root.IsMap()) fail(ctx, ": expected a mapping of model fields at the top level");
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.Scalar();
    bool known = false;
    for (const char* k : kKnownYamlKeys) known = known || key == k;
    if (!known) fail(ctx, ": unknown field '", key, "' (fields mirror HF config.json; see configs/models/)");
  }
  ModelSpec s;
  s.name = yaml_get<std::string>(root, "name", ctx, false, "model");
  s.family = parse_family(yaml_get<std::string>(root, "family", ctx, true, ""), ctx + ": field 'family'");
  std::string dt = yaml_get<std::string>(root, "dtype", ctx, false, "f16");
  try {
    s.dtype = parse_dtype(dt);
  } catch (const Error& e) {
    fail(ctx, ": field 'dtype': ", e.what());
  }
  s.hidden_size = yaml_get<int64_t>(root, "hidden_size", ctx, true, 0);
  s.num_hidden_layers = yaml_get<int64_t>(root, "num_hidden_layers", ctx, true, 0);
  s.num_attention_heads = yaml_get<int64_t>(root, "num_attention_heads", ctx, true, 0);
  s.num_key_value_heads = yaml_get<int64_t>(root, "num_key_value_heads", ctx, false, s.num_attention_heads);
  s.head_dim = yaml_get<int64_t>(root, "head_dim", ctx, false,
                                 s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0);
  s.vocab_size = yaml_get<int64_t>(root, "vocab_size", ctx, true, 0);
  s.intermediate_size = yaml_get<int64_t>(root, "intermediate_size", ctx, s.family != Family::Qwen3Moe, 0);
  if (s.is_moe()) {
    s.num_experts = yaml_get<int64_t>(root, "num_experts", ctx, false, 0);
    if (s.num_experts == 0) s.num_experts = yaml_get<int64_t>(root, "num_local_experts", ctx, true, 0);
    s.num_experts_per_tok = yaml_get<int64_t>(root, "num_experts_per_tok", ctx, true, 0);
    s.moe_intermediate_size = yaml_get<int64_t>(root, "moe_intermediate_size", ctx, true, 0);
    s.norm_topk_prob = yaml_get<bool>(root, "norm_topk_prob", ctx, false, true);
  }
  s.rope_theta = yaml_get<double>(root, "rope_theta", ctx, false, 10000.0);
  s.rms_norm_eps = yaml_get<double>(root, "rms_norm_eps", ctx, false, 1e-5);
  s.tie_word_embeddings = yaml_get<bool>(root, "tie_word_embeddings", ctx, false, false);
  s.max_position_embeddings = yaml_get<int64_t>(root, "max_position_embeddings", ctx, false, 0);
  s.mrope_section = yaml_mrope_section(root, ctx);
  s.validate(ctx);
  return s;
}

ModelSpec load_spec_yaml(const std::string& path) {
  return parse_spec_yaml_text(read_text_file(path), path);
}

std::string spec_to_yaml(const ModelSpec& s) {
  std::ostringstream os;
  os << "name: " << s.name << "\n"
     << "family: " << family_name(s.family) << "\n"
     << "dtype: " << dtype_name(s.dtype) << "\n"
     << "hidden_size: " << s.hidden_size << "\n"
     << "num_hidden_layers: " << s.num_hidden_layers << "\n"
     << "num_attention_heads: " << s.num_attention_heads << "\n"
     << "num_key_value_heads: " << s.num_key_value_heads << "\n"
     << "head_dim: " << s.head_dim << "\n";
  if (s.is_moe())
    os << "num_experts: " << s.num_experts << "\n"
       << "num_experts_per_tok: " << s.num_experts_per_tok << "\n"
       << "moe_intermediate_size: " << s.moe_intermediate_size << "\n"
       << "norm_topk_prob: " << (s.norm_topk_prob ? "true" : "false") << "\n";
  else
    os << "intermediate_size: " << s.intermediate_size << "\n";
  os << "vocab_size: " << s.vocab_size << "\n"
     << "rope_theta: " << s.rope_theta << "\n"
     << "rms_norm_eps: " << s.rms_norm_eps << "\n"
     << "tie_word_embeddings: " << (s.tie_word_embeddings ? "true" : "false") << "\n";
  if (s.max_position_embeddings > 0) os << "max_position_embeddings: " << s.max_position_embeddings << "\n";
  if (!s.mrope_section.empty()) {
    os << "mrope_section: [";
    for (size_t i = 0; i < s.mrope_section.size(); ++i) os << (i ? ", " : "") << s.mrope_section[i];
    os << "]\n";
  }
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// HF config.json

namespace {

// Typed fields of a parsed config.json; every message names the file (ctx) and the field.
struct HfConfig {
  const nlohmann::json& j;
  const std::string& ctx;

  int64_t get_int(const char* key, bool required, int64_t fallback) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) fail(ctx, ": missing required field '", key, "'");
      return fallback;
    }
    if (!it->is_number_integer()) fail(ctx, ": field '", key, "' must be an integer, got ", json_brief(*it));
    return it->get<int64_t>();
  }
  double get_num(const nlohmann::json& obj, const char* key, double fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(ctx, ": field '", key, "' must be a number, got ", json_brief(*it));
    return it->get<double>();
  }
  std::string get_str(const nlohmann::json& obj, const char* key, const std::string& fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_string()) fail(ctx, ": field '", key, "' must be a string, got ", json_brief(*it));
    return it->get<std::string>();
  }
  bool get_bool(const char* key, bool fallback) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(ctx, ": field '", key, "' must be true or false, got ", json_brief(*it));
    return it->get<bool>();
  }
};

// The experts of an MoE config; every layer must be an MoE layer.
void read_hf_moe(const HfConfig& c, ModelSpec& s) {
  s.num_experts = c.get_int("num_experts", false, 0);
  if (s.num_experts == 0) s.num_experts = c.get_int("num_local_experts", true, 0);
  s.num_experts_per_tok = c.get_int("num_experts_per_tok", true, 0);
  s.moe_intermediate_size = c.get_int("moe_intermediate_size", true, 0);
  s.norm_topk_prob = c.get_bool("norm_topk_prob", false);  // HF's Qwen3MoeConfig default is false
  if (c.get_int("decoder_sparse_step", false, 1) != 1)
    fail(c.ctx, ": decoder_sparse_step != 1 (dense layers between MoE layers) is not supported");
  auto mlp_only = c.j.find("mlp_only_layers");
  if (mlp_only != c.j.end() && mlp_only->is_array() && !mlp_only->empty())
    fail(c.ctx, ": mlp_only_layers (dense layers in an MoE model) is not supported");
}

// rope_theta; only default RoPE. transformers 4.x: rope_theta + rope_scaling; 5.x: rope_parameters
// {rope_theta, rope_type}.
void read_hf_rope(const HfConfig& c, ModelSpec& s) {
  s.rope_theta = c.get_num(c.j, "rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = c.j.find(key);
    if (it == c.j.end() || it->is_null()) continue;
    if (!it->is_object()) fail(c.ctx, ": field '", key, "' must be an object");
    s.rope_theta = c.get_num(*it, "rope_theta", s.rope_theta);
    std::string type = c.get_str(*it, "rope_type", c.get_str(*it, "type", "default"));
    auto sec = it->find("mrope_section");
    if (sec != it->end() && !sec->is_null()) {  // Qwen2-VL family: multimodal RoPE sections
      if (!sec->is_array() || sec->size() != 3)
        fail(c.ctx, ": ", key, ".mrope_section must be a list of 3 integers, got ", json_brief(*sec));
      s.mrope_section.clear();
      for (const auto& v : *sec) {
        if (!v.is_number_integer()) fail(c.ctx, ": ", key, ".mrope_section holds ", json_brief(v), ", not an integer");
        s.mrope_section.push_back(v.get<int64_t>());
      }
      if (type == "mrope") type = "default";
    }
    if (type != "default") fail(c.ctx, ": ", key, ".rope_type '", type, "' is not supported (only default RoPE)");
  }
}

}  // namespace

ModelSpec spec_from_hf_config_json(const std::string& text, const std::string& ctx) {
  using nlohmann::json;
  json j;
  check_json_depth(text, ctx);
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ctx, ": malformed JSON at byte ", e.byte, ": ", e.what());
  }
  if (!j.is_object()) fail(ctx, ": expected a JSON object");
  std::string model_type = HfConfig{j, ctx}.get_str(j, "model_type", "");
  if (model_type.empty()) fail(ctx, ": missing field 'model_type'");
  // Qwen2.5-VL: its language model is qwen2 with M-RoPE, its fields nested in text_config by transformers
  // 5 and at the top level in the released checkpoints; the vision tower is vision/'s.
  const bool vl = model_type == "qwen2_5_vl";
  auto text_config = j.find("text_config");
  const json& tc = vl && text_config != j.end() && text_config->is_object() ? *text_config : j;
  const HfConfig c{tc, ctx};
  ModelSpec s;
  s.family = parse_family(vl ? "qwen2" : model_type, ctx + ": field 'model_type'");
  s.vision_tower = vl;
  s.name = model_type;
  s.hidden_size = c.get_int("hidden_size", true, 0);
  s.num_hidden_layers = c.get_int("num_hidden_layers", true, 0);
  s.num_attention_heads = c.get_int("num_attention_heads", true, 0);
  s.num_key_value_heads = c.get_int("num_key_value_heads", false, s.num_attention_heads);
  s.head_dim = c.get_int("head_dim", false, s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0);
  s.vocab_size = c.get_int("vocab_size", true, 0);
  s.intermediate_size = c.get_int("intermediate_size", s.family != Family::Qwen3Moe, 0);
  s.max_position_embeddings = c.get_int("max_position_embeddings", false, 0);
  if (s.is_moe()) read_hf_moe(c, s);
  s.rms_norm_eps = c.get_num(tc, "rms_norm_eps", 1e-6);
  read_hf_rope(c, s);
  s.tie_word_embeddings = c.get_bool("tie_word_embeddings", HfConfig{j, ctx}.get_bool("tie_word_embeddings", false));
  // qwen2 always has q/k/v biases (its projections are built with them; no config key says so).
  if (c.get_bool("attention_bias", false)) fail(ctx, ": attention_bias = true is not supported for ", model_type);
  if (c.get_bool("use_sliding_window", false))
    fail(ctx, ": use_sliding_window = true is not supported (only full attention)");
  if (c.get_bool("mlp_bias", false)) fail(ctx, ": mlp_bias = true is not supported for ", model_type);
  std::string act = c.get_str(tc, "hidden_act", "silu");
  if (act != "silu") fail(ctx, ": hidden_act '", act, "' is not supported (only silu)");
  std::string torch_dtype = c.get_str(
      tc, "torch_dtype", c.get_str(tc, "dtype", c.get_str(j, "torch_dtype", c.get_str(j, "dtype", "float32"))));
  auto layer_types = tc.find("layer_types");
  if (layer_types != tc.end() && layer_types->is_array())
    for (const auto& t : *layer_types)
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        fail(ctx, ": layer_types contains ", json_brief(t), " (only full attention is supported, no sliding window)");
  s.dtype = torch_dtype == "bfloat16" ? DType::BF16 : torch_dtype == "float16" ? DType::F16 : DType::F32;
  s.validate(ctx);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Builtins and resolution

std::vector<std::string> builtin_spec_names() {
  std::vector<std::string> names;
  for (int i = 0; i < kBuiltinSpecsCount; ++i) names.emplace_back(kBuiltinSpecs[i].name);
  return names;
}

ModelSpec builtin_spec(const std::string& name) {
  for (int i = 0; i < kBuiltinSpecsCount; ++i)
    if (name == kBuiltinSpecs[i].name)
      return parse_spec_yaml_text(kBuiltinSpecs[i].yaml, "configs/models/" + name + ".yaml");
  std::string known;
  for (const auto& n : builtin_spec_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model spec '", name, "' (builtin: ", known, "; or give a .yaml / config.json path)");
}

ModelSpec resolve_spec(const std::string& name_or_path) {
  if (ends_with(name_or_path, ".yaml") || ends_with(name_or_path, ".yml")) return load_spec_yaml(name_or_path);
  if (ends_with(name_or_path, ".json")) return spec_from_hf_config_json(read_text_file(name_or_path), name_or_path);
  return builtin_spec(name_or_path);
}

}  // namespace shardwise

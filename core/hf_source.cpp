// core/hf_source.cpp — weights from an HF directory: config.json + safetensors (single or sharded).
// HF names are mapped to canonical (llama.cpp) names; per-expert tensors (or transformers 5's fused
// gate_up_proj) are merged into {E, out, in} tensors, which costs one copy of the expert weights.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/host_buffer.h"
#include "core/json_util.h"
#include "core/safetensors.h"
#include "core/weight_source.h"

namespace shardwise {
namespace {

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The directory, once it is known to hold a config.json (checked before the safetensors are opened,
// so a directory with neither names the config first).
const std::string& checked_hf_dir(const std::string& dir) {
  if (!file_exists(dir + "/config.json"))
    fail(dir, ": no config.json (an HF model directory needs config.json and model.safetensors)");
  return dir;
}

class HfWeights : public WeightSource {
 public:
  explicit HfWeights(const std::string& dir) : st_(checked_hf_dir(dir)) {
    origin_ = dir;
    const std::string cfg = dir + "/config.json";
    try {
      spec_ = spec_from_hf_config_json(read_text_file(cfg), cfg);
    } catch (const nlohmann::json::exception& e) {
      // A field of an unexpected JSON type (e.g. "model_type": 5) surfaces as a json exception.
      fail(cfg, ": ", e.what());
    }
    rope_style_ = RopeStyle::Neox;  // HF rotates halves
    read_tokenizer_metadata(dir);
    map_tensors(dir);
  }

 private:
  // Tokenizer side files: tokenizer.json is parsed by the executor's tokenizer; here we take the
  // flags and ids transformers keeps beside it (tokenizer_config.json, generation_config.json,
  // config.json, chat_template.jinja). A malformed side file is an error naming it.
  void read_tokenizer_metadata(const std::string& dir) {
    if (file_exists(dir + "/tokenizer.json"))
      tokenizer_.hf_tokenizer_json = dir + "/tokenizer.json";
    else if (file_exists(dir + "/tokenizer.model"))
      tokenizer_.hf_tokenizer_model = dir + "/tokenizer.model";
    auto token_text = [](const nlohmann::json& v) -> std::string {
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
      return std::string();
    };
    auto parse = [&](const std::string& path) -> nlohmann::json {
      const std::string text = read_text_file(path);
      check_json_depth(text, path);
      try {
        return nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        fail(path, ": not valid JSON: ", e.what());
      }
    };
    const std::string tc = dir + "/tokenizer_config.json";
    if (file_exists(tc)) {
      const nlohmann::json j = parse(tc);
      if (j.is_object()) {
        if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) {
          tokenizer_.add_bos = j["add_bos_token"].get<bool>();
          tokenizer_.add_bos_explicit = true;
        }
        if (j.contains("add_eos_token") && j["add_eos_token"].is_boolean())
          tokenizer_.add_eos = j["add_eos_token"].get<bool>();
        if (j.contains("bos_token")) tokenizer_.bos_token = token_text(j["bos_token"]);
        if (j.contains("eos_token")) tokenizer_.eos_token = token_text(j["eos_token"]);
        if (j.contains("chat_template")) {
          const auto& t = j["chat_template"];
          if (t.is_string()) {
            tokenizer_.chat_template = t.get<std::string>();
          } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
            for (const auto& e : t)
              if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
                  e["template"].is_string())
                tokenizer_.chat_template = e["template"].get<std::string>();
          }
        }
      }
    }
    // transformers >= 4.43 saves the template in its own file.
    if (tokenizer_.chat_template.empty() && file_exists(dir + "/chat_template.jinja"))
      tokenizer_.chat_template = read_text_file(dir + "/chat_template.jinja");
    auto ids = [](const nlohmann::json& v, std::vector<int64_t>* out) {
      if (v.is_number_integer()) out->push_back(v.get<int64_t>());
      if (v.is_array())
        for (const auto& e : v)
          if (e.is_number_integer()) out->push_back(e.get<int64_t>());
    };
    const nlohmann::json cfg = parse(dir + "/config.json");
    if (cfg.is_object()) {
      std::vector<int64_t> b, e;
      if (cfg.contains("bos_token_id")) ids(cfg["bos_token_id"], &b);
      if (cfg.contains("eos_token_id")) ids(cfg["eos_token_id"], &e);
      if (!b.empty()) tokenizer_.bos_id = b.front();
      if (!e.empty()) tokenizer_.eos_id = e.front();
      for (int64_t x : e) tokenizer_.eog_ids.push_back(x);
    }
    const std::string gc = dir + "/generation_config.json";
    if (file_exists(gc)) {
      const nlohmann::json j = parse(gc);
      if (j.is_object() && j.contains("eos_token_id")) ids(j["eos_token_id"], &tokenizer_.eog_ids);
    }
    auto in_vocab = [&](int64_t x) { return x >= 0 && x < spec_.vocab_size; };
    if (!in_vocab(tokenizer_.bos_id)) tokenizer_.bos_id = -1;
    if (!in_vocab(tokenizer_.eos_id)) tokenizer_.eos_id = -1;
    std::vector<int64_t> eog;
    for (int64_t x : tokenizer_.eog_ids)
      if (in_vocab(x) && std::find(eog.begin(), eog.end(), x) == eog.end()) eog.push_back(x);
    tokenizer_.eog_ids = eog;
  }

  // Keeps a view, copying it to aligned memory when the file's layout leaves it misaligned.
  TensorView aligned(const TensorView& v) {
    const size_t align = v.dtype == DType::F32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(v.data) % align == 0) return v;
    owned_.emplace_back(v.nbytes);
    std::memcpy(owned_.back().data(), v.data, v.nbytes);
    TensorView c = v;
    c.data = owned_.back().data();
    return c;
  }

  void map_tensors(const std::string& dir) {
    const std::string ctx = dir;
    std::set<std::string> used;
    auto take = [&](const std::string& hf_name, const std::string& canon) {
      const SafetensorsTensor* t = st_.find(hf_name);
      if (!t) return false;
      tensors_[canon] = aligned(st_.view(*t));
      used.insert(hf_name);
      return true;
    };
    // A vision-language checkpoint saved by transformers 5 keeps its language model under
    // model.language_model.; text models and the released VL checkpoints under model.
    const std::string lm = st_.find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
    if (!take(lm + "embed_tokens.weight", "token_embd.weight"))
      fail(ctx, ": missing tensor '", lm, "embed_tokens.weight'");
    take(lm + "norm.weight", "output_norm.weight");
    bool has_head = st_.find("lm_head.weight") != nullptr;
    if (spec_.tie_word_embeddings) {
      if (has_head) used.insert("lm_head.weight");  // some exports store the tied copy too
    } else if (!has_head) {
      fail(ctx, ": missing tensor 'lm_head.weight' and config.json does not set tie_word_embeddings");
    } else {
      take("lm_head.weight", "output.weight");
    }
    static const std::pair<const char*, const char*> kLayerMap[] = {
        {"input_layernorm.weight", "attn_norm"},    {"self_attn.q_proj.weight", "attn_q"},
        {"self_attn.k_proj.weight", "attn_k"},      {"self_attn.v_proj.weight", "attn_v"},
        {"self_attn.o_proj.weight", "attn_output"}, {"self_attn.q_norm.weight", "attn_q_norm"},
        {"self_attn.k_norm.weight", "attn_k_norm"}, {"post_attention_layernorm.weight", "ffn_norm"},
        {"mlp.gate_proj.weight", "ffn_gate"},       {"mlp.up_proj.weight", "ffn_up"},
        {"mlp.down_proj.weight", "ffn_down"},       {"mlp.gate.weight", "ffn_gate_inp"},
    };
    for (int64_t l = 0; l < spec_.num_hidden_layers; ++l) {
      const std::string p = lm + "layers." + std::to_string(l) + ".";
      const std::string c = "blk." + std::to_string(l) + ".";
      for (const auto& m : kLayerMap) take(p + m.first, c + m.second + ".weight");
      if (spec_.has_qkv_bias())
        for (const char* b : {"q", "k", "v"}) take(p + "self_attn." + b + "_proj.bias", c + "attn_" + b + ".bias");
      if (spec_.is_moe()) merge_experts(ctx, p, c, used);
    }
    for (const auto& kv : st_.tensors()) {
      if (used.count(kv.first)) continue;
      if (kv.first.find("rotary_emb.inv_freq") != std::string::npos) continue;  // old exports carry it
      if (spec_.vision_tower && (kv.first.rfind("visual.", 0) == 0 || kv.first.rfind("model.visual.", 0) == 0))
        continue;  // the vision encoder's (vision/encoder.h reads them)
      fail(ctx, ": unexpected tensor '", kv.first, "' for a ", family_name(spec_.family), " model");
    }
    check_complete(ctx);
  }

  void merge_experts(const std::string& ctx, const std::string& p, const std::string& c, std::set<std::string>& used) {
    const int64_t E = spec_.num_experts, F = spec_.moe_intermediate_size, H = spec_.hidden_size;
    // transformers 5 runtime layout: experts.gate_up_proj {E, 2F, H} (gate first), experts.down_proj {E, H, F}.
    const SafetensorsTensor* fused = st_.find(p + "mlp.experts.gate_up_proj");
    const SafetensorsTensor* fused_down = st_.find(p + "mlp.experts.down_proj");
    if (fused || fused_down) {
      if (!fused || !fused_down) fail(ctx, ": ", p, "mlp.experts needs both gate_up_proj and down_proj");
      TensorView gu = st_.view(*fused), dn = st_.view(*fused_down);
      if (gu.shape != Shape{E, 2 * F, H})
        fail(ctx, ": tensor '", fused->name, "' has shape ", shape_str(gu.shape), ", expected ",
             shape_str({E, 2 * F, H}));
      if (dn.shape != Shape{E, H, F})
        fail(ctx, ": tensor '", fused_down->name, "' has shape ", shape_str(dn.shape), ", expected ",
             shape_str({E, H, F}));
      const uint64_t half = tensor_bytes(gu.dtype, {F, H});
      TensorView g = alloc(gu.dtype, {E, F, H}), u = alloc(gu.dtype, {E, F, H});
      for (int64_t e = 0; e < E; ++e) {
        const uint8_t* src = static_cast<const uint8_t*>(gu.data) + static_cast<uint64_t>(e) * 2 * half;
        std::memcpy(const_cast<uint8_t*>(static_cast<const uint8_t*>(g.data)) + e * half, src, half);
        std::memcpy(const_cast<uint8_t*>(static_cast<const uint8_t*>(u.data)) + e * half, src + half, half);
      }
      tensors_[c + "ffn_gate_exps.weight"] = g;
      tensors_[c + "ffn_up_exps.weight"] = u;
      tensors_[c + "ffn_down_exps.weight"] = aligned(dn);
      used.insert(fused->name);
      used.insert(fused_down->name);
      return;
    }
    static const std::pair<const char*, const char*> kProj[] = {
        {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}, {"down_proj", "ffn_down_exps"}};
    for (const auto& proj : kProj) {
      const SafetensorsTensor* first = st_.find(p + "mlp.experts.0." + proj.first + ".weight");
      if (!first) fail(ctx, ": missing tensor '", p, "mlp.experts.0.", proj.first, ".weight'");
      TensorView v0 = st_.view(*first);
      // Checked before allocating the merged tensor, whose size would otherwise come from the file.
      const Shape expected = std::string(proj.first) == "down_proj" ? Shape{H, F} : Shape{F, H};
      if (v0.shape != expected)
        fail(ctx, ": tensor '", first->name, "' has shape ", shape_str(v0.shape), " but config.json needs ",
             shape_str(expected));
      Shape merged = v0.shape;
      merged.insert(merged.begin(), E);
      TensorView out = alloc(v0.dtype, merged);
      for (int64_t e = 0; e < E; ++e) {
        const std::string name = p + "mlp.experts." + std::to_string(e) + "." + proj.first + ".weight";
        const SafetensorsTensor* t = st_.find(name);
        if (!t) fail(ctx, ": missing tensor '", name, "'");
        TensorView v = st_.view(*t);
        if (v.dtype != v0.dtype || v.shape != v0.shape)
          fail(ctx, ": tensor '", name, "' differs in dtype or shape from expert 0");
        std::memcpy(const_cast<uint8_t*>(static_cast<const uint8_t*>(out.data)) + static_cast<uint64_t>(e) * v.nbytes,
                    v.data, v.nbytes);
        used.insert(name);
      }
      tensors_[c + proj.second + ".weight"] = out;
    }
  }

  TensorView alloc(DType dt, const Shape& shape) {
    TensorView v;
    v.dtype = dt;
    v.shape = shape;
    v.nbytes = tensor_bytes(dt, shape);
    owned_.emplace_back(v.nbytes);
    v.data = owned_.back().data();
    return v;
  }

  SafetensorsSet st_;
  std::vector<HostBuffer> owned_;
};

}  // namespace

std::unique_ptr<WeightSource> open_hf_weights(const std::string& dir) {
  return std::make_unique<HfWeights>(dir);
}

}  // namespace shardwise

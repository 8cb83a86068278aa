// tests/vl_test_util.cpp — see vl_test_util.h.
#include "vl_test_util.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/gguf.h"
#include "core/weight_source.h"
#include "test_util.h"
#include "text/unicode.h"

namespace shardwise::test {

namespace {

// The tiny models' special tokens, at their ids.
const std::vector<std::pair<int, std::string>> kVlSpecials = {{kVlImStart, "<|im_start|>"},
                                                              {kVlImEnd, "<|im_end|>"},
                                                              {kVlVisionStart, "<|vision_start|>"},
                                                              {kVlVisionEnd, "<|vision_end|>"},
                                                              {kVlImage, "<|image_pad|>"}};

}  // namespace

void write_vl_tokenizer(const std::string& dir) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  json added = json::array();
  for (const auto& [id, text] : kVlSpecials) added.push_back({{"id", id}, {"content", text}, {"special", true}});
  write_file(dir + "/tokenizer.json", json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
                                           {"added_tokens", added},
                                           {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                                           {"decoder", {{"type", "ByteLevel"}}}}
                                          .dump());
}

std::string vl_fixture_with_tokenizer(const std::string& name) {
  namespace fs = std::filesystem;
  const std::string dir = temp_path(name);
  fs::create_directories(dir);
  const std::string from = fixtures_dir() + "/vl/qwen2_5_vl";
  for (const char* f : {"config.json", "model.safetensors", "preprocessor_config.json"})
    fs::copy_file(from + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  write_vl_tokenizer(dir);
  return dir;
}

namespace {

struct HfTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

void write_f32_safetensors(const std::string& path, const std::vector<HfTensor>& tensors) {
  using nlohmann::json;
  json h = json::object();
  std::string data;
  for (const HfTensor& t : tensors) {
    h[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + 4 * t.values.size()}}};
    data.append(reinterpret_cast<const char*>(t.values.data()), 4 * t.values.size());
  }
  const std::string header = h.dump();
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(&out[0], &n, 8);
  write_file(path, out + header + data);
}

std::vector<float> values_of(const TensorView& t) {
  if (t.dtype != DType::F32) throw std::runtime_error("write_vl_hf_dir: the language model must be f32");
  std::vector<float> v(static_cast<size_t>(shape_elems(t.shape)));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

std::vector<HfTensor> vl_tensors(const WeightSource& lm, const VisionSpec& vs, const VisionWeights& vw) {
  const ModelSpec& s = lm.spec();
  std::vector<HfTensor> t = {
      {"model.language_model.embed_tokens.weight",
       {s.vocab_size, s.hidden_size},
       values_of(lm.tensor("token_embd.weight"))},
      {"model.language_model.norm.weight", {s.hidden_size}, values_of(lm.tensor("output_norm.weight"))},
      {"lm_head.weight", {s.vocab_size, s.hidden_size}, values_of(lm.tensor("output.weight"))}};
  for (int l = 0; l < s.num_hidden_layers; ++l)
    for (const auto& m : qwen2_hf_layer_names()) {
      const TensorView& v = lm.tensor("blk." + std::to_string(l) + "." + m.second);
      t.push_back({"model.language_model.layers." + std::to_string(l) + "." + m.first, v.shape, values_of(v)});
    }
  const int64_t h = vs.hidden_size, f = vs.intermediate_size, mw = vs.merger_width();
  const std::string p = "model.visual.";
  t.push_back({p + "patch_embed.proj.weight",
               {h, vs.in_chans, vs.temporal_patch_size, vs.patch_size, vs.patch_size},
               vw.patch_embed.values()});
  for (int64_t i = 0; i < vs.depth; ++i) {
    const VisionBlockWeights& b = vw.blocks[static_cast<size_t>(i)];
    const std::string q = p + "blocks." + std::to_string(i) + ".";
    t.insert(t.end(), {{q + "norm1.weight", {h}, b.norm1},
                       {q + "norm2.weight", {h}, b.norm2},
                       {q + "attn.qkv.weight", {3 * h, h}, b.qkv_w.values()},
                       {q + "attn.qkv.bias", {3 * h}, b.qkv_b},
                       {q + "attn.proj.weight", {h, h}, b.proj_w.values()},
                       {q + "attn.proj.bias", {h}, b.proj_b},
                       {q + "mlp.gate_proj.weight", {f, h}, b.gate_w.values()},
                       {q + "mlp.gate_proj.bias", {f}, b.gate_b},
                       {q + "mlp.up_proj.weight", {f, h}, b.up_w.values()},
                       {q + "mlp.up_proj.bias", {f}, b.up_b},
                       {q + "mlp.down_proj.weight", {h, f}, b.down_w.values()},
                       {q + "mlp.down_proj.bias", {h}, b.down_b}});
  }
  t.insert(t.end(), {{p + "merger.ln_q.weight", {h}, vw.merger_norm},
                     {p + "merger.mlp.0.weight", {mw, mw}, vw.merger_fc1_w.values()},
                     {p + "merger.mlp.0.bias", {mw}, vw.merger_fc1_b},
                     {p + "merger.mlp.2.weight", {vs.out_hidden_size, mw}, vw.merger_fc2_w.values()},
                     {p + "merger.mlp.2.bias", {vs.out_hidden_size}, vw.merger_fc2_b}});
  return t;
}

std::string vl_config(const ModelSpec& s, const std::vector<int64_t>& mrope, const VisionSpec& vs, VlTokenIds ids) {
  using nlohmann::json;
  const json vc = {{"depth", vs.depth},
                   {"hidden_size", vs.hidden_size},
                   {"intermediate_size", vs.intermediate_size},
                   {"num_heads", vs.num_heads},
                   {"out_hidden_size", vs.out_hidden_size},
                   {"patch_size", vs.patch_size},
                   {"temporal_patch_size", vs.temporal_patch_size},
                   {"spatial_merge_size", vs.spatial_merge_size},
                   {"window_size", vs.window_size},
                   {"fullatt_block_indexes", vs.fullatt_block_indexes},
                   {"hidden_act", vs.hidden_act}};
  const json text = {
      {"hidden_size", s.hidden_size},
      {"num_hidden_layers", s.num_hidden_layers},
      {"num_attention_heads", s.num_attention_heads},
      {"num_key_value_heads", s.num_key_value_heads},
      {"head_dim", s.head_dim},
      {"intermediate_size", s.intermediate_size},
      {"vocab_size", s.vocab_size},
      {"rms_norm_eps", s.rms_norm_eps},
      {"tie_word_embeddings", false},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", s.rope_theta}, {"mrope_section", mrope}}}};
  return json{{"model_type", "qwen2_5_vl"},
              {"text_config", text},
              {"vision_config", vc},
              {"image_token_id", ids.image},
              {"vision_start_token_id", ids.vision_start},
              {"vision_end_token_id", ids.vision_end}}
      .dump();
}

}  // namespace

void write_vl_hf_dir(const std::string& dir, const WeightSource& lm, const std::vector<int64_t>& mrope,
                     const VisionSpec& vs, const VisionWeights& vw, VlTokenIds ids) {
  write_f32_safetensors(dir + "/model.safetensors", vl_tensors(lm, vs, vw));
  write_file(dir + "/config.json", vl_config(lm.spec(), mrope, vs, ids));
}

void drop_gguf_tensor(const std::string& path, const std::string& name) {
  const GgufFile f(path);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const GgufTensorInfo& t : f.tensors())
    if (t.name != name) w.add_tensor(t.name, f.view(t));
  w.write(path);  // through a temporary file renamed over `path`: the mapping read here stays valid
}

namespace {

// A source's weights and spec with another vocabulary (what write_gguf writes as tokenizer.ggml.*).
class WithVocabulary : public WeightSource {
 public:
  WithVocabulary(const WeightSource& from, TokenizerInfo vocabulary) {
    spec_ = from.spec();
    rope_style_ = from.rope_style();
    origin_ = from.origin();
    tensors_ = from.tensors();
    tokenizer_ = std::move(vocabulary);
  }
};

}  // namespace

void write_vl_language_gguf(const std::string& path) {
  const auto hf = open_weights(fixtures_dir() + "/vl/qwen2_5_vl");
  const int64_t n = hf->spec().vocab_size;
  TokenizerInfo v;
  v.model = "gpt2";
  v.pre = "qwen2";
  for (int64_t i = 0; i < n; ++i) {
    v.tokens.push_back(i < 256 ? tok::byte_level_encode(std::string(1, static_cast<char>(i)))
                               : "<|unused_" + std::to_string(i) + "|>");
    v.token_types.push_back(i < 256 ? 1 : 5);  // normal, unused
  }
  for (const auto& [id, text] : kVlSpecials) {
    v.tokens[static_cast<size_t>(id)] = text;
    v.token_types[static_cast<size_t>(id)] = 3;  // control
  }
  // Byte-level BPE needs a merge: one of two control bytes, which no test text holds.
  const std::string a = tok::byte_level_encode("\x01"), b = tok::byte_level_encode("\x02");
  v.tokens[256] = a + b;
  v.token_types[256] = 1;
  v.merges = {a + " " + b};
  v.eos_id = kVlImEnd;
  write_gguf(WithVocabulary(*hf, v), path, DType::F32);
}

}  // namespace shardwise::test

// tests/vl_test_util.cpp — see vl_test_util.h.
#include "vl_test_util.h"

#include <filesystem>
#include <nlohmann/json.hpp>
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

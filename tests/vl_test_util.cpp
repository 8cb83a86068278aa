// tests/vl_test_util.cpp — see vl_test_util.h.
#include "vl_test_util.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "test_util.h"
#include "text/unicode.h"

namespace shardwise::test {

void write_vl_tokenizer(const std::string& dir) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  json added = json::array();
  for (const auto& [id, text] : std::vector<std::pair<int, std::string>>{{kVlImStart, "<|im_start|>"},
                                                                         {kVlImEnd, "<|im_end|>"},
                                                                         {kVlVisionStart, "<|vision_start|>"},
                                                                         {kVlVisionEnd, "<|vision_end|>"},
                                                                         {kVlImage, "<|image_pad|>"}})
    added.push_back({{"id", id}, {"content", text}, {"special", true}});
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

}  // namespace shardwise::test

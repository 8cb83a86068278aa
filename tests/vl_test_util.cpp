// tests/vl_test_util.cpp — see vl_test_util.h.
#include "vl_test_util.h"

#include <cstring>
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

namespace {

// Holds the data the writer's views point at until the file is written.
struct MmprojWriter {
  GgufWriter w;
  std::vector<std::vector<uint8_t>> keep;
  void f32(const std::string& name, const float* v, const Shape& shape) {
    const size_t n = static_cast<size_t>(shape_elems(shape));
    keep.emplace_back(n * sizeof(float));
    std::memcpy(keep.back().data(), v, n * sizeof(float));
    w.add_tensor(name, TensorView{DType::F32, shape, keep.back().data(), n * sizeof(float)});
  }
  void f16(const std::string& name, const float* v, const Shape& shape) {
    const size_t n = static_cast<size_t>(shape_elems(shape));
    keep.emplace_back(n * 2);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_f16(v[i]);
      std::memcpy(keep.back().data() + 2 * i, &h, 2);
    }
    w.add_tensor(name, TensorView{DType::F16, shape, keep.back().data(), n * 2});
  }
};

}  // namespace

void write_mmproj(const VisionModel& m, const std::string& path, const std::string& skip) {
  const VisionSpec& s = m.spec;
  const VisionWeights& w = m.weights;
  const int64_t h = s.hidden_size, f = s.intermediate_size, mw = s.merger_width(), p = s.patch_size;
  MmprojWriter out;
  out.w.set("general.architecture", GgufValue::of_string("clip"));
  out.w.set("clip.projector_type", GgufValue::of_string("qwen2.5vl"));
  out.w.set("clip.has_vision_encoder", GgufValue::of_bool(true));
  out.w.set("clip.use_silu", GgufValue::of_bool(true));
  out.w.set("clip.vision.block_count", GgufValue::of_u32(static_cast<uint32_t>(s.depth)));
  out.w.set("clip.vision.embedding_length", GgufValue::of_u32(static_cast<uint32_t>(h)));
  out.w.set("clip.vision.feed_forward_length", GgufValue::of_u32(static_cast<uint32_t>(f)));
  out.w.set("clip.vision.attention.head_count", GgufValue::of_u32(static_cast<uint32_t>(s.num_heads)));
  out.w.set("clip.vision.projection_dim", GgufValue::of_u32(static_cast<uint32_t>(s.out_hidden_size)));
  out.w.set("clip.vision.patch_size", GgufValue::of_u32(static_cast<uint32_t>(p)));
  out.w.set("clip.vision.n_wa_pattern", GgufValue::of_u32(static_cast<uint32_t>(s.fullatt_block_indexes[0] + 1)));
  out.w.set("clip.vision.attention.layer_norm_epsilon", GgufValue::of_f32(static_cast<float>(s.rms_norm_eps)));
  out.w.set("clip.vision.image_mean", GgufValue::of_f32s({0.48145466f, 0.4578275f, 0.40821073f}));
  out.w.set("clip.vision.image_std", GgufValue::of_f32s({0.26862954f, 0.26130258f, 0.27577711f}));
  auto add = [&](const std::string& name, const std::vector<float>& v, const Shape& shape) {
    if (name != skip) out.f32(name, v.data(), shape);
  };
  // The Conv3d's frames: (hidden, C, T, P, P) -> two (hidden, C, P, P).
  std::vector<float> frame[2];
  for (int t = 0; t < 2; ++t)
    for (int64_t hc = 0; hc < h * s.in_chans; ++hc)
      frame[t].insert(frame[t].end(), w.patch_embed.begin() + (hc * 2 + t) * p * p,
                      w.patch_embed.begin() + (hc * 2 + t + 1) * p * p);
  out.f16("v.patch_embd.weight", frame[0].data(), {h, s.in_chans, p, p});
  out.f16("v.patch_embd.weight.1", frame[1].data(), {h, s.in_chans, p, p});
  for (int64_t i = 0; i < s.depth; ++i) {
    const VisionBlockWeights& b = w.blocks[static_cast<size_t>(i)];
    const std::string n = "v.blk." + std::to_string(i) + ".";
    const char* parts[] = {"attn_q", "attn_k", "attn_v"};
    for (int64_t k = 0; k < 3; ++k) {
      add(n + parts[k] + ".weight", std::vector<float>(b.qkv_w.begin() + k * h * h, b.qkv_w.begin() + (k + 1) * h * h),
          {h, h});
      add(n + parts[k] + ".bias", std::vector<float>(b.qkv_b.begin() + k * h, b.qkv_b.begin() + (k + 1) * h), {h});
    }
    add(n + "attn_out.weight", b.proj_w, {h, h});
    add(n + "attn_out.bias", b.proj_b, {h});
    add(n + "ln1.weight", b.norm1, {h});
    add(n + "ln2.weight", b.norm2, {h});
    add(n + "ffn_gate.weight", b.gate_w, {f, h});
    add(n + "ffn_gate.bias", b.gate_b, {f});
    add(n + "ffn_up.weight", b.up_w, {f, h});
    add(n + "ffn_up.bias", b.up_b, {f});
    add(n + "ffn_down.weight", b.down_w, {h, f});
    add(n + "ffn_down.bias", b.down_b, {h});
  }
  add("v.post_ln.weight", w.merger_norm, {h});
  add("mm.0.weight", w.merger_fc1_w, {mw, mw});
  add("mm.0.bias", w.merger_fc1_b, {mw});
  add("mm.2.weight", w.merger_fc2_w, {s.out_hidden_size, mw});
  add("mm.2.bias", w.merger_fc2_b, {s.out_hidden_size});
  out.w.write(path);
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

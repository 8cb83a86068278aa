// Tests for `shardwise synth --mmproj` and the product's mmproj writer (vision/mmproj.h write_mmproj):
// a Qwen2.5-VL-shaped pair, the language model GGUF (qwen2vl, a character vocabulary with Qwen2.5-VL's
// special tokens at their ids) and the projector GGUF in the layout of llama.cpp's converter, reads back
// into the tower it was drawn from and runs as the same weights do from an HF directory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/gguf.h"
#include "core/weight_source.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vl_test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

constexpr int32_t kImStart = 151644, kImEnd = 151645, kVisionStart = 151652, kVisionEnd = 151653, kImagePad = 151655;

VisionSpec tiny_tower() {
  VisionSpec s;
  REQUIRE(builtin_vision_spec("tiny_qwen2vl", &s));
  return s;
}

// `synth --spec tiny_qwen2vl` with these flags, its language model at `lm` and its projector at `mm`.
void synth_pair(const std::string& flags, const std::string& lm, const std::string& mm) {
  std::string out;
  REQUIRE(test::run_command("(" + test::shardwise_bin() + " synth --spec tiny_qwen2vl " + flags + " -o " + lm +
                                " --mmproj " + mm + " 2>&1)",
                            &out) == 0);
}

float round_to(DType t, float v) {
  return t == DType::F16 ? f16_to_f32(f32_to_f16(v)) : t == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

std::vector<float> rounded(DType t, std::vector<float> v) {
  for (float& x : v) x = round_to(t, x);
  return v;
}

// Every tensor of `got` equals `want`'s: matrices through `dtype`'s rounding, the patch embedding
// through f16's, vectors exactly.
void check_tower(const VisionWeights& got, const VisionWeights& want, DType dtype) {
  CHECK(got.patch_embed.values() == rounded(DType::F16, want.patch_embed.values()));
  REQUIRE(got.blocks.size() == want.blocks.size());
  for (size_t i = 0; i < want.blocks.size(); ++i) {
    INFO("block " << i);
    const VisionBlockWeights &g = got.blocks[i], &w = want.blocks[i];
    for (auto m : {&VisionBlockWeights::qkv_w, &VisionBlockWeights::proj_w, &VisionBlockWeights::gate_w,
                   &VisionBlockWeights::up_w, &VisionBlockWeights::down_w})
      CHECK((g.*m).values() == rounded(dtype, (w.*m).values()));
    for (auto v : {&VisionBlockWeights::norm1, &VisionBlockWeights::norm2, &VisionBlockWeights::qkv_b,
                   &VisionBlockWeights::proj_b, &VisionBlockWeights::gate_b, &VisionBlockWeights::up_b,
                   &VisionBlockWeights::down_b})
      CHECK(g.*v == w.*v);
  }
  CHECK(got.merger_norm == want.merger_norm);
  CHECK(got.merger_fc1_w.values() == rounded(dtype, want.merger_fc1_w.values()));
  CHECK(got.merger_fc1_b == want.merger_fc1_b);
  CHECK(got.merger_fc2_w.values() == rounded(dtype, want.merger_fc2_w.values()));
  CHECK(got.merger_fc2_b == want.merger_fc2_b);
}

// The ids of ChatML text in synth's character vocabulary as llama.cpp's SentencePiece tokeniser gives
// them: a "<|...|>" part is its control token, any other part one token per character after the space
// prefix ("\u2581", id 259) that follows a control token; ' ' is 259, '\n' the byte token <0x0A>, a
// printable character c the id 260 + c - 33.
std::vector<int32_t> chat_ids(const std::vector<std::string>& parts) {
  std::vector<int32_t> ids = {1};  // <s>
  for (const std::string& p : parts) {
    bool special = false;
    for (const SpecialToken& t : qwen2vl_special_tokens())
      if (p == t.text) {
        ids.push_back(static_cast<int32_t>(t.id));
        special = true;
      }
    if (special) continue;
    ids.push_back(259);
    for (char c : p) ids.push_back(c == ' ' ? 259 : c == '\n' ? 3 + 10 : 260 + (c - 33));
  }
  return ids;
}

}  // namespace

TEST_CASE("write_mmproj: the tower reads back exactly in f32, within the rounding of f16 and bf16",
          "[vision][mmproj]") {
  const VisionSpec s = tiny_tower();
  VisionModel m{s, random_vision_weights(s, 9, 0.02f)};
  const std::string path = test::temp_path("roundtrip.mmproj.gguf");
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    INFO(dtype_name(t));
    write_mmproj(m, ImageProcessorConfig{}, path, t);
    const VisionModel r = load_mmproj(path);
    CHECK(r.spec.depth == s.depth);
    CHECK(r.spec.intermediate_size == s.intermediate_size);
    CHECK(r.spec.out_hidden_size == s.out_hidden_size);
    CHECK(r.spec.fullatt_block_indexes == s.fullatt_block_indexes);
    CHECK(r.spec.hidden_act == "silu");
    check_tower(r.weights, m.weights, t);
  }
  // What the file cannot say, or a type the converter does not write: one error each.
  CHECK_THROWS_WITH(write_mmproj(m, ImageProcessorConfig{}, path, DType::Q8_0), Contains("f32, f16 or bf16"));
  VisionModel odd = m;
  odd.spec.fullatt_block_indexes = {1, 2};
  CHECK_THROWS_WITH(write_mmproj(odd, ImageProcessorConfig{}, path, DType::F16), Contains("every n-th"));
  odd = m;
  odd.spec.spatial_merge_size = 4;
  CHECK_THROWS_WITH(write_mmproj(odd, ImageProcessorConfig{}, path, DType::F16), Contains("merge"));
}

TEST_CASE("synth --mmproj: tiny_qwen2vl's pair, the projector in the converter's keys and types",
          "[vision][mmproj][cli]") {
  const std::string lm = test::temp_path("synth_vl16.gguf"), mm = test::temp_path("synth_vl16.mmproj.gguf");
  synth_pair("--dtype f16 --seed 3", lm, mm);
  // The tower drawn with synth's seed, its matrices stored as f16 (the converter's default --outtype).
  const VisionSpec s = tiny_tower();
  check_tower(load_mmproj(mm).weights, random_vision_weights(s, 3, 0.02f), DType::F16);
  const GgufFile f(mm);
  CHECK(f.find("general.architecture")->as_string("") == "clip");
  CHECK(f.find("general.type")->as_string("") == "mmproj");
  CHECK(f.find("clip.projector_type")->as_string("") == "qwen2.5vl_merger");
  CHECK(f.find("clip.vision.n_wa_pattern")->as_int("") == 2);
  CHECK(f.find("clip.vision.image_size")->as_int("") == 560);
  CHECK(f.find("clip.vision.projection_dim")->as_int("") == 64);
  CHECK(f.find("general.file_type")->as_int("") == 1);          // mostly f16
  CHECK(f.find_tensor("v.blk.0.ln1.weight")->type_id == 0);     // f32
  CHECK(f.find_tensor("v.blk.0.attn_q.bias")->type_id == 0);    // f32
  CHECK(f.find_tensor("mm.0.weight")->type_id == 1);            // f16
  CHECK(f.find_tensor("v.patch_embd.weight.1")->type_id == 1);  // f16
  // The language model: llama.cpp's qwen2vl, Qwen2.5-VL's special tokens as control tokens at their ids.
  const GgufFile g(lm);
  CHECK(g.find("general.architecture")->as_string("") == "qwen2vl");
  const auto src = open_weights(lm);
  const TokenizerInfo& tok = src->tokenizer();
  REQUIRE(tok.tokens.size() == 151936);
  for (const SpecialToken& t : qwen2vl_special_tokens()) {
    CHECK(tok.tokens[static_cast<size_t>(t.id)] == t.text);
    CHECK(tok.token_types[static_cast<size_t>(t.id)] == 3);
  }
  CHECK(tok.tokens[260] == "!");
  CHECK_THAT(tok.chat_template, Contains("You are a helpful assistant."));
}

TEST_CASE(
    "synth --mmproj: run reads the pair as it reads the same weights from an HF directory, and from a prompt on "
    "the CPU and the emulated device alike",
    "[vision][mmproj][cli]") {
  const std::string lm = test::temp_path("synth_vl32.gguf"), mm = test::temp_path("synth_vl32.mmproj.gguf");
  synth_pair("--seed 5", lm, mm);  // f32: the same values as synthetic:tiny_qwen2vl?seed=5
  const std::string dir = test::temp_path("synth_vl_hf");
  std::filesystem::create_directories(dir);
  const auto weights = open_weights("synthetic:tiny_qwen2vl?seed=5");
  test::write_vl_hf_dir(dir, *weights, {2, 3, 3}, tiny_tower(), load_mmproj(mm).weights,
                        {kImagePad, kVisionStart, kVisionEnd});
  test::write_file(dir + "/preprocessor_config.json", R"({"min_pixels": 3136, "max_pixels": 12845056})");
  const std::string image = test::fixtures_dir() + "/vl/qwen2_5_vl/images/img_300x200/image.png";
  const std::string tail = " --image " + image + " -n 6 --greedy --ignore-eos --json -t 2";
  const std::string tokens = " --tokens 1,72,105," + std::to_string(kVisionStart) + "," + std::to_string(kImagePad) +
                             "," + std::to_string(kVisionEnd) + ",33";
  std::string hf, pair;
  REQUIRE(test::run_command(
              "(" + test::shardwise_bin() + " run -m " + dir + tokens + tail + " --device cpu 2>/dev/null)", &hf) == 0);
  REQUIRE(test::run_command("(" + test::shardwise_bin() + " run -m " + lm + " --mmproj " + mm + tokens + tail +
                                " --device cpu 2>/dev/null)",
                            &pair) == 0);
  INFO(hf << "\n" << pair);
  const json jh = json::parse(hf), jp = json::parse(pair);
  CHECK(jp["n_prompt_tokens"] == 6 + 77);  // 300x200 resizes to 308x196: 22x14 patches, 77 image tokens
  CHECK(jp["n_prompt_tokens"] == jh["n_prompt_tokens"]);
  CHECK(jp["generated_ids"] == jh["generated_ids"]);

  // --prompt: ChatML with Qwen2.5-VL's default system turn, the image's placeholders before the text, each
  // character one token; on the CPU and, under a budget that holds part of the model, the emulated device.
  std::vector<std::string> parts = {
      "<|im_start|>",    "system\nYou are a helpful assistant.", "<|im_end|>", "\n", "<|im_start|>", "user\n",
      "<|vision_start|>"};
  parts.insert(parts.end(), 77, "<|image_pad|>");
  parts.insert(parts.end(), {"<|vision_end|>", "Hi there", "<|im_end|>", "\n", "<|im_start|>", "assistant\n"});
  const std::vector<int32_t> want = chat_ids(parts);
  std::vector<int32_t> first;
  for (const std::string device : {"--device cpu", "--device emu --vram-budget 32M"}) {
    INFO(device);
    std::string out;
    REQUIRE(test::run_command("(" + test::shardwise_bin() + " run -m " + lm + " --mmproj " + mm +
                                  " --prompt 'Hi there'" + tail + " " + device + " 2>/dev/null)",
                              &out) == 0);
    const json j = json::parse(out);
    if (j["device"] == "emu") CHECK(j["schedules"]["1"] != "gpu-only");  // part of the model stays on the host
    CHECK(j["prompt_ids"].get<std::vector<int32_t>>() == want);
    if (first.empty()) first = j["generated_ids"].get<std::vector<int32_t>>();
    CHECK(j["generated_ids"].get<std::vector<int32_t>>() == first);
  }
  CHECK(want.size() > 77);
  CHECK(std::count(want.begin(), want.end(), kImStart) == 3);
  CHECK(std::count(want.begin(), want.end(), kImEnd) == 2);
}

TEST_CASE("synth --mmproj: a spec without a tower, or one that cannot take it, is one error line", "[vision][cli]") {
  const std::string lm = test::temp_path("no_tower.gguf"), mm = test::temp_path("no_tower.mmproj.gguf");
  std::filesystem::remove(lm);
  const auto synth = [&](const std::string& spec, std::string* out) {
    return test::run_command(
        "(" + test::shardwise_bin() + " synth --spec " + spec + " -o " + lm + " --mmproj " + mm + " 2>&1)", out);
  };
  std::string out;
  CHECK(synth("tiny_qwen2", &out) != 0);
  CHECK_THAT(out, Contains("tiny_qwen2' has no vision tower") && Contains("tiny_qwen2vl"));
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(lm));  // refused before the language model is written
  CHECK(test::run_command(
            "(" + test::shardwise_bin() + " synth --spec tiny_qwen2vl -o " + lm + " --mmproj " + lm + " 2>&1)", &out) !=
        0);
  CHECK_THAT(out, Contains("a file of its own"));
  // A spec of the tower's name whose vocabulary is too small for the vision tokens, or of another width.
  const std::string base =
      "name: tiny_qwen2vl\nfamily: qwen2\nnum_hidden_layers: 1\nnum_attention_heads: 4\n"
      "num_key_value_heads: 2\nhead_dim: 16\nintermediate_size: 32\nmrope_section: [2, 3, 3]\n";
  const std::string small = test::temp_path("small_vocab.yaml"), narrow = test::temp_path("narrow.yaml");
  test::write_file(small, base + "hidden_size: 64\nvocab_size: 1000\n");
  test::write_file(narrow, base + "hidden_size: 32\nvocab_size: 151936\n");
  CHECK(synth(small, &out) != 0);
  CHECK_THAT(out, Contains("1000 tokens cannot hold"));
  CHECK(synth(narrow, &out) != 0);
  CHECK_THAT(out, Contains("hidden_size 32"));
}

// Tests for vision/vl_prompt and `shardwise logits --image`: a prompt's image placeholders expanded to the
// encoder's tokens at M-RoPE positions, and a whole tiny Qwen2.5-VL directory (language model, vision
// tower, processor) run by the CLI against the library and the f64 reference.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "executor/cpu/ops.h"
#include "executor/model/model_weights.h"
#include "executor/reference/reference_model.h"
#include "test_util.h"
#include "vision/vl_prompt.h"
#include "vl_test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

constexpr int32_t kVs = test::kVlVisionStart, kVe = test::kVlVisionEnd, kImg = test::kVlImage;

VisionSpec tiny_vision() {
  VisionSpec s;
  s.depth = 2;
  s.hidden_size = 32;
  s.intermediate_size = 48;
  s.num_heads = 2;
  s.out_hidden_size = 64;  // the language model's hidden size
  s.patch_size = 2;
  s.window_size = 8;
  s.fullatt_block_indexes = {1};
  return s;
}

// The ids of ChatML text written with the tokenizer above: "<|x|>" markers as their ids, bytes as bytes.
std::vector<int32_t> vl_chat_ids(const std::vector<std::string>& parts) {
  const std::map<std::string, int32_t> special = {{"<|im_start|>", test::kVlImStart},
                                                  {"<|im_end|>", test::kVlImEnd},
                                                  {"<|vision_start|>", kVs},
                                                  {"<|vision_end|>", kVe},
                                                  {"<|image_pad|>", kImg}};
  std::vector<int32_t> ids;
  for (const std::string& p : parts) {
    if (special.count(p)) {
      ids.push_back(special.at(p));
      continue;
    }
    for (unsigned char c : p) ids.push_back(c);
  }
  return ids;
}

}  // namespace

TEST_CASE("vl prompt: placeholders expand to the encoder's rows at their M-RoPE positions", "[vision]") {
  auto lm = open_weights("synthetic:tiny_qwen2?seed=2");
  const TensorView& emb = lm->tensor("token_embd.weight");
  const MropeTokens tok{kImg, kVs, 2};
  const std::vector<float> image = test::random_floats(static_cast<size_t>(7 * 64), 3);  // 1 + 6 tokens
  const VlInput in = build_vl_input({1, kVs, kImg, kVe, kVs, kImg, kVe, 9}, {GridThw{1, 2, 2}, GridThw{1, 4, 6}},
                                    image.data(), 7, emb, tok);
  REQUIRE(in.ids.size() == 13);
  CHECK(in.ids[2] == kImg);
  CHECK(in.ids[10] == kImg);
  CHECK(std::memcmp(in.embeddings.data() + 2 * 64, image.data(), 64 * sizeof(float)) == 0);
  CHECK(std::memcmp(in.embeddings.data() + 5 * 64, image.data() + 64, 6 * 64 * sizeof(float)) == 0);
  std::vector<float> row(64);
  const int32_t nine = 9;
  embed_rows(emb, &nine, 1, row.data());
  CHECK(std::memcmp(in.embeddings.data() + 12 * 64, row.data(), 64 * sizeof(float)) == 0);
  CHECK(in.positions.pos[5] == std::array<int64_t, 3>{5, 5, 5});
  CHECK(in.positions.pos[10] == std::array<int64_t, 3>{5, 6, 7});
  CHECK_THROWS_WITH(build_vl_input({kVs, kImg, kVe}, {}, image.data(), 7, emb, tok),
                    Contains("more image placeholders"));
  CHECK_THROWS_WITH(build_vl_input({kVs, kImg, kVe}, {GridThw{1, 2, 2}}, image.data(), 7, emb, tok),
                    Contains("expand to 1"));
  CHECK_THROWS_WITH(build_vl_input({1, 300}, {}, image.data(), 0, emb, tok), Contains("outside the vocabulary"));
}

TEST_CASE("shardwise logits --image: a tiny Qwen2.5-VL directory against the library and the reference",
          "[vision][cli]") {
  auto lm = open_weights("synthetic:tiny_qwen2?seed=4");
  const VisionSpec vs = tiny_vision();
  const VisionWeights vw = random_vision_weights(vs, 8, 0.1f);
  const std::string dir = test::temp_path("vl_model");
  std::filesystem::create_directories(dir);
  test::write_vl_hf_dir(dir, *lm, {2, 3, 3}, vs, vw, {kImg, kVs, kVe});
  test::write_file(
      dir + "/preprocessor_config.json",
      R"({"patch_size": 2, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 64, "max_pixels": 512})");
  const std::string img = test::fixtures_dir() + "/vision/images/png_rgb8_37x23.png";
  const std::string out = test::temp_path("vl_logits.npy"), out_ref = test::temp_path("vl_logits_ref.npy");
  const std::string base = test::shardwise_bin() + " logits -m " + dir + " --image " + img + " --tokens 5,17," +
                           std::to_string(kVs) + "," + std::to_string(kImg) + "," + std::to_string(kVe) + ",33,8";
  std::string text;
  REQUIRE(test::run_command(base + " --out " + out + " -t 2 2>/dev/null", &text) == 0);
  REQUIRE(test::run_command(base + " --out " + out_ref + " --path reference 2>/dev/null", &text) == 0);

  // The library: the same image through the processor and the encoder, the prompt expanded.
  auto src = open_weights(dir);
  ThreadPool pool(2);
  const VisionModel vm = load_vision_model(dir);
  const EncodedImages e = encode_image_files(vm, model_image_processor(dir, vm.spec), {img}, pool);
  const ModelWeights w = ModelWeights::from_source(*src);
  const VlInput in =
      build_vl_input({5, 17, kVs, kImg, kVe, 33, 8}, e.grids, e.tokens.data(),
                     static_cast<int64_t>(e.tokens.size()) / 64, w.token_embd, MropeTokens{kImg, kVs, 2});
  std::vector<int64_t> pos3;
  for (const auto& p : in.positions.pos) pos3.insert(pos3.end(), p.begin(), p.end());
  const std::vector<float> ref = reference_logits_embedded(*src, in.embeddings, pos3);
  const std::vector<float> got = test::load_npy_floats(out), got_ref = test::load_npy_floats(out_ref);
  REQUIRE(got.size() == in.ids.size() * 300);
  CHECK(in.ids.size() > 7);  // the placeholder became the image's tokens
  CHECK(got_ref == ref);
  CHECK(test::max_rel_error(got, ref, 300) <= 1e-4);
  // run --image: greedy tokens after the image prompt, each the argmax of the reference over the prompt
  // and the tokens before it (text tokens after the prompt at position row + delta).
  REQUIRE(test::run_command("(" + test::shardwise_bin() + " run -m " + dir + " --device cpu --image " + img +
                                " --tokens 5,17," + std::to_string(kVs) + "," + std::to_string(kImg) + "," +
                                std::to_string(kVe) + ",33,8 -n 3 --greedy --json -t 2 2>/dev/null)",
                            &text) == 0);
  INFO(text);
  const json run = json::parse(text);
  CHECK(run["n_prompt_tokens"].get<size_t>() == in.ids.size());
  std::vector<float> x = in.embeddings;
  std::vector<int64_t> pos = pos3;
  std::vector<int32_t> want;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> l = reference_logits_embedded(*src, x, pos);
    const auto last = l.end() - 300;
    want.push_back(static_cast<int32_t>(std::max_element(last, l.end()) - last));
    std::vector<float> row(64);
    embed_rows(w.token_embd, &want.back(), 1, row.data());
    x.insert(x.end(), row.begin(), row.end());
    const int64_t p = static_cast<int64_t>(in.ids.size()) + k + in.positions.delta;
    pos.insert(pos.end(), {p, p, p});
  }
  CHECK(run["generated_ids"].get<std::vector<int32_t>>() == want);
  CHECK(in.positions.delta < 0);  // the image's rows and columns share positions: decode continues below n
  // run --image --prompt: the Qwen2-VL chat template (its default system message, the image's placeholders
  // before the text) encoded by the directory's tokenizer generates as --tokens does with the ids that
  // template spells.
  test::write_vl_tokenizer(dir);
  const std::vector<int32_t> chat =
      vl_chat_ids({"<|im_start|>", "system\nYou are a helpful assistant.", "<|im_end|>", "\n", "<|im_start|>", "user\n",
                   "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "Say hi.", "<|im_end|>", "\n", "<|im_start|>",
                   "assistant\n"});
  std::string chat_list;
  for (int32_t id : chat) chat_list += (chat_list.empty() ? "" : ",") + std::to_string(id);
  const std::string run_image =
      test::shardwise_bin() + " run -m " + dir + " --device cpu --image " + img + " -n 4 --greedy --json -t 2";
  std::string by_prompt, by_tokens;
  const int rc_prompt = test::run_command("(" + run_image + " --prompt 'Say hi.' 2>/dev/null)", &by_prompt);
  const int rc_tokens = test::run_command("(" + run_image + " --tokens " + chat_list + " 2>/dev/null)", &by_tokens);
  INFO(by_prompt << by_tokens);
  REQUIRE(rc_prompt == 0);
  REQUIRE(rc_tokens == 0);
  const json jp = json::parse(by_prompt), jt = json::parse(by_tokens);
  CHECK(jp["n_prompt_tokens"].get<size_t>() == chat.size() - 1 + (in.ids.size() - 6));
  CHECK(jp["n_prompt_tokens"] == jt["n_prompt_tokens"]);
  CHECK(jp["generated_ids"] == jt["generated_ids"]);
  // A text model, or a prompt without the image's placeholder (on the CPU or a device), is one error line.
  for (const std::string& bad :
       {test::shardwise_bin() + " logits -m synthetic:tiny_qwen2 --image " + img + " --tokens 1,2 --out " + out,
        test::shardwise_bin() + " logits -m " + dir + " --image " + img + " --tokens 1,2 --out " + out,
        test::shardwise_bin() + " run -m " + dir + " --image " + img + " --tokens 1,2 -n 2 --device emu",
        test::shardwise_bin() + " run -m " + dir + " --image " + img + " --tokens 1,2 -n 2 --device cpu"}) {
    INFO(bad);
    CHECK(test::run_command(bad + " 2>&1", &text) != 0);
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  }
}

// Tests for llama.cpp's vision projector files (vision/mmproj.h): an mmproj written in the layout of
// llama.cpp's converter (q, k, v split, the Conv3d as two frames, f16 patch embedding, the merger as
// v.post_ln, mm.0, mm.2) from the HF fixture's tower reads back into the same spec and weights, and
// encodes images to the HF directory's tokens; bad files give one error naming the key or tensor.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/gguf.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vl_test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

std::string vl_dir() {
  return test::fixtures_dir() + "/vl/qwen2_5_vl";
}

}  // namespace

TEST_CASE("mmproj: llama.cpp's layout reads back into the HF tower, and encodes as it does", "[vision][mmproj]") {
  const VisionModel hf = load_vision_model(vl_dir());
  const std::string path = test::temp_path("tower.mmproj.gguf");
  write_mmproj(hf, ImageProcessorConfig{}, path, DType::F32);
  const VisionModel m = load_mmproj(path);
  CHECK(m.spec.depth == hf.spec.depth);
  CHECK(m.spec.hidden_size == hf.spec.hidden_size);
  CHECK(m.spec.num_heads == hf.spec.num_heads);
  CHECK(m.spec.out_hidden_size == hf.spec.out_hidden_size);
  CHECK(m.spec.fullatt_block_indexes == hf.spec.fullatt_block_indexes);
  CHECK(m.spec.hidden_act == "silu");
  // Every weight exactly, the patch embedding as its f16 rounding (what the converter stores).
  for (size_t i = 0; i < hf.weights.blocks.size(); ++i) {
    INFO("block " << i);
    CHECK(m.weights.blocks[i].qkv_w == hf.weights.blocks[i].qkv_w);
    CHECK(m.weights.blocks[i].qkv_b == hf.weights.blocks[i].qkv_b);
    CHECK(m.weights.blocks[i].down_w == hf.weights.blocks[i].down_w);
    CHECK(m.weights.blocks[i].norm2 == hf.weights.blocks[i].norm2);
  }
  CHECK(m.weights.merger_fc2_w == hf.weights.merger_fc2_w);
  std::vector<float> rounded = hf.weights.patch_embed.values();
  for (float& v : rounded) v = f16_to_f32(f32_to_f16(v));
  CHECK(m.weights.patch_embed.values() == rounded);

  // The tokens of an image equal the HF tower's with the same rounded patch embedding and llama.cpp's
  // fixed 112-pixel window (the fixture's tower has 56: the file cannot say so, and clip.cpp uses 112).
  CHECK(m.spec.window_size == 112);
  VisionWeights hf_rounded = hf.weights;
  hf_rounded.patch_embed = VisionMatrix::from_values(rounded, hf_rounded.matrix_dtype);
  VisionSpec hf112 = hf.spec;
  hf112.window_size = 112;
  const std::vector<GridThw> grids = {{1, 6, 8}};
  const std::vector<float> pix = test::random_floats(static_cast<size_t>(48 * hf.spec.patch_dim()), 3, -2, 2);
  ThreadPool pool(1);
  CHECK(encode_images(m.spec, m.weights, pix.data(), grids, pool) ==
        encode_images(hf112, hf_rounded, pix.data(), grids, pool));
  const ImageProcessorConfig c = mmproj_image_processor(path, m.spec);
  CHECK(c.patch_size == 14);
  CHECK(c.max_pixels == 12845056);
  CHECK(c.image_std[1] == 0.26130258f);
}

TEST_CASE("mmproj: bad files give one error naming the key or tensor", "[vision][mmproj]") {
  const VisionModel hf = load_vision_model(vl_dir());
  const std::string path = test::temp_path("bad.mmproj.gguf");
  write_mmproj(hf, ImageProcessorConfig{}, path, DType::F32);
  test::drop_gguf_tensor(path, "v.blk.2.ffn_up.bias");
  CHECK_THROWS_WITH(load_mmproj(path), Contains("v.blk.2.ffn_up.bias") && Contains("missing"));
  // A language model GGUF is not a projector.
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_string("qwen2vl"));
  w.write(path);
  CHECK_THROWS_WITH(load_mmproj(path), Contains("clip.projector_type"));
  CHECK_THROWS_WITH(load_mmproj(test::temp_path("no_such.gguf")), Contains("no_such.gguf"));
  // A projector for a language model of another width.
  write_mmproj(hf, ImageProcessorConfig{}, path, DType::F32);
  ModelSpec lm;
  lm.hidden_size = hf.spec.out_hidden_size + 8;
  lm.mrope_section = {2, 3, 3};
  CHECK_THROWS_WITH(load_vl_model_gguf(path, lm, 292, 290), Contains("projection_dim"));
  lm.hidden_size = hf.spec.out_hidden_size;
  CHECK_THROWS_WITH(load_vl_model_gguf(path, lm, -1, 290), Contains("<|image_pad|>"));
  lm.mrope_section.clear();
  CHECK_THROWS_WITH(load_vl_model_gguf(path, lm, 292, 290), Contains("M-RoPE"));
}

TEST_CASE("run --mmproj: the pair's errors are one line each", "[vision][mmproj][cli]") {
  const std::string lm = test::temp_path("vl_lm.gguf"), proj = test::temp_path("vl.mmproj.gguf");
  write_gguf(*open_weights(vl_dir()), lm, DType::F32);  // qwen2vl, as llama.cpp's converter names it
  write_mmproj(load_vision_model(vl_dir()), ImageProcessorConfig{}, proj, DType::F32);
  const std::string image = vl_dir() + "/images/img_300x200/image.png";
  const std::string run = test::shardwise_bin() + " run -m " + lm + " --tokens 5,290,292,291,7 -n 2 --device cpu";
  std::string text;
  CHECK(test::run_command("(" + run + " --mmproj " + proj + " 2>&1)", &text) != 0);
  CHECK_THAT(text, Contains("--mmproj needs --image"));
  // This file's vocabulary is empty: the placeholders' ids cannot be found.
  CHECK(test::run_command("(" + run + " --mmproj " + proj + " --image " + image + " 2>&1)", &text) != 0);
  CHECK_THAT(text, Contains("<|image_pad|>"));
  CHECK(test::run_command("(" + run + " --image " + image + " 2>&1)", &text) != 0);
  CHECK_THAT(text, Contains("--mmproj"));
  CHECK(test::run_command("(" + run + " --mmproj " + lm + " --image " + image + " 2>&1)", &text) != 0);
  CHECK_THAT(text, Contains("clip.projector_type"));
}

TEST_CASE("vision -m MMPROJ.gguf: the tower of llama.cpp's projector file, as the library encodes it",
          "[vision][mmproj][cli]") {
  const VisionModel hf = load_vision_model(vl_dir());
  const std::string proj = test::temp_path("cli.mmproj.gguf"), out = test::temp_path("mmproj_tokens.npy");
  write_mmproj(hf, ImageProcessorConfig{}, proj, DType::F32);
  const std::string image = vl_dir() + "/images/img_300x200/image.png";
  std::string text;
  REQUIRE(test::run_command("(" + test::shardwise_bin() + " vision -m " + proj + " --image " + image + " --out " + out +
                                " -t 1 --json 2>/dev/null)",
                            &text) == 0);
  INFO(text);
  const VisionModel m = load_mmproj(proj);
  ThreadPool pool(1);
  const EncodedImages e = encode_image_files(m, mmproj_image_processor(proj, m.spec), {image}, pool);
  CHECK(test::load_npy_floats(out) == e.tokens);
  // The released checkpoints' pixel limits, not the fixture's preprocessor_config.json (which the file
  // does not carry): 300x200 stays 308x196, 77 tokens (12 under the fixture's smaller max_pixels).
  CHECK(nlohmann::json::parse(text)["tokens"] == 77);
}

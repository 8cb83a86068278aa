// Tests for the Qwen2.5-VL vision encoder: the spec read from config.json (and bad configs refused), the
// window order and rotary positions against cases worked by hand from HF's get_window_index and
// rot_pos_emb, the tiled attention against naive attention, weights read from safetensors, and the f32
// encoder against the f64 reference on tiny random towers; `shardwise vision` against the library.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/varlen_attention.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/encoder_reference.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/vision_spec.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

// A tiny tower with several windows per image: 2-pixel patches, so an 8-pixel window is 2 x 2 merged
// tokens; blocks 1 and 3 attend over whole frames, 0 and 2 within windows.
VisionSpec tiny_spec() {
  VisionSpec s;
  s.depth = 4;
  s.hidden_size = 64;
  s.intermediate_size = 96;
  s.num_heads = 4;
  s.out_hidden_size = 48;
  s.patch_size = 2;
  s.window_size = 8;
  s.fullatt_block_indexes = {1, 3};
  return s;
}

// The released Qwen2.5-VL-7B-Instruct config.json (transformers 4 layout: the text fields at the top),
// with the text part shortened.
const char* kQwen25Vl7bConfig = R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"],
  "model_type": "qwen2_5_vl",
  "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "vocab_size": 152064,
  "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
  "vision_config": {
    "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
    "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
    "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
    "temporal_patch_size": 2
  },
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}
})";

std::vector<float> random_pixels(const VisionSpec& s, const std::vector<GridThw>& grids, uint32_t seed) {
  return test::random_floats(static_cast<size_t>(vision_patch_count(grids) * s.patch_dim()), seed, -2.0f, 2.0f);
}

// max |a - ref| / max |ref| over the whole output.
double rel_error(const std::vector<float>& a, const std::vector<double>& ref) {
  REQUIRE(a.size() == ref.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  REQUIRE(scale > 0.0);
  return err / scale;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<float> af(a.begin(), a.end());
  return rel_error(af, b);
}

void require_config_error(const json& config, const std::string& expected) {
  INFO(expected);
  REQUIRE_THROWS_WITH(vision_spec_from_hf_config(config.dump(), "cfg.json"),
                      Contains("cfg.json") && Contains(expected));
}

}  // namespace

TEST_CASE("vision spec: the Qwen2.5-VL-7B config.json, transformers 4 and 5 layouts", "[vision]") {
  const VisionSpec s = vision_spec_from_hf_config(kQwen25Vl7bConfig, "config.json");
  CHECK(s.depth == 32);
  CHECK(s.hidden_size == 1280);
  CHECK(s.intermediate_size == 3420);
  CHECK(s.num_heads == 16);
  CHECK(s.head_dim() == 80);
  CHECK(s.out_hidden_size == 3584);
  CHECK(s.in_chans == 3);
  CHECK(s.patch_size == 14);
  CHECK(s.temporal_patch_size == 2);
  CHECK(s.spatial_merge_size == 2);
  CHECK(s.window_size == 112);
  CHECK(s.window_merged() == 4);
  CHECK(s.fullatt_block_indexes == std::vector<int>{7, 15, 23, 31});
  CHECK(s.hidden_act == "silu");
  CHECK(s.act() == VisionAct::Silu);
  CHECK(s.patch_dim() == 1176);
  CHECK(s.merger_width() == 5120);
  CHECK(s.full_attention(15));
  CHECK_FALSE(s.full_attention(14));
  // 1280 * 1176 + 32 blocks * 19702200 + merger 44574464: the tower's 676.55M parameters.
  CHECK(vision_patch_embed_params(s) == 1505280);
  CHECK(vision_block_params(s) == 19702200);
  CHECK(vision_merger_params(s) == 44574464);
  CHECK(vision_params(s) == 676550144);
  CHECK(vision_weight_bytes(s, DType::BF16) == 2 * 676550144ull);
  CHECK(vision_block_bytes(s, DType::F32) == 4 * 19702200ull);
  CHECK_THROWS_AS(vision_block_bytes(s, DType::Q8_0), Error);
  CHECK(vision_image_tokens(s, {1, 36, 52}) == 468);

  // transformers 5 nests the text fields in text_config; vision_config stays at the top.
  json j = json::parse(kQwen25Vl7bConfig);
  json v5 = {{"model_type", "qwen2_5_vl"}, {"vision_config", j["vision_config"]}};
  v5["text_config"] = {{"model_type", "qwen2_5_vl_text"}, {"hidden_size", 3584}};
  const VisionSpec s5 = vision_spec_from_hf_config(v5.dump(), "config.json");
  CHECK(s5.hidden_size == 1280);
  CHECK(s5.out_hidden_size == 3584);
  CHECK(s5.fullatt_block_indexes == s.fullatt_block_indexes);

  // in_channels (what HF's config class reads) wins over in_chans; defaults are HF's.
  json vc = j["vision_config"];
  vc["in_channels"] = 4;
  for (const char* key : {"patch_size", "window_size", "fullatt_block_indexes", "hidden_act", "spatial_merge_size"})
    vc.erase(key);
  const VisionSpec sd =
      vision_spec_from_hf_config(json{{"model_type", "qwen2_5_vl"}, {"vision_config", vc}}.dump(), "c");
  CHECK(sd.in_chans == 4);
  CHECK(sd.patch_size == 14);
  CHECK(sd.window_size == 112);
  CHECK(sd.spatial_merge_size == 2);
  CHECK(sd.hidden_act == "silu");
  CHECK(sd.fullatt_block_indexes == std::vector<int>{7, 15, 23, 31});
}

TEST_CASE("vision spec: bad configs are refused with one clear error", "[vision]") {
  const json base = json::parse(kQwen25Vl7bConfig);
  auto with = [&](const std::string& key, const json& value) {
    json j = base;
    j["vision_config"][key] = value;
    return j;
  };
  require_config_error(with("hidden_size", 1281), "not a multiple of num_heads");
  require_config_error(with("num_heads", 0), "num_heads = 0 is out of range");
  require_config_error(with("depth", 100000), "depth = 100000 is out of range");
  require_config_error(with("depth", "32"), "is not an integer");
  require_config_error(with("depth", 32.5), "is not an integer");
  require_config_error(with("out_hidden_size", -5), "out_hidden_size = -5 is out of range");
  require_config_error(with("intermediate_size", 18446744073709551615ull), "intermediate_size");
  require_config_error(with("window_size", 100), "window_size = 100 is not a multiple of");
  require_config_error(with("spatial_merge_size", 3), "window_size = 112 is not a multiple of");
  require_config_error(with("fullatt_block_indexes", json::array({7, 32})), "fullatt_block_indexes holds 32");
  require_config_error(with("fullatt_block_indexes", json::array({-1})), "fullatt_block_indexes holds -1");
  require_config_error(with("fullatt_block_indexes", 7), "not a list");
  require_config_error(with("hidden_act", "relu"), "hidden_act 'relu' is not supported");
  require_config_error(with("patch_size", 0), "patch_size = 0 is out of range");
  json hd18 = with("hidden_size", 36);
  hd18["vision_config"]["num_heads"] = 2;
  require_config_error(hd18, "head_dim hidden_size / num_heads = 18 is not a multiple of 4");
  json huge = with("depth", 256);
  huge["vision_config"]["hidden_size"] = 65536;
  huge["vision_config"]["num_heads"] = 1024;
  huge["vision_config"]["intermediate_size"] = 262144;
  huge["vision_config"]["fullatt_block_indexes"] = json::array();
  require_config_error(huge, "parameters, more than the limit");
  json no_inter = base;
  no_inter["vision_config"].erase("intermediate_size");
  require_config_error(no_inter, "vision_config has no intermediate_size");
  json qwen2vl = base;
  qwen2vl["model_type"] = "qwen2_vl";
  require_config_error(qwen2vl, "qwen2_vl (Qwen2-VL) is not supported yet");
  json llama = base;
  llama["model_type"] = "llama";
  require_config_error(llama, "'llama' is not a vision-language model");
  json no_vision = base;
  no_vision.erase("vision_config");
  require_config_error(no_vision, "no vision_config");
  CHECK_THROWS_WITH(vision_spec_from_hf_config("{\"model_type\": ", "cfg.json"), Contains("not valid JSON"));
  CHECK_THROWS_WITH(vision_spec_from_hf_config("[1, 2]", "cfg.json"), Contains("not a JSON object"));

  const VisionSpec s = tiny_spec();
  CHECK_THROWS_WITH(validate_grids(s, {}, "enc"), Contains("no images"));
  CHECK_THROWS_WITH(validate_grids(s, {{1, 5, 6}}, "enc"), Contains("multiples of spatial_merge_size = 2"));
  CHECK_THROWS_WITH(validate_grids(s, {{1, 4, 4}, {0, 4, 4}}, "enc"), Contains("image 1"));
  CHECK_THROWS_WITH(validate_grids(s, {{1, 1024, 1026}}, "enc"), Contains("patches in all"));
  CHECK_NOTHROW(validate_grids(s, {{1, 4, 6}, {2, 8, 8}}, "enc"));
}

TEST_CASE("vision geometry: window order and rotary positions as HF computes them", "[vision]") {
  const VisionSpec s = tiny_spec();  // windows of 2 x 2 merged tokens
  REQUIRE(s.window_merged() == 2);

  SECTION("one 1x4x6 image: merged grid 2 x 3, a full window and a half one") {
    // Merged tokens 0 1 2 / 3 4 5; windows {0, 1, 3, 4} and {2, 5}; the padded row of windows is empty.
    const VisionWindows w = vision_windows(s, {{1, 4, 6}});
    CHECK(w.window_index == std::vector<int64_t>{0, 1, 3, 4, 2, 5});
    CHECK(w.cu_window_seqlens == std::vector<int64_t>{0, 16, 24});
    CHECK(vision_frame_seqlens({{1, 4, 6}}) == std::vector<int64_t>{0, 24});
    // Patches in merge blocks of 2 x 2, the blocks row-major over the 2 x 3 merged grid.
    const std::vector<std::array<int64_t, 2>> expected = {
        {0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {0, 4}, {0, 5}, {1, 4}, {1, 5},
        {2, 0}, {2, 1}, {3, 0}, {3, 1}, {2, 2}, {2, 3}, {3, 2}, {3, 3}, {2, 4}, {2, 5}, {3, 4}, {3, 5}};
    CHECK(vision_patch_positions(s, {{1, 4, 6}}) == expected);
  }
  SECTION("1x8x8: four full windows (the grid divides, HF still pads a window of -100)") {
    const VisionWindows w = vision_windows(s, {{1, 8, 8}});
    CHECK(w.window_index == std::vector<int64_t>{0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15});
    CHECK(w.cu_window_seqlens == std::vector<int64_t>{0, 16, 32, 48, 64});
  }
  SECTION("1x6x10: merged grid 3 x 5, windows cut at both edges") {
    const VisionWindows w = vision_windows(s, {{1, 6, 10}});
    CHECK(w.window_index == std::vector<int64_t>{0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14});
    CHECK(w.cu_window_seqlens == std::vector<int64_t>{0, 16, 32, 40, 48, 56, 60});
  }
  SECTION("several images and frames: windows per frame, indices offset per image") {
    const std::vector<GridThw> grids = {{1, 4, 6}, {2, 4, 4}};
    const VisionWindows w = vision_windows(s, grids);
    CHECK(w.window_index == std::vector<int64_t>{0, 1, 3, 4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13});
    CHECK(w.cu_window_seqlens == std::vector<int64_t>{0, 16, 24, 40, 56});
    CHECK(vision_frame_seqlens(grids) == std::vector<int64_t>{0, 24, 40, 56});
    const auto pos = vision_patch_positions(s, grids);
    REQUIRE(pos.size() == 56);
    // The second image's frames repeat its positions.
    CHECK(std::equal(pos.begin() + 24, pos.begin() + 40, pos.begin() + 40));
    CHECK(pos[24 + 4] == std::array<int64_t, 2>{0, 2});
    CHECK(pos[24 + 15] == std::array<int64_t, 2>{3, 3});
  }
  SECTION("a window as wide as the image: one window per frame") {
    VisionSpec big = s;
    big.window_size = 112;  // 28 merged tokens
    const VisionWindows w = vision_windows(big, {{1, 4, 6}});
    CHECK(w.window_index == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
    CHECK(w.cu_window_seqlens == std::vector<int64_t>{0, 24});
  }
}

TEST_CASE("vision attention: tiled equals naive over segments not multiples of the tile", "[vision]") {
  const int64_t heads = 3, hd = 16, width = heads * hd, stride = 3 * width;  // fused q, k, v rows
  const std::vector<int64_t> lengths = {1, 63, 64, 65, 0, 130, 7, 200};
  std::vector<int64_t> cu = {0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  const int64_t n = cu.back();
  const std::vector<float> qkv = test::random_floats(static_cast<size_t>(n * stride), 17, -2.0f, 2.0f);
  const std::vector<double> qkv64(qkv.begin(), qkv.end());
  std::vector<double> ref(static_cast<size_t>(n * width));
  varlen_attention_reference(qkv64.data(), qkv64.data() + width, qkv64.data() + 2 * width, stride, ref.data(), width,
                             cu, heads, hd);
  VarlenAttentionShape shape;
  shape.n_heads = heads;
  shape.head_dim = hd;
  shape.q_stride = shape.kv_stride = stride;
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(static_cast<size_t>(n * width), std::numeric_limits<float>::quiet_NaN());
    varlen_attention(qkv.data(), qkv.data() + width, qkv.data() + 2 * width, out.data(), cu, shape, pool);
    INFO("threads " << threads);
    CHECK(rel_error(out, ref) <= 2e-6);
    outs.push_back(out);
  }
  CHECK(outs[0] == outs[1]);  // each row is computed in one fixed order, whatever the thread count

  // The scores are far from uniform (else a wrong mask or scale would go unseen): the reference over one
  // segment of all rows differs clearly.
  std::vector<double> merged(ref.size());
  varlen_attention_reference(qkv64.data(), qkv64.data() + width, qkv64.data() + 2 * width, stride, merged.data(), width,
                             {0, n}, heads, hd);
  CHECK(rel_diff(merged, ref) > 0.1);

  CHECK(varlen_attention_scratch_bytes(80, 2) == 2 * (4 * (64 * 64 + 64 * 80 + 2 * 64) + 16 * 64));
  ThreadPool pool(1);
  std::vector<float> out(static_cast<size_t>(n * width));
  CHECK_THROWS_AS(varlen_attention(qkv.data(), qkv.data(), qkv.data(), out.data(), {0, 5, 3}, shape, pool), Error);
}

TEST_CASE("vision encoder: f32 forward matches the f64 reference", "[vision]") {
  // Tolerance: every f32 dot product (length <= 1024 here) rounds relative to its terms at ~1e-7 per
  // accumulation step; through 4 blocks and the merger the measured max error is a few 1e-7 of the
  // output's largest value, so 1e-5 leaves room for other BLAS builds while any wrong step (a
  // window, a rotary channel, a bias) moves the output by more than 1e-2.
  constexpr double kTolerance = 1e-5;
  const VisionSpec s = tiny_spec();
  const VisionWeights w = random_vision_weights(s, 7, 0.1f);
  ThreadPool pool(2);
  const std::vector<std::vector<GridThw>> cases = {
      {{1, 4, 6}}, {{1, 8, 8}}, {{1, 6, 10}}, {{2, 4, 4}}, {{1, 4, 6}, {1, 8, 8}}, {{1, 6, 10}, {2, 4, 4}, {1, 2, 2}}};
  uint32_t seed = 100;
  for (const auto& grids : cases) {
    const std::vector<float> pix = random_pixels(s, grids, seed++);
    const std::vector<float> out = encode_images(s, w, pix.data(), grids, pool);
    const std::vector<double> ref = encode_images_reference(s, w, pix.data(), grids);
    int64_t tokens = 0;
    for (const GridThw& g : grids) tokens += vision_image_tokens(s, g);
    REQUIRE(static_cast<int64_t>(out.size()) == tokens * s.out_hidden_size);
    INFO("grids " << grids.size() << " first " << grids[0][0] << "x" << grids[0][1] << "x" << grids[0][2]);
    CHECK(rel_error(out, ref) <= kTolerance);
  }

  SECTION("real patch and window sizes, head_dim 80, other activations") {
    VisionSpec r = s;
    r.hidden_size = 160;
    r.num_heads = 2;
    r.patch_size = 14;
    r.window_size = 56;  // 2 merged tokens
    for (const char* act : {"silu", "gelu_pytorch_tanh", "quick_gelu"}) {
      r.hidden_act = act;
      const VisionWeights rw = random_vision_weights(r, 3, 0.05f);
      const std::vector<GridThw> grids = {{1, 4, 6}, {1, 6, 4}};
      const std::vector<float> pix = random_pixels(r, grids, 9);
      INFO(act);
      CHECK(rel_error(encode_images(r, rw, pix.data(), grids, pool),
                      encode_images_reference(r, rw, pix.data(), grids)) <= kTolerance);
    }
  }
}

TEST_CASE("vision encoder: images are independent, and the checks can fail", "[vision]") {
  const VisionSpec s = tiny_spec();
  const VisionWeights w = random_vision_weights(s, 11, 0.1f);
  ThreadPool pool(2);
  const GridThw a = {1, 6, 10}, b = {2, 4, 4};
  const std::vector<float> pa = random_pixels(s, {a}, 1), pb = random_pixels(s, {b}, 2);
  std::vector<float> both = pa;
  both.insert(both.end(), pb.begin(), pb.end());
  // Encoding two images together gives each one's tokens as encoding it alone, in turn.
  std::vector<double> alone = encode_images_reference(s, w, pa.data(), {a});
  const std::vector<double> alone_b = encode_images_reference(s, w, pb.data(), {b});
  alone.insert(alone.end(), alone_b.begin(), alone_b.end());
  CHECK(rel_error(encode_images(s, w, both.data(), {a, b}, pool), alone) <= 1e-5);

  // What the comparison with the reference would catch: each of these changes moves the output far
  // beyond the tolerance.
  const std::vector<double> ref = encode_images_reference(s, w, pa.data(), {a});
  VisionSpec all_full = s, all_windows = s, wider = s;
  all_full.fullatt_block_indexes = {0, 1, 2, 3};
  all_windows.fullatt_block_indexes = {};
  wider.window_size = 12;  // 3 merged tokens
  for (const VisionSpec* other : {&all_full, &all_windows, &wider})
    CHECK(rel_diff(encode_images_reference(*other, w, pa.data(), {a}), ref) > 1e-2);
  VisionWeights no_bias = w;
  std::fill(no_bias.blocks[2].proj_b.begin(), no_bias.blocks[2].proj_b.end(), 0.0f);
  CHECK(rel_diff(encode_images_reference(s, no_bias, pa.data(), {a}), ref) > 1e-2);

  VisionWeights short_w = w;
  short_w.blocks[1].qkv_b.pop_back();
  CHECK_THROWS_WITH(encode_images(s, short_w, pa.data(), {a}, pool), Contains("blocks.1.attn.qkv.bias"));
  CHECK_THROWS_WITH(encode_images(s, w, pa.data(), {{1, 5, 10}}, pool), Contains("spatial_merge_size"));
  CHECK(vision_encoder_scratch_bytes(s, 60, 2) > 60 * 4 * (7 * 64 + 2 * 96));
}

namespace {

struct StTensor {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string bf16_bytes(const std::vector<float>& v) {
  std::string out(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(&out[2 * i], &h, 2);
  }
  return out;
}

// A safetensors file: 8-byte little-endian header length, the JSON header (padded to an odd length so
// that the data is misaligned, which readers must cope with), the data.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
  json h = json::object();
  std::string data;
  for (const StTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 2 == 0) header += ' ';
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(&out[0], &n, 8);
  test::write_file(path, out + header + data);
}

// The tower's tensors under `prefix` (norms and the merger in bf16, the rest f32), plus an LLM tensor.
std::vector<StTensor> tower_tensors(const VisionSpec& s, const VisionWeights& w, const std::string& prefix) {
  const int64_t h = s.hidden_size, f = s.intermediate_size, m = s.merger_width();
  std::vector<StTensor> t;
  t.push_back({prefix + "patch_embed.proj.weight",
               "F32",
               {h, s.in_chans, s.temporal_patch_size, s.patch_size, s.patch_size},
               f32_bytes(w.patch_embed.values())});
  for (int64_t i = 0; i < s.depth; ++i) {
    const VisionBlockWeights& b = w.blocks[static_cast<size_t>(i)];
    const std::string p = prefix + "blocks." + std::to_string(i) + ".";
    t.push_back({p + "norm1.weight", "BF16", {h}, bf16_bytes(b.norm1)});
    t.push_back({p + "norm2.weight", "BF16", {h}, bf16_bytes(b.norm2)});
    t.push_back({p + "attn.qkv.weight", "F32", {3 * h, h}, f32_bytes(b.qkv_w.values())});
    t.push_back({p + "attn.qkv.bias", "F32", {3 * h}, f32_bytes(b.qkv_b)});
    t.push_back({p + "attn.proj.weight", "F32", {h, h}, f32_bytes(b.proj_w.values())});
    t.push_back({p + "attn.proj.bias", "F32", {h}, f32_bytes(b.proj_b)});
    t.push_back({p + "mlp.gate_proj.weight", "F32", {f, h}, f32_bytes(b.gate_w.values())});
    t.push_back({p + "mlp.gate_proj.bias", "F32", {f}, f32_bytes(b.gate_b)});
    t.push_back({p + "mlp.up_proj.weight", "F32", {f, h}, f32_bytes(b.up_w.values())});
    t.push_back({p + "mlp.up_proj.bias", "F32", {f}, f32_bytes(b.up_b)});
    t.push_back({p + "mlp.down_proj.weight", "F32", {h, f}, f32_bytes(b.down_w.values())});
    t.push_back({p + "mlp.down_proj.bias", "F32", {h}, f32_bytes(b.down_b)});
  }
  t.push_back({prefix + "merger.ln_q.weight", "BF16", {h}, bf16_bytes(w.merger_norm)});
  t.push_back({prefix + "merger.mlp.0.weight", "BF16", {m, m}, bf16_bytes(w.merger_fc1_w.values())});
  t.push_back({prefix + "merger.mlp.0.bias", "F32", {m}, f32_bytes(w.merger_fc1_b)});
  t.push_back({prefix + "merger.mlp.2.weight", "F32", {s.out_hidden_size, m}, f32_bytes(w.merger_fc2_w.values())});
  t.push_back({prefix + "merger.mlp.2.bias", "F32", {s.out_hidden_size}, f32_bytes(w.merger_fc2_b)});
  t.push_back({"model.embed_tokens.weight", "F32", {2, 2}, f32_bytes({1, 2, 3, 4})});
  return t;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

std::string tiny_config_json(const VisionSpec& s) {
  json vc = {{"depth", s.depth},
             {"hidden_size", s.hidden_size},
             {"intermediate_size", s.intermediate_size},
             {"num_heads", s.num_heads},
             {"in_chans", s.in_chans},
             {"out_hidden_size", s.out_hidden_size},
             {"patch_size", s.patch_size},
             {"temporal_patch_size", s.temporal_patch_size},
             {"spatial_merge_size", s.spatial_merge_size},
             {"window_size", s.window_size},
             {"fullatt_block_indexes", s.fullatt_block_indexes},
             {"hidden_act", s.hidden_act}};
  return json{{"model_type", "qwen2_5_vl"}, {"text_config", {{"hidden_size", 48}}}, {"vision_config", vc}}.dump();
}

}  // namespace

TEST_CASE("vision weights: read from safetensors under both name prefixes, shapes checked", "[vision]") {
  const VisionSpec s = tiny_spec();
  const VisionWeights w = random_vision_weights(s, 21, 0.1f);
  for (const std::string prefix : {"visual.", "model.visual."}) {
    const std::string dir = test::temp_path("vl_" + prefix);
    std::filesystem::create_directories(dir);
    test::write_file(dir + "/config.json", tiny_config_json(s));
    write_safetensors(dir + "/model.safetensors", tower_tensors(s, w, prefix));
    const VisionModel m = load_vision_model(dir);
    INFO(prefix);
    CHECK(m.spec.depth == s.depth);
    CHECK(m.spec.fullatt_block_indexes == s.fullatt_block_indexes);
    CHECK(m.weights.patch_embed == w.patch_embed);
    CHECK(m.weights.blocks[3].down_w == w.blocks[3].down_w);
    CHECK(m.weights.blocks[0].qkv_b == w.blocks[0].qkv_b);
    CHECK(m.weights.blocks[2].norm1 == bf16_rounded(w.blocks[2].norm1));
    CHECK(m.weights.merger_fc1_w.values() == bf16_rounded(w.merger_fc1_w.values()));
    CHECK(m.weights.merger_fc2_b == w.merger_fc2_b);
  }

  const std::string dir = test::temp_path("vl_bad");
  std::filesystem::create_directories(dir);
  test::write_file(dir + "/config.json", tiny_config_json(s));
  SECTION("a transposed matrix is refused, naming the tensor") {
    auto t = tower_tensors(s, w, "visual.");
    for (StTensor& x : t)
      if (x.name == "visual.blocks.2.mlp.down_proj.weight") x.shape = {s.intermediate_size, s.hidden_size};
    write_safetensors(dir + "/model.safetensors", t);
    CHECK_THROWS_WITH(load_vision_model(dir), Contains("visual.blocks.2.mlp.down_proj.weight") &&
                                                  Contains("[96, 64]") && Contains("needs [64, 96]"));
  }
  SECTION("a missing tensor is refused, naming it") {
    auto t = tower_tensors(s, w, "model.visual.");
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const StTensor& x) { return x.name == "model.visual.merger.mlp.2.bias"; }),
            t.end());
    write_safetensors(dir + "/model.safetensors", t);
    CHECK_THROWS_WITH(load_vision_model(dir), Contains("model.visual.merger.mlp.2.bias is missing"));
  }
  SECTION("a checkpoint without a vision tower is refused") {
    write_safetensors(dir + "/model.safetensors", {{"model.embed_tokens.weight", "F32", {1}, f32_bytes({1})}});
    CHECK_THROWS_WITH(load_vision_model(dir), Contains("no visual.patch_embed.proj.weight"));
  }
  SECTION("shards without an index are all read") {
    const std::string shards = test::temp_path("vl_shards");
    std::filesystem::create_directories(shards);
    test::write_file(shards + "/config.json", tiny_config_json(s));
    auto t = tower_tensors(s, w, "visual.");
    const auto half = t.begin() + static_cast<int64_t>(t.size() / 2);
    write_safetensors(shards + "/model-00001-of-00002.safetensors", std::vector<StTensor>(t.begin(), half));
    write_safetensors(shards + "/model-00002-of-00002.safetensors", std::vector<StTensor>(half, t.end()));
    const VisionModel m = load_vision_model(shards);
    CHECK(m.weights.merger_fc2_w == w.merger_fc2_w);
    CHECK(m.weights.patch_embed == w.patch_embed);
  }
}

// `shardwise vision` on a model directory: the image tokens it writes are encode_images' on the image
// processor's patches of the same files; its bad inputs are one error line and a non-zero exit.
TEST_CASE("shardwise vision: images to image tokens, as the library computes them", "[vision][cli]") {
  const VisionSpec s = tiny_spec();
  const VisionWeights w = random_vision_weights(s, 5, 0.1f);
  const std::string dir = test::temp_path("vl_cli_model");
  std::filesystem::create_directories(dir);
  test::write_file(dir + "/config.json", tiny_config_json(s));
  write_safetensors(dir + "/model.safetensors", tower_tensors(s, w, "model.visual."));
  test::write_file(dir + "/preprocessor_config.json",
                   R"({"patch_size": 2, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 64,
                       "max_pixels": 1024})");
  const std::string img = test::fixtures_dir() + "/vision/images/";
  const std::vector<std::string> files = {img + "png_rgb8_37x23.png", img + "jpeg_progressive_45x33.jpg"};
  const std::string out = test::temp_path("vl_tokens.npy");
  std::string text;
  const std::string cmd = test::shardwise_bin() + " vision -m " + dir + " --image " + files[0] + " --image " +
                          files[1] + " --out " + out + " -t 2 --json";
  REQUIRE(test::run_command("(" + cmd + " 2>/dev/null)", &text) == 0);
  const json j = json::parse(text);

  // The same images through the library.
  ImageProcessorConfig pc = parse_preprocessor_config(test::read_file(dir + "/preprocessor_config.json"), "pc");
  std::vector<float> pixels;
  std::vector<GridThw> grids;
  for (const std::string& f : files) {
    const PreprocessedImage p = preprocess_image(load_image(f), pc);
    pixels.insert(pixels.end(), p.pixel_values.begin(), p.pixel_values.end());
    grids.push_back({p.grid_t, p.grid_h, p.grid_w});
  }
  ThreadPool pool(2);
  const VisionWeights bf = load_vision_model(dir).weights;  // as stored (norms and merger in bf16)
  const std::vector<float> want = encode_images(s, bf, pixels.data(), grids, pool);
  const std::vector<float> got = test::load_npy_floats(out);
  CHECK(got == want);
  CHECK(j["tokens"].get<int64_t>() * s.out_hidden_size == static_cast<int64_t>(want.size()));
  CHECK(j["images"][1]["grid_thw"] == json{grids[1][0], grids[1][1], grids[1][2]});

  // Bad inputs: one line, non-zero exit.
  for (const std::string& bad :
       {" vision -m " + dir + " --image " + test::fixtures_dir() + "/vision/manifest.txt",
        " vision -m " + dir + "/missing --image " + files[0],
        " vision -m " + dir + " --image " + files[0] + " --out " + test::temp_path("no/such/dir/x.npy")}) {
    INFO(bad);
    CHECK(test::run_command(test::shardwise_bin() + bad + " 2>&1", &text) != 0);
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
    CHECK(text.rfind("error: ", 0) == 0);
  }
  // A processor whose patching differs from the encoder's is refused.
  test::write_file(dir + "/preprocessor_config.json", R"({"patch_size": 14})");
  CHECK(test::run_command(test::shardwise_bin() + " vision -m " + dir + " --image " + files[0] + " 2>&1", &text) != 0);
  CHECK_THAT(text, Contains("differ from the vision encoder's"));
}

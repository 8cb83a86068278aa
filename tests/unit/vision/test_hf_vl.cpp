// Qwen2.5-VL against HF transformers (tests/fixtures/vl/qwen2_5_vl, made by
// scripts/fixtures/make_vl_fixtures.py: a tiny random-weight model, its Pillow-backend image processor's
// outputs, its vision tower's outputs, get_rope_index's positions, forward logits and greedy tokens).
// References nobody here wrote: the processor must match bit for bit, the rest within f32 rounding.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/mrope.h"
#include "vision/vl_prompt.h"

using namespace shardwise;
using nlohmann::json;

namespace {

std::string vl_dir() {
  return test::fixtures_dir() + "/vl/qwen2_5_vl";
}

json meta() {
  return json::parse(test::read_file(vl_dir() + "/meta.json"));
}

std::vector<GridThw> grids_of(const std::vector<int32_t>& flat) {
  REQUIRE(flat.size() % 3 == 0);
  std::vector<GridThw> g;
  for (size_t i = 0; i < flat.size(); i += 3) g.push_back(GridThw{flat[i], flat[i + 1], flat[i + 2]});
  return g;
}

// The ids with each run of image tokens cut to one placeholder (the form `--tokens` takes).
std::vector<int32_t> collapse_images(const std::vector<int32_t>& ids, int32_t image_token) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != image_token || i == 0 || ids[i - 1] != image_token) out.push_back(ids[i]);
  return out;
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

// --image FILE for each image a prompt names (its PNG, which the fixture's pixel values came from).
std::string image_flags(const json& prompt) {
  std::string s;
  for (const auto& name : prompt["images"])
    s += " --image " + vl_dir() + "/images/" + name.get<std::string>() + "/image.png";
  return s;
}

// The fixture model with the released checkpoints' flat config.json (text fields at the top level).
std::string flat_layout_dir() {
  const std::string dir = test::temp_path("vl_flat");
  std::filesystem::create_directories(dir);
  for (const char* f : {"model.safetensors", "preprocessor_config.json"})
    std::filesystem::copy_file(vl_dir() + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(vl_dir() + "/config_flat.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}

}  // namespace

TEST_CASE("HF Qwen2.5-VL: the Pillow-backend processor's pixel values and grids, bit for bit", "[vision][fixtures]") {
  const VisionModel vm = load_vision_model(vl_dir());
  const ImageProcessorConfig proc = model_image_processor(vl_dir(), vm.spec);
  const json m = meta();
  REQUIRE(m["images"].size() >= 5);
  for (const auto& [name, info] : m["images"].items()) {
    INFO(name);
    const std::string d = vl_dir() + "/images/" + name;
    const Image img = load_image(d + "/image.png");
    CHECK(img.width == info["width"].get<int64_t>());
    CHECK(img.height == info["height"].get<int64_t>());
    const PreprocessedImage p = preprocess_image(img, proc);
    CHECK(std::vector<int32_t>{static_cast<int32_t>(p.grid_t), static_cast<int32_t>(p.grid_h),
                               static_cast<int32_t>(p.grid_w)} == test::load_npy_ints(d + "/grid_thw_pil.npy"));
    const std::vector<float> want = test::load_npy_floats(d + "/pixel_values_pil.npy");
    REQUIRE(p.pixel_values.size() == want.size());
    CHECK(std::memcmp(p.pixel_values.data(), want.data(), want.size() * sizeof(float)) == 0);
    // libjpeg-turbo decodes the JPEG to the pixels Pillow decodes it to.
    const Image jpg = load_image(d + "/image.jpg"), pil = load_image(d + "/jpg_decoded.png");
    CHECK(jpg.width == pil.width);
    CHECK(jpg.rgb == pil.rgb);
  }
}

TEST_CASE("HF Qwen2.5-VL: the vision tower on HF's pixel values, one image and a pair", "[vision][fixtures]") {
  const VisionModel vm = load_vision_model(vl_dir());
  ThreadPool pool(2);
  const int64_t out_w = vm.spec.out_hidden_size;
  const json m = meta();
  for (const auto& [name, info] : m["images"].items()) {
    INFO(name);
    const std::string d = vl_dir() + "/images/" + name;
    const std::vector<float> px = test::load_npy_floats(d + "/pixel_values_pil.npy");
    const std::vector<float> got =
        encode_images(vm.spec, vm.weights, px.data(), grids_of(test::load_npy_ints(d + "/grid_thw_pil.npy")), pool);
    CHECK(test::max_rel_error(got, test::load_npy_floats(d + "/vision_out.npy"), out_w) <= 1e-4);
  }
  // Two images of different grids in one call: the windows and full attention stay within each image.
  std::vector<float> px;
  for (const auto& name : m["vision_pair"]["images"]) {
    const auto one = test::load_npy_floats(vl_dir() + "/images/" + name.get<std::string>() + "/pixel_values_pil.npy");
    px.insert(px.end(), one.begin(), one.end());
  }
  const std::vector<float> got = encode_images(
      vm.spec, vm.weights, px.data(), grids_of(test::load_npy_ints(vl_dir() + "/vision_pair/grid_thw.npy")), pool);
  CHECK(test::max_rel_error(got, test::load_npy_floats(vl_dir() + "/vision_pair/vision_out.npy"), out_w) <= 1e-4);
}

TEST_CASE("HF Qwen2.5-VL: M-RoPE positions and decode delta equal get_rope_index's", "[vision][fixtures]") {
  const MropeTokens tok = vl_tokens_from_hf_config(test::read_file(vl_dir() + "/config.json"), "config.json");
  for (const char* name : {"one_image", "two_images", "text_only"}) {
    INFO(name);
    const std::string d = vl_dir() + "/prompts/" + name;
    const std::vector<int32_t> ids = test::load_npy_ints(d + "/input_ids.npy");
    const std::vector<GridThw> grids = std::filesystem::exists(d + "/image_grid_thw.npy")
                                           ? grids_of(test::load_npy_ints(d + "/image_grid_thw.npy"))
                                           : std::vector<GridThw>{};
    const MropePositions p = mrope_positions(ids, grids, tok);
    const std::vector<int32_t> want = test::load_npy_ints(d + "/position_ids.npy");  // [3, n]
    REQUIRE(want.size() == 3 * ids.size());
    REQUIRE(p.pos.size() == ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      for (size_t s = 0; s < 3; ++s) CHECK(p.pos[i][s] == want[s * ids.size() + i]);
    CHECK(p.delta == test::load_npy_ints(d + "/rope_deltas.npy").at(0));
  }
}

TEST_CASE("HF Qwen2.5-VL: logits --image and run --image against transformers, both config layouts",
          "[vision][fixtures][cli]") {
  const json m = meta();
  const int32_t image_token = m["token_ids"]["image"].get<int32_t>();
  const int64_t V = m["text_config"]["vocab_size"].get<int64_t>();
  const std::string flat = flat_layout_dir();
  for (const char* name : {"one_image", "two_images", "text_only"}) {
    const std::string d = vl_dir() + "/prompts/" + name;
    const json& pm = m["prompts"][name];
    const std::vector<int32_t> ids = test::load_npy_ints(d + "/input_ids.npy");
    const std::vector<int32_t> greedy = test::load_npy_ints(d + "/greedy_ids.npy");
    const std::string tokens = id_list(collapse_images(ids, image_token));
    for (const std::string& model : {vl_dir(), flat}) {
      INFO(name << " " << model);
      const std::string out = test::temp_path(std::string(name) + "_logits.npy");
      std::string text;
      REQUIRE(test::run_command("(" + test::shardwise_bin() + " logits -m " + model + image_flags(pm) + " --tokens " +
                                    tokens + " --out " + out + " -t 2 2>/dev/null)",
                                &text) == 0);
      CHECK(test::max_rel_error(test::load_npy_floats(out), test::load_npy_floats(d + "/logits.npy"), V) <= 1e-4);
      // Greedy generation (prefill, then decode at position row + delta) gives HF's tokens (an f32 cache,
      // as HF's).
      REQUIRE(test::run_command("(" + test::shardwise_bin() + " run -m " + model + image_flags(pm) + " --tokens " +
                                    tokens + " -n " + std::to_string(greedy.size()) +
                                    " --greedy --ignore-eos --json --device cpu --kv-dtype f32 -t 2 2>/dev/null)",
                                &text) == 0);
      INFO(text);
      const json run = json::parse(text);
      CHECK(run["n_prompt_tokens"].get<size_t>() == ids.size());
      CHECK(run["generated_ids"].get<std::vector<int32_t>>() == greedy);
    }
    // The language model planned on the emulated device under a budget that holds part of it, in each
    // schedule (the image rows and M-RoPE positions go through the plan runtime), with the default f16 KV
    // cache and with f32 and bf16 ones; the vision encoder on the same device first, within the same
    // budget (1450K: its blocks streamed), its arena gone before the language model's.
    for (const std::string& how :
         {std::string("--schedule gpu-only"), std::string("--schedule static"), std::string("--schedule dynamic"),
          std::string("--schedule static --kv-dtype f32"), std::string("--schedule dynamic --kv-dtype bf16"),
          std::string("--schedule dynamic --vram-budget 1450K")}) {
      INFO(name << " emu " << how);
      std::string text;
      const bool small = how.find("1450K") != std::string::npos;
      REQUIRE(test::run_command("(" + test::shardwise_bin() + " run -m " + vl_dir() + image_flags(pm) + " --tokens " +
                                    tokens + " -n " + std::to_string(greedy.size()) +
                                    " --greedy --ignore-eos --json --device emu " +
                                    (small ? "" : "--vram-budget 1500K ") + how + " -t 2 2>/dev/null)",
                                &text) == 0);
      INFO(text);
      const json run = json::parse(text);
      CHECK(run["device"] == "emu");
      if (!pm["images"].empty()) {
        const json& v = run["vision"];
        CHECK(v["device"] == "emu");
        if (small) CHECK(v["schedule"] == "streamed");
        CHECK(v["device_peak_bytes"].get<uint64_t>() <= run["budget_bytes"].get<uint64_t>());
        // Each part alone fits; together they would not.
        CHECK(v["arena_bytes"].get<uint64_t>() + run["arena_peak_bytes"].get<uint64_t>() >
              run["budget_bytes"].get<uint64_t>());
      }
      CHECK(run["n_prompt_tokens"].get<size_t>() == ids.size());
      CHECK(run["generated_ids"].get<std::vector<int32_t>>() == greedy);
    }
    // The logits over the prompt and the greedy tokens before the last (each decode step's input).
    std::vector<int32_t> full = collapse_images(ids, image_token);
    full.insert(full.end(), greedy.begin(), greedy.end() - 1);
    const std::string out = test::temp_path(std::string(name) + "_full.npy");
    std::string text;
    REQUIRE(test::run_command("(" + test::shardwise_bin() + " logits -m " + vl_dir() + image_flags(pm) + " --tokens " +
                                  id_list(full) + " --out " + out + " -t 2 2>/dev/null)",
                              &text) == 0);
    CHECK(test::max_rel_error(test::load_npy_floats(out), test::load_npy_floats(d + "/full_logits.npy"), V) <= 1e-4);
  }
}

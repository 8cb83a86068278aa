// cli/verb_vision.cpp — `shardwise vision`: a vision-language model's image processor and vision encoder
// on the CPU. Images go in; the image tokens the language model would take come out as .npy, with each
// image's size, patch grid and token count.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/npy.h"
#include "core/thread_pool.h"
#include "executor/session/sampling.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace shardwise::cli {
namespace {

struct VisionArgs {
  std::string model, out, pixels_out;
  std::vector<std::string> images;
  int threads = 0;
  bool json = false;
};

// The model directory's preprocessor_config.json (HF's defaults without one); its patching must be the
// encoder's.
ImageProcessorConfig processor_config(const std::string& dir, const VisionSpec& spec) {
  const std::string path = dir + "/preprocessor_config.json";
  ImageProcessorConfig c;
  if (std::filesystem::exists(path)) c = parse_preprocessor_config(read_text_file(path), path);
  if (c.patch_size != spec.patch_size || c.temporal_patch_size != spec.temporal_patch_size ||
      c.merge_size != spec.spatial_merge_size)
    fail(path, ": patch_size ", c.patch_size, ", temporal_patch_size ", c.temporal_patch_size, ", merge_size ",
         c.merge_size, " differ from the vision encoder's ", spec.patch_size, ", ", spec.temporal_patch_size, ", ",
         spec.spatial_merge_size, " (config.json's vision_config)");
  return c;
}

struct Batch {
  std::vector<float> pixels;  // every image's patches in turn
  std::vector<GridThw> grids;
  nlohmann::json images = nlohmann::json::array();
};

Batch preprocess_all(const std::vector<std::string>& paths, const ImageProcessorConfig& pc) {
  Batch b;
  for (const std::string& path : paths) {
    const Image im = load_image(path);
    const PreprocessedImage p = preprocess_image(im, pc);
    b.pixels.insert(b.pixels.end(), p.pixel_values.begin(), p.pixel_values.end());
    b.grids.push_back({p.grid_t, p.grid_h, p.grid_w});
    b.images.push_back({{"path", path},
                        {"width", im.width},
                        {"height", im.height},
                        {"resized_width", p.resized_width},
                        {"resized_height", p.resized_height},
                        {"grid_thw", {p.grid_t, p.grid_h, p.grid_w}},
                        {"tokens", p.n_merged_tokens()}});
  }
  return b;
}

void run_vision(const VisionArgs& a) {
  if (!a.out.empty()) check_output_path(a.out, "--out");
  if (!a.pixels_out.empty()) check_output_path(a.pixels_out, "--pixels-out");
  const VisionModel m = load_vision_model(a.model);
  const Batch b = preprocess_all(a.images, processor_config(a.model, m.spec));
  const int64_t patches = vision_patch_count(b.grids), width = m.spec.out_hidden_size;
  if (!a.pixels_out.empty()) write_npy_f32(a.pixels_out, b.pixels.data(), {patches, m.spec.patch_dim()});
  ThreadPool pool(resolve_threads(a.threads));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> tokens = encode_images(m.spec, m.weights, b.pixels.data(), b.grids, pool);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n = static_cast<int64_t>(tokens.size()) / width;
  if (!a.out.empty()) {
    write_npy_f32(a.out, tokens.data(), {n, width});
    const int64_t bad = first_non_finite(tokens.data(), static_cast<int64_t>(tokens.size()));
    if (bad >= 0)
      fail(a.out, ": image token ", bad / width, " holds ", tokens[static_cast<size_t>(bad)],
           " (written as computed): the vision weights or activations are not finite");
  }
  if (a.json) {
    print_json({{"images", b.images}, {"patches", patches}, {"tokens", n}, {"width", width}, {"encode_ms", ms}});
    return;
  }
  for (const auto& im : b.images)
    std::printf("%s: %lldx%lld -> %lldx%lld, grid %lldx%lldx%lld, %lld tokens\n", im["path"].get<std::string>().c_str(),
                im["width"].get<long long>(), im["height"].get<long long>(), im["resized_width"].get<long long>(),
                im["resized_height"].get<long long>(), im["grid_thw"][0].get<long long>(),
                im["grid_thw"][1].get<long long>(), im["grid_thw"][2].get<long long>(), im["tokens"].get<long long>());
  std::printf("encoded %lld patches into %lld tokens of width %lld in %.1f ms%s%s\n", static_cast<long long>(patches),
              static_cast<long long>(n), static_cast<long long>(width), ms, a.out.empty() ? "" : "; wrote ",
              a.out.c_str());
}

}  // namespace

void register_vision(CLI::App& app) {
  auto a = std::make_shared<VisionArgs>();
  CLI::App* sub = app.add_subcommand(
      "vision", "Run a vision-language model's image processor and vision encoder (CPU): images to image tokens");
  sub->add_option("-m,--model", a->model,
                  "An HF directory of a Qwen2.5-VL model (config.json, safetensors, preprocessor_config.json)")
      ->required();
  sub->add_option("--image", a->images, "A JPEG or PNG file; repeat for several images (encoded together)")->required();
  sub->add_option("--out", a->out, "Output .npy of the image tokens (float32 [tokens, the LLM's hidden size])");
  sub->add_option("--pixels-out", a->pixels_out,
                  "Output .npy of the preprocessed patches (float32 [patches, 3 * T * P * P]), as HF's pixel_values");
  sub->add_option("-t,--threads", a->threads, kThreadsHelp);
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->callback([a] { run_vision(*a); });
}

}  // namespace shardwise::cli

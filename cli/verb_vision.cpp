// cli/verb_vision.cpp — `shardwise vision`: a vision-language model's image processor and vision encoder,
// on the CPU or planned on a device within a VRAM budget (vision_runtime.h). Images go in; the image
// tokens the language model would take come out as .npy, with each image's size, patch grid and token
// count, and on a device the encoder's plan and measured peak.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/npy.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "engine/run_setup.h"
#include "executor/session/sampling.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/vision_runtime.h"
#include "vision/vl_prompt.h"

namespace shardwise::cli {
namespace {

struct VisionArgs {
  std::string model, out, pixels_out;
  std::vector<std::string> images;
  std::string device = "cpu", budget;
  int threads = 0;
  bool json = false;
};

// The encoder's plan and peak on a device, for --json.
nlohmann::json device_json(const EncodedImages& e) {
  const VisionPlan& p = e.run.plan;
  return {{"device", e.device},
          {"schedule", p.schedule()},
          {"resident_blocks", p.resident_blocks},
          {"blocks", p.depth},
          {"mlp_chunk", p.mlp_chunk},
          {"budget_bytes", p.budget_bytes},
          {"arena_bytes", p.arena_bytes},
          {"workspace_bytes", p.workspace_bytes},
          {"weight_bytes", p.weight_bytes()},
          {"device_peak_bytes", e.run.device_peak_bytes}};
}

void run_vision(const VisionArgs& a) {
  if (!a.out.empty()) check_output_path(a.out, "--out");
  if (!a.pixels_out.empty()) check_output_path(a.pixels_out, "--pixels-out");
  if (a.device != "cpu" && a.budget.empty()) fail("--device ", a.device, " needs --vram-budget (e.g. 2G)");
  if (a.device == "cpu" && !a.budget.empty()) fail("--vram-budget needs a device (--device cuda or emu)");
  const uint64_t budget = a.budget.empty() ? 0 : parse_vram_budget(a.budget, "--vram-budget");
  const VisionTower tower = load_vision_tower(a.model);  // an HF directory, or llama.cpp's mmproj GGUF
  const VisionModel& m = tower.model;
  const ImageProcessorConfig& processor = tower.processor;
  ThreadPool pool(resolve_threads(a.threads));
  std::unique_ptr<Device> dev;
  if (a.device != "cpu") dev = make_run_device(a.device);
  const EncodedImages e = encode_image_files(m, processor, a.images, pool, dev.get(), budget);
  if (e.device != "cpu")
    log_info(e.run.plan.describe(), "; measured device peak ", format_bytes(e.run.device_peak_bytes));
  const int64_t patches = vision_patch_count(e.grids), width = m.spec.out_hidden_size;
  const int64_t n = static_cast<int64_t>(e.tokens.size()) / width;
  if (!a.pixels_out.empty()) write_npy_f32(a.pixels_out, e.pixel_values.data(), {patches, m.spec.patch_dim()});
  if (!a.out.empty()) {
    write_npy_f32(a.out, e.tokens.data(), {n, width});
    const int64_t bad = first_non_finite(e.tokens.data(), static_cast<int64_t>(e.tokens.size()));
    if (bad >= 0)
      fail(a.out, ": image token ", bad / width, " holds ", e.tokens[static_cast<size_t>(bad)],
           " (written as computed): the vision weights or activations are not finite");
  }
  nlohmann::json images = nlohmann::json::array();
  for (const EncodedImage& im : e.images)
    images.push_back({{"path", im.path},
                      {"width", im.width},
                      {"height", im.height},
                      {"resized_width", im.resized_width},
                      {"resized_height", im.resized_height},
                      {"grid_thw", {im.grid[0], im.grid[1], im.grid[2]}},
                      {"tokens", im.tokens}});
  if (a.json) {
    nlohmann::json j = {{"images", images}, {"patches", patches},       {"tokens", n},
                        {"width", width},   {"encode_ms", e.encode_ms}, {"device", e.device}};
    if (e.device != "cpu") j["encoder"] = device_json(e);
    print_json(j);
    return;
  }
  for (const EncodedImage& im : e.images)
    std::printf("%s: %lldx%lld -> %lldx%lld, grid %lldx%lldx%lld, %lld tokens\n", im.path.c_str(),
                static_cast<long long>(im.width), static_cast<long long>(im.height),
                static_cast<long long>(im.resized_width), static_cast<long long>(im.resized_height),
                static_cast<long long>(im.grid[0]), static_cast<long long>(im.grid[1]),
                static_cast<long long>(im.grid[2]), static_cast<long long>(im.tokens));
  std::printf("encoded %lld patches into %lld tokens of width %lld in %.1f ms on %s%s%s\n",
              static_cast<long long>(patches), static_cast<long long>(n), static_cast<long long>(width), e.encode_ms,
              e.device.c_str(), a.out.empty() ? "" : "; wrote ", a.out.c_str());
}

}  // namespace

void register_vision(CLI::App& app) {
  auto a = std::make_shared<VisionArgs>();
  CLI::App* sub = app.add_subcommand(
      "vision", "Run a vision-language model's image processor and vision encoder: images to image tokens");
  sub->add_option("-m,--model", a->model,
                  "An HF directory of a Qwen2.5-VL model (config.json, safetensors, preprocessor_config.json), or "
                  "llama.cpp's mmproj .gguf of one")
      ->required();
  sub->add_option("--image", a->images, "A JPEG or PNG file; repeat for several images (encoded together)")->required();
  sub->add_option("--out", a->out, "Output .npy of the image tokens (float32 [tokens, the LLM's hidden size])");
  sub->add_option("--pixels-out", a->pixels_out,
                  "Output .npy of the preprocessed patches (float32 [patches, 3 * T * P * P]), as HF's pixel_values");
  sub->add_option("-t,--threads", a->threads, kThreadsHelp);
  sub->add_option("--device", a->device,
                  "Where the encoder runs: cpu, or a device (cuda; emu, the emulated device) within --vram-budget, "
                  "its weights streamed from host memory where they do not all fit")
      ->check(CLI::IsMember({"cpu", "cuda", "emu"}));
  sub->add_option("--vram-budget", a->budget, "Device memory the encoder may use (e.g. 2G); needs --device");
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->callback([a] { run_vision(*a); });
}

}  // namespace shardwise::cli

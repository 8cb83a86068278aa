// vision/vl_prompt.cpp — the language model's input for a prompt with images (see vl_prompt.h).
#include "vision/vl_prompt.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/log.h"
#include "executor/cpu/ops.h"
#include "vision/image.h"

namespace shardwise {

ImageProcessorConfig model_image_processor(const std::string& dir, const VisionSpec& spec) {
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

EncodedImages encode_image_files(const VisionModel& model, const ImageProcessorConfig& processor,
                                 const std::vector<std::string>& paths, ThreadPool& pool, Device* device,
                                 uint64_t budget_bytes) {
  EncodedImages out;
  for (const std::string& path : paths) {
    const Image im = load_image(path);
    const PreprocessedImage p = preprocess_image(im, processor);
    out.pixel_values.insert(out.pixel_values.end(), p.pixel_values.begin(), p.pixel_values.end());
    const GridThw grid{p.grid_t, p.grid_h, p.grid_w};
    out.grids.push_back(grid);
    out.images.push_back({path, im.width, im.height, p.resized_width, p.resized_height, p.n_merged_tokens(), grid});
  }
  encode_preprocessed_images(model, out, pool, device, budget_bytes);
  return out;
}

void encode_preprocessed_images(const VisionModel& model, EncodedImages& out, ThreadPool& pool, Device* device,
                                uint64_t budget_bytes, uint8_t* held_arena) {
  // A budget too small for these images' encoder: the CPU encodes them instead, said once, rather than
  // the run or the request failing.
  if (device) {
    const VisionInputs in = vision_inputs(model.spec, out.grids);
    const VisionWorkspace ws = device->vision_kernels(model.spec.head_dim()).workspace(model.weights.matrix_dtype);
    try {
      plan_vision_encoder(model.spec, in, budget_bytes, ws, model.weights.matrix_dtype);
    } catch (const Error& e) {
      log_warn(e.what(), ": the images are encoded on the CPU");
      device = nullptr;
    }
  }
  if (device) {
    out.tokens = held_arena ? encode_images_in_arena(*device, held_arena, budget_bytes, model.spec, model.weights,
                                                     out.pixel_values.data(), out.grids, &out.run)
                            : encode_images_on_device(*device, model.spec, model.weights, out.pixel_values.data(),
                                                      out.grids, budget_bytes, &out.run);
    out.device = device->kind();
    out.encode_ms = out.run.encode_ms;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  out.tokens = encode_images(model.spec, model.weights, out.pixel_values.data(), out.grids, pool);
  out.encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.device = "cpu";
}

VlModel load_vl_model(const std::string& dir, const ModelSpec& lm) {
  if (!lm.vision_tower || lm.mrope_section.empty())
    fail("--image: ", dir,
         " is not a vision-language model (an HF directory of a Qwen2.5-VL model, or a Qwen2.5-VL GGUF with --mmproj)");
  const std::string config = dir + "/config.json";
  VlModel m;
  m.tokens = vl_tokens_from_hf_config(read_text_file(config), config);
  m.vision = load_vision_model(dir);
  if (m.vision.spec.out_hidden_size != lm.hidden_size)
    fail(config, ": vision_config.out_hidden_size ", m.vision.spec.out_hidden_size,
         " is not the language model's hidden size ", lm.hidden_size);
  m.processor = model_image_processor(dir, m.vision.spec);
  return m;
}

MropeTokens vl_tokens_from_hf_config(const std::string& text, const std::string& ctx) {
  using nlohmann::json;
  check_json_depth(text, ctx);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ctx, ": malformed JSON at byte ", e.byte, ": ", e.what());
  }
  if (!j.is_object()) fail(ctx, ": expected a JSON object");
  auto id = [&](const char* key) -> int32_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 30))
      fail(ctx, ": field '", key, "' must be a token id, got ",
           it == j.end() ? std::string("nothing") : json_brief(*it));
    return static_cast<int32_t>(it->get<int64_t>());
  };
  MropeTokens t;
  t.image_token_id = id("image_token_id");
  t.vision_start_token_id = id("vision_start_token_id");
  auto vc = j.find("vision_config");
  if (vc != j.end() && vc->is_object()) {
    auto m = vc->find("spatial_merge_size");
    if (m != vc->end()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() > 16)
        fail(ctx, ": vision_config.spatial_merge_size must be 1 to 16, got ", json_brief(*m));
      t.spatial_merge_size = m->get<int64_t>();
    }
  }
  return t;
}

VlInput build_vl_input(const std::vector<int32_t>& ids, const std::vector<GridThw>& grids, const float* image_tokens,
                       int64_t image_token_rows, const TensorView& token_embd, const MropeTokens& tokens) {
  const int64_t vocab = token_embd.rows(), H = token_embd.cols(), merge = tokens.spatial_merge_size;
  VlInput in;
  size_t image = 0;
  int64_t placed = 0;              // image token rows placed so far
  std::vector<int64_t> image_row;  // per expanded position: its row of image_tokens, or -1
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab) fail("token id ", id, " at position ", i, " is outside the vocabulary of ", vocab);
    if (id != tokens.image_token_id) {
      in.ids.push_back(id);
      image_row.push_back(-1);
      continue;
    }
    if (image >= grids.size())
      fail("the prompt has more image placeholders (token ", tokens.image_token_id, ") than images (", grids.size(),
           ")");
    const GridThw& g = grids[image++];
    SW_CHECK(g[0] >= 1 && g[1] >= merge && g[2] >= merge && g[1] % merge == 0 && g[2] % merge == 0, "image ", image - 1,
             ": grid ", g[0], "x", g[1], "x", g[2], " is not a whole number of merged tokens");
    const int64_t count = g[0] * (g[1] / merge) * (g[2] / merge);
    if (placed + count > image_token_rows)
      fail("the images give ", image_token_rows, " image tokens, their placeholders need more");
    for (int64_t k = 0; k < count; ++k) {
      in.ids.push_back(id);
      image_row.push_back(placed++);
    }
  }
  if (image != grids.size())
    fail("the prompt has ", image, " image placeholder(s) (token ", tokens.image_token_id, ") for ", grids.size(),
         " image(s)");
  if (placed != image_token_rows)
    fail("the images give ", image_token_rows, " image tokens, their placeholders expand to ", placed);
  const int64_t n = static_cast<int64_t>(in.ids.size());
  in.embeddings.resize(static_cast<size_t>(n * H));
  for (int64_t t = 0; t < n; ++t) {
    float* row = in.embeddings.data() + t * H;
    if (image_row[static_cast<size_t>(t)] < 0)
      embed_rows(token_embd, &in.ids[static_cast<size_t>(t)], 1, row);
    else
      std::memcpy(row, image_tokens + image_row[static_cast<size_t>(t)] * H, static_cast<size_t>(H) * sizeof(float));
  }
  in.positions = mrope_positions(in.ids, grids, tokens);
  return in;
}

}  // namespace shardwise

// vision/vl_prompt.h — a vision-language prompt as the language model takes it: the token ids with each
// image's placeholder expanded to its image tokens (as HF's processor expands them), the input embeddings
// (text tokens' embedding rows, the vision encoder's rows at the image tokens) and the M-RoPE positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"
#include "vision/encoder.h"
#include "vision/mrope.h"
#include "vision/preprocess.h"
#include "vision/vision_runtime.h"

namespace shardwise {

class ThreadPool;

// A model directory's image processor: its preprocessor_config.json (HF's defaults without one), whose
// patching must be the encoder's (an Error names the file otherwise).
ImageProcessorConfig model_image_processor(const std::string& dir, const VisionSpec& spec);

struct EncodedImage {
  std::string path;
  int64_t width = 0, height = 0, resized_width = 0, resized_height = 0, tokens = 0;
  GridThw grid{};
};
struct EncodedImages {
  std::vector<EncodedImage> images;
  std::vector<GridThw> grids;
  std::vector<float> pixel_values;  // [patches, patch_dim]: every image's in turn
  std::vector<float> tokens;        // [image tokens, out_hidden_size]: every image's in turn
  double encode_ms = 0;             // the encoder's time (not the decoding or preprocessing)
  std::string device = "cpu";       // where the encoder ran
  VisionRunStats run;               // on a device: its plan and measured peak
};
// Preprocessed images (`images`' pixel_values and grids filled) through the encoder, together, filling
// its tokens, encode_ms, device and run: on the CPU (device null), or on `device` within budget_bytes
// (vision_runtime.h): in held_arena, the budget_bytes the caller holds on the device, or else in an arena
// of the encode's own (the device must hold none then, and holds none after). A budget too small for these
// images' encoder (not even its activations and two blocks) encodes them on the CPU, with one warning.
void encode_preprocessed_images(const VisionModel& model, EncodedImages& images, ThreadPool& pool,
                                Device* device = nullptr, uint64_t budget_bytes = 0, uint8_t* held_arena = nullptr);
// Image files through the processor, then encode_preprocessed_images.
EncodedImages encode_image_files(const VisionModel& model, const ImageProcessorConfig& processor,
                                 const std::vector<std::string>& paths, ThreadPool& pool, Device* device = nullptr,
                                 uint64_t budget_bytes = 0);

// The vision side of a vision-language HF directory whose language model is `lm` (opened from the same
// directory): its special tokens, its vision tower, its image processor. An Error says why a directory is
// not one (a text model, an encoder whose output width is not the language model's hidden size).
struct VlModel {
  MropeTokens tokens;
  VisionModel vision;
  ImageProcessorConfig processor;
};
VlModel load_vl_model(const std::string& dir, const ModelSpec& lm);

// The special tokens of a Qwen2-VL family config.json (top-level image_token_id, vision_start_token_id;
// the merge size from vision_config.spatial_merge_size). Throws Error naming a missing or bad field.
MropeTokens vl_tokens_from_hf_config(const std::string& config_json_text, const std::string& context);

struct VlInput {
  std::vector<int32_t> ids;       // the expanded prompt
  std::vector<float> embeddings;  // [ids.size(), hidden]
  MropePositions positions;       // [ids.size()] (temporal, height, width), and the decode delta
};

// `ids` holds one image_token_id per image, at the image's place; image i's placeholder becomes
// grids[i]'s t*(h/m)*(w/m) image tokens, whose embedding rows are image_tokens' rows in turn
// (image_tokens: [sum of tokens, hidden], the vision encoder's output); every other id takes its row of
// token_embd. Throws Error when the placeholders and grids disagree or an id is outside the vocabulary.
VlInput build_vl_input(const std::vector<int32_t>& ids, const std::vector<GridThw>& grids, const float* image_tokens,
                       int64_t image_token_rows, const TensorView& token_embd, const MropeTokens& tokens);

}  // namespace shardwise

// vision/preprocess.h — the Qwen2-VL / Qwen2.5-VL image processor: an RGB image to the vision
// encoder's pixel_values, bit for bit as HF transformers' Qwen2VLImageProcessor (its Pillow path,
// not the torchvision "fast" one) computes them for one image.
//
// Steps: smart_resize picks a size divisible by patch_size * merge_size within [min_pixels,
// max_pixels]; Pillow's bicubic resize; x * rescale_factor in double, cast to float; (x - mean) / std
// in float; the frame repeated temporal_patch_size times; cut into patches ordered so that each
// merge_size x merge_size block of patches is contiguous (the rows the encoder's merger joins).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vision/image.h"

namespace shardwise {

// preprocessor_config.json's fields; the defaults are Qwen2VLImageProcessor's.
struct ImageProcessorConfig {
  int64_t min_pixels = 56 * 56;         // size.shortest_edge: the fewest pixels after resizing
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge: the most pixels after resizing
  int64_t patch_size = 14;              // pixels on a patch's side
  int64_t temporal_patch_size = 2;      // frames in a patch (an image is repeated to fill them)
  int64_t merge_size = 2;               // patches on a side of the block merged into one token
  // OpenAI CLIP's mean and std, rounded to float as numpy does.
  float image_mean[3] = {static_cast<float>(0.48145466), static_cast<float>(0.4578275), static_cast<float>(0.40821073)};
  float image_std[3] = {static_cast<float>(0.26862954), static_cast<float>(0.26130258), static_cast<float>(0.27577711)};
  double rescale_factor = 1.0 / 255.0;
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
};

// Reads preprocessor_config.json's text: min_pixels / max_pixels (or size.shortest_edge /
// size.longest_edge, which min_pixels / max_pixels override, as HF does), patch_size,
// temporal_patch_size, merge_size, image_mean, image_std (3 numbers or one for all channels),
// rescale_factor, do_resize, do_rescale, do_normalize. Absent keys keep the defaults; unknown keys
// are ignored; a resample other than 3 (bicubic) is refused. Throws Error naming `context` and the
// field on a bad value.
ImageProcessorConfig parse_preprocessor_config(const std::string& json_text, const std::string& context);

// HF's smart_resize: (height, width) rounded to multiples of `factor`, then scaled down (floor) to
// at most max_pixels or up (ceil) to at least min_pixels, keeping the aspect ratio. Python's round
// (half to even) and float arithmetic are reproduced. Throws Error, as HF raises, when a side is
// shorter than `factor`, the aspect ratio exceeds 200, or max_pixels would shrink a side to 0.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels);

struct PreprocessedImage {
  int64_t grid_t = 0, grid_h = 0, grid_w = 0;  // patches along time, height, width
  int64_t merge_size = 2;
  // (grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size * patch_size): rows ordered
  // (t, h / merge, w / merge, merge row, merge column); columns (channel, frame, row, column).
  std::vector<float> pixel_values;
  int64_t resized_width = 0, resized_height = 0;

  // The tokens this image takes in the language model's sequence, one per merged block.
  int64_t n_merged_tokens() const { return grid_t * grid_h * grid_w / (merge_size * merge_size); }
};

PreprocessedImage preprocess_image(const Image& image, const ImageProcessorConfig& config);

// The patch grid (t, h, w) preprocess_image gives an image of width x height, without the pixels (to plan
// for an image size). Throws Error as preprocess_image does for a size it refuses.
std::array<int64_t, 3> image_grid(int64_t width, int64_t height, const ImageProcessorConfig& config);

}  // namespace shardwise

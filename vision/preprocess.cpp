// vision/preprocess.cpp — Qwen2VLImageProcessor for one image: config parsing, smart_resize,
// rescale / normalise in HF's precisions, and the patch layout of its reshape and transpose.
#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"
#include "core/json_util.h"
#include "vision/resize.h"

namespace shardwise {
namespace {

using Json = nlohmann::json;

// A JSON integer (or an integral number) in [lo, hi].
int64_t json_int(const Json& v, const std::string& field, int64_t lo, int64_t hi, const std::string& context) {
  const bool integral = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                  v.get<double>() == std::floor(v.get<double>()));
  SW_CHECK(integral, context, ": '", field, "' must be an integer, got ", v.dump());
  const double d = v.get<double>();
  SW_CHECK(d >= static_cast<double>(lo) && d <= static_cast<double>(hi), context, ": '", field, "' is ", v.dump(),
           "; it must be in [", lo, ", ", hi, "]");
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
}

double json_double(const Json& v, const std::string& field, const std::string& context) {
  SW_CHECK(v.is_number() && std::isfinite(v.get<double>()), context, ": '", field, "' must be a finite number, got ",
           v.dump());
  return v.get<double>();
}

bool json_bool(const Json& v, const std::string& field, const std::string& context) {
  SW_CHECK(v.is_boolean(), context, ": '", field, "' must be true or false, got ", v.dump());
  return v.get<bool>();
}

// image_mean / image_std: three numbers, or one for every channel (as HF accepts), rounded to float
// as numpy's np.array(values, dtype=float32) does.
void json_channels(const Json& v, const std::string& field, float out[3], const std::string& context) {
  if (v.is_number()) {
    out[0] = out[1] = out[2] = static_cast<float>(json_double(v, field, context));
    return;
  }
  SW_CHECK(v.is_array() && v.size() == 3, context, ": '", field, "' must be a list of 3 numbers, got ", v.dump());
  for (int c = 0; c < 3; ++c) out[c] = static_cast<float>(json_double(v[c], field, context));
}

void check_config(const ImageProcessorConfig& c, const std::string& context) {
  SW_CHECK(c.patch_size >= 1 && c.patch_size <= 1024, context, ": patch_size ", c.patch_size, " is not in [1, 1024]");
  SW_CHECK(c.merge_size >= 1 && c.merge_size <= 64, context, ": merge_size ", c.merge_size, " is not in [1, 64]");
  SW_CHECK(c.temporal_patch_size >= 1 && c.temporal_patch_size <= 64, context, ": temporal_patch_size ",
           c.temporal_patch_size, " is not in [1, 64]");
  SW_CHECK(c.patch_size * c.merge_size <= kMaxImageSide, context, ": patch_size * merge_size (",
           c.patch_size * c.merge_size, ") exceeds ", kMaxImageSide);
  SW_CHECK(c.min_pixels >= 1 && c.max_pixels <= kMaxImagePixels && c.min_pixels <= c.max_pixels, context,
           ": min_pixels ", c.min_pixels, " and max_pixels ", c.max_pixels,
           " must satisfy 1 <= min <= max <= ", kMaxImagePixels);
  SW_CHECK(c.rescale_factor > 0 && std::isfinite(c.rescale_factor), context, ": rescale_factor ", c.rescale_factor,
           " must be positive");
  for (int i = 0; i < 3; ++i) {
    SW_CHECK(std::isfinite(c.image_mean[i]), context, ": image_mean[", i, "] is not finite");
    SW_CHECK(std::isfinite(c.image_std[i]) && c.image_std[i] != 0.0f, context, ": image_std[", i, "] is ",
             c.image_std[i], "; it must be finite and non-zero");
  }
}

// Python's round() of a float: to the nearest integer, halves to even.
double round_half_even(double x) {
  double r = std::floor(x);
  const double frac = x - r;  // exact for doubles
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  return r;
}

// (3, height, width) planes of (x * rescale_factor - mean) / std, each step in HF's precision.
std::vector<float> normalized_planes(const Image& image, const ImageProcessorConfig& config) {
  const size_t n = static_cast<size_t>(image.width * image.height);
  std::vector<float> planes(3 * n);
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < 3; ++c) {
      const uint8_t x = image.rgb[3 * i + c];
      // HF: image.astype(float64) * scale, then .astype(float32); without rescale, astype(float32).
      float v = config.do_rescale ? static_cast<float>(static_cast<double>(x) * config.rescale_factor)
                                  : static_cast<float>(x);
      if (config.do_normalize) v = (v - config.image_mean[c]) / config.image_std[c];  // float32, as numpy
      planes[c * n + i] = v;
    }
  }
  return planes;
}

}  // namespace

ImageProcessorConfig parse_preprocessor_config(const std::string& json_text, const std::string& context) {
  check_json_depth(json_text, context);  // before parsing: deep nesting would exhaust the parser's stack
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    fail(context, ": not valid JSON (", e.what(), ")");
  }
  SW_CHECK(j.is_object(), context, ": the preprocessor config must be a JSON object");
  ImageProcessorConfig c;
  const int64_t max_px = kMaxImagePixels;
  if (j.contains("size") && !j["size"].is_null()) {
    const Json& s = j["size"];
    SW_CHECK(s.is_object(), context, ": 'size' must be an object, got ", s.dump());
    // HF's keys, or min_pixels / max_pixels as early releases saved them.
    const char* lo = s.contains("shortest_edge") ? "shortest_edge" : "min_pixels";
    const char* hi = s.contains("longest_edge") ? "longest_edge" : "max_pixels";
    SW_CHECK(s.contains(lo) && s.contains(hi), context,
             ": 'size' must contain 'shortest_edge' and 'longest_edge' (the pixel bounds), got ", s.dump());
    c.min_pixels = json_int(s[lo], std::string("size.") + lo, 1, max_px, context);
    c.max_pixels = json_int(s[hi], std::string("size.") + hi, 1, max_px, context);
  }
  if (j.contains("min_pixels") && !j["min_pixels"].is_null()) {
    c.min_pixels = json_int(j["min_pixels"], "min_pixels", 1, max_px, context);
  }
  if (j.contains("max_pixels") && !j["max_pixels"].is_null()) {
    c.max_pixels = json_int(j["max_pixels"], "max_pixels", 1, max_px, context);
  }
  if (j.contains("patch_size")) c.patch_size = json_int(j["patch_size"], "patch_size", 1, 1024, context);
  if (j.contains("temporal_patch_size")) {
    c.temporal_patch_size = json_int(j["temporal_patch_size"], "temporal_patch_size", 1, 64, context);
  }
  if (j.contains("merge_size")) c.merge_size = json_int(j["merge_size"], "merge_size", 1, 64, context);
  if (j.contains("image_mean")) json_channels(j["image_mean"], "image_mean", c.image_mean, context);
  if (j.contains("image_std")) json_channels(j["image_std"], "image_std", c.image_std, context);
  if (j.contains("rescale_factor")) c.rescale_factor = json_double(j["rescale_factor"], "rescale_factor", context);
  if (j.contains("do_resize")) c.do_resize = json_bool(j["do_resize"], "do_resize", context);
  if (j.contains("do_rescale")) c.do_rescale = json_bool(j["do_rescale"], "do_rescale", context);
  if (j.contains("do_normalize")) c.do_normalize = json_bool(j["do_normalize"], "do_normalize", context);
  if (j.contains("resample")) {
    const int64_t resample = json_int(j["resample"], "resample", 0, 5, context);
    SW_CHECK(resample == 3, context, ": resample ", resample, " is not supported (only 3, bicubic)");
  }
  check_config(c, context);
  return c;
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels) {
  SW_CHECK(factor >= 1 && min_pixels >= 1 && max_pixels >= 1, "smart_resize: factor ", factor, ", min_pixels ",
           min_pixels, " and max_pixels ", max_pixels, " must be positive");
  SW_CHECK(height >= factor && width >= factor, "image of ", width, "x", height,
           " pixels: both sides must be at least ", factor, " (patch_size * merge_size) pixels");
  constexpr int64_t kMaxSide = int64_t{1} << 24;  // keeps height * width and the doubles below exact
  SW_CHECK(height <= kMaxSide && width <= kMaxSide, "image of ", width, "x", height, " pixels: larger than ", kMaxSide,
           " on a side");
  const double ratio = static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  SW_CHECK(ratio <= 200, "image of ", width, "x", height, " pixels: the aspect ratio ", ratio,
           " exceeds 200, the processor's limit");
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  int64_t h_bar = static_cast<int64_t>(round_half_even(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(round_half_even(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height * width) / static_cast<double>(max_pixels));
    h_bar = static_cast<int64_t>(std::floor(h / beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::floor(w / beta / f)) * factor;
    // transformers goes on with a 0 side and fails in the resize; some ports clamp to one factor instead.
    SW_CHECK(h_bar > 0 && w_bar > 0, "image of ", width, "x", height, " pixels: max_pixels ", max_pixels,
             " would shrink a side below ", factor, " pixels");
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(height * width));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

PreprocessedImage preprocess_image(const Image& image, const ImageProcessorConfig& config) {
  check_config(config, "image processor config");
  SW_CHECK(
      image.width >= 1 && image.height >= 1 && image.rgb.size() == static_cast<size_t>(image.width * image.height * 3),
      "preprocess_image: the image (", image.width, "x", image.height, ", ", image.rgb.size(),
      " bytes) is not a valid RGB image");
  const int64_t patch = config.patch_size, merge = config.merge_size, frames = config.temporal_patch_size;
  const int64_t factor = patch * merge;
  PreprocessedImage out;
  out.merge_size = merge;
  out.resized_height = image.height;
  out.resized_width = image.width;
  Image resized;
  if (config.do_resize) {
    std::tie(out.resized_height, out.resized_width) =
        smart_resize(image.height, image.width, factor, config.min_pixels, config.max_pixels);
    SW_CHECK(out.resized_height * out.resized_width <= kMaxImagePixels, "image of ", image.width, "x", image.height,
             ": resizing to ", out.resized_width, "x", out.resized_height, " exceeds ", kMaxImagePixels, " pixels");
    resized = resize_bicubic(image, out.resized_width, out.resized_height);
  } else {
    SW_CHECK(image.height % factor == 0 && image.width % factor == 0, "image of ", image.width, "x", image.height,
             ": with do_resize false both sides must be multiples of patch_size * merge_size (", factor, ")");
  }
  const Image& src = config.do_resize ? resized : image;
  const std::vector<float> planes = normalized_planes(src, config);

  out.grid_t = 1;  // one image, repeated to fill the temporal patch
  out.grid_h = out.resized_height / patch;
  out.grid_w = out.resized_width / patch;
  const int64_t width = out.resized_width, plane = out.resized_height * out.resized_width;
  const int64_t row_size = 3 * frames * patch * patch;
  out.pixel_values.resize(static_cast<size_t>(out.grid_h * out.grid_w * row_size));
  float* dst = out.pixel_values.data();
  // HF's reshape (t, T, C, h/m, m, P, w/m, m, P) and transpose (0, 3, 6, 4, 7, 2, 1, 5, 8).
  for (int64_t hb = 0; hb < out.grid_h / merge; ++hb) {
    for (int64_t wb = 0; wb < out.grid_w / merge; ++wb) {
      for (int64_t mh = 0; mh < merge; ++mh) {
        for (int64_t mw = 0; mw < merge; ++mw) {
          const int64_t y0 = (hb * merge + mh) * patch, x0 = (wb * merge + mw) * patch;
          for (int64_t c = 0; c < 3; ++c) {
            for (int64_t t = 0; t < frames; ++t) {
              for (int64_t py = 0; py < patch; ++py) {
                const float* src_row = planes.data() + c * plane + (y0 + py) * width + x0;
                for (int64_t px = 0; px < patch; ++px) *dst++ = src_row[px];
              }
            }
          }
        }
      }
    }
  }
  return out;
}

std::array<int64_t, 3> image_grid(int64_t width, int64_t height, const ImageProcessorConfig& config) {
  const int64_t factor = config.patch_size * config.merge_size;
  SW_CHECK(width > 0 && height > 0 && width <= kMaxImagePixels && height <= kMaxImagePixels, "image size ", width, "x",
           height, " is not a size an image can have");
  int64_t h = height, w = width;
  if (config.do_resize) {
    std::tie(h, w) = smart_resize(height, width, factor, config.min_pixels, config.max_pixels);
    SW_CHECK(h * w <= kMaxImagePixels, "image of ", width, "x", height, ": resizing to ", w, "x", h, " exceeds ",
             kMaxImagePixels, " pixels");
  } else {
    SW_CHECK(h % factor == 0 && w % factor == 0, "image of ", width, "x", height,
             ": with do_resize false both sides must be multiples of patch_size * merge_size (", factor, ")");
  }
  return {1, h / config.patch_size, w / config.patch_size};
}

}  // namespace shardwise

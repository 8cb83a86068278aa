// vision/resize.cpp — Pillow's bicubic resampling (libImaging/Resample.c) for 8-bit RGB. Every
// floating-point step is Pillow's, in its order, so the 22-bit weights and hence the bytes match.
#include "vision/resize.h"

#include <cmath>
#include <vector>

#include "core/error.h"

// A fused multiply-add rounds differently from Pillow's separate multiply and add, which changes
// weights in their last bit and, through the fixed-point rounding, output bytes.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace shardwise {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output position along one axis: the first input pixel, the number used, and their
// fixed-point weights (ksize slots per position, unused ones zero).
struct AxisWeights {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // (out_size, ksize)
};

// Pillow's precompute_coeffs followed by normalize_coeffs_8bpc, for the box (0, in_size).
AxisWeights axis_weights(int in_size, int out_size) {
  constexpr double kSupport = 2.0;  // bicubic
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  AxisWeights w;
  w.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  w.first.resize(out_size);
  w.count.resize(out_size);
  w.weights.assign(static_cast<size_t>(out_size) * w.ksize, 0);
  std::vector<double> k(w.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation, as Pillow's (int) cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = bicubic_filter((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    int32_t* out = &w.weights[static_cast<size_t>(xx) * w.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      out[x] = v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits))
                     : static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    w.first[xx] = xmin;
    w.count[xx] = xmax;
  }
  return w;
}

uint8_t clip8(int64_t acc) {
  if (acc >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  if (acc <= 0) return 0;
  return static_cast<uint8_t>(acc >> kPrecisionBits);
}

// One pass along x over input rows [row0, row0 + out.height).
void resample_horizontal(const Image& in, int64_t row0, const AxisWeights& w, Image& out) {
  for (int64_t y = 0; y < out.height; ++y) {
    const uint8_t* src = in.rgb.data() + static_cast<size_t>((y + row0) * in.width * 3);
    uint8_t* dst = out.rgb.data() + static_cast<size_t>(y * out.width * 3);
    for (int64_t xx = 0; xx < out.width; ++xx) {
      const int32_t* k = &w.weights[static_cast<size_t>(xx) * w.ksize];
      const uint8_t* p = src + static_cast<size_t>(w.first[xx]) * 3;
      int64_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < w.count[xx]; ++x, p += 3) {
        s0 += p[0] * int64_t{k[x]};
        s1 += p[1] * int64_t{k[x]};
        s2 += p[2] * int64_t{k[x]};
      }
      dst[3 * xx] = clip8(s0), dst[3 * xx + 1] = clip8(s1), dst[3 * xx + 2] = clip8(s2);
    }
  }
}

// One pass along y; `w.first` is relative to the first row of `in`, shifted by -row0.
void resample_vertical(const Image& in, int64_t row0, const AxisWeights& w, Image& out) {
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int64_t yy = 0; yy < out.height; ++yy) {
    const int32_t* k = &w.weights[static_cast<size_t>(yy) * w.ksize];
    const uint8_t* src = in.rgb.data() + static_cast<size_t>(w.first[yy] - row0) * stride;
    uint8_t* dst = out.rgb.data() + static_cast<size_t>(yy) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int64_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < w.count[yy]; ++y) s += src[y * stride + i] * int64_t{k[y]};
      dst[i] = clip8(s);
    }
  }
}

Image blank(int64_t width, int64_t height) {
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width * height * 3));
  return image;
}

}  // namespace

Image resize_bicubic(const Image& in, int64_t out_w, int64_t out_h) {
  SW_CHECK(in.width >= 1 && in.height >= 1 && in.width <= kMaxImageSide && in.height <= kMaxImageSide &&
               in.rgb.size() == static_cast<size_t>(in.width * in.height * 3),
           "resize_bicubic: the input image (", in.width, "x", in.height, ", ", in.rgb.size(),
           " bytes) is not a valid RGB image");
  SW_CHECK(
      out_w >= 1 && out_h >= 1 && out_w <= kMaxImageSide && out_h <= kMaxImageSide && out_w * out_h <= kMaxImagePixels,
      "resize_bicubic: cannot resize to ", out_w, "x", out_h, " (1 to ", kMaxImageSide, " a side, at most ",
      kMaxImagePixels, " pixels)");
  if (out_w == in.width && out_h == in.height) return in;  // Pillow returns a copy

  const AxisWeights horiz = axis_weights(static_cast<int>(in.width), static_cast<int>(out_w));
  const AxisWeights vert = axis_weights(static_cast<int>(in.height), static_cast<int>(out_h));
  if (out_w == in.width) {
    Image out = blank(out_w, out_h);
    resample_vertical(in, 0, vert, out);
    return out;
  }
  // The horizontal pass covers only the input rows the vertical pass will read.
  const int64_t row_first = vert.first[0];
  const int64_t row_last = vert.first[out_h - 1] + vert.count[out_h - 1];
  Image temp = blank(out_w, row_last - row_first);
  resample_horizontal(in, row_first, horiz, temp);
  if (out_h == in.height) return temp;
  Image out = blank(out_w, out_h);
  resample_vertical(temp, row_first, vert, out);
  return out;
}

}  // namespace shardwise

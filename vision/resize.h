// vision/resize.h — Pillow's bicubic resize of 8-bit RGB, byte for byte: the resize HF's image
// processors run (`PIL.Image.resize(size, Image.BICUBIC)`, no reducing_gap).
#pragma once

#include <cstdint>

#include "vision/image.h"

namespace shardwise {

// `in` resized to out_w x out_h (each 1 .. kMaxImageSide, at most kMaxImagePixels) as Pillow 9.4
// does it: a separable bicubic filter (a = -0.5) widened by the scale when shrinking, its weights
// normalised then rounded to 22-bit fixed point, the horizontal pass first. Throws Error on an
// inconsistent `in` or a bad size.
Image resize_bicubic(const Image& in, int64_t out_w, int64_t out_h);

}  // namespace shardwise

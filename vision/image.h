// vision/image.h — image files (JPEG, PNG) decoded to 8-bit RGB, pixel for pixel as Pillow's
// `Image.open(f).convert("RGB")` gives them, which is what HF's image processors see.
//
// Owns: the decoders' error handling (a corrupt, truncated or hostile file is an Error, never a crash
// or an exit) and the size limits, checked on the header before any pixel memory is allocated.
// Never: applies EXIF orientation, colour profiles or gamma (Pillow's open does none of these), or
// composites alpha (convert("RGB") drops it).
//
// What each file kind becomes (as Pillow 9.4 does it):
//   JPEG: 8-bit, 1, 3 or 4 components, baseline or progressive, libjpeg-turbo's defaults (ISLOW
//         IDCT, fancy upsampling); gray is replicated; CMYK/YCCK are read as Adobe-inverted CMYK and
//         converted with Pillow's cmyk2rgb. A file that ends before its EOI marker is refused.
//   PNG:  every colour type and depth; 16-bit samples keep the high byte, except 16-bit gray, which
//         Pillow opens as 32-bit integers and clips to 255; palettes are looked up, indices past the
//         palette's end reading gray (i, i, i) as Pillow's; tRNS and alpha are dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardwise {

struct Image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3), row-major, R G B per pixel
};

// Larger images are refused before decoding (their header is read first).
constexpr int64_t kMaxImageSide = 32768;
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;
// The largest image file load_image reads (checked before reading: a bigger file is refused, not read).
constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

// Reads and decodes a JPEG or PNG file (the format from its first bytes, not its name).
Image load_image(const std::string& path);
// Decodes a JPEG or PNG held in memory; `context` (a file name, "request image 2") starts every
// error message.
Image decode_image(const uint8_t* data, size_t size, const std::string& context);

}  // namespace shardwise

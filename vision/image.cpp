// vision/image.cpp — JPEG (libjpeg-turbo) and PNG (libpng) decoding to RGB, as Pillow does it.
// Both libraries report errors through a callback that must not return; it longjmps back to the
// function that called setjmp, so every function holding a jmp_buf keeps only trivially destructible
// locals (nothing for the jump to skip) and reports failure through its return value.
#include "vision/image.h"

#include <sys/stat.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>

// jpeglib.h uses FILE and size_t without including their headers, so it comes after <cstdio>.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "core/error.h"

namespace shardwise {
namespace {

constexpr int kMaxJpegScans = 1000;  // a progressive file with more is hostile (decode time explodes)

void check_dimensions(int64_t width, int64_t height, const std::string& context) {
  SW_CHECK(width >= 1 && height >= 1, context, ": the image is ", width, "x", height, " pixels");
  SW_CHECK(width <= kMaxImageSide && height <= kMaxImageSide && width * height <= kMaxImagePixels, context,
           ": the image is ", width, "x", height, " pixels; at most ", kMaxImageSide, " on a side and ",
           kMaxImagePixels, " pixels are accepted");
}

// ---------------------------------------------------------------- JPEG

struct JpegState {
  jpeg_error_mgr error;  // first, so that cinfo->err can be cast back to JpegState
  jpeg_progress_mgr progress;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
  bool hit_eof;  // libjpeg ran out of data and padded the rest (a truncated file)
};

JpegState* jpeg_state(j_common_ptr cinfo) {
  return reinterpret_cast<JpegState*>(cinfo->err);
}

void jpeg_on_error(j_common_ptr cinfo) {
  (*cinfo->err->format_message)(cinfo, jpeg_state(cinfo)->message);
  std::longjmp(jpeg_state(cinfo)->jump, 1);
}

// Warnings are not printed; the one that means "truncated" is remembered. Pillow also goes on after
// the others (corrupt entropy data, extraneous bytes), so they are no reason to refuse.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_state(cinfo)->hit_eof = true;
}

void jpeg_on_progress(j_common_ptr cinfo) {
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number > kMaxJpegScans) {
    std::snprintf(jpeg_state(cinfo)->message, sizeof(JpegState::message), "more than %d scans", kMaxJpegScans);
    std::longjmp(jpeg_state(cinfo)->jump, 1);
  }
}

// Creates the decompressor, reads the header and picks the output colour space Pillow asks for.
// False on a libjpeg error.
bool jpeg_read_header_raw(jpeg_decompress_struct* cinfo, JpegState* state, const uint8_t* data, size_t size) {
  if (setjmp(state->jump)) return false;
  jpeg_create_decompress(cinfo);
  cinfo->progress = &state->progress;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  // Pillow picks its mode from the component count alone: L, RGB, or CMYK read Adobe-inverted.
  if (cinfo->num_components == 1) cinfo->out_color_space = JCS_GRAYSCALE;
  if (cinfo->num_components == 3) cinfo->out_color_space = JCS_RGB;
  if (cinfo->num_components == 4) cinfo->out_color_space = JCS_CMYK;
  return true;
}

// Decodes every row into `out` (rows of width*3 bytes), then reads on to the EOI marker; `cmyk_row`
// holds one row of 4-byte pixels. False on a libjpeg error.
bool jpeg_read_pixels_raw(jpeg_decompress_struct* cinfo, JpegState* state, uint8_t* out, uint8_t* cmyk_row) {
  if (setjmp(state->jump)) return false;
  jpeg_start_decompress(cinfo);
  const size_t width = cinfo->output_width;
  while (cinfo->output_scanline < cinfo->output_height && !state->hit_eof) {
    uint8_t* row = out + size_t{cinfo->output_scanline} * width * 3;
    JSAMPROW target = cinfo->out_color_space == JCS_CMYK ? cmyk_row : row;
    jpeg_read_scanlines(cinfo, &target, 1);
    if (cinfo->out_color_space == JCS_GRAYSCALE) {
      for (size_t x = width; x-- > 0;) {  // in place, back to front
        row[3 * x] = row[3 * x + 1] = row[3 * x + 2] = row[x];
      }
    } else if (cinfo->out_color_space == JCS_CMYK) {
      // Pillow's "CMYK;I" unpacking inverts every byte; its cmyk2rgb then gives, from the inverted
      // C and K, nk = 255 - K and clip(nk - MULDIV255(C, nk)). So nk is the file's k byte.
      for (size_t x = 0; x < width; ++x) {
        const uint8_t* p = cmyk_row + 4 * x;
        const int nk = p[3];
        for (int c = 0; c < 3; ++c) {
          const int v = 255 - p[c];  // the inverted C (or M, Y)
          const int t = v * nk + 128;
          const int r = nk - (((t >> 8) + t) >> 8);
          row[3 * x + c] = static_cast<uint8_t>(r < 0 ? 0 : r > 255 ? 255 : r);
        }
      }
    }
  }
  if (!state->hit_eof) jpeg_finish_decompress(cinfo);  // reads up to EOI: Pillow refuses a file without it
  return true;
}

struct JpegDecompress {  // destroys the decompressor on every path out
  jpeg_decompress_struct cinfo{};
  ~JpegDecompress() { jpeg_destroy_decompress(&cinfo); }
};

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& context) {
  JpegState state{};
  JpegDecompress d;
  d.cinfo.err = jpeg_std_error(&state.error);
  state.error.error_exit = jpeg_on_error;
  state.error.emit_message = jpeg_on_message;
  state.progress.progress_monitor = jpeg_on_progress;

  if (!jpeg_read_header_raw(&d.cinfo, &state, data, size)) {
    fail(context, state.hit_eof ? ": the JPEG data is truncated" : ": not a readable JPEG",
         " (libjpeg: ", state.message, ")");
  }
  SW_CHECK(d.cinfo.num_components == 1 || d.cinfo.num_components == 3 || d.cinfo.num_components == 4, context,
           ": JPEG with ", d.cinfo.num_components, " components is not supported (1, 3 or 4)");
  Image image;
  image.width = d.cinfo.image_width;
  image.height = d.cinfo.image_height;
  check_dimensions(image.width, image.height, context);
  image.rgb.resize(static_cast<size_t>(image.width * image.height * 3));
  std::vector<uint8_t> cmyk_row(d.cinfo.num_components == 4 ? static_cast<size_t>(image.width) * 4 : 0);

  if (!jpeg_read_pixels_raw(&d.cinfo, &state, image.rgb.data(), cmyk_row.data())) {
    fail(context, state.hit_eof ? ": the JPEG data is truncated" : ": corrupt JPEG", " (libjpeg: ", state.message, ")");
  }
  SW_CHECK(!state.hit_eof && d.cinfo.output_scanline == d.cinfo.output_height, context,
           ": the JPEG data is truncated (the file ends before its end marker)");
  return image;
}

// ---------------------------------------------------------------- PNG

struct PngState {
  const uint8_t* data;
  size_t size;
  size_t pos;
  bool truncated;
  char message[256];
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, size_t n) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > state->size - state->pos) {
    state->truncated = true;
    png_error(png, "the file ends early");
  }
  std::memcpy(out, state->data + state->pos, n);
  state->pos += n;
}

struct PngHeader {
  png_uint_32 width, height;
  int bit_depth, color_type;
  const png_color* palette;  // PLTE, for palette images
  int palette_size;
};

bool png_read_header_raw(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  int interlace = 0, compression = 0, filter = 0;
  png_get_IHDR(png, info, &h->width, &h->height, &h->bit_depth, &h->color_type, &interlace, &compression, &filter);
  png_colorp palette = nullptr;
  h->palette_size = 0;
  if (h->color_type == PNG_COLOR_TYPE_PALETTE) png_get_PLTE(png, info, &palette, &h->palette_size);
  h->palette = palette;
  return true;
}

// Sets libpng's transformations so that its rows are either final RGB (3 bytes a pixel) or, for
// palette and 16-bit gray images, what the conversion after it needs (an index; a big-endian
// sample). Returns the bytes per pixel of libpng's rows, 0 on a libpng error.
int png_set_transforms_raw(png_structp png, png_infop info, const PngHeader& h) {
  if (setjmp(png_jmpbuf(png))) return 0;
  int pixel_bytes = 3;
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_packing(png);  // 1/2/4-bit indices to one byte each, unscaled
    pixel_bytes = 1;
  } else if (h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth == 16) {
    pixel_bytes = 2;  // Pillow clips these to 255 instead of taking the high byte
  } else {
    // Gray 1/2/4-bit scales by bit replication (v * 255, 85, 17), as Pillow's "1", "L;2", "L;4".
    if (h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (h.bit_depth == 16) png_set_strip_16(png);  // the high byte, as Pillow's ";16B" raw modes
    if (h.color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (!(h.color_type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t{h.width} * pixel_bytes) png_error(png, "unexpected row layout");
  return pixel_bytes;
}

bool png_read_rows_raw(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

struct PngRead {  // destroys libpng's structures on every path out
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngRead() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// Turns libpng's rows (palette indices or 16-bit gray) into RGB in place, last pixel first: each
// pixel's source bytes lie at or before its 3 RGB bytes.
void png_finish_rows(Image& image, const PngHeader& h, int pixel_bytes) {
  if (pixel_bytes == 3) return;
  // Pillow's palette starts as a gray ramp and PLTE overwrites its first entries.
  uint8_t lut[256][3];
  for (int i = 0; i < 256; ++i) lut[i][0] = lut[i][1] = lut[i][2] = static_cast<uint8_t>(i);
  for (int i = 0; i < h.palette_size && i < 256; ++i) {
    lut[i][0] = h.palette[i].red, lut[i][1] = h.palette[i].green, lut[i][2] = h.palette[i].blue;
  }
  const size_t width = static_cast<size_t>(image.width);
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* row = image.rgb.data() + static_cast<size_t>(y) * width * 3;
    for (size_t x = width; x-- > 0;) {
      uint8_t r, g, b;
      if (pixel_bytes == 1) {
        const uint8_t* c = lut[row[x]];
        r = c[0], g = c[1], b = c[2];
      } else {
        const int v = (row[2 * x] << 8) | row[2 * x + 1];
        r = g = b = static_cast<uint8_t>(v > 255 ? 255 : v);
      }
      row[3 * x] = r, row[3 * x + 1] = g, row[3 * x + 2] = b;
    }
  }
}

Image decode_png(const uint8_t* data, size_t size, const std::string& context) {
  PngState state{data, size, 0, false, {}};
  PngRead p;
  p.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, png_on_error, png_on_warning);
  SW_CHECK(p.png, context, ": out of memory creating the PNG reader");
  p.info = png_create_info_struct(p.png);
  SW_CHECK(p.info, context, ": out of memory creating the PNG reader");
  png_set_read_fn(p.png, &state, png_on_read);
  // Pillow refuses a bad checksum in any chunk before the image data; libpng would skip ancillary ones.
  png_set_crc_action(p.png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);

  PngHeader h{};
  if (!png_read_header_raw(p.png, p.info, &h)) {
    fail(context, state.truncated ? ": the PNG data is truncated" : ": not a readable PNG", " (libpng: ", state.message,
         ")");
  }
  Image image;
  image.width = h.width;
  image.height = h.height;
  check_dimensions(image.width, image.height, context);
  const int pixel_bytes = png_set_transforms_raw(p.png, p.info, h);
  if (pixel_bytes == 0) fail(context, ": unsupported PNG layout (libpng: ", state.message, ")");

  image.rgb.resize(static_cast<size_t>(image.width * image.height * 3));
  std::vector<png_bytep> rows(static_cast<size_t>(image.height));
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = image.rgb.data() + y * static_cast<size_t>(image.width) * 3;
  if (!png_read_rows_raw(p.png, rows.data())) {
    fail(context, state.truncated ? ": the PNG data is truncated" : ": corrupt PNG", " (libpng: ", state.message, ")");
  }
  png_finish_rows(image, h, pixel_bytes);
  return image;
}

// ---------------------------------------------------------------- format detection

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

// Names the formats people most often try, so that the message says what to do.
[[noreturn]] void fail_unknown_format(const uint8_t* data, size_t size, const std::string& context) {
  const char* known = nullptr;
  if (starts_with(data, size, "GIF8", 4)) known = "GIF";
  if (starts_with(data, size, "BM", 2)) known = "BMP";
  if (starts_with(data, size, "II*\0", 4) || starts_with(data, size, "MM\0*", 4)) known = "TIFF";
  if (size >= 12 && starts_with(data, size, "RIFF", 4) && std::memcmp(data + 8, "WEBP", 4) == 0) known = "WebP";
  if (known) fail(context, ": ", known, " images are not supported (JPEG and PNG are)");
  if (size == 0) fail(context, ": the image data is empty");
  fail(context, ": not a JPEG or PNG file (unrecognised first bytes)");
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& context) {
  if (data == nullptr) size = 0;
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n", 8)) return decode_png(data, size, context);
  if (starts_with(data, size, "\xff\xd8\xff", 3)) return decode_jpeg(data, size, context);
  fail_unknown_format(data, size, context);
}

Image load_image(const std::string& path) {
  struct stat st;
  SW_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot open the image file (", std::strerror(errno), ")");
  SW_CHECK(S_ISREG(st.st_mode), path, ": not an image file (a directory or a device)");
  const auto size = static_cast<uint64_t>(st.st_size);
  SW_CHECK(size <= kMaxImageFileBytes, path, ": ", size, " bytes, more than an image file may have (",
           kMaxImageFileBytes, ")");
  std::ifstream in(path, std::ios::binary);
  SW_CHECK(in, path, ": cannot open the image file");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  SW_CHECK(static_cast<uint64_t>(in.gcount()) == size, path, ": error reading the image file");
  return decode_image(bytes.data(), bytes.size(), path);
}

}  // namespace shardwise

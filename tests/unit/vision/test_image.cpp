// Tests for vision/image, vision/resize and vision/preprocess against the committed fixtures of
// tests/fixtures/vision, which make_fixtures.py computed with Pillow (decodes, bicubic resizes) and
// a numpy transcription of HF's Qwen2VLImageProcessor (smart_resize, pixel_values).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "test_util.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/resize.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;

namespace {

std::string vision_dir() {
  return fixtures_dir() + "/vision";
}

// The manifest's lines of one kind, split into words (the kind dropped).
std::vector<std::vector<std::string>> manifest(const std::string& kind) {
  std::ifstream in(vision_dir() + "/manifest.txt");
  REQUIRE(in);
  std::vector<std::vector<std::string>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string first, w;
    words >> first;
    if (first != kind) continue;
    out.emplace_back();
    while (words >> w) out.back().push_back(w);
  }
  return out;
}

// A (height, width, 3) uint8 .npy (numpy's '|u1', which core/npy does not read) as an Image.
Image read_npy_image(const std::string& path) {
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() >= 10);
  REQUIRE(bytes.compare(0, 6, "\x93NUMPY") == 0);
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  REQUIRE(bytes[6] == 1);
  const std::string header = bytes.substr(10, header_len);
  REQUIRE_THAT(header, Contains("'descr': '|u1'") && Contains("'fortran_order': False"));
  const size_t open = header.find("'shape': (");
  REQUIRE(open != std::string::npos);
  Image image;
  char comma = 0;
  int64_t channels = 0;
  std::istringstream shape(header.substr(open + 10));
  shape >> image.height >> comma >> image.width >> comma >> channels;
  REQUIRE(channels == 3);
  image.rgb.assign(bytes.begin() + 10 + header_len, bytes.end());
  REQUIRE(image.rgb.size() == static_cast<size_t>(image.width * image.height * 3));
  return image;
}

// Counts differing bytes and reports the first, so a failure says where.
void check_same_image(const Image& got, const Image& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.width == want.width);
  REQUIRE(got.height == want.height);
  REQUIRE(got.rgb.size() == want.rgb.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i) {
    if (got.rgb[i] != want.rgb[i] && differ++ == 0) first = i;
  }
  INFO("first difference at byte " << first << " (pixel " << first / 3 << ", channel " << first % 3 << "): got "
                                   << (differ ? int(got.rgb[first]) : 0) << ", want "
                                   << (differ ? int(want.rgb[first]) : 0));
  CHECK(differ == 0);
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  const std::string s = read_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

// Where a JPEG's frame header (SOFn) ends: mutations after it leave the image size alone, so a
// mutated file never asks for a large allocation.
size_t jpeg_after_frame_header(const std::vector<uint8_t>& d) {
  size_t i = 2;
  while (i + 4 <= d.size() && d[i] == 0xFF) {
    const uint8_t m = d[i + 1];
    const size_t len = (d[i + 2] << 8) | d[i + 3];
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) return i + 2 + len;
    i += 2 + len;
  }
  FAIL("no frame header");
  return 0;
}

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// Rewrites each PNG chunk's checksum, so that mutated bytes reach zlib and the unfiltering
// instead of stopping at the checksum.
void fix_png_checksums(std::vector<uint8_t>& d) {
  for (size_t i = 8; i + 12 <= d.size();) {
    const size_t len = (size_t{d[i]} << 24) | (d[i + 1] << 16) | (d[i + 2] << 8) | d[i + 3];
    if (len > d.size() - i - 12) return;
    const uint32_t c = crc32(&d[i + 4], len + 4);
    for (int k = 0; k < 4; ++k) d[i + 8 + len + k] = static_cast<uint8_t>(c >> (24 - 8 * k));
    i += 12 + len;
  }
}

// Decodes `data`: a shardwise::Error is fine, anything else (another exception, a crash under the
// sanitizers) fails. On success the image must be well formed and, when given, equal `full`.
void decode_or_error(const std::vector<uint8_t>& data, const Image* full, const std::string& what) {
  try {
    Image image = decode_image(data.data(), data.size(), what);
    REQUIRE(image.width >= 1);
    REQUIRE(image.height >= 1);
    REQUIRE(image.rgb.size() == static_cast<size_t>(image.width * image.height * 3));
    if (full) check_same_image(image, *full, what + " decoded anyway");
  } catch (const Error&) {
  }
}

}  // namespace

TEST_CASE("decode: every fixture equals Pillow's convert(RGB)", "[vision]") {
  const auto cases = manifest("decode");
  REQUIRE(cases.size() >= 25);
  for (const auto& c : cases) {
    const std::string file = vision_dir() + "/" + c[0];
    const Image want = read_npy_image(vision_dir() + "/" + c[1]);
    const Image got = load_image(file);
    check_same_image(got, want, c[0]);
    const std::vector<uint8_t> bytes = file_bytes(file);
    check_same_image(decode_image(bytes.data(), bytes.size(), c[0]), want, c[0] + " from memory");
  }
}

TEST_CASE("decode: bad files are refused with one line naming the file", "[vision]") {
  const auto cases = manifest("reject");
  REQUIRE(cases.size() >= 15);
  for (const auto& c : cases) {
    INFO(c[0] << " (" << c[1] << ")");
    const std::string file = vision_dir() + "/" + c[0];
    try {
      load_image(file);
      FAIL("decoded without an error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Contains(c[0]));
      CHECK(msg.find('\n') == std::string::npos);
      if (c[1] == "too_wide" || c[1] == "too_many_pixels") CHECK_THAT(msg, Contains("at most 32768 on a side"));
      if (c[1] == "truncated") CHECK_THAT(msg, Contains("truncated"));
      if (c[1] == "unsupported_format") CHECK_THAT(msg, Contains("GIF images are not supported"));
    }
  }
  CHECK_THROWS_WITH(load_image(vision_dir() + "/no_such_file.png"), Contains("cannot open"));
  // A directory or a device is refused by what it is, before anything is read from it.
  CHECK_THROWS_WITH(load_image(vision_dir()), Contains("not an image file"));
  CHECK_THROWS_WITH(load_image("/dev/zero"), Contains("/dev/zero: not an image file"));
  CHECK_THROWS_WITH(decode_image(nullptr, 0, "nothing"), Contains("nothing: the image data is empty"));
}

TEST_CASE("decode: every truncation is an error or the whole image", "[vision]") {
  for (const auto& c : manifest("decode")) {
    const std::vector<uint8_t> bytes = file_bytes(vision_dir() + "/" + c[0]);
    const Image full = read_npy_image(vision_dir() + "/" + c[1]);
    const size_t step = std::max<size_t>(1, bytes.size() / 300);
    for (size_t n = 0; n < bytes.size(); n += step) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
      decode_or_error(cut, &full, c[0] + " cut to " + std::to_string(n) + " bytes");
    }
    if (c[0].find(".jpg") != std::string::npos) {  // a JPEG needs its EOI marker, as in Pillow
      std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 1);
      CHECK_THROWS_AS(decode_image(cut.data(), cut.size(), c[0]), Error);
    }
  }
}

TEST_CASE("decode: corrupted bytes give an Error or an image, never a crash", "[vision]") {
  REQUIRE(crc32(reinterpret_cast<const uint8_t*>("123456789"), 9) == 0xCBF43926u);  // the standard check value
  std::mt19937 rng(20240611);
  for (const auto& c : manifest("decode")) {
    const std::vector<uint8_t> bytes = file_bytes(vision_dir() + "/" + c[0]);
    const bool jpeg = c[0].find(".jpg") != std::string::npos;
    const size_t lo = jpeg ? jpeg_after_frame_header(bytes) : 33;  // past a PNG's IHDR too
    REQUIRE(lo < bytes.size());
    for (int trial = 0; trial < 150; ++trial) {
      std::vector<uint8_t> bad = bytes;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[lo + rng() % (bad.size() - lo)] ^= static_cast<uint8_t>(1 + rng() % 255);
      if (!jpeg && trial % 2 == 0) fix_png_checksums(bad);
      decode_or_error(bad, nullptr, c[0] + " trial " + std::to_string(trial));
    }
  }
}

TEST_CASE("resize_bicubic equals Pillow's Image.resize(BICUBIC)", "[vision]") {
  const auto cases = manifest("resize");
  REQUIRE(cases.size() >= 20);
  for (const auto& c : cases) {
    const Image src = read_npy_image(vision_dir() + "/" + c[0]);
    const Image want = read_npy_image(vision_dir() + "/" + c[3]);
    const Image got = resize_bicubic(src, std::stoll(c[1]), std::stoll(c[2]));
    check_same_image(got, want, c[0] + " to " + c[1] + "x" + c[2]);
  }
}

TEST_CASE("resize_bicubic refuses bad sizes and inconsistent images", "[vision]") {
  Image img{4, 3, std::vector<uint8_t>(4 * 3 * 3, 7)};
  CHECK_THROWS_AS(resize_bicubic(img, 0, 3), Error);
  CHECK_THROWS_AS(resize_bicubic(img, 3, -1), Error);
  CHECK_THROWS_AS(resize_bicubic(img, kMaxImageSide + 1, 1), Error);
  CHECK_THROWS_AS(resize_bicubic(img, 20000, 20000), Error);
  img.rgb.pop_back();
  CHECK_THROWS_WITH(resize_bicubic(img, 2, 2), Contains("not a valid RGB image"));
}

TEST_CASE("smart_resize matches HF's, Python rounding included", "[vision]") {
  const auto cases = manifest("smart");
  REQUIRE(cases.size() >= 8);
  for (const auto& c : cases) {
    INFO("smart_resize(" << c[0] << ", " << c[1] << ", " << c[2] << ", " << c[3] << ", " << c[4] << ")");
    const auto got =
        smart_resize(std::stoll(c[0]), std::stoll(c[1]), std::stoll(c[2]), std::stoll(c[3]), std::stoll(c[4]));
    CHECK(got.first == std::stoll(c[5]));
    CHECK(got.second == std::stoll(c[6]));
  }
  const auto errors = manifest("smart_error");
  REQUIRE(errors.size() >= 3);
  for (const auto& c : errors) {
    INFO("smart_resize(" << c[0] << ", " << c[1] << ", " << c[2] << ", " << c[3] << ", " << c[4] << ")");
    CHECK_THROWS_AS(
        smart_resize(std::stoll(c[0]), std::stoll(c[1]), std::stoll(c[2]), std::stoll(c[3]), std::stoll(c[4])), Error);
  }
  // By hand from HF's rules: 70 / 28 = 2.5 rounds to 2 (half to even), 98 / 28 = 3.5 to 4.
  CHECK(smart_resize(70, 70, 28, 3136, 1003520) == std::make_pair<int64_t, int64_t>(56, 56));
  CHECK(smart_resize(98, 42, 28, 3136, 1003520) == std::make_pair<int64_t, int64_t>(112, 56));
  CHECK_THROWS_WITH(smart_resize(28, 5601, 28, 3136, 1003520), Contains("aspect ratio"));
  CHECK_THROWS_WITH(smart_resize(27, 100, 28, 3136, 1003520), Contains("at least 28"));
  CHECK_THROWS_WITH(smart_resize(28, 5000, 28, 3136, 3136), Contains("would shrink a side below 28"));
}

TEST_CASE("preprocess_image equals HF's pixel_values bit for bit", "[vision]") {
  const auto cases = manifest("preprocess");
  REQUIRE(cases.size() >= 3);
  for (const auto& c : cases) {
    INFO(c[0] << " with " << c[1]);
    const Image src = read_npy_image(vision_dir() + "/" + c[0]);
    const ImageProcessorConfig config = parse_preprocessor_config(read_file(vision_dir() + "/" + c[1]), c[1]);
    const PreprocessedImage got = preprocess_image(src, config);
    const NpyArray want = read_npy(vision_dir() + "/" + c[2]);
    CHECK(got.grid_t == std::stoll(c[3]));
    CHECK(got.grid_h == std::stoll(c[4]));
    CHECK(got.grid_w == std::stoll(c[5]));
    CHECK(got.resized_height == got.grid_h * config.patch_size);
    CHECK(got.resized_width == got.grid_w * config.patch_size);
    CHECK(got.n_merged_tokens() == got.grid_h * got.grid_w / (config.merge_size * config.merge_size));
    REQUIRE(want.shape.size() == 2);
    CHECK(want.shape[0] == got.grid_t * got.grid_h * got.grid_w);
    REQUIRE(got.pixel_values.size() == want.values.size());
    REQUIRE(static_cast<int64_t>(got.pixel_values.size()) == want.shape[0] * want.shape[1]);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < want.values.size(); ++i) {
      const float w = static_cast<float>(want.values[i]);  // exact: the fixture is float32
      if (std::memcmp(&w, &got.pixel_values[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    }
    INFO("first difference at " << first << ": got " << got.pixel_values[first] << ", want " << want.values[first]);
    CHECK(differ == 0);
  }
}

TEST_CASE("parse_preprocessor_config reads HF's files and refuses bad values", "[vision]") {
  const ImageProcessorConfig q =
      parse_preprocessor_config(read_file(vision_dir() + "/configs/qwen25vl_7b.json"), "qwen25vl_7b.json");
  CHECK(q.min_pixels == 3136);
  CHECK(q.max_pixels == 12845056);
  CHECK(q.patch_size == 14);
  CHECK(q.merge_size == 2);
  CHECK(q.temporal_patch_size == 2);
  CHECK(q.image_mean[0] == static_cast<float>(0.48145466));
  CHECK(q.image_std[2] == static_cast<float>(0.27577711));
  CHECK(q.rescale_factor == 1.0 / 255.0);

  const ImageProcessorConfig d = parse_preprocessor_config("{}", "empty.json");  // Qwen2VLImageProcessor's defaults
  CHECK(d.min_pixels == 56 * 56);
  CHECK(d.max_pixels == 28 * 28 * 1280);
  CHECK(d.do_resize);
  CHECK(d.do_rescale);
  CHECK(d.do_normalize);

  const auto sized = parse_preprocessor_config(
      R"({"size": {"shortest_edge": 100, "longest_edge": 5000}, "max_pixels": 4000, "image_mean": 0.5,
          "do_normalize": false, "unknown_key": [1, 2]})",
      "sized.json");
  CHECK(sized.min_pixels == 100);
  CHECK(sized.max_pixels == 4000);  // max_pixels overrides size.longest_edge, as HF does
  CHECK(sized.image_mean[1] == 0.5f);
  CHECK_FALSE(sized.do_normalize);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{", "not valid JSON"},
      {"[1]", "must be a JSON object"},
      {R"({"image_std": [0.5, 0, 0.5]})", "image_std[1]"},
      {R"({"image_mean": [0.5, 0.5]})", "'image_mean' must be a list of 3 numbers"},
      {R"({"patch_size": -14})", "'patch_size'"},
      {R"({"patch_size": 14.5})", "must be an integer"},
      {R"({"merge_size": "2"})", "'merge_size' must be an integer"},
      {R"({"min_pixels": 5000, "max_pixels": 4000})", "min_pixels 5000 and max_pixels 4000"},
      {R"({"max_pixels": 1e12})", "'max_pixels'"},
      {R"({"resample": 2})", "resample 2 is not supported"},
      {R"({"rescale_factor": -1})", "rescale_factor"},
      {R"({"do_rescale": 1})", "'do_rescale' must be true or false"},
      {R"({"size": {"height": 224, "width": 224}})", "'size' must contain 'shortest_edge'"},
  };
  for (const auto& [text, expect] : bad) {
    INFO(text);
    CHECK_THROWS_WITH(parse_preprocessor_config(text, "cfg.json"), Contains("cfg.json: ") && Contains(expect));
  }
}

TEST_CASE("preprocess_image: without resizing, sides must be multiples of the merged patch", "[vision]") {
  ImageProcessorConfig config;
  config.do_resize = false;
  Image img{56, 28, std::vector<uint8_t>(56 * 28 * 3)};
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>(i * 37 % 251);
  const PreprocessedImage p = preprocess_image(img, config);
  CHECK(p.grid_h == 2);
  CHECK(p.grid_w == 4);
  CHECK(p.n_merged_tokens() == 2);
  // Row 0, column 0 is channel 0, frame 0, the top-left pixel; the second frame repeats the first.
  const float x = static_cast<float>(img.rgb[0] * (1.0 / 255.0));
  CHECK(p.pixel_values[0] == (x - config.image_mean[0]) / config.image_std[0]);
  CHECK(p.pixel_values[14 * 14] == p.pixel_values[0]);
  img.width = 50;
  img.rgb.resize(50 * 28 * 3);
  CHECK_THROWS_WITH(preprocess_image(img, config), Contains("multiples of patch_size * merge_size (28)"));
}

// dev/vision_pin/bench.cpp — does a one-shot encode (`run --image`, `vision`) gain from pinning the
// tower's matrices for the encode, pinning included, over copying them from pageable memory?
//
// Check, then time. Per image, interleaved over rounds:
//   pageable  encode_images_on_device with the matrices where they are (what `run --image` does)
//   pin+enc   pin_vision_matrices, the same encode, unpin: the wall time of all three
//   pinned    the encode with the matrices pinned beforehand (what `serve` does; the pin not counted)
// The check: the three give the same tokens bit for bit (the same kernels; only the copies' source
// differs). Prints per image and variant the median and range of the wall times, and the pin and
// unpin times alone.
//
//   bench TOWER BUDGET ROUNDS IMAGE|WIDTHxHEIGHT...
// TOWER: an mmproj GGUF, an HF directory or synthetic:qwen2vl7b?dtype=f16&seed=1 (load_vision_tower); a
// size in place of an image file encodes seeded pixels of that image's patch grid (the time does not
// depend on the values).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "engine/run_setup.h"
#include "engine/vision_planning.h"
#include "executor/device/device.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/mmproj.h"
#include "vision/preprocess.h"
#include "vision/vision_runtime.h"
#include "vision/vl_prompt.h"

using namespace shardwise;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void unpin(Device& dev, const VisionWeights& w) {
  for (const VisionMatrix* m : vision_matrices(w)) dev.unpin_host(m->bytes.data(), m->bytes.size());
}

struct Series {
  std::vector<double> ms;
  void add(double v) { ms.push_back(v); }
  std::string text() const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    char b[96];
    std::snprintf(b, sizeof b, "%8.1f ms (%.1f-%.1f, %zu runs)", s[s.size() / 2], s.front(), s.back(), s.size());
    return b;
  }
};

// An image file preprocessed, or seeded pixels for the patch grid of an image of a size "WxH".
PreprocessedImage image_or_size(const std::string& arg, const VisionTower& t) {
  const bool size = arg.find('x') != std::string::npos && arg.find_first_not_of("0123456789x") == std::string::npos;
  if (!size) return preprocess_image(load_image(arg), t.processor);
  const std::array<int64_t, 2> wh = parse_image_size(arg, "size");
  const std::array<int64_t, 3> g = image_grid(wh[0], wh[1], t.processor);
  PreprocessedImage p;
  p.grid_t = g[0], p.grid_h = g[1], p.grid_w = g[2];
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  p.pixel_values.resize(static_cast<size_t>(g[0] * g[1] * g[2] * t.model.spec.patch_dim()));
  for (float& x : p.pixel_values) x = d(rng);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s TOWER BUDGET ROUNDS IMAGE|WIDTHxHEIGHT...\n", argv[0]);
    return 2;
  }
  try {
    const VisionTower t = load_vision_tower(argv[1]);
    const VisionModel& m = t.model;
    const uint64_t budget = parse_vram_budget(argv[2], "BUDGET");
    const int rounds = std::max(1, std::atoi(argv[3]));
    std::unique_ptr<Device> dev = make_run_device("cuda");
    uint64_t tower = 0;
    for (const VisionMatrix* x : vision_matrices(m.weights)) tower += x->bytes.size();
    std::printf("tower matrices: %.2f GB (%s)\n", tower / 1e9, dtype_name(m.weights.matrix_dtype));
    for (int i = 4; i < argc; ++i) {
      const PreprocessedImage p = image_or_size(argv[i], t);
      const std::vector<GridThw> grids = {{p.grid_t, p.grid_h, p.grid_w}};
      auto encode = [&] {
        return encode_images_on_device(*dev, m.spec, m.weights, p.pixel_values.data(), grids, budget);
      };
      // Check: the three variants' tokens, bit for bit.
      const std::vector<float> want = encode();
      pin_vision_matrices(*dev, m.weights);
      const bool same = encode() == want;
      unpin(*dev, m.weights);
      if (!same) fail(argv[i], ": the encode from pinned matrices differs from the pageable one");
      Series pageable, pin_enc, pinned, pin, unpin_ms;
      for (int r = 0; r < rounds; ++r) {
        auto t0 = Clock::now();
        encode();
        pageable.add(ms_since(t0));
        t0 = Clock::now();
        pin_vision_matrices(*dev, m.weights);
        pin.add(ms_since(t0));
        const auto t1 = Clock::now();
        encode();
        pinned.add(ms_since(t1));
        const auto t2 = Clock::now();
        unpin(*dev, m.weights);
        unpin_ms.add(ms_since(t2));
        pin_enc.add(ms_since(t0));
      }
      std::printf("%s: %lldx%lld patches\n  pageable  %s\n  pin+enc   %s\n  pinned    %s\n  (pin %s, unpin %s)\n",
                  argv[i], static_cast<long long>(p.grid_h), static_cast<long long>(p.grid_w), pageable.text().c_str(),
                  pin_enc.text().c_str(), pinned.text().c_str(), pin.text().c_str(), unpin_ms.text().c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

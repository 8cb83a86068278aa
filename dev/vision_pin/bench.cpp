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
//   bench MMPROJ.gguf|HF_DIR BUDGET ROUNDS IMAGE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "engine/run_setup.h"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MMPROJ.gguf|HF_DIR BUDGET ROUNDS IMAGE...\n", argv[0]);
    return 2;
  }
  try {
    const std::string model = argv[1];
    const bool gguf = model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0;
    const VisionModel m = gguf ? load_mmproj(model) : load_vision_model(model);
    const ImageProcessorConfig proc =
        gguf ? mmproj_image_processor(model, m.spec) : model_image_processor(model, m.spec);
    const uint64_t budget = parse_vram_budget(argv[2], "BUDGET");
    const int rounds = std::max(1, std::atoi(argv[3]));
    std::unique_ptr<Device> dev = make_run_device("cuda");
    uint64_t tower = 0;
    for (const VisionMatrix* x : vision_matrices(m.weights)) tower += x->bytes.size();
    std::printf("tower matrices: %.2f GB (%s)\n", tower / 1e9, dtype_name(m.weights.matrix_dtype));
    for (int i = 4; i < argc; ++i) {
      const PreprocessedImage p = preprocess_image(load_image(argv[i]), proc);
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

// The vision encoder on CUDA (vision_runtime.h): the whole forward pass against the CPU encoder, GPU-only
// and streamed (resident blocks and slots), on a tower with Qwen2.5-VL-7B's head_dim (80), several images
// of different grids and both window and full attention; the measured device peak within the budget; and
// the arena gone after the encode.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/thread_pool.h"
#include "executor/device/device.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/vision_runtime.h"

using namespace shardwise;

namespace {

VisionSpec head80_spec() {
  VisionSpec s;
  s.depth = 6;
  s.hidden_size = 320;  // 4 heads of 80
  s.intermediate_size = 856;
  s.num_heads = 4;
  s.out_hidden_size = 256;
  s.patch_size = 14;
  s.window_size = 112;  // 4 x 4 merged tokens
  s.fullatt_block_indexes = {2, 5};
  return s;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  REQUIRE(scale > 0);
  return err / scale;
}

}  // namespace

TEST_CASE("CUDA vision encoder: the CPU encoder's tokens, GPU-only and streamed, within the budget", "[gpu][vision]") {
  const VisionSpec s = head80_spec();
  // 1-frame images of 22 x 36 and 40 x 24 patches (several windows, uneven ones at the edges) and a 2-frame
  // one: 1,880 patches.
  const std::vector<GridThw> grids = {{1, 22, 36}, {1, 40, 24}, {2, 8, 8}};
  const std::vector<float> pix =
      test::random_floats(static_cast<size_t>(vision_patch_count(grids) * s.patch_dim()), 3, -2.0f, 2.0f);
  ThreadPool pool(4);
  const VisionInputs in = vision_inputs(s, grids);
  std::unique_ptr<Device> dev = make_cuda_device(0);
  // f32 matrices, and f16 ones as a 16-bit checkpoint keeps them (the GEMMs on tensor cores).
  for (DType t : {DType::F32, DType::F16}) {
    const VisionWeights w = random_vision_weights(s, 21, 0.05f, t);
    const std::vector<float> want = encode_images(s, w, pix.data(), grids, pool);
    const VisionPlan big = plan_vision_encoder(s, in, uint64_t(1) << 32, cuda_vision_workspace(t), t);
    const uint64_t fixed = big.activation_bytes + big.workspace_bytes + big.edge_bytes;
    for (int64_t blocks : {int64_t(6), int64_t(3), int64_t(2)}) {
      const uint64_t budget = fixed + static_cast<uint64_t>(blocks) * big.block_bytes;
      VisionRunStats st;
      const std::vector<float> got = encode_images_on_device(*dev, s, w, pix.data(), grids, budget, &st);
      INFO(dtype_name(t) << ": " << st.plan.describe() << "; peak " << st.device_peak_bytes << " of " << budget);
      CHECK(st.plan.resident_blocks == (blocks == 6 ? 6 : blocks - 2));
      CHECK(rel_diff(got, want) <= 1e-4);
      // Device memory is taken in granules of 2 MiB: the arena of the budget rounds up to one (as the
      // language runtime's check_memory allows), nothing else may be taken.
      const uint64_t g = uint64_t(2) << 20;
      CHECK(st.device_peak_bytes <= (budget + g - 1) / g * g);
    }
  }
  // No arena is left: a new one of the whole budget can be had.
  CHECK(dev->allocate_arena(uint64_t(64) << 20) != nullptr);
}

// Tests for the vision encoder's price (planner/encoder_cost.h) on the datasheet roofline: a
// Qwen2.5-VL-7B-shaped tower at a 1440p image — full attention dearer than windows, the whole encode at
// least its blocks' compute, streaming never cheaper than keeping blocks resident, and a slow link
// showing through once a block's copy outlasts its compute.
#include <catch2/catch.hpp>

#include "core/hardware_spec.h"
#include "planner/encoder_cost.h"

using namespace shardwise;

namespace {

EncoderShape tower_1440p() {
  EncoderShape s;
  s.tokens = 102 * 182;  // 1428 x 2548 pixels in 14-pixel patches
  s.hidden = 1280, s.intermediate = 3420, s.heads = 16, s.head_dim = 80;
  s.patch_dim = 1176, s.out_hidden = 3584, s.merge_unit = 4, s.mlp_chunk = 4096;
  for (int b = 0; b < 32; ++b) s.full_attention.push_back(b % 8 == 7);
  s.windows.assign(s.tokens / 64, 64);
  s.windows.push_back(s.tokens % 64);
  s.frames = {s.tokens};
  s.block_bytes = 4ull * (3 * 1280 * 1280 + 1280 * 1280 + 3 * 1280 * 3420 + 8 * 1280 + 2 * 3420);
  s.edge_bytes = 4ull * (1280 * 1176 + 2 * 5120 * 5120 + 3584 * 5120);
  return s;
}

}  // namespace

TEST_CASE("encoder cost: a 7B-shaped tower at 1440p on the datasheet roofline", "[planner][vision]") {
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  EncoderShape s = tower_1440p();
  s.resident_blocks = 32;
  const EncoderCost gpu_only = predict_encoder(*cost, s);
  CHECK(gpu_only.full_block_compute_ms > gpu_only.block_compute_ms);
  CHECK(gpu_only.predicted_ms >= 28 * gpu_only.block_compute_ms + 4 * gpu_only.full_block_compute_ms);
  CHECK(gpu_only.copy_ms > 0);
  s.resident_blocks = 0;
  const EncoderCost streamed = predict_encoder(*cost, s);
  CHECK(streamed.predicted_ms >= gpu_only.predicted_ms);

  // A link slow enough that a block's copy outlasts its compute: streaming then waits on the copies.
  auto slow = make_analytic_cost_model(builtin_hardware("h200-host"), 0.2e9);
  const EncoderCost capped = predict_encoder(*slow, s);
  REQUIRE(capped.copy_ms > capped.block_compute_ms);
  CHECK(capped.predicted_ms >= 32 * capped.copy_ms);
  CHECK(capped.predicted_ms > streamed.predicted_ms);

  // Weights copied from pageable memory (`run --image`; a server pins them): each block's copy at the
  // pageable rate, never cheaper.
  EncoderShape pageable = s;
  pageable.pinned = false;
  const EncoderCost unpinned = predict_encoder(*cost, pageable);
  CHECK(unpinned.copy_ms > 2 * streamed.copy_ms);
  CHECK(unpinned.predicted_ms >= streamed.predicted_ms);
  CHECK(unpinned.predicted_ms >= 32 * unpinned.copy_ms);

  // A small image: far less work.
  EncoderShape small = s;
  small.tokens = 34 * 60;
  small.windows.assign(small.tokens / 64, 64);
  small.frames = {small.tokens};
  CHECK(predict_encoder(*cost, small).block_compute_ms < streamed.block_compute_ms / 5);
}

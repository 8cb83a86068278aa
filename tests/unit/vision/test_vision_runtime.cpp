// Tests for the vision encoder on a device (vision_runtime.h): the plan within the budget (GPU-only,
// streamed with and without resident blocks, the MLP in pieces, a budget too small refused), and the
// encode on the emulated device — random delays and unequal queue speeds — equal to the CPU encoder's
// bits in every schedule, its arena released after; dropping the copy/compute dependencies breaks it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "core/thread_pool.h"
#include "executor/device/device.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/vision_runtime.h"
#include "vision/vl_prompt.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

// Six blocks (two of full attention), 2-pixel patches and 8-pixel windows: several windows per image.
VisionSpec runtime_spec() {
  VisionSpec s;
  s.depth = 6;
  s.hidden_size = 64;
  s.intermediate_size = 96;
  s.num_heads = 4;
  s.out_hidden_size = 48;
  s.patch_size = 2;
  s.window_size = 8;
  s.fullatt_block_indexes = {2, 5};
  return s;
}

const std::vector<GridThw> kGrids = {{1, 6, 10}, {2, 4, 4}, {1, 20, 16}};

std::vector<float> pixels(const VisionSpec& s, const std::vector<GridThw>& grids) {
  return test::random_floats(static_cast<size_t>(vision_patch_count(grids) * s.patch_dim()), 5, -2.0f, 2.0f);
}

// A budget that holds the activations (MLP piece `chunk`), the edges and `blocks` blocks.
uint64_t budget_for(const VisionPlan& p, const VisionSpec& s, const VisionInputs& in, int64_t chunk, int64_t blocks) {
  return vision_activation_bytes(s, in, chunk) + p.workspace_bytes + p.edge_bytes +
         static_cast<uint64_t>(blocks) * p.block_bytes;
}

}  // namespace

TEST_CASE("vision plan: GPU-only, streamed, MLP pieces, and a budget too small", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const VisionInputs in = vision_inputs(s, kGrids);
  const VisionPlan big = plan_vision_encoder(s, in, uint64_t(1) << 30, {}, DType::F32);
  CHECK(big.schedule() == "gpu-only");
  CHECK(big.resident_blocks == s.depth);
  CHECK(big.slots == 0);
  CHECK(big.mlp_chunk == in.n_patches);  // fewer than 4096 patches: one piece
  CHECK(big.arena_bytes == budget_for(big, s, in, in.n_patches, s.depth));

  // Room for two blocks besides everything else: every block streamed through two slots.
  const uint64_t two = budget_for(big, s, in, in.n_patches, 2);
  const VisionPlan streamed = plan_vision_encoder(s, in, two, {}, DType::F32);
  CHECK(streamed.schedule() == "streamed");
  CHECK(streamed.resident_blocks == 0);
  CHECK(streamed.slots == 2);
  CHECK(streamed.arena_bytes <= two);

  // Room for four: two resident, two slots.
  const VisionPlan mixed = plan_vision_encoder(s, in, budget_for(big, s, in, in.n_patches, 4) + 100, {}, DType::F32);
  CHECK(mixed.resident_blocks == 2);
  CHECK(mixed.slots == 2);

  // Less than two blocks' room at the full MLP: the MLP goes in pieces of 256 tokens.
  const uint64_t pieces = budget_for(big, s, in, 256, 2);
  REQUIRE(pieces < two);
  const VisionPlan small = plan_vision_encoder(s, in, pieces, {}, DType::F32);
  CHECK(small.mlp_chunk == 256);
  CHECK(small.resident_blocks == 0);
  CHECK(small.arena_bytes <= pieces);

  CHECK_THROWS_WITH(plan_vision_encoder(s, in, pieces - 1, {}, DType::F32),
                    Contains("the vision encoder needs at least") && Contains("patches"));
}

TEST_CASE("vision encoder on the emulated device: the CPU's bits in every schedule", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const VisionWeights w = random_vision_weights(s, 3, 0.1f);
  const std::vector<float> pix = pixels(s, kGrids);
  ThreadPool pool(1);  // the emulated device's kernels run on one thread (the CPU matmul's sums depend on threads)
  const std::vector<float> want = encode_images(s, w, pix.data(), kGrids, pool);
  const VisionInputs in = vision_inputs(s, kGrids);
  const VisionPlan big = plan_vision_encoder(s, in, uint64_t(1) << 30, {}, DType::F32);

  for (int64_t blocks : {int64_t(6), int64_t(4), int64_t(3), int64_t(2)}) {
    for (int speeds = 0; speeds < 3; ++speeds) {
      EmuOptions eo;
      eo.seed = static_cast<uint64_t>(10 * blocks + speeds);
      eo.max_delay_us = 100;
      if (speeds == 1) eo.queue_scale[static_cast<int>(Queue::H2D)] = 10;      // copies lag
      if (speeds == 2) eo.queue_scale[static_cast<int>(Queue::Compute)] = 10;  // compute lags
      std::unique_ptr<Device> dev = make_emu_device(eo);
      const uint64_t budget = budget_for(big, s, in, in.n_patches, blocks);
      VisionRunStats st;
      const std::vector<float> got = encode_images_on_device(*dev, s, w, pix.data(), kGrids, budget, &st);
      INFO("blocks " << blocks << ", speeds " << speeds << ": " << st.plan.describe());
      CHECK(st.plan.resident_blocks == (blocks == 6 ? 6 : blocks - 2));
      CHECK(st.device_peak_bytes <= budget);
      CHECK(got == want);
      // The arena is released: another of any size can be allocated.
      CHECK(dev->allocate_arena(budget + 4096) != nullptr);
    }
  }
}

TEST_CASE("vision plan: at most max_resident blocks resident, the CPU's bits still", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const VisionWeights w = random_vision_weights(s, 3, 0.1f);
  const std::vector<float> pix = pixels(s, kGrids);
  ThreadPool pool(1);
  const std::vector<float> want = encode_images(s, w, pix.data(), kGrids, pool);
  const VisionInputs in = vision_inputs(s, kGrids);
  const uint64_t budget = uint64_t(1) << 30;  // holds every block
  for (int64_t most : {int64_t(6), int64_t(4), int64_t(1), int64_t(0)}) {
    const VisionPlan p = plan_vision_encoder(s, in, budget, {}, DType::F32, most);
    INFO("max_resident " << most << ": " << p.describe());
    CHECK(p.resident_blocks == most);
    CHECK(p.slots == (most == s.depth ? 0 : 2));
    CHECK(p.arena_bytes <= budget);
    std::unique_ptr<Device> dev = make_emu_device(EmuOptions{});
    VisionRunStats st;
    CHECK(encode_images_on_device(*dev, s, w, pix.data(), kGrids, budget, &st, most) == want);
    CHECK(st.plan.resident_blocks == most);
  }
  // More than the budget holds: as many as fit beside the two slots.
  const VisionPlan room = plan_vision_encoder(s, in, budget, {}, DType::F32);
  const uint64_t three = room.arena_bytes - 3 * room.block_bytes;  // three blocks' room
  CHECK(plan_vision_encoder(s, in, three, {}, DType::F32, 5).resident_blocks == 1);
  CHECK_THROWS_WITH(plan_vision_encoder(s, in, budget, {}, DType::F32, -1), Contains("max_resident"));

  // A one-block tower streamed: one slot, within the budget, the CPU's bits.
  VisionSpec one = s;
  one.depth = 1;
  one.fullatt_block_indexes = {0};
  const VisionWeights w1 = random_vision_weights(one, 4, 0.1f);
  const std::vector<float> want1 = encode_images(one, w1, pix.data(), kGrids, pool);
  const VisionPlan all1 = plan_vision_encoder(one, in, budget, {}, DType::F32);
  const VisionPlan p1 = plan_vision_encoder(one, in, all1.arena_bytes, {}, DType::F32, 0);
  CHECK(p1.resident_blocks == 0);
  CHECK(p1.slots == 1);
  CHECK(p1.arena_bytes <= all1.arena_bytes);
  std::unique_ptr<Device> dev = make_emu_device(EmuOptions{});
  CHECK(encode_images_on_device(*dev, one, w1, pix.data(), kGrids, all1.arena_bytes, nullptr, 0) == want1);
}

TEST_CASE("vision encoder with 16-bit matrices: half their bytes on the device, the same encode", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const std::vector<float> pix = pixels(s, kGrids);
  ThreadPool pool(1);
  const VisionInputs in = vision_inputs(s, kGrids);
  const VisionPlan p32 = plan_vision_encoder(s, in, uint64_t(1) << 30, {}, DType::F32);
  for (DType t : {DType::F16, DType::BF16}) {
    INFO(dtype_name(t));
    const VisionWeights w = random_vision_weights(s, 3, 0.1f, t);
    CHECK(w.matrix_dtype == t);
    CHECK(w.blocks[2].gate_w.dtype == t);
    CHECK(w.blocks[2].gate_w.bytes.size() == static_cast<size_t>(2 * s.intermediate_size * s.hidden_size));
    const VisionPlan p16 = plan_vision_encoder(s, in, uint64_t(1) << 30, {}, t);
    // A block is 4 matrices of (h, 3h), (h, h), 2 x (f, h), (h, f) and 9 vectors: the matrices' half.
    const uint64_t h = 64, f = 96;
    CHECK(p32.block_bytes - p16.block_bytes == 2 * (3 * h * h + h * h + 3 * f * h));
    // The same values widened to f32 encode to the same tokens up to the sums' order; on the emulated
    // device (CPU kernels in the device's memory) the CPU encoder's bits, streamed too.
    VisionWeights wide = w;
    convert_vision_matrices(wide, DType::F32);
    CHECK(wide.blocks[2].gate_w.values() == w.blocks[2].gate_w.values());
    const std::vector<float> want = encode_images(s, w, pix.data(), kGrids, pool);
    const std::vector<float> f32 = encode_images(s, wide, pix.data(), kGrids, pool);
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(want[i] - f32[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(f32[i])));
    }
    CHECK(err <= 1e-5 * scale);
    for (int64_t blocks : {int64_t(6), int64_t(2)}) {
      std::unique_ptr<Device> dev = make_emu_device();
      const uint64_t budget = budget_for(p16, s, in, in.n_patches, blocks);
      VisionRunStats st;
      CHECK(encode_images_on_device(*dev, s, w, pix.data(), kGrids, budget, &st) == want);
      CHECK(st.plan.block_bytes == p16.block_bytes);
      CHECK(st.device_peak_bytes <= budget);
    }
    // Pinned for a server's many encodes: every matrix's bytes, in whole pages.
    std::unique_ptr<Device> pinning = make_emu_device();
    pin_vision_matrices(*pinning, w);
    uint64_t matrices = w.patch_embed.bytes.size() + w.merger_fc1_w.bytes.size() + w.merger_fc2_w.bytes.size();
    for (const VisionBlockWeights& b : w.blocks)
      matrices += b.qkv_w.bytes.size() + b.proj_w.bytes.size() + b.gate_w.bytes.size() + b.up_w.bytes.size() +
                  b.down_w.bytes.size();
    CHECK(pinning->pinned_host_bytes() >= matrices);
    // Weights whose matrices disagree on their dtype are refused, naming the tensor.
    VisionWeights mixed = w;
    mixed.blocks[1].up_w = VisionMatrix::from_values(w.blocks[1].up_w.values(), DType::F32);
    CHECK_THROWS_WITH(encode_images(s, mixed, pix.data(), kGrids, pool), Contains("blocks.1.mlp.up_proj.weight"));
  }
}

TEST_CASE("vision encoder on the emulated device: each dependency is needed", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const VisionWeights w = random_vision_weights(s, 4, 0.1f);
  const std::vector<float> pix = pixels(s, kGrids);
  ThreadPool pool(1);
  const std::vector<float> want = encode_images(s, w, pix.data(), kGrids, pool);
  const VisionInputs in = vision_inputs(s, kGrids);
  const VisionPlan big = plan_vision_encoder(s, in, uint64_t(1) << 30, {}, DType::F32);
  const uint64_t streamed = budget_for(big, s, in, in.n_patches, 2);
  // The waits in order: compute on the inputs (1) and the edge weights (2), compute on block 0's copy
  // (3), on block 1's (4), then block 2's copy on block 0's compute, the slot's previous user (5).
  struct Case {
    int drop;
    Queue slow;
  };
  for (const Case c : {Case{1, Queue::H2DAct}, Case{3, Queue::H2D}, Case{5, Queue::Compute}}) {
    bool differs = false;
    for (uint64_t seed = 1; seed <= 3 && !differs; ++seed) {
      EmuOptions eo;
      eo.seed = seed;
      eo.max_delay_us = 300;
      for (double& q : eo.queue_scale) q = 0;
      eo.queue_scale[static_cast<int>(c.slow)] = 10;
      eo.drop_wait = c.drop;
      std::unique_ptr<Device> dev = make_emu_device(eo);
      differs = encode_images_on_device(*dev, s, w, pix.data(), kGrids, streamed) != want;
    }
    INFO("dropped wait " << c.drop);
    CHECK(differs);
  }
}

TEST_CASE("vision encoder on a device: bad inputs give one error and leave no arena", "[vision][vlmopt]") {
  const VisionSpec s = runtime_spec();
  const VisionWeights w = random_vision_weights(s, 4, 0.1f);
  const std::vector<float> pix = pixels(s, kGrids);
  std::unique_ptr<Device> dev = make_emu_device();
  CHECK_THROWS_WITH(encode_images_on_device(*dev, s, w, pix.data(), {{1, 5, 10}}, uint64_t(1) << 30),
                    Contains("spatial_merge_size"));
  CHECK_THROWS_WITH(encode_images_on_device(*dev, s, w, pix.data(), kGrids, 1 << 16), Contains("needs at least"));
  VisionWeights short_w = w;
  short_w.blocks[1].qkv_b.pop_back();
  CHECK_THROWS_WITH(encode_images_on_device(*dev, s, short_w, pix.data(), kGrids, uint64_t(1) << 30),
                    Contains("blocks.1.attn.qkv.bias"));
  CHECK(dev->allocate_arena(1 << 20) != nullptr);
}

TEST_CASE("plan --image-size: the encoder's plan for images of those sizes within the budget",
          "[vision][vlmopt][cli]") {
  const std::string dir = test::fixtures_dir() + "/vl/qwen2_5_vl";
  const VisionSpec spec = vision_spec_from_hf_config(read_text_file(dir + "/config.json"), "config.json");
  const ImageProcessorConfig processor = model_image_processor(dir, spec);
  const std::vector<GridThw> grids = {image_grid(300, 200, processor), image_grid(64, 300, processor)};
  const uint64_t budget = uint64_t(10) << 20;
  const DType dtype = stored_vision_matrix_dtype(spec, dir);
  const VisionPlan want =
      plan_vision_encoder(spec, vision_inputs(spec, grids), budget, cuda_vision_workspace(dtype), dtype);
  std::string text;
  REQUIRE(test::run_command("(" + test::shardwise_bin() + " plan -m " + dir +
                                " --hw h200-host --vram-budget 10M --image-size 300x200 --image-size 64x300 --json "
                                "2>/dev/null)",
                            &text) == 0);
  INFO(text);
  const auto j = nlohmann::json::parse(text)["vision"];
  CHECK(j["patches"] == vision_patch_count(grids));
  CHECK(j["schedule"] == want.schedule());
  CHECK(j["resident_blocks"] == want.resident_blocks);
  CHECK(j["arena_bytes"] == want.arena_bytes);
  CHECK(j["arena_bytes"].get<uint64_t>() <= budget);
  CHECK(j["workspace_bytes"] == want.workspace_bytes);
  // The grid of a size equals the processor's on an image of that size.
  CHECK(grids[0] == GridThw{1, 6, 8});

  REQUIRE(test::run_command("(" + test::shardwise_bin() + " plan -m " + dir +
                                " --hw h200-host --vram-budget 10M --image-size 300by200 2>&1)",
                            &text) != 0);
  CHECK_THAT(text, Contains("expected WIDTHxHEIGHT"));
}

TEST_CASE("vision --device: a budget too small for the encoder falls back to the CPU, said once",
          "[vision][vlmopt][cli]") {
  const std::string dir = test::fixtures_dir() + "/vl/qwen2_5_vl";
  const std::string base =
      test::shardwise_bin() + " vision -m " + dir + " --image " + dir + "/images/img_300x200/image.png -t 1 --json";
  std::string cpu, small, warn;
  REQUIRE(test::run_command("(" + base + " --out " + test::temp_path("enc_cpu.npy") + " 2>/dev/null)", &cpu) == 0);
  REQUIRE(test::run_command(
              "(" + base + " --device emu --vram-budget 1M --out " + test::temp_path("enc_small.npy") + " 2>/dev/null)",
              &small) == 0);
  INFO(small);
  CHECK(nlohmann::json::parse(small)["device"] == "cpu");
  CHECK(test::load_npy_floats(test::temp_path("enc_small.npy")) ==
        test::load_npy_floats(test::temp_path("enc_cpu.npy")));
  REQUIRE(test::run_command("(" + base + " --device emu --vram-budget 1M 2>&1 >/dev/null)", &warn) == 0);
  CHECK_THAT(warn, Contains("needs at least") && Contains("encoded on the CPU"));
}

TEST_CASE("vision plan: the largest kernel workspace that fits, before resident blocks", "[vision][vlmopt]") {
  // bytes_for: per row, the 16-bit parts of a row padded to 8 halves, and 512 bytes.
  const VisionWorkspace f16 = cuda_vision_workspace(DType::F16), bf16 = cuda_vision_workspace(DType::BF16);
  CHECK(cuda_vision_workspace(DType::F32).bytes_for(100000, 5120) == f16.min_bytes);
  CHECK(f16.bytes_for(0, 1280) == f16.min_bytes);
  CHECK(f16.bytes_for(10, 1280) == f16.min_bytes + 10 * (2 * 1280 * 2 + 512));
  CHECK(f16.bytes_for(1, 1276) == f16.bytes_for(1, 1280));
  CHECK(bf16.bytes_for(10, 1280) == bf16.min_bytes + 10 * (3 * 1280 * 2 + 512));
  CHECK_THROWS_WITH(f16.bytes_for(INT64_MAX, 1280), Contains("overflow"));
  CHECK(VisionWorkspace{}.bytes_for(5000, 64) == 0);

  // 6,400 patches: MLP pieces of 4096. Every layer whole: the 6,400 rows of qkv (64 wide) are the most; no
  // layer over a piece: the 4096 rows of the MLP's down projection (96 wide).
  const VisionSpec s = runtime_spec();
  const VisionInputs in = vision_inputs(s, {{1, 80, 80}});
  REQUIRE(in.n_patches == 6400);
  const VisionWorkspace ws{uint64_t(1) << 20, 2};
  const uint64_t whole = vision_aligned_bytes(ws.bytes_for(6400, 64));
  const uint64_t capped = vision_aligned_bytes(ws.bytes_for(4096, 96));
  const uint64_t least = vision_aligned_bytes(ws.min_bytes);
  REQUIRE(whole > capped);
  const VisionPlan big = plan_vision_encoder(s, in, uint64_t(1) << 30, ws, DType::F16);
  CHECK(big.workspace_bytes == whole);
  CHECK(big.schedule() == "gpu-only");
  CHECK(big.mlp_chunk == 4096);
  const uint64_t rest = big.activation_bytes + big.edge_bytes, two = 2 * big.block_bytes;
  // The workspace comes first; then as many blocks as the rest holds (all of them: GPU-only).
  const uint64_t all = static_cast<uint64_t>(s.depth) * big.block_bytes;
  for (const auto& [budget, want_ws] : {std::pair<uint64_t, uint64_t>{rest + whole + two + big.block_bytes, whole},
                                        {rest + whole + two, whole},
                                        {rest + whole + two - 1, capped},
                                        {rest + capped + two, capped},
                                        {rest + capped + two - 1, least},
                                        {rest + least + two, least}}) {
    const VisionPlan p = plan_vision_encoder(s, in, budget, ws, DType::F16);
    INFO(p.describe() << "; workspace " << p.workspace_bytes << "; budget " << budget);
    CHECK(p.mlp_chunk == 4096);
    CHECK(p.workspace_bytes == want_ws);
    const uint64_t free = budget - rest - want_ws;
    const int64_t resident =
        free >= all ? s.depth : std::min<int64_t>(s.depth - 2, static_cast<int64_t>((free - two) / big.block_bytes));
    CHECK(p.resident_blocks == resident);
    CHECK(p.arena_bytes <= budget);
  }
  CHECK(plan_vision_encoder(s, in, rest + whole + two, ws, DType::F16).resident_blocks == 0);
  // Below the least workspace, the MLP pieces shrink; with none of them it is an error naming the bytes.
  CHECK(plan_vision_encoder(s, in, rest + least + two - 1, ws, DType::F16).mlp_chunk < 4096);
  CHECK_THROWS_WITH(plan_vision_encoder(s, in, 1 << 20, ws, DType::F16), Contains("needs at least"));
}

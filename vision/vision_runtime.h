// vision/vision_runtime.h — the vision encoder on a device within a VRAM budget (the paper's VLMOpt):
// the weights stay in host memory and go to the device as the blocks need them, the attention is tiled
// (vision_kernels.h: memory linear in the patch count), and the encoder's arena lives only for the
// encode — it is released before the language model's arena is laid out, so the peak is the larger of
// the two, not their sum.
//
// The plan: the activations of the images (vision_activations in encoder.h, the MLP taken mlp_chunk
// tokens at a time) and the patch embedding and merger weights are always in the arena; of the blocks,
// as many as fit stay for the whole encode ("resident"), the rest take turns in two slots, each copied
// while the block before it computes ("streamed"). Every block's weights cross the link once per encode
// either way, so the schedule changes memory, not the bytes copied; with every block resident it is
// GPU-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/device/device.h"
#include "executor/device/vision_kernels.h"
#include "vision/encoder.h"

namespace shardwise {

struct VisionPlan {
  int64_t n_patches = 0, depth = 0;
  int64_t mlp_chunk = 0;        // MLP tokens per piece
  int64_t resident_blocks = 0;  // blocks 0 .. resident_blocks - 1 stay for the whole encode
  int64_t slots = 0;            // slots the other blocks take turns in (0, or 2; 1 for a one-block tower)
  uint64_t budget_bytes = 0;
  uint64_t activation_bytes = 0;  // vision_activation_bytes
  uint64_t workspace_bytes = 0;   // the kernels' temporaries
  uint64_t edge_bytes = 0;        // the patch embedding and the merger's weights, as laid out
  uint64_t block_bytes = 0;       // one block's weights, as laid out
  uint64_t arena_bytes = 0;       // all of it: at most budget_bytes
  uint64_t weight_bytes() const;  // copied per encode
  std::string schedule() const { return resident_blocks == depth ? "gpu-only" : "streamed"; }
  std::string describe() const;  // one line for logs
};

// The plan for these images' inputs under budget_bytes, the kernels' temporaries as `workspace` says
// (VisionKernels::workspace) and the weights' matrices in matrix_dtype (VisionWeights::matrix_dtype): the
// MLP piece is min(n, 4096) tokens, smaller (down to 256) only where that is what fits; at each piece, the
// workspace in which every linear layer runs in one GEMM, else the one in which none runs in pieces
// smaller than an MLP piece, else the least (the workspace comes before resident blocks: every block
// crosses the link once per encode either way, while a layer cut in pieces costs launches and small GEMMs);
// then as many resident blocks as the rest holds, at most max_resident (the oracle measures the plans with
// fewer; every block resident is GPU-only, any fewer stream the others through two slots). Throws Error
// naming the bytes needed when not even the activations, the least workspace, the edge weights and two
// slots fit.
VisionPlan plan_vision_encoder(const VisionSpec& spec, const VisionInputs& in, uint64_t budget_bytes,
                               const VisionWorkspace& workspace, DType matrix_dtype, int64_t max_resident = INT64_MAX);

// Pins the tower's matrices in host memory (Device::pin_host) for an encoder that runs many times: its
// copies then run at the link's speed and without holding the host. They must stay where they are, and
// unpinned (or the device gone) before they are freed.
void pin_vision_matrices(Device& dev, const VisionWeights& w);

struct VisionRunStats {
  VisionPlan plan;
  double encode_ms = 0;            // from the arena's allocation to the tokens on the host
  uint64_t device_peak_bytes = 0;  // the device's measured peak during the encode (Device::device_peak_bytes)
};

// encode_images (encoder.h) on `device`, planned under budget_bytes: the arena is allocated for the encode
// and released before returning (also on an error). The device must hold no arena when called. The
// result is the CPU encoder's within f32 rounding (the same operations; CUDA sums in other orders).
// max_resident as in plan_vision_encoder.
std::vector<float> encode_images_on_device(Device& device, const VisionSpec& spec, const VisionWeights& weights,
                                           const float* pixel_values, const std::vector<GridThw>& grid_thw,
                                           uint64_t budget_bytes, VisionRunStats* stats = nullptr,
                                           int64_t max_resident = INT64_MAX);

// The same within an arena the caller holds on `device` (`arena_bytes` from `arena`, the budget): nothing is
// allocated or released on the device. A server keeps its encoder's arena for its life: allocating and
// releasing one per request would synchronise the whole GPU while the language model's own device works
// on it, and break the CUDA graphs it captures meanwhile. The kernels for the spec's head_dim are set up
// on first use (before the caller allocates its arena, ideally: Device::vision_kernels).
std::vector<float> encode_images_in_arena(Device& device, uint8_t* arena, uint64_t arena_bytes, const VisionSpec& spec,
                                          const VisionWeights& weights, const float* pixel_values,
                                          const std::vector<GridThw>& grid_thw, VisionRunStats* stats = nullptr);

}  // namespace shardwise

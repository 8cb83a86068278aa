// engine/vision_planning.h — a vision-language model's encoder planned for images of given sizes, as
// every caller asks it (`plan --image-size`, the Python module): the spec and processor from the model's
// HF directory, each size's patch grid, the encoder's plan within the budget on CUDA
// (vision/vision_runtime.h) and the planner's price of it (planner/encoder_cost.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"
#include "planner/encoder_cost.h"
#include "vision/vision_runtime.h"

namespace shardwise {

struct VisionPart {
  VisionPlan plan;
  EncoderCost cost;
};

// "WIDTHxHEIGHT" in pixels; throws Error naming `what` otherwise.
std::array<int64_t, 2> parse_image_size(const std::string& text, const std::string& what);

// The encoder's plan for these inputs under budget_bytes, its matrices of `dtype`, the kernels' workspace
// as `workspace` says (VisionKernels::workspace), with at most max_resident resident blocks
// (plan_vision_encoder), and its price as `run --image` runs it (weights copied from pageable memory).
// Throws Error when nothing fits.
VisionPart plan_vision_inputs(const VisionSpec& spec, const VisionInputs& in, uint64_t budget_bytes, DType dtype,
                              const VisionWorkspace& workspace, const CostModel& cost,
                              int64_t max_resident = INT64_MAX);

// The encoder of the HF directory `dir` for images of these (width, height) sizes, under budget_bytes.
// Throws Error when dir is not a vision-language model's directory or nothing fits the budget.
VisionPart plan_vision_part(const std::string& dir, const std::vector<std::array<int64_t, 2>>& sizes,
                            uint64_t budget_bytes, const CostModel& cost);

}  // namespace shardwise

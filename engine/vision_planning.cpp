// engine/vision_planning.cpp — see vision_planning.h.
#include "engine/vision_planning.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "executor/device/vision_kernels.h"
#include "vision/encoder.h"
#include "vision/vl_prompt.h"

namespace shardwise {
namespace {

std::vector<int64_t> lengths(const std::vector<int32_t>& cu) {
  std::vector<int64_t> l;
  for (size_t i = 0; i + 1 < cu.size(); ++i) l.push_back(cu[i + 1] - cu[i]);
  return l;
}

// The encoder as the planner prices it: `run --image` and `vision` copy its matrices of `dtype` from
// pageable memory (a server pins them; plan prices the one-shot run).
EncoderShape encoder_shape(const VisionSpec& spec, const VisionInputs& in, const VisionPlan& p, DType dtype) {
  EncoderShape e;
  e.dtype = dtype;
  e.pinned = false;
  e.tokens = in.n_patches;
  e.hidden = spec.hidden_size, e.intermediate = spec.intermediate_size;
  e.heads = spec.num_heads, e.head_dim = spec.head_dim();
  e.patch_dim = spec.patch_dim(), e.out_hidden = spec.out_hidden_size, e.merge_unit = spec.merge_unit();
  e.mlp_chunk = p.mlp_chunk;
  for (int64_t b = 0; b < spec.depth; ++b) e.full_attention.push_back(spec.full_attention(b));
  e.windows = lengths(in.cu_windows);
  e.frames = lengths(in.cu_frames);
  e.resident_blocks = p.resident_blocks;
  e.block_bytes = p.block_bytes;
  e.edge_bytes = p.edge_bytes;
  return e;
}

}  // namespace

std::array<int64_t, 2> parse_image_size(const std::string& text, const std::string& what) {
  long long w = 0, h = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lldx%lld%c", &w, &h, &tail) != 2)
    fail(what, " ", text, ": expected WIDTHxHEIGHT in pixels, e.g. 1920x1080");
  return {w, h};
}

VisionPart plan_vision_part(const std::string& dir, const std::vector<std::array<int64_t, 2>>& sizes, uint64_t budget,
                            const CostModel& cost) {
  const std::string config = dir + "/config.json";
  if (!std::filesystem::is_regular_file(config))
    fail(dir, " is not an HF directory of a vision-language model (no config.json)");
  SW_CHECK(!sizes.empty(), "plan_vision_part: no image sizes");
  const VisionSpec spec = vision_spec_from_hf_config(read_text_file(config), config);
  const ImageProcessorConfig processor = model_image_processor(dir, spec);
  std::vector<GridThw> grids;
  for (const auto& s : sizes) grids.push_back(image_grid(s[0], s[1], processor));
  const DType dtype = stored_vision_matrix_dtype(spec, dir);
  return plan_vision_inputs(spec, vision_inputs(spec, grids), budget, dtype, cuda_vision_workspace(dtype), cost);
}

VisionPart plan_vision_inputs(const VisionSpec& spec, const VisionInputs& in, uint64_t budget, DType dtype,
                              const VisionWorkspace& workspace, const CostModel& cost, int64_t max_resident) {
  VisionPart v;
  v.plan = plan_vision_encoder(spec, in, budget, workspace, dtype, max_resident);
  v.cost = predict_encoder(cost, encoder_shape(spec, in, v.plan, dtype));
  return v;
}

}  // namespace shardwise

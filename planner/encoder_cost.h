// planner/encoder_cost.h — the time of a vision encoder's encode on the GPU as vision/vision_runtime.h
// runs it, priced by the cost model: each block's linear layers (Matmul rows of the weights' dtype), its
// attention (VisionAttention rows: the kernel's segments of each length, every query attending its whole
// segment; a profile without them prices it from its Attention rows), norms,
// rotary and element-wise work, and the weight copies, overlapped as the runtime overlaps them (the
// resident blocks' copies queued at the start, streamed blocks' copies each waiting for the slot's
// previous user). Plain shapes in, so that the planner needs nothing of vision/.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/cost_model.h"

namespace shardwise {

struct EncoderShape {
  int64_t tokens = 0;  // patches
  int64_t hidden = 0, intermediate = 0, heads = 0, head_dim = 0, patch_dim = 0, out_hidden = 0, merge_unit = 4;
  int64_t mlp_chunk = 0;
  DType dtype = DType::F32;                  // the weights' on the device
  std::vector<bool> full_attention;          // per block
  std::vector<int64_t> windows, frames;      // segment lengths of the window and full-attention blocks
  int64_t resident_blocks = 0;               // the first ones; the others stream through two slots
  uint64_t block_bytes = 0, edge_bytes = 0;  // weights copied per block, and for the patch embedding and merger
  bool pinned = true;                        // the host weights pinned (else copied at the pageable rate)
};

struct EncoderCost {
  double block_compute_ms = 0;  // one window-attention block's compute
  double full_block_compute_ms = 0;
  double copy_ms = 0;       // one block's weights over PCIe
  double predicted_ms = 0;  // the whole encode, copies overlapped
};

EncoderCost predict_encoder(const CostModel& cost, const EncoderShape& shape);

}  // namespace shardwise

// executor/reference/reference_model.h — THE REFERENCE PATH. A readable, unoptimised forward
// pass in double precision for all three families, written for clarity, not speed: no KV cache
// (each position attends to the earlier ones directly), weights dequantised row by row, plain loops.
// Tests check the fast CPU path (and, later, every schedule on every backend) against it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight_source.h"

namespace shardwise {

// Logits [tokens.size(), vocab] (row-major) for the sequence starting at position 0.
std::vector<float> reference_logits(const WeightSource& source, const std::vector<int32_t>& tokens);
// Logits from input embeddings x [n, hidden] at positions pos3 [n, 3] (temporal, height, width: the
// spec's mrope_section picks one per rotary pair; without sections the first is the position).
std::vector<float> reference_logits_embedded(const WeightSource& source, const std::vector<float>& x,
                                             const std::vector<int64_t>& pos3);

}  // namespace shardwise

// executor/reference/reference_model.h — THE REFERENCE PATH. A readable, unoptimised forward
// pass in double precision for all three families, written for clarity, not speed: no KV cache
// (each position attends to the earlier ones directly), weights dequantised row by row, plain loops.
// Tests check the fast CPU path (and, later, every schedule on every backend) against it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/weight_source.h"

namespace shardwise {

// Logits [tokens.size(), vocab] (row-major) for the sequence starting at position 0. kv_dtype: what a
// KV cache would store — F32 (K and V kept in double), F16 or BF16 (each K row after RoPE and each V
// row after its bias rounded, as such a cache holds them; everything else stays in double) or Q8_0 (the
// same rows quantised in blocks of 32 and read back, as a q8_0 cache holds them).
std::vector<float> reference_logits(const WeightSource& source, const std::vector<int32_t>& tokens,
                                    DType kv_dtype = DType::F32);
// Logits from input embeddings x [n, hidden] at positions pos3 [n, 3] (temporal, height, width: the
// spec's mrope_section picks one per rotary pair; without sections the first is the position).
std::vector<float> reference_logits_embedded(const WeightSource& source, const std::vector<float>& x,
                                             const std::vector<int64_t>& pos3, DType kv_dtype = DType::F32);

}  // namespace shardwise

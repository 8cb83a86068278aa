// vision/encoder_reference.h — the reference of the Qwen2.5-VL vision encoder: the whole forward pass in
// f64 with plain loops and a full softmax per attention segment, step by step in the order of
// transformers' Qwen2_5_VisionTransformerPretrainedModel (patch embedding, rotary positions, window
// order, blocks, merger, input order restored). No threads, no tiling, no tricks: it exists to check
// the fast encoder (encoder.h) and is far too slow for real images.
#pragma once

#include <cstdint>
#include <vector>

#include "vision/encoder.h"
#include "vision/vision_spec.h"

namespace shardwise {

// encode_images in f64: pixel_values [N, C * T * P * P] → [N / merge^2, out_hidden_size].
std::vector<double> encode_images_reference(const VisionSpec& spec, const VisionWeights& weights,
                                            const float* pixel_values, const std::vector<GridThw>& grid_thw);

// The activation in f64 (HF's formulas).
double vision_activation_reference(VisionAct act, double x);

// Naive attention over segments: for each segment [cu[s], cu[s+1]), head and query, the scores against
// every key of the segment scaled by 1/sqrt(head_dim), a max-subtracted softmax, the weighted sum of
// the values. q, k and v rows are in_stride doubles apart, out rows out_stride.
void varlen_attention_reference(const double* q, const double* k, const double* v, int64_t in_stride, double* out,
                                int64_t out_stride, const std::vector<int64_t>& cu_seqlens, int64_t n_heads,
                                int64_t head_dim);

}  // namespace shardwise

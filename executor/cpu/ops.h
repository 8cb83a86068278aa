// executor/cpu/ops.h — element-wise and small CPU ops of a transformer step (fast path).
// Activations are f32 row-major [n_tokens, width]. Norm weights are f32 (dequantised at load).
// Each op is checked against executor/reference/ on odd sizes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"

namespace shardwise {

class ThreadPool;

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w  for each of n rows of `dim`; y may alias x.
void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n_rows, int64_t dim);

// In-place per-head RMSNorm of x [n_tokens, n_heads * head_dim] with weight w [head_dim].
void rms_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const float* w, float eps);

// cos/sin of the RoPE angles of one step's tokens, computed once and shared by every layer's Q and K.
// Angles are computed in double: position * theta^(-2i/head_dim).
struct RopeAngles {
  int64_t n_tokens = 0, half = 0;
  std::vector<float> cos, sin;  // [n_tokens, half]
  void compute(const int32_t* positions, int64_t n_tokens, int64_t head_dim, double theta);
  // Multimodal RoPE: token t's pair i turns by its position pos3[3 t + s], s the section of pair i (the
  // first sections[0] pairs temporal, the next sections[1] height, the rest width). Equal positions give
  // compute()'s table bit for bit.
  void compute_sections(const int64_t* pos3, int64_t n_tokens, int64_t head_dim, double theta,
                        const std::vector<int64_t>& sections);
};

// In-place rotary embedding of x [n_tokens, n_heads * head_dim] with the step's angles; rows are
// row_stride floats apart (0 = dense).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const RopeAngles& angles, RopeStyle style,
          int64_t row_stride = 0);

// gate[i] = silu(gate[i]) * up[i] (the ISA's vector kernel); the pool form splits long rows (a
// prefill's n·F) across its threads.
void swiglu(float* gate, const float* up, int64_t n);
void swiglu(float* gate, const float* up, int64_t n, ThreadPool& pool);

// In-place softmax over n values (max-subtracted, f32).
void softmax(float* x, int64_t n);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

// out[t] = row tokens[t] of the embedding table (any dtype), as f32. Token ids must be in range.
void embed_rows(const TensorView& table, const int32_t* tokens, int64_t n, float* out);

}  // namespace shardwise

// executor/reference/op_reference.h — the f64 reference of every op of the op table (ops/op_table.h):
// plain double-precision loops over the inputs as the kernels see them (weights through core's
// dequantize_row), written for clarity. Each returns the result and, per element, the magnitude that
// the kernels' f32 rounding is relative to, which a case's Tolerance scales. The CPU and CUDA kernel
// tests check every case against these; the benchmarks check their results before timing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/model_spec.h"
#include "executor/cpu/attention.h"
#include "executor/ops/op_table.h"

namespace shardwise {

struct OpReference {
  std::vector<double> y;    // the result
  std::vector<double> mag;  // per element: the magnitude its rounding error is relative to
};

// y[t * rows + r] = sum_c deq(W[r])[c] * x[t * ldx + c] for t < n; mag = sum_c |deq(W[r])[c] * x[t * ldx + c]|
// (a dot product's rounding grows with the magnitudes summed, not with a possibly cancelling result).
// W's rows are row_bytes apart.
OpReference reference_matmul(DType dtype, const void* w, uint64_t row_bytes, int64_t rows, int64_t cols, const float* x,
                             int64_t ldx, int64_t n);

// Causal GQA attention as attention() (cpu/attention.h) defines it: out[(t * heads + h) * head_dim + e] =
// sum_j p_j v_j[e] / l over keys j <= positions[t], p_j = exp(s_j - max s), s_j = q . k_j / sqrt(head_dim);
// q and out are [n, heads * head_dim], the caches in shape's layout. mag = sum_j p_j |v_j[e]| / l times
// 1 + max_j sum_e |q_e k_j[e]| / sqrt(head_dim): a score's rounding, relative to its magnitude, scales
// p_j by 1 + that error.
OpReference reference_attention(const float* q, int64_t n, const int32_t* positions, const float* k, const float* v,
                                const AttentionShape& shape);

// y[r * dim + i] = x / sqrt(mean(x[r]^2) + eps) * w[i]; mag = |y|.
OpReference reference_rms_norm(const float* x, const float* w, double eps, int64_t rows, int64_t dim);

// Rotary embedding of x [n, heads * head_dim] at `positions` (angle pos * theta^(-2i / head_dim)),
// pairs (i, i + head_dim / 2) for Neox, (2i, 2i + 1) for Normal; mag = |a| + |b| of the element's pair.
OpReference reference_rope(const float* x, const int32_t* positions, int64_t n, int64_t heads, int64_t head_dim,
                           double theta, RopeStyle style);

// gate[i] / (1 + exp(-gate[i])) * up[i]; mag = |y|.
OpReference reference_swiglu(const float* gate, const float* up, int64_t n);

// y[i] + a * x[i]; mag = |a * x[i]| + |y[i]|.
OpReference reference_axpy(float a, const float* x, const float* y, int64_t n);

// One element: sum_i a[i] * b[i]; mag = sum_i |a[i] * b[i]|.
OpReference reference_dot(const float* a, const float* b, int64_t n);

// core's dequantize_row, the reference of every dequantisation (compared bit for bit; mag 0).
OpReference reference_dequant(DType dtype, const void* src, int64_t n);

// |got - ref| / tol.bound(mag): <= 1 passes; a NaN result where the reference is a number, or a
// difference where the bound is 0, is infinite. Exact tolerances: 0 when equal bit for bit (NaN
// matching NaN), else infinite.
double excess(float got, double ref, double mag, const Tolerance& tol);

// Every element of got (as many as the reference has) against the reference.
struct RefCheck {
  int64_t bad = 0;        // elements with excess > 1
  int64_t first = -1;     // the first of them
  double worst = 0;       // the largest excess
  int64_t worst_at = -1;  // where
  bool ok() const { return bad == 0; }
};
RefCheck compare_to_reference(const float* got, const OpReference& ref, const Tolerance& tol);
// "element 17: got 0.25, reference 0.2500013 (tolerance 1e-06), worst excess 3.2 at 17" for messages.
std::string describe(const RefCheck& check, const float* got, const OpReference& ref, const Tolerance& tol);

}  // namespace shardwise

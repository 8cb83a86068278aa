// executor/device/vision_kernels.h — the operations of a vision encoder (a ViT block's and the patch
// merger's: linear layers with biases, RMSNorm, 2-D rotary, bidirectional attention over variable-length
// segments, gated activations, row permutations) over memory of one device. vision/encoder.h composes
// them into the Qwen2.5-VL tower once, for every device: the CPU (host memory, computed at the call), the
// emulated device and CUDA (enqueued on the device's compute queue in call order). Activations and
// accumulation are f32; weights f32, f16 or bf16. Attention never holds a score matrix larger than a
// tile: its memory is its inputs and output.
#pragma once

#include <cstdint>
#include <memory>

#include "executor/device/device.h"

namespace shardwise {

class ThreadPool;

// The MLP activation of the ViT blocks (HF's ACT2FN names: silu, gelu, gelu_pytorch_tanh, quick_gelu).
enum class VisionAct { Silu, Gelu, GeluTanh, QuickGelu };

// The largest head_dim the attention kernels take (every released vision tower: 80).
constexpr int64_t kVisionMaxHeadDim = 128;

// The device temporaries of the operations: min_bytes for any call, and for a linear layer to take its n
// rows in one GEMM, bytes_for(n, cols): room for split_parts 16-bit copies of each activation row (f32
// activations against f16 or bf16 matrices go through tensor cores as 2 or 3 parts). With less room a
// layer runs in pieces of the rows that fit: the same result (each row is computed alone), more launches
// and smaller GEMMs.
struct VisionWorkspace {
  uint64_t min_bytes = 0;
  int split_parts = 0;  // 0: a layer needs no room per row
  uint64_t bytes_for(int64_t rows, int64_t cols) const;
};

// The CUDA kernels' workspace for matrices of `matrix_dtype`: 8 MiB (cuBLAS's 2 MiB among it) and, for
// f16 and bf16 matrices, 2 or 3 parts per row. What a plan made without a device (--predict) assumes.
VisionWorkspace cuda_vision_workspace(DType matrix_dtype);

class VisionKernels {
 public:
  virtual ~VisionKernels() = default;
  // The device temporaries the operations need with matrices of `matrix_dtype` (none by default), and
  // the region they come from, given before the first call (at least min_bytes).
  virtual VisionWorkspace workspace(DType /*matrix_dtype*/) const { return {}; }
  virtual void set_workspace(uint8_t* dev, uint64_t bytes) = 0;
  // y[t * ldy + r] (+)= sum_c W[r, c] x[t * ldx + c] + bias[r], for t < n and r < w.rows (bias may be
  // null; accumulate adds to y). W is f32, f16 or bf16.
  virtual void linear(const DevMat& w, const float* bias, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                      bool accumulate) = 0;
  // y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w over n rows of dim (y may alias x).
  virtual void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim) = 0;
  // HF's rotate-half rotary, in place, on the q and k parts of n fused qkv rows ([n, 3 * n_heads *
  // head_dim]: q, k, v in turn): for each head, v[i], v[i + half] turned by the row's cos[i], sin[i]
  // (cos, sin: [n, head_dim / 2]).
  virtual void rotary(float* qkv, const float* cos, const float* sin, int64_t n, int64_t n_heads, int64_t head_dim) = 0;
  // out[t, head h] = sum_j softmax_j(q_t . k_j / sqrt(head_dim)) v_j over the keys j of t's segment, q,
  // k, v from fused qkv rows as above, out [n, n_heads * head_dim]. cu_seqlens: [n_segments + 1] int32
  // row offsets in this device's memory, from 0, non-decreasing (empty segments allowed); max_len: the
  // longest segment (the caller knows it from the host copy). head_dim a multiple of 4, at most
  // kVisionMaxHeadDim. Rows past the last offset are not touched; out must not overlap qkv.
  virtual void attention(const float* qkv, float* out, const int32_t* cu_seqlens, int64_t n_segments, int64_t max_len,
                         int64_t n_heads, int64_t head_dim) = 0;
  // gate[i] = act(gate[i]) * up[i] for i < count; with up null, gate[i] = act(gate[i]).
  virtual void activation(VisionAct act, float* gate, const float* up, int64_t count) = 0;
  // Gather (scatter false): dst row i = src row index[i]; scatter: dst row index[i] = src row i; rows i
  // < rows of `width` floats, index: int32 in this device's memory, a permutation of [0, rows).
  virtual void permute_rows(const float* src, const int32_t* index, float* dst, int64_t rows, int64_t width,
                            bool scatter) = 0;
};

// The operations on the CPU over host memory, computed at the call on `pool` (which must outlive them).
std::unique_ptr<VisionKernels> make_cpu_vision_kernels(ThreadPool& pool);

// The scalar activation (the CPU kernels and the references use it).
float vision_activation(VisionAct act, float x);

}  // namespace shardwise

// executor/cpu/vision_kernels.cpp — the vision encoder's operations (vision_kernels.h) on the CPU, over
// host memory, computed at the call on a thread pool: the executor's matmul, RMSNorm and varlen tile
// attention, and element-wise loops. Only the matmul's sums may depend on the number of threads.
#include "executor/device/vision_kernels.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/cpu/ops.h"
#include "executor/cpu/varlen_attention.h"

namespace shardwise {

float vision_activation(VisionAct act, float x) {
  switch (act) {
    case VisionAct::Silu:
      return x / (1.0f + std::exp(-x));
    case VisionAct::Gelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case VisionAct::GeluTanh:
      return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case VisionAct::QuickGelu:
      return x / (1.0f + std::exp(-1.702f * x));
  }
  return x;
}

uint64_t VisionWorkspace::bytes_for(int64_t rows, int64_t cols) const {
  SW_CHECK(rows >= 0 && cols >= 0, "VisionWorkspace: ", rows, " rows of ", cols);
  if (split_parts == 0) return min_bytes;
  // Each part of a row is padded to 8 halves; 512 bytes a row cover the GEMM's scalars and alignment.
  const uint64_t per_row = static_cast<uint64_t>(split_parts) * ((static_cast<uint64_t>(cols) + 7) / 8 * 8) * 2 + 512;
  SW_CHECK(static_cast<uint64_t>(rows) <= (UINT64_MAX - min_bytes) / per_row, "VisionWorkspace: ", rows, " rows of ",
           cols, " overflow");
  return min_bytes + static_cast<uint64_t>(rows) * per_row;
}

VisionWorkspace cuda_vision_workspace(DType matrix_dtype) {
  VisionWorkspace w;
  w.min_bytes = uint64_t(8) << 20;
  w.split_parts = matrix_dtype == DType::F16 ? 2 : matrix_dtype == DType::BF16 ? 3 : 0;
  return w;
}

namespace {

class CpuVisionKernels : public VisionKernels {
 public:
  explicit CpuVisionKernels(ThreadPool& pool) : pool_(pool) {}
  void set_workspace(uint8_t*, uint64_t) override {}  // the CPU operations keep their own temporaries

  void linear(const DevMat& w, const float* bias, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
              bool accumulate) override {
    if (n <= 0 || w.rows <= 0) return;
    const TensorView view{w.dtype, {w.rows, w.cols}, w.data, tensor_bytes(w.dtype, {w.rows, w.cols})};
    if (!accumulate) {
      matmul(view, x, ldx, n, y, ldy, pool_);
      if (bias) for_rows(n, w.rows, [&](int64_t t) { add_inplace(y + t * ldy, bias, w.rows); });
      return;
    }
    // y += W x + b: the product into a temporary, then added row by row (the order of the CPU encoder's
    // residual: W x + b first, then the residual).
    std::vector<float> tmp(static_cast<size_t>(n * w.rows));
    matmul(view, x, ldx, n, tmp.data(), w.rows, pool_);
    for_rows(n, w.rows, [&](int64_t t) {
      float* p = tmp.data() + t * w.rows;
      if (bias) add_inplace(p, bias, w.rows);
      add_inplace(y + t * ldy, p, w.rows);
    });
  }

  void rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim) override {
    for_rows(n, dim, [&](int64_t t) { shardwise::rms_norm(x + t * dim, w, eps, y + t * dim, 1, dim); });
  }

  void rotary(float* qkv, const float* cos, const float* sin, int64_t n, int64_t n_heads, int64_t head_dim) override {
    const int64_t half = head_dim / 2, width = n_heads * head_dim, stride = 3 * width;
    for_rows(n, 2 * width, [&](int64_t r) {
      const float* cs = cos + r * half;
      const float* sn = sin + r * half;
      for (int part = 0; part < 2; ++part)  // q, then k
        for (int64_t h = 0; h < n_heads; ++h) {
          float* v = qkv + r * stride + part * width + h * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const float lo = v[i], hi = v[i + half];
            v[i] = lo * cs[i] - hi * sn[i];
            v[i + half] = hi * cs[i] + lo * sn[i];
          }
        }
    });
  }

  void attention(const float* qkv, float* out, const int32_t* cu_seqlens, int64_t n_segments, int64_t max_len,
                 int64_t n_heads, int64_t head_dim) override {
    (void)max_len;
    SW_CHECK(n_segments >= 0 && head_dim % 4 == 0 && head_dim <= kVisionMaxHeadDim, "vision attention: ", n_segments,
             " segments of head_dim ", head_dim);
    const std::vector<int64_t> cu(cu_seqlens, cu_seqlens + n_segments + 1);
    VarlenAttentionShape shape;
    shape.n_heads = n_heads;
    shape.head_dim = head_dim;
    shape.q_stride = shape.kv_stride = 3 * n_heads * head_dim;
    shape.out_stride = n_heads * head_dim;
    const int64_t width = n_heads * head_dim;
    varlen_attention(qkv, qkv + width, qkv + 2 * width, out, cu, shape, pool_);
  }

  void activation(VisionAct act, float* gate, const float* up, int64_t count) override {
    if (act == VisionAct::Silu && up) return swiglu(gate, up, count, pool_);
    constexpr int64_t kGrain = 32768;
    pool_.parallel_for(count, kGrain, [&](int64_t a, int64_t b, int) {
      for (int64_t i = a; i < b; ++i) gate[i] = vision_activation(act, gate[i]) * (up ? up[i] : 1.0f);
    });
  }

  void permute_rows(const float* src, const int32_t* index, float* dst, int64_t rows, int64_t width,
                    bool scatter) override {
    for (int64_t i = 0; i < rows; ++i)
      SW_CHECK(index[i] >= 0 && index[i] < rows, "vision permute_rows: index ", index[i], " outside ", rows, " rows");
    for_rows(rows, width, [&](int64_t i) {
      const int64_t from = scatter ? i : index[i], to = scatter ? index[i] : i;
      std::copy_n(src + from * width, width, dst + to * width);
    });
  }

 private:
  // fn(row) over n rows of about `row_floats` work each, in ranges of about 32K floats.
  void for_rows(int64_t n, int64_t row_floats, const std::function<void(int64_t)>& fn) {
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_floats));
    pool_.parallel_for(n, grain, [&](int64_t a, int64_t b, int) {
      for (int64_t r = a; r < b; ++r) fn(r);
    });
  }

  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<VisionKernels> make_cpu_vision_kernels(ThreadPool& pool) {
  return std::make_unique<CpuVisionKernels>(pool);
}

}  // namespace shardwise

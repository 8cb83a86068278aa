// core/tensor.h — non-owning views of tensor data and their shapes.
// Shapes are row-major, outermost dimension first (HF/PyTorch order): a linear weight is
// {out_features, in_features}; a merged MoE expert tensor is {n_experts, out, in}. GGUF stores
// dimensions innermost first; the GGUF reader reverses them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardwise {

using Shape = std::vector<int64_t>;

inline int64_t shape_elems(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s);  // "[4096, 11520]"

// Bytes of a tensor with this shape; the innermost dimension must be a whole number of blocks.
uint64_t tensor_bytes(DType t, const Shape& s);

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;

  int64_t dim(size_t i) const { return shape.at(i); }
  int64_t rows() const {  // all dimensions but the innermost
    int64_t r = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
    return r;
  }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  uint64_t row_bytes() const { return dtype_row_bytes(dtype, cols()); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
  // Sub-view of slice i of the outermost dimension (e.g. one expert of a merged tensor).
  TensorView slice(int64_t i) const;
};

}  // namespace shardwise

// core/tensor.cpp — shape helpers.
#include "core/tensor.h"

#include "core/error.h"

namespace shardwise {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

uint64_t tensor_bytes(DType t, const Shape& s) {
  if (s.empty()) return static_cast<uint64_t>(dtype_block_bytes(t));
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) rows *= static_cast<uint64_t>(s[i]);
  return rows * dtype_row_bytes(t, s.back());
}

TensorView TensorView::slice(int64_t i) const {
  SW_CHECK(shape.size() >= 2 && i >= 0 && i < shape[0], "slice ", i, " out of range for shape ", shape_str(shape));
  TensorView v;
  v.dtype = dtype;
  v.shape.assign(shape.begin() + 1, shape.end());
  v.nbytes = tensor_bytes(dtype, v.shape);
  v.data = static_cast<const uint8_t*>(data) + static_cast<uint64_t>(i) * v.nbytes;
  return v;
}

}  // namespace shardwise

// core/npy.h — NumPy .npy files (version 1.0): write float32 arrays, read float32/int32/int64.
// Used for `shardwise logits` output and for reference fixtures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardwise {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // converted to double, C order
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads a little-endian C-order array of <f4, <f8, <i4 or <i8. Throws Error naming the file.
NpyArray read_npy(const std::string& path);

}  // namespace shardwise

// core/safetensors.h — safetensors reader (mmap): one file, or a sharded set described by
// model.safetensors.index.json. Validates the header (size, JSON, dtypes, shapes, offsets inside
// the data section, no overlaps) before exposing any tensor. Names are kept as stored (HF names);
// mapping them to canonical names is the weight source's job.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace shardwise {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;  // as stored: "F32", "F16", "BF16", ...
  Shape shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;  // which file holds it
};

class SafetensorsSet {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding either.
  explicit SafetensorsSet(const std::string& path);

  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // View with dtype F32/F16/BF16; throws naming the tensor for any other stored dtype.
  TensorView view(const SafetensorsTensor& t) const;

 private:
  void load_file(const std::string& path);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace shardwise

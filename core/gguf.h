// core/gguf.h — GGUF v3 reader (mmap) and writer, as specified by ggml's GGUF document.
// The reader validates everything it is given before trusting it: magic, version, counts against
// the file size, string/array lengths, tensor dimensions, type ids, alignment and tensor data
// ranges (inside the data section, non-overlapping). Errors name the file, the byte offset and the
// field. It never allocates memory sized by a count it has not checked against the file size.
// Model semantics (architecture keys, tensor names) are not interpreted here; see weight_source.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace shardwise {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::U32;
  uint64_t u = 0;  // unsigned integer types and bool
  int64_t i = 0;   // signed integer types
  double f = 0;    // float types
  std::string s;   // STRING
  GgufType array_type = GgufType::U8;
  std::vector<GgufValue> array;  // ARRAY

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufType::F32 || type == GgufType::F64; }
  int64_t as_int(const std::string& context) const;    // any integer type; throws otherwise
  double as_double(const std::string& context) const;  // any number
  const std::string& as_string(const std::string& context) const;
  bool as_bool(const std::string& context) const;

  static GgufValue of_u32(uint32_t v);
  static GgufValue of_i32(int32_t v);
  static GgufValue of_u64(uint64_t v);
  static GgufValue of_f32(float v);
  static GgufValue of_bool(bool v);
  static GgufValue of_string(std::string v);
  static GgufValue of_strings(const std::vector<std::string>& v);
  static GgufValue of_f32s(const std::vector<float>& v);
  static GgufValue of_i32s(const std::vector<int32_t>& v);
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type_id = 0;      // GGML type id (may be one we cannot compute with)
  std::vector<uint64_t> ne;  // GGUF order: innermost dimension first
  Shape shape;               // row-major: ne reversed
  uint64_t offset = 0;       // relative to the data section
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;  // file offset of this tensor's info record (for error messages)
};

class GgufFile {
 public:
  // Opens and validates a GGUF file. Throws Error("<path>: offset N: ...") on any problem.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // View of a tensor's bytes; throws naming the tensor when its type is not supported.
  TensorView view(const GgufTensorInfo& t) const;
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return file_->data() + data_offset_ + t.offset; }

 private:
  void check_data_section(uint64_t infos_end, uint64_t n_tensors);
  void check_tiling(const std::vector<const GgufTensorInfo*>& by_offset, uint64_t data_size) const;
  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes a GGUF v3 file. Metadata keys keep insertion order; tensors are laid out in the order
// added, each aligned. Data is copied from the views at write() time.
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}
  void set(const std::string& key, GgufValue value);
  // Adds a tensor; `shape` row-major. The view's data must stay valid until write().
  void add_tensor(const std::string& name, const TensorView& view);
  // Writes to `path` (via a temporary file renamed on success). Throws Error on I/O failure.
  void write(const std::string& path) const;

 private:
  uint64_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<std::pair<std::string, TensorView>> tensors_;
};

}  // namespace shardwise

// core/mapped_file.h — a read-only, shared memory map of a whole file (RAII).
#pragma once

#include <cstdint>
#include <string>

namespace shardwise {

class MappedFile {
 public:
  // Throws Error naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace shardwise

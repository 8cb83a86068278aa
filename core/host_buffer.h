// core/host_buffer.h — an owned, page-aligned block of host memory (anonymous mmap).
// Pages are untouched until first written, so threads that fill a buffer also place its pages.
#pragma once

#include <cstdint>

namespace shardwise {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(uint64_t bytes);  // throws Error when the memory cannot be mapped
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace shardwise

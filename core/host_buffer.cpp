// core/host_buffer.cpp — anonymous-mmap host buffer.
#include "core/host_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/size.h"

namespace shardwise {

HostBuffer::HostBuffer(uint64_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate ", format_bytes(bytes), " of host memory (", std::strerror(errno), ")");
  data_ = static_cast<uint8_t*>(p);
  // Weight buffers are streamed end to end: huge pages cut TLB misses (opt-in on many hosts).
  if (bytes >= (2u << 20)) ::madvise(p, bytes, MADV_HUGEPAGE);
}

HostBuffer::~HostBuffer() {
  if (data_) ::munmap(data_, size_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace shardwise

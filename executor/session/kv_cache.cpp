// executor/session/kv_cache.cpp — host KV cache.
#include "executor/session/kv_cache.h"

#include "core/error.h"

namespace shardwise {

KvCache::KvCache(const ModelSpec& spec, int64_t capacity, DType dtype)
    : n_layers_(spec.num_hidden_layers), kv_dim_(spec.kv_dim()), capacity_(capacity), dtype_(dtype) {
  if (capacity < 1 || capacity > (int64_t(1) << 24))
    fail("context size ", capacity, " is out of range (1 .. 16M tokens)");
  if (!is_kv_dtype(dtype)) fail("a KV cache of ", dtype_name(dtype), " is not supported (", kKvDtypeNames, ")");
  check_kv_head_dim(dtype, spec.head_dim, "KV cache");
  buffer_ = HostBuffer(static_cast<uint64_t>(n_layers_) * 2 * static_cast<uint64_t>(capacity_) * row_bytes());
}

void KvCache::set_n_past(int64_t n) {
  SW_CHECK(n >= 0 && n <= capacity_, "KV cache position ", n, " outside [0, ", capacity_, "]");
  n_past_ = n;
}

uint8_t* KvCache::base(int64_t layer, int which) {
  return buffer_.data() + static_cast<uint64_t>((layer * 2 + which) * capacity_) * row_bytes();
}

}  // namespace shardwise

// executor/session/kv_cache.cpp — host KV cache.
#include "executor/session/kv_cache.h"

#include "core/error.h"

namespace shardwise {

KvCache::KvCache(const ModelSpec& spec, int64_t capacity)
    : n_layers_(spec.num_hidden_layers), kv_dim_(spec.kv_dim()), capacity_(capacity) {
  if (capacity < 1 || capacity > (int64_t(1) << 24))
    fail("context size ", capacity, " is out of range (1 .. 16M tokens)");
  buffer_ = HostBuffer(static_cast<uint64_t>(n_layers_) * 2 * static_cast<uint64_t>(capacity_) *
                       static_cast<uint64_t>(kv_dim_) * sizeof(float));
}

void KvCache::set_n_past(int64_t n) {
  SW_CHECK(n >= 0 && n <= capacity_, "KV cache position ", n, " outside [0, ", capacity_, "]");
  n_past_ = n;
}

float* KvCache::base(int64_t layer, int which) {
  return reinterpret_cast<float*>(buffer_.data()) + ((layer * 2 + which) * capacity_) * kv_dim_;
}

}  // namespace shardwise

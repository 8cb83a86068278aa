// executor/session/kv_cache.h — the KV cache of one sequence on the host: per layer, K and V in f32
// (exact against an f32 reference), head-major: [n_kv_heads, capacity, head_dim], row j of a head
// holding position j (CpuBlocks::set_kv_capacity(capacity()) reads and writes it so).
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_buffer.h"
#include "core/model_spec.h"

namespace shardwise {

class KvCache {
 public:
  KvCache(const ModelSpec& spec, int64_t capacity_tokens);

  int64_t capacity() const { return capacity_; }
  int64_t n_past() const { return n_past_; }  // positions filled so far
  void set_n_past(int64_t n);                 // rewind or mark filled (after a step)
  int64_t kv_dim() const { return kv_dim_; }
  uint64_t bytes() const { return buffer_.size(); }

  float* k(int64_t layer) { return base(layer, 0); }
  float* v(int64_t layer) { return base(layer, 1); }
  const float* k(int64_t layer) const { return const_cast<KvCache*>(this)->base(layer, 0); }
  const float* v(int64_t layer) const { return const_cast<KvCache*>(this)->base(layer, 1); }

 private:
  float* base(int64_t layer, int which);
  int64_t n_layers_, kv_dim_, capacity_, n_past_ = 0;
  HostBuffer buffer_;
};

}  // namespace shardwise

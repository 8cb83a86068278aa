// executor/session/kv_cache.h — the KV cache of one sequence on the host: per layer, K and V stored as
// f32 (exact against an f32 reference), f16 or bf16 (half the memory; rows rounded to nearest even as
// they are written) or q8_0 (34 bytes per 32 values; each head's row quantised as it is written),
// head-major: [n_kv_heads, capacity, head_dim], row j of a head holding position j
// (CpuBlocks::set_kv_capacity(capacity()) and set_kv_dtype(dtype()) read and write it so).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/host_buffer.h"
#include "core/model_spec.h"

namespace shardwise {

class KvCache {
 public:
  // dtype: F32, F16, BF16 or Q8_0 (q8_0 needs the spec's head_dim a multiple of 32; anything else is
  // an error).
  KvCache(const ModelSpec& spec, int64_t capacity_tokens, DType dtype = DType::F32);

  int64_t capacity() const { return capacity_; }
  int64_t n_past() const { return n_past_; }  // positions filled so far
  void set_n_past(int64_t n);                 // rewind or mark filled (after a step)
  int64_t kv_dim() const { return kv_dim_; }
  DType dtype() const { return dtype_; }
  uint64_t row_bytes() const { return dtype_row_bytes(dtype_, kv_dim_); }  // one position, all KV heads
  uint64_t bytes() const { return buffer_.size(); }

  // A layer's K or V cache: capacity() * kv_dim() elements of dtype() (q8_0: in blocks of 32).
  void* k(int64_t layer) { return base(layer, 0); }
  void* v(int64_t layer) { return base(layer, 1); }
  const void* k(int64_t layer) const { return const_cast<KvCache*>(this)->base(layer, 0); }
  const void* v(int64_t layer) const { return const_cast<KvCache*>(this)->base(layer, 1); }

 private:
  uint8_t* base(int64_t layer, int which);
  int64_t n_layers_, kv_dim_, capacity_, n_past_ = 0;
  DType dtype_;
  HostBuffer buffer_;
};

}  // namespace shardwise

// executor/cpu/attention.h — causal GQA attention of new queries over a KV cache (CPU fast path).
// Keys are processed in tiles with an online softmax, so the score matrix for the whole context is
// never materialised (memory is O(tile) per thread at any context length).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace shardwise {

class ThreadPool;

struct AttentionShape {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  // The caches' layout, in elements: KV head g's row of position j starts at g * head_stride + j *
  // row_stride. 0, 0: rows of all heads side by side ([kv_len, n_kv_heads * head_dim]).
  int64_t kv_row_stride = 0;
  int64_t kv_head_stride = 0;
  // The caches' element type: F32, F16, BF16 (K and V rows are widened to f32 as they are read) or Q8_0
  // (each head's row of head_dim, a multiple of 32, in blocks; dequantised to f32 as it is read). The
  // strides then count elements as well (multiples of 32: a row starts a block).
  DType kv_dtype = DType::F32;
};

// The layout of a cache of `capacity` positions that keeps each KV head's rows contiguous
// ([n_kv_heads, capacity, head_dim]): a head's keys then stream from DRAM like one array (side by
// side, each 512-byte row of a head starts a new 4 KiB page, and decode attention of a long host
// context ran at ~40% of the read bandwidth).
AttentionShape head_major(AttentionShape s, int64_t capacity);

// q:   [n_tokens, n_heads * head_dim], already normed/roped.
// k,v: caches in shape's layout and element type holding >= kv_len positions.
// Query t (at positions[t]) attends to cache rows 0..positions[t] (which must be < kv_len).
// out: [n_tokens, n_heads * head_dim]. Scale 1/sqrt(head_dim).
void attention(const float* q, int64_t n_tokens, const int32_t* positions, const void* k, const void* v, int64_t kv_len,
               const AttentionShape& shape, float* out, ThreadPool& pool);

// One sequence of a batched call: queries [t0, t0 + n) of q (at positions[t0 ..]) over its own caches
// k, v (in the shape's layout, holding >= kv_len positions).
struct AttentionSegment {
  int64_t t0 = 0, n = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_len = 0;
};
// Every segment as attention() computes it alone (the same bits), in one pass of the pool: a batch of
// decode tokens, each over its own sequence, keeps every thread busy at once.
void attention_segments(const float* q, const int32_t* positions, const std::vector<AttentionSegment>& segments,
                        const AttentionShape& shape, float* out, ThreadPool& pool);

}  // namespace shardwise

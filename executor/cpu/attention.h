// executor/cpu/attention.h — causal GQA attention of new queries over a KV cache (CPU fast path).
// Keys are processed in tiles with an online softmax, so the score matrix for the whole context is
// never materialised (memory is O(tile) per thread at any context length).
#pragma once

#include <cstdint>

namespace shardwise {

class ThreadPool;

struct AttentionShape {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
};

// q:   [n_tokens, n_heads * head_dim], already normed/roped.
// k,v: caches [>= kv_len, n_kv_heads * head_dim]; cache row j holds position j.
// Query t (at positions[t]) attends to cache rows 0..positions[t] (which must be < kv_len).
// out: [n_tokens, n_heads * head_dim]. Scale 1/sqrt(head_dim).
void attention(const float* q, int64_t n_tokens, const int32_t* positions, const float* k, const float* v,
               int64_t kv_len, const AttentionShape& shape, float* out, ThreadPool& pool);

}  // namespace shardwise

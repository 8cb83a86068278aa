// executor/cpu/varlen_attention.h — bidirectional multi-head attention over variable-length segments (the
// vision encoder's windows and frames: tokens attend to every token of their own segment, no mask), f32
// on the CPU. Keys are taken in tiles with an online softmax (the executor's SIMD attention tile
// kernel, executor/cpu/kernels.h), so no score matrix larger than one tile is ever held: memory is
// linear in the token count (the inputs and the output) plus a fixed scratch per thread. The work is
// split over (segment, query tile, head) on the thread pool; each output row is computed by one thread
// in a fixed order, so the result does not depend on the number of threads.
#pragma once

#include <cstdint>
#include <vector>

namespace shardwise {

class ThreadPool;

// Queries per work item and keys per tile (the tile kernel's limits).
constexpr int64_t kVisionAttentionQueryTile = 64;
constexpr int64_t kVisionAttentionKeyTile = 64;

struct VarlenAttentionShape {
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  // Row strides in floats of q, of k and v (one stride for both), and of out; head h of a row starts
  // h * head_dim floats in. 0 means n_heads * head_dim (rows side by side). The encoder passes its fused
  // qkv rows (3 * hidden).
  int64_t q_stride = 0, kv_stride = 0, out_stride = 0;
};

// Scratch one varlen_attention call allocates: per thread, the scores of a tile (query tile x key tile),
// the output accumulators (query tile x head_dim) and each query's running maximum and sum, all f32,
// and per query a row pointer and a key limit (16 bytes):
//   n_threads * (4 * (QT * KT + QT * head_dim + 2 * QT) + 16 * QT) bytes   (QT, KT: the tiles above)
// — independent of the token count (37 KiB a thread for head_dim 80).
uint64_t varlen_attention_scratch_bytes(int64_t head_dim, int n_threads);

// out[t, head h] = sum_j softmax_j(q_t . k_j / sqrt(head_dim)) v_j over the keys j of t's segment, for
// every head. cu_seqlens: segment offsets in rows, cu_seqlens[0] == 0, non-decreasing (an empty segment
// is allowed); rows from the last offset on are not touched. out must not overlap q, k or v.
void varlen_attention(const float* q, const float* k, const float* v, float* out,
                      const std::vector<int64_t>& cu_seqlens, const VarlenAttentionShape& shape, ThreadPool& pool);

}  // namespace shardwise

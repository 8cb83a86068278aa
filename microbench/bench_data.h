// microbench/bench_data.h — what the CPU and GPU sides of the profiler both time on: buffers tiled
// with a valid random pattern of a dtype (non-zero values in [-1, 1), a whole number of blocks), so
// that matrices placed at block boundaries anywhere in the buffer are valid data of that dtype; and
// the one-layer model whose FFN block stands for a MoeExperts op; the expert labels that keep a timed
// MoE run's experts out of the last level cache (ExpertDeck).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/model_spec.h"
#include "core/thread_pool.h"
#include "costmodel/cost_model.h"
#include "executor/model/moe_routing.h"

namespace shardwise {

// Every shape field of an op, as a map key: the CPU and GPU runners size each op's burst from its
// previous sample under this key.
inline std::string op_shape_key(const Op& op) {
  std::string k;
  for (int64_t v : {static_cast<int64_t>(op.kind), static_cast<int64_t>(op.dtype), op.tokens, op.rows, op.cols,
                    op.n_experts, op.top_k, op.ctx, op.n_heads, op.n_kv_heads, op.head_dim, op.elems})
    k += std::to_string(v) + '/';
  return k;
}

// The pattern: 32K elements of dtype.
inline std::vector<uint8_t> random_pattern(DType dt, uint64_t seed) {
  const int64_t elems = 32 * 1024;
  std::vector<float> src(static_cast<size_t>(elems));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : src) {
    v = u(rng);
    if (v == 0.0f) v = 0.5f;
  }
  std::vector<uint8_t> pattern(dtype_row_bytes(dt, elems));
  quantize_row(dt, src.data(), pattern.data(), elems);
  return pattern;
}

inline void fill_random(DType dt, uint8_t* buf, uint64_t bytes, uint64_t seed, ThreadPool& pool) {
  const std::vector<uint8_t> pattern = random_pattern(dt, seed);
  const uint64_t pb = pattern.size();
  const int64_t tiles = static_cast<int64_t>((bytes + pb - 1) / pb);
  pool.parallel_for(tiles, 16, [&](int64_t a, int64_t b, int) {
    for (int64_t i = a; i < b; ++i) {
      const uint64_t off = static_cast<uint64_t>(i) * pb;
      std::memcpy(buf + off, pattern.data(), std::min<uint64_t>(pb, bytes - off));
    }
  });
}

// A qwen3_moe layer with the op's experts (rows = expert FFN width, cols = hidden size); its
// attention is a placeholder (one head of 32) that the MoE FFN block never touches.
inline ModelSpec moe_block_spec(const Op& op) {
  ModelSpec spec;
  spec.family = Family::Qwen3Moe;
  spec.hidden_size = op.cols;
  spec.moe_intermediate_size = op.rows;
  spec.num_experts = op.n_experts;
  spec.num_experts_per_tok = op.top_k;
  spec.num_attention_heads = 1;
  spec.num_key_value_heads = 1;
  spec.head_dim = 32;
  spec.num_hidden_layers = 1;
  spec.dtype = op.dtype;
  return spec;
}

// Which experts a timed MoE run reads, so that they come from DRAM as a real step's do (between two
// reads of one layer's experts a step passes the rest of the model). A run reads only its routed
// experts (qwen30b's decode: 8 of 128, 21 MB of a 340 MB set at q4_0): with labels drawn at random, a
// run re-reads experts that the runs before it on the same weights left in the last level cache — the
// GPU host's 300 MB L3 held enough of them that the profile timed the CPU MoE block 1.05-1.22x faster
// than the model's steps ran it. The deck relabels a
// random routing instead: the distinct experts the run routes to become the next ones of a fixed
// shuffled order of the n experts, so every expert is read once per pass over the order (with R
// replicas of the layer visited in turn, R x the set's bytes pass between two reads of one expert),
// and the routing's shape — experts per token, tokens per expert, their weights — is that of the
// random routing: the labels are symmetric.
class ExpertDeck {
 public:
  ExpertDeck(int64_t n_experts, uint64_t seed) : order_(static_cast<size_t>(n_experts)) {
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
    std::shuffle(order_.begin(), order_.end(), std::mt19937_64(seed));
  }

  // Permutes the columns of `logits` [tokens, n_experts] in place so that the routing of top_k
  // experts per token reads the next experts of the order; returns that routing.
  MoeRouting next(float* logits, int64_t tokens, int64_t top_k) {
    const int64_t n = static_cast<int64_t>(order_.size());
    const MoeRouting drawn = route_tokens(logits, tokens, n, top_k, true);
    std::vector<int32_t> to(static_cast<size_t>(n), -1);  // drawn label -> label read
    std::vector<char> taken(static_cast<size_t>(n), 0);
    int64_t d = 0;
    for (int32_t e : drawn.expert_ids)
      if (to[static_cast<size_t>(e)] < 0) {
        const int32_t p = order_[static_cast<size_t>((cursor_ + d++) % n)];
        to[static_cast<size_t>(e)] = p;
        taken[static_cast<size_t>(p)] = 1;
      }
    cursor_ = (cursor_ + d) % n;
    int32_t free = 0;  // the experts not routed to take the labels left, in order
    for (auto& t : to)
      if (t < 0) {
        while (taken[static_cast<size_t>(free)]) ++free;
        t = free++;
      }
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t t = 0; t < tokens; ++t) {
      float* l = logits + t * n;
      for (int64_t e = 0; e < n; ++e) row[static_cast<size_t>(to[static_cast<size_t>(e)])] = l[e];
      std::copy(row.begin(), row.end(), l);
    }
    return route_tokens(logits, tokens, n, top_k, true);
  }

 private:
  std::vector<int32_t> order_;
  int64_t cursor_ = 0;
};

}  // namespace shardwise

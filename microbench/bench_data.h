// microbench/bench_data.h — what the CPU and GPU sides of the profiler both time on: buffers tiled
// with a valid random pattern of a dtype (non-zero values in [-1, 1), a whole number of blocks), so
// that matrices placed at block boundaries anywhere in the buffer are valid data of that dtype; and
// the one-layer model whose FFN block stands for a MoeExperts op.
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

namespace shardwise {

// Every shape field of an op, as a map key: the CPU and GPU runners size each op's burst from its
// previous sample under this key.
inline std::string op_shape_key(const Op& op) {
  std::string k;
  for (int64_t v : {static_cast<int64_t>(op.kind), static_cast<int64_t>(op.dtype), op.tokens, op.rows, op.cols, op.n_experts,
                    op.top_k, op.ctx, op.n_heads, op.n_kv_heads, op.head_dim, op.elems})
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

}  // namespace shardwise

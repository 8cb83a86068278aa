// executor/model/cpu_model.h — the CPU fast path of a transformer step, in shard-sized blocks.
// A step takes n new tokens at given positions, appends their K/V to the cache and produces
// logits. The blocks (embed, attention, FFN/MoE, output) are the units the planner places, so a
// runtime can run any of them here while others run elsewhere. Families differ only inside the
// blocks: llama.cpp (attention + dense FFN; qwen3 adds q/k norm), qwen3_moe.cpp (routed experts).
#pragma once

#include <cstdint>
#include <vector>

#include "executor/cpu/ops.h"
#include "executor/model/model_weights.h"

namespace shardwise {

class KvCache;
class ThreadPool;

// Per-step working memory, grown on demand and reused across steps.
struct CpuScratch {
  std::vector<float> norm, q, k, v, attn, gate, up, ffn_out, router, expert_in, expert_out;
  std::vector<int32_t> positions;
  RopeAngles rope;
};

class CpuModel {
 public:
  CpuModel(const ModelWeights& weights, ThreadPool& pool);

  const ModelSpec& spec() const { return w_.spec; }

  // One step: tokens [n] at positions kv.n_past() .. +n-1. Writes logits [n, vocab] when
  // all_logits, else only the last token's [1, vocab]. Advances kv.n_past() by n.
  void forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits);

  // --- blocks (x is the residual stream [n, hidden], updated in place) ---
  void embed(const int32_t* tokens, int64_t n, float* x);
  void prepare_step(const int32_t* positions, int64_t n);  // positions and RoPE angles of the step
  void attention_block(int64_t layer, float* x, int64_t n, KvCache& kv);
  void ffn_block(int64_t layer, float* x, int64_t n);
  void output_block(const float* x, int64_t n, float* logits);  // final norm + LM head

 private:
  void dense_ffn(const LayerWeights& lw, const float* xn, int64_t n, float* out);
  void moe_ffn(const LayerWeights& lw, const float* xn, int64_t n, float* out);

  const ModelWeights& w_;
  ThreadPool& pool_;
  CpuScratch s_;
};

}  // namespace shardwise

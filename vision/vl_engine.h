// vision/vl_engine.h — a vision-language prompt's generation on the CPU: a StepEngine (the generation loop's
// interface) over the language model whose first positions are the prompt's embeddings at M-RoPE positions
// (vl_prompt.h) and whose later tokens are embedded from the vocabulary at position row + delta.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/model/cpu_model.h"
#include "executor/session/kv_cache.h"
#include "vision/vl_prompt.h"

namespace shardwise {

class VlCpuEngine : public StepEngine {
 public:
  // ctx: the KV capacity (at least the prompt's expanded length), kept as kv_dtype (f32 or f16).
  // `weights` and `pool` must outlive it.
  VlCpuEngine(const ModelWeights& weights, ThreadPool& pool, int64_t ctx, VlInput input, DType kv_dtype = DType::F32);
  const ModelSpec& spec() const override { return model_.spec(); }
  int64_t capacity() const override { return kv_.capacity(); }
  int64_t n_past_of(int slot) const override;
  // One sequence (slot 0). Positions inside the prompt must carry the prompt's ids (the image tokens'
  // rows are the encoder's, not the vocabulary's).
  void step_batch(const std::vector<SeqStep>& seqs) override;
  void truncate_slot(int slot, int64_t n_past) override;
  std::string device() const override { return "cpu"; }

  const VlInput& input() const { return in_; }
  DType kv_dtype() const { return kv_.dtype(); }

 private:
  const ModelWeights& w_;
  CpuModel model_;
  KvCache kv_;
  VlInput in_;
  std::vector<float> x_, logits_;
  std::vector<int64_t> pos3_;
};

}  // namespace shardwise

// executor/model/cpu_model.h — the whole model on the CPU: a step runs every block of cpu_blocks.h in
// order over the host weights and a host KV cache. The CPU-only path of `run` and `logits`, and the
// model the emulated and CUDA schedules are checked against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/model/cpu_blocks.h"
#include "executor/model/model_weights.h"
#include "executor/session/step_engine.h"

namespace shardwise {

class KvCache;
class ThreadPool;

class CpuModel {
 public:
  CpuModel(const ModelWeights& weights, ThreadPool& pool);

  const ModelSpec& spec() const { return w_.spec; }
  const ModelWeights& weights() const { return w_; }

  // One step: tokens [n] at positions kv.n_past() .. +n-1. Writes logits [n, vocab] when
  // all_logits, else only the last token's [1, vocab]. Advances kv.n_past() by n.
  void forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits);
  // A batched step: tokens of every segment (each a sequence in its rows of kv, step_engine.h); writes
  // each segment's last logits, logits [segments, vocab]. Leaves kv.n_past() alone (the caller keeps
  // each sequence's positions). rows [n, hidden], when given, are the step's input rows instead of the
  // tokens' embeddings.
  void forward_batch(const int32_t* tokens, const std::vector<StepSegment>& segments, KvCache& kv, float* logits,
                     const float* rows = nullptr);
  // A step from input embeddings x [n, hidden] (a vision-language prompt: text tokens' embedding rows and
  // the vision encoder's image tokens) at multimodal RoPE positions rope_pos3 [n, 3]; otherwise as
  // forward().
  void forward_embedded(const float* x, const int64_t* rope_pos3, int64_t n, KvCache& kv, float* logits,
                        bool all_logits);

  // MoE models: called with each layer's routing of each step (for statistics; must not throw).
  void set_routing_observer(std::function<void(int64_t layer, const MoeRouting&)> observer) {
    observer_ = std::move(observer);
  }
  // MoE models: called with each layer's MoE input (the residual stream after its attention, [n, hidden])
  // before its router runs (for statistics; must not throw).
  void set_moe_input_observer(std::function<void(int64_t layer, const float* x, int64_t n)> observer) {
    input_observer_ = std::move(observer);
  }

 private:
  // Embeds the step's tokens into x_ and runs every layer over them.
  void run_layers(const int32_t* tokens, const std::vector<StepSegment>& segments, KvCache& kv,
                  const float* rows = nullptr);
  // Every layer over the n rows of x_ (the step already prepared).
  void run_blocks(int64_t n, KvCache& kv);
  // Logits of a one-sequence step of n tokens: every row or the last.
  void write_logits(int64_t n, float* logits, bool all_logits);

  const ModelWeights& w_;
  ThreadPool& pool_;
  CpuBlocks blocks_;
  std::vector<float> x_, router_logits_;
  std::function<void(int64_t, const MoeRouting&)> observer_;
  std::function<void(int64_t, const float*, int64_t)> input_observer_;
};

// MoE models: the mean number of distinct experts per layer that `n` consecutive tokens are routed
// to, for each n in `counts` — measured by a CPU forward pass of `tokens` (one step) through the
// model and averaged over the layers and over the non-overlapping windows of n tokens (a count above
// tokens.size() uses all of them). What the planner needs to know how many experts a step streams;
// tokens picking experts uniformly would give E·(1−(1−k/E)^n). Empty for dense models. `fewest`, if
// given, receives for each n the same average of the layer whose windows touch the fewest experts.
std::vector<double> measure_experts_touched(const ModelWeights& weights, ThreadPool& pool,
                                            const std::vector<int32_t>& tokens, const std::vector<int64_t>& counts,
                                            std::vector<double>* fewest = nullptr);

// MoE models: how well a layer's MoE input predicts the next layer's routing — the fraction of each
// token's top-k experts at layer l + 1 that layer l + 1's router (and FFN norm) picks from layer l's MoE
// input, averaged over tokens and layer pairs, in a CPU forward pass of `tokens` (one step). What copying
// the next layer's experts ahead of its routing (speculative expert prefetch) would get right; 1 when the
// residual stream does not change between the layers' routers. NaN for dense or one-layer models.
double measure_next_layer_routing(const ModelWeights& weights, ThreadPool& pool, const std::vector<int32_t>& tokens);

// A CpuModel with its own KV cache, as a StepEngine for the generation loop: `slots` sequences share
// the ctx positions (ctx / slots each, as llama-server's -c and -np), stored as kv_dtype (f32, f16, bf16 or q8_0).
class CpuEngine : public StepEngine {
 public:
  CpuEngine(const ModelWeights& weights, ThreadPool& pool, int64_t ctx, int slots = 1, DType kv_dtype = DType::F32);
  ~CpuEngine() override;
  const ModelSpec& spec() const override { return model_.spec(); }
  int slots() const override { return slots_; }
  int64_t capacity() const override { return capacity_; }
  int64_t n_past_of(int slot) const override;
  void step_batch(const std::vector<SeqStep>& seqs) override;
  void truncate_slot(int slot, int64_t n_past) override;
  std::string device() const override { return "cpu"; }

 private:
  CpuModel model_;
  int slots_;
  int64_t capacity_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int64_t> n_past_;
  std::vector<float> logits_;
};

}  // namespace shardwise

// executor/model/cpu_blocks.h — the blocks of a transformer step on the CPU (fast path), over
// weights and KV-cache memory given by the caller: the units the planner places (attention — whole,
// or split into pre / core / post when its cache lives elsewhere —, router, FFN/MoE, output). The
// CPU-only model, the emulated device and the runtime's CPU side all run these same functions, so a
// block computes the same numbers wherever it is scheduled on the host. Families differ only inside
// the blocks: llama.cpp (attention, dense FFN; qwen3 adds q/k norm), qwen3_moe.cpp (routed experts).
#pragma once

#include <cstdint>
#include <vector>

#include "executor/cpu/ops.h"
#include "executor/model/model_weights.h"
#include "executor/model/moe_routing.h"
#include "executor/session/step_engine.h"

namespace shardwise {

class ThreadPool;

// The RoPE angles of a step's segments: token i of a segment at position pos0 + i, or at its M-RoPE
// positions where the segment has them (spec.mrope_section splits the rotary pairs; an Error for a
// model without one). Computed on the host, so the CPU and the devices turn by the same table.
RopeAngles step_rope_angles(const ModelSpec& spec, const std::vector<StepSegment>& segments);

// The input rows [n, hidden] of a step some of whose sequences bring their own (SeqStep::embeddings):
// theirs, and the token embeddings of the others, in the step's token order.
std::vector<float> step_input_rows(const std::vector<SeqStep>& seqs, const TensorView& token_embd, int64_t hidden);

class CpuBlocks {
 public:
  CpuBlocks(const ModelSpec& spec, RopeStyle rope_style, ThreadPool& pool);

  const ModelSpec& spec() const { return spec_; }
  int64_t qkv_width() const { return spec_.q_dim() + 2 * spec_.kv_dim(); }

  // The step's tokens sit at positions pos0 .. pos0 + n - 1 (computes the RoPE angles once).
  void prepare_step(int64_t pos0, int64_t n);
  // A batched step: each segment's tokens at its sequence's positions, its cache rows from its row0.
  void prepare_step(const std::vector<StepSegment>& segments);
  // One sequence at cache rows pos0 .. pos0 + n - 1 whose tokens turn by multimodal RoPE positions
  // rope_pos3 [n, 3] (temporal, height, width; spec.mrope_section splits the rotary pairs).
  void prepare_step_mrope(int64_t pos0, int64_t n, const int64_t* rope_pos3);

  // The caches' layout: capacity > 0: each KV head's rows contiguous, [n_kv_heads, capacity,
  // head_dim] (host caches: KvCache); 0 (the default): [capacity, kv_dim], the heads of a position
  // side by side (as the device caches).
  void set_kv_capacity(int64_t capacity) { kv_capacity_ = capacity; }
  // The caches' element type: F32 (the default), F16 or BF16 (K and V rows are rounded to nearest even
  // as they are stored; attention reads them back widened to f32) or Q8_0 (each head's row quantised
  // as it is stored, head_dim a multiple of 32; attention reads it back dequantised).
  void set_kv_dtype(DType dtype);
  DType kv_dtype() const { return kv_dtype_; }

  // x [n, hidden] is the residual stream, updated in place. Caches hold a segment's position j at row
  // row0 + j (of each head, or of all heads: set_kv_capacity); the step writes each segment's new
  // positions and each token attends to its own sequence's positions 0 .. pos.
  void attention(const LayerWeights& w, float* x, int64_t n, void* k_cache, void* v_cache);
  // The same, split: pre writes qkv [n, q_dim + 2 kv_dim] (normed, roped); core stores k, v in the
  // cache and writes attn [n, q_dim]; post adds the output projection to x.
  void attention_pre(const LayerWeights& w, const float* x, int64_t n, float* qkv);
  void attention_core(const float* qkv, int64_t n, void* k_cache, void* v_cache, float* attn);
  void attention_post(const LayerWeights& w, float* x, const float* attn, int64_t n);

  // MoE: router logits [n, num_experts] of the FFN-normed x.
  void router(const LayerWeights& w, const float* x, int64_t n, float* logits);
  // x += FFN(ffn_norm(x)). MoE layers need the routing of these tokens (from router logits).
  void ffn(const LayerWeights& w, float* x, int64_t n, const MoeRouting* routing);
  // MoE: out = the routed experts' weighted outputs of ffn_norm(x), over the experts `routing` names
  // (a CPU share of the layer, split_routing); x is not changed.
  void moe_share(const LayerWeights& w, const float* x, int64_t n, const MoeRouting& routing, float* out);
  // Final norm of one row + rows [r0, r1) of the LM head -> logits[r0 .. r1).
  void output(const std::vector<float>& out_norm, const TensorView& head, const float* x_row, float* logits, int64_t r0,
              int64_t r1);
  // The same for `count` rows of x ([n, hidden]): x rows rows[i] -> logits + i * ld (one pass over the
  // head for all of them).
  void output_rows(const std::vector<float>& out_norm, const TensorView& head, const float* x, const int64_t* rows,
                   int64_t count, float* logits, int64_t ld, int64_t r0, int64_t r1);

 private:
  void dense_ffn(const LayerWeights& w, const float* xn, int64_t n, float* out);
  void moe_ffn(const LayerWeights& w, const float* xn, int64_t n, const MoeRouting& routing, float* out);
  void moe_ffn_decode(const LayerWeights& w, const float* xn, int64_t n, const MoeRouting& routing, float* out);

  ModelSpec spec_;
  RopeStyle rope_;
  ThreadPool& pool_;
  std::vector<StepSegment> segments_;
  int64_t kv_capacity_ = 0;  // > 0: head-major caches of this many positions
  DType kv_dtype_ = DType::F32;
  std::vector<int32_t> positions_;
  RopeAngles angles_;
  std::vector<float> norm_, qkv_, attn_, out_, gate_, up_, expert_in_, expert_out_;
};

}  // namespace shardwise

// executor/model/cpu_model.cpp — step driver and output block of the CPU fast path.
#include "executor/model/cpu_model.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/session/kv_cache.h"

namespace shardwise {

CpuModel::CpuModel(const ModelWeights& weights, ThreadPool& pool) : w_(weights), pool_(pool) {}

void CpuModel::embed(const int32_t* tokens, int64_t n, float* x) { embed_rows(w_.token_embd, tokens, n, x); }

void CpuModel::prepare_step(const int32_t* positions, int64_t n) {
  s_.positions.assign(positions, positions + n);
  s_.rope.compute(positions, n, w_.spec.head_dim, w_.spec.rope_theta);
}

void CpuModel::output_block(const float* x, int64_t n, float* logits) {
  const int64_t H = w_.spec.hidden_size;
  s_.norm.resize(static_cast<size_t>(n * H));
  rms_norm(x, w_.output_norm.data(), static_cast<float>(w_.spec.rms_norm_eps), s_.norm.data(), n, H);
  matmul(w_.output, s_.norm.data(), H, n, logits, w_.spec.vocab_size, pool_);
}

void CpuModel::ffn_block(int64_t layer, float* x, int64_t n) {
  const LayerWeights& lw = w_.layers.at(static_cast<size_t>(layer));
  const int64_t H = w_.spec.hidden_size;
  s_.norm.resize(static_cast<size_t>(n * H));
  s_.ffn_out.resize(static_cast<size_t>(n * H));
  rms_norm(x, lw.ffn_norm.data(), static_cast<float>(w_.spec.rms_norm_eps), s_.norm.data(), n, H);
  if (w_.spec.is_moe()) moe_ffn(lw, s_.norm.data(), n, s_.ffn_out.data());
  else dense_ffn(lw, s_.norm.data(), n, s_.ffn_out.data());
  add_inplace(x, s_.ffn_out.data(), n * H);
}

void CpuModel::forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits) {
  SW_CHECK(n >= 1, "forward: empty step");
  SW_CHECK(kv.n_past() + n <= kv.capacity(), "the context is full: ", kv.n_past(), " + ", n,
           " tokens exceed the KV capacity of ", kv.capacity(), " (raise --ctx)");
  const int64_t H = w_.spec.hidden_size;
  std::vector<float> x(static_cast<size_t>(n * H));
  embed(tokens, n, x.data());
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(kv.n_past() + i);
  prepare_step(positions.data(), n);
  for (int64_t l = 0; l < w_.spec.num_hidden_layers; ++l) {
    attention_block(l, x.data(), n, kv);
    ffn_block(l, x.data(), n);
  }
  kv.set_n_past(kv.n_past() + n);
  if (all_logits) output_block(x.data(), n, logits);
  else output_block(x.data() + (n - 1) * H, 1, logits);
}

}  // namespace shardwise

// executor/model/cpu_model.cpp — the CPU-only step driver (see cpu_model.h).
#include "executor/model/cpu_model.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/session/kv_cache.h"

namespace shardwise {

CpuModel::CpuModel(const ModelWeights& weights, ThreadPool& pool)
    : w_(weights), pool_(pool), blocks_(weights.spec, weights.rope_style, pool) {}

void CpuModel::forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits) {
  SW_CHECK(n >= 1, "forward: empty step");
  SW_CHECK(kv.n_past() + n <= kv.capacity(), "the context is full: ", kv.n_past(), " + ", n,
           " tokens exceed the KV capacity of ", kv.capacity(), " (raise --ctx)");
  const ModelSpec& sp = w_.spec;
  const int64_t H = sp.hidden_size;
  x_.resize(static_cast<size_t>(n * H));
  embed_rows(w_.token_embd, tokens, n, x_.data());
  blocks_.prepare_step(kv.n_past(), n);
  for (int64_t l = 0; l < sp.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    blocks_.attention(lw, x_.data(), n, kv.k(l), kv.v(l));
    if (sp.is_moe()) {
      router_logits_.resize(static_cast<size_t>(n * sp.num_experts));
      blocks_.router(lw, x_.data(), n, router_logits_.data());
      const MoeRouting r = route_tokens(router_logits_.data(), n, sp.num_experts, sp.num_experts_per_tok, sp.norm_topk_prob);
      blocks_.ffn(lw, x_.data(), n, &r);
    } else {
      blocks_.ffn(lw, x_.data(), n, nullptr);
    }
  }
  kv.set_n_past(kv.n_past() + n);
  const int64_t V = sp.vocab_size;
  if (all_logits) {
    for (int64_t t = 0; t < n; ++t) blocks_.output(w_.output_norm, w_.output, x_.data() + t * H, logits + t * V, 0, V);
  } else {
    blocks_.output(w_.output_norm, w_.output, x_.data() + (n - 1) * H, logits, 0, V);
  }
}

CpuEngine::CpuEngine(const ModelWeights& weights, ThreadPool& pool, int64_t ctx)
    : model_(weights, pool), kv_(std::make_unique<KvCache>(weights.spec, ctx)) {}
CpuEngine::~CpuEngine() = default;
int64_t CpuEngine::n_past() const { return kv_->n_past(); }
int64_t CpuEngine::capacity() const { return kv_->capacity(); }
void CpuEngine::step(const int32_t* tokens, int64_t n, float* last_logits) {
  model_.forward(tokens, n, *kv_, last_logits, false);
}

}  // namespace shardwise

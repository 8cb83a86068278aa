// executor/model/cpu_model.cpp — the CPU-only step driver (see cpu_model.h).
#include "executor/model/cpu_model.h"

#include <algorithm>
#include <cmath>

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
  run_layers(tokens, {StepSegment{0, n, kv.n_past(), 0}}, kv);
  kv.set_n_past(kv.n_past() + n);
  write_logits(n, logits, all_logits);
}

void CpuModel::forward_embedded(const float* x, const int64_t* rope_pos3, int64_t n, KvCache& kv, float* logits,
                                bool all_logits) {
  SW_CHECK(n >= 1, "forward: empty step");
  SW_CHECK(kv.n_past() + n <= kv.capacity(), "the context is full: ", kv.n_past(), " + ", n,
           " tokens exceed the KV capacity of ", kv.capacity(), " (raise --ctx)");
  const int64_t H = w_.spec.hidden_size;
  x_.assign(x, x + n * H);
  blocks_.prepare_step_mrope(kv.n_past(), n, rope_pos3);
  run_blocks(n, kv);
  kv.set_n_past(kv.n_past() + n);
  write_logits(n, logits, all_logits);
}

void CpuModel::write_logits(int64_t n, float* logits, bool all_logits) {
  const int64_t H = w_.spec.hidden_size, V = w_.spec.vocab_size;
  if (all_logits) {
    for (int64_t t = 0; t < n; ++t) blocks_.output(w_.output_norm, w_.output, x_.data() + t * H, logits + t * V, 0, V);
  } else {
    blocks_.output(w_.output_norm, w_.output, x_.data() + (n - 1) * H, logits, 0, V);
  }
}

void CpuModel::forward_batch(const int32_t* tokens, const std::vector<StepSegment>& segments, KvCache& kv,
                             float* logits, const float* rows) {
  for (const StepSegment& s : segments)
    SW_CHECK(s.row0 + s.pos0 + s.n <= kv.capacity(), "forward: rows up to ", s.row0 + s.pos0 + s.n,
             " exceed the KV capacity of ", kv.capacity());
  run_layers(tokens, segments, kv, rows);
  std::vector<int64_t> last;
  for (const StepSegment& s : segments) last.push_back(s.t0 + s.n - 1);
  const int64_t V = w_.spec.vocab_size;
  blocks_.output_rows(w_.output_norm, w_.output, x_.data(), last.data(), static_cast<int64_t>(last.size()), logits, V,
                      0, V);
}

void CpuModel::run_layers(const int32_t* tokens, const std::vector<StepSegment>& segments, KvCache& kv,
                          const float* rows) {
  const ModelSpec& sp = w_.spec;
  const int64_t H = sp.hidden_size, n = segments.back().t0 + segments.back().n;
  x_.resize(static_cast<size_t>(n * H));
  if (rows)
    std::copy(rows, rows + n * H, x_.begin());
  else
    embed_rows(w_.token_embd, tokens, n, x_.data());
  blocks_.prepare_step(segments);
  run_blocks(n, kv);
}

void CpuModel::run_blocks(int64_t n, KvCache& kv) {
  const ModelSpec& sp = w_.spec;
  blocks_.set_kv_capacity(kv.capacity());  // KvCache is head-major
  blocks_.set_kv_dtype(kv.dtype());
  for (int64_t l = 0; l < sp.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    blocks_.attention(lw, x_.data(), n, kv.k(l), kv.v(l));
    if (sp.is_moe()) {
      router_logits_.resize(static_cast<size_t>(n * sp.num_experts));
      if (input_observer_) input_observer_(l, x_.data(), n);
      blocks_.router(lw, x_.data(), n, router_logits_.data());
      const MoeRouting r =
          route_tokens(router_logits_.data(), n, sp.num_experts, sp.num_experts_per_tok, sp.norm_topk_prob);
      if (observer_) observer_(l, r);
      blocks_.ffn(lw, x_.data(), n, &r);
    } else {
      blocks_.ffn(lw, x_.data(), n, nullptr);
    }
  }
}

std::vector<double> measure_experts_touched(const ModelWeights& w, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                            const std::vector<int64_t>& counts, std::vector<double>* fewest) {
  const ModelSpec& sp = w.spec;
  if (!sp.is_moe()) return {};
  SW_CHECK(!tokens.empty(), "measure_experts_touched: no tokens");
  const int64_t n = static_cast<int64_t>(tokens.size()), k = sp.num_experts_per_tok;
  for (int32_t t : tokens) SW_CHECK(t >= 0 && t < sp.vocab_size, "measure_experts_touched: token ", t, " out of range");
  CpuModel model(w, pool);
  KvCache kv(sp, n);
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(sp.num_hidden_layers));  // [layer][token * k + j]
  model.set_routing_observer([&](int64_t layer, const MoeRouting& r) {
    auto& v = ids[static_cast<size_t>(layer)];
    v.insert(v.end(), r.expert_ids.begin(), r.expert_ids.end());
  });
  std::vector<float> logits(static_cast<size_t>(sp.vocab_size));
  model.forward(tokens.data(), n, kv, logits.data(), false);
  std::vector<double> out;
  if (fewest) fewest->clear();
  std::vector<char> seen(static_cast<size_t>(sp.num_experts));
  for (int64_t c : counts) {
    SW_CHECK(c >= 1, "measure_experts_touched: token count ", c, " must be positive");
    const int64_t win = std::min(c, n), windows = n / win;
    double sum = 0, least = static_cast<double>(sp.num_experts);
    for (const auto& v : ids) {
      int64_t layer_sum = 0;
      for (int64_t s = 0; s + win <= n; s += win) {
        std::fill(seen.begin(), seen.end(), 0);
        for (int64_t i = s * k; i < (s + win) * k; ++i) {
          char& f = seen[static_cast<size_t>(v[static_cast<size_t>(i)])];
          layer_sum += f == 0;
          f = 1;
        }
      }
      sum += static_cast<double>(layer_sum);
      least = std::min(least, static_cast<double>(layer_sum) / static_cast<double>(windows));
    }
    out.push_back(sum / static_cast<double>(windows * sp.num_hidden_layers));
    if (fewest) fewest->push_back(least);
  }
  return out;
}

double measure_next_layer_routing(const ModelWeights& w, ThreadPool& pool, const std::vector<int32_t>& tokens) {
  const ModelSpec& sp = w.spec;
  if (!sp.is_moe() || sp.num_hidden_layers < 2) return std::nan("");
  SW_CHECK(!tokens.empty(), "measure_next_layer_routing: no tokens");
  const int64_t n = static_cast<int64_t>(tokens.size()), k = sp.num_experts_per_tok, E = sp.num_experts;
  for (int32_t t : tokens)
    SW_CHECK(t >= 0 && t < sp.vocab_size, "measure_next_layer_routing: token ", t, " out of range");
  CpuModel model(w, pool);
  CpuBlocks next_router(sp, w.rope_style, pool);
  KvCache kv(sp, n);
  // Layer l's MoE input through layer l + 1's router: the guess; layer l + 1's routing: the truth.
  std::vector<std::vector<int32_t>> guess(static_cast<size_t>(sp.num_hidden_layers)), truth(guess.size());
  std::vector<float> logits(static_cast<size_t>(n * E));
  model.set_moe_input_observer([&](int64_t l, const float* x, int64_t m) {
    if (l + 1 >= sp.num_hidden_layers) return;
    next_router.router(w.layers[static_cast<size_t>(l + 1)], x, m, logits.data());
    guess[static_cast<size_t>(l + 1)] = route_tokens(logits.data(), m, E, k, sp.norm_topk_prob).expert_ids;
  });
  model.set_routing_observer([&](int64_t l, const MoeRouting& r) { truth[static_cast<size_t>(l)] = r.expert_ids; });
  std::vector<float> out(static_cast<size_t>(sp.vocab_size));
  model.forward(tokens.data(), n, kv, out.data(), false);
  double hits = 0, total = 0;
  for (int64_t l = 1; l < sp.num_hidden_layers; ++l) {
    const auto& g = guess[static_cast<size_t>(l)];
    const auto& t = truth[static_cast<size_t>(l)];
    SW_CHECK(g.size() == static_cast<size_t>(n * k) && t.size() == g.size(), "measure_next_layer_routing: layer ", l,
             " routed ", t.size(), " entries, guessed ", g.size(), " (", n * k, " expected)");
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = 0; a < k; ++a)
        for (int64_t b = 0; b < k; ++b) hits += t[static_cast<size_t>(i * k + a)] == g[static_cast<size_t>(i * k + b)];
    total += static_cast<double>(n * k);
  }
  return hits / total;
}

CpuEngine::CpuEngine(const ModelWeights& weights, ThreadPool& pool, int64_t ctx, int slots, DType kv_dtype)
    : model_(weights, pool), slots_(slots), capacity_(slots > 0 ? ctx / slots : 0) {
  SW_CHECK(slots >= 1 && capacity_ >= 1, "a context of ", ctx, " tokens cannot be shared by ", slots, " slots");
  kv_ = std::make_unique<KvCache>(weights.spec, capacity_ * slots, kv_dtype);
  n_past_.assign(static_cast<size_t>(slots), 0);
}
CpuEngine::~CpuEngine() = default;
int64_t CpuEngine::n_past_of(int slot) const {
  SW_CHECK(slot >= 0 && slot < slots_, "slot ", slot, " is outside the engine's ", slots_, " slots");
  return n_past_[static_cast<size_t>(slot)];
}
void CpuEngine::step_batch(const std::vector<SeqStep>& seqs) {
  const std::vector<StepSegment> segs = step_segments(seqs, slots_, capacity_, n_past_, spec().vocab_size);
  std::vector<int32_t> tokens;
  for (const SeqStep& s : seqs) tokens.insert(tokens.end(), s.tokens, s.tokens + s.n);
  const int64_t V = spec().vocab_size;
  logits_.resize(static_cast<size_t>(seqs.size()) * static_cast<size_t>(V));
  std::vector<float> rows;
  if (step_has_embeddings(seqs)) rows = step_input_rows(seqs, model_.weights().token_embd, spec().hidden_size);
  model_.forward_batch(tokens.data(), segs, *kv_, logits_.data(), rows.empty() ? nullptr : rows.data());
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::copy(logits_.begin() + static_cast<int64_t>(i) * V, logits_.begin() + static_cast<int64_t>(i + 1) * V,
              seqs[i].logits);
    n_past_[static_cast<size_t>(seqs[i].slot)] += seqs[i].n;
  }
}
void CpuEngine::truncate_slot(int slot, int64_t n_past) {
  SW_CHECK(n_past >= 0 && n_past <= n_past_of(slot), "truncate: position ", n_past, " outside the ", n_past_of(slot),
           " cached positions");
  n_past_[static_cast<size_t>(slot)] = n_past;
}

}  // namespace shardwise

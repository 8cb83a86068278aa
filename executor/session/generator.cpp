// executor/session/generator.cpp — prefill + decode loop with timings.
#include "executor/session/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "executor/session/sampling.h"
#include "executor/session/step_engine.h"

namespace shardwise {
namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The row a token is about to be sampled from must be finite: a NaN row makes greedy pick token 0
// forever (and the chain sample garbage), a silent wrong answer. `token` counts generated tokens from 1
// (step 1 samples from the prompt's last logits).
void check_logits(const float* logits, int64_t vocab, int64_t token, int64_t position) {
  const int64_t bad = first_non_finite(logits, vocab);
  if (bad >= 0)
    fail("step ", token, " of the generation (the logits at position ", position, "): token id ", bad, " has logit ",
         logits[bad],
         ": the model's weights or activations are not finite (a corrupt file, or a tensor stored as another "
         "type than it says)");
}
}  // namespace

GenerateResult generate(StepEngine& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const std::function<void(int32_t)>& on_token) {
  SW_CHECK(!prompt.empty(), "the prompt is empty: give at least one token");
  const int64_t vocab = model.spec().vocab_size;
  for (int32_t id : prompt)
    SW_CHECK(id >= 0 && id < vocab, "token id ", id, " is out of range for this model (vocabulary of ", vocab, ")");
  const int64_t cached = opt.cached_prompt;
  SW_CHECK(cached >= 0 && cached < static_cast<int64_t>(prompt.size()) && (cached == 0 || model.n_past() == cached),
           "generate: ", cached, " cached prompt tokens for a prompt of ", prompt.size(), " and a cache of ",
           model.n_past(), " positions");
  const int64_t total =
      model.n_past() - cached + static_cast<int64_t>(prompt.size()) + std::max<int64_t>(0, opt.n_predict - 1);
  SW_CHECK(total <= model.capacity(), "the prompt (", prompt.size(), " tokens) plus ", opt.n_predict,
           " generated tokens need a context of ", total, " but --ctx is ", model.capacity());

  GenerateResult r;
  r.n_prompt = static_cast<int64_t>(prompt.size());
  r.n_cached = cached;
  Sampler sampler(opt.sampling);
  std::vector<int32_t> history = prompt;
  std::vector<float> logits(static_cast<size_t>(vocab));
  const auto t0 = std::chrono::steady_clock::now();
  // 0 = hand the whole prompt to the engine (the plan runtime chunks it by its plan table).
  const int64_t rest = static_cast<int64_t>(prompt.size()) - cached;
  const int64_t chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : rest;
  for (int64_t i = cached; i < static_cast<int64_t>(prompt.size()); i += chunk) {
    if (i > cached && opt.stop_requested && opt.stop_requested()) return r;  // abandoned during the prefill
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size()) - i);
    const auto ts = std::chrono::steady_clock::now();
    model.step(prompt.data() + i, n, logits.data());
    r.steps.push_back({n, ms_since(ts)});
  }
  r.prefill_ms = ms_since(t0);
  if (opt.n_predict <= 0) return r;
  check_logits(logits.data(), vocab, 1, model.n_past() - 1);
  int32_t next = sampler.sample(logits.data(), vocab, history);
  r.ttft_ms = ms_since(t0);
  const auto t_first = std::chrono::steady_clock::now();
  for (;;) {
    r.generated.push_back(next);
    history.push_back(next);
    if (on_token) on_token(next);
    if (static_cast<int64_t>(r.generated.size()) >= opt.n_predict) break;
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), next) != opt.stop_ids.end()) break;
    if (opt.stop_requested && opt.stop_requested()) break;
    const auto ts = std::chrono::steady_clock::now();
    model.step(&next, 1, logits.data());
    r.steps.push_back({1, ms_since(ts)});
    check_logits(logits.data(), vocab, static_cast<int64_t>(r.generated.size()) + 1, model.n_past() - 1);
    next = sampler.sample(logits.data(), vocab, history);
  }
  r.decode_ms = ms_since(t_first);
  r.prompt_tokens_per_s = r.prefill_ms > 0 ? 1000.0 * static_cast<double>(rest) / r.prefill_ms : 0;
  const double n_dec = static_cast<double>(r.generated.size()) - 1;
  r.decode_tokens_per_s = (n_dec > 0 && r.decode_ms > 0) ? 1000.0 * n_dec / r.decode_ms : 0;
  return r;
}

}  // namespace shardwise

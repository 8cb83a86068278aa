// vision/vl_engine.cpp — a vision-language prompt's generation on the CPU (see vl_engine.h).
#include "vision/vl_engine.h"

#include <cstring>

#include "core/error.h"
#include "executor/cpu/ops.h"

namespace shardwise {

VlCpuEngine::VlCpuEngine(const ModelWeights& weights, ThreadPool& pool, int64_t ctx, VlInput input, DType kv_dtype)
    : w_(weights), model_(weights, pool), kv_(weights.spec, ctx, kv_dtype), in_(std::move(input)) {
  SW_CHECK(static_cast<int64_t>(in_.ids.size()) <= ctx, "the image prompt's ", in_.ids.size(),
           " tokens exceed the context of ", ctx);
}

int64_t VlCpuEngine::n_past_of(int slot) const {
  SW_CHECK(slot == 0, "a vision-language engine holds one sequence (slot 0), not slot ", slot);
  return kv_.n_past();
}

void VlCpuEngine::step_batch(const std::vector<SeqStep>& seqs) {
  const ModelSpec& sp = spec();
  step_segments(seqs, 1, kv_.capacity(), {kv_.n_past()}, sp.vocab_size);  // checks slot, room, ids
  const SeqStep& s = seqs.front();
  const int64_t H = sp.hidden_size, n = s.n, r0 = kv_.n_past(), prompt = static_cast<int64_t>(in_.ids.size());
  x_.resize(static_cast<size_t>(n * H));
  pos3_.resize(static_cast<size_t>(3 * n));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = r0 + t;
    float* x = x_.data() + t * H;
    if (row < prompt) {  // the prompt's own row: text or image token
      SW_CHECK(s.tokens[t] == in_.ids[static_cast<size_t>(row)], "position ", row, " holds token ", s.tokens[t],
               ", the image prompt has ", in_.ids[static_cast<size_t>(row)], " there");
      std::memcpy(x, in_.embeddings.data() + row * H, static_cast<size_t>(H) * sizeof(float));
      for (int k = 0; k < 3; ++k)
        pos3_[static_cast<size_t>(3 * t + k)] = in_.positions.pos[static_cast<size_t>(row)][k];
    } else {
      embed_rows(w_.token_embd, &s.tokens[t], 1, x);
      for (int k = 0; k < 3; ++k) pos3_[static_cast<size_t>(3 * t + k)] = row + in_.positions.delta;
    }
  }
  logits_.resize(static_cast<size_t>(sp.vocab_size));
  model_.forward_embedded(x_.data(), pos3_.data(), n, kv_, logits_.data(), false);
  std::memcpy(s.logits, logits_.data(), logits_.size() * sizeof(float));
}

void VlCpuEngine::truncate_slot(int slot, int64_t n_past) {
  SW_CHECK(slot == 0 && n_past >= 0 && n_past <= kv_.n_past(), "truncate: position ", n_past, " outside the ",
           kv_.n_past(), " cached positions");
  kv_.set_n_past(n_past);
}

}  // namespace shardwise

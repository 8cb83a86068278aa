// vision/vl_engine.cpp — a vision-language prompt's generation on any engine (see vl_engine.h).
#include "vision/vl_engine.h"

#include <cstring>

#include "core/error.h"
#include "executor/cpu/ops.h"

namespace shardwise {

VlEngine::VlEngine(StepEngine& inner, const TensorView& token_embd, VlInput input)
    : inner_(inner), token_embd_(token_embd), in_(std::move(input)) {
  SW_CHECK(static_cast<int64_t>(in_.ids.size()) <= inner_.capacity(), "the image prompt's ", in_.ids.size(),
           " tokens exceed the context of ", inner_.capacity());
  SW_CHECK(!inner_.spec().mrope_section.empty(), "a vision-language prompt needs a model with M-RoPE sections");
}

int64_t VlEngine::n_past_of(int slot) const {
  SW_CHECK(slot == 0, "a vision-language engine holds one sequence (slot 0), not slot ", slot);
  return inner_.n_past_of(0);
}

void VlEngine::step_batch(const std::vector<SeqStep>& seqs) {
  const ModelSpec& sp = spec();
  SW_CHECK(seqs.size() == 1 && seqs.front().slot == 0, "a vision-language engine steps one sequence (slot 0)");
  const SeqStep& s = seqs.front();
  step_segments(seqs, 1, capacity(), {n_past_of(0)}, sp.vocab_size);  // checks room and ids
  const int64_t H = sp.hidden_size, n = s.n, r0 = n_past_of(0), prompt = static_cast<int64_t>(in_.ids.size());
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
      embed_rows(token_embd_, &s.tokens[t], 1, x);
      for (int k = 0; k < 3; ++k) pos3_[static_cast<size_t>(3 * t + k)] = row + in_.positions.delta;
    }
  }
  SeqStep inner = s;
  inner.embeddings = x_.data();
  inner.rope_pos3 = pos3_.data();
  inner_.step_batch({inner});
}

void VlEngine::truncate_slot(int slot, int64_t n_past) {
  SW_CHECK(slot == 0, "a vision-language engine holds one sequence (slot 0), not slot ", slot);
  inner_.truncate_slot(0, n_past);
}

}  // namespace shardwise

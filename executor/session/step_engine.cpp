// executor/session/step_engine.cpp — a batched step's segments (see step_engine.h).
#include "executor/session/step_engine.h"

#include "core/error.h"

namespace shardwise {

int64_t segments_tokens(const std::vector<StepSegment>& segments) {
  SW_CHECK(!segments.empty(), "a step needs at least one segment");
  int64_t n = 0;
  for (const StepSegment& g : segments) {
    SW_CHECK(g.t0 == n && g.n >= 1 && g.pos0 >= 0 && g.row0 >= 0 && g.row0 + g.pos0 + g.n <= (int64_t(1) << 30),
             "step positions out of range");
    n += g.n;
  }
  return n;
}

std::vector<StepSegment> step_segments(const std::vector<SeqStep>& seqs, int slots, int64_t capacity,
                                       const std::vector<int64_t>& n_past, int64_t vocab) {
  SW_CHECK(!seqs.empty(), "a step needs at least one sequence");
  SW_CHECK(static_cast<int64_t>(n_past.size()) == slots, "step: ", n_past.size(), " positions for ", slots, " slots");
  std::vector<char> seen(static_cast<size_t>(slots), 0);
  std::vector<StepSegment> segs;
  segs.reserve(seqs.size());
  int64_t t0 = 0;
  for (const SeqStep& s : seqs) {
    SW_CHECK(s.slot >= 0 && s.slot < slots, "step: slot ", s.slot, " is outside the engine's ", slots, " slots");
    SW_CHECK(!seen[static_cast<size_t>(s.slot)], "step: slot ", s.slot, " appears twice in one step");
    seen[static_cast<size_t>(s.slot)] = 1;
    SW_CHECK(s.n >= 1 && s.tokens != nullptr && s.logits != nullptr, "step: slot ", s.slot,
             " has no tokens (or nowhere for its logits)");
    const int64_t past = n_past[static_cast<size_t>(s.slot)];
    SW_CHECK(s.n <= capacity - past, "the context is full: ", past, " + ", s.n, " tokens exceed the ", capacity,
             " positions of ", slots > 1 ? "a slot (--ctx is shared by the slots)" : "--ctx");
    for (int64_t i = 0; i < s.n; ++i)
      SW_CHECK(s.tokens[i] >= 0 && s.tokens[i] < vocab, "token id ", s.tokens[i], " is out of range [0, ", vocab, ")");
    segs.push_back({t0, s.n, past, static_cast<int64_t>(s.slot) * capacity, s.rope_pos3});
    t0 += s.n;
  }
  return segs;
}

bool step_has_embeddings(const std::vector<SeqStep>& seqs) {
  for (const SeqStep& s : seqs)
    if (s.embeddings != nullptr) return true;
  return false;
}

}  // namespace shardwise

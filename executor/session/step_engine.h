// executor/session/step_engine.h — what the generation loop drives: something that runs a step of new
// tokens (appending them to its KV cache) and returns the last token's logits. The CPU-only model and
// the plan runtime (CPU + device) both are one.
//
// A batched engine holds several sequences at once, each in a slot of its KV cache (its own positions,
// capacity() of them): one step_batch runs new tokens of any of them together, so every weight the
// step reads serves all of them (decode tokens of many users, prefill chunks among them). The step's
// tier is the total of its new tokens. Each sequence's tokens and logits are those it would get alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"

namespace shardwise {

// One sequence's new tokens in a step.
struct SeqStep {
  int slot = 0;                     // which sequence (0 .. slots() - 1); a slot appears once per step
  const int32_t* tokens = nullptr;  // at the slot's positions n_past_of(slot) .. + n - 1
  int64_t n = 0;
  float* logits = nullptr;  // receives the last token's logits [vocab]
  // A vision-language prompt's rows (vision/vl_engine.h): the input rows [n, hidden] instead of the
  // tokens' embeddings (null: the tokens'), and the tokens' M-RoPE (temporal, height, width) positions
  // [n, 3] (null: each position three times; only for a model with mrope_section). Both are read while
  // the step runs.
  const float* embeddings = nullptr;
  const int64_t* rope_pos3 = nullptr;
};

// One sequence's part of a step as the blocks see it: tokens [t0, t0 + n) of the step's token list, at
// the sequence's positions pos0 .. pos0 + n - 1, its cache rows starting at row0 (its slot's first row:
// position p is cache row row0 + p, and it attends to rows row0 .. row0 + p).
struct StepSegment {
  int64_t t0 = 0, n = 0, pos0 = 0, row0 = 0;
  // The tokens' M-RoPE positions [n, 3] (SeqStep::rope_pos3), which turn RoPE instead of pos0 + i (the
  // cache rows and the causal mask stay by position); null: pos0 + i.
  const int64_t* rope_pos3 = nullptr;
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual int slots() const { return 1; }         // sequences the KV cache holds at once
  virtual int64_t capacity() const = 0;           // KV capacity of one slot, in tokens
  virtual int64_t n_past_of(int slot) const = 0;  // positions already in the slot's cache
  // Every listed sequence's tokens in one step; writes each one's last logits. Checks everything (slots
  // in range and distinct, tokens in the vocabulary, room in each slot) before it computes anything.
  virtual void step_batch(const std::vector<SeqStep>& seqs) = 0;
  // Keeps positions 0 .. n_past-1 of the slot's cache and drops the rest (0 <= n_past <= n_past_of),
  // so its next step continues at position n_past: a server reuses the prefix a new prompt shares with
  // the previous one, or frees the slot (0). Nothing is freed; later steps overwrite the dropped rows.
  virtual void truncate_slot(int slot, int64_t n_past) = 0;
  virtual std::string device() const = 0;  // "cpu", "emu", "cuda" — who ran it

  // One sequence, in slot 0 (the generation loop, `run`, `logits`).
  int64_t n_past() const { return n_past_of(0); }
  void step(const int32_t* tokens, int64_t n, float* last_logits) { step_batch({SeqStep{0, tokens, n, last_logits}}); }
  void truncate(int64_t n_past) { truncate_slot(0, n_past); }
};

// The step's token count, after checking that the segments tile it in order (t0 = the tokens before),
// each with at least one token at positions and rows inside [0, 2^30).
int64_t segments_tokens(const std::vector<StepSegment>& segments);

// The segments of a step of `seqs` (tokens in list order; slot s's rows start at s * capacity), checked:
// slots in [0, slots) and distinct, n >= 1, every token in [0, vocab), room in each slot for its tokens
// after n_past[slot]. One clear error for the first violation.
std::vector<StepSegment> step_segments(const std::vector<SeqStep>& seqs, int slots, int64_t capacity,
                                       const std::vector<int64_t>& n_past, int64_t vocab);

// Whether any sequence of the step brings its own input rows (SeqStep::embeddings).
bool step_has_embeddings(const std::vector<SeqStep>& seqs);

}  // namespace shardwise

// vision/vl_engine.h — a vision-language prompt's generation on any engine (the CPU model, or the plan
// runtime on a device): a StepEngine (the generation loop's interface) over the language model's engine
// whose first positions are the prompt's embeddings at M-RoPE positions (vl_prompt.h) and whose later
// tokens are embedded from the vocabulary at position row + delta.
#pragma once

#include <string>
#include <vector>

#include "executor/session/step_engine.h"
#include "vision/vl_prompt.h"

namespace shardwise {

class VlEngine : public StepEngine {
 public:
  // inner: the language model's engine (one sequence, in slot 0; a capacity of at least the prompt's
  // expanded length); token_embd: its embedding table. Both must outlive this engine.
  VlEngine(StepEngine& inner, const TensorView& token_embd, VlInput input);
  const ModelSpec& spec() const override { return inner_.spec(); }
  int64_t capacity() const override { return inner_.capacity(); }
  int64_t n_past_of(int slot) const override;
  // One sequence (slot 0). Positions inside the prompt must carry the prompt's ids (the image tokens'
  // rows are the encoder's, not the vocabulary's).
  void step_batch(const std::vector<SeqStep>& seqs) override;
  void truncate_slot(int slot, int64_t n_past) override;
  std::string device() const override { return inner_.device(); }

  const VlInput& input() const { return in_; }

 private:
  StepEngine& inner_;
  const TensorView& token_embd_;
  VlInput in_;
  std::vector<float> x_;
  std::vector<int64_t> pos3_;
};

}  // namespace shardwise

// executor/session/step_engine.h — what the generation loop drives: something that runs a step of n
// new tokens (appending them to its KV cache) and returns the last token's logits. The CPU-only model
// and the plan runtime (CPU + device) both are one.
#pragma once

#include <cstdint>
#include <string>

#include "core/model_spec.h"

namespace shardwise {

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual int64_t n_past() const = 0;    // positions already in the KV cache
  virtual int64_t capacity() const = 0;  // KV capacity in tokens
  // Tokens at positions n_past() .. +n-1; writes the last token's logits [vocab].
  virtual void step(const int32_t* tokens, int64_t n, float* last_logits) = 0;
  // Keeps positions 0 .. n_past-1 of the KV cache and drops the rest (0 <= n_past <= n_past()), so
  // the next step continues at position n_past: a server reuses the prefix a new prompt shares with
  // the previous one. Nothing is freed; later steps overwrite the dropped positions.
  virtual void truncate(int64_t n_past) = 0;
  virtual std::string device() const = 0;  // "cpu", "emu", "cuda" — who ran it
};

}  // namespace shardwise

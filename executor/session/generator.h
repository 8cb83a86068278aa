// executor/session/generator.h — a generation loop over a StepEngine (CPU model or plan runtime): prefill the prompt in
// chunks, then decode token by token, with the timings llama.cpp users know (TTFT, prompt and
// decode tokens/s).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "executor/session/sampling.h"

namespace shardwise {

class StepEngine;

struct GenerateOptions {
  int64_t n_predict = 32;       // tokens to generate (stops earlier at a stop token)
  int64_t prefill_chunk = 512;  // prompt tokens per step (0 = the whole prompt in one step)
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // e.g. EOS; generation ends after emitting one
  // Asked after each generated token (after on_token), and between prefill chunks; true ends the
  // generation there, e.g. when a stop string has appeared in the text or the client went away.
  std::function<bool()> stop_requested;
  // The first `cached_prompt` prompt tokens are already in the engine's KV cache (positions 0 ..
  // cached_prompt-1, left there by an earlier generation); the prefill starts after them. Less than
  // the prompt's length: the last prompt token is always stepped, for the logits it gives.
  int64_t cached_prompt = 0;
};

struct StepTiming {
  int64_t n_tokens;
  double ms;
};

struct GenerateResult {
  std::vector<int32_t> generated;
  int64_t n_prompt = 0;            // the whole prompt, cached tokens included
  int64_t n_cached = 0;            // prompt tokens that were in the cache already (not stepped)
  double prefill_ms = 0;           // all prompt steps
  double ttft_ms = 0;              // start to first generated token (prefill + first sample)
  double decode_ms = 0;            // after the first token, until the last one
  double prompt_tokens_per_s = 0;  // prompt tokens stepped / prefill_ms
  double decode_tokens_per_s = 0;  // (generated - 1) / decode_ms
  std::vector<StepTiming> steps;
};

// `on_token` (optional) is called with each generated id as soon as it is sampled.
GenerateResult generate(StepEngine& engine, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace shardwise

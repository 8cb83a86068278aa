// executor/session/sampling.h — turning logits into the next token: greedy, or llama.cpp's chain
// (repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw) with a seeded generator, so a
// given seed reproduces a generation exactly. Semantics follow llama.cpp's samplers: the penalty
// divides positive logits and multiplies negative ones of tokens seen in the last repeat_last_n
// (prompt included); top-p keeps the smallest prefix whose probability reaches p; min-p keeps
// tokens whose logit is within log(min_p) of the best; temperature <= 0 means argmax after the
// penalty. One difference: the default seed is fixed (llama.cpp's default draws a random one).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace shardwise {

struct SamplingParams {
  bool greedy = false;  // argmax (ties: lowest id); also used when temp <= 0
  float temp = 0.8f;
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int32_t repeat_last_n = 64;
  uint64_t seed = 0xFFFFFFFFu;  // fixed default, so runs are reproducible unless a seed is given

  // Throws Error naming the flag for values outside their range (NaN, top-p outside (0, 1], ...).
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits [vocab]; `history` = tokens so far (prompt + generated).
  int32_t sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Index of the largest value (lowest index on ties).
int32_t argmax(const float* x, int64_t n);

// Index of the first NaN or infinity in x[0, n), -1 when every value is finite. One vectorised pass
// (the largest magnitude's bits), then a search only when some value is not finite: a few
// microseconds for a row of 150K logits.
int64_t first_non_finite(const float* x, int64_t n);

}  // namespace shardwise

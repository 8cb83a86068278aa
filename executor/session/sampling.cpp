// executor/session/sampling.cpp — sampling chain (see sampling.h).
#include "executor/session/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/error.h"

namespace shardwise {

int64_t first_non_finite(const float* x, int64_t n) {
  // A float is NaN or infinite exactly when its bits without the sign are >= those of infinity.
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    largest = std::max(largest, bits & 0x7fffffffu);
  }
  if (largest < 0x7f800000u) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

int32_t argmax(const float* x, int64_t n) {
  // The first index of the largest value, NaN never chosen unless x[0] is NaN (then 0): what one pass of
  // `if (x[i] > x[best]) best = i` gives, which took ~45 us over a vocabulary of 131072 (a chain of
  // dependent compares). Here: each block's maximum in 8 independent lanes (vector max instructions),
  // then the first element equal to the largest in the first block that holds it.
  if (n <= 0 || !(x[0] == x[0])) return 0;
  constexpr int64_t kBlock = 2048;
  constexpr int kLanes = 8;
  float best = x[0];
  int64_t best_block = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    float m[kLanes];
    for (int k = 0; k < kLanes; ++k) m[k] = -std::numeric_limits<float>::infinity();  // never NaN
    int64_t i = b0;
    for (; i + kLanes <= b1; i += kLanes)
      for (int k = 0; k < kLanes; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < b1; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
    for (int k = 1; k < kLanes; ++k) m[0] = m[k] > m[0] ? m[k] : m[0];
    if (m[0] > best) {  // NaN elements never enter the lanes (NaN > m is false)
      best = m[0];
      best_block = b0;
    }
  }
  const int64_t end = std::min(n, best_block + kBlock);
  for (int64_t i = best_block; i < end; ++i)
    if (x[i] == best) return static_cast<int32_t>(i);
  return static_cast<int32_t>(best_block);  // not reached: best is an element of that block
}

void SamplingParams::validate() const {
  if (!std::isfinite(temp)) fail("--temp ", temp, " is not a number");
  if (top_k < 0) fail("--top-k ", top_k, " is negative (0 turns it off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("--top-p ", top_p, " is outside (0, 1] (1 turns it off)");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("--min-p ", min_p, " is outside [0, 1] (0 turns it off)");
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
    fail("--repeat-penalty ", repeat_penalty, " must be a positive number (1 turns it off)");
  if (repeat_last_n < -1) fail("--repeat-last-n ", repeat_last_n, " must be -1 (all), 0 (off) or positive");
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  const bool penalty = p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0;
  const bool greedy = p_.greedy || p_.temp <= 0.0f;
  if (greedy && !penalty) return argmax(logits, vocab);  // nothing to change: no copy
  std::vector<float> l(logits, logits + vocab);
  if (penalty) {
    const size_t n =
        p_.repeat_last_n < 0 ? history.size() : std::min<size_t>(history.size(), static_cast<size_t>(p_.repeat_last_n));
    std::unordered_set<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= vocab) continue;
      l[id] = l[id] > 0 ? l[id] / p_.repeat_penalty : l[id] * p_.repeat_penalty;
    }
  }
  if (greedy) return argmax(l.data(), vocab);

  struct Cand {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<Cand> c(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) c[i] = {static_cast<int32_t>(i), l[i], 0.0f};
  auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t keep = c.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) keep = static_cast<size_t>(p_.top_k);
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(keep), c.end(), by_logit);
  c.resize(keep);
  auto normalize = [&](float temp) {
    const float m = c.front().logit;
    double s = 0;
    for (auto& x : c) s += (x.p = std::exp((x.logit - m) / temp));
    for (auto& x : c) x.p = static_cast<float>(x.p / s);
  };
  normalize(1.0f);
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t k = 0;
    while (k < c.size()) {
      cum += c[k].p;
      ++k;
      if (cum >= p_.top_p) break;
    }
    c.resize(std::max<size_t>(1, k));
  }
  if (p_.min_p > 0.0f) {
    // llama.cpp compares logits: keep logit >= max_logit + log(min_p).
    const float min_logit = c.front().logit + std::log(p_.min_p);
    size_t k = 0;
    while (k < c.size() && c[k].logit >= min_logit) ++k;
    c.resize(std::max<size_t>(1, k));
  }
  normalize(p_.temp);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_), cum = 0;
  for (const auto& x : c) {
    cum += x.p;
    if (r < cum) return x.id;
  }
  return c.back().id;
}

}  // namespace shardwise

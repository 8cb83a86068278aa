// Tests for the session pieces: sampling, and the byte-level fallback and GGUF SentencePiece vocabularies.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/session/generator.h"
#include "executor/session/sampling.h"
#include "executor/session/step_engine.h"
#include "test_util.h"
#include "text/tokenizer.h"

using namespace shardwise;
using Catch::Matchers::Contains;

TEST_CASE("argmax: the first largest value, NaN skipped, as one compare loop", "[sampling]") {
  auto reference = [](const std::vector<float>& x) {
    size_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = i;
    return static_cast<int32_t>(best);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(0, 5);  // few distinct values: many ties
  int checked = 0;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(7), int64_t(8), int64_t(9), int64_t(2047), int64_t(2048),
                    int64_t(2049), int64_t(4096), int64_t(131072), int64_t(151936)})
    for (int pattern = 0; pattern < 7; ++pattern) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x)
        v = pattern == 0 ? static_cast<float>(small(rng)) : std::ldexp(static_cast<float>(rng() % 100000), -7) - 300.0f;
      if (pattern == 2)  // NaNs at block starts and elsewhere, the maximum right after one
        for (size_t i = 0; i < x.size(); i += 2048) {
          x[i] = nan;
          if (i + 1 < x.size()) x[i + 1] = 1e9f;
        }
      if (pattern == 3) x[0] = nan;  // then 0, whatever follows
      if (pattern == 4) std::fill(x.begin(), x.end(), -inf);
      if (pattern == 5) x[x.size() - 1] = inf;  // the very last element
      if (pattern == 6) std::fill(x.begin(), x.end(), 3.0f);
      INFO("n " << n << " pattern " << pattern);
      CHECK(argmax(x.data(), n) == reference(x));
      ++checked;
    }
  CHECK(checked == 77);
  std::vector<float> t = {1.0f, nan, 5.0f, 5.0f};
  CHECK(argmax(t.data(), 4) == 2);
}

TEST_CASE("sampling: greedy, seeded reproducibility, filters", "[sampling]") {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
  SamplingParams g;
  g.greedy = true;
  CHECK(Sampler(g).sample(logits.data(), 5, {}) == 1);  // ties: lowest id
  SamplingParams p;
  p.temp = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.sample(logits.data(), 5, {}));
    sb.push_back(b.sample(logits.data(), 5, {}));
  }
  CHECK(sa == sb);
  CHECK(std::find(sa.begin(), sa.end(), 2) != sa.end());  // not greedy
  SamplingParams k1 = p;
  k1.top_k = 1;
  Sampler c(k1);
  for (int i = 0; i < 20; ++i) CHECK(c.sample(logits.data(), 5, {}) == 1);
  SamplingParams pen;
  pen.greedy = true;
  pen.repeat_penalty = 2.0f;
  CHECK(Sampler(pen).sample(logits.data(), 5, {1}) == 4);  // id 1 penalised: 2.0 -> 1.0
}

TEST_CASE("tokenizer: byte fallback for models without a vocabulary", "[tokenizer]") {
  ModelSpec s = builtin_spec("tiny_qwen3");  // vocab 300 >= 259
  ThreadPool pool(1);
  auto src = make_synthetic_weights(s, 1, &pool);
  Tokenizer tok(*src);
  CHECK(tok.kind() == "bytes");
  const std::string text = "héllo, 世界";
  auto ids = tok.encode(text, true);
  CHECK(ids.front() == tok.bos());
  CHECK(ids.size() == 1 + text.size());
  CHECK(tok.decode(ids) == text);
  CHECK_THROWS_WITH(tok.encode("bad \xff utf8", false), Contains("UTF-8"));
  ModelSpec small = builtin_spec("tiny_llama");  // vocab 256 < 259: no byte tokens
  auto src2 = make_synthetic_weights(small, 1, &pool);
  CHECK_THROWS_WITH(Tokenizer(*src2).encode("x", false), Contains("--tokens"));
}

TEST_CASE("tokenizer: SentencePiece-style GGUF vocabulary", "[tokenizer]") {
  auto src = open_weights(test::fixtures_dir() + "/llamacpp/gguf/llama_small.f16.gguf");
  Tokenizer tok(*src);
  CHECK(tok.kind() == "spm");
  CHECK(tok.bos() == 1);
  // The fixture's vocabulary is <tN> placeholders: "<t5>" is one token.
  auto ids = tok.encode("<t5><t7>", false);
  REQUIRE(ids.size() >= 2);
  CHECK(tok.decode({5, 7}) == "<t5><t7>");
}

namespace {
// An engine whose logits favour token (position % vocab), and hold `bad` at token `bad_id` from step
// `bad_step` on (steps count from 1: the prompt's is the first).
class FakeEngine : public StepEngine {
 public:
  FakeEngine(int64_t bad_step, int64_t bad_id, float bad) : bad_step_(bad_step), bad_id_(bad_id), bad_(bad) {
    spec_.vocab_size = 50;
  }
  const ModelSpec& spec() const override { return spec_; }
  int64_t n_past_of(int) const override { return n_past_; }
  int64_t capacity() const override { return 64; }
  std::string device() const override { return "fake"; }
  void truncate_slot(int, int64_t n) override { n_past_ = n; }
  void step_batch(const std::vector<SeqStep>& seqs) override {
    n_past_ += seqs.at(0).n;
    float* logits = seqs[0].logits;
    ++steps_;
    for (int64_t i = 0; i < spec_.vocab_size; ++i) logits[i] = i == (n_past_ - 1) % spec_.vocab_size ? 1.0f : 0.0f;
    if (steps_ >= bad_step_) logits[bad_id_] = bad_;
  }
  int64_t steps_ = 0;

 private:
  ModelSpec spec_;
  int64_t n_past_ = 0, bad_step_, bad_id_;
  float bad_;
};
}  // namespace

TEST_CASE("generation stops with an error naming the step when the logits are not finite", "[sampling]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const auto& [bad_step, bad_id, bad] :
       {std::tuple<int64_t, int64_t, float>{1, 0, nan}, {4, 49, inf}, {2, 17, -inf}, {6, 3, -nan}}) {
    INFO("step " << bad_step << ", id " << bad_id << ", value " << bad);
    for (bool greedy : {true, false}) {
      FakeEngine engine(bad_step, bad_id, bad);
      GenerateOptions o;
      o.n_predict = 10;
      o.sampling.greedy = greedy;
      std::vector<int32_t> got;
      try {
        generate(engine, {1, 2, 3}, o, [&](int32_t id) { got.push_back(id); });
        FAIL("generated past non-finite logits");
      } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK_THAT(msg, Contains("step " + std::to_string(bad_step) + " of the generation") &&
                            Contains("position " + std::to_string(3 + bad_step - 2)) &&
                            Contains("token id " + std::to_string(bad_id)) && Contains("not finite"));
      }
      CHECK(static_cast<int64_t>(got.size()) == bad_step - 1);  // the steps before it ran
    }
  }
  // Finite logits, however large, pass.
  FakeEngine fine(1, 5, 3.0e38f);
  GenerateOptions o;
  o.n_predict = 5;
  CHECK(generate(fine, {1}, o).generated.size() == 5);
}

TEST_CASE("first_non_finite finds the first NaN or infinity, -1 for finite rows", "[sampling]") {
  std::vector<float> row(150001, 0.5f);
  row[7] = -3.4e38f;
  row[9] = std::numeric_limits<float>::denorm_min();
  CHECK(first_non_finite(row.data(), static_cast<int64_t>(row.size())) == -1);
  for (int64_t at : {int64_t(0), int64_t(8), int64_t(150000), int64_t(77777)}) {
    std::vector<float> r = row;
    r[static_cast<size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
    r[150000] = at == 150000 ? r[150000] : std::numeric_limits<float>::infinity();
    CHECK(first_non_finite(r.data(), static_cast<int64_t>(r.size())) == at);
  }
  CHECK(first_non_finite(row.data(), 0) == -1);
}

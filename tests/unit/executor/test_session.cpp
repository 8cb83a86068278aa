// Tests for the session pieces: sampling, and the byte-level fallback and GGUF SentencePiece vocabularies.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/session/sampling.h"
#include "executor/session/tokenizer.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

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

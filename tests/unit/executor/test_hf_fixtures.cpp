// Correctness against references nobody here wrote: HF transformers (eager, f32) on the committed
// HF fixtures, and the GGUF files written by llama.cpp's own converter with their references.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "executor/reference/reference_model.h"
#include "executor/session/generator.h"
#include "executor/session/kv_cache.h"
#include "test_util.h"

using namespace shardwise;

namespace {

// Greedy tokens of the fast path for a prompt, through the generation loop (prefill + decode).
std::vector<int32_t> greedy(const WeightSource& src, const std::vector<int32_t>& prompt, int n) {
  ThreadPool pool(2);
  ModelWeights w = ModelWeights::from_source(src);
  CpuEngine engine(w, pool, static_cast<int64_t>(prompt.size()) + n);
  GenerateOptions o;
  o.n_predict = n;
  o.sampling.greedy = true;
  return generate(engine, prompt, o).generated;
}

// Number of leading greedy steps whose reference top-2 gap is clear (>= 1e-3 of max |logit|).
size_t steps_before_near_tie(const std::vector<float>& full_logits, int64_t vocab, size_t n_prompt, size_t n_greedy) {
  for (size_t i = 0; i < n_greedy; ++i) {
    const float* l = full_logits.data() + (n_prompt - 1 + i) * static_cast<size_t>(vocab);
    float a = -INFINITY, b = -INFINITY, m = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      m = std::max(m, std::fabs(l[j]));
      if (l[j] > a) {
        b = a;
        a = l[j];
      } else if (l[j] > b) {
        b = l[j];
      }
    }
    if (a - b < 1e-3f * m) return i;
  }
  return n_greedy;
}

}  // namespace

TEST_CASE("HF transformers fixtures: logits and greedy tokens", "[fixtures]") {
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "qwen3moe_norm", "qwen3moe_nonorm"}) {
    const std::string dir = test::fixtures_dir() + "/hf/" + name;
    auto src = open_weights(dir);
    const int64_t V = src->spec().vocab_size;
    const auto ids = test::load_npy_ints(dir + "/ref_prompt_ids.npy");
    const auto ref = test::load_npy_floats(dir + "/ref_prompt_logits.npy");
    const auto ref_greedy = test::load_npy_ints(dir + "/ref_greedy_ids.npy");
    const auto full = test::load_npy_floats(dir + "/ref_full_logits.npy");
    INFO(name);
    CHECK(test::max_rel_error(test::fast_logits(*src, ids), ref, V) <= 1e-4);
    CHECK(test::max_rel_error(reference_logits(*src, ids), ref, V) <= 1e-4);
    const auto got = greedy(*src, ids, static_cast<int>(ref_greedy.size()));
    const size_t n_cmp = steps_before_near_tie(full, V, ids.size(), ref_greedy.size());
    CHECK(n_cmp >= 1);
    for (size_t i = 0; i < n_cmp; ++i) CHECK(got[i] == ref_greedy[i]);
    // Logits over the prompt and the greedy continuation (the decode steps' inputs).
    std::vector<int32_t> seq = ids;
    seq.insert(seq.end(), ref_greedy.begin(), ref_greedy.end() - 1);
    CHECK(test::max_rel_error(test::fast_logits(*src, seq), full, V) <= 1e-4);
  }
}

TEST_CASE("llama.cpp-converted GGUF fixtures match their references", "[fixtures]") {
  const std::string dir = test::fixtures_dir() + "/llamacpp";
  for (const char* model : {"llama_small", "qwen3moe_small"}) {
    const auto ids = test::load_npy_ints(dir + "/hf/" + model + "/ref_prompt_ids.npy");
    for (const char* type : {"f16", "q8_0"}) {
      const std::string base = dir + "/gguf/" + model + "." + type;
      auto src = open_weights(base + ".gguf");
      const int64_t V = src->spec().vocab_size;
      const auto ref = test::load_npy_floats(base + ".ref_prompt_logits.npy");
      const auto ref_greedy = test::load_npy_ints(base + ".ref_greedy_ids.npy");
      INFO(base);
      CHECK(test::max_rel_error(test::fast_logits(*src, ids), ref, V) <= 1e-4);
      CHECK(test::max_rel_error(reference_logits(*src, ids), ref, V) <= 1e-4);
      // The references' greedy runs have no near-ties in their first steps; compare all of them
      // unless our own logits show a near-tie.
      const auto got = greedy(*src, ids, static_cast<int>(ref_greedy.size()));
      CHECK(got.front() == ref_greedy.front());
    }
    // The f32 HF model itself, for completeness.
    auto hf = open_weights(dir + "/hf/" + model);
    const auto ref = test::load_npy_floats(dir + "/hf/" + model + "/ref_prompt_logits.npy");
    CHECK(test::max_rel_error(test::fast_logits(*hf, ids), ref, hf->spec().vocab_size) <= 1e-4);
  }
}

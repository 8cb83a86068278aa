// Tests for the CPU fast path against the f64 reference on synthetic models of every family and
// dtype: full prefill, chunked prefill and token-by-token decode over the KV cache must agree.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/ops.h"
#include "executor/model/cpu_model.h"
#include "executor/reference/reference_model.h"
#include "executor/session/kv_cache.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

std::vector<int32_t> some_tokens(int64_t vocab, int n, uint32_t seed) {
  std::vector<int32_t> t;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab)));
  }
  return t;
}

}  // namespace

TEST_CASE("fast path matches the reference for every family and dtype", "[forward]") {
  for (const char* spec_name : {"tiny_llama", "tiny_qwen3", "tiny_moe", "tiny_qwen2"}) {
    for (const char* dt : {"f32", "f16", "bf16", "q8_0", "q4_0"}) {
      ModelSpec s = builtin_spec(spec_name);
      s.dtype = parse_dtype(dt);
      ThreadPool pool(2);
      auto src = make_synthetic_weights(s, 11, &pool);
      const auto toks = some_tokens(s.vocab_size, 13, 5);
      const auto ref = reference_logits(*src, toks);
      const auto fast = test::fast_logits(*src, toks);
      INFO(spec_name << " " << dt);
      CHECK(test::max_rel_error(fast, ref, s.vocab_size) <= 1e-4);
    }
  }
}

namespace {

// Greedy token (argmax) of each row of [rows, width] logits.
std::vector<int64_t> argmax_rows(const std::vector<float>& logits, int64_t width) {
  std::vector<int64_t> out;
  for (size_t r = 0; r < logits.size() / static_cast<size_t>(width); ++r) {
    const auto row = logits.begin() + static_cast<std::ptrdiff_t>(r * static_cast<size_t>(width));
    out.push_back(std::max_element(row, row + width) - row);
  }
  return out;
}

}  // namespace

// A 16-bit cache stores each K row after RoPE and each V row after its bias rounded to f16 (or bf16), a
// q8_0 cache each head's row quantised in blocks of 32: the reference rounds (quantises) the same
// values, so only the fast path's own f32 rounding separates them (a value at a rounding boundary may
// land one step apart: bf16's step is 8x f16's). The logits must also differ from the f32 cache's (the
// cache really is 16-bit or 8-bit). q8_0 needs a head_dim of whole blocks: tiny_qwen3 and tiny_moe (32);
// its bound, 1e-4 (measured: 2e-7), is below the 6e-4 to 2e-3 by which an f32 cache's logits differ
// from its on these models, so a reference that kept K and V unquantised would fail it.
TEST_CASE("f16, bf16 and q8_0 KV caches: the fast path matches the reference rounding the same", "[forward][kv_f16]") {
  for (const char* spec_name : {"tiny_llama", "tiny_qwen3", "tiny_moe", "tiny_qwen2"}) {
    for (const auto& [dt, kv] :
         {std::pair{DType::F16, DType::F16}, std::pair{DType::Q8_0, DType::F16}, std::pair{DType::Q8_0, DType::BF16},
          std::pair{DType::F16, DType::Q8_0}, std::pair{DType::Q8_0, DType::Q8_0}}) {
      ModelSpec s = builtin_spec(spec_name);
      if (s.head_dim % dtype_block_elems(kv) != 0) continue;
      s.dtype = dt;
      ThreadPool pool(2);
      auto src = make_synthetic_weights(s, 7, &pool);
      const auto toks = some_tokens(s.vocab_size, 19, 3);
      const auto ref = reference_logits(*src, toks, kv);
      const auto fast = test::fast_logits(*src, toks, 2, kv);
      const auto fast32 = test::fast_logits(*src, toks, 2, DType::F32);
      INFO(spec_name << " " << dtype_name(dt) << " weights, " << dtype_name(kv) << " cache");
      CHECK(test::max_rel_error(fast, ref, s.vocab_size) <= (kv == DType::F16    ? 1e-3
                                                             : kv == DType::BF16 ? 8e-3
                                                                                 : 1e-4));
      CHECK(argmax_rows(fast, s.vocab_size) == argmax_rows(ref, s.vocab_size));
      CHECK(fast != fast32);
    }
  }
}

// An f16 cache (half the bytes of f32) and a q8_0 one (34 bytes per 32 values: 17/64 of f32's): decode
// token by token over the cache equals one prefill as closely as over an f32 cache. A q8_0 cache's
// logits stay within a stated distance of an f32 cache's: 1% of each row's largest logit (measured on
// these models: 0.25% and 0.05%; 8-bit K and V: a value is off by at most half a step, a 254th of its
// block's largest). q8_0 needs a head_dim of whole blocks: tiny_llama's (48) is refused by the cache,
// the CPU blocks and the reference, naming it.
TEST_CASE("f16 and q8_0 KV caches: decode token by token equals one prefill in the type's bytes, q8_0 near f32",
          "[forward][kv_f16]") {
  struct Case {
    const char* spec;
    DType kv;
    uint64_t num, den;  // the cache's bytes over an f32 cache's
  };
  for (const Case& c :
       {Case{"tiny_llama", DType::F16, 1, 2}, Case{"tiny_moe", DType::F16, 1, 2}, Case{"tiny_qwen2", DType::F16, 1, 2},
        Case{"tiny_qwen3", DType::Q8_0, 17, 64}, Case{"tiny_moe", DType::Q8_0, 17, 64}}) {
    ModelSpec s = builtin_spec(c.spec);
    s.dtype = DType::Q8_0;
    ThreadPool pool(2);
    auto src = make_synthetic_weights(s, 4, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const auto toks = some_tokens(s.vocab_size, 15, 8);
    const int64_t V = s.vocab_size, n = static_cast<int64_t>(toks.size());
    const auto full = test::fast_logits(*src, toks, 2, c.kv);
    INFO(c.spec << " " << dtype_name(c.kv));
    if (c.kv == DType::Q8_0) {
      const auto full32 = test::fast_logits(*src, toks, 2, DType::F32);
      CHECK(test::max_rel_error(full, full32, V) <= 1e-2);
      CHECK(full != full32);
    }
    CpuModel model(w, pool);
    KvCache kv(s, 40, c.kv);
    CHECK(kv.dtype() == c.kv);
    CHECK(kv.bytes() * c.den == KvCache(s, 40).bytes() * c.num);
    std::vector<float> chunk(static_cast<size_t>(6 * V)), got;
    model.forward(toks.data(), 6, kv, chunk.data(), true);
    got = chunk;
    std::vector<float> step(static_cast<size_t>(V));
    for (int64_t i = 6; i < n; ++i) {
      model.forward(&toks[static_cast<size_t>(i)], 1, kv, step.data(), false);
      got.insert(got.end(), step.begin(), step.end());
    }
    CHECK(test::max_rel_error(got, full, V) <= 1e-5);
  }
  ModelSpec s = builtin_spec("tiny_llama");
  CHECK_THROWS_WITH(KvCache(s, 8, DType::Q4_0), Contains("q4_0") && Contains("f32, f16, bf16 or q8_0"));
  REQUIRE(s.head_dim == 48);
  CHECK_THROWS_WITH(KvCache(s, 8, DType::Q8_0), Contains("KV cache: a q8_0") && Contains("head_dim is 48"));
  ThreadPool pool(1);
  CpuBlocks blocks(s, RopeStyle::Neox, pool);
  CHECK_THROWS_WITH(blocks.set_kv_dtype(DType::Q8_0), Contains("q8_0") && Contains("head_dim is 48"));
  auto src = make_synthetic_weights(s, 1, &pool);
  CHECK_THROWS_WITH(reference_logits(*src, {1, 2}, DType::Q4_0), Contains("q4_0"));
  CHECK_THROWS_WITH(reference_logits(*src, {1, 2}, DType::Q8_0), Contains("multiple of 32") && Contains("is 48"));
}

TEST_CASE("KV cache: decode token by token and chunked prefill equal one prefill", "[forward]") {
  for (const char* spec_name : {"tiny_llama", "tiny_qwen3", "tiny_moe", "tiny_qwen2"}) {
    ModelSpec s = builtin_spec(spec_name);
    s.dtype = DType::Q8_0;
    ThreadPool pool(2);
    auto src = make_synthetic_weights(s, 3, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const auto toks = some_tokens(s.vocab_size, 21, 9);
    const int64_t V = s.vocab_size, n = static_cast<int64_t>(toks.size());
    const auto full = test::fast_logits(*src, toks);

    CpuModel model(w, pool);
    KvCache kv(s, 64);
    std::vector<float> step(static_cast<size_t>(V)), got;
    // 7 tokens as one chunk, then 5, then one at a time.
    std::vector<float> chunk(static_cast<size_t>(7 * V));
    model.forward(toks.data(), 7, kv, chunk.data(), true);
    got.insert(got.end(), chunk.begin(), chunk.end());
    chunk.resize(static_cast<size_t>(5 * V));
    model.forward(toks.data() + 7, 5, kv, chunk.data(), true);
    got.insert(got.end(), chunk.begin(), chunk.end());
    for (int64_t i = 12; i < n; ++i) {
      model.forward(&toks[static_cast<size_t>(i)], 1, kv, step.data(), false);
      got.insert(got.end(), step.begin(), step.end());
    }
    CHECK(kv.n_past() == n);
    INFO(spec_name);
    CHECK(test::max_rel_error(got, full, V) <= 1e-5);
  }
}

TEST_CASE("thread count does not change results beyond rounding", "[forward]") {
  ModelSpec s = builtin_spec("tiny_moe");
  s.dtype = DType::F16;
  ThreadPool pool(2);
  auto src = make_synthetic_weights(s, 5, &pool);
  const auto toks = some_tokens(s.vocab_size, 17, 2);
  const auto a = test::fast_logits(*src, toks, 1);
  const auto b = test::fast_logits(*src, toks, 3);
  CHECK(test::max_rel_error(a, b, s.vocab_size) <= 1e-6);
}

TEST_CASE("context overflow and bad token ids are clear errors", "[forward]") {
  ModelSpec s = builtin_spec("tiny_llama");
  ThreadPool pool(1);
  auto src = make_synthetic_weights(s, 1, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  CpuModel model(w, pool);
  KvCache kv(s, 4);
  std::vector<int32_t> toks = {1, 2, 3, 4, 5};
  std::vector<float> logits(static_cast<size_t>(5 * s.vocab_size));
  CHECK_THROWS_WITH(model.forward(toks.data(), 5, kv, logits.data(), true), Contains("--ctx"));
  std::vector<int32_t> bad = {1, static_cast<int32_t>(s.vocab_size)};
  CHECK_THROWS_WITH(model.forward(bad.data(), 2, kv, logits.data(), true), Contains("out of range"));
}

TEST_CASE("measured MoE routing: distinct experts per layer by token count", "[forward][routing]") {
  ThreadPool pool(2);
  auto src = open_weights(test::fixtures_dir() + "/hf/qwen3moe_nonorm");
  ModelWeights w = ModelWeights::from_source(*src);
  const ModelSpec& s = w.spec;
  REQUIRE(s.is_moe());
  const int64_t k = s.num_experts_per_tok, E = s.num_experts;
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back(static_cast<int32_t>((i * 7919 + 3) % s.vocab_size));
  const std::vector<int64_t> counts = {1, 2, 6, 24, 100};
  const auto d = measure_experts_touched(w, pool, toks, counts);
  REQUIRE(d.size() == counts.size());
  CHECK(d[0] == Approx(static_cast<double>(k)));  // one token: exactly its top-k
  for (size_t i = 0; i < d.size(); ++i) {
    CHECK(d[i] >= static_cast<double>(k) - 1e-9);
    CHECK(d[i] <= static_cast<double>(std::min<int64_t>(E, std::min<int64_t>(counts[i], 24) * k)) + 1e-9);
    if (i > 0) CHECK(d[i] >= d[i - 1] - 1e-9);
  }
  CHECK(d[4] == d[3]);  // more than the tokens measured: all of them
  // All 24 tokens: the mean over layers of the experts the observer saw in one forward pass.
  CpuModel m(w, pool);
  KvCache kv(s, 24);
  std::vector<std::set<int32_t>> seen(static_cast<size_t>(s.num_hidden_layers));
  m.set_routing_observer([&](int64_t l, const MoeRouting& r) {
    seen[static_cast<size_t>(l)].insert(r.expert_ids.begin(), r.expert_ids.end());
  });
  std::vector<float> logits(static_cast<size_t>(s.vocab_size));
  m.forward(toks.data(), 24, kv, logits.data(), false);
  double mean = 0;
  for (const auto& x : seen) mean += static_cast<double>(x.size());
  CHECK(d[3] == Approx(mean / static_cast<double>(seen.size())));
  // Dense models have no routing.
  const ModelSpec dense = builtin_spec("tiny_llama");
  auto dsrc = make_synthetic_weights(dense, 1, &pool);
  CHECK(measure_experts_touched(ModelWeights::from_source(*dsrc), pool, toks, counts).empty());
  CHECK(std::isnan(measure_next_layer_routing(ModelWeights::from_source(*dsrc), pool, toks)));
}

// A trained MoE router is load-balanced: n tokens touch about as many distinct experts per layer as
// tokens picking uniformly would, E(n) = E * (1 - (1 - k/E)^n), and over many tokens every expert takes
// a share near the mean. Synthetic weights must route so too (in every dtype), or a benchmark on them
// streams far fewer experts than a user's model would.
TEST_CASE("synthetic MoE weights route like a trained, load-balanced router", "[forward][routing]") {
  // 128 experts, top-8, all 48 layers (depth is what turns neighbours' hidden states alike), at a width
  // a unit test can run.
  ModelSpec s = builtin_spec("qwen30b");
  s.name = "qwen30b_narrow";
  s.hidden_size = 256;
  s.num_attention_heads = 4;
  s.num_key_value_heads = 2;
  s.head_dim = 64;
  s.moe_intermediate_size = 32;
  s.vocab_size = 2048;
  const int64_t E = s.num_experts, k = s.num_experts_per_tok, n = 512;
  const std::vector<int32_t> toks = some_tokens(s.vocab_size, static_cast<int>(n), 11);
  for (DType dt : {DType::Q4_0, DType::Q8_0, DType::F16, DType::Q4_K, DType::Q2_K, DType::Q6_K}) {
    s.dtype = dt;
    CAPTURE(dtype_name(dt));
    ThreadPool pool(2);
    auto src = make_synthetic_weights(s, 1, &pool);
    const ModelWeights w = ModelWeights::from_source(*src);
    CpuModel m(w, pool);
    KvCache kv(s, n);
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(s.num_hidden_layers));
    m.set_routing_observer([&](int64_t l, const MoeRouting& r) { ids[static_cast<size_t>(l)] = r.expert_ids; });
    std::vector<float> logits(static_cast<size_t>(s.vocab_size));
    m.forward(toks.data(), n, kv, logits.data(), false);
    const std::vector<int64_t> windows = {4, 16, 64, 512};
    std::vector<double> fewest(windows.size(), static_cast<double>(E));
    for (int64_t l = 0; l < s.num_hidden_layers; ++l) {
      CAPTURE(l);
      const std::vector<int32_t>& id = ids[static_cast<size_t>(l)];
      REQUIRE(static_cast<int64_t>(id.size()) == n * k);
      for (size_t wi = 0; wi < windows.size(); ++wi) {  // distinct experts per window of tokens, averaged
        const int64_t window = windows[wi];
        double sum = 0;
        for (int64_t t0 = 0; t0 < n; t0 += window)
          sum += static_cast<double>(std::set<int32_t>(id.begin() + t0 * k, id.begin() + (t0 + window) * k).size());
        const double measured = sum / static_cast<double>(n / window);
        const double uniform =
            static_cast<double>(E) *
            (1.0 - std::pow(1.0 - static_cast<double>(k) / static_cast<double>(E), static_cast<double>(window)));
        CAPTURE(window, measured, uniform);
        CHECK(std::abs(measured - uniform) <= 0.1 * uniform);
        fewest[wi] = std::min(fewest[wi], measured);
      }
      // Decode: each token's top-k, over all tokens. Every expert takes a share, and the shares spread
      // about as much as uniform picks' do (binomial: n p (1 - p), p = k/E); a trained router's are
      // not exactly uniform either, so up to twice that standard deviation.
      std::vector<int64_t> load(static_cast<size_t>(E), 0);
      for (int32_t e : id) ++load[static_cast<size_t>(e)];
      const double p = static_cast<double>(k) / static_cast<double>(E), mean = static_cast<double>(n) * p;
      double var = 0;
      for (int64_t c : load) var += (static_cast<double>(c) - mean) * (static_cast<double>(c) - mean);
      const double sd = std::sqrt(var / static_cast<double>(E)), uniform_sd = std::sqrt(mean * (1 - p));
      CAPTURE(sd, uniform_sd);
      CHECK(*std::min_element(load.begin(), load.end()) > 0);
      CHECK(sd <= 2.0 * uniform_sd);
    }
    std::vector<double> measured_fewest;  // what `plan --routing-tokens` reports as the fewest layer
    measure_experts_touched(w, pool, toks, windows, &measured_fewest);
    REQUIRE(measured_fewest.size() == windows.size());
    for (size_t wi = 0; wi < windows.size(); ++wi) CHECK(measured_fewest[wi] == Approx(fewest[wi]));
  }
  // The named alternative for studies: q4_0 codes drawn uniformly send a prompt to few experts.
  s.dtype = DType::Q4_0;
  ThreadPool pool(2);
  auto conc = make_synthetic_weights(s, 1, &pool, false, SyntheticRouting::Concentrated);
  const double uniform =
      static_cast<double>(E) * (1.0 - std::pow(1.0 - static_cast<double>(k) / static_cast<double>(E), 64.0));
  const std::vector<double> d = measure_experts_touched(ModelWeights::from_source(*conc), pool, toks, {64});
  REQUIRE(d.size() == 1);
  CHECK(d[0] < 0.75 * uniform);
}

TEST_CASE("measured MoE routing: the next layer's experts guessed from this layer's MoE input", "[forward][routing]") {
  ThreadPool pool(2);
  auto src = open_weights(test::fixtures_dir() + "/hf/qwen3moe_nonorm");
  const ModelWeights w = ModelWeights::from_source(*src);
  const ModelSpec& s = w.spec;
  REQUIRE(s.num_hidden_layers >= 2);
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back(static_cast<int32_t>((i * 7919 + 3) % s.vocab_size));
  // The fixture's layers differ: some guesses miss, some hit (uniform guessing gets k / E).
  const double real = measure_next_layer_routing(w, pool, toks);
  CHECK(real > 0.0);
  CHECK(real < 1.0);
  // Layers whose attention and experts add nothing (zero output projections) and that share layer 0's
  // router and FFN norm route every token alike: every guess is right.
  ModelWeights same = w;
  const LayerWeights& l0 = w.layers[0];
  std::vector<uint8_t> zeros(std::max(l0.wo.nbytes, l0.down_exps.nbytes), 0);
  for (LayerWeights& l : same.layers) {
    l.router = l0.router;
    l.ffn_norm = l0.ffn_norm;
    l.wo.data = zeros.data();
    l.down_exps.data = zeros.data();
    l.down_exp.clear();
  }
  CHECK(measure_next_layer_routing(same, pool, toks) == 1.0);
  // The measure follows the layers: the same weights give the same fraction.
  CHECK(measure_next_layer_routing(w, pool, toks) == real);
}

// Files that llama.cpp's llama-quantize wrote (tests/fixtures/kquants): its mixes of types per tensor
// (q4_K with q6_K for some attn_v / ffn_down and the output, q2_K with q3_K, an 8-expert MoE with q8_0
// attention...) and every block type alone. The f64 reference reads the same weights dequantised.
TEST_CASE("fast path matches the reference on llama-quantize's files of every block type and mix",
          "[forward][kquants]") {
  const std::string dir = test::fixtures_dir() + "/kquants/";
  for (const char* f : {"kq_llama.Q4_K_M", "kq_llama.Q5_K_M", "kq_llama.Q6_K", "kq_llama.Q2_K", "kq_llama.Q3_K_M",
                        "kq_llama.Q4_0", "kq_llama.pure_Q4_1", "kq_llama.pure_Q5_0", "kq_llama.pure_Q5_1",
                        "kq_llama.pure_IQ4_NL", "kq_llama.pure_Q2_K", "kq_llama.pure_Q3_K", "kq_moe.Q2_K"}) {
    auto src = open_weights(dir + f + ".gguf");
    const auto toks = some_tokens(src->spec().vocab_size, 13, 5);
    const auto ref = reference_logits(*src, toks);
    const auto fast = test::fast_logits(*src, toks);
    INFO(f);
    CHECK(test::max_rel_error(fast, ref, src->spec().vocab_size) <= 1e-4);
  }
}

// A vision-language prompt's language side: input embeddings (text rows and stand-in image rows) at
// multimodal RoPE positions, against the f64 reference; text alone is plain RoPE bit for bit.
TEST_CASE("M-RoPE: a step from embeddings at multimodal positions matches the reference", "[forward]") {
  ModelSpec s = builtin_spec("tiny_qwen2");
  s.mrope_section = {2, 3, 3};  // head_dim 16: 8 rotary pairs
  ThreadPool pool(2);
  auto src = make_synthetic_weights(s, 9, &pool);
  const ModelWeights w = ModelWeights::from_source(*src);
  const int64_t H = s.hidden_size, V = s.vocab_size, n = 12;
  const auto toks = some_tokens(V, static_cast<int>(n), 3);
  std::vector<float> x(static_cast<size_t>(n * H));
  embed_rows(w.token_embd, toks.data(), n, x.data());
  const std::vector<float> image = test::random_floats(static_cast<size_t>(6 * H), 17);
  std::copy(image.begin(), image.end(), x.begin() + 3 * H);  // rows 3..8: a 2x3 image
  const std::vector<int64_t> pos3 = {0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4, 3, 3, 5,
                                     3, 4, 3, 3, 4, 4, 3, 4, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8};
  CpuModel model(w, pool);
  KvCache kv(s, 32);
  std::vector<float> got(static_cast<size_t>(n * V));
  model.forward_embedded(x.data(), pos3.data(), n, kv, got.data(), true);
  const std::vector<float> ref = reference_logits_embedded(*src, x, pos3);
  CHECK(test::max_rel_error(got, ref, V) <= 1e-4);
  // Decode continues at position n + delta = 9 (all three equal), cache row n.
  std::vector<float> x1(static_cast<size_t>(H)), next(static_cast<size_t>(V));
  const int32_t t1 = 42;
  embed_rows(w.token_embd, &t1, 1, x1.data());
  const std::vector<int64_t> p1 = {9, 9, 9};
  model.forward_embedded(x1.data(), p1.data(), 1, kv, next.data(), false);
  std::vector<float> x_all = x;
  x_all.insert(x_all.end(), x1.begin(), x1.end());
  std::vector<int64_t> pos_all = pos3;
  pos_all.insert(pos_all.end(), p1.begin(), p1.end());
  const std::vector<float> ref_all = reference_logits_embedded(*src, x_all, pos_all);
  CHECK(test::max_rel_error(next, std::vector<float>(ref_all.end() - V, ref_all.end()), V) <= 1e-4);
  // The sections matter: the image's rows at plain positions give other logits.
  std::vector<int64_t> plain;
  for (int64_t t = 0; t < n; ++t) plain.insert(plain.end(), {t, t, t});
  CHECK(test::max_rel_error(reference_logits_embedded(*src, x, plain), ref, V) > 1e-3);
  // Text alone: equal positions from embeddings are forward() bit for bit.
  std::vector<float> xt(static_cast<size_t>(n * H)), a(static_cast<size_t>(n * V)), b(a.size());
  embed_rows(w.token_embd, toks.data(), n, xt.data());
  KvCache k1(s, 32), k2(s, 32);
  model.forward_embedded(xt.data(), plain.data(), n, k1, a.data(), true);
  model.forward(toks.data(), n, k2, b.data(), true);
  CHECK(a == b);
}

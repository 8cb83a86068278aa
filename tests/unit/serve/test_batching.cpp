// Continuous batching: the scheduler runs requests on several slots of one engine, stepping them
// together (decode tokens and prompt chunks in one step), and every request gets the tokens it gets
// alone — greedy or seeded sampling, with requests queued beyond the slots, joining and leaving at
// different steps, and one cancelled midway. Then the same through the HTTP server on the emulated
// device.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "serve_test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;

namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  bool done = false, failed = false;
  Usage usage;
};

// Every event of one request until its end (or 60 s).
Outcome drain(Channel& c) {
  Outcome o;
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (!o.done && !o.failed && Clock::now() < until)
    for (const shardwise::serve::Event& e : c.wait_take(std::chrono::milliseconds(100))) {
      o.tokens.insert(o.tokens.end(), e.tokens.begin(), e.tokens.end());
      o.done = o.done || e.kind == shardwise::serve::Event::Kind::Done;
      o.failed = o.failed || e.kind == shardwise::serve::Event::Kind::Failed;
      if (e.kind == shardwise::serve::Event::Kind::Done) o.usage = e.usage;
    }
  return o;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temp = 0.9f;
  p.top_k = 20;
  p.seed = seed;
  return p;
}

}  // namespace

TEST_CASE("serve: continuous batching over 4 slots gives every request its tokens alone", "[serve][batch]") {
  TestModel& m = test_model();
  const int slots = 4;
  CpuEngine cpu(m.served->weights, m.served->pool, slots * 256, slots);
  GatedEngine gate(cpu);
  Metrics metrics;
  SchedulerOptions o;
  o.parallel = slots;
  o.prefill_chunk = 16;  // long prompts take several steps, beside the others' decode tokens
  Scheduler sched(gate, *m.tok, metrics, o);
  const std::vector<std::string> texts = {
      "The first request is a greedy one with a prompt long enough for two chunks of prefill.",
      "Second: sampled with a seed.",
      "A third, greedy, short.",
      "The fourth request samples with another seed and a longer prompt than most of the others here.",
      "Fifth waits in the queue for a free slot.",
      "Sixth waits too, and is sampled."};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < texts.size(); ++i)
    reqs.push_back(generation(texts[i], 6 + 3 * static_cast<int64_t>(i), i % 2 ? seeded(40 + i) : greedy()));
  gate.close_gate();  // everything queued before the first step: the first steps hold several prompts
  std::vector<std::shared_ptr<Channel>> out;
  for (const GenerationRequest& r : reqs) {
    out.push_back(std::make_shared<Channel>());
    REQUIRE(sched.submit(r, out.back()) == Scheduler::Admit::Queued);
  }
  gate.open_gate();
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i);
    const Outcome got = drain(*out[i]);
    REQUIRE(got.done);
    CHECK(got.tokens == reference_generation(reqs[i].prompt, reqs[i].max_tokens, reqs[i].sampling, true).tokens);
    CHECK(got.usage.completion_tokens == reqs[i].max_tokens);
  }
  CHECK(gate.max_batch >= 3);  // the steps did carry several sequences
  CHECK(metrics.in_flight == 0);
  CHECK(metrics.requests_done == reqs.size());
  // Each slot holds what its last request stepped: a request that reuses it computes only the rest.
  size_t held = 0;
  for (int s = 0; s < slots; ++s) held += sched.cached_tokens(s).size();
  CHECK(held > 0);
}

TEST_CASE("serve: a request cancelled amid a batch leaves the others' tokens unchanged", "[serve][batch]") {
  TestModel& m = test_model();
  CpuEngine cpu(m.served->weights, m.served->pool, 3 * 256, 3);
  GatedEngine gate(cpu);
  Metrics metrics;
  SchedulerOptions o;
  o.parallel = 3;
  Scheduler sched(gate, *m.tok, metrics, o);
  const GenerationRequest a = generation("Stays to the end.", 24, greedy()),
                          b = generation("Leaves early.", 200, seeded(7)),
                          c = generation("Joins while the others run.", 12, seeded(9));
  auto ca = std::make_shared<Channel>(), cb = std::make_shared<Channel>(), cc = std::make_shared<Channel>();
  gate.delay_us = 2000;
  REQUIRE(sched.submit(a, ca) == Scheduler::Admit::Queued);
  REQUIRE(sched.submit(b, cb) == Scheduler::Admit::Queued);
  // b goes once it has a few tokens; c arrives meanwhile.
  std::vector<int32_t> b_tokens;
  while (b_tokens.size() < 4)
    for (const shardwise::serve::Event& e : cb->wait_take(std::chrono::milliseconds(50)))
      b_tokens.insert(b_tokens.end(), e.tokens.begin(), e.tokens.end());
  cb->cancel();
  REQUIRE(sched.submit(c, cc) == Scheduler::Admit::Queued);
  const Outcome ga = drain(*ca), gc = drain(*cc);
  REQUIRE(ga.done);
  REQUIRE(gc.done);
  CHECK(ga.tokens == reference_generation(a.prompt, a.max_tokens, a.sampling, true).tokens);
  CHECK(gc.tokens == reference_generation(c.prompt, c.max_tokens, c.sampling, true).tokens);
  const std::vector<int32_t> b_ref = reference_generation(b.prompt, 4, b.sampling, true).tokens;
  CHECK(std::vector<int32_t>(b_tokens.begin(), b_tokens.begin() + 4) == b_ref);
  for (int i = 0; i < 100 && metrics.in_flight > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(metrics.requests_cancelled == 1);
  CHECK(metrics.in_flight == 0);
}

TEST_CASE("serve: the scheduler refuses more slots than the engine has, with one clear line", "[serve][batch]") {
  TestModel& m = test_model();
  CpuEngine engine(m.served->weights, m.served->pool, 64);
  Metrics metrics;
  SchedulerOptions o;
  o.parallel = 2;
  try {
    Scheduler s(engine, *m.tok, metrics, o);
    FAIL("a scheduler of 2 slots was made over an engine of 1");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("--parallel 2") && Catch::Matchers::Contains("1 slots"));
  }
}

TEST_CASE("StepEngine::step_batch refuses a bad batch before it computes anything", "[serve][batch]") {
  TestModel& m = test_model();
  CpuEngine engine(m.served->weights, m.served->pool, 2 * 32, 2);
  std::vector<float> l0(static_cast<size_t>(engine.spec().vocab_size)), l1(l0.size());
  const std::vector<int32_t> t = {5, 6, 7}, bad = {5, 100000};
  CHECK_THROWS_WITH(engine.step_batch({{0, t.data(), 3, l0.data()}, {0, t.data(), 1, l1.data()}}),
                    Catch::Matchers::Contains("appears twice"));
  CHECK_THROWS_WITH(engine.step_batch({{2, t.data(), 3, l0.data()}}), Catch::Matchers::Contains("outside"));
  CHECK_THROWS_WITH(engine.step_batch({{1, bad.data(), 2, l0.data()}}), Catch::Matchers::Contains("out of range"));
  std::vector<int32_t> long_step(33, 5);
  CHECK_THROWS_WITH(engine.step_batch({{1, long_step.data(), 33, l0.data()}}),
                    Catch::Matchers::Contains("context is full"));
  CHECK(engine.n_past_of(0) == 0);
  CHECK(engine.n_past_of(1) == 0);
  engine.step_batch({{1, t.data(), 3, l1.data()}, {0, t.data(), 2, l0.data()}});
  CHECK(engine.n_past_of(0) == 2);
  CHECK(engine.n_past_of(1) == 3);
}

// Tests for what prefix reuse stands on: StepEngine::truncate on the CPU engine and the plan runtime
// (emulated device), generate()'s cached prompt, and a server on the
// emulated device (its tokens, its device metrics).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "executor/runtime/runtime.h"
#include "serve_test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;

namespace {

// The emulated device's run set-up of the test model (planned for `budget` bytes).
std::unique_ptr<RunSetup> emu_setup(LoadedModel& m, uint64_t budget, int64_t ctx) {
  RunSetupOptions o;
  o.device = "emu";
  o.ctx = ctx;
  o.machine.hw = "h200-host";
  o.planner.budget_bytes = budget;
  return std::make_unique<RunSetup>(m, o, completion_prompt("probe"));
}

std::vector<float> logits_after(StepEngine& e, const std::vector<int32_t>& tokens) {
  std::vector<float> l(static_cast<size_t>(e.spec().vocab_size));
  e.step(tokens.data(), static_cast<int64_t>(tokens.size()), l.data());
  return l;
}

// Truncating keeps the prefix's cache exactly: stepping new tokens after it gives the logits, bit for bit,
// of an engine that never held the dropped positions.
void check_truncate(StepEngine& used, StepEngine& fresh) {
  const std::vector<int32_t> prefix = completion_prompt("A common beginning,");
  const std::vector<int32_t> dropped = {50, 60, 70, 80, 90}, next = {11, 12, 13};
  logits_after(used, prefix);
  logits_after(used, dropped);
  CHECK(used.n_past() == static_cast<int64_t>(prefix.size() + dropped.size()));
  used.truncate(static_cast<int64_t>(prefix.size()));
  CHECK(used.n_past() == static_cast<int64_t>(prefix.size()));
  const std::vector<float> got = logits_after(used, next);
  logits_after(fresh, prefix);
  CHECK(got == logits_after(fresh, next));
  CHECK_THROWS_AS(used.truncate(used.n_past() + 1), Error);
  CHECK_THROWS_AS(used.truncate(-1), Error);
  used.truncate(0);
  CHECK(used.n_past() == 0);
}

}  // namespace

TEST_CASE("StepEngine::truncate keeps positions 0..n-1 exactly, on the CPU and on the emulated device",
          "[serve][truncate]") {
  TestModel& m = test_model();
  SECTION("cpu") {
    CpuEngine used(m.served->weights, m.served->pool, 256), fresh(m.served->weights, m.served->pool, 256);
    check_truncate(used, fresh);
  }
  SECTION("emu") {
    auto used = emu_setup(*m.served, 64 << 20, 256);
    auto fresh = emu_setup(*m.reference, 64 << 20, 256);
    REQUIRE(used->runtime() != nullptr);
    check_truncate(used->engine(), fresh->engine());
  }
}

TEST_CASE("generate with a cached prompt steps only the rest and gives the tokens of a full prefill",
          "[serve][truncate]") {
  TestModel& m = test_model();
  const std::vector<int32_t> prompt = completion_prompt("Reuse what is already computed, and only that.");
  const Reference ref = reference_generation(prompt, 12, greedy());
  CpuEngine engine(m.served->weights, m.served->pool, 512);
  std::vector<float> l(static_cast<size_t>(engine.spec().vocab_size));
  const int64_t cached = 9;
  engine.step(prompt.data(), cached, l.data());
  GenerateOptions go;
  go.n_predict = 12;
  go.sampling = greedy();
  go.stop_ids = m.tok->eog_ids();
  go.cached_prompt = cached;
  const GenerateResult r = generate(engine, prompt, go);
  CHECK(r.generated == ref.tokens);
  CHECK(r.n_prompt == static_cast<int64_t>(prompt.size()));
  CHECK(r.n_cached == cached);
  int64_t stepped = 0;
  for (const auto& s : r.steps) stepped += s.n_tokens;
  CHECK(stepped == static_cast<int64_t>(prompt.size()) - cached + static_cast<int64_t>(r.generated.size()) - 1);
  // The cache must hold exactly the cached prefix, and the last prompt token is always stepped.
  CpuEngine empty(m.served->weights, m.served->pool, 512);
  CHECK_THROWS_AS(generate(empty, prompt, go), Error);
  go.cached_prompt = static_cast<int64_t>(prompt.size());
  CHECK_THROWS_AS(generate(engine, prompt, go), Error);
}

TEST_CASE("serve: on the emulated device the server generates the CPU path's tokens and reports device memory",
          "[serve][emu]") {
  TestModel& m = test_model();
  const uint64_t budget = 64 << 20;
  auto setup = emu_setup(*m.served, budget, 1024);
  ServerOptions o;
  o.prefill_chunk = 0;  // as `run` on a device: the plan table's tiers cut the prompt
  TestServer s(setup->engine(), o, 1024, setup->runtime());
  CHECK(s.metric("shardwise_vram_arena_bytes") == budget);
  const std::string text = "The emulated device runs the same plans";
  const auto a =
      s.post("/v1/completions", {{"prompt", text}, {"max_tokens", 12}, {"temperature", 0}, {"return_tokens", true}});
  REQUIRE(a.status == 200);
  CHECK(a.body["choices"][0]["tokens"].get<std::vector<int32_t>>() ==
        reference_generation(completion_prompt(text), 12, greedy()).tokens);
  // Prefix reuse through Runtime::truncate.
  const std::string longer = text + " as a GPU would";
  const auto b =
      s.post("/v1/completions", {{"prompt", longer}, {"max_tokens", 12}, {"temperature", 0}, {"return_tokens", true}});
  REQUIRE(b.status == 200);
  CHECK(b.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>() > 10);
  CHECK(b.body["choices"][0]["tokens"].get<std::vector<int32_t>>() ==
        reference_generation(completion_prompt(longer), 12, greedy()).tokens);
  CHECK(s.metric("shardwise_vram_arena_peak_bytes") > 0);
  CHECK(s.metric("shardwise_vram_arena_peak_bytes") <= budget);
  CHECK(s.metric("shardwise_device_peak_bytes") > 0);
  CHECK(setup->runtime()->steps().size() == 1);  // the server keeps the step records from growing
}

// Budget changes while the model stays loaded (POST /admin/budget): the run set-up re-plans and replaces
// the runtime on the emulated device, the scheduler pauses its running requests between two steps and
// computes their caches again, and every request still gets the tokens it gets alone — through a
// shrink, a growth and a refused budget. The HTTP side's checks of the admin request.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "serve_test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;

TEST_CASE("serve: the VRAM budget shrinks and grows under load and every request keeps its tokens", "[serve][budget]") {
  TestModel& m = test_model();
  const int slots = 3;
  RunSetupOptions o;
  o.device = "emu";
  o.ctx = slots * 512;
  o.machine.hw = "h200-host";
  o.planner.budget_bytes = 64 << 20;
  o.runtime.slots = slots;
  RunSetup setup(*m.served, o, completion_prompt("probe"));
  SetupBudget control(setup);
  Metrics metrics;
  SchedulerOptions so;
  so.parallel = slots;
  so.prefill_chunk = 32;
  so.change_budget = [&](uint64_t b) { return control.change_budget(b); };
  so.engine = [&]() -> StepEngine& { return control.engine(); };
  Scheduler sched(setup.engine(), *m.tok, metrics, so);
  SamplingParams sampled;
  sampled.seed = 11;
  const std::vector<GenerationRequest> reqs = {
      generation("A long answer, greedy, through every change.", 160, greedy()),
      generation("Another one, sampled with a seed.", 140, sampled),
      generation("A third: greedy again.", 120, greedy())};
  std::vector<std::shared_ptr<Channel>> out;
  std::vector<Collected> got(reqs.size());
  for (const auto& r : reqs) {
    out.push_back(std::make_shared<Channel>());
    REQUIRE(sched.submit(r, out.back()) == Scheduler::Admit::Queued);
  }
  // Each change waits until the first request has made some progress since the last one.
  size_t seen = 0;
  const auto change = [&](uint64_t bytes) {
    while (got[0].tokens.size() < seen + 5 && !got[0].done)
      for (size_t i = 0; i < reqs.size(); ++i) collect(*out[i], got[i], std::chrono::milliseconds(5));
    seen = got[0].tokens.size();
    auto c = std::make_shared<Channel>();
    REQUIRE(sched.change_budget(bytes, c) == Scheduler::Admit::Queued);
    return finish(*c);
  };
  const Collected small = change(4 << 20), refused = change(1), large = change(96 << 20);
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i);
    got[i] = finish(*out[i], got[i]);
    INFO("failed " << got[i].failed << " status " << got[i].status << " tokens " << got[i].tokens.size());
    REQUIRE(got[i].done);
    CHECK(got[i].tokens == reference_generation(reqs[i].prompt, reqs[i].max_tokens, reqs[i].sampling, true).tokens);
  }
  REQUIRE(small.done);
  CHECK(json::parse(small.text)["vram_budget_bytes"] == 4u << 20);
  CHECK(json::parse(small.text)["device_peak_bytes"].get<uint64_t>() <= 64u << 20);
  CHECK(json::parse(small.text)["refilled_tokens"].get<int64_t>() > 0);  // the running caches were recomputed
  CHECK(refused.failed);
  CHECK(refused.status == 400);
  REQUIRE(large.done);
  CHECK(json::parse(large.text)["vram_budget_bytes"] == 96u << 20);
  CHECK(setup.runtime()->memory().budget_bytes == 96u << 20);
  CHECK(metrics.in_flight == 0);
}

TEST_CASE("serve: POST /admin/budget checks its body, its key and that the budget can change", "[serve][budget]") {
  ServerOptions o;
  o.api_key = "k";
  TestServer s(o);  // a CPU engine: no VRAM budget to change
  const HttpClient::Headers auth = {{"Authorization", "Bearer k"}};
  CHECK(s.post("/admin/budget", {{"vram_budget", "4G"}}).status == 401);
  for (const json& body : {json{{"vram_budget", "lots"}}, json{{"vram_budget", 1}}, json{{"vram_budget", true}},
                           json{{"budget", "4G"}}, json::array()}) {
    INFO(body.dump());
    const auto r = s.post("/admin/budget", body, auth);
    CHECK(r.status == 400);
    CHECK(r.body["error"]["message"].is_string());
  }
  const auto r = s.post("/admin/budget", {{"vram_budget", "4G"}}, auth);
  CHECK(r.status == 400);
  CHECK(r.body["error"]["code"] == "unsupported");
  CHECK(s.get("/admin/budget", auth).status == 405);
}

TEST_CASE("serve: POST /admin/budget on the emulated device answers the change and /metrics shows the new arena",
          "[serve][budget]") {
  TestModel& m = test_model();
  RunSetupOptions o;
  o.device = "emu";
  o.ctx = 1024;
  o.machine.hw = "h200-host";
  o.planner.budget_bytes = 64 << 20;
  RunSetup setup(*m.served, o, completion_prompt("probe"));
  SetupBudget control(setup);
  ServerOptions so;
  so.prefill_chunk = 0;
  so.budget = &control;
  TestServer s(setup.engine(), so, 1024, setup.runtime());
  const auto before =
      s.post("/v1/completions", {{"prompt", "Before the change"}, {"max_tokens", 6}, {"temperature", 0}});
  REQUIRE(before.status == 200);
  const auto r = s.post("/admin/budget", {{"vram_budget", "16M"}});
  INFO(r.text);
  REQUIRE(r.status == 200);
  CHECK(r.body["vram_budget_bytes"] == 16u << 20);
  CHECK(s.metric("shardwise_vram_arena_bytes") == 16u << 20);
  const auto after =
      s.post("/v1/completions", {{"prompt", "Before the change"}, {"max_tokens", 6}, {"temperature", 0}});
  REQUIRE(after.status == 200);
  CHECK(after.body["choices"][0]["text"] == before.body["choices"][0]["text"]);
}

TEST_CASE("serve: a budget change is refused for a saved plan table and on the CPU, the engine kept",
          "[serve][budget]") {
  TestModel& m = test_model();
  RunSetupOptions o;
  o.device = "emu";
  o.ctx = 512;
  o.machine.hw = "h200-host";
  o.planner.budget_bytes = 32 << 20;
  RunSetup planned(*m.served, o, completion_prompt("probe"));
  o.table = planned.runtime()->table();  // as `--plan TABLE.json` gives it
  RunSetup saved(*m.served, o, completion_prompt("probe"));
  StepEngine* before = &saved.engine();
  CHECK_THROWS_WITH(saved.change_budget(64 << 20), Catch::Matchers::Contains("--plan"));
  CHECK(&saved.engine() == before);
  CHECK(saved.runtime()->memory().budget_bytes == 32u << 20);
  RunSetupOptions cpu;
  cpu.ctx = 512;
  RunSetup on_cpu(*m.served, cpu, {});
  CHECK_THROWS_WITH(on_cpu.change_budget(64 << 20), Catch::Matchers::Contains("CPU"));
}

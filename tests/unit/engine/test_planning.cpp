// Tests for the engine's planning (engine/planning.h) and run set-up (engine/run_setup.h): the flags'
// values, the planner's config from the user's choices, the routing measured on weights, the policy
// that measures how well routers guess the next layer's experts where a plan streams them and plans
// again with the guess, and a run set up on the emulated device generating the CPU path's tokens.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/model_spec.h"
#include "engine/planning.h"
#include "engine/run_setup.h"
#include "executor/runtime/runtime.h"
#include "executor/session/generator.h"
#include "executor/traits.h"
#include "planner/plan.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// qwen30b's decode on the GPU host's datasheet at 4G: GPU-only streams its experts (the guess's case).
struct Qwen30b {
  ModelSpec spec = resolve_spec("qwen30b");
  std::unique_ptr<CostModel> cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig config(uint64_t budget = 4ull << 30) const {
    PlannerChoices c;
    c.budget_bytes = budget;
    c.ctx = 1024;
    c.threads = 16;
    c.tiers = {1};
    c.only = Schedule::GpuOnly;
    return planner_config(spec, c, facts_of_spec(spec, "qwen30b"));
  }
  const Plan& decode(const PlannedTable& t) const { return *t.table.lookup(1).find(Schedule::GpuOnly); }
};

std::vector<int32_t> greedy_tokens(StepEngine& engine, const std::vector<int32_t>& prompt, int64_t n) {
  GenerateOptions go;
  go.n_predict = n;
  go.prefill_chunk = 0;
  go.sampling.greedy = true;
  return generate(engine, prompt, go).generated;
}

}  // namespace

TEST_CASE("engine planning: --next-layer-hits is auto, off or a fraction, one error line otherwise",
          "[engine][planning]") {
  CHECK(parse_next_layer_hits("auto", "--next-layer-hits").mode == NextLayerHits::Mode::Auto);
  CHECK(parse_next_layer_hits("off", "--next-layer-hits").mode == NextLayerHits::Mode::Off);
  CHECK(parse_next_layer_hits("0", "--next-layer-hits").mode == NextLayerHits::Mode::Off);
  const NextLayerHits half = parse_next_layer_hits("0.5", "--next-layer-hits");
  CHECK(half.mode == NextLayerHits::Mode::Given);
  CHECK(half.fraction == 0.5);
  CHECK(parse_next_layer_hits("1", "--next-layer-hits").fraction == 1.0);
  CHECK_THAT(error_of([] { parse_next_layer_hits("often", "--next-layer-hits"); }),
             Contains("--next-layer-hits 'often'"));
  CHECK_THAT(error_of([] { parse_next_layer_hits("nan", "--next-layer-hits"); }), Contains("--next-layer-hits 'nan'"));
  CHECK_THAT(error_of([] { parse_next_layer_hits("1.5", "--next-layer-hits"); }),
             Contains("--next-layer-hits 1.5 must be a fraction"));
  CHECK_THAT(error_of([] { parse_next_layer_hits("-0.1", "--next-layer-hits"); }), Contains("must be a fraction"));
}

TEST_CASE("engine planning: threads and the planner's config from the user's choices", "[engine][planning]") {
  const Qwen30b q;
  CHECK(planner_threads(0, *q.cost, "--threads") == q.cost->max_threads());
  CHECK(planner_threads(7, *q.cost, "--threads") == 7);
  CHECK_THAT(error_of([&] { planner_threads(5000, *q.cost, "threads"); }), Contains("threads 5000 is out of range"));
  PlannerChoices c;
  c.budget_bytes = 123 << 20;
  c.ctx = 2048;
  c.threads = 3;
  c.kv_dtype = DType::F16;
  c.kv_layers = 5;
  c.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
  c.moe_split = 2;
  c.only = Schedule::Dynamic;
  c.tiers = {1, 64};
  ModelFacts facts{"m", {{"blk.0.ffn_gate_exps.weight", DType::Q8_0}}, 1};
  const PlannerConfig cfg = planner_config(q.spec, c, facts);
  CHECK(cfg.budget_bytes == c.budget_bytes);
  CHECK(cfg.ctx == 2048);
  CHECK(cfg.threads == 3);
  CHECK(cfg.kv_dtype == DType::F16);
  CHECK(cfg.kv_layers == 5);
  CHECK(cfg.host_kv_attention == PlannerConfig::HostKvAttention::Staged);
  CHECK(cfg.moe_cpu_experts == 2);
  CHECK(cfg.schedules == std::vector<Schedule>{Schedule::Dynamic});
  CHECK(cfg.tiers == std::vector<int64_t>{1, 64});
  CHECK(cfg.model_name == "m");
  CHECK(cfg.tensor_dtypes == facts.tensor_dtypes);
  // The executor's traits for the model, with the facts' copies per streamed expert.
  const ExecutorTraits traits = executor_traits(q.spec, 1);
  CHECK(cfg.executor.set());
  CHECK(cfg.executor.expert_copies == 1);
  CHECK(cfg.executor.scratch_fixed_bytes == traits.scratch_fixed_bytes);
  CHECK(cfg.executor.scratch_bytes_per_token == traits.scratch_bytes_per_token);
  CHECK(cfg.executor.gpu_fused_qkv_max_tokens == traits.gpu_fused_qkv_max_tokens);
  CHECK(cfg.executor.device_routing_max_tokens == traits.device_routing_max_tokens);
  // Unset choices keep the planner's defaults: every schedule, the default tiers.
  const PlannerConfig plain = planner_config(q.spec, PlannerChoices{}, facts_of_spec(q.spec, "q"));
  CHECK(plain.schedules == PlannerConfig{}.schedules);
  CHECK(plain.tiers == default_tiers());
  CHECK(plain.executor.expert_copies == synthetic_expert_copies(q.spec));
}

TEST_CASE("engine planning: auto measures the guess where a plan streams experts and plans again with it",
          "[engine][planning]") {
  const Qwen30b q;
  int calls = 0;
  auto guess = [&calls](double f) {
    return [&calls, f] {
      ++calls;
      return f;
    };
  };
  const PlannedTable off = plan_table(q.spec, *q.cost, q.config(), NextLayerHits::given(0), 16e9, guess(0.9));
  CHECK(calls == 0);
  CHECK(!off.guess_measured);
  CHECK(off.config.next_layer_hits == 0);
  CHECK(off.table.pcie_cap_gbps == 16);
  REQUIRE(plans_stream_experts(off.table, q.spec));

  const PlannedTable measured = plan_table(q.spec, *q.cost, q.config(), NextLayerHits{}, 16e9, guess(0.9));
  CHECK(calls == 1);
  CHECK(measured.guess_measured);
  CHECK(measured.config.next_layer_hits == 0.9);
  CHECK_THAT(q.decode(measured).notes, Contains("90% hits"));
  CHECK(q.decode(measured).predicted_ms < q.decode(off).predicted_ms);  // the table was planned again

  // A guess of nothing: measured, not planned again.
  calls = 0;
  const PlannedTable none = plan_table(q.spec, *q.cost, q.config(), NextLayerHits{}, 16e9, guess(0));
  CHECK(calls == 1);
  CHECK(none.config.next_layer_hits == 0);
  CHECK(q.decode(none).predicted_ms == q.decode(off).predicted_ms);

  // Given: that fraction, nothing measured.
  calls = 0;
  const PlannedTable given = plan_table(q.spec, *q.cost, q.config(), NextLayerHits::given(0.98), 16e9, guess(0.9));
  CHECK(calls == 0);
  CHECK(given.config.next_layer_hits == 0.98);
  CHECK_THAT(q.decode(given).notes, Contains("98% hits"));

  // A routing measured before planning (plan --routing-tokens, the sweep) is used as it is.
  PlannerConfig routed = q.config();
  MeasuredRouting r;
  r.next_layer_hits = 0.7;
  use_routing(routed, r);
  const PlannedTable before = plan_table(q.spec, *q.cost, routed, NextLayerHits{}, 0, guess(0.9));
  CHECK(calls == 0);
  CHECK(before.config.next_layer_hits == 0.7);
}

TEST_CASE("engine planning: no guess is measured where no plan streams experts, nor for a dense model",
          "[engine][planning]") {
  const Qwen30b q;
  int calls = 0;
  auto guess = [&calls] {
    ++calls;
    return 0.9;
  };
  // The whole model fits: nothing streams.
  const PlannedTable resident =
      plan_table(q.spec, *q.cost, q.config(2 * q.spec.total_bytes()), NextLayerHits{}, 0, guess);
  CHECK(!plans_stream_experts(resident.table, q.spec));
  CHECK(calls == 0);
  CHECK(resident.config.next_layer_hits == 0);
  // A dense model has no router to guess with, whatever is given.
  const ModelSpec dense = resolve_spec("nemo8b");
  PlannerChoices c;
  c.budget_bytes = 2ull << 30;
  c.ctx = 1024;
  c.threads = 16;
  c.tiers = {1};
  const PlannedTable d = plan_table(dense, *q.cost, planner_config(dense, c, facts_of_spec(dense, "nemo8b")),
                                    NextLayerHits::given(0.5), 0, guess);
  CHECK(calls == 0);
  CHECK(d.config.next_layer_hits == 0);
  CHECK(!plans_stream_experts(d.table, dense));
}

TEST_CASE("engine planning: an MoE model's routing measured on its weights", "[engine][planning][routing]") {
  const std::unique_ptr<WeightSource> src = open_weights("synthetic:tiny_moe?seed=3");
  LoadedModel m(*src, 2);
  const ModelSpec& spec = m.weights.spec;
  const std::vector<int32_t> toks = step_tokens(64, spec.vocab_size, 1);
  CHECK(toks == step_tokens(64, spec.vocab_size, 1));
  CHECK(toks != step_tokens(64, spec.vocab_size, 2));
  const MeasuredRouting r = measure_routing(m.weights, m.pool, toks, {16, 1, 4}, 8);
  CHECK(r.tokens == std::vector<int64_t>{1, 4, 16});
  CHECK(r.measured_on == 64);
  REQUIRE(r.experts.size() == 3);
  const double k = static_cast<double>(spec.num_experts_per_tok);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(r.experts[i] >= k - 1e-9);
    CHECK(r.experts[i] <=
          std::min<double>(static_cast<double>(spec.num_experts), static_cast<double>(r.tokens[i]) * k) + 1e-9);
  }
  CHECK(r.experts[0] == Approx(k));  // one token: its own top-k
  REQUIRE(r.fewest.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK((r.fewest[i] >= k - 1e-9 && r.fewest[i] <= r.experts[i] + 1e-9));
  CHECK(r.next_layer_measured);
  CHECK((r.next_layer_hits > 0 && r.next_layer_hits <= 1));
  PlannerConfig cfg;
  use_routing(cfg, r);
  CHECK(cfg.routing_tokens == r.tokens);
  CHECK(cfg.routing_experts == r.experts);
  CHECK(cfg.next_layer_hits == r.next_layer_hits);
  CHECK(measure_guess_on_prompt(m.weights, m.pool, toks) > 0);
}

TEST_CASE("engine run set-up: the emulated device plans, measures the guess and generates the CPU path's tokens",
          "[engine][run]") {
  const std::unique_ptr<WeightSource> src = open_weights(test::fixtures_dir() + "/hf/qwen3moe_nonorm");
  LoadedModel m(*src, 2);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  RunSetupOptions cpu;
  cpu.device = "cpu";
  cpu.ctx = 64;
  RunSetup on_cpu(m, cpu, prompt);
  CHECK(on_cpu.runtime() == nullptr);
  const std::vector<int32_t> expected = greedy_tokens(on_cpu.engine(), prompt, 6);

  RunSetupOptions emu;
  emu.device = "emu";
  emu.ctx = 64;
  emu.machine.hw = "h200-host";
  emu.planner.budget_bytes = 3 << 20;  // every expert streamed
  emu.planner.only = Schedule::GpuOnly;
  emu.runtime.schedule = Schedule::GpuOnly;
  RunSetup run(m, emu, prompt);
  REQUIRE(run.runtime() != nullptr);
  CHECK(run.device() != nullptr);
  CHECK((run.next_layer_hits() > 0 && run.next_layer_hits() <= 1));  // auto: measured on the prompt
  CHECK(greedy_tokens(run.engine(), prompt, 6) == expected);
  CHECK(run.runtime()->table().budget_bytes == 3u << 20);

  // A saved table is executed as it is: nothing planned, nothing measured.
  RunSetupOptions saved = emu;
  saved.table = run.runtime()->table();
  saved.machine = MachineChoice{};  // no cost model needed
  RunSetup again(m, saved, prompt);
  CHECK(again.next_layer_hits() == 0);
  CHECK(greedy_tokens(again.engine(), prompt, 6) == expected);
}

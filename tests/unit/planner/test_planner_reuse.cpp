// Tests for what the planner reuses between its candidate plans (planner/simulator.h StepPrices, the
// per-thread spares and the layout's plans the table takes): a returned plan is the plan made anew —
// its prediction that of its actions simulated afresh, its labels and shard names those of its fields —
// and the table is the same whatever the threads' timing.
#include <catch2/catch.hpp>
#include <string>

#include "core/hardware_spec.h"
#include "costmodel/cost_model.h"
#include "executor/traits.h"
#include "planner/planner.h"
#include "planner/simulator.h"

using namespace shardwise;

namespace {

constexpr uint64_t GiB = 1ull << 30;

// qwen30b in 2 GiB on the cli3 machine: most of its KV on the host (attention split and staged),
// speculative expert prefetch (guessed and missed experts), split experts and the LM head streamed in
// pieces — every kind of action.
PlannerConfig mixed_config(const ModelSpec& spec, int threads) {
  PlannerConfig c;
  c.executor = executor_traits(spec);
  c.budget_bytes = 2 * GiB;
  c.ctx = 16384;
  c.threads = threads;
  c.next_layer_hits = 0.6;
  return c;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

TEST_CASE("planner: a plan's prediction is its actions simulated anew, however many plans shared the prices",
          "[planner][simulate]") {
  const ModelSpec spec = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  const PlannerConfig cfg = mixed_config(spec, 4);
  const PlanTable t = build_plan_table(spec, *cost, cfg);
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
  int simulated = 0;
  for (const TierEntry& e : t.tiers) {
    StepShape step;
    step.tokens = e.tokens;
    step.keys = cfg.ctx;
    step.kv_dtype = cfg.kv_dtype;
    step.threads = cfg.threads;
    step.gpu_fused_qkv_max_tokens = cfg.executor.gpu_fused_qkv_max_tokens;
    StepPrices shared(spec, S, *cost, step);  // one step's prices for all its plans, twice over
    for (int round = 0; round < 2; ++round)
      for (const Plan& p : e.candidates) {
        if (!p.feasible) continue;
        INFO(schedule_name(p.schedule) << " at " << e.tokens << " tokens, round " << round);
        CHECK(repredict(p, spec, *cost, cfg) == p.predicted_ms);
        Plan again = p;
        CHECK(simulate(again, shared) == p.predicted_ms);
        for (size_t i = 0; i < p.actions.size(); ++i) {
          CHECK(again.actions[i].start_ms == p.actions[i].start_ms);
          CHECK(again.actions[i].end_ms == p.actions[i].end_ms);
        }
        ++simulated;
      }
  }
  CHECK(simulated > 8);
}

TEST_CASE("planner: the plans returned are labelled from their fields and their placements named",
          "[planner][verify]") {
  const ModelSpec spec = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  const PlannerConfig cfg = mixed_config(spec, 4);
  const PlanTable t = build_plan_table(spec, *cost, cfg);
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
  int guessed = 0, missed = 0, staged = 0, pieces = 0;
  for (const TierEntry& e : t.tiers)
    for (const Plan& p : e.candidates) {
      INFO(schedule_name(p.schedule) << " at " << e.tokens << " tokens");
      for (const ShardPlacement& sp : p.placements) CHECK(sp.name == S.at(sp.shard).name());
      for (const Action& a : p.actions) {
        INFO("action " << a.id << " (" << a.label << ")");
        if (a.kind == ActionKind::Embed) CHECK(a.label == "embed");
        if (a.kind == ActionKind::CopyLogits) CHECK(a.label == "logits");
        if (a.shard < 0 || a.kind == ActionKind::CopyLogits) continue;
        const std::string name = S.at(a.shard).name();
        CHECK(a.label.compare(0, name.size(), name) == 0);
        if (a.kind == ActionKind::Compute && a.row_end > 0) {
          CHECK(ends_with(a.label, "[" + std::to_string(a.row_begin) + ":" + std::to_string(a.row_end) + "]"));
          ++pieces;
        }
        if (a.kind == ActionKind::Compute && a.part == ComputePart::AttnStaged) ++staged;
        if (a.kind != ActionKind::CopyWeights) continue;
        bool after_guess = false;
        for (int d : a.deps) after_guess = after_guess || p.actions[static_cast<size_t>(d)].speculative;
        if (a.speculative) {
          CHECK(a.label == name + " guessed experts");
          ++guessed;
        } else if (after_guess) {
          CHECK(a.label == name + " missed experts");
          ++missed;
        } else {
          CHECK(a.label.compare(0, name.size() + 8, name + " weights") == 0);
        }
      }
    }
  CHECK(guessed > 0);
  CHECK(missed == guessed);
  CHECK(staged > 0);
  CHECK(pieces > 0);
}

TEST_CASE("planner: the same table whatever the threads' timing, and a single plan as the table has it", "[planner]") {
  const ModelSpec spec = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  const PlannerConfig cfg = mixed_config(spec, 8);
  const PlanTable t = build_plan_table(spec, *cost, cfg);
  CHECK(plan_table_to_json(build_plan_table(spec, *cost, cfg)) == plan_table_to_json(t));
  for (int64_t tier : {int64_t{1}, int64_t{16}})  // taken from the layout's choice, and planned anew
    for (Schedule s : {Schedule::Dynamic, Schedule::LayerSplit}) {
      INFO(schedule_name(s) << " at " << tier << " tokens");
      const Plan* p = t.find_tier(tier)->find(s);
      REQUIRE(p != nullptr);
      CHECK(plan_to_json(build_plan(spec, *cost, cfg, s, tier)) == plan_to_json(*p));
    }
}

// engine/planning.h — from the user's planner choices to a PlanTable, the same for every caller:
// the PlannerConfig (budget, ctx, threads, KV, schedules, tiers, the model file's facts), an MoE
// model's routing measured on its weights, and the policy that plans, measures how well routers guess
// the next layer's experts where a plan would use it, and plans again with the guess.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "costmodel/cost_model.h"
#include "executor/model/model_weights.h"
#include "planner/planner.h"

namespace shardwise {

// What plans assume of guessing each MoE layer's experts a layer early (PlannerConfig::next_layer_hits).
struct NextLayerHits {
  enum class Mode { Auto, Off, Given };
  Mode mode = Mode::Auto;
  double fraction = 0;                          // Given: in (0, 1]
  static NextLayerHits given(double fraction);  // 0: Off
};
// "auto", "off" or a fraction in [0, 1] (0: off); errors name `flag`.
NextLayerHits parse_next_layer_hits(const std::string& text, const char* flag);

// The user's planner choices (typed; the CLI parses its flags into them, Python its arguments).
struct PlannerChoices {
  uint64_t budget_bytes = 0;
  int64_t ctx = 4096;
  int threads = 1;  // resolved (planner_threads)
  DType kv_dtype = DType::F32;
  int kv_layers = -1;  // -1: chosen by simulating a request
  PlannerConfig::HostKvAttention host_kv_attention = PlannerConfig::HostKvAttention::Choose;
  int moe_split = -1;  // PlannerConfig::moe_cpu_experts
  // One schedule's own table (run --schedule S, plan --only S): the layout best for it, not for the
  // mix of schedules, in which it may not fit at all. Unset: every schedule, the fastest chosen.
  std::optional<Schedule> only;
  std::vector<int64_t> tiers;  // empty: default_tiers()
  NextLayerHits next_layer_hits;
  int sequences = 1;  // sequences a step may run at once (`serve --parallel`): their logits rows in the scratch
};

// 0: the cost model's machine's cores; else 1 to kMaxPoolThreads. Errors name `flag`.
int planner_threads(int requested, const CostModel& cost, const char* flag);

// What the planner needs of a model's weights beyond its spec.
struct ModelFacts {
  std::string name;            // the plan table's model
  TensorDtypes tensor_dtypes;  // storage dtypes where the file differs from the spec's rule
  int expert_copies = 3;       // copies the runtime makes of a streamed expert (ExecutorTraits::expert_copies)
};
// A weight file, or weights already made.
ModelFacts facts_of(const WeightSource& source, const std::string& name);
// A spec without weights (a builtin, a .yaml, synthetic:SPEC not made): as synthetic weights lay it out.
ModelFacts facts_of_spec(const ModelSpec& spec, const std::string& name);

// The planner's config, with the executor's traits for `spec` (the one place a plan's executor facts
// are filled in). next_layer_hits is set by plan_table (the policy below), not here.
PlannerConfig planner_config(const ModelSpec& spec, const PlannerChoices& choices, const ModelFacts& facts);

// An MoE model's routing measured on its weights (a CPU pass over `measured_on` step tokens).
struct MeasuredRouting {
  std::vector<int64_t> tokens;  // step sizes of the curve, ascending
  std::vector<double> experts;  // distinct experts per layer a step of that many tokens touches
  std::vector<double> fewest;   // the same for the layer that touches the fewest
  int64_t measured_on = 0;
  // The fraction of each token's experts a layer's router picks from the layer before's MoE input:
  // what speculative expert prefetch gets right. 0 where it cannot be measured (one layer).
  double next_layer_hits = 0;
  bool next_layer_measured = false;
};
// `curve_tokens` (sorted here) from `tokens`; the guess on the first `next_layer_tokens` of them.
MeasuredRouting measure_routing(const ModelWeights& weights, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                std::vector<int64_t> curve_tokens, size_t next_layer_tokens);
// The planner plans with the measured curve and guess rate.
void use_routing(PlannerConfig& cfg, const MeasuredRouting& routing);

// The tokens of a step of n tokens (seeded, the same in every call): what the oracle measures a step
// with, and what routing is measured on.
std::vector<int32_t> step_tokens(int64_t n, int64_t vocab, uint64_t seed);

// The guess rate measured on a prompt's first tokens (~0.1 s for qwen30b): `run`'s auto; 0 for a
// dense model or where it cannot be measured.
double measure_guess_on_prompt(const ModelWeights& weights, ThreadPool& pool, const std::vector<int32_t>& prompt);

// Whether some feasible plan of the table streams an MoE layer's experts (what a guess would speed up).
bool plans_stream_experts(const PlanTable& table, const ModelSpec& spec);

struct PlannedTable {
  PlanTable table;
  PlannerConfig config;         // as the table was planned, next_layer_hits included
  bool guess_measured = false;  // measure_guess ran
};

// The plan table, under the routing policy for the guess rate:
//   Given: that fraction; Off: none;
//   Auto: cfg's own (a routing measured before planning, use_routing), and where that is none, a plan
//   streams experts and `measure_guess` is given (run: measure_guess_on_prompt), the guess is
//   measured and, if any, the table planned again with it.
// A dense model has no router to guess with: none. The table records the PCIe cap (bytes/s) it was
// planned under.
PlannedTable plan_table(const ModelSpec& spec, const CostModel& cost, PlannerConfig cfg, const NextLayerHits& hits,
                        double pcie_cap_bytes_per_s, const std::function<double()>& measure_guess = {});

}  // namespace shardwise

// planner/planner.h — builds the PlanTable: for every token tier, a plan per schedule (GPU-only,
// Static, Dynamic, and the llama.cpp baselines layer-split and cpu-moe), each laid out in the VRAM
// arena by priority (attention > KV > FFN > output), timed by the simulator, and the fastest of the
// three schedules chosen. Pure CPU code: it reads a ModelSpec and a CostModel and runs nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"
#include "planner/executor_traits.h"
#include "planner/plan.h"
#include "planner/shard_layout.h"
#include "planner/simulator.h"

namespace shardwise {

// The paper's tiers: {1, 4, 16, 32, 64, 512, 1K, 2K, 4K, 8K, 16K} new tokens per step.
const std::vector<int64_t>& default_tiers();

struct PlannerConfig {
  uint64_t budget_bytes = 0;  // the arena: every device allocation for the model (DESIGN.md §6)
  int64_t ctx = 4096;         // KV capacity in tokens; steps are planned with the cache full
  int threads = 1;
  DType kv_dtype = DType::F32;
  std::vector<int64_t> tiers = default_tiers();
  std::vector<Schedule> schedules = {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit,
                                     Schedule::CpuMoe};
  std::string model_name;
  // Storage dtypes of the actual weight file where they differ from the spec's rule (optional).
  TensorDtypes tensor_dtypes;
  // MoE models: the weights' measured routing — mean distinct experts per layer that n consecutive
  // tokens are routed to, at ascending token counts (executor: measure_experts_touched). Empty =
  // tokens pick experts uniformly at random. It sets how many experts a step streams and computes.
  std::vector<int64_t> routing_tokens;
  std::vector<double> routing_experts;
  // MoE models: the fraction of each token's routed experts that the layer before's router input,
  // put through this layer's router, picks (executor: measure_next_layer_routing). > 0: GPU-only and
  // Dynamic plans are also made with speculative expert prefetch (plan.h router_next) and the faster
  // kept; 0 = not measured, no speculation.
  double next_layer_hits = 0;
  // Tests and studies: keep the speculative plan wherever speculation applies, faster or not.
  bool always_speculate = false;
  // KV layers kept in VRAM (the first ones; where their attention is not pinned, GPU-only and Dynamic
  // steps stream it, Static cannot run). -1: chosen with the LM head's place by simulating a request.
  int kv_layers = -1;
  // The LM head can be streamed in row pieces of any slot size; this is the slot it needs when
  // nothing larger is streamed (a larger head streams in pieces of at most this).
  uint64_t lm_head_piece_bytes = 256ull << 20;
  // Attention on the GPU of a layer whose KV is on the host: split (its core on the CPU over the host
  // cache) or staged (the cache copied to the arena, attended on the GPU, its new rows copied back):
  // Choose plans both and keeps the faster; Split and Staged force one where it fits (tests, studies).
  enum class HostKvAttention { Choose, Split, Staged };
  HostKvAttention host_kv_attention = HostKvAttention::Choose;
  // MoE, Dynamic: its CPU FFN layers' routed experts may be split (plan.h moe_cpu_share): -1 lets the
  // planner try every share of the top_k per token with the CPU; 0 never splits; N (1 .. top_k - 1)
  // makes every Dynamic plan split with that share (tests, studies).
  int moe_cpu_experts = -1;
  // The executor's facts the plans depend on (executor/traits.h: executor_traits gives them for a
  // model): its scratch per step, the token limits of its fused Q/K/V and of device routing, the copies
  // of a streamed expert. Required: a table planned without them would not fit the executor.
  ExecutorTraits executor;
};

// "choose" | "split" | "staged" (the CLI's --host-kv-attention); errors on anything else.
PlannerConfig::HostKvAttention parse_host_kv_attention(const std::string& text);

// Distinct experts per layer that a step of n tokens touches under cfg's routing (interpolated in
// log tokens between measured counts, held within [top_k, min(E, n·top_k)]), or 0 when the routing
// is not measured (the uniform expectation applies). Errors on a malformed curve.
double routing_experts_for(const ModelSpec& spec, const PlannerConfig& cfg, int64_t n);

// Builds every tier. Throws Error naming the smallest budget that works when no schedule fits even
// the decode tier.
PlanTable build_plan_table(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config);

// The smallest budget (bytes, a multiple of the arena's 256-byte alignment) for which some candidate
// schedule is feasible at the decode tier.
uint64_t minimum_budget(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config);

// One plan (the table's fixed layout decisions are recomputed for the given config).
Plan build_plan(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config, Schedule schedule,
                int64_t tier);

// The step time of `plan` (made for `config`) predicted again with another cost model: the same
// actions simulated anew (the oracle re-predicts a measured plan for the machine's state when it was
// measured). With the cost model the plan was made with, plan.predicted_ms.
double repredict(const Plan& plan, const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config);

// Human-readable placement of each shard with bytes, predicted time and why.
std::string explain_plan(const Plan& plan, const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config);

}  // namespace shardwise

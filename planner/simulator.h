// planner/simulator.h — predicts a plan's step latency by simulating its timeline over the four
// resources (GPU compute stream, H2D copy engine, D2H copy engine, CPU pool): each resource runs
// its actions in list order, an action starts when its resource is free and its dependencies have
// finished. CPU actions slow down while copies run, and copies while CPU work reads DRAM (DRAM
// contention): the simulation is repeated with each CPU action's bandwidth lowered by the copy
// traffic that overlapped it in the previous pass, and each copy slowed by the CPU's DRAM reads
// beside it (CostModel::copy_slowdown); the two host-to-device queues (weights; activations and
// staged KV caches) share the link, each copy slowed by the other queue's traffic beside it. The CPU
// resource is also the host thread that enqueues device work: a routed MoE layer's expert copies take it
// CostModel::copy_issue_ms per copy once their routing is known, before its next CPU action — except
// with more than one thread, where a split MoE layer's CPU share starts first and the host enqueues the
// layer's copies and GPU share beside it (lengthening the share by that work over the threads). A split
// MoE layer's shares each cost the block's fixed part once plus their experts' part. The timeline is also
// written as a Chrome trace, so a predicted and a measured timeline can be laid side by side.
#pragma once

#include <memory>
#include <string>

#include "costmodel/cost_model.h"
#include "planner/plan.h"
#include "planner/shard_ops.h"

namespace shardwise {

struct StepShape {
  int64_t tokens = 1;  // new tokens in the step
  int64_t keys = 1;    // cached keys each query attends to (the KV fill)
  DType kv_dtype = DType::F32;
  int threads = 1;
  double active_experts = 0;  // MoE: distinct experts per layer the step touches (0 = uniform routing)
  // The executor's ExecutorTraits::gpu_fused_qkv_max_tokens: GPU attention of steps up to this many
  // tokens projects Q, K and V as one matmul (0: never).
  int64_t gpu_fused_qkv_max_tokens = 0;
};

// The durations of one step's actions for a shard set and a cost model. A step's actions repeat a few
// shapes (every layer's ops are layer 0's) and the copy traffic beside a CPU action takes few distinct
// values, so each duration is asked of the cost model once and remembered by everything it depends on:
// the action's kind, part, resource, shard kind, split share, rows, bytes and copies (copies only), and
// the traffic beside it. The planner simulates thousands of candidate plans of one step with one of these,
// which also keeps the simulations' working memory. Not thread-safe (a cache): one per thread. The shards
// and the cost model must outlive it.
class StepPrices {
 public:
  StepPrices(const ModelSpec& spec, const ShardSet& shards, const CostModel& cost, const StepShape& step);
  ~StepPrices();
  StepPrices(const StepPrices&) = delete;
  StepPrices& operator=(const StepPrices&) = delete;

  // Duration of `a` alone, or (a CPU action) while copies move concurrent_pcie_gbps beside it.
  double action_ms(const Action& a, double concurrent_pcie_gbps);
  const CostModel& cost() const { return cost_; }
  const StepShape& step() const { return step_; }

 private:
  friend double simulate(Plan& plan, StepPrices& prices, int contention_passes);
  struct Impl;
  const ShardSet& shards_;
  const CostModel& cost_;
  const StepShape step_;
  std::unique_ptr<Impl> impl_;
};

// Fills start_ms/end_ms of every action and returns the step's makespan in ms.
double simulate(Plan& plan, StepPrices& prices, int contention_passes = 3);
double simulate(Plan& plan, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost, const StepShape& step,
                int contention_passes = 3);

// Duration of one action alone (no contention), for explanations.
double action_ms(const Action& a, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                 const StepShape& step, double concurrent_pcie_gbps = 0);

// Chrome trace ("traceEvents", one thread per resource) of a simulated plan.
std::string chrome_trace_json(const Plan& plan, const std::string& title);

}  // namespace shardwise

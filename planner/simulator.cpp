// planner/simulator.cpp — list-scheduling simulation with DRAM contention (see simulator.h).
#include "planner/simulator.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardwise {
namespace {

double ops_ms(const std::vector<Op>& ops, const CostModel& cost, const ExecEnv& env) {
  double t = 0;
  for (const Op& op : ops) t += cost.op_ms(op, env);
  return t;
}

}  // namespace

double action_ms(const Action& a, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                 const StepShape& step, double concurrent) {
  ExecEnv env;
  env.backend = a.resource == Resource::GpuCompute ? Backend::Gpu : Backend::Cpu;
  env.threads = step.threads;
  env.concurrent_pcie_gbps = concurrent;
  switch (a.kind) {
    case ActionKind::Embed: return ops_ms(embed_ops(spec, step.tokens), cost, env);
    case ActionKind::CopyWeights:
    case ActionKind::CopyActivations:
    case ActionKind::CopyLogits:
      return cost.transfer_ms(a.bytes, a.resource == Resource::D2H ? Direction::DeviceToHost : Direction::HostToDevice);
    case ActionKind::Compute: break;
  }
  const Shard& s = shards.at(a.shard);
  switch (s.kind) {
    case ShardKind::Attention: {
      const AttentionOps ops = attention_ops(spec, shards, s.layer, step.tokens, step.keys, step.kv_dtype);
      switch (a.part) {
        case ComputePart::Full: return ops_ms(ops.pre, cost, env) + ops_ms(ops.core, cost, env) + ops_ms(ops.post, cost, env);
        case ComputePart::AttnPre: return ops_ms(ops.pre, cost, env);
        case ComputePart::AttnCore: return ops_ms(ops.core, cost, env);
        case ComputePart::AttnPost: return ops_ms(ops.post, cost, env);
      }
      return 0;
    }
    case ShardKind::Ffn: return ops_ms(ffn_ops(spec, shards, s.layer, step.tokens), cost, env);
    case ShardKind::Output: {
      std::vector<Op> ops = output_ops(spec, shards);
      if (a.row_end > a.row_begin) {  // one piece of the LM head
        ops.erase(ops.begin());       // the final norm runs once, with the first piece
        ops.back().rows = a.row_end - a.row_begin;
        double t = ops_ms(ops, cost, env);
        if (a.row_begin == 0) t += ops_ms({output_ops(spec, shards).front()}, cost, env);
        return t;
      }
      return ops_ms(ops, cost, env);
    }
    default: fail("simulate: shard ", s.name(), " has no compute");
  }
}

double simulate(Plan& plan, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                const StepShape& step, int passes) {
  std::vector<Action>& acts = plan.actions;
  const size_t n = acts.size();
  // Durations without contention are fixed for everything but CPU work; cache them.
  std::vector<double> base(n);
  std::vector<bool> is_copy(n), is_cpu(n);
  for (size_t i = 0; i < n; ++i) {
    SW_CHECK(acts[i].id == static_cast<int>(i), "simulate: action ids must be their positions");
    base[i] = action_ms(acts[i], spec, shards, cost, step, 0);
    is_copy[i] = acts[i].resource == Resource::H2D || acts[i].resource == Resource::D2H;
    is_cpu[i] = acts[i].resource == Resource::Cpu && acts[i].kind == ActionKind::Compute;
  }
  std::vector<double> dur = base;
  double makespan = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass) {
    if (pass > 0) {
      // Copy traffic overlapping each CPU action in the previous pass lowers its DRAM bandwidth.
      for (size_t i = 0; i < n; ++i) {
        if (!is_cpu[i]) continue;
        const double s = acts[i].start_ms, e = acts[i].end_ms;
        if (e <= s) continue;
        double moved_gb = 0;
        for (size_t c = 0; c < n; ++c) {
          if (!is_copy[c] || acts[c].end_ms <= acts[c].start_ms) continue;
          const double ov = std::min(e, acts[c].end_ms) - std::max(s, acts[c].start_ms);
          if (ov <= 0) continue;
          moved_gb += static_cast<double>(acts[c].bytes) / 1e9 * ov / (acts[c].end_ms - acts[c].start_ms);
        }
        const double gbps = moved_gb / ((e - s) / 1e3);
        dur[i] = action_ms(acts[i], spec, shards, cost, step, gbps);
      }
    }
    double free_at[kNumResources] = {0, 0, 0, 0};
    makespan = 0;
    for (size_t i = 0; i < n; ++i) {
      Action& a = acts[i];
      double start = free_at[static_cast<int>(a.resource)];
      for (int d : a.deps) {
        SW_CHECK(d >= 0 && d < a.id, "simulate: action ", a.id, " depends on a later action ", d);
        start = std::max(start, acts[static_cast<size_t>(d)].end_ms);
      }
      a.start_ms = start;
      a.end_ms = start + dur[i];
      free_at[static_cast<int>(a.resource)] = a.end_ms;
      makespan = std::max(makespan, a.end_ms);
    }
  }
  return makespan;
}

std::string chrome_trace_json(const Plan& plan, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < kNumResources; ++r)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                      {"args", {{"name", resource_name(static_cast<Resource>(r))}}}});
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", title}}}});
  for (const Action& a : plan.actions) {
    events.push_back({{"name", a.label},
                      {"cat", action_kind_name(a.kind)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", static_cast<int>(a.resource)},
                      {"ts", a.start_ms * 1e3},
                      {"dur", (a.end_ms - a.start_ms) * 1e3},
                      {"args", {{"bytes", a.bytes}, {"id", a.id}, {"deps", a.deps}}}});
  }
  nlohmann::json j;
  j["traceEvents"] = events;
  j["displayTimeUnit"] = "ms";
  return j.dump();
}

}  // namespace shardwise

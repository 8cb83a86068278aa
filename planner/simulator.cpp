// planner/simulator.cpp — list-scheduling simulation with DRAM contention (see simulator.h).
#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardwise {
namespace {

double ops_ms(const std::vector<Op>& ops, const CostModel& cost, const ExecEnv& env) {
  double t = 0;
  for (const Op& op : ops) t += cost.op_ms(op, env);
  return t;
}

// The part of an MoE block's time that does not grow with its experts (launches or the pool's dispatch,
// the norm, the routing tables, the combine): from the block's times at 1 and 4 tokens, whose experts
// each carry about one token, T(n) = a + d(n)·b for d(n) distinct experts gives a = T1 - d1·b with
// b = (T4 - T1) / (d4 - d1); kept within [0, T1] (0 where the per-expert time rises with its tokens, as
// one CPU thread's does). On the H200 host's profile: GPU q4_0 qwen30b 12 of 35 us, CPU 16 threads 23
// of 288 us.
double moe_fixed_ms(const Op& moe, const CostModel& cost, const ExecEnv& env) {
  Op one = moe, four = moe;
  one.tokens = 1;
  four.tokens = 4;
  one.active_experts = four.active_experts = 0;
  const double d1 = one.experts_touched(), d4 = four.experts_touched();
  if (!(d4 > d1 + 0.5)) return 0;
  const double t1 = cost.op_ms(one, env), t4 = cost.op_ms(four, env);
  const double b = (t4 - t1) / (d4 - d1);
  if (!std::isfinite(b) || !std::isfinite(t1)) return 0;
  return std::clamp(t1 - d1 * b, 0.0, t1);
}

// The ops of every compute kind of one step, built once per simulation (shapes do not depend on
// the layer), so that timing an action is arithmetic only.
struct StepOps {
  std::vector<Op> embed, attn_pre, attn_pre_gpu, attn_core, attn_post, ffn, output, output_norm, output_head;
  std::vector<Op> router;  // MoE: the FFN norm and the router (the end of attn_post; alone: router_next)
  Op share_add;  // a split MoE layer's GPU share adds the CPU's partial: one f32 add over the step's rows
  double moe_fixed[2] = {0, 0};  // moe_fixed_ms of the step's MoE block on the CPU, on the GPU (alone)
  StepOps(const ModelSpec& spec, const ShardSet& shards, const StepShape& step, const CostModel& cost) {
    share_add.kind = OpKind::Elementwise;
    share_add.dtype = DType::F32;
    share_add.tokens = step.tokens;
    share_add.elems = step.tokens * spec.hidden_size;
    embed = embed_ops(spec, step.tokens);
    const int layer = shards.n_layers > 0 ? 0 : -1;
    if (layer >= 0) {
      AttentionOps a = attention_ops(spec, shards, layer, step.tokens, step.keys, step.kv_dtype, step.gpu_fused_qkv_max_tokens);
      attn_pre = std::move(a.pre);
      attn_pre_gpu = std::move(a.pre_gpu);
      attn_core = std::move(a.core);
      attn_post = std::move(a.post);
      if (spec.is_moe() && attn_post.size() >= 2) router.assign(attn_post.end() - 2, attn_post.end());
      ffn = ffn_ops(spec, shards, layer, step.tokens, step.active_experts);
    }
    output = output_ops(spec, shards);
    output_norm = {output.front()};
    output_head = {output.back()};
    for (const Op& op : ffn)
      if (op.kind == OpKind::MoeExperts)
        for (Backend b : {Backend::Cpu, Backend::Gpu}) {
          ExecEnv env;
          env.backend = b;
          env.threads = step.threads;
          moe_fixed[b == Backend::Gpu] = moe_fixed_ms(op, cost, env);
        }
  }
};

double timed(const Action& a, const StepOps& ops, const ShardSet& shards, const CostModel& cost, const StepShape& step,
             double concurrent) {
  ExecEnv env;
  env.backend = a.resource == Resource::GpuCompute ? Backend::Gpu : Backend::Cpu;
  env.threads = step.threads;
  env.concurrent_pcie_gbps = concurrent;
  switch (a.kind) {
    case ActionKind::Embed: return ops_ms(ops.embed, cost, env);
    case ActionKind::CopyWeights:  // a routed MoE FFN goes as several copies; transfer_burst_ms of one is transfer_ms
      return cost.transfer_burst_ms(a.bytes, a.copies, Direction::HostToDevice);
    case ActionKind::CopyActivations:
    case ActionKind::CopyLogits:
      return cost.transfer_ms(a.bytes, a.resource == Resource::D2H ? Direction::DeviceToHost : Direction::HostToDevice);
    case ActionKind::Compute: break;
  }
  const Shard& s = shards.at(a.shard);
  switch (s.kind) {
    case ShardKind::Attention: {
      const std::vector<Op>& pre = env.backend == Backend::Gpu ? ops.attn_pre_gpu : ops.attn_pre;
      switch (a.part) {
        case ComputePart::Full:
        case ComputePart::AttnStaged:  // (its layout conversions move the staged K, V once: HBM, negligible)
          return ops_ms(pre, cost, env) + ops_ms(ops.attn_core, cost, env) + ops_ms(ops.attn_post, cost, env);
        case ComputePart::AttnPre: return ops_ms(pre, cost, env);
        case ComputePart::AttnCore: return ops_ms(ops.attn_core, cost, env);
        case ComputePart::AttnPost: return ops_ms(ops.attn_post, cost, env);
        case ComputePart::RouterNext: return ops_ms(ops.router, cost, env);
        case ComputePart::MoeCpuShare:
        case ComputePart::MoeGpuShare:
        case ComputePart::MoeShareAdd: fail("simulate: ", s.name(), " is attention, not an MoE FFN to share");
      }
      return 0;
    }
    case ShardKind::Ffn: {
      if (a.part == ComputePart::MoeShareAdd) return cost.op_ms(ops.share_add, env);  // the CPU's partial added
      if (a.part != ComputePart::MoeCpuShare && a.part != ComputePart::MoeGpuShare) return ops_ms(ops.ffn, cost, env);
      // A share of an MoE layer split between CPU and GPU: the block's fixed part whole (each share runs
      // the block's kernels or loops once; launches and dispatch, timed without contention) and its part
      // of the experts' work (one token's k experts are k equal sets of three matmuls).
      double t = 0;
      for (const Op& op : ops.ffn) {
        const double whole = cost.op_ms(op, env);
        if (op.kind != OpKind::MoeExperts) {
          t += whole;
          continue;
        }
        const double k = std::max<double>(1, static_cast<double>(op.top_k));
        const double c = std::min<double>(a.cpu_experts, k);
        const double fixed = std::min(whole, ops.moe_fixed[env.backend == Backend::Gpu]);
        t += fixed + (whole - fixed) * (a.part == ComputePart::MoeCpuShare ? c : k - c) / k;
      }
      return t;
    }
    case ShardKind::Output: {
      if (a.row_end <= a.row_begin) return ops_ms(ops.output, cost, env);
      Op head = ops.output_head.front();  // one piece of the LM head; the norm runs with the first
      head.rows = a.row_end - a.row_begin;
      return cost.op_ms(head, env) + (a.row_begin == 0 ? ops_ms(ops.output_norm, cost, env) : 0.0);
    }
    default: fail("simulate: shard ", s.name(), " has no compute");
  }
}

// GB that the actions of one resource (`ids`, in list order = time order: they do not overlap each
// other) move or read within [s, e), each spread evenly over its own duration.
double overlap_gb(const std::vector<Action>& acts, const std::vector<size_t>& ids, double s, double e) {
  double gb = 0;
  auto it = std::partition_point(ids.begin(), ids.end(), [&](size_t i) { return acts[i].end_ms <= s; });
  for (; it != ids.end() && acts[*it].start_ms < e; ++it) {
    const Action& a = acts[*it];
    if (a.end_ms <= a.start_ms) continue;
    const double ov = std::min(e, a.end_ms) - std::max(s, a.start_ms);
    if (ov > 0) gb += static_cast<double>(a.bytes) / 1e9 * ov / (a.end_ms - a.start_ms);
  }
  return gb;
}

// Fraction of [s, e) during which the actions `ids` of one resource (in time order) are running.
double busy_fraction(const std::vector<Action>& acts, const std::vector<size_t>& ids, double s, double e) {
  if (e <= s) return 0;
  double busy = 0;
  auto it = std::partition_point(ids.begin(), ids.end(), [&](size_t i) { return acts[i].end_ms <= s; });
  for (; it != ids.end() && acts[*it].start_ms < e; ++it) busy += std::max(0.0, std::min(e, acts[*it].end_ms) - std::max(s, acts[*it].start_ms));
  return std::min(1.0, busy / (e - s));
}

}  // namespace

double action_ms(const Action& a, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                 const StepShape& step, double concurrent) {
  return timed(a, StepOps(spec, shards, step, cost), shards, cost, step, concurrent);
}

double simulate(Plan& plan, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                const StepShape& step, int passes) {
  std::vector<Action>& acts = plan.actions;
  const size_t n = acts.size();
  const StepOps ops(spec, shards, step, cost);
  std::vector<double> dur(n), dur_alone(n);
  std::vector<size_t> cpu_work;
  std::vector<size_t> copies[3];  // per copy queue (weights, activations to the GPU, to the host), in list order = time order
  for (size_t i = 0; i < n; ++i) {
    SW_CHECK(acts[i].id == static_cast<int>(i), "simulate: action ids must be their positions");
    dur[i] = dur_alone[i] = timed(acts[i], ops, shards, cost, step, 0);
    if (acts[i].resource == Resource::H2D) copies[0].push_back(i);
    if (acts[i].resource == Resource::D2H) copies[1].push_back(i);
    if (acts[i].resource == Resource::H2DAct) copies[2].push_back(i);
    if (acts[i].resource == Resource::Cpu && acts[i].kind == ActionKind::Compute) cpu_work.push_back(i);
  }
  const double issue_ms = cost.copy_issue_ms(), launch_ms = cost.launch_ms();
  // Kernels of a split layer's GPU share as the CUDA MoE block runs a decode step (executor/cuda/blocks.cu
  // moe_decode: the norm, the experts' gate/up and down GEMVs, the weighted combine); longer steps launch
  // more, and this stays their lower bound.
  constexpr int kGpuShareLaunches = 4;
  // With a pool of more than one thread, a split layer's CPU share starts before the host enqueues the
  // layer's routed expert copies and GPU share: the host thread enqueues them while the pool's other
  // threads compute (runtime.cpp, ThreadPool::set_caller_work), so that work lengthens the share by its
  // time over the threads instead of delaying it. One thread enqueues first, then computes.
  const bool host_beside_share = step.threads > 1;
  std::vector<int> share_of_layer;  // a layer's MoeCpuShare action, -1 if none
  for (const Action& a : acts)
    if (a.part == ComputePart::MoeCpuShare && a.resource == Resource::Cpu && a.layer >= 0) {
      if (share_of_layer.size() <= static_cast<size_t>(a.layer)) share_of_layer.resize(static_cast<size_t>(a.layer) + 1, -1);
      share_of_layer[static_cast<size_t>(a.layer)] = a.id;
    }
  auto share_of = [&](const Action& a) {
    return a.layer >= 0 && static_cast<size_t>(a.layer) < share_of_layer.size() ? share_of_layer[static_cast<size_t>(a.layer)] : -1;
  };
  double makespan = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass) {
    if (pass > 0) {
      // Copy traffic overlapping each CPU action in the previous pass lowers its DRAM bandwidth.
      for (size_t i : cpu_work) {
        const double s = acts[i].start_ms, e = acts[i].end_ms;
        if (e <= s) continue;
        double moved_gb = 0;
        for (const auto& engine : copies) moved_gb += overlap_gb(acts, engine, s, e);
        dur[i] = timed(acts[i], ops, shards, cost, step, moved_gb / ((e - s) / 1e3));
      }
      // CPU work reading DRAM beside each copy in the previous pass slows the copy. The two
      // host-to-device queues (weights, activations and staged KV) share the link: while the other
      // runs, each gets half of it, so a copy whose window the other queue filled for a fraction f
      // takes 1 / (1 - f/2) times as long.
      for (int q = 0; q < 3; ++q)
        for (size_t c : copies[q]) {
          const double s = acts[c].start_ms, e = acts[c].end_ms;
          if (e <= s) continue;
          const double read_gb = overlap_gb(acts, cpu_work, s, e);
          const Direction dir = q == 1 ? Direction::DeviceToHost : Direction::HostToDevice;
          const double shared = q == 1 ? 0.0 : busy_fraction(acts, copies[q == 0 ? 2 : 0], s, e);
          dur[c] = dur_alone[c] * cost.copy_slowdown(dir, read_gb / ((e - s) / 1e3)) / (1.0 - 0.5 * shared);
        }
    }
    double free_at[kNumResources] = {};
    double caller_free = 0;                // the host thread, enqueuing beside a CPU share
    std::vector<double> caller_work(n, 0);  // per CPU share: the host's enqueue work beside it, ms
    makespan = 0;
    for (size_t i = 0; i < n; ++i) {
      Action& a = acts[i];
      double ready = 0;
      for (int d : a.deps) {
        SW_CHECK(d >= 0 && d < a.id, "simulate: action ", a.id, " depends on a later action ", d);
        ready = std::max(ready, acts[static_cast<size_t>(d)].end_ms);
      }
      double start = std::max(free_at[static_cast<int>(a.resource)], ready);
      // This layer's CPU share, when the host enqueues this action beside it: the layer's routed expert
      // copies (before the share in the list, all its dependencies earlier still) and its GPU share.
      int beside = -1;
      if (host_beside_share && a.cpu_experts > 0 && !a.speculative &&
          (a.kind == ActionKind::CopyWeights || a.part == ComputePart::MoeGpuShare)) {
        beside = share_of(a);
      }
      if (beside >= 0) {
        const Action& share = acts[static_cast<size_t>(beside)];
        double share_start = share.start_ms;
        if (beside > a.id) {  // the share comes later in the list: when its dependencies so far are done
          share_start = free_at[static_cast<int>(Resource::Cpu)];  // (routing and x, copied down beside each other)
          for (int d : share.deps)
            if (d < a.id) share_start = std::max(share_start, acts[static_cast<size_t>(d)].end_ms);
          for (int d : a.deps) {
            const Action& b = acts[static_cast<size_t>(d)];
            if (b.payload == Payload::RouterLogits || b.resource == Resource::Cpu) share_start = std::max(share_start, b.end_ms);
          }
        }
        const double host = std::max(caller_free, share_start);
        const double work = a.kind == ActionKind::CopyWeights ? a.copies * issue_ms : kGpuShareLaunches * launch_ms;
        caller_free = host + work;
        if (a.kind == ActionKind::CopyWeights || beside > a.id) caller_work[static_cast<size_t>(beside)] += work;
        start = std::max(start, host + (a.kind == ActionKind::CopyWeights ? issue_ms : launch_ms));
      } else if (issue_ms > 0 && a.kind == ActionKind::CopyWeights && a.copies > 1) {
        // A routed MoE layer's expert copies: the host thread enqueues them itself once their routing
        // is known (and it is done with the CPU work before), computing nothing meanwhile, one by one
        // (Device::copy_h2d_batch); the first starts after its own enqueue (runtime.cpp's issue order),
        // the copy engine then keeps ahead of the host's issue.
        const double host = std::max(free_at[static_cast<int>(Resource::Cpu)], ready);
        free_at[static_cast<int>(Resource::Cpu)] = host + a.copies * issue_ms;
        start = std::max(start, host + issue_ms);
      }
      if (beside < 0 && launch_ms > 0 && a.part == ComputePart::MoeGpuShare) {
        // A split layer's GPU share: the host enqueues its kernels once the routing is on the host (the
        // device waits for the rest), before it computes the CPU's share (runtime.cpp's issue order).
        double routed = 0;
        for (int d : a.deps) {
          const Action& b = acts[static_cast<size_t>(d)];
          if (b.payload == Payload::RouterLogits || b.resource == Resource::Cpu) routed = std::max(routed, b.end_ms);
        }
        const double host = std::max(free_at[static_cast<int>(Resource::Cpu)], routed);
        free_at[static_cast<int>(Resource::Cpu)] = host + kGpuShareLaunches * launch_ms;
        start = std::max(start, host + launch_ms);
      }
      double d_i = dur[i];
      if (host_beside_share && a.part == ComputePart::MoeCpuShare && a.resource == Resource::Cpu)
        d_i += caller_work[i] / step.threads;  // the caller joins late
      a.start_ms = start;
      a.end_ms = start + d_i;
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

// planner/simulator.cpp — list-scheduling simulation with DRAM contention (see simulator.h).
#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
  Op share_add;            // a split MoE layer's GPU share adds the CPU's partial: one f32 add over the step's rows
  double moe_fixed[2] = {0, 0};  // moe_fixed_ms of the step's MoE block on the CPU, on the GPU (alone)
  StepOps(const ModelSpec& spec, const ShardSet& shards, const StepShape& step, const CostModel& cost) {
    share_add.kind = OpKind::Elementwise;
    share_add.dtype = DType::F32;
    share_add.tokens = step.tokens;
    share_add.elems = step.tokens * spec.hidden_size;
    embed = embed_ops(spec, step.tokens);
    const int layer = shards.n_layers > 0 ? 0 : -1;
    if (layer >= 0) {
      AttentionOps a =
          attention_ops(spec, shards, layer, step.tokens, step.keys, step.kv_dtype, step.gpu_fused_qkv_max_tokens);
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
    case ActionKind::Embed:
      return ops_ms(ops.embed, cost, env);
    case ActionKind::CopyWeights:  // a routed MoE FFN goes as several copies; transfer_burst_ms of one is transfer_ms
      return cost.transfer_burst_ms(a.bytes, a.copies, Direction::HostToDevice);
    case ActionKind::CopyActivations:
    case ActionKind::CopyLogits:
      return cost.transfer_ms(a.bytes, a.resource == Resource::D2H ? Direction::DeviceToHost : Direction::HostToDevice);
    case ActionKind::Compute:
      break;
  }
  const Shard& s = shards.at(a.shard);
  switch (s.kind) {
    case ShardKind::Attention: {
      const std::vector<Op>& pre = env.backend == Backend::Gpu ? ops.attn_pre_gpu : ops.attn_pre;
      switch (a.part) {
        case ComputePart::Full:
        case ComputePart::AttnStaged:  // (its layout conversions move the staged K, V once: HBM, negligible)
          return ops_ms(pre, cost, env) + ops_ms(ops.attn_core, cost, env) + ops_ms(ops.attn_post, cost, env);
        case ComputePart::AttnPre:
          return ops_ms(pre, cost, env);
        case ComputePart::AttnCore:
          return ops_ms(ops.attn_core, cost, env);
        case ComputePart::AttnPost:
          return ops_ms(ops.attn_post, cost, env);
        case ComputePart::RouterNext:
          return ops_ms(ops.router, cost, env);
        case ComputePart::MoeCpuShare:
        case ComputePart::MoeGpuShare:
        case ComputePart::MoeShareAdd:
          fail("simulate: ", s.name(), " is attention, not an MoE FFN to share");
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
    default:
      fail("simulate: shard ", s.name(), " has no compute");
  }
}

// What an action's duration depends on (timed reads no other field), packed in words: its kind,
// resource, part, shard kind (computes), split share and copies (copies), its rows, its bytes (copies),
// and the copy traffic beside it (its bits: equal traffic, equal time).
struct PriceKey {
  uint64_t w[6];
  bool operator==(const PriceKey& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3] && w[4] == o.w[4] && w[5] == o.w[5];
  }
  uint64_t hash() const {
    uint64_t h = 0;
    for (uint64_t v : w) h = (h ^ v) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
  }
};
PriceKey price_key(const Action& a, const ShardSet& shards, double concurrent) {
  const bool compute = a.kind == ActionKind::Compute;
  const uint64_t shard_kind = compute ? static_cast<uint64_t>(shards.at(a.shard).kind) + 1 : 0;
  const uint64_t small = static_cast<uint64_t>(a.kind) | static_cast<uint64_t>(a.resource) << 8 |
                         static_cast<uint64_t>(a.part) << 16 | shard_kind << 24 |
                         static_cast<uint64_t>(static_cast<uint32_t>(compute ? 0 : a.copies)) << 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &concurrent, sizeof bits);
  return {{small, static_cast<uint64_t>(static_cast<uint32_t>(a.cpu_experts)), static_cast<uint64_t>(a.row_begin),
           static_cast<uint64_t>(a.row_end), compute ? 0 : a.bytes, bits}};
}

// Durations by PriceKey: open addressing in a power-of-two table, at most half full.
class PriceMemo {
 public:
  // The duration stored for k, or null.
  const double* find(const PriceKey& k) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = k.hash() & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == k) return &s.ms;
    }
  }
  void insert(const PriceKey& k, double ms) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = k.hash() & mask_;
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i] = {k, ms, true};
    ++size_;
  }

 private:
  struct Slot {
    PriceKey key;
    double ms;
    bool used;
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(64, 2 * old.size()), Slot{});
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& s : old)
      if (s.used) insert(s.key, s.ms);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

// An action's place on the timeline, as the contention pass reads it: the actions of one resource in
// list order (= time order: they do not overlap each other), packed apart from the actions.
struct Span {
  double start, end;
  double gb;  // bytes moved or read, in GB
};
// The spans of `ids`; true where their ends ascend (each starts once the one before ended: durations
// are not negative).
bool spans_of(const std::vector<Action>& acts, const std::vector<size_t>& ids, std::vector<Span>& out) {
  out.resize(ids.size());
  bool ascending = true;
  for (size_t k = 0; k < ids.size(); ++k) {
    const Action& a = acts[ids[k]];
    out[k] = {a.start_ms, a.end_ms, static_cast<double>(a.bytes) / 1e9};
    ascending = ascending && (k == 0 || out[k - 1].end <= out[k].end);
  }
  return ascending;
}

// The first of a resource's spans that ends after s (std::partition_point's answer). Queried at
// times that mostly ascend, over spans whose ends ascend (each starts once the one before ended), it
// walks on from the last answer instead of searching: the spans before it ended before the last time
// asked, so before this one too. Where the ends do not ascend (a negative duration) it searches.
class SpanIndex {
 public:
  // ascending: the spans' ends ascend (spans_of says).
  void reset(const std::vector<Span>& spans, bool ascending) {
    spans_ = &spans;
    at_ = 0;
    last_ = -INFINITY;
    ascending_ = ascending;
  }
  std::vector<Span>::const_iterator first_after(double s) {
    const std::vector<Span>& v = *spans_;
    if (!ascending_) return std::partition_point(v.begin(), v.end(), [&](const Span& a) { return a.end <= s; });
    if (!(s >= last_)) at_ = 0;
    while (at_ < v.size() && v[at_].end <= s) ++at_;
    last_ = s;
    return v.begin() + static_cast<std::ptrdiff_t>(at_);
  }
  const std::vector<Span>& spans() const { return *spans_; }

 private:
  const std::vector<Span>* spans_ = nullptr;
  size_t at_ = 0;
  double last_ = -INFINITY;
  bool ascending_ = true;
};

// GB that the spans of one resource move or read within [s, e), each spread evenly over its own duration.
double overlap_gb(SpanIndex& index, double s, double e) {
  double gb = 0;
  for (auto it = index.first_after(s); it != index.spans().end() && it->start < e; ++it) {
    if (it->end <= it->start) continue;
    const double ov = std::min(e, it->end) - std::max(s, it->start);
    if (ov > 0) gb += it->gb * ov / (it->end - it->start);
  }
  return gb;
}

// Fraction of [s, e) during which the spans of one resource are running.
double busy_fraction(SpanIndex& index, double s, double e) {
  if (e <= s) return 0;
  double busy = 0;
  for (auto it = index.first_after(s); it != index.spans().end() && it->start < e; ++it)
    busy += std::max(0.0, std::min(e, it->end) - std::max(s, it->start));
  return std::min(1.0, busy / (e - s));
}

// Kernels of a split layer's GPU share as the CUDA MoE block runs a decode step (executor/cuda/blocks.cu
// moe_decode: the norm, the experts' gate/up and down GEMVs, the weighted combine); longer steps launch
// more, and this stays their lower bound.
constexpr int kGpuShareLaunches = 4;

// What a simulation keeps between its passes, reused from one simulation to the next (StepPrices
// holds one: it serves one thread).
struct SimWork {
  std::vector<double> dur, dur_alone;
  std::vector<size_t> cpu_work;   // CPU computes, in list order = time order
  std::vector<size_t> copies[3];  // per copy queue (weights, activations to the GPU, to the host), likewise
  std::vector<Span> copy_spans[3], cpu_spans;  // their places on the last pass's timeline
  std::vector<int> share_of_layer;             // a layer's MoeCpuShare action, -1 if none
  std::vector<double> caller_work;             // per CPU share: the host's enqueue work beside it, ms
};

// One simulation of a plan's step: the actions' durations alone, then passes over the list that place
// each action on its resource after its dependencies, the later passes with the DRAM contention of the
// pass before.
class Simulation {
 public:
  Simulation(std::vector<Action>& acts, StepPrices& prices, SimWork& w)
      : acts_(acts),
        prices_(prices),
        cost_(prices.cost()),
        step_(prices.step()),
        n_(acts.size()),
        w_(w),
        issue_ms_(cost_.copy_issue_ms()),
        launch_ms_(cost_.launch_ms()),
        host_beside_share_(step_.threads > 1) {
    w_.dur.resize(n_);
    w_.dur_alone.resize(n_);
    w_.cpu_work.clear();
    for (auto& q : w_.copies) q.clear();
    w_.share_of_layer.clear();
    for (size_t i = 0; i < n_; ++i) {
      SW_CHECK(acts_[i].id == static_cast<int>(i), "simulate: action ids must be their positions");
      const Action& a = acts_[i];
      w_.dur[i] = w_.dur_alone[i] = prices_.action_ms(a, 0);
      if (a.resource == Resource::H2D) w_.copies[0].push_back(i);
      if (a.resource == Resource::D2H) w_.copies[1].push_back(i);
      if (a.resource == Resource::H2DAct) w_.copies[2].push_back(i);
      if (a.resource == Resource::Cpu && a.kind == ActionKind::Compute) w_.cpu_work.push_back(i);
    }
    for (const Action& a : acts_)
      if (a.part == ComputePart::MoeCpuShare && a.resource == Resource::Cpu && a.layer >= 0) {
        if (w_.share_of_layer.size() <= static_cast<size_t>(a.layer))
          w_.share_of_layer.resize(static_cast<size_t>(a.layer) + 1, -1);
        w_.share_of_layer[static_cast<size_t>(a.layer)] = a.id;
      }
    w_.caller_work.resize(n_);  // pass() zeroes the shares' entries, the only ones used
  }

  // One pass over the list; returns the makespan.
  double pass() {
    for (double& f : free_at_) f = 0;
    caller_free_ = 0;
    for (int share : w_.share_of_layer)  // only the shares' entries are written
      if (share >= 0) w_.caller_work[static_cast<size_t>(share)] = 0;
    double makespan = 0;
    for (size_t i = 0; i < n_; ++i) {
      Action& a = acts_[i];
      double ready = 0;
      for (int d : a.deps) {
        SW_CHECK(d >= 0 && d < a.id, "simulate: action ", a.id, " depends on a later action ", d);
        ready = std::max(ready, acts_[static_cast<size_t>(d)].end_ms);
      }
      const double start = host_enqueue(a, ready, std::max(free_at_[static_cast<int>(a.resource)], ready));
      double d_i = w_.dur[i];
      if (host_beside_share_ && a.part == ComputePart::MoeCpuShare && a.resource == Resource::Cpu)
        d_i += w_.caller_work[i] / step_.threads;  // the caller joins late
      a.start_ms = start;
      a.end_ms = start + d_i;
      free_at_[static_cast<int>(a.resource)] = a.end_ms;
      makespan = std::max(makespan, a.end_ms);
    }
    return makespan;
  }

  // The durations of the next pass from this one's overlaps. Copy traffic overlapping each CPU action
  // lowers its DRAM bandwidth. CPU work reading DRAM beside each copy slows the copy. The two
  // host-to-device queues (weights, activations and staged KV) share the link: while the other runs,
  // each gets half of it, so a copy whose window the other queue filled for a fraction f takes
  // 1 / (1 - f/2) times as long.
  void contend() {
    bool ascending[3];
    for (int q = 0; q < 3; ++q) ascending[q] = spans_of(acts_, w_.copies[q], w_.copy_spans[q]);
    SpanIndex copy_index[3], cpu_index, other_queue[3];  // one per sequence of times asked
    for (int q = 0; q < 3; ++q) {
      copy_index[q].reset(w_.copy_spans[q], ascending[q]);
      other_queue[q].reset(w_.copy_spans[q == 0 ? 2 : 0], ascending[q == 0 ? 2 : 0]);
    }
    cpu_index.reset(w_.cpu_spans, spans_of(acts_, w_.cpu_work, w_.cpu_spans));
    for (size_t k = 0; k < w_.cpu_work.size(); ++k) {
      const double s = w_.cpu_spans[k].start, e = w_.cpu_spans[k].end;
      if (e <= s) continue;
      double moved_gb = 0;
      for (SpanIndex& engine : copy_index) moved_gb += overlap_gb(engine, s, e);
      w_.dur[w_.cpu_work[k]] = prices_.action_ms(acts_[w_.cpu_work[k]], moved_gb / ((e - s) / 1e3));
    }
    for (int q = 0; q < 3; ++q)
      for (size_t k = 0; k < w_.copies[q].size(); ++k) {
        const double s = w_.copy_spans[q][k].start, e = w_.copy_spans[q][k].end;
        if (e <= s) continue;
        const double read_gb = overlap_gb(cpu_index, s, e);
        const Direction dir = q == 1 ? Direction::DeviceToHost : Direction::HostToDevice;
        const double shared = q == 1 ? 0.0 : busy_fraction(other_queue[q], s, e);
        const size_t c = w_.copies[q][k];
        w_.dur[c] = w_.dur_alone[c] * cost_.copy_slowdown(dir, read_gb / ((e - s) / 1e3)) / (1.0 - 0.5 * shared);
      }
  }

 private:
  int share_of(const Action& a) const {
    return a.layer >= 0 && static_cast<size_t>(a.layer) < w_.share_of_layer.size()
               ? w_.share_of_layer[static_cast<size_t>(a.layer)]
               : -1;
  }

  // When the host thread enqueues an action that would start at `start`: the start after the host's
  // enqueue, where the host's time matters (expert copies, a split layer's GPU share).
  double host_enqueue(const Action& a, double ready, double start) {
    // This layer's CPU share, when the host enqueues this action beside it: the layer's routed expert
    // copies (before the share in the list, all its dependencies earlier still) and its GPU share.
    int beside = -1;
    if (host_beside_share_ && a.cpu_experts > 0 && !a.speculative &&
        (a.kind == ActionKind::CopyWeights || a.part == ComputePart::MoeGpuShare)) {
      beside = share_of(a);
    }
    if (beside >= 0) {
      start = enqueue_beside_share(a, beside, start);
    } else if (issue_ms_ > 0 && a.kind == ActionKind::CopyWeights && a.copies > 1) {
      // A routed MoE layer's expert copies: the host thread enqueues them itself once their routing
      // is known (and it is done with the CPU work before), computing nothing meanwhile, one by one
      // (Device::copy_h2d_batch); the first starts after its own enqueue (runtime.cpp's issue order),
      // the copy engine then keeps ahead of the host's issue.
      const double host = std::max(free_at_[static_cast<int>(Resource::Cpu)], ready);
      free_at_[static_cast<int>(Resource::Cpu)] = host + a.copies * issue_ms_;
      start = std::max(start, host + issue_ms_);
    }
    if (beside < 0 && launch_ms_ > 0 && a.part == ComputePart::MoeGpuShare) {
      // A split layer's GPU share: the host enqueues its kernels once the routing is on the host (the
      // device waits for the rest), before it computes the CPU's share (runtime.cpp's issue order).
      double routed = 0;
      for (int d : a.deps) {
        const Action& b = acts_[static_cast<size_t>(d)];
        if (b.payload == Payload::RouterLogits || b.resource == Resource::Cpu) routed = std::max(routed, b.end_ms);
      }
      const double host = std::max(free_at_[static_cast<int>(Resource::Cpu)], routed);
      free_at_[static_cast<int>(Resource::Cpu)] = host + kGpuShareLaunches * launch_ms_;
      start = std::max(start, host + launch_ms_);
    }
    return start;
  }

  // With a pool of more than one thread, a split layer's CPU share starts before the host enqueues the
  // layer's routed expert copies and GPU share: the host thread enqueues them while the pool's other
  // threads compute (runtime.cpp, ThreadPool::set_caller_work), so that work lengthens the share by its
  // time over the threads instead of delaying it. One thread enqueues first, then computes.
  double enqueue_beside_share(const Action& a, int beside, double start) {
    const Action& share = acts_[static_cast<size_t>(beside)];
    double share_start = share.start_ms;
    if (beside > a.id) {  // the share comes later in the list: when its dependencies so far are done
      share_start = free_at_[static_cast<int>(Resource::Cpu)];  // (routing and x, copied down beside each other)
      for (int d : share.deps)
        if (d < a.id) share_start = std::max(share_start, acts_[static_cast<size_t>(d)].end_ms);
      for (int d : a.deps) {
        const Action& b = acts_[static_cast<size_t>(d)];
        if (b.payload == Payload::RouterLogits || b.resource == Resource::Cpu)
          share_start = std::max(share_start, b.end_ms);
      }
    }
    const double host = std::max(caller_free_, share_start);
    const double work = a.kind == ActionKind::CopyWeights ? a.copies * issue_ms_ : kGpuShareLaunches * launch_ms_;
    caller_free_ = host + work;
    if (a.kind == ActionKind::CopyWeights || beside > a.id) w_.caller_work[static_cast<size_t>(beside)] += work;
    return std::max(start, host + (a.kind == ActionKind::CopyWeights ? issue_ms_ : launch_ms_));
  }

  std::vector<Action>& acts_;
  StepPrices& prices_;
  const CostModel& cost_;
  const StepShape& step_;
  const size_t n_;
  SimWork& w_;
  const double issue_ms_, launch_ms_;
  const bool host_beside_share_;
  double free_at_[kNumResources] = {};
  double caller_free_ = 0;  // the host thread, enqueuing beside a CPU share
};

}  // namespace

struct StepPrices::Impl {
  StepOps ops;
  PriceMemo memo;
  SimWork work;
  Impl(const ModelSpec& spec, const ShardSet& shards, const StepShape& step, const CostModel& cost)
      : ops(spec, shards, step, cost) {}
};

StepPrices::StepPrices(const ModelSpec& spec, const ShardSet& shards, const CostModel& cost, const StepShape& step)
    : shards_(shards), cost_(cost), step_(step), impl_(std::make_unique<Impl>(spec, shards, step, cost)) {}

StepPrices::~StepPrices() = default;

double StepPrices::action_ms(const Action& a, double concurrent) {
  const PriceKey k = price_key(a, shards_, concurrent);
  if (const double* ms = impl_->memo.find(k)) return *ms;
  const double ms = timed(a, impl_->ops, shards_, cost_, step_, concurrent);
  impl_->memo.insert(k, ms);
  return ms;
}

double action_ms(const Action& a, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost,
                 const StepShape& step, double concurrent) {
  return timed(a, StepOps(spec, shards, step, cost), shards, cost, step, concurrent);
}

double simulate(Plan& plan, StepPrices& prices, int passes) {
  Simulation sim(plan.actions, prices, prices.impl_->work);
  double makespan = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass) {
    if (pass > 0) sim.contend();
    makespan = sim.pass();
  }
  return makespan;
}

double simulate(Plan& plan, const ModelSpec& spec, const ShardSet& shards, const CostModel& cost, const StepShape& step,
                int passes) {
  StepPrices prices(spec, shards, cost, step);
  return simulate(plan, prices, passes);
}

std::string chrome_trace_json(const Plan& plan, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < kNumResources; ++r)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
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

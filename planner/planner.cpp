// planner/planner.cpp — arena layout, the five schedule generators and the plan table.
#include "planner/planner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "planner/shard_ops.h"
#include "planner/verify.h"

namespace shardwise {

const std::vector<int64_t>& default_tiers() {
  static const std::vector<int64_t> t = {1, 4, 16, 32, 64, 512, 1024, 2048, 4096, 8192, 16384};
  return t;
}

namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}
// The end of the arena's usable bytes: regions placed from the top (the KV cache) end here, so that
// they start aligned whatever the budget (kernels read and write the cache with vector accesses).
uint64_t arena_top(uint64_t budget) {
  return budget / kAlign * kAlign;
}

// Decisions shared by every tier of a table: the canonical pinned order with fixed offsets, and
// which layers keep their KV cache in VRAM (the end of the arena).
struct Layout {
  ShardSet shards;
  std::vector<int> canonical;        // attention shards by layer, FFN shards by layer, output (or the
                                     // output right after the attention shards: lm_head_early)
  std::vector<uint64_t> prefix_end;  // prefix_end[p] = arena bytes of the first p canonical shards
  std::vector<bool> kv_gpu;          // per layer
  uint64_t kv_layer_bytes = 0;
  uint64_t kv_region = 0;  // aligned bytes at the end of the arena
};

// The slot size needed to stream these shards whole (the LM head only needs a piece).
uint64_t largest_streamed(const ModelSpec& spec, const PlannerConfig& cfg, const ShardSet& set,
                          const std::vector<int>& ids, int64_t n) {
  uint64_t m = 0;
  for (int id : ids) {
    const Shard& s = set.at(id);
    if (s.kind == ShardKind::Output)
      m = std::max(m, std::min(s.bytes, cfg.lm_head_piece_bytes));
    else
      m = std::max(m, s.kind == ShardKind::Ffn ? ffn_bytes_touched(spec, s, n, true) : s.bytes);
  }
  return align_up(m);
}

// The layout with the first `kv_layers` layers' KV in VRAM. lm_head_early: the LM head is pinned
// before the FFN shards instead of after them — where a decode step reads a small share of each FFN
// shard's bytes (MoE: top_k of the experts), a byte of VRAM given to the LM head saves more of a step
// (qwen30b at 4G: its 175 MB LM head ran 2.5 ms per token on the CPU, an MoE layer's 340 MB of experts
// 0.33 ms).
// shards: make_shards of this spec and config when the caller has it (choose_layout builds a layout
// per candidate KV split from one).
Layout make_layout(const ModelSpec& spec, const PlannerConfig& cfg, int kv_layers, bool lm_head_early = false,
                   const ShardSet* shards = nullptr) {
  Layout L;
  L.shards = shards ? *shards : make_shards(spec, cfg.ctx, cfg.kv_dtype, &cfg.tensor_dtypes);
  const ShardSet& S = L.shards;
  for (int l = 0; l < S.n_layers; ++l) L.canonical.push_back(S.attention[l]);
  if (lm_head_early) L.canonical.push_back(S.output);
  for (int l = 0; l < S.n_layers; ++l) L.canonical.push_back(S.ffn[l]);
  if (!lm_head_early) L.canonical.push_back(S.output);
  L.prefix_end.assign(L.canonical.size() + 1, 0);
  for (size_t i = 0; i < L.canonical.size(); ++i)
    L.prefix_end[i + 1] = L.prefix_end[i] + align_up(S.at(L.canonical[i]).bytes);
  L.kv_layer_bytes = S.n_layers > 0 ? S.at(S.kv[0]).bytes : 0;
  const int k = std::max(0, std::min(kv_layers, S.n_layers));
  L.kv_gpu.assign(static_cast<size_t>(S.n_layers), false);
  for (int l = 0; l < k; ++l) L.kv_gpu[static_cast<size_t>(l)] = true;
  L.kv_region = align_up(static_cast<uint64_t>(k) * L.kv_layer_bytes);
  return L;
}

// KV layers the priority rule gives (every attention shard first, then KV layer by layer), keeping
// room for a prefill step's scratch and two stream slots of the largest FFN shard; the most KV
// layers possible with their attention shards pinned (plus a prefill step's scratch); and the most
// KV layers with their attention streamed where not pinned (a prefill step's scratch and two slots
// of the largest streamed shard beside them): GPU-only and Dynamic steps stream such a layer's
// attention into a slot, Static cannot run them.
void kv_layer_bounds(const ModelSpec& spec, const PlannerConfig& cfg, int* priority_k, int* max_k,
                     int* max_k_streamed) {
  const Layout L = make_layout(spec, cfg, 0);
  const ShardSet& S = L.shards;
  const int64_t ref_tier = 512;
  std::vector<int> ffns(S.ffn.begin(), S.ffn.end());
  const uint64_t scratch = align_up(cfg.executor.scratch_bytes(ref_tier));
  const uint64_t reserve = scratch + 2 * largest_streamed(spec, cfg, S, ffns, ref_tier);
  const uint64_t attn_all = L.prefix_end[static_cast<size_t>(S.n_layers)];
  const uint64_t kv = std::max<uint64_t>(1, L.kv_layer_bytes);
  *priority_k = 0;
  if (attn_all + reserve <= cfg.budget_bytes)
    *priority_k = static_cast<int>(
        std::min<uint64_t>(static_cast<uint64_t>(S.n_layers), (cfg.budget_bytes - attn_all - reserve) / kv));
  *max_k = 0;
  while (*max_k < S.n_layers && L.prefix_end[static_cast<size_t>(*max_k + 1)] +
                                        align_up(static_cast<uint64_t>(*max_k + 1) * L.kv_layer_bytes) + scratch <=
                                    cfg.budget_bytes)
    ++*max_k;
  std::vector<int> weights(S.ffn.begin(), S.ffn.end());
  weights.insert(weights.end(), S.attention.begin(), S.attention.end());
  const uint64_t slots = 2 * largest_streamed(spec, cfg, S, weights, ref_tier);
  *max_k_streamed = *max_k;
  while (*max_k_streamed < S.n_layers &&
         align_up(static_cast<uint64_t>(*max_k_streamed + 1) * L.kv_layer_bytes) + scratch + slots <= cfg.budget_bytes)
    ++*max_k_streamed;
}

// What a thread reuses from the candidate plans it drops for the next ones it builds: an emptied
// actions list and emptied dependency lists, with their memory (a Dynamic step builds and drops tens of
// plans of hundreds of actions each).
class Spares {
 public:
  void recycle(Plan& p) {
    for (Action& a : p.actions)
      if (a.deps.capacity() > 0 && deps_.size() < kMaxDeps) deps_.push_back(std::move(a.deps));
    p.actions.clear();
    if (p.actions.capacity() > actions_.capacity()) actions_ = std::move(p.actions);
  }
  // An empty actions list (with room for n, where a dropped plan left it) and an empty dependency list.
  std::vector<Action> actions(size_t n) {
    std::vector<Action> v = std::move(actions_);
    actions_ = std::vector<Action>();
    v.clear();
    v.reserve(n);
    return v;
  }
  std::vector<int> deps() {
    if (deps_.empty()) return {};
    std::vector<int> v = std::move(deps_.back());
    deps_.pop_back();
    v.clear();
    return v;
  }

 private:
  static constexpr size_t kMaxDeps = 1 << 14;
  std::vector<Action> actions_;
  std::vector<std::vector<int>> deps_;
};

// Emits the action list of one step for given per-shard decisions (see plan.h for the vocabulary).
class Builder {
 public:
  // spares: where the plan's lists come from (null: new ones).
  Builder(const ModelSpec& spec, const ExecutorTraits& traits, const ShardSet& set, Plan& plan, int64_t n,
          double experts, Spares* spares = nullptr)
      : spec_(spec),
        traits_(traits),
        set_(set),
        plan_(plan),
        n_(n),
        routed_(experts > 0 ? experts : expected_distinct_experts(n, spec.num_experts_per_tok, spec.num_experts)),
        spares_(spares) {}

  // MoE FFN shards (by id) whose routed experts are split: the CPU computes share[id] of each token's
  // top_k from host memory while the rest are copied into the shard's stream slot and run on the GPU
  // (plan.h moe_cpu_share / moe_gpu_share). Such a shard is executed on the GPU with a slot.
  void split_experts(std::vector<int> share) { share_ = std::move(share); }

  // GPU attention of layers whose KV is on the host runs over the layer's cache staged in the arena
  // (`past_tokens` cached positions go up, the step's rows come back), not split with a CPU core.
  void stage_host_kv(int64_t past_tokens) {
    stage_ = true;
    past_tokens_ = past_tokens;
  }

  // Speculative expert prefetch (plan.h router_next): a streamed MoE FFN on the GPU (of a split layer, its
  // GPU's share) whose
  // attention is pinned on the GPU, after a layer whose attention runs on the GPU, has its experts
  // guessed from the layer before and copied while that layer runs; `hit` (0..1] is the fraction of
  // the routed experts the guess gets (PlannerConfig::next_layer_hits), the rest are copied after the
  // layer's own routing.
  void speculate(double hit) { hit_ = std::clamp(hit, 0.0, 1.0); }
  bool speculates() const {
    for (int g : guess_)
      if (g >= 0) return true;
    return false;
  }

  // exec[id]: where each shard runs; slot[id]: -1, or the stream slot its weights are copied into;
  // prefetch: how many streamed shards ahead copies may run (2 = double buffering).
  // slot_bytes: size of a stream slot; a streamed LM head larger than a slot goes in row pieces.
  void build(const std::vector<ExecDevice>& exec, const std::vector<int>& slot, const std::vector<bool>& kv_gpu,
             int prefetch, uint64_t slot_bytes = 0) {
    std::vector<int> order;
    for (int l = 0; l < set_.n_layers; ++l) {
      order.push_back(set_.attention[l]);
      order.push_back(set_.ffn[l]);
    }
    order.push_back(set_.output);
    plan_streams(order, slot, slot_bytes);
    start(exec, slot, prefetch);
    const size_t room = 4 * order.size() + 2 * streamed_.size() + 8;  // most steps' actions, in one allocation
    if (spares_ && plan_.actions.empty())
      plan_.actions = spares_->actions(room);
    else
      plan_.actions.reserve(room);

    last_x_ = add(Resource::Cpu, ActionKind::Embed, -1, -1, residual_bytes(spec_, n_));
    on_gpu_ = false;
    emit_ready_copies();
    for (int id : order) {
      const Shard& s = set_.at(id);
      const ExecDevice e = exec[id];
      const int k = stream_index(id);
      if (k >= 0) force_copy(k);
      if (k >= 0 && streamed_[static_cast<size_t>(k)].row1 > 0) {  // LM head in pieces
        emit_head_pieces(id, k);
        continue;
      }
      int slot_user = -1;  // the compute after which the shard's stream slot is free (default: its last)
      if (s.kind == ShardKind::Attention) {
        const bool kvg = kv_gpu[static_cast<size_t>(s.layer)];
        SW_CHECK(!(kvg && e == ExecDevice::Cpu), "plan: attention of layer ", s.layer,
                 " on the CPU with its KV in VRAM");
        if (e == ExecDevice::Gpu) {
          emit_gpu_attention(s, k, kvg);
          emit_routing(s);
          emit_next_guess(s);
        } else {
          to_host();
          last_x_ = compute(Resource::Cpu, id, ComputePart::Full, {last_x_});
          if (spec_.is_moe()) routing_[static_cast<size_t>(s.layer)] = last_x_;
        }
      } else {  // FFN or output
        slot_user = emit_ffn_or_output(s, e, k);
      }
      if (k >= 0) compute_done_[k] = slot_user >= 0 ? slot_user : last_x_;
      emit_ready_copies();
    }
  }

 private:
  struct Piece {
    int shard;
    int64_t row0, row1;  // 0, 0 = the whole shard
    uint64_t bytes;
  };

  // The dependencies an emitter gathers for one action (at most four), kept off the heap.
  struct Deps {
    int id[4] = {-1, -1, -1, -1};
    size_t n = 0;
    Deps() = default;
    Deps(std::initializer_list<int> ids) {
      for (int d : ids) push_back(d);
    }
    void push_back(int d) {
      SW_CHECK(n < 4, "plan: an action with more than four dependencies");
      id[n++] = d;
    }
  };

  // The streamed shards in execution order; a streamed LM head larger than a slot in row pieces.
  void plan_streams(const std::vector<int>& order, const std::vector<int>& slot, uint64_t slot_bytes) {
    for (int id : order) {
      if (slot[id] < 0) continue;
      const Shard& s = set_.at(id);
      if (s.kind == ShardKind::Output && slot_bytes > 0 && s.bytes > slot_bytes) {
        const int64_t V = spec_.vocab_size;
        const uint64_t row_bytes = (s.bytes + static_cast<uint64_t>(V) - 1) / static_cast<uint64_t>(V);
        const int64_t rows_per_piece = std::max<int64_t>(1, static_cast<int64_t>(slot_bytes / row_bytes));
        for (int64_t r = 0; r < V; r += rows_per_piece) {
          const int64_t r1 = std::min(V, r + rows_per_piece);
          streamed_.push_back({id, r, r1, static_cast<uint64_t>(r1 - r) * row_bytes});
        }
      } else {
        streamed_.push_back({id, 0, 0, s.kind == ShardKind::Ffn ? share_bytes(s, false) : s.bytes});
      }
    }
  }

  // The emitter's state for a step, and the layers whose experts are guessed (speculate()).
  void start(const std::vector<ExecDevice>& exec, const std::vector<int>& slot, int prefetch) {
    first_piece_.assign(set_.shards.size(), -1);
    for (size_t k = streamed_.size(); k-- > 0;)
      first_piece_[static_cast<size_t>(streamed_[k].shard)] = static_cast<int>(k);
    copy_action_.assign(streamed_.size(), -1);
    guess_copy_.assign(streamed_.size(), -1);
    compute_done_.assign(streamed_.size(), -1);
    routing_.assign(static_cast<size_t>(set_.n_layers), -1);
    guess_.assign(static_cast<size_t>(set_.n_layers), -1);
    wants_guess_.assign(static_cast<size_t>(set_.n_layers), false);
    for (int l = 1; hit_ > 0 && spec_.is_moe() && l < set_.n_layers; ++l) {
      const int f = set_.ffn[static_cast<size_t>(l)], at = set_.attention[static_cast<size_t>(l)];
      wants_guess_[static_cast<size_t>(l)] = slot[f] >= 0 && exec[f] == ExecDevice::Gpu && slot[at] < 0 &&
                                             exec[at] == ExecDevice::Gpu &&
                                             exec[set_.attention[static_cast<size_t>(l - 1)]] == ExecDevice::Gpu;
    }
    prefetch_ = prefetch;
    slot_ = &slot;
    exec_ = &exec;
  }

  // A streamed LM head larger than a slot: piece by piece, each computed from its own slot.
  void emit_head_pieces(int id, int k) {
    to_gpu();
    const int x = last_x_;
    int last = -1;
    for (size_t j = static_cast<size_t>(k); j < streamed_.size() && streamed_[j].shard == id; ++j) {
      force_copy(static_cast<int>(j));
      last = compute(Resource::GpuCompute, id, ComputePart::Full, {x, copy_action_[j]});
      plan_.actions.back().row_begin = streamed_[j].row0;
      plan_.actions.back().row_end = streamed_[j].row1;
      plan_.actions.back().slot = static_cast<int>(j % 2);
      plan_.actions.back().bytes = streamed_[j].bytes;
      compute_done_[j] = last;
      emit_ready_copies();
    }
    last_x_ = add(Resource::D2H, ActionKind::CopyLogits, id, -1, logits_bytes(spec_), {last});
  }

  // A layer's attention on the GPU: whole over its KV in VRAM, over its host cache staged in the arena,
  // or split around a CPU core over the host cache.
  void emit_gpu_attention(const Shard& s, int k, bool kvg) {
    const int id = s.id;
    to_gpu();
    Deps deps = {last_x_};
    if (k >= 0) deps.push_back(copy_action_[k]);
    if (kvg) {
      last_x_ = compute(Resource::GpuCompute, id, ComputePart::Full, deps);
    } else if (stage_) {
      const uint64_t row = 2 * dtype_row_bytes(set_.kv_dtype, spec_.kv_dim());  // K and V of one position
      const int up = add(Resource::H2DAct, ActionKind::CopyActivations, id, s.layer,
                         static_cast<uint64_t>(past_tokens_) * row, {last_staged_});
      plan_.actions.back().payload = Payload::KvPast;
      deps.push_back(up);
      last_x_ = compute(Resource::GpuCompute, id, ComputePart::AttnStaged, deps);
      last_staged_ =
          add(Resource::D2H, ActionKind::CopyActivations, id, s.layer, static_cast<uint64_t>(n_) * row, {last_x_});
      plan_.actions.back().payload = Payload::KvNew;
    } else {
      const int pre = compute(Resource::GpuCompute, id, ComputePart::AttnPre, deps);
      const int d2h = add(Resource::D2H, ActionKind::CopyActivations, id, s.layer, qkv_bytes(spec_, n_), {pre});
      plan_.actions.back().payload = Payload::Qkv;
      const int core = compute(Resource::Cpu, id, ComputePart::AttnCore, {d2h});
      const int h2d =
          add(Resource::H2DAct, ActionKind::CopyActivations, id, s.layer, attn_out_bytes(spec_, n_), {core});
      plan_.actions.back().payload = Payload::AttnOut;
      last_x_ = compute(Resource::GpuCompute, id, ComputePart::AttnPost, {h2d, pre});
    }
  }

  // Where an MoE layer whose attention ran on the GPU is routed: on the GPU from its own logits (a
  // resident FFN there, a small step: ExecutorTraits::device_routing_max_tokens), else on the host from
  // the router logits copied down (same code on every device).
  void emit_routing(const Shard& s) {
    const std::vector<ExecDevice>& exec = *exec_;
    const std::vector<int>& slot = *slot_;
    const int f = set_.ffn[static_cast<size_t>(s.layer)];
    if (spec_.is_moe() && exec[f] == ExecDevice::Gpu && slot[f] < 0 && n_ <= traits_.device_routing_max_tokens) {
      routing_[static_cast<size_t>(s.layer)] = last_x_;  // the GPU routes from its own logits
    } else if (spec_.is_moe()) {  // router logits to the host, which routes (same code on every device)
      routing_[static_cast<size_t>(s.layer)] = add(Resource::D2H, ActionKind::CopyActivations, s.id, s.layer,
                                                   static_cast<uint64_t>(n_ * spec_.num_experts) * 4, {last_x_});
      plan_.actions.back().payload = Payload::RouterLogits;
    }
  }

  // The next layer's routing guessed from x as it is now, with that layer's router.
  void emit_next_guess(const Shard& s) {
    if (s.layer + 1 >= set_.n_layers || !wants_guess_[static_cast<size_t>(s.layer + 1)]) return;
    const int next = set_.attention[static_cast<size_t>(s.layer + 1)];
    const int g = compute(Resource::GpuCompute, next, ComputePart::RouterNext, {last_x_});
    plan_.actions.back().bytes = router_bytes();
    guess_[static_cast<size_t>(s.layer + 1)] = add(Resource::D2H, ActionKind::CopyActivations, next, s.layer + 1,
                                                   static_cast<uint64_t>(n_ * spec_.num_experts) * 4, {g});
    plan_.actions.back().payload = Payload::RouterGuess;
  }

  // An FFN or the LM head where it runs; returns the compute after which its stream slot is free (-1:
  // its last).
  int emit_ffn_or_output(const Shard& s, ExecDevice e, int k) {
    const int id = s.id;
    // An MoE FFN needs its layer's routing on the host (the router logits copy, or the CPU router).
    const int routing = s.kind == ShardKind::Ffn && spec_.is_moe() ? routing_[static_cast<size_t>(s.layer)] : -1;
    int slot_user = -1;
    if (e == ExecDevice::Gpu && share_of(id) > 0) {  // experts split: the CPU's share beside the GPU's
      slot_user = emit_split_ffn(s, k, routing);
    } else if (e == ExecDevice::Gpu) {
      to_gpu();
      Deps deps = {last_x_, routing};
      if (k >= 0) deps.push_back(copy_action_[k]);
      last_x_ = compute(Resource::GpuCompute, id, ComputePart::Full, deps);
    } else {
      to_host();
      last_x_ = compute(Resource::Cpu, id, ComputePart::Full, {last_x_, routing});
    }
    if (s.kind == ShardKind::Output && e == ExecDevice::Gpu)
      last_x_ = add(Resource::D2H, ActionKind::CopyLogits, id, -1, logits_bytes(spec_), {last_x_});
    return slot_user;
  }

  // An MoE FFN whose experts are split: the CPU's share beside the GPU's. Returns the GPU's share, after
  // which the stream slot is free.
  int emit_split_ffn(const Shard& s, int k, int routing) {
    const int id = s.id;
    to_gpu();
    const int c = share_of(id);
    const int xh = add(Resource::D2H, ActionKind::CopyActivations, id, s.layer, residual_bytes(spec_, n_), {last_x_});
    plan_.actions.back().payload = Payload::Residual;
    // The GPU's experts into x, after x went down for the CPU's share, enqueued before the host
    // computes that share so that the two run at once; the CPU's partial is added after both.
    Deps deps = {last_x_, routing, xh};
    if (k >= 0) deps.push_back(copy_action_[k]);
    const int gpu = compute(Resource::GpuCompute, id, ComputePart::MoeGpuShare, deps);
    plan_.actions.back().cpu_experts = c;
    const int cpu = compute(Resource::Cpu, id, ComputePart::MoeCpuShare, {xh, routing});
    plan_.actions.back().cpu_experts = c;
    plan_.actions.back().slot = -1;
    plan_.actions.back().bytes = share_bytes(s, true);
    const int up = add(Resource::H2DAct, ActionKind::CopyActivations, id, s.layer, residual_bytes(spec_, n_), {cpu});
    plan_.actions.back().payload = Payload::MoePartial;
    last_x_ = compute(Resource::GpuCompute, id, ComputePart::MoeShareAdd, {gpu, up});
    plan_.actions.back().cpu_experts = c;
    plan_.actions.back().slot = -1;
    plan_.actions.back().bytes = 0;
    return gpu;
  }

  int stream_index(int id) const { return first_piece_[static_cast<size_t>(id)]; }
  int share_of(int id) const { return static_cast<size_t>(id) < share_.size() ? share_[static_cast<size_t>(id)] : 0; }
  // Bytes of an FFN shard a step reads: all it touches, or for a split MoE layer the CPU's share of
  // its experts (cpu) or the GPU's, with the norm (!cpu).
  uint64_t share_bytes(const Shard& s, bool cpu) const {
    const uint64_t all = ffn_bytes_touched(spec_, s, n_, false, routed_);
    const int c = share_of(s.id);
    if (c <= 0 || !spec_.is_moe()) return all;
    const double k = static_cast<double>(std::max<int64_t>(1, spec_.num_experts_per_tok));
    const double experts = static_cast<double>(all - s.expert_base);
    return cpu ? static_cast<uint64_t>(experts * c / k + 0.5)
               : s.expert_base + static_cast<uint64_t>(experts * (k - c) / k + 0.5);
  }

  // A new action (labelled later: label_plan) after `deps` (-1: none; each once).
  int add(Resource r, ActionKind kind, int shard, int layer, uint64_t bytes, const int* deps, size_t n_deps) {
    Action& a = plan_.actions.emplace_back();
    a.id = static_cast<int>(plan_.actions.size()) - 1;
    a.resource = r;
    a.kind = kind;
    a.shard = shard;
    a.layer = layer;
    a.bytes = bytes;
    if (spares_) a.deps = spares_->deps();
    a.deps.reserve(n_deps);
    for (size_t i = 0; i < n_deps; ++i)
      if (deps[i] >= 0 && std::find(a.deps.begin(), a.deps.end(), deps[i]) == a.deps.end()) a.deps.push_back(deps[i]);
    return a.id;
  }
  int add(Resource r, ActionKind kind, int shard, int layer, uint64_t bytes, std::initializer_list<int> deps = {}) {
    return add(r, kind, shard, layer, bytes, deps.begin(), deps.size());
  }
  int add(Resource r, ActionKind kind, int shard, int layer, uint64_t bytes, const Deps& deps) {
    return add(r, kind, shard, layer, bytes, deps.id, deps.n);
  }

  int compute(Resource r, int shard, ComputePart part, const int* deps, size_t n_deps) {
    const Shard& s = set_.at(shard);
    const uint64_t bytes = s.kind == ShardKind::Ffn ? share_bytes(s, false) : s.bytes;
    const int id = add(r, ActionKind::Compute, shard, s.layer, part == ComputePart::AttnCore ? 0 : bytes, deps, n_deps);
    plan_.actions.back().part = part;
    const int k = stream_index(shard);
    plan_.actions.back().slot = k >= 0 ? k % std::max(1, prefetch_) : -1;
    return id;
  }
  int compute(Resource r, int shard, ComputePart part, std::initializer_list<int> deps) {
    return compute(r, shard, part, deps.begin(), deps.size());
  }
  int compute(Resource r, int shard, ComputePart part, const Deps& deps) {
    return compute(r, shard, part, deps.id, deps.n);
  }

  void to_gpu() {
    if (on_gpu_) return;
    last_x_ = add(Resource::H2DAct, ActionKind::CopyActivations, -1, -1, residual_bytes(spec_, n_), {last_x_});
    plan_.actions.back().payload = Payload::Residual;
    on_gpu_ = true;
  }
  void to_host() {
    if (!on_gpu_) return;
    last_x_ = add(Resource::D2H, ActionKind::CopyActivations, -1, -1, residual_bytes(spec_, n_), {last_x_});
    plan_.actions.back().payload = Payload::Residual;
    on_gpu_ = false;
  }

  // A copy may be issued once its slot's previous user has been issued (and, for experts, once the
  // layer's routing is known); copies are issued in order. A layer whose experts are guessed first
  // copies the guess once the guess is known, then what it missed once the routing is.
  bool slot_free(size_t k) const {
    return k < static_cast<size_t>(prefetch_) || compute_done_[k - static_cast<size_t>(prefetch_)] >= 0;
  }
  int layer_of(size_t k) const { return set_.at(streamed_[k].shard).layer; }
  bool guessed(size_t k) const {
    const Shard& s = set_.at(streamed_[k].shard);
    return s.kind == ShardKind::Ffn && wants_guess_[static_cast<size_t>(s.layer)];
  }
  bool copy_ready(size_t k) const {
    if (!slot_free(k)) return false;
    const Shard& s = set_.at(streamed_[k].shard);
    if (spec_.is_moe() && s.kind == ShardKind::Ffn && routing_[static_cast<size_t>(s.layer)] < 0) return false;
    return true;
  }
  void emit_ready_copies() {
    while (next_copy_ < streamed_.size()) {
      const size_t k = next_copy_;
      if (guessed(k) && guess_copy_[k] < 0) {
        if (!slot_free(k) || guess_[static_cast<size_t>(layer_of(k))] < 0) return;
        emit_guess(k);
      }
      if (!copy_ready(k)) return;
      emit_copy(next_copy_++);
    }
  }
  void force_copy(int k) {
    while (next_copy_ <= static_cast<size_t>(k)) {
      const size_t j = next_copy_;
      if (guessed(j) && guess_copy_[j] < 0 && guess_[static_cast<size_t>(layer_of(j))] >= 0) emit_guess(j);
      emit_copy(next_copy_++);
    }
  }
  // Expected distinct routed experts of an MoE FFN in this step, and the GPU's part of each token's k.
  double routed_experts() const { return routed_; }
  double gpu_experts(const Shard& s) const {
    const double k = static_cast<double>(std::max<int64_t>(1, spec_.num_experts_per_tok));
    return routed_experts() * (k - share_of(s.id)) / k;
  }
  uint64_t router_bytes() const {
    return static_cast<uint64_t>(spec_.num_experts * spec_.hidden_size) * 4 +
           static_cast<uint64_t>(spec_.hidden_size) * 4;
  }
  void emit_guess(size_t k) {
    const Piece& piece = streamed_[k];
    const Shard& s = set_.at(piece.shard);
    Deps deps = {guess_[static_cast<size_t>(s.layer)]};
    if (k >= static_cast<size_t>(prefetch_)) deps.push_back(compute_done_[k - static_cast<size_t>(prefetch_)]);
    // As many experts as the routing will pick (the guess picks top_k per token too; of a split layer,
    // the GPU's share of them), and the norm.
    guess_copy_[k] = add(Resource::H2D, ActionKind::CopyWeights, s.id, s.layer, piece.bytes, deps);
    Action& a = plan_.actions.back();
    a.speculative = true;
    a.cpu_experts = share_of(s.id);
    a.copies = 1 + static_cast<int>(std::llround(traits_.expert_copies * std::max(1.0, gpu_experts(s))));
    a.slot = static_cast<int>(k % static_cast<size_t>(std::max(1, prefetch_)));
  }
  void emit_copy(size_t k) {
    const Piece& piece = streamed_[k];
    const Shard& s = set_.at(piece.shard);
    Deps deps;
    if (k >= static_cast<size_t>(prefetch_)) deps.push_back(compute_done_[k - static_cast<size_t>(prefetch_)]);
    if (spec_.is_moe() && s.kind == ShardKind::Ffn) deps.push_back(routing_[static_cast<size_t>(s.layer)]);
    const bool after_guess = guess_copy_[k] >= 0;
    if (after_guess) deps.push_back(guess_copy_[k]);
    // After a guess: the routed experts it missed (1 - hit of them), no norm.
    const double miss = after_guess ? 1.0 - hit_ : 1.0;
    const uint64_t bytes = after_guess
                               ? static_cast<uint64_t>(static_cast<double>(piece.bytes - s.expert_base) * miss + 0.5)
                               : piece.bytes;
    copy_action_[k] = add(Resource::H2D, ActionKind::CopyWeights, s.id, s.layer, bytes, deps);
    if (spec_.is_moe() &&
        s.kind == ShardKind::Ffn) {  // the runtime copies each routed expert's gate, up, down and the norm
      // (a split layer the GPU's share of them)
      const int per = traits_.expert_copies;
      plan_.actions.back().copies = after_guess
                                        ? std::max(1, static_cast<int>(std::llround(per * gpu_experts(s) * miss)))
                                        : 1 + static_cast<int>(std::llround(per * std::max(1.0, gpu_experts(s))));
      plan_.actions.back().cpu_experts = share_of(s.id);
    }
    plan_.actions.back().slot = static_cast<int>(k % static_cast<size_t>(std::max(1, prefetch_)));
    plan_.actions.back().row_begin = piece.row0;
    plan_.actions.back().row_end = piece.row1;
  }

  const ModelSpec& spec_;
  const ExecutorTraits& traits_;  // the executor's copies per expert and device routing limit
  const ShardSet& set_;
  Plan& plan_;
  int64_t n_;
  // Distinct experts per layer a step of n_ tokens touches: as measured, else the uniform expectation.
  double routed_;
  std::vector<int> share_;                  // split_experts
  const std::vector<int>* slot_ = nullptr;  // build's slot and exec, while it runs
  const std::vector<ExecDevice>* exec_ = nullptr;
  std::vector<Piece> streamed_;
  std::vector<int> first_piece_, copy_action_, compute_done_, routing_;
  double hit_ = 0;                 // speculate()
  std::vector<int> guess_copy_;    // per streamed piece: its speculative copy, -1 = none (yet)
  std::vector<int> guess_;         // per layer: its router_guess copy to the host, -1 = none (yet)
  std::vector<bool> wants_guess_;  // per layer: its experts are guessed (speculate())
  size_t next_copy_ = 0;
  int prefetch_ = 2;
  int last_x_ = -1;
  bool on_gpu_ = false;
  bool stage_ = false;       // attention of host-KV layers on the GPU runs staged (attn_staged)
  int64_t past_tokens_ = 0;  // cached positions a staged layer uploads (the cache planned full)
  int last_staged_ = -1;     // the last staged layer's kv_new copy: the staging is free after it
  Spares* spares_;
};

// What an action does to which shard, in words ("L3.ffn weights", "x to gpu"), from its fields alone: the
// Builder leaves actions unlabelled, and only the plans the planner returns are labelled (label_plan),
// not the thousands of candidates it simulates and drops.
std::string action_label(const Plan& plan, const Action& a, const ShardSet& set) {
  const std::string rows =
      a.row_end > 0 ? "[" + std::to_string(a.row_begin) + ":" + std::to_string(a.row_end) + "]" : std::string();
  switch (a.kind) {
    case ActionKind::Embed:
      return "embed";
    case ActionKind::CopyLogits:
      return "logits";
    case ActionKind::Compute:
      return set.at(a.shard).name() +
             (a.part == ComputePart::Full ? std::string() : std::string(" ") + compute_part_name(a.part)) + rows;
    case ActionKind::CopyWeights: {
      if (a.speculative) return set.at(a.shard).name() + " guessed experts";
      bool after_guess = false;  // the experts its layer's speculative copy missed
      for (int d : a.deps) {
        const Action& b = plan.actions.at(static_cast<size_t>(d));
        after_guess = after_guess || (b.kind == ActionKind::CopyWeights && b.speculative);
      }
      return set.at(a.shard).name() + (after_guess ? " missed experts" : " weights") + rows;
    }
    case ActionKind::CopyActivations:
      break;
  }
  if (a.shard < 0) return a.resource == Resource::D2H ? "x to host" : "x to gpu";
  const char* what = "";
  switch (a.payload) {
    case Payload::Residual:
      what = " x for the cpu share";
      break;
    case Payload::Qkv:
      what = " q,k,v";
      break;
    case Payload::AttnOut:
      what = " attn out";
      break;
    case Payload::RouterLogits:
      what = " router logits";
      break;
    case Payload::KvPast:
      what = " kv past";
      break;
    case Payload::KvNew:
      what = " kv new";
      break;
    case Payload::MoePartial:
      what = " cpu share";
      break;
    case Payload::RouterGuess:
      what = " router guess";
      break;
    case Payload::None:
      break;
  }
  return set.at(a.shard).name() + what;
}

// The words of a plan the planner returns: its actions' labels and its placements' shard names.
void label_plan(Plan& plan, const ShardSet& set) {
  for (Action& a : plan.actions) a.label = action_label(plan, a, set);
  for (ShardPlacement& sp : plan.placements) sp.name = set.at(sp.shard).name();
}

}  // namespace

double routing_experts_for(const ModelSpec& spec, const PlannerConfig& cfg, int64_t n) {
  if (!spec.is_moe() || cfg.routing_tokens.empty() || n < 1) return 0;
  const auto& T = cfg.routing_tokens;
  const auto& E = cfg.routing_experts;
  if (T.size() != E.size())
    fail("planner: the routing curve has ", T.size(), " token counts and ", E.size(), " expert counts");
  for (size_t i = 0; i < T.size(); ++i) {
    if (T[i] < 1 || !(E[i] > 0) || !std::isfinite(E[i]) || (i > 0 && T[i] <= T[i - 1]))
      fail("planner: the routing curve must have ascending token counts >= 1 and positive expert counts (entry ", i,
           ")");
  }
  double e;
  if (n <= T.front()) {
    e = E.front();
  } else if (n >= T.back()) {
    e = E.back();
  } else {
    const size_t i = static_cast<size_t>(std::lower_bound(T.begin(), T.end(), n) - T.begin());
    if (T[i] == n) {
      e = E[i];
    } else {
      const double f = std::log(static_cast<double>(n) / static_cast<double>(T[i - 1])) /
                       std::log(static_cast<double>(T[i]) / static_cast<double>(T[i - 1]));
      e = E[i - 1] * std::pow(E[i] / E[i - 1], f);
    }
  }
  const double k = static_cast<double>(std::min(spec.num_experts_per_tok, spec.num_experts));
  const double most = static_cast<double>(std::min<int64_t>(spec.num_experts, n * spec.num_experts_per_tok));
  return std::min(most, std::max(k, e));
}

namespace {

struct Ctx {
  const ModelSpec& spec;
  const CostModel& cost;
  const PlannerConfig& cfg;
  const Layout& L;
  // Attention of host-KV layers that runs on the GPU: over a copy of the host cache staged in the
  // arena (attn_staged), instead of split with its core on the CPU. Plans are made both ways.
  bool stage = false;
  // The durations of the step being planned and the lists of dropped plans, the thread's (Planning
  // sets them: one step, many candidate plans).
  StepPrices* prices = nullptr;
  Spares* spares = nullptr;
};

// The "kv staging" region: one layer's K and V as the device attends to them (position-major) and as
// they cross PCIe (head-major, like the host cache).
uint64_t staging_bytes(const Ctx& c) {
  return c.stage ? 2 * align_up(c.L.kv_layer_bytes) : 0;
}

bool has_host_kv(const Layout& L) {
  return std::find(L.kv_gpu.begin(), L.kv_gpu.end(), false) != L.kv_gpu.end();
}

// The shape of a step of n new tokens over a full cache, as the config plans it.
StepShape step_shape(const ModelSpec& spec, const PlannerConfig& cfg, int64_t n) {
  StepShape st;
  st.tokens = n;
  st.active_experts = routing_experts_for(spec, cfg, n);
  // Sequences sharing the cache (a batched engine's slots, ExecutorTraits::output_rows) each hold ctx /
  // sequences positions: a token attends to its own sequence's keys only.
  st.keys = std::max<int64_t>(1, cfg.ctx / std::max<int64_t>(1, cfg.executor.output_rows));
  st.kv_dtype = cfg.kv_dtype;
  st.threads = cfg.threads;
  st.gpu_fused_qkv_max_tokens = cfg.executor.gpu_fused_qkv_max_tokens;
  return st;
}

Plan infeasible(const Ctx& c, Schedule s, int64_t n, const std::string& why) {
  Plan p;
  p.schedule = s;
  p.tier = n;
  p.budget_bytes = c.cfg.budget_bytes;
  p.feasible = false;
  p.infeasible_reason = why;
  p.kv_on_gpu = c.L.kv_gpu;
  return p;
}

// Every shard's placement: pinned weights at pinned_offset (or -1), where each runs, which are
// streamed (into slot_offset[slot]), and each layer's KV cache in VRAM at kv_offset (or -1 = host).
// Unnamed, like the actions: label_plan names the placements of the plans returned.
std::vector<ShardPlacement> place_shards(const ShardSet& S, const std::vector<int64_t>& pinned_offset,
                                         const std::vector<ExecDevice>& exec, const std::vector<int>& slot,
                                         const std::vector<int64_t>& slot_offset,
                                         const std::vector<int64_t>& kv_offset) {
  std::vector<ShardPlacement> out;
  out.reserve(S.shards.size());
  for (const Shard& s : S.shards) {
    ShardPlacement sp;
    sp.shard = s.id;
    sp.bytes = s.bytes;
    const size_t i = static_cast<size_t>(s.id);
    if (s.kind == ShardKind::Kv) {
      const int64_t off = kv_offset[static_cast<size_t>(s.layer)];
      sp.home = off >= 0 ? WeightHome::Pinned : WeightHome::Host;
      sp.exec = off >= 0 ? ExecDevice::Gpu : ExecDevice::Cpu;
      sp.arena_offset = off;
    } else if (s.kind == ShardKind::Embedding) {
      sp.home = WeightHome::Host;
      sp.exec = ExecDevice::Cpu;
    } else {
      sp.home = pinned_offset[i] >= 0 ? WeightHome::Pinned : WeightHome::Host;
      sp.exec = exec[i];
      sp.streamed = slot[i] >= 0;
      sp.arena_offset = sp.home == WeightHome::Pinned ? pinned_offset[i]
                        : sp.streamed                 ? slot_offset.at(static_cast<size_t>(slot[i]))
                                                      : -1;
    }
    out.push_back(std::move(sp));
  }
  return out;
}

// Fills placements/arena for a canonical-prefix plan and simulates it.
Plan finish_canonical(const Ctx& c, Schedule sched, int64_t n, size_t p, uint64_t slot_bytes,
                      const std::vector<ExecDevice>& exec, const std::vector<int>& slot, int prefetch,
                      const std::string& notes, const std::vector<int>& share = {}) {
  const Layout& L = c.L;
  const ShardSet& S = L.shards;
  Plan plan;
  plan.schedule = sched;
  plan.tier = n;
  plan.budget_bytes = c.cfg.budget_bytes;
  plan.kv_on_gpu = L.kv_gpu;
  plan.pinned_prefix = static_cast<int64_t>(p);
  plan.notes = notes;
  const uint64_t scratch = align_up(c.cfg.executor.scratch_bytes(n));
  const uint64_t pinned = L.prefix_end[p];
  uint64_t off = 0;
  plan.arena.push_back({"pinned", off, pinned});
  off += pinned;
  if (slot_bytes > 0) {
    plan.arena.push_back({"slot0", off, slot_bytes});
    plan.arena.push_back({"slot1", off + slot_bytes, slot_bytes});
    off += 2 * slot_bytes;
  }
  plan.arena.push_back({"scratch", off, scratch});
  off += scratch;
  if (c.stage) {
    plan.arena.push_back({"kv staging", off, staging_bytes(c)});
    off += staging_bytes(c);
  }
  const uint64_t kv_off = arena_top(c.cfg.budget_bytes) - L.kv_region;
  if (L.kv_region > 0) plan.arena.push_back({"kv", kv_off, L.kv_region});
  plan.vram_bytes = off + L.kv_region;
  std::vector<int64_t> pinned_offset(S.shards.size(), -1);
  for (size_t i = 0; i < p; ++i)
    pinned_offset[static_cast<size_t>(L.canonical[i])] = static_cast<int64_t>(L.prefix_end[i]);
  std::vector<int64_t> kv_offset(static_cast<size_t>(S.n_layers), -1);
  for (int l = 0; l < S.n_layers; ++l)
    if (L.kv_gpu[static_cast<size_t>(l)])
      kv_offset[static_cast<size_t>(l)] = static_cast<int64_t>(kv_off + static_cast<uint64_t>(l) * L.kv_layer_bytes);
  const std::vector<int64_t> slot_offset = {static_cast<int64_t>(pinned), static_cast<int64_t>(pinned + slot_bytes)};
  plan.placements = place_shards(S, pinned_offset, exec, slot, slot_offset, kv_offset);
  if (plan.vram_bytes > c.cfg.budget_bytes) {
    plan.feasible = false;
    plan.infeasible_reason = "needs " + format_bytes(plan.vram_bytes) + " of VRAM";
    return plan;
  }
  const double hit = c.cfg.next_layer_hits;
  const bool may_guess = hit > 0 && c.spec.is_moe();
  Plan laid_out;  // the plan before its actions, for the speculative one
  if (may_guess) laid_out = plan;
  auto build = [&](Plan& p, double hit) {
    Builder builder(c.spec, c.cfg.executor, S, p, n, routing_experts_for(c.spec, c.cfg, n), c.spares);
    if (c.stage) builder.stage_host_kv(std::max<int64_t>(0, c.cfg.ctx - n));
    if (!share.empty()) builder.split_experts(share);
    builder.speculate(hit);
    builder.build(exec, slot, L.kv_gpu, prefetch, slot_bytes);
    p.predicted_ms = simulate(p, *c.prices);
    p.feasible = true;
    return builder.speculates();
  };
  build(plan, 0);
  SW_CHECK(std::isfinite(hit) && hit >= 0 && hit <= 1, "planner: next_layer_hits ", hit, " must be within [0, 1]");
  if (may_guess) {  // with speculative expert prefetch where it applies; the faster is kept
    Plan guessed = std::move(laid_out);
    if (build(guessed, hit) && (guessed.predicted_ms < plan.predicted_ms || c.cfg.always_speculate)) {
      guessed.notes +=
          (guessed.notes.empty() ? "" : "; ") + str_cat("experts prefetched on the layer before's guess (",
                                                        static_cast<int>(std::lround(hit * 100)), "% hits)");
      std::swap(plan, guessed);
    }
    if (c.spares) c.spares->recycle(guessed);
  }
  return plan;
}

// Room for the pinned prefix and stream slots in a tier.
bool room_for(const Ctx& c, int64_t n, uint64_t* room) {
  const uint64_t fixed = c.L.kv_region + align_up(c.cfg.executor.scratch_bytes(n)) + staging_bytes(c);
  if (fixed > c.cfg.budget_bytes) return false;
  *room = c.cfg.budget_bytes - fixed;
  return true;
}

Plan plan_gpu_only(const Ctx& c, int64_t n) {
  const Layout& L = c.L;
  const ShardSet& S = L.shards;
  uint64_t room;
  if (!room_for(c, n, &room)) return infeasible(c, Schedule::GpuOnly, n, "scratch and KV exceed the budget");
  const size_t N = L.canonical.size();
  // The longest prefix p such that prefix + two slots of the largest remaining shard fit.
  std::vector<uint64_t> suffix_max(N + 1, 0);
  for (size_t i = N; i-- > 0;) {
    std::vector<int> one = {L.canonical[i]};
    suffix_max[i] = std::max(suffix_max[i + 1], largest_streamed(c.spec, c.cfg, S, one, n));
  }
  for (size_t p = N + 1; p-- > 0;) {
    if (L.prefix_end[p] + 2 * suffix_max[p] > room) continue;
    std::vector<ExecDevice> exec(S.shards.size(), ExecDevice::Gpu);
    std::vector<int> slot(S.shards.size(), -1);
    int k = 0;
    for (int l = 0; l < S.n_layers; ++l)
      for (int id : {S.attention[l], S.ffn[l]})
        if (std::find(L.canonical.begin(), L.canonical.begin() + static_cast<std::ptrdiff_t>(p), id) ==
            L.canonical.begin() + static_cast<std::ptrdiff_t>(p))
          slot[static_cast<size_t>(id)] = (k++) % 2;
    if (std::find(L.canonical.begin(), L.canonical.begin() + static_cast<std::ptrdiff_t>(p), S.output) ==
        L.canonical.begin() + static_cast<std::ptrdiff_t>(p))
      slot[static_cast<size_t>(S.output)] = (k++) % 2;
    char notes[128];
    std::snprintf(notes, sizeof notes, "%zu of %zu shards pinned, %d streamed", p, N, k);
    return finish_canonical(c, Schedule::GpuOnly, n, p, suffix_max[p], exec, slot, 2, notes);
  }
  return infeasible(c, Schedule::GpuOnly, n, "two stream slots of the largest shard do not fit");
}

size_t longest_prefix(const Layout& L, uint64_t room) {
  size_t p = 0;
  while (p < L.canonical.size() && L.prefix_end[p + 1] <= room) ++p;
  return p;
}

// Static / Dynamic: pinned shards run on the GPU, the rest on the CPU, except the `streamed` ones.
Plan plan_hybrid(const Ctx& c, int64_t n, Schedule sched, uint64_t slot_bytes, const std::vector<int>& stream_ids,
                 size_t p, const std::string& notes, const std::vector<int>& share = {}) {
  const Layout& L = c.L;
  const ShardSet& S = L.shards;
  std::vector<ExecDevice> exec(S.shards.size(), ExecDevice::Cpu);
  std::vector<int> slot(S.shards.size(), -1);
  for (size_t i = 0; i < p; ++i) exec[static_cast<size_t>(L.canonical[i])] = ExecDevice::Gpu;
  int k = 0;
  for (int id : stream_ids) {
    exec[static_cast<size_t>(id)] = ExecDevice::Gpu;
    slot[static_cast<size_t>(id)] = (k++) % 2;
  }
  for (int l = 0; l < S.n_layers; ++l)
    if (L.kv_gpu[static_cast<size_t>(l)] && exec[static_cast<size_t>(S.attention[l])] != ExecDevice::Gpu)
      return infeasible(
          c, sched, n,
          "layer " + std::to_string(l) + " keeps its KV in VRAM but its attention is neither pinned nor streamed");
  return finish_canonical(c, sched, n, p, slot_bytes, exec, slot, 2, notes, share);
}

Plan plan_static(const Ctx& c, int64_t n) {
  uint64_t room;
  if (!room_for(c, n, &room)) return infeasible(c, Schedule::Static, n, "scratch and KV exceed the budget");
  const size_t p = longest_prefix(c.L, room);
  char notes[96];
  std::snprintf(notes, sizeof notes, "%zu of %zu shards pinned", p, c.L.canonical.size());
  return plan_hybrid(c, n, Schedule::Static, 0, {}, p, notes);
}

// Position of a shard in a step's execution (attention, FFN layer by layer, then the LM head).
int exec_rank(const ShardSet& S, int id) {
  const Shard& s = S.at(id);
  if (s.kind == ShardKind::Output) return 2 * S.n_layers;
  return 2 * s.layer + (s.kind == ShardKind::Ffn ? 1 : 0);
}

// The shards a Dynamic plan with stream slots of slot_bytes streams beside the pinned prefix `p` that
// leaves room for the two slots.
struct DynamicChoice {
  size_t p = 0;
  std::vector<int> forced;      // attention of KV-in-VRAM layers that is not pinned
  std::vector<int> candidates;  // CPU shards that fit the slot, in execution order
};

// False where an attention shard that must be streamed does not fit the slot.
bool dynamic_choice(const Ctx& c, int64_t n, uint64_t slot_bytes, uint64_t room, DynamicChoice* d) {
  const Layout& L = c.L;
  const ShardSet& S = L.shards;
  const size_t p = longest_prefix(L, room - 2 * slot_bytes);
  d->p = p;
  auto pinned_at = [&](int id) {
    return std::find(L.canonical.begin(), L.canonical.begin() + static_cast<std::ptrdiff_t>(p), id) !=
           L.canonical.begin() + static_cast<std::ptrdiff_t>(p);
  };
  bool fits = true;
  for (int l = 0; l < S.n_layers; ++l) {
    const int id = S.attention[l];
    if (!L.kv_gpu[static_cast<size_t>(l)] || pinned_at(id)) continue;
    d->forced.push_back(id);
    std::vector<int> one = {id};
    fits = fits && largest_streamed(c.spec, c.cfg, S, one, n) <= slot_bytes;
  }
  if (!fits) return false;
  for (int l = 0; l < S.n_layers; ++l) {
    const int id = S.ffn[l];
    std::vector<int> one = {id};
    if (!pinned_at(id) && largest_streamed(c.spec, c.cfg, S, one, n) <= slot_bytes) d->candidates.push_back(id);
  }
  if (!pinned_at(S.output)) d->candidates.push_back(S.output);  // the LM head fits any slot in row pieces
  return true;
}

// The faster feasible plan of the two in `best` (the earlier on a tie); the other one's lists to the
// thread's spares.
void keep_faster(const Ctx& c, Plan& best, Plan plan) {
  if (plan.feasible && (!best.feasible || plan.predicted_ms < best.predicted_ms)) std::swap(best, plan);
  if (c.spares) c.spares->recycle(plan);
}

// Streaming m of the candidates, spread evenly over the layers: every count up to 8, then about 12%
// apart, and all of them (none, where attention shards must be streamed anyway).
void dynamic_streamed(const Ctx& c, int64_t n, uint64_t slot_bytes, const DynamicChoice& d, Plan& best) {
  const ShardSet& S = c.L.shards;
  const size_t U = d.candidates.size();
  std::vector<size_t> counts;
  if (!d.forced.empty()) counts.push_back(0);
  for (size_t m = 1; m <= U; m = m < 8 ? m + 1 : std::max(m + 1, m * 9 / 8)) counts.push_back(m);
  if (U > 0 && counts.back() != U) counts.push_back(U);
  for (size_t m : counts) {
    if (c.cfg.moe_cpu_experts > 0) break;  // a share given: only the split plans
    std::vector<int> pick;
    for (size_t i = 0; i < m; ++i) pick.push_back(d.candidates[std::min(U - 1, (2 * i + 1) * U / (2 * m))]);
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    const size_t optional = pick.size();
    pick.insert(pick.end(), d.forced.begin(), d.forced.end());
    std::sort(pick.begin(), pick.end(), [&](int a, int b) { return exec_rank(S, a) < exec_rank(S, b); });
    char notes[200];
    std::snprintf(notes, sizeof notes, "%zu of %zu shards pinned, %zu of %zu CPU shards streamed%s (slot %s)", d.p,
                  c.L.canonical.size(), optional, U,
                  d.forced.empty()
                      ? ""
                      : (", attention of " + std::to_string(d.forced.size()) + " KV-in-VRAM layers streamed").c_str(),
                  format_bytes(slot_bytes).c_str());
    keep_faster(c, best, plan_hybrid(c, n, Schedule::Dynamic, slot_bytes, pick, d.p, notes));
  }
}

// MoE: every CPU FFN layer's routed experts split, c of each token's k computed by the CPU from host
// memory while the others are copied and run on the GPU (a layer's copy cannot start before its routing
// is known, so streaming a whole layer never overlaps the CPU's work on it; splitting it does).
void dynamic_split(const Ctx& c, int64_t n, uint64_t slot_bytes, const DynamicChoice& d, Plan& best) {
  const ShardSet& S = c.L.shards;
  const int64_t K = c.spec.is_moe() ? c.spec.num_experts_per_tok : 0;
  std::vector<int> ffns;
  for (int id : d.candidates)
    if (S.at(id).kind == ShardKind::Ffn) ffns.push_back(id);
  const int64_t want = c.cfg.moe_cpu_experts;
  for (int64_t share = 1; share < K && !ffns.empty() && want != 0; ++share) {
    if (want > 0 && share != want) continue;
    std::vector<int> pick = ffns, split(S.shards.size(), 0);
    for (int id : ffns) split[static_cast<size_t>(id)] = static_cast<int>(share);
    pick.insert(pick.end(), d.forced.begin(), d.forced.end());
    std::sort(pick.begin(), pick.end(), [&](int a, int b) { return exec_rank(S, a) < exec_rank(S, b); });
    char notes[200];
    std::snprintf(notes, sizeof notes,
                  "%zu of %zu shards pinned, the experts of %zu CPU FFN layers split: %lld of %lld per token on the "
                  "CPU (slot %s)",
                  d.p, c.L.canonical.size(), ffns.size(), static_cast<long long>(share), static_cast<long long>(K),
                  format_bytes(slot_bytes).c_str());
    keep_faster(c, best, plan_hybrid(c, n, Schedule::Dynamic, slot_bytes, pick, d.p, notes, split));
  }
}

// Dynamic: for each slot size (the distinct sizes of streamable shards), the pinned prefix that
// leaves room for two slots; then how many of the CPU shards to stream (1..all, spread evenly over
// the layers so copies overlap the CPU work between them); the fastest simulated plan wins. An
// attention shard runs where its layer's KV is: pinned or CPU, or, for a layer whose KV is in VRAM
// but whose attention is not pinned, streamed (always).
// plan_dynamic in parts (the planner plans each slot size on a thread of its own): the slot sizes it
// tries, whose two slots fit `room` (false: scratch and KV alone exceed the budget); the fastest plan of
// one slot size; and the plan where none is feasible, which the fastest of the slot sizes' replaces.
bool dynamic_slots(const Ctx& c, int64_t n, std::vector<uint64_t>* slots, uint64_t* room) {
  const Layout& L = c.L;
  const ShardSet& S = L.shards;
  if (!room_for(c, n, room)) return false;
  std::vector<uint64_t> sizes;
  for (int id : L.canonical) {
    const Shard& s = S.at(id);
    if (s.kind == ShardKind::Attention && !L.kv_gpu[static_cast<size_t>(s.layer)]) continue;
    std::vector<int> one = {id};
    sizes.push_back(largest_streamed(c.spec, c.cfg, S, one, n));
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (uint64_t slot_bytes : sizes)
    if (2 * slot_bytes <= *room) slots->push_back(slot_bytes);
  return true;
}
Plan no_dynamic(const Ctx& c, int64_t n) {
  return infeasible(c, Schedule::Dynamic, n, "no CPU shard can be streamed within the budget");
}
Plan plan_dynamic_slot(const Ctx& c, int64_t n, uint64_t slot_bytes, uint64_t room) {
  Plan best = no_dynamic(c, n);
  DynamicChoice d;
  if (dynamic_choice(c, n, slot_bytes, room, &d)) {
    dynamic_streamed(c, n, slot_bytes, d, best);
    dynamic_split(c, n, slot_bytes, d, best);
  }
  return best;
}

Plan plan_dynamic(const Ctx& c, int64_t n) {
  std::vector<uint64_t> slots;
  uint64_t room;
  if (!dynamic_slots(c, n, &slots, &room))
    return infeasible(c, Schedule::Dynamic, n, "scratch and KV exceed the budget");
  Plan best = no_dynamic(c, n);
  for (uint64_t slot_bytes : slots) keep_faster(c, best, plan_dynamic_slot(c, n, slot_bytes, room));
  return best;
}

// llama.cpp -ngl N: the last N whole layers (weights and KV) on the GPU, the output too when all
// layers fit; for steps of >= 32 tokens the CPU layers' matmul weights are copied to the GPU and
// run there, one at a time (attention over the host KV stays on the CPU).
// llama.cpp's default micro-batch: larger steps run as several of these.
constexpr int64_t kBaselineMicroBatch = 512;

// -ngl N for the budget: the most trailing whole layers (weights and KV; the LM head too once all of
// them fit) that fit beside the compute buffer and, when some layers stay on the CPU, a slot for their
// weights; -1 where not even the buffer fits.
int layer_split_layers(const Ctx& c, uint64_t scratch, uint64_t max_weight, bool* output_gpu) {
  const ShardSet& S = c.L.shards;
  const int Ln = S.n_layers;
  const uint64_t kv = c.L.kv_layer_bytes;
  int N = Ln;
  bool out_gpu = true;
  auto need = [&](int layers, bool out) {
    uint64_t b = scratch + (layers < Ln ? align_up(max_weight) : 0);
    for (int l = Ln - layers; l < Ln; ++l)
      b += align_up(S.at(S.attention[l]).bytes) + align_up(S.at(S.ffn[l]).bytes) + align_up(kv);
    if (out) b += align_up(S.at(S.output).bytes);
    return b;
  };
  while (N >= 0 && need(N, out_gpu && N == Ln) > c.cfg.budget_bytes) {
    if (out_gpu && N == Ln)
      out_gpu = false;
    else
      --N;
  }
  *output_gpu = out_gpu && N == Ln;
  return N;
}

Plan plan_layer_split(const Ctx& c, int64_t n) {
  if (n > kBaselineMicroBatch)
    return infeasible(c, Schedule::LayerSplit, n,
                      "llama.cpp runs steps above its 512-token micro-batch as several micro-batches");
  const ModelSpec& spec = c.spec;
  const ShardSet& S = c.L.shards;
  const int Ln = S.n_layers;
  const uint64_t kv = c.L.kv_layer_bytes;
  const bool offload_batches = n >= 32;
  uint64_t max_weight = 0;
  for (int l = 0; l < Ln; ++l) max_weight = std::max({max_weight, S.at(S.attention[l]).bytes, S.at(S.ffn[l]).bytes});
  // llama.cpp sizes its compute buffer for its micro-batch at load time.
  const uint64_t scratch = align_up(c.cfg.executor.scratch_bytes(kBaselineMicroBatch));
  bool output_gpu = false;
  const int N = layer_split_layers(c, scratch, max_weight, &output_gpu);
  if (N < 0) return infeasible(c, Schedule::LayerSplit, n, "the compute buffer alone exceeds the budget");
  const int first_gpu = Ln - N;
  Plan plan;
  plan.schedule = Schedule::LayerSplit;
  plan.tier = n;
  plan.budget_bytes = c.cfg.budget_bytes;
  plan.kv_on_gpu.assign(static_cast<size_t>(Ln), false);
  for (int l = first_gpu; l < Ln; ++l) plan.kv_on_gpu[static_cast<size_t>(l)] = true;
  std::vector<ExecDevice> exec(S.shards.size(), ExecDevice::Cpu);
  std::vector<int> slot(S.shards.size(), -1);
  std::vector<int64_t> offset(S.shards.size(), -1);
  uint64_t off = 0;
  for (int l = first_gpu; l < Ln; ++l)
    for (int id : {S.attention[l], S.ffn[l]}) {
      exec[static_cast<size_t>(id)] = ExecDevice::Gpu;
      offset[static_cast<size_t>(id)] = static_cast<int64_t>(off);
      off += align_up(S.at(id).bytes);
    }
  if (output_gpu) {
    exec[static_cast<size_t>(S.output)] = ExecDevice::Gpu;
    offset[static_cast<size_t>(S.output)] = static_cast<int64_t>(off);
    off += align_up(S.at(S.output).bytes);
  }
  plan.arena.push_back({"pinned", 0, off});
  uint64_t slot_bytes = 0;
  if (offload_batches && N < Ln) {
    slot_bytes = align_up(max_weight);
    plan.arena.push_back({"slot0", off, slot_bytes});
    for (int l = 0; l < first_gpu; ++l)
      for (int id : {S.attention[l], S.ffn[l]}) {
        exec[static_cast<size_t>(id)] = ExecDevice::Gpu;
        slot[static_cast<size_t>(id)] = 0;
      }
  }
  plan.arena.push_back({"scratch", off + slot_bytes, scratch});
  const uint64_t kv_region = align_up(static_cast<uint64_t>(N) * kv);
  plan.arena.push_back({"kv", arena_top(c.cfg.budget_bytes) - kv_region, kv_region});
  plan.vram_bytes = off + slot_bytes + scratch + kv_region;
  std::vector<int64_t> kv_offset(static_cast<size_t>(Ln), -1);
  for (int l = first_gpu; l < Ln; ++l)
    kv_offset[static_cast<size_t>(l)] =
        static_cast<int64_t>(arena_top(c.cfg.budget_bytes) - kv_region + static_cast<uint64_t>(l - first_gpu) * kv);
  plan.placements = place_shards(S, offset, exec, slot, {static_cast<int64_t>(off)}, kv_offset);
  char notes[128];
  std::snprintf(notes, sizeof notes, "-ngl %d of %d layers%s%s", N, Ln, output_gpu ? " + output" : "",
                offload_batches && N < Ln ? "; CPU layers' weights copied to the GPU for this batch" : "");
  plan.notes = notes;
  plan.pinned_prefix = 0;
  Builder(spec, c.cfg.executor, S, plan, n, routing_experts_for(spec, c.cfg, n)).build(exec, slot, plan.kv_on_gpu, 1);
  plan.predicted_ms = simulate(plan, *c.prices);
  plan.feasible = true;
  return plan;
}

// llama.cpp --cpu-moe: every expert on the CPU, everything else (attention, router, output, all
// KV) on the GPU.
Plan plan_cpu_moe(const Ctx& c, int64_t n) {
  const ModelSpec& spec = c.spec;
  const ShardSet& S = c.L.shards;
  if (!spec.is_moe()) return infeasible(c, Schedule::CpuMoe, n, "the model has no experts");
  if (n > kBaselineMicroBatch)
    return infeasible(c, Schedule::CpuMoe, n,
                      "llama.cpp runs steps above its 512-token micro-batch as several micro-batches");
  Plan plan;
  plan.schedule = Schedule::CpuMoe;
  plan.tier = n;
  plan.budget_bytes = c.cfg.budget_bytes;
  plan.kv_on_gpu.assign(static_cast<size_t>(S.n_layers), true);
  std::vector<ExecDevice> exec(S.shards.size(), ExecDevice::Cpu);
  std::vector<int> slot(S.shards.size(), -1);
  std::vector<int64_t> offset(S.shards.size(), -1);
  uint64_t off = 0;
  for (int l = 0; l < S.n_layers; ++l) {
    exec[static_cast<size_t>(S.attention[l])] = ExecDevice::Gpu;
    offset[static_cast<size_t>(S.attention[l])] = static_cast<int64_t>(off);
    off += align_up(S.at(S.attention[l]).bytes);
  }
  exec[static_cast<size_t>(S.output)] = ExecDevice::Gpu;
  offset[static_cast<size_t>(S.output)] = static_cast<int64_t>(off);
  off += align_up(S.at(S.output).bytes);
  const uint64_t scratch = align_up(c.cfg.executor.scratch_bytes(kBaselineMicroBatch));
  const uint64_t kv_region = align_up(static_cast<uint64_t>(S.n_layers) * c.L.kv_layer_bytes);
  plan.vram_bytes = off + scratch + kv_region;
  if (plan.vram_bytes > c.cfg.budget_bytes)
    return infeasible(c, Schedule::CpuMoe, n, "attention, output and all KV need " + format_bytes(plan.vram_bytes));
  plan.arena = {
      {"pinned", 0, off}, {"scratch", off, scratch}, {"kv", arena_top(c.cfg.budget_bytes) - kv_region, kv_region}};
  std::vector<int64_t> kv_offset(static_cast<size_t>(S.n_layers), -1);
  for (int l = 0; l < S.n_layers; ++l)
    kv_offset[static_cast<size_t>(l)] =
        static_cast<int64_t>(arena_top(c.cfg.budget_bytes) - kv_region + static_cast<uint64_t>(l) * c.L.kv_layer_bytes);
  plan.placements = place_shards(S, offset, exec, slot, {}, kv_offset);
  plan.notes = "experts on the CPU, the rest on the GPU";
  Builder(spec, c.cfg.executor, S, plan, n, routing_experts_for(spec, c.cfg, n)).build(exec, slot, plan.kv_on_gpu, 2);
  plan.predicted_ms = simulate(plan, *c.prices);
  plan.feasible = true;
  return plan;
}

Plan plan_candidate(const Ctx& c, Schedule s, int64_t n) {
  switch (s) {
    case Schedule::GpuOnly:
      return plan_gpu_only(c, n);
    case Schedule::Static:
      return plan_static(c, n);
    case Schedule::Dynamic:
      return plan_dynamic(c, n);
    default:
      fail("plan_candidate: ", schedule_name(s), " is a baseline");
  }
}

// One piece of planning work: the plan of a step of n tokens on layout L with schedule s, the GPU
// attention of host-KV layers split around a CPU core (stage false) or staged (true); a Dynamic plan
// of one stream slot size (one_slot: plan_dynamic_slot) or of all.
struct PlanJob {
  const Layout* L = nullptr;
  Schedule s = Schedule::Static;
  int64_t n = 1;
  bool stage = false;
  bool one_slot = false;
  uint64_t slot_bytes = 0;
};

// A plan wanted: schedule s for a step of n tokens on layout L (one or two jobs: stages_too).
struct PlanWant {
  const Layout* L = nullptr;
  Schedule s = Schedule::Static;
  int64_t n = 1;
};

// With KV on the host, the GPU attention of those layers either splits (its core on the CPU) or runs
// staged: the candidate schedules are planned both ways (faster_variant keeps one).
bool stages_too(const Layout& L, const PlannerConfig& cfg, Schedule s) {
  return schedule_is_candidate(s) && has_host_kv(L) && cfg.host_kv_attention != PlannerConfig::HostKvAttention::Split;
}

// The split plan, or the staged one where it is faster (or forced); a larger staged region may make
// the staged plan infeasible.
Plan faster_variant(const PlannerConfig& cfg, Plan split, Plan staged) {
  using HK = PlannerConfig::HostKvAttention;
  bool stages = false;
  for (const Action& a : staged.actions) stages = stages || a.part == ComputePart::AttnStaged;
  if (stages && staged.feasible &&
      (cfg.host_kv_attention == HK::Staged || !split.feasible || staged.predicted_ms < split.predicted_ms))
    return staged;
  return split;
}

// The planning work of one call (a table, a plan, a budget probe) on up to `threads` threads, each
// with its own step prices by tier (StepPrices is a cache, one per thread). Every layout of a call
// copies `shards` and a duration depends on the shards' contents only, so a thread's prices of a tier
// serve every layout.
class Planning {
 public:
  Planning(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& cfg, int threads)
      : spec(spec),
        cost(cost),
        cfg(cfg),
        shards(make_shards(spec, cfg.ctx, cfg.kv_dtype, &cfg.tensor_dtypes)),
        threads_(std::max(threads, 1)),
        prices_(static_cast<size_t>(threads_)),
        spares_(static_cast<size_t>(threads_)) {}

  // fn(i, thread) for i in [0, n), on up to the call's threads, each thread taking the next i when it is
  // done with one (the items differ in cost by tens of times). The caller reads the results in order, so
  // what it picks is the sequential choice whatever the threads.
  void for_each(int64_t n, const std::function<void(int64_t, int)>& fn) {
    if (threads_ <= 1 || n <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
      return;
    }
    if (!pool_) pool_ = std::make_unique<ThreadPool>(threads_);
    std::atomic<int64_t> next{0};
    pool_->parallel_for(std::min<int64_t>(threads_, n), 1, [&](int64_t, int64_t, int thread) {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, thread);
    });
  }

  // The plans wanted, in order (faster_variant's choice for each), their jobs spread over the threads.
  std::vector<Plan> plan(const std::vector<PlanWant>& want) {
    std::vector<PlanJob> jobs;
    std::vector<Variant> variants;  // per want, split then (stages_too) staged
    for (const PlanWant& w : want)
      for (bool stage : {false, true})
        if (!stage || stages_too(*w.L, cfg, w.s)) variants.push_back(add_jobs(w, stage, jobs));
    // Dynamic jobs (tens of candidate plans each) first, so that no thread starts one last.
    std::vector<size_t> order(jobs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_partition(order.begin(), order.end(), [&](size_t i) { return jobs[i].s == Schedule::Dynamic; });
    std::vector<Plan> done(jobs.size());
    for_each(static_cast<int64_t>(jobs.size()), [&](int64_t i, int thread) {
      const PlanJob& j = jobs[order[static_cast<size_t>(i)]];
      done[order[static_cast<size_t>(i)]] = run(j, prices(thread, j.n), spares_[static_cast<size_t>(thread)]);
    });
    std::vector<Plan> out;
    size_t v = 0;
    for (const PlanWant& w : want) {
      Plan split = gather(w, variants[v++], done);
      out.push_back(stages_too(*w.L, cfg, w.s) ? faster_variant(cfg, std::move(split), gather(w, variants[v++], done))
                                               : std::move(split));
    }
    return out;
  }

  const ModelSpec& spec;
  const CostModel& cost;
  const PlannerConfig& cfg;
  const ShardSet shards;  // make_shards of the config: what every layout of the call copies

 private:
  // The jobs [begin, end) of one plan wanted with attention staged or not; by_slot: a Dynamic plan in
  // parts, one per slot size.
  struct Variant {
    size_t begin = 0, end = 0;
    bool stage = false, by_slot = false;
  };

  Ctx ctx_of(const Layout& L, bool stage) const {
    Ctx c{spec, cost, cfg, L};
    c.stage = stage;
    return c;
  }

  Variant add_jobs(const PlanWant& w, bool stage, std::vector<PlanJob>& jobs) const {
    Variant v;
    v.begin = jobs.size();
    v.stage = stage;
    std::vector<uint64_t> slots;
    uint64_t room = 0;
    if (w.s == Schedule::Dynamic && dynamic_slots(ctx_of(*w.L, stage), w.n, &slots, &room)) {
      v.by_slot = true;
      for (uint64_t slot_bytes : slots) jobs.push_back({w.L, w.s, w.n, stage, true, slot_bytes});
    } else {
      jobs.push_back({w.L, w.s, w.n, stage, false, 0});
    }
    v.end = jobs.size();
    return v;
  }

  // A variant's plan from its jobs': a Dynamic plan the fastest of its slot sizes' (plan_dynamic).
  Plan gather(const PlanWant& w, const Variant& v, std::vector<Plan>& done) const {
    if (!v.by_slot) return std::move(done[v.begin]);
    const Ctx c = ctx_of(*w.L, v.stage);
    Plan best = no_dynamic(c, w.n);
    for (size_t j = v.begin; j < v.end; ++j) keep_faster(c, best, std::move(done[j]));
    return best;
  }

  StepPrices& prices(int thread, int64_t n) {
    auto& p = prices_.at(static_cast<size_t>(thread))[n];
    if (!p) p = std::make_unique<StepPrices>(spec, shards, cost, step_shape(spec, cfg, n));
    return *p;
  }

  Plan run(const PlanJob& j, StepPrices& prices, Spares& spares) const {
    Ctx c = ctx_of(*j.L, j.stage);
    c.prices = &prices;
    c.spares = &spares;
    uint64_t room = 0;
    if (j.one_slot) {
      SW_CHECK(room_for(c, j.n, &room), "planner: a Dynamic slot size planned without room");
      return plan_dynamic_slot(c, j.n, j.slot_bytes, room);
    }
    switch (j.s) {
      case Schedule::GpuOnly:
      case Schedule::Static:
      case Schedule::Dynamic:
        return plan_candidate(c, j.s, j.n);
      case Schedule::LayerSplit:
        return plan_layer_split(c, j.n);
      case Schedule::CpuMoe:
        return plan_cpu_moe(c, j.n);
    }
    fail("unknown schedule");
  }

  const int threads_;
  std::unique_ptr<ThreadPool> pool_;                                    // started by the first parallel loop
  std::vector<std::map<int64_t, std::unique_ptr<StepPrices>>> prices_;  // per thread, per tier
  std::vector<Spares> spares_;                                          // per thread
};

// A layout with the plans choose_layout made on it, by schedule and tier (the table takes them).
struct LayoutPlans {
  Layout L;
  std::map<std::pair<Schedule, int64_t>, Plan> plans;
};

// What choose_layout weighs a layout by.
struct Request {
  std::vector<Schedule> candidates;    // the schedules the table may pick
  std::vector<int64_t> prefill_tiers;  // the prompt's steps: 512-token chunks, or one step of a larger tier
};

Request request_of(const PlannerConfig& cfg) {
  Request r;
  // The prompt's prefill: in chunks of 512 tokens, or in one step of the largest tier within the
  // context (its copies of streamed weights made once instead of once per chunk), whichever is faster.
  const int64_t chunk = std::min<int64_t>(512, cfg.ctx);
  int64_t whole = 0;  // the largest tier within the context, above the chunk
  for (int64_t t : cfg.tiers)
    if (t <= cfg.ctx && t > chunk) whole = std::max(whole, t);
  r.prefill_tiers = {chunk};
  if (whole > 0) r.prefill_tiers.push_back(whole);
  // The layout serves the schedules the table may pick: a table of one schedule (`run --schedule
  // static`) gets the layout best for that one, not one in which it cannot run.
  for (Schedule s : {Schedule::Static, Schedule::Dynamic, Schedule::GpuOnly})
    if (std::find(cfg.schedules.begin(), cfg.schedules.end(), s) != cfg.schedules.end()) r.candidates.push_back(s);
  if (r.candidates.empty()) r.candidates = {Schedule::Static, Schedule::Dynamic, Schedule::GpuOnly};
  return r;
}

// The fastest feasible plan of step t on a layout among the candidate schedules (infinite: none).
double fastest_ms(const LayoutPlans& lp, const Request& r, int64_t t) {
  double ms = INFINITY;
  for (Schedule s : r.candidates) {
    const Plan& p = lp.plans.at({s, t});
    if (p.feasible) ms = std::min(ms, p.predicted_ms);
  }
  return ms;
}

// The plans of steps `tiers` of the candidate schedules on each layout, all at once on the call's threads.
void plan_steps(Planning& P, const Request& r, const std::vector<LayoutPlans*>& layouts,
                const std::vector<int64_t>& tiers) {
  std::vector<PlanWant> want;
  std::vector<LayoutPlans*> of;  // want[i] is a plan of of[i]
  for (LayoutPlans* lp : layouts)
    for (int64_t t : tiers)
      for (Schedule s : r.candidates) {
        want.push_back({&lp->L, s, t});
        of.push_back(lp);
      }
  std::vector<Plan> plans = P.plan(want);
  for (size_t i = 0; i < want.size(); ++i) of[i]->plans[{want[i].s, want[i].n}] = std::move(plans[i]);
}

// Every layout's plans of the request's steps: the decode step's, then the prompt's on the layouts where
// some schedule can decode (request_ms weighs no other).
void plan_requests(Planning& P, const Request& r, const std::vector<LayoutPlans*>& layouts) {
  plan_steps(P, r, layouts, {1});
  std::vector<LayoutPlans*> decoding;
  for (LayoutPlans* lp : layouts)
    if (std::isfinite(fastest_ms(*lp, r, 1))) decoding.push_back(lp);
  std::vector<int64_t> prompt;  // the prefill tiers, the decode step's plans made already
  for (int64_t t : r.prefill_tiers)
    if (t != 1) prompt.push_back(t);
  plan_steps(P, r, decoding, prompt);
}

// The predicted interactive request on a layout: a prompt filling the context (in 512-token chunks
// or one step of the largest tier within it, whichever is faster) plus 64 decode steps, each step with
// the fastest of the candidate schedules.
double request_ms(const LayoutPlans& lp, const Request& r, const PlannerConfig& cfg) {
  const double fastest_decode = fastest_ms(lp, r, 1);
  if (!std::isfinite(fastest_decode)) return INFINITY;
  double prefill = INFINITY;
  for (int64_t t : r.prefill_tiers) {
    const double step = fastest_ms(lp, r, t);
    if (std::isfinite(step))
      prefill = std::min(prefill, std::ceil(static_cast<double>(cfg.ctx) / static_cast<double>(t)) * step);
  }
  if (!std::isfinite(prefill)) prefill = fastest_decode * static_cast<double>(cfg.ctx);
  return prefill + 64.0 * fastest_decode;
}

// KV placement and the LM head's place in the pinned order are fixed for the whole table, so they
// are chosen once: among the priority rule's choice (attention > KV > FFN > output) and a spread of
// alternatives — KV layers up to the most that fit with their attention pinned, and up to the most
// that fit at all (their attention streamed where not pinned); the LM head before or after the FFN
// shards — the one whose plans give the shortest interactive request (request_ms). The layout comes
// with the plans made on it.
LayoutPlans choose_layout(Planning& P) {
  const ModelSpec& spec = P.spec;
  const PlannerConfig& cfg = P.cfg;
  int priority_k = 0, max_k = 0, max_k_streamed = 0;
  kv_layer_bounds(spec, cfg, &priority_k, &max_k, &max_k_streamed);
  std::vector<int> ks = {
      priority_k, 0, max_k, max_k / 4, max_k / 2, (3 * max_k) / 4, max_k_streamed, (max_k + max_k_streamed) / 2};
  if (cfg.kv_layers >= 0) {  // given: only the LM head's place is chosen
    priority_k = static_cast<int>(std::min<int64_t>(cfg.kv_layers, spec.num_hidden_layers));
    ks = {priority_k};
  }
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  const Request r = request_of(cfg);
  LayoutPlans best;
  double best_cost = INFINITY;
  bool have = false;
  int best_k = priority_k;
  auto consider = [&](int k, bool early, LayoutPlans& lp, double request) {
    if (!std::isfinite(request)) return;
    // Prefer the priority rule's choice on ties (within 0.5%).
    if (!have || request < best_cost * (k == priority_k && !early ? 1.005 : 0.995)) {
      best = std::move(lp);
      best_cost = request;
      best_k = k;
      have = true;
    }
  };
  // The KV split with the LM head last (every split's plans at once), then the LM head early with the
  // split chosen (planning cost: each layout plans every schedule at three tiers).
  std::vector<LayoutPlans> layouts(ks.size());
  std::vector<LayoutPlans*> all;
  for (size_t i = 0; i < ks.size(); ++i) {
    layouts[i].L = make_layout(spec, cfg, ks[i], false, &P.shards);
    all.push_back(&layouts[i]);
  }
  plan_requests(P, r, all);
  for (size_t i = 0; i < ks.size(); ++i) consider(ks[i], false, layouts[i], request_ms(layouts[i], r, cfg));
  LayoutPlans early;
  early.L = make_layout(spec, cfg, best_k, true, &P.shards);
  plan_requests(P, r, {&early});
  consider(best_k, true, early, request_ms(early, r, cfg));
  if (!have) return {make_layout(spec, cfg, priority_k, false, &P.shards), {}};
  return best;
}

// Plans are sized and priced by the executor's facts: without them no plan would fit it.
void require_executor(const PlannerConfig& cfg) {
  if (!cfg.executor.set())
    fail("planner: no executor traits given (PlannerConfig::executor: executor_traits gives them)");
}

void check_config(const ModelSpec& spec, const PlannerConfig& cfg) {
  spec.validate(cfg.model_name.empty() ? spec.name : cfg.model_name);
  if (cfg.budget_bytes == 0 || cfg.budget_bytes > kMaxVramBudget)
    fail("--vram-budget ", cfg.budget_bytes, " bytes is out of range (1 byte to 1 PiB)");
  if (cfg.ctx < 1 || cfg.ctx > kMaxContext) fail("--ctx ", cfg.ctx, " is out of range (1 to ", kMaxContext, ")");
  if (cfg.threads < 1 || cfg.threads > kMaxPoolThreads)
    fail("--threads ", cfg.threads, " is out of range (1 to ", kMaxPoolThreads, ")");
  if (cfg.tiers.empty()) fail("no tiers to plan");
  if (cfg.lm_head_piece_bytes < 4096) fail("LM head piece of ", cfg.lm_head_piece_bytes, " bytes: at least 4096");
  if (cfg.kv_layers < -1 || cfg.kv_layers > spec.num_hidden_layers)
    fail("KV layers in VRAM: ", cfg.kv_layers, " is out of range (0..", spec.num_hidden_layers, ", or -1 to choose)");
  for (size_t i = 0; i < cfg.tiers.size(); ++i)
    if (cfg.tiers[i] < 1 || (i && cfg.tiers[i] <= cfg.tiers[i - 1])) fail("tiers must be positive and ascending");
  if (cfg.moe_cpu_experts < -1 ||
      (cfg.moe_cpu_experts > 0 && (!spec.is_moe() || cfg.moe_cpu_experts >= spec.num_experts_per_tok)))
    fail("--moe-split ", cfg.moe_cpu_experts, ": ",
         spec.is_moe()
             ? str_cat("1 .. ", spec.num_experts_per_tok - 1, " experts per token on the CPU, 0 (never) or -1 (choose)")
             : std::string("the model has no experts (use 0 or -1)"));
  require_executor(cfg);
  if (cfg.executor.expert_copies < 1 || cfg.executor.expert_copies > 3)
    fail("expert copies ", cfg.executor.expert_copies,
         ": each routed expert is copied as 1 to 3 copies (gate, up, down)");
}

bool decode_feasible(const ModelSpec& spec, const CostModel& cost, PlannerConfig cfg, uint64_t budget) {
  cfg.budget_bytes = budget;
  Planning P(spec, cost, cfg, 1);
  const Layout L = make_layout(spec, cfg, 0, false, &P.shards);
  const int64_t n = cfg.tiers.front();
  // The schedules the table may pick at its first tier (the candidates the config names; a table of
  // baselines alone picks among them); Static and GPU-only need the least VRAM of the candidates.
  std::vector<Schedule> pickable;
  for (Schedule s : cfg.schedules)
    if (schedule_is_candidate(s)) pickable.push_back(s);
  if (pickable.empty()) pickable = cfg.schedules;
  for (Schedule s : pickable)
    if (P.plan({{&L, s, n}}).front().feasible) return true;
  return false;
}

// Every tier's plan of every schedule (tier-major, schedules in the config's order), labelled: those
// choose_layout made taken from it, the others planned at once on the call's threads.
std::vector<Plan> table_plans(Planning& P, LayoutPlans& chosen) {
  const PlannerConfig& cfg = P.cfg;
  const size_t n_s = cfg.schedules.size();
  std::vector<Plan> plans(cfg.tiers.size() * n_s);
  std::vector<PlanWant> want;
  std::vector<size_t> at;  // want[i] is plans[at[i]]
  for (size_t k = 0; k < plans.size(); ++k) {
    const Schedule s = cfg.schedules[k % n_s];
    const int64_t n = cfg.tiers[k / n_s];
    auto it = chosen.plans.find({s, n});
    if (it != chosen.plans.end()) {
      plans[k] = std::move(it->second);
      chosen.plans.erase(it);
    } else {
      want.push_back({&chosen.L, s, n});
      at.push_back(k);
    }
  }
  std::vector<Plan> made = P.plan(want);
  for (size_t i = 0; i < made.size(); ++i) plans[at[i]] = std::move(made[i]);
  P.for_each(static_cast<int64_t>(plans.size()),
             [&](int64_t k, int) { label_plan(plans[static_cast<size_t>(k)], chosen.L.shards); });
  return plans;
}

}  // namespace

PlannerConfig::HostKvAttention parse_host_kv_attention(const std::string& text) {
  if (text == "choose") return PlannerConfig::HostKvAttention::Choose;
  if (text == "split") return PlannerConfig::HostKvAttention::Split;
  if (text == "staged") return PlannerConfig::HostKvAttention::Staged;
  fail("--host-kv-attention '", text, "': give choose, split or staged");
}

uint64_t minimum_budget(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& config) {
  // Bisection down to the arena's alignment (~42 plannings): every region is a multiple of it, so the
  // smallest feasible budget is one too. lo is infeasible, hi feasible throughout.
  require_executor(config);
  uint64_t lo = 0, hi = kMaxVramBudget;
  if (!decode_feasible(spec, cost, config, hi)) fail("no budget makes this model plannable");
  while (hi - lo > kAlign) {
    const uint64_t mid = (lo + (hi - lo) / 2) / kAlign * kAlign;
    if (decode_feasible(spec, cost, config, mid))
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

Plan build_plan(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& cfg, Schedule s, int64_t tier) {
  check_config(spec, cfg);
  Planning P(spec, cost, cfg, cfg.threads);
  LayoutPlans chosen = choose_layout(P);
  auto it = chosen.plans.find({s, tier});
  Plan plan = it != chosen.plans.end() ? std::move(it->second) : std::move(P.plan({{&chosen.L, s, tier}}).front());
  label_plan(plan, chosen.L.shards);
  return plan;
}

PlanTable build_plan_table(const ModelSpec& spec, const CostModel& cost, const PlannerConfig& cfg) {
  check_config(spec, cfg);
  Planning P(spec, cost, cfg, cfg.threads);
  LayoutPlans chosen = choose_layout(P);
  const Layout& L = chosen.L;
  PlanTable t;
  t.model = cfg.model_name.empty() ? spec.name : cfg.model_name;
  t.machine = cost.describe();
  t.budget_bytes = cfg.budget_bytes;
  t.ctx = cfg.ctx;
  t.threads = cfg.threads;
  t.kv_dtype = dtype_name(cfg.kv_dtype);
  for (size_t i = 0; i < L.canonical.size(); ++i) {
    t.canonical_order.push_back(L.canonical[i]);
    t.canonical_offsets.push_back(L.prefix_end[i]);
  }
  t.kv_on_gpu = L.kv_gpu;
  // A table of baselines alone (`run --schedule layer-split`) picks among them; otherwise they are
  // reference rows, never picked.
  const bool baselines_only = std::none_of(cfg.schedules.begin(), cfg.schedules.end(), schedule_is_candidate);
  // Every tier's plan of every schedule; then each tier's pick, in order.
  const size_t n_s = cfg.schedules.size();
  std::vector<Plan> plans = table_plans(P, chosen);
  for (size_t ti = 0; ti < cfg.tiers.size(); ++ti) {
    const int64_t n = cfg.tiers[ti];
    TierEntry e;
    e.tokens = n;
    double best = 0;
    for (size_t si = 0; si < n_s; ++si) {
      const Schedule s = cfg.schedules[si];
      Plan p = std::move(plans[ti * n_s + si]);
      if (p.feasible && (baselines_only || schedule_is_candidate(s)) && (!e.feasible || p.predicted_ms < best)) {
        e.feasible = true;
        e.chosen = s;
        best = p.predicted_ms;
      }
      e.candidates.push_back(std::move(p));
    }
    t.tiers.push_back(std::move(e));
  }
  // A tier runs as chunks of a smaller one when that is predicted faster (or it does not fit).
  for (size_t i = 0; i < t.tiers.size(); ++i) {
    TierEntry& e = t.tiers[i];
    double best = e.feasible ? e.chosen_plan().predicted_ms : INFINITY;
    for (size_t j = 0; j < i; ++j) {
      const TierEntry& s = t.tiers[j];
      if (!s.feasible) continue;
      const double chunks =
          std::ceil(static_cast<double>(e.tokens) / static_cast<double>(s.tokens)) * s.chosen_plan().predicted_ms;
      if (chunks < best * 0.999) {
        best = chunks;
        e.chunk_tokens = s.tokens;
      }
    }
  }
  if (!t.tiers.front().feasible) {
    // Too small a budget, or schedules that cannot run at any (Dynamic alone where everything fits).
    uint64_t smallest = 0;
    try {
      smallest = minimum_budget(spec, cost, cfg);
    } catch (const Error&) {
    }
    if (smallest > cfg.budget_bytes)
      fail("a VRAM budget of ", format_bytes(cfg.budget_bytes), " is too small for ", t.model, " at --ctx ", cfg.ctx,
           ": the smallest budget that works is ", format_bytes(smallest), " (", smallest, " bytes)");
    std::string why;
    for (const Plan& p : t.tiers.front().candidates)
      why += str_cat(why.empty() ? "" : "; ", schedule_name(p.schedule), ": ", p.infeasible_reason);
    fail("no plan for ", t.tiers.front().tokens, " tokens of ", t.model, " under a VRAM budget of ",
         format_bytes(cfg.budget_bytes), " at --ctx ", cfg.ctx, " (", why, ")");
  }
  // The rules the executor relies on, kept by construction: a break is a planner bug, caught here
  // rather than as wrong tokens.
  verify_plan_table(t, spec, L.shards, "planner (internal error): the plan table for " + t.model);
  return t;
}

double repredict(const Plan& plan, const ModelSpec& spec, const CostModel& cost, const PlannerConfig& cfg) {
  SW_CHECK(plan.feasible, "repredict: the ", schedule_name(plan.schedule), " plan for ", plan.tier,
           " tokens is infeasible");
  require_executor(cfg);
  Plan copy = plan;
  return simulate(copy, spec, make_shards(spec, cfg.ctx, cfg.kv_dtype, &cfg.tensor_dtypes), cost,
                  step_shape(spec, cfg, plan.tier));
}

namespace {
// How many of each token's experts the CPU computes in a split MoE layer (0: not split).
int split_share(const Plan& plan, int shard) {
  for (const Action& a : plan.actions)
    if (a.shard == shard && a.part == ComputePart::MoeCpuShare) return a.cpu_experts;
  return 0;
}
// Why a shard sits where the plan put it, in words.
std::string placement_reason(const Plan& plan, const ModelSpec& spec, const Shard& s, const ShardPlacement& sp) {
  if (s.kind == ShardKind::Embedding) return "embedding rows are gathered on the host";
  if (s.kind == ShardKind::Kv)
    return sp.exec == ExecDevice::Gpu
               ? "KV in VRAM (fixed for the table: the split that simulated a prefill + 64 decode steps fastest)"
               : "KV on the host: attention core runs on the CPU";
  if (sp.home == WeightHome::Pinned) return "pinned: inside the canonical prefix that fits";
  if (split_share(plan, sp.shard) > 0)
    return str_cat("experts split: ", split_share(plan, sp.shard), " of ", spec.num_experts_per_tok,
                   " per token on the CPU from host memory, the rest streamed");
  if (sp.streamed) return "streamed into a slot; the copy overlaps other work";
  return "host weights, CPU compute (no VRAM left)";
}

// A row of explain_plan: the shard's layer (-1: none) and part ("L3.ffn" -> 3, "ffn"), and its columns.
struct ExplainRow {
  int64_t layer = -1;
  std::string part, columns;
};
ExplainRow explain_row(const std::string& name, const std::string& columns) {
  ExplainRow r;
  r.part = name;
  r.columns = columns;
  const size_t dot = name.find('.');
  if (name.size() > 1 && name[0] == 'L' && dot != std::string::npos && dot > 1 &&
      name.find_first_not_of("0123456789", 1) == dot) {
    r.layer = std::stoll(name.substr(1, dot - 1));
    r.part = name.substr(dot + 1);
  }
  return r;
}

// The rows with runs of consecutive layers whose rows are identical printed once, as L<a>-<b>.part.
std::string grouped_rows(const std::vector<ExplainRow>& rows) {
  // Blocks: one layer's consecutive rows, or a row without a layer.
  std::vector<std::pair<size_t, size_t>> blocks;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (rows[i].layer >= 0 && j < rows.size() && rows[j].layer == rows[i].layer) ++j;
    blocks.push_back({i, j});
    i = j;
  }
  auto same = [&](const std::pair<size_t, size_t>& a, const std::pair<size_t, size_t>& b) {
    if (rows[a.first].layer < 0 || rows[b.first].layer != rows[a.first].layer + 1 ||
        a.second - a.first != b.second - b.first)
      return false;
    for (size_t k = 0; k < a.second - a.first; ++k)
      if (rows[a.first + k].part != rows[b.first + k].part || rows[a.first + k].columns != rows[b.first + k].columns)
        return false;
    return true;
  };
  std::string out;
  for (size_t b = 0; b < blocks.size();) {
    size_t e = b + 1;
    while (e < blocks.size() && same(blocks[e - 1], blocks[e])) ++e;
    for (size_t k = blocks[b].first; k < blocks[b].second; ++k) {
      const ExplainRow& r = rows[k];
      std::string name = r.part;
      if (r.layer >= 0)
        name = e - b > 1 ? str_cat("L", r.layer, "-", rows[blocks[e - 1].first].layer, ".", r.part)
                         : str_cat("L", r.layer, ".", r.part);
      char buf[512];
      std::snprintf(buf, sizeof buf, "  %-14s %s\n", name.c_str(), r.columns.c_str());
      out += buf;
    }
    b = e;
  }
  return out;
}
}  // namespace

std::string explain_plan(const Plan& plan, const ModelSpec& spec, const CostModel& cost, const PlannerConfig& cfg) {
  std::ostringstream os;
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype, &cfg.tensor_dtypes);
  const StepShape st = step_shape(spec, cfg, plan.tier);
  os << schedule_name(plan.schedule) << " for " << plan.tier << " tokens: ";
  if (!plan.feasible) {
    os << "infeasible (" << plan.infeasible_reason << ")\n";
    return os.str();
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f ms predicted, %s of %s VRAM; %s\n", plan.predicted_ms,
                format_bytes(plan.vram_bytes).c_str(), format_bytes(plan.budget_bytes).c_str(), plan.notes.c_str());
  os << buf;
  os << "arena:";
  for (const auto& r : plan.arena) os << "  " << r.name << " @" << r.offset << " " << format_bytes(r.bytes);
  os << "\n";
  std::snprintf(buf, sizeof buf, "  %-14s %-7s %-4s %-9s %10s %10s  %s\n", "shard", "weights", "runs", "streamed",
                "bytes", "time ms", "why");
  os << buf;
  std::vector<double> shard_ms(S.shards.size(), 0);
  for (const Action& a : plan.actions)
    if (a.kind == ActionKind::Compute && a.shard >= 0) shard_ms[static_cast<size_t>(a.shard)] += a.end_ms - a.start_ms;
  std::vector<ExplainRow> rows;
  for (const ShardPlacement& sp : plan.placements) {
    const Shard& s = S.at(sp.shard);
    std::snprintf(buf, sizeof buf, "%-7s %-4s %-9s %10s %10.3f  %s", sp.home == WeightHome::Pinned ? "vram" : "host",
                  sp.exec == ExecDevice::Gpu ? "gpu" : "cpu", sp.streamed ? "yes" : "-", format_bytes(sp.bytes).c_str(),
                  shard_ms[static_cast<size_t>(sp.shard)], placement_reason(plan, spec, s, sp).c_str());
    rows.push_back(explain_row(sp.name, buf));
  }
  os << grouped_rows(rows);
  os << "  (a row L<a>-<b>.part stands for each of layers a to b, whose rows are identical; time ms: the shard's "
        "compute in the simulated step)\n";
  (void)cost;
  (void)st;
  return os.str();
}

}  // namespace shardwise

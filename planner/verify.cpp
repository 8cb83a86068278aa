// planner/verify.cpp — the plan rules of verify.h.
#include "planner/verify.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/size.h"

namespace shardwise {
namespace {

// Happens-before between actions: a path of dependencies and queue order (each resource runs its
// actions in list order). Searches back from the later action, never below the earlier one's id
// (ids only grow along a path), so a query costs the window between the two.
class Order {
 public:
  explicit Order(const Plan& p) : p_(p), prev_(p.actions.size(), -1), seen_(p.actions.size(), 0) {
    int last[kNumResources];
    std::fill(std::begin(last), std::end(last), -1);
    for (const Action& a : p.actions) {
      prev_[static_cast<size_t>(a.id)] = last[static_cast<int>(a.resource)];
      last[static_cast<int>(a.resource)] = a.id;
    }
  }
  // `a` finishes before `b` starts.
  bool before(int a, int b) {
    if (a >= b) return false;
    ++stamp_;
    stack_.assign(1, b);
    while (!stack_.empty()) {
      const int x = stack_.back();
      stack_.pop_back();
      auto visit = [&](int y) {
        if (y == a) return true;
        if (y > a && seen_[static_cast<size_t>(y)] != stamp_) {
          seen_[static_cast<size_t>(y)] = stamp_;
          stack_.push_back(y);
        }
        return false;
      };
      if (visit(prev_[static_cast<size_t>(x)])) return true;
      for (int d : p_.actions[static_cast<size_t>(x)].deps)
        if (visit(d)) return true;
    }
    return false;
  }

 private:
  const Plan& p_;
  std::vector<int> prev_;
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  std::vector<int> stack_;
};

struct Ctx {
  const Plan& p;
  const ModelSpec& spec;
  const ShardSet& S;
  uint64_t budget;
  std::string where;
  template <typename... Args>
  [[noreturn]] void fail_at(const Args&... args) const {
    fail(where, ": ", args...);
  }
  std::string act(const Action& a) const { return str_cat("action ", a.id, " (", a.label, ")"); }
};

const ArenaRegion* region(const Plan& p, const char* name) {
  for (const ArenaRegion& r : p.arena)
    if (r.name == name) return &r;
  return nullptr;
}

// Every region and every shard in the arena starts on this boundary: kernels access weights, caches
// and activations with vector loads and stores.
constexpr uint64_t kArenaAlign = 256;

bool overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

void check_arena(const Ctx& c) {
  static const char* const kNames[] = {"pinned", "slot0", "slot1", "scratch", "kv staging", "kv"};
  if (c.p.vram_bytes > c.budget) c.fail_at("vram_bytes ", c.p.vram_bytes, " exceed the budget of ", c.budget, " bytes");
  for (size_t i = 0; i < c.p.arena.size(); ++i) {
    const ArenaRegion& r = c.p.arena[i];
    if (std::find(std::begin(kNames), std::end(kNames), r.name) == std::end(kNames))
      c.fail_at("arena[", i, "]: region name '", r.name,
                "' is not one of pinned, slot0, slot1, scratch, kv staging, kv");
    if (r.offset % kArenaAlign != 0)
      c.fail_at("arena region '", r.name, "' starts at offset ", r.offset, ", not a multiple of ", kArenaAlign,
                " bytes");
    if (r.offset > c.budget || r.bytes > c.budget - r.offset)
      c.fail_at("arena region '", r.name, "' [", r.offset, ", +", r.bytes, ") lies outside the budget of ", c.budget,
                " bytes");
    for (size_t j = 0; j < i; ++j) {
      const ArenaRegion& o = c.p.arena[j];
      if (o.name == r.name) c.fail_at("arena region '", r.name, "' appears twice");
      if (overlap(r.offset, r.bytes, o.offset, o.bytes))
        c.fail_at("arena regions '", o.name, "' [", o.offset, ", +", o.bytes, ") and '", r.name, "' [", r.offset, ", +",
                  r.bytes, ") overlap (all regions are live for the whole step)");
    }
  }
  if (!region(c.p, "scratch")) c.fail_at("the arena has no 'scratch' region");
}

// [offset, offset + bytes) inside the named region.
void check_inside(const Ctx& c, const ShardPlacement& sp, const char* name) {
  const ArenaRegion* r = region(c.p, name);
  const uint64_t off = static_cast<uint64_t>(sp.arena_offset);
  if (!r || sp.arena_offset < 0 || off < r->offset || sp.bytes > r->bytes || off - r->offset > r->bytes - sp.bytes)
    c.fail_at("shard ", sp.name, " at arena offset ", sp.arena_offset, " (", sp.bytes, " bytes) lies outside the '",
              name, "' region");
}

void check_placements(const Ctx& c) {
  const size_t n = c.S.shards.size();
  if (c.p.placements.size() != n)
    c.fail_at(c.p.placements.size(), " shard placements, but this model has ", n,
              " shards (a plan for another model?)");
  if (c.p.kv_on_gpu.size() != static_cast<size_t>(c.S.n_layers))
    c.fail_at("kv_on_gpu names ", c.p.kv_on_gpu.size(), " layers, this model has ", c.S.n_layers);
  std::vector<std::pair<uint64_t, const ShardPlacement*>> pinned;
  const ArenaRegion* slots[2] = {region(c.p, "slot0"), region(c.p, "slot1")};
  for (size_t i = 0; i < n; ++i) {
    const ShardPlacement& sp = c.p.placements[i];
    if (sp.shard != static_cast<int>(i))
      c.fail_at("placements[", i, "] is of shard ", sp.shard, " (placements are listed by shard id)");
    const Shard& s = c.S.at(sp.shard);
    if (sp.bytes != s.bytes)
      c.fail_at("shard ", s.name(), " has ", sp.bytes, " bytes in the plan but ", s.bytes,
                " in this model (a plan for another file?)");
    const bool pin = sp.home == WeightHome::Pinned;
    if (s.kind == ShardKind::Kv) {
      if (pin != c.p.kv_on_gpu[static_cast<size_t>(s.layer)] || sp.streamed)
        c.fail_at("shard ", s.name(), " is ", pin ? "pinned" : "on the host", " but kv_on_gpu says the opposite");
      if (pin) check_inside(c, sp, "kv");
    } else if (s.kind == ShardKind::Embedding) {
      if (pin || sp.streamed || sp.exec != ExecDevice::Cpu)
        c.fail_at("the embedding stays on the host and runs on the CPU");
    } else if (pin) {
      if (sp.streamed) c.fail_at("shard ", s.name(), " is both pinned and streamed");
      check_inside(c, sp, "pinned");
    } else if (sp.streamed) {
      const bool at_slot = std::any_of(std::begin(slots), std::end(slots), [&](const ArenaRegion* r) {
        return r && sp.arena_offset >= 0 && static_cast<uint64_t>(sp.arena_offset) == r->offset;
      });
      if (!at_slot || sp.exec != ExecDevice::Gpu)
        c.fail_at("streamed shard ", s.name(), " must run on the GPU from a stream slot (arena offset ",
                  sp.arena_offset, ")");
    } else if (sp.exec == ExecDevice::Gpu) {
      c.fail_at("shard ", s.name(), " runs on the GPU but is neither pinned nor streamed");
    }
    if (pin) pinned.emplace_back(static_cast<uint64_t>(sp.arena_offset), &sp);
  }
  std::sort(pinned.begin(), pinned.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < pinned.size(); ++i)
    if (overlap(pinned[i - 1].first, pinned[i - 1].second->bytes, pinned[i].first, pinned[i].second->bytes))
      c.fail_at("pinned shards ", pinned[i - 1].second->name, " and ", pinned[i].second->name, " overlap in the arena");
}

// The resource each kind of action runs on, and the ranges of its fields.
void check_action_fields(const Ctx& c) {
  const int n = static_cast<int>(c.S.shards.size()), L = c.S.n_layers;
  for (const Action& a : c.p.actions) {
    if (a.shard < -1 || a.shard >= n) c.fail_at(c.act(a), " names shard ", a.shard, " of ", n);
    if (a.layer < -1 || a.layer >= L) c.fail_at(c.act(a), " names layer ", a.layer, " of ", L);
    if (a.slot < -1 || a.slot > 1) c.fail_at(c.act(a), " names stream slot ", a.slot, " (0 or 1)");
    if (a.slot >= 0 && !region(c.p, a.slot == 0 ? "slot0" : "slot1"))
      c.fail_at(c.act(a), " uses stream slot ", a.slot, ", which the arena lacks");
    for (int d : a.deps)
      if (d < 0 || d >= a.id) c.fail_at(c.act(a), ": dependency ", d, " must name an earlier action");
    bool ok = true;
    switch (a.kind) {
      case ActionKind::Embed:
        ok = a.resource == Resource::Cpu;
        break;
      case ActionKind::Compute:
        ok = a.shard >= 0 && (a.resource == Resource::Cpu || a.resource == Resource::GpuCompute);
        break;
      case ActionKind::CopyWeights:
        ok = a.shard >= 0 && a.slot >= 0 && a.resource == Resource::H2D;
        break;
      case ActionKind::CopyActivations:
        ok = a.resource == Resource::H2D || a.resource == Resource::H2DAct || a.resource == Resource::D2H;
        break;
      case ActionKind::CopyLogits:
        ok = a.resource == Resource::D2H;
        break;
    }
    if (!ok)
      c.fail_at(
          c.act(a), ": a ", action_kind_name(a.kind), " action cannot run on ", resource_name(a.resource),
          a.kind == ActionKind::CopyWeights || a.kind == ActionKind::Compute ? " (or lacks its shard or slot)" : "");
    if (a.kind == ActionKind::CopyWeights && !c.p.placements[static_cast<size_t>(a.shard)].streamed)
      c.fail_at(c.act(a), " copies shard ", c.S.at(a.shard).name(), ", which the plan does not stream");
  }
}

// One step of the forward pass: the compute actions of a shard (or the embedding), in list order.
struct Step {
  std::string name;
  std::vector<int> computes;
};

// The device a compute runs on: its part's, or for a whole shard its placement's.
bool on_gpu(const Ctx& c, const Action& a) {
  switch (a.part) {
    case ComputePart::AttnCore:
    case ComputePart::MoeCpuShare:
      return false;
    case ComputePart::Full:
      return c.p.placements[static_cast<size_t>(a.shard)].exec == ExecDevice::Gpu;
    default:
      return true;
  }
}

// The parts a step is made of: one whole compute, or one of the split forms, each part once.
void check_step_parts(const Ctx& c, const Shard& s, const Step& st) {
  std::map<ComputePart, int> parts;
  for (int id : st.computes) {
    const Action& a = c.p.actions[static_cast<size_t>(id)];
    if (on_gpu(c, a) != (a.resource == Resource::GpuCompute))
      c.fail_at(c.act(a), " runs on ", resource_name(a.resource), " but its shard and part belong on the ",
                on_gpu(c, a) ? "GPU" : "CPU");
    ++parts[a.part];
  }
  using P = ComputePart;
  auto is = [&](std::initializer_list<P> want) {
    if (parts.size() != want.size()) return false;
    for (P w : want)
      if (!parts.count(w) || parts.at(w) != 1) return false;
    return true;
  };
  bool ok = false;
  if (s.kind == ShardKind::Attention)
    ok = is({P::Full}) || is({P::AttnStaged}) || is({P::AttnPre, P::AttnCore, P::AttnPost});
  else if (s.kind == ShardKind::Ffn)
    ok = is({P::Full}) || is({P::MoeGpuShare, P::MoeCpuShare, P::MoeShareAdd});
  else
    ok = parts.size() == 1 && parts.count(P::Full);  // the LM head: whole, or row pieces (checked by the caller)
  if (!ok)
    c.fail_at(st.name, " is not computed exactly once (", st.computes.size(),
              " compute actions of the wrong parts, or none)");
}

// The LM head's computes cover rows [0, vocab) once: one whole compute, or pieces.
void check_head_rows(const Ctx& c, const Step& st) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int id : st.computes) {
    const Action& a = c.p.actions[static_cast<size_t>(id)];
    rows.emplace_back(a.row_begin, a.row_end > a.row_begin
                                       ? a.row_end
                                       : (a.row_end == 0 && a.row_begin == 0 ? c.spec.vocab_size : a.row_begin));
  }
  std::sort(rows.begin(), rows.end());
  int64_t end = 0;
  for (const auto& r : rows) {
    if (r.first != end)
      c.fail_at("the LM head's row pieces do not cover the vocabulary once (a piece starts at ", r.first, ", not ", end,
                ")");
    end = r.second;
  }
  if (end != c.spec.vocab_size) c.fail_at("the LM head's row pieces end at row ", end, " of ", c.spec.vocab_size);
}

std::vector<Step> forward_steps(const Ctx& c) {
  std::vector<Step> steps;
  steps.push_back({"the embedding", {}});
  std::vector<int> step_of(c.S.shards.size(), -1);
  for (int l = 0; l < c.S.n_layers; ++l) {
    step_of[static_cast<size_t>(c.S.attention[static_cast<size_t>(l)])] = static_cast<int>(steps.size());
    steps.push_back({str_cat("layer ", l, "'s attention"), {}});
    step_of[static_cast<size_t>(c.S.ffn[static_cast<size_t>(l)])] = static_cast<int>(steps.size());
    steps.push_back({str_cat("layer ", l, "'s FFN"), {}});
  }
  step_of[static_cast<size_t>(c.S.output)] = static_cast<int>(steps.size());
  steps.push_back({"the LM head", {}});
  for (const Action& a : c.p.actions) {
    if (a.kind == ActionKind::Embed) steps.front().computes.push_back(a.id);
    if (a.kind != ActionKind::Compute || a.part == ComputePart::RouterNext) continue;
    const int k = step_of[static_cast<size_t>(a.shard)];
    if (k < 0) c.fail_at(c.act(a), " computes shard ", c.S.at(a.shard).name(), ", which has nothing to compute");
    steps[static_cast<size_t>(k)].computes.push_back(a.id);
  }
  if (steps.front().computes.size() != 1)
    c.fail_at("the plan has ", steps.front().computes.size(), " embed actions (one needed)");
  return steps;
}

// An x copy of the residual stream from `from` (GPU or host side) to the other side, between a and b.
bool residual_moved(const Ctx& c, Order& order, int a, int b, bool from_gpu) {
  for (int id = a + 1; id < b; ++id) {
    const Action& x = c.p.actions[static_cast<size_t>(id)];
    if (x.kind == ActionKind::CopyActivations && x.payload == Payload::Residual &&
        (x.resource == Resource::D2H) == from_gpu && order.before(a, id) && order.before(id, b))
      return true;
  }
  return false;
}

void check_forward(const Ctx& c, Order& order) {
  std::vector<Step> steps = forward_steps(c);
  int prev_end = -1;
  bool prev_gpu = false;
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& st = steps[k];
    if (k > 0) {
      const int shard = k + 1 == steps.size() ? c.S.output : (k % 2 == 1 ? c.S.attention : c.S.ffn)[(k - 1) / 2];
      check_step_parts(c, c.S.at(shard), st);
      if (shard == c.S.output) check_head_rows(c, st);
    }
    const int end = st.computes.back();
    for (int id : st.computes) {
      if (id != end && !order.before(id, end))
        c.fail_at(c.act(c.p.actions[static_cast<size_t>(id)]), " is not finished before ", st.name, " ends");
      if (prev_end >= 0 && !order.before(prev_end, id))
        c.fail_at(c.act(c.p.actions[static_cast<size_t>(id)]), " of ", st.name,
                  " does not wait for the step before it (", steps[k - 1].name, ")");
    }
    const int first = st.computes.front();
    const bool first_gpu = k > 0 && on_gpu(c, c.p.actions[static_cast<size_t>(first)]);
    if (prev_end >= 0 && first_gpu != prev_gpu && !residual_moved(c, order, prev_end, first, prev_gpu))
      c.fail_at(st.name, " runs on the ", first_gpu ? "GPU" : "CPU", " after ", steps[k - 1].name, " on the ",
                prev_gpu ? "GPU" : "CPU", " with no copy of the residual stream between them");
    prev_end = end;
    prev_gpu = k > 0 && on_gpu(c, c.p.actions[static_cast<size_t>(end)]);
  }
  bool logits = !prev_gpu;
  for (const Action& a : c.p.actions)
    logits = logits || (a.kind == ActionKind::CopyLogits && order.before(prev_end, a.id));
  if (!logits) c.fail_at("the LM head runs on the GPU but no logits copy to the host follows it");
}

// A slot holds what was last copied into it: computes read it after that copy, and the next copy of
// other weights waits for every compute that read it.
void check_slots(const Ctx& c, Order& order) {
  for (int slot = 0; slot < 2; ++slot) {
    std::vector<int> copies, readers;  // the slot's current content
    const Action* held = nullptr;      // its first copy
    for (const Action& a : c.p.actions) {
      if (a.slot != slot) continue;
      if (a.kind == ActionKind::CopyWeights) {
        const bool fill_in = held && !copies.empty() && c.p.actions[static_cast<size_t>(copies.back())].speculative &&
                             !a.speculative && a.shard == held->shard;
        if (!fill_in) {
          for (int r : readers)
            if (!order.before(r, a.id))
              c.fail_at(c.act(a), " overwrites stream slot ", slot, " before ",
                        c.act(c.p.actions[static_cast<size_t>(r)]), " has read it");
          copies.clear();
          readers.clear();
          held = &a;
        }
        copies.push_back(a.id);
      } else if (a.kind == ActionKind::Compute && a.resource == Resource::GpuCompute) {  // the CPU reads host weights
        if (!held || held->shard != a.shard || held->row_begin != a.row_begin || held->row_end != a.row_end)
          c.fail_at(c.act(a), " reads stream slot ", slot, ", which holds ",
                    held ? c.act(*held) + "'s weights" : "nothing", " then");
        for (int cp : copies)
          if (!order.before(cp, a.id))
            c.fail_at(c.act(a), " reads stream slot ", slot, " before ", c.act(c.p.actions[static_cast<size_t>(cp)]),
                      " filled it");
        readers.push_back(a.id);
      }
    }
  }
  // A streamed shard's GPU computes read its slot (all but the sum of a split MoE layer's shares).
  for (const Action& a : c.p.actions)
    if (a.kind == ActionKind::Compute && a.resource == Resource::GpuCompute && a.part != ComputePart::RouterNext &&
        a.part != ComputePart::MoeShareAdd && c.p.placements[static_cast<size_t>(a.shard)].streamed && a.slot < 0)
      c.fail_at(c.act(a), " computes streamed shard ", c.S.at(a.shard).name(), " without naming its stream slot");
}

// KV placement of a plan: per layer, its arena offset (-1: host).
std::vector<int64_t> kv_layout(const Plan& p, const ShardSet& S) {
  std::vector<int64_t> out;
  for (int id : S.kv) out.push_back(p.placements[static_cast<size_t>(id)].arena_offset);
  return out;
}

}  // namespace

void verify_plan(const Plan& plan, const ModelSpec& spec, const ShardSet& shards, uint64_t budget,
                 const std::string& where) {
  const Ctx c{plan, spec, shards, budget, where};
  if (plan.budget_bytes != budget) c.fail_at("budget_bytes ", plan.budget_bytes, " differ from the table's ", budget);
  check_arena(c);
  check_placements(c);
  check_action_fields(c);
  Order order(plan);
  check_forward(c, order);
  check_slots(c, order);
}

void verify_plan_table(const PlanTable& t, const ModelSpec& spec, const ShardSet& shards, const std::string& where) {
  if (t.budget_bytes == 0 || t.budget_bytes > kMaxVramBudget)
    fail(where, ": budget_bytes ", t.budget_bytes, " must be from 1 to ", kMaxVramBudget, " (1 PiB)");
  if (t.ctx < 1 || t.ctx > kMaxContext) fail(where, ": ctx ", t.ctx, " must be from 1 to ", kMaxContext);
  if (t.tiers.empty()) fail(where, ": the plan table has no tiers");
  std::map<Schedule, std::vector<int64_t>> kv_of_schedule;
  std::vector<int64_t> kv_of_chosen;
  for (size_t i = 0; i < t.tiers.size(); ++i) {
    const TierEntry& e = t.tiers[i];
    const std::string tier = str_cat(where, ": tiers[", i, "]");
    if (e.tokens < 1 || (i > 0 && e.tokens <= t.tiers[i - 1].tokens))
      fail(tier, ": tokens ", e.tokens, " (tiers ascend from 1)");
    if (e.chunk_tokens != 0 && (e.chunk_tokens >= e.tokens || !t.find_tier(e.chunk_tokens)))
      fail(tier, ": chunk_tokens ", e.chunk_tokens, " names no smaller tier");
    for (size_t k = 0; k < e.candidates.size(); ++k) {
      const Plan& p = e.candidates[k];
      if (!p.feasible) continue;
      const std::string at = str_cat(tier, ".candidates[", k, "] (", schedule_name(p.schedule), ", tier ", p.tier, ")");
      if (p.tier != e.tokens) fail(at, ": the plan is for ", p.tier, " tokens, its tier for ", e.tokens);
      verify_plan(p, spec, shards, t.budget_bytes, at);
      const std::vector<int64_t> kv = kv_layout(p, shards);
      auto same = [&](std::vector<int64_t>& ref, const char* which) {
        if (ref.empty())
          ref = kv;
        else if (ref != kv)
          fail(at, ": its KV caches lie elsewhere than in the other ", which, " (a cache would move between steps)");
      };
      same(kv_of_schedule[p.schedule], str_cat(schedule_name(p.schedule), " plans").c_str());
      if (e.feasible && p.schedule == e.chosen) same(kv_of_chosen, "chosen plans");
    }
    if (e.feasible && (!e.find(e.chosen) || !e.find(e.chosen)->feasible))
      fail(tier, ": its chosen schedule ", schedule_name(e.chosen), " has no feasible plan");
  }
}

}  // namespace shardwise

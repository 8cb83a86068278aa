// planner/plan.cpp — names, lookup and the JSON round trip of Plan / PlanTable.
#include "planner/plan.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardwise {

using nlohmann::json;

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::GpuCompute: return "gpu";
    case Resource::H2D: return "h2d";
    case Resource::D2H: return "d2h";
    case Resource::Cpu: return "cpu";
    case Resource::H2DAct: return "h2d_act";
  }
  return "?";
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::GpuOnly: return "gpu-only";
    case Schedule::Static: return "static";
    case Schedule::Dynamic: return "dynamic";
    case Schedule::LayerSplit: return "layer-split";
    case Schedule::CpuMoe: return "cpu-moe";
  }
  return "?";
}

Schedule parse_schedule(const std::string& n) {
  for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe})
    if (n == schedule_name(s)) return s;
  fail("unknown schedule '", n, "' (gpu-only, static, dynamic, layer-split, cpu-moe)");
}

bool schedule_is_candidate(Schedule s) {
  return s == Schedule::GpuOnly || s == Schedule::Static || s == Schedule::Dynamic;
}

const char* action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::Embed: return "embed";
    case ActionKind::Compute: return "compute";
    case ActionKind::CopyWeights: return "copy_weights";
    case ActionKind::CopyActivations: return "copy_activations";
    case ActionKind::CopyLogits: return "copy_logits";
  }
  return "?";
}

const char* compute_part_name(ComputePart p) {
  switch (p) {
    case ComputePart::Full: return "full";
    case ComputePart::AttnPre: return "attn_pre";
    case ComputePart::AttnCore: return "attn_core";
    case ComputePart::AttnPost: return "attn_post";
    case ComputePart::AttnStaged: return "attn_staged";
    case ComputePart::MoeCpuShare: return "moe_cpu_share";
    case ComputePart::MoeGpuShare: return "moe_gpu_share";
    case ComputePart::MoeShareAdd: return "moe_share_add";
    case ComputePart::RouterNext: return "router_next";
  }
  return "?";
}

const char* payload_name(Payload p) {
  switch (p) {
    case Payload::None: return "none";
    case Payload::Residual: return "residual";
    case Payload::Qkv: return "qkv";
    case Payload::AttnOut: return "attn_out";
    case Payload::RouterLogits: return "router_logits";
    case Payload::KvPast: return "kv_past";
    case Payload::KvNew: return "kv_new";
    case Payload::MoePartial: return "moe_partial";
    case Payload::RouterGuess: return "router_guess";
  }
  return "?";
}

const Plan* TierEntry::find(Schedule s) const {
  for (const auto& p : candidates)
    if (p.schedule == s) return &p;
  return nullptr;
}

const Plan& TierEntry::chosen_plan() const {
  const Plan* p = find(chosen);
  SW_CHECK(p != nullptr, "tier ", tokens, ": the chosen schedule has no plan");
  return *p;
}

const TierEntry* PlanTable::find_tier(int64_t tokens) const {
  for (const auto& t : tiers)
    if (t.tokens == tokens) return &t;
  return nullptr;
}

const TierEntry& PlanTable::lookup(int64_t n) const {
  SW_CHECK(n >= 1, "a step needs at least one token");
  SW_CHECK(!tiers.empty(), "the plan table has no tiers");
  const TierEntry* e = &tiers.back();
  for (const auto& t : tiers)
    if (t.tokens >= n) {
      e = &t;
      break;
    }
  for (int hops = 0; e->chunk_tokens > 0 && hops < 64; ++hops) {
    const TierEntry* c = find_tier(e->chunk_tokens);
    SW_CHECK(c != nullptr && c->tokens < e->tokens, "tier ", e->tokens, " runs as chunks of a missing tier ", e->chunk_tokens);
    e = c;
  }
  SW_CHECK(e->feasible, "no tier of this plan table can run a step of ", n, " tokens");
  return *e;
}

// ---------------------------------------------------------------------------------------------

namespace {

template <typename E>
E enum_from(const json& j, const char* field, E (*parse)(const std::string&), const std::string& ctx) {
  if (!j.contains(field) || !j[field].is_string()) fail(ctx, ": field '", field, "' must be a string");
  return parse(j[field].get<std::string>());
}

Resource parse_resource(const std::string& s) {
  for (Resource r : {Resource::GpuCompute, Resource::H2D, Resource::D2H, Resource::Cpu, Resource::H2DAct})
    if (s == resource_name(r)) return r;
  fail("unknown resource '", s, "'");
}
ActionKind parse_action_kind(const std::string& s) {
  for (ActionKind k : {ActionKind::Embed, ActionKind::Compute, ActionKind::CopyWeights, ActionKind::CopyActivations,
                       ActionKind::CopyLogits})
    if (s == action_kind_name(k)) return k;
  fail("unknown action kind '", s, "'");
}
Payload parse_payload(const std::string& s) {
  for (Payload p : {Payload::None, Payload::Residual, Payload::Qkv, Payload::AttnOut, Payload::RouterLogits, Payload::KvPast,
                    Payload::KvNew, Payload::MoePartial, Payload::RouterGuess})
    if (s == payload_name(p)) return p;
  fail("unknown payload '", s, "'");
}
ComputePart parse_part(const std::string& s) {
  for (ComputePart p : {ComputePart::Full, ComputePart::AttnPre, ComputePart::AttnCore, ComputePart::AttnPost, ComputePart::AttnStaged,
                        ComputePart::MoeCpuShare, ComputePart::MoeGpuShare, ComputePart::MoeShareAdd, ComputePart::RouterNext})
    if (s == compute_part_name(p)) return p;
  fail("unknown compute part '", s, "'");
}

json to_json(const Plan& p) {
  json j;
  j["version"] = p.version;
  j["schedule"] = schedule_name(p.schedule);
  j["tier"] = p.tier;
  j["feasible"] = p.feasible;
  if (!p.feasible) j["infeasible_reason"] = p.infeasible_reason;
  j["budget_bytes"] = p.budget_bytes;
  j["vram_bytes"] = p.vram_bytes;
  j["predicted_ms"] = p.predicted_ms;
  j["pinned_prefix"] = p.pinned_prefix;
  j["notes"] = p.notes;
  j["kv_on_gpu"] = p.kv_on_gpu;
  json pl = json::array();
  for (const auto& s : p.placements)
    pl.push_back({{"shard", s.shard}, {"name", s.name}, {"home", s.home == WeightHome::Pinned ? "pinned" : "host"},
                  {"exec", s.exec == ExecDevice::Gpu ? "gpu" : "cpu"}, {"streamed", s.streamed},
                  {"arena_offset", s.arena_offset}, {"bytes", s.bytes}});
  j["placements"] = pl;
  json ar = json::array();
  for (const auto& r : p.arena) ar.push_back({{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}});
  j["arena"] = ar;
  json acts = json::array();
  for (const auto& a : p.actions)
    acts.push_back({{"id", a.id}, {"resource", resource_name(a.resource)}, {"kind", action_kind_name(a.kind)},
                    {"part", compute_part_name(a.part)}, {"payload", payload_name(a.payload)}, {"shard", a.shard}, {"layer", a.layer}, {"slot", a.slot},
                    {"row_begin", a.row_begin}, {"row_end", a.row_end},
                    {"bytes", a.bytes}, {"copies", a.copies}, {"cpu_experts", a.cpu_experts}, {"speculative", a.speculative}, {"flops", a.flops}, {"deps", a.deps}, {"label", a.label},
                    {"start_ms", a.start_ms}, {"end_ms", a.end_ms}});
  j["actions"] = acts;
  return j;
}

template <typename T>
T field(const json& j, const char* name, const std::string& ctx) {
  if (!j.contains(name)) fail(ctx, ": missing field '", name, "'");
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    fail(ctx, ": field '", name, "' has the wrong type");
  }
}

Plan from_json(const json& j, const std::string& ctx) {
  if (!j.is_object()) fail(ctx, ": a plan must be a JSON object");
  Plan p;
  p.version = field<int>(j, "version", ctx);
  if (p.version != kPlanFormatVersion)
    fail(ctx, ": plan format version ", p.version, " is not supported (this build reads version ", kPlanFormatVersion, ")");
  p.schedule = enum_from<Schedule>(j, "schedule", parse_schedule, ctx);
  p.tier = field<int64_t>(j, "tier", ctx);
  p.feasible = field<bool>(j, "feasible", ctx);
  if (!p.feasible && j.contains("infeasible_reason")) p.infeasible_reason = field<std::string>(j, "infeasible_reason", ctx);
  p.budget_bytes = field<uint64_t>(j, "budget_bytes", ctx);
  p.vram_bytes = field<uint64_t>(j, "vram_bytes", ctx);
  p.predicted_ms = field<double>(j, "predicted_ms", ctx);
  p.pinned_prefix = field<int64_t>(j, "pinned_prefix", ctx);
  p.notes = field<std::string>(j, "notes", ctx);
  p.kv_on_gpu = field<std::vector<bool>>(j, "kv_on_gpu", ctx);
  for (const auto& s : field<json>(j, "placements", ctx)) {
    ShardPlacement sp;
    sp.shard = field<int>(s, "shard", ctx + " placement");
    sp.name = field<std::string>(s, "name", ctx + " placement");
    const std::string home = field<std::string>(s, "home", ctx + " placement");
    const std::string exec = field<std::string>(s, "exec", ctx + " placement");
    if (home != "pinned" && home != "host") fail(ctx, ": placement home '", home, "' must be pinned or host");
    if (exec != "gpu" && exec != "cpu") fail(ctx, ": placement exec '", exec, "' must be gpu or cpu");
    sp.home = home == "pinned" ? WeightHome::Pinned : WeightHome::Host;
    sp.exec = exec == "gpu" ? ExecDevice::Gpu : ExecDevice::Cpu;
    sp.streamed = field<bool>(s, "streamed", ctx + " placement");
    sp.arena_offset = field<int64_t>(s, "arena_offset", ctx + " placement");
    sp.bytes = field<uint64_t>(s, "bytes", ctx + " placement");
    p.placements.push_back(sp);
  }
  for (const auto& r : field<json>(j, "arena", ctx))
    p.arena.push_back({field<std::string>(r, "name", ctx + " arena"), field<uint64_t>(r, "offset", ctx + " arena"),
                       field<uint64_t>(r, "bytes", ctx + " arena")});
  for (const auto& a : field<json>(j, "actions", ctx)) {
    Action x;
    const std::string actx = ctx + " action";
    x.id = field<int>(a, "id", actx);
    x.resource = enum_from<Resource>(a, "resource", parse_resource, actx);
    x.kind = enum_from<ActionKind>(a, "kind", parse_action_kind, actx);
    x.part = enum_from<ComputePart>(a, "part", parse_part, actx);
    x.payload = enum_from<Payload>(a, "payload", parse_payload, actx);
    x.shard = field<int>(a, "shard", actx);
    x.layer = field<int>(a, "layer", actx);
    x.slot = field<int>(a, "slot", actx);
    x.row_begin = field<int64_t>(a, "row_begin", actx);
    x.row_end = field<int64_t>(a, "row_end", actx);
    if (x.row_begin < 0 || x.row_end < x.row_begin) fail(actx, " ", x.id, ": row range [", x.row_begin, ", ", x.row_end, ") is invalid");
    x.bytes = field<uint64_t>(a, "bytes", actx);
    if (a.contains("copies")) {  // plans saved before it: one copy
      x.copies = field<int>(a, "copies", actx);
      if (x.copies < 1 || x.copies > (1 << 20)) fail(actx, " ", x.id, ": copies ", x.copies, " must be in [1, 1048576]");
    }
    if (a.contains("cpu_experts")) {  // plans saved before it: no split
      x.cpu_experts = field<int>(a, "cpu_experts", actx);
      if (x.cpu_experts < 0 || x.cpu_experts > 4096) fail(actx, " ", x.id, ": cpu_experts ", x.cpu_experts, " must be in [0, 4096]");
    }
    if (a.contains("speculative")) x.speculative = field<bool>(a, "speculative", actx);  // plans saved before it: none
    if (x.speculative && x.kind != ActionKind::CopyWeights) fail(actx, " ", x.id, ": only a weight copy can be speculative");
    x.flops = field<double>(a, "flops", actx);
    x.deps = field<std::vector<int>>(a, "deps", actx);
    x.label = field<std::string>(a, "label", actx);
    x.start_ms = field<double>(a, "start_ms", actx);
    x.end_ms = field<double>(a, "end_ms", actx);
    if (x.id != static_cast<int>(p.actions.size())) fail(actx, ": ids must be 0, 1, 2, ... in order (got ", x.id, ")");
    for (int d : x.deps)
      if (d < 0 || d >= x.id) fail(actx, " ", x.id, ": dependency ", d, " must name an earlier action");
    p.actions.push_back(std::move(x));
  }
  return p;
}

json parse_json(const std::string& text, const std::string& ctx) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ctx, ": malformed JSON at byte ", e.byte);
  }
}

}  // namespace

std::string plan_to_json(const Plan& plan, int indent) { return to_json(plan).dump(indent); }

Plan plan_from_json(const std::string& text, const std::string& ctx) { return from_json(parse_json(text, ctx), ctx); }

std::string plan_table_to_json(const PlanTable& t, int indent) {
  json j;
  j["version"] = t.version;
  j["model"] = t.model;
  j["machine"] = t.machine;
  j["device"] = t.device;
  j["budget_bytes"] = t.budget_bytes;
  j["ctx"] = t.ctx;
  j["threads"] = t.threads;
  j["pcie_cap_gbps"] = t.pcie_cap_gbps;
  j["kv_dtype"] = t.kv_dtype;
  j["canonical_order"] = t.canonical_order;
  j["canonical_offsets"] = t.canonical_offsets;
  j["kv_on_gpu"] = t.kv_on_gpu;
  json tiers = json::array();
  for (const auto& te : t.tiers) {
    json c = json::array();
    for (const auto& p : te.candidates) c.push_back(to_json(p));
    tiers.push_back({{"tokens", te.tokens}, {"chosen", schedule_name(te.chosen)}, {"feasible", te.feasible},
                     {"chunk_tokens", te.chunk_tokens}, {"candidates", c}});
  }
  j["tiers"] = tiers;
  return j.dump(indent);
}

PlanTable plan_table_from_json(const std::string& text, const std::string& ctx) {
  json j = parse_json(text, ctx);
  if (!j.is_object()) fail(ctx, ": a plan table must be a JSON object");
  PlanTable t;
  t.version = field<int>(j, "version", ctx);
  if (t.version != kPlanFormatVersion)
    fail(ctx, ": plan format version ", t.version, " is not supported (this build reads version ", kPlanFormatVersion, ")");
  t.model = field<std::string>(j, "model", ctx);
  t.machine = field<std::string>(j, "machine", ctx);
  t.device = field<std::string>(j, "device", ctx);
  t.budget_bytes = field<uint64_t>(j, "budget_bytes", ctx);
  t.ctx = field<int64_t>(j, "ctx", ctx);
  t.threads = field<int>(j, "threads", ctx);
  t.pcie_cap_gbps = field<double>(j, "pcie_cap_gbps", ctx);
  t.kv_dtype = field<std::string>(j, "kv_dtype", ctx);
  t.canonical_order = field<std::vector<int64_t>>(j, "canonical_order", ctx);
  t.canonical_offsets = field<std::vector<uint64_t>>(j, "canonical_offsets", ctx);
  t.kv_on_gpu = field<std::vector<bool>>(j, "kv_on_gpu", ctx);
  for (const auto& te : field<json>(j, "tiers", ctx)) {
    TierEntry e;
    e.tokens = field<int64_t>(te, "tokens", ctx + " tier");
    e.chosen = enum_from<Schedule>(te, "chosen", parse_schedule, ctx + " tier");
    e.feasible = field<bool>(te, "feasible", ctx + " tier");
    e.chunk_tokens = field<int64_t>(te, "chunk_tokens", ctx + " tier");
    for (const auto& c : field<json>(te, "candidates", ctx + " tier")) e.candidates.push_back(from_json(c, ctx + " tier"));
    t.tiers.push_back(std::move(e));
  }
  return t;
}

}  // namespace shardwise

// planner/plan.cpp — names, lookup and the JSON round trip of Plan / PlanTable.
#include "planner/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "core/error.h"
#include "core/json_util.h"

namespace shardwise {

using nlohmann::json;

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::GpuCompute:
      return "gpu";
    case Resource::H2D:
      return "h2d";
    case Resource::D2H:
      return "d2h";
    case Resource::Cpu:
      return "cpu";
    case Resource::H2DAct:
      return "h2d_act";
  }
  return "?";
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::GpuOnly:
      return "gpu-only";
    case Schedule::Static:
      return "static";
    case Schedule::Dynamic:
      return "dynamic";
    case Schedule::LayerSplit:
      return "layer-split";
    case Schedule::CpuMoe:
      return "cpu-moe";
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
    case ActionKind::Embed:
      return "embed";
    case ActionKind::Compute:
      return "compute";
    case ActionKind::CopyWeights:
      return "copy_weights";
    case ActionKind::CopyActivations:
      return "copy_activations";
    case ActionKind::CopyLogits:
      return "copy_logits";
  }
  return "?";
}

const char* compute_part_name(ComputePart p) {
  switch (p) {
    case ComputePart::Full:
      return "full";
    case ComputePart::AttnPre:
      return "attn_pre";
    case ComputePart::AttnCore:
      return "attn_core";
    case ComputePart::AttnPost:
      return "attn_post";
    case ComputePart::AttnStaged:
      return "attn_staged";
    case ComputePart::MoeCpuShare:
      return "moe_cpu_share";
    case ComputePart::MoeGpuShare:
      return "moe_gpu_share";
    case ComputePart::MoeShareAdd:
      return "moe_share_add";
    case ComputePart::RouterNext:
      return "router_next";
  }
  return "?";
}

const char* payload_name(Payload p) {
  switch (p) {
    case Payload::None:
      return "none";
    case Payload::Residual:
      return "residual";
    case Payload::Qkv:
      return "qkv";
    case Payload::AttnOut:
      return "attn_out";
    case Payload::RouterLogits:
      return "router_logits";
    case Payload::KvPast:
      return "kv_past";
    case Payload::KvNew:
      return "kv_new";
    case Payload::MoePartial:
      return "moe_partial";
    case Payload::RouterGuess:
      return "router_guess";
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
    SW_CHECK(c != nullptr && c->tokens < e->tokens, "tier ", e->tokens, " runs as chunks of a missing tier ",
             e->chunk_tokens);
    e = c;
  }
  SW_CHECK(e->feasible, "no tier of this plan table can run a step of ", n, " tokens");
  return *e;
}

// ---------------------------------------------------------------------------------------------

namespace {

// A name among an enum's names (the message lists them).
template <typename E>
E parse_enum(const std::string& s, const char* what, std::initializer_list<E> all, const char* (*name)(E)) {
  std::string names;
  for (E e : all) {
    if (s == name(e)) return e;
    names += (names.empty() ? "" : ", ") + std::string(name(e));
  }
  fail("unknown ", what, " '", s, "' (one of ", names, ")");
}
Resource parse_resource(const std::string& s) {
  return parse_enum(s, "resource",
                    {Resource::GpuCompute, Resource::H2D, Resource::D2H, Resource::Cpu, Resource::H2DAct},
                    resource_name);
}
ActionKind parse_action_kind(const std::string& s) {
  return parse_enum(s, "action kind",
                    {ActionKind::Embed, ActionKind::Compute, ActionKind::CopyWeights, ActionKind::CopyActivations,
                     ActionKind::CopyLogits},
                    action_kind_name);
}
Payload parse_payload(const std::string& s) {
  return parse_enum(s, "payload",
                    {Payload::None, Payload::Residual, Payload::Qkv, Payload::AttnOut, Payload::RouterLogits,
                     Payload::KvPast, Payload::KvNew, Payload::MoePartial, Payload::RouterGuess},
                    payload_name);
}
ComputePart parse_part(const std::string& s) {
  return parse_enum(
      s, "compute part",
      {ComputePart::Full, ComputePart::AttnPre, ComputePart::AttnCore, ComputePart::AttnPost, ComputePart::AttnStaged,
       ComputePart::MoeCpuShare, ComputePart::MoeGpuShare, ComputePart::MoeShareAdd, ComputePart::RouterNext},
      compute_part_name);
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
    pl.push_back({{"shard", s.shard},
                  {"name", s.name},
                  {"home", s.home == WeightHome::Pinned ? "pinned" : "host"},
                  {"exec", s.exec == ExecDevice::Gpu ? "gpu" : "cpu"},
                  {"streamed", s.streamed},
                  {"arena_offset", s.arena_offset},
                  {"bytes", s.bytes}});
  j["placements"] = pl;
  json ar = json::array();
  for (const auto& r : p.arena) ar.push_back({{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}});
  j["arena"] = ar;
  json acts = json::array();
  for (const auto& a : p.actions)
    acts.push_back({{"id", a.id},
                    {"resource", resource_name(a.resource)},
                    {"kind", action_kind_name(a.kind)},
                    {"part", compute_part_name(a.part)},
                    {"payload", payload_name(a.payload)},
                    {"shard", a.shard},
                    {"layer", a.layer},
                    {"slot", a.slot},
                    {"row_begin", a.row_begin},
                    {"row_end", a.row_end},
                    {"bytes", a.bytes},
                    {"copies", a.copies},
                    {"cpu_experts", a.cpu_experts},
                    {"speculative", a.speculative},
                    {"flops", a.flops},
                    {"deps", a.deps},
                    {"label", a.label},
                    {"start_ms", a.start_ms},
                    {"end_ms", a.end_ms}});
  j["actions"] = acts;
  return j;
}

// Where a value sits: the file and the JSON path inside it ("tiers[2].candidates[0].actions[17]").
struct At {
  std::string file, path;
  std::string name(const char* key) const { return path.empty() ? key : path + "." + key; }
  At operator()(const char* key) const { return {file, name(key)}; }
  At operator()(const char* key, size_t i) const { return {file, str_cat(name(key), "[", i, "]")}; }
  template <typename... Args>
  [[noreturn]] void fail_at(const Args&... args) const {
    fail(file, ": ", path.empty() ? std::string("(top level)") : path, ": ", args...);
  }
};

// Every key of an object is one this version reads (plan.h lists which are only informational).
void check_keys(const json& j, const At& at, std::initializer_list<const char*> known) {
  if (!j.is_object()) at.fail_at("must be a JSON object");
  for (const auto& kv : j.items())
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return kv.key() == k; }))
      at.fail_at("unknown field '", kv.key(),
                 "' (a plan of another version? the fields are those plan_to_json writes)");
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else if constexpr (std::is_unsigned_v<T>)
    return "a non-negative integer";
  else
    return "an integer";
}

// One value of type T: present, of that type, an integer in T's range.
template <typename T>
T as(const json& v, const At& at) {
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>)
    ok = v.is_string();
  else if constexpr (std::is_floating_point_v<T>)
    ok = v.is_number() && std::isfinite(v.get<double>());
  else if constexpr (std::is_unsigned_v<T>)
    ok = v.is_number_unsigned() && v.get<uint64_t>() <= std::numeric_limits<T>::max();
  else
    ok = v.is_number_integer() &&
         !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())) &&
         v.get<int64_t>() >= std::numeric_limits<T>::min() && v.get<int64_t>() <= std::numeric_limits<T>::max();
  if (!ok) at.fail_at("must be ", type_name<T>(), ", got ", json_brief(v));
  return v.get<T>();
}

template <typename T>
T field(const json& j, const char* name, const At& at) {
  if (!j.contains(name)) at.fail_at("missing field '", name, "'");
  return as<T>(j.at(name), at(name));
}

template <typename T>
std::vector<T> list(const json& j, const char* name, const At& at) {
  if (!j.contains(name)) at.fail_at("missing field '", name, "'");
  const json& a = j.at(name);
  if (!a.is_array()) at(name).fail_at("must be an array");
  std::vector<T> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) out.push_back(as<T>(a[i], at(name, i)));
  return out;
}

const json& array_field(const json& j, const char* name, const At& at) {
  if (!j.contains(name)) at.fail_at("missing field '", name, "'");
  if (!j.at(name).is_array()) at(name).fail_at("must be an array");
  return j.at(name);
}

template <typename E>
E enum_from(const json& j, const char* name, E (*parse)(const std::string&), const At& at) {
  const std::string s = field<std::string>(j, name, at);
  try {
    return parse(s);
  } catch (const Error& e) {
    at(name).fail_at(e.what());
  }
}

ShardPlacement placement_from_json(const json& s, const At& at) {
  check_keys(s, at, {"shard", "name", "home", "exec", "streamed", "arena_offset", "bytes"});
  ShardPlacement sp;
  sp.shard = field<int>(s, "shard", at);
  sp.name = field<std::string>(s, "name", at);
  const std::string home = field<std::string>(s, "home", at);
  const std::string exec = field<std::string>(s, "exec", at);
  if (home != "pinned" && home != "host") at("home").fail_at("'", home, "' must be pinned or host");
  if (exec != "gpu" && exec != "cpu") at("exec").fail_at("'", exec, "' must be gpu or cpu");
  sp.home = home == "pinned" ? WeightHome::Pinned : WeightHome::Host;
  sp.exec = exec == "gpu" ? ExecDevice::Gpu : ExecDevice::Cpu;
  sp.streamed = field<bool>(s, "streamed", at);
  sp.arena_offset = field<int64_t>(s, "arena_offset", at);
  sp.bytes = field<uint64_t>(s, "bytes", at);
  return sp;
}

Action action_from_json(const json& a, const At& at, int index) {
  check_keys(a, at,
             {"id", "resource", "kind", "part", "payload", "shard", "layer", "slot", "row_begin", "row_end", "bytes",
              "copies", "cpu_experts", "speculative", "flops", "deps", "label", "start_ms", "end_ms"});
  Action x;
  x.id = field<int>(a, "id", at);
  if (x.id != index) at("id").fail_at("ids must be 0, 1, 2, ... in order (got ", x.id, ")");
  x.resource = enum_from<Resource>(a, "resource", parse_resource, at);
  x.kind = enum_from<ActionKind>(a, "kind", parse_action_kind, at);
  x.part = enum_from<ComputePart>(a, "part", parse_part, at);
  x.payload = enum_from<Payload>(a, "payload", parse_payload, at);
  x.shard = field<int>(a, "shard", at);
  x.layer = field<int>(a, "layer", at);
  x.slot = field<int>(a, "slot", at);
  x.row_begin = field<int64_t>(a, "row_begin", at);
  x.row_end = field<int64_t>(a, "row_end", at);
  if (x.row_begin < 0 || x.row_end < x.row_begin)
    at.fail_at("row range [", x.row_begin, ", ", x.row_end, ") is invalid");
  x.bytes = field<uint64_t>(a, "bytes", at);
  if (a.contains("copies")) {  // plans saved before it: one copy
    x.copies = field<int>(a, "copies", at);
    if (x.copies < 1 || x.copies > (1 << 20)) at("copies").fail_at(x.copies, " must be in [1, 1048576]");
  }
  if (a.contains("cpu_experts")) {  // plans saved before it: no split
    x.cpu_experts = field<int>(a, "cpu_experts", at);
    if (x.cpu_experts < 0 || x.cpu_experts > 4096) at("cpu_experts").fail_at(x.cpu_experts, " must be in [0, 4096]");
  }
  if (a.contains("speculative")) x.speculative = field<bool>(a, "speculative", at);  // plans saved before it: none
  if (x.speculative && x.kind != ActionKind::CopyWeights)
    at("speculative").fail_at("only a weight copy can be speculative");
  x.flops = field<double>(a, "flops", at);
  x.deps = list<int>(a, "deps", at);
  for (size_t i = 0; i < x.deps.size(); ++i)
    if (x.deps[i] < 0 || x.deps[i] >= x.id)
      at("deps", i).fail_at("dependency ", x.deps[i], " must name an earlier action");
  x.label = field<std::string>(a, "label", at);
  x.start_ms = field<double>(a, "start_ms", at);
  x.end_ms = field<double>(a, "end_ms", at);
  return x;
}

Plan from_json(const json& j, const At& at) {
  check_keys(j, at,
             {"version", "schedule", "tier", "feasible", "infeasible_reason", "budget_bytes", "vram_bytes",
              "predicted_ms", "pinned_prefix", "notes", "kv_on_gpu", "placements", "arena", "actions"});
  Plan p;
  p.version = field<int>(j, "version", at);
  if (p.version != kPlanFormatVersion)
    at("version").fail_at("plan format version ", p.version, " is not supported (this build reads version ",
                          kPlanFormatVersion, ")");
  p.schedule = enum_from<Schedule>(j, "schedule", parse_schedule, at);
  p.tier = field<int64_t>(j, "tier", at);
  p.feasible = field<bool>(j, "feasible", at);
  if (!p.feasible && j.contains("infeasible_reason"))
    p.infeasible_reason = field<std::string>(j, "infeasible_reason", at);
  p.budget_bytes = field<uint64_t>(j, "budget_bytes", at);
  p.vram_bytes = field<uint64_t>(j, "vram_bytes", at);
  p.predicted_ms = field<double>(j, "predicted_ms", at);
  p.pinned_prefix = field<int64_t>(j, "pinned_prefix", at);
  p.notes = field<std::string>(j, "notes", at);
  p.kv_on_gpu = list<bool>(j, "kv_on_gpu", at);
  const json& pl = array_field(j, "placements", at);
  for (size_t i = 0; i < pl.size(); ++i) p.placements.push_back(placement_from_json(pl[i], at("placements", i)));
  const json& ar = array_field(j, "arena", at);
  for (size_t i = 0; i < ar.size(); ++i) {
    const At r = at("arena", i);
    check_keys(ar[i], r, {"name", "offset", "bytes"});
    p.arena.push_back({field<std::string>(ar[i], "name", r), field<uint64_t>(ar[i], "offset", r),
                       field<uint64_t>(ar[i], "bytes", r)});
  }
  const json& acts = array_field(j, "actions", at);
  for (size_t i = 0; i < acts.size(); ++i)
    p.actions.push_back(action_from_json(acts[i], at("actions", i), static_cast<int>(i)));
  return p;
}

json parse_json(const std::string& text, const std::string& ctx) {
  check_json_depth(text, ctx);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ctx, ": malformed JSON at byte ", e.byte);
  }
}
}  // namespace

std::string plan_to_json(const Plan& plan, int indent) {
  return to_json(plan).dump(indent);
}

Plan plan_from_json(const std::string& text, const std::string& ctx) {
  return from_json(parse_json(text, ctx), At{ctx, ""});
}

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
    tiers.push_back({{"tokens", te.tokens},
                     {"chosen", schedule_name(te.chosen)},
                     {"feasible", te.feasible},
                     {"chunk_tokens", te.chunk_tokens},
                     {"candidates", c}});
  }
  j["tiers"] = tiers;
  return j.dump(indent);
}

PlanTable plan_table_from_json(const std::string& text, const std::string& ctx) {
  const json j = parse_json(text, ctx);
  const At at{ctx, ""};
  check_keys(j, at,
             {"version", "model", "machine", "device", "budget_bytes", "ctx", "threads", "pcie_cap_gbps", "kv_dtype",
              "canonical_order", "canonical_offsets", "kv_on_gpu", "tiers"});
  PlanTable t;
  t.origin = ctx;
  t.version = field<int>(j, "version", at);
  if (t.version != kPlanFormatVersion)
    at("version").fail_at("plan format version ", t.version, " is not supported (this build reads version ",
                          kPlanFormatVersion, ")");
  t.model = field<std::string>(j, "model", at);
  t.machine = field<std::string>(j, "machine", at);
  t.device = field<std::string>(j, "device", at);
  t.budget_bytes = field<uint64_t>(j, "budget_bytes", at);
  t.ctx = field<int64_t>(j, "ctx", at);
  t.threads = field<int>(j, "threads", at);
  t.pcie_cap_gbps = field<double>(j, "pcie_cap_gbps", at);
  t.kv_dtype = field<std::string>(j, "kv_dtype", at);
  t.canonical_order = list<int64_t>(j, "canonical_order", at);
  t.canonical_offsets = list<uint64_t>(j, "canonical_offsets", at);
  t.kv_on_gpu = list<bool>(j, "kv_on_gpu", at);
  const json& tiers = array_field(j, "tiers", at);
  for (size_t i = 0; i < tiers.size(); ++i) {
    const At ta = at("tiers", i);
    const json& te = tiers[i];
    check_keys(te, ta, {"tokens", "chosen", "feasible", "chunk_tokens", "candidates"});
    TierEntry e;
    e.tokens = field<int64_t>(te, "tokens", ta);
    e.chosen = enum_from<Schedule>(te, "chosen", parse_schedule, ta);
    e.feasible = field<bool>(te, "feasible", ta);
    e.chunk_tokens = field<int64_t>(te, "chunk_tokens", ta);
    const json& cands = array_field(te, "candidates", ta);
    for (size_t k = 0; k < cands.size(); ++k) e.candidates.push_back(from_json(cands[k], ta("candidates", k)));
    t.tiers.push_back(std::move(e));
  }
  return t;
}

}  // namespace shardwise

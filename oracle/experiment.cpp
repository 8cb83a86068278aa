// oracle/experiment.cpp — experiment YAML parsing, validation and expansion into configurations.
#include "oracle/experiment.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/hardware_spec.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "core/yaml_util.h"
#include "costmodel/profile_db.h"
#include "vision/mmproj.h"
#include "vision/vision_spec.h"

namespace shardwise {
namespace {

const std::vector<std::string> kTopKeys = {"name",       "description", "hardware",  "profile", "models",    "budgets",
                                           "ctx",        "threads",     "pcie_caps", "tiers",   "schedules", "kv_dtype",
                                           "token_seed", "measure",     "filters",   "exclude", "images"};
// What a vision encoder experiment (one with `images`) has besides them.
const std::vector<std::string> kLanguageOnlyKeys = {"ctx",       "threads",  "pcie_caps",  "tiers",
                                                    "schedules", "kv_dtype", "token_seed", "filters"};
constexpr size_t kMaxImages = 64;
constexpr int64_t kMaxImageSide = 1 << 16;
const std::vector<std::string> kMeasureKeys = {"warmup",      "min_repeats",       "max_repeats", "target_spread",
                                               "row_seconds", "expensive_repeats", "max_step_ms", "rounds"};
const std::vector<std::string> kFilterKeys = {"budget_below_model", "plannable"};
const std::vector<std::string> kRuleKeys = {"model", "budget", "ctx", "threads", "pcie_cap", "tier", "schedule"};

// Messages all read "<file>: <field>: what".
struct Ctx {
  std::string file;
  template <typename... Args>
  [[noreturn]] void fail_at(const std::string& field, const Args&... args) const {
    fail(file, ": ", field, ": ", args...);
  }
};

void check_keys(const Ctx& c, const YAML::Node& node, const std::string& where, const std::vector<std::string>& known) {
  if (!node.IsMap()) c.fail_at(where.empty() ? "(top level)" : where, "must be a mapping");
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end())
      c.fail_at(where.empty() ? key : where + "." + key, "unknown field (known: ", comma_list(known), ")");
  }
}

std::string scalar(const Ctx& c, const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) c.fail_at(field, "must be a single value");
  return n.as<std::string>();
}

// A field that may be one value or a list of values; each element with its field name ("budgets[2]").
std::vector<std::pair<std::string, YAML::Node>> items(const Ctx& c, const YAML::Node& n, const std::string& field,
                                                      bool allow_empty = false) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) out.emplace_back(field + "[" + std::to_string(i) + "]", n[i]);
  } else if (n.IsScalar() || n.IsMap()) {
    out.emplace_back(field, n);
  } else if (!n.IsNull()) {
    c.fail_at(field, "must be a value or a list");
  }
  if (out.empty() && !allow_empty) c.fail_at(field, "must not be empty");
  return out;
}

int64_t as_int(const Ctx& c, const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi) {
  const std::string s = scalar(c, n, field);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end) c.fail_at(field, "'", s, "' must be a whole number");
  if (v < lo || v > hi) c.fail_at(field, v, " is out of range (", lo, "..", hi, ")");
  return v;
}

double as_double(const Ctx& c, const YAML::Node& n, const std::string& field, double lo, double hi) {
  const std::string s = scalar(c, n, field);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || !std::isfinite(v)) c.fail_at(field, "'", s, "' must be a number");
  if (v < lo || v > hi) c.fail_at(field, v, " is out of range (", lo, "..", hi, ")");
  return v;
}

bool as_bool(const Ctx& c, const YAML::Node& n, const std::string& field) {
  const std::string s = scalar(c, n, field);
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  c.fail_at(field, "'", s, "' must be true or false");
}

template <typename F>
auto wrap(const Ctx& c, const std::string& field, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    c.fail_at(field, e.what());
  }
}

std::string default_model_name(const std::string& weights) {
  const std::string synth = "synthetic:";
  if (weights.compare(0, synth.size(), synth) == 0) {
    std::string rest = weights.substr(synth.size());
    std::string name = rest.substr(0, rest.find('?'));
    const auto slash = name.find_last_of('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
    const auto dot = name.rfind('.');
    if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
    return name;
  }
  std::string s = weights;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const auto slash = s.find_last_of('/');
  if (slash != std::string::npos) s = s.substr(slash + 1);
  return s;
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// A relative path in the file is tried as given (from the working directory), then next to the file.
std::string resolve_relative(const std::string& p, const std::string& file) {
  if (p.empty() || p[0] == '/' || file_exists(p)) return p;
  const std::string beside = dirname_of(file) + "/" + p;
  return file_exists(beside) ? beside : p;
}

bool is_yaml_path(const std::string& s) {
  return (s.size() > 5 && s.compare(s.size() - 5, 5, ".yaml") == 0) ||
         (s.size() > 4 && s.compare(s.size() - 4, 4, ".yml") == 0);
}

// Files named by a model entry (a .gguf, an HF directory, or the spec .yaml of synthetic:SPEC) are
// found from the working directory or next to the experiment file.
std::string resolve_weights_path(const std::string& weights, const std::string& file) {
  const std::string synth = "synthetic:";
  if (weights.compare(0, synth.size(), synth) != 0) return resolve_relative(weights, file);
  const std::string rest = weights.substr(synth.size());
  const auto q = rest.find('?');
  const std::string spec = rest.substr(0, q);
  if (!is_yaml_path(spec)) return weights;
  return synth + resolve_relative(spec, file) + (q == std::string::npos ? "" : rest.substr(q));
}

}  // namespace

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string make_config_id(const std::string& weights, uint64_t budget_bytes, int64_t ctx, int threads,
                           double pcie_cap_bytes_per_s) {
  // Integers only, so the text (and the id) is the same on every platform.
  const long long cap = std::llround(pcie_cap_bytes_per_s);
  return fnv1a_hex(str_cat("model=", weights, ";budget_bytes=", budget_bytes, ";ctx=", ctx, ";threads=", threads,
                           ";pcie_cap_bytes_per_s=", cap));
}

void parse_shard(const std::string& text, int* index, int* count) {
  const auto slash = text.find('/');
  char* end = nullptr;
  auto num = [&](const std::string& s) {
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end) fail("--shard '", text, "' must be i/n, e.g. 0/4 (shards are numbered from 0)");
    return v;
  };
  if (slash == std::string::npos) fail("--shard '", text, "' must be i/n, e.g. 0/4 (shards are numbered from 0)");
  const long i = num(text.substr(0, slash)), n = num(text.substr(slash + 1));
  if (n < 1 || n > 100000) fail("--shard '", text, "': n must be between 1 and 100000");
  if (i < 0 || i >= n) fail("--shard '", text, "': i must be between 0 and ", n - 1, " (shards are numbered from 0)");
  *index = static_cast<int>(i);
  *count = static_cast<int>(n);
}

bool Configuration::row_excluded(int64_t tier, Schedule s) const {
  for (const auto& r : excluded_rows)
    if (r.first == tier && r.second == s) return true;
  return false;
}

ModelSpec experiment_model_spec(const std::string& weights) {
  const std::string synth = "synthetic:";
  if (weights.compare(0, synth.size(), synth) != 0) return open_weights(weights)->spec();
  return parse_synthetic(weights.substr(synth.size())).spec;
}

// The product of the lists, refused before anything is expanded: 10^9 configurations fit in a 20 KB
// file and would fill memory; each row also takes a plan per tier.
void check_expansion(const Ctx& c, const Experiment& e) {
  const double n = static_cast<double>(e.models.size()) * static_cast<double>(e.budgets.size()) *
                   static_cast<double>(e.ctxs.size()) * static_cast<double>(e.threads.size()) *
                   static_cast<double>(e.caps.size());
  if (n > static_cast<double>(kMaxConfigurations))
    fail(c.file, ": the experiment expands to ", str_cat(std::fixed, std::setprecision(0), n),
         " configurations (models ", e.models.size(), " x budgets ", e.budgets.size(), " x ctx ", e.ctxs.size(),
         " x threads ", e.threads.size(), " x pcie_caps ", e.caps.size(), "), more than ", kMaxConfigurations,
         ": split its lists over several experiment files (--shard i/n divides a sweep between runs, but each run "
         "expands all of it)");
  if (e.tiers.size() > kMaxTiers) c.fail_at("tiers", e.tiers.size(), " tiers: at most ", kMaxTiers);
}

namespace {

// A required key's node.
YAML::Node need(const Ctx& c, const YAML::Node& root, const char* key) {
  if (!root[key] || root[key].IsNull()) c.fail_at(key, "missing (required)");
  return root[key];
}

// Cost model: a measured profile, else (or, for a CPU-only profile, also) a hardware datasheet.
void parse_machine(const Ctx& c, const YAML::Node& root, Experiment& e) {
  const std::string& path = c.file;
  if (root["profile"] && !root["profile"].IsNull()) {
    e.profile = scalar(c, root["profile"], "profile");
    if (e.profile.empty()) c.fail_at("profile", "must name a ProfileDB file (from `shardwise profile`)");
    e.profile_path = resolve_relative(e.profile, path);
    if (!file_exists(e.profile_path))
      c.fail_at("profile", "cannot open ", e.profile, " (looked from the working directory and next to ", path, ")");
  }
  if (e.profile.empty() || (root["hardware"] && !root["hardware"].IsNull())) {
    e.hardware = scalar(c, need(c, root, "hardware"), "hardware");
    e.hardware_path = is_yaml_path(e.hardware) ? resolve_relative(e.hardware, path) : e.hardware;
    wrap(c, "hardware", [&] { return resolve_hardware(e.hardware_path); });
  }
  if (!e.profile.empty()) {
    const ProfileDB db = wrap(c, "profile", [&] { return load_profile(e.profile_path); });
    if (!db.has_gpu() && e.hardware.empty())
      c.fail_at("profile", "the profile ", e.profile_path,
                " has no GPU rows (measured on a machine without a GPU): add `hardware: NAME` to stand in for the GPU, "
                "or use a "
                "GPU profile");
  }
}

// The models' entries (a weights string, or name and weights), each checked by `check` (field, model).
template <class Check>
void parse_models(const Ctx& c, const YAML::Node& root, Experiment& e, const char* example, Check check) {
  std::set<std::string> names;
  for (const auto& [field, n] : items(c, need(c, root, "models"), "models")) {
    ExperimentModel m;
    if (n.IsScalar()) {
      m.weights = n.template as<std::string>();
    } else {
      check_keys(c, n, field, {"name", "weights"});
      if (!n["weights"]) c.fail_at(field + ".weights", "missing (", example, ")");
      m.weights = scalar(c, n["weights"], field + ".weights");
      if (n["name"]) m.name = scalar(c, n["name"], field + ".name");
    }
    m.open_path = resolve_weights_path(m.weights, c.file);
    if (m.name.empty()) m.name = default_model_name(m.weights);
    if (!names.insert(m.name).second)
      c.fail_at(field + ".name", "'", m.name, "' appears twice (give each model a distinct name)");
    check(field, m);
    e.models.push_back(m);
  }
}

void parse_budgets(const Ctx& c, const YAML::Node& root, Experiment& e) {
  std::set<std::string> budget_texts;
  for (const auto& [field, n] : items(c, need(c, root, "budgets"), "budgets")) {
    ExperimentBudget b;
    b.text = scalar(c, n, field);
    if (!b.text.empty() && b.text.back() == '%') {
      b.fraction = as_double(c, YAML::Node(b.text.substr(0, b.text.size() - 1)), field, 1e-6, 1e6) / 100.0;
    } else {
      b.bytes = wrap(c, field, [&] { return parse_vram_budget(b.text, "budget"); });
    }
    if (!budget_texts.insert(b.text).second) c.fail_at(field, "'", b.text, "' appears twice");
    e.budgets.push_back(b);
  }
  for (size_t i = 0; i < e.budgets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (e.budgets[i].bytes && e.budgets[i].bytes == e.budgets[j].bytes)
        c.fail_at("budgets[" + std::to_string(i) + "]", "'", e.budgets[i].text, "' is the same budget as '",
                  e.budgets[j].text, "'");
}

// Contexts, threads, caps, tiers.
void parse_axes(const Ctx& c, const YAML::Node& root, Experiment& e) {
  for (const auto& [field, n] : items(c, need(c, root, "ctx"), "ctx")) {
    const int64_t v = wrap(c, field, [&] { return parse_token_count(scalar(c, n, field), "ctx"); });
    if (v > kMaxContext) c.fail_at(field, v, " is more than ", kMaxContext, " tokens");
    if (std::find(e.ctxs.begin(), e.ctxs.end(), v) != e.ctxs.end()) c.fail_at(field, v, " appears twice");
    e.ctxs.push_back(v);
  }
  for (const auto& [field, n] : items(c, need(c, root, "threads"), "threads")) {
    const int v = static_cast<int>(as_int(c, n, field, 1, kMaxPoolThreads));
    if (std::find(e.threads.begin(), e.threads.end(), v) != e.threads.end()) c.fail_at(field, v, " appears twice");
    e.threads.push_back(v);
  }
  for (const auto& [field, n] : items(c, need(c, root, "pcie_caps"), "pcie_caps")) {
    ExperimentCap cap;
    cap.text = scalar(c, n, field);
    cap.bytes_per_s = wrap(c, field, [&] { return parse_pcie_cap(cap.text, "PCIe cap"); });
    for (const auto& o : e.caps)
      if (o.bytes_per_s == cap.bytes_per_s) c.fail_at(field, "'", cap.text, "' is the same cap as '", o.text, "'");
    e.caps.push_back(cap);
  }
  for (const auto& [field, n] : items(c, need(c, root, "tiers"), "tiers")) {
    const int64_t v = wrap(c, field, [&] { return parse_token_count(scalar(c, n, field), "tier"); });
    if (std::find(e.tiers.begin(), e.tiers.end(), v) != e.tiers.end()) c.fail_at(field, v, " appears twice");
    for (int64_t ctx : e.ctxs)
      if (v > ctx)
        c.fail_at(field, v, " exceeds ctx ", ctx,
                  " (a step of `tier` new tokens over a cache filled to ctx needs tier <= ctx)");
    e.tiers.push_back(v);
  }
  std::sort(e.tiers.begin(), e.tiers.end());
  check_expansion(c, e);
}

// Schedules (default: the three candidates and the two baselines as reference rows), KV dtype, seed.
void parse_schedules(const Ctx& c, const YAML::Node& root, Experiment& e) {
  if (root["schedules"]) {
    for (const auto& [field, n] : items(c, root["schedules"], "schedules")) {
      const Schedule s = wrap(c, field, [&] { return parse_schedule(scalar(c, n, field)); });
      if (std::find(e.schedules.begin(), e.schedules.end(), s) != e.schedules.end())
        c.fail_at(field, schedule_name(s), " appears twice");
      e.schedules.push_back(s);
    }
  } else {
    e.schedules = {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe};
  }
  if (root["kv_dtype"]) {
    e.kv_dtype = scalar(c, root["kv_dtype"], "kv_dtype");
    const DType kv = wrap(c, "kv_dtype", [&] { return parse_dtype(e.kv_dtype); });
    if (!is_kv_dtype(kv))
      c.fail_at("kv_dtype", "the executor keeps the KV cache in ", kKvDtypeNames, " ('", e.kv_dtype,
                "' cannot be measured)");
  }
  if (root["token_seed"])
    e.token_seed = static_cast<uint64_t>(as_int(c, root["token_seed"], "token_seed", 0, INT64_MAX));
}

void parse_measure(const Ctx& c, const YAML::Node& root, Experiment& e) {
  if (const YAML::Node m = root["measure"]) {
    check_keys(c, m, "measure", kMeasureKeys);
    MeasureSettings& s = e.measure;
    if (m["warmup"]) s.warmup = static_cast<int>(as_int(c, m["warmup"], "measure.warmup", 0, 100));
    if (m["min_repeats"]) s.min_repeats = static_cast<int>(as_int(c, m["min_repeats"], "measure.min_repeats", 1, 1000));
    if (m["max_repeats"]) s.max_repeats = static_cast<int>(as_int(c, m["max_repeats"], "measure.max_repeats", 1, 1000));
    if (m["target_spread"]) s.target_spread = as_double(c, m["target_spread"], "measure.target_spread", 0, 10);
    if (m["row_seconds"]) s.row_seconds = as_double(c, m["row_seconds"], "measure.row_seconds", 0, 86400);
    if (m["expensive_repeats"])
      s.expensive_repeats = static_cast<int>(as_int(c, m["expensive_repeats"], "measure.expensive_repeats", 1, 1000));
    if (m["max_step_ms"]) s.max_step_ms = as_double(c, m["max_step_ms"], "measure.max_step_ms", 0, 1e9);
    if (m["rounds"]) s.rounds = static_cast<int>(as_int(c, m["rounds"], "measure.rounds", 1, 10));
    if (s.max_repeats < s.min_repeats)
      c.fail_at("measure.max_repeats", s.max_repeats, " is below measure.min_repeats (", s.min_repeats, ")");
    if (s.expensive_repeats > s.min_repeats)
      c.fail_at("measure.expensive_repeats", s.expensive_repeats, " is above measure.min_repeats (", s.min_repeats,
                ")");
  }
}

void parse_filters(const Ctx& c, const YAML::Node& root, Experiment& e) {
  if (const YAML::Node f = root["filters"]) {
    check_keys(c, f, "filters", kFilterKeys);
    if (f["budget_below_model"])
      e.filters.budget_below_model = as_bool(c, f["budget_below_model"], "filters.budget_below_model");
    if (f["plannable"]) e.filters.plannable = as_bool(c, f["plannable"], "filters.plannable");
  }
}

// One exclusion rule: every value must be one the product can produce, so a typo cannot silently
// exclude nothing.
ExclusionRule parse_exclusion(const Ctx& c, const YAML::Node& r, const std::string& where, const Experiment& e) {
  std::set<std::string> names, budget_texts;
  for (const auto& m : e.models) names.insert(m.name);
  for (const auto& b : e.budgets) budget_texts.insert(b.text);
  ExclusionRule rule;
  rule.where = where;
  if (r["model"])
    for (const auto& [f, n] : items(c, r["model"], where + ".model")) {
      const std::string v = scalar(c, n, f);
      if (!names.count(v))
        c.fail_at(f, "'", v, "' is not one of the models (", comma_list({names.begin(), names.end()}), ")");
      rule.models.push_back(v);
    }
  if (r["budget"])
    for (const auto& [f, n] : items(c, r["budget"], where + ".budget")) {
      const std::string v = scalar(c, n, f);
      if (!budget_texts.count(v))
        c.fail_at(f, "'", v, "' is not one of the budgets (", comma_list({budget_texts.begin(), budget_texts.end()}),
                  ")");
      rule.budgets.push_back(v);
    }
  if (r["ctx"])
    for (const auto& [f, n] : items(c, r["ctx"], where + ".ctx")) {
      const int64_t v = wrap(c, f, [&] { return parse_token_count(scalar(c, n, f), "ctx"); });
      if (std::find(e.ctxs.begin(), e.ctxs.end(), v) == e.ctxs.end()) c.fail_at(f, v, " is not one of the ctx values");
      rule.ctxs.push_back(v);
    }
  if (r["threads"])
    for (const auto& [f, n] : items(c, r["threads"], where + ".threads")) {
      const int v = static_cast<int>(as_int(c, n, f, 1, kMaxPoolThreads));
      if (std::find(e.threads.begin(), e.threads.end(), v) == e.threads.end())
        c.fail_at(f, v, " is not one of the thread counts");
      rule.threads.push_back(v);
    }
  if (r["pcie_cap"])
    for (const auto& [f, n] : items(c, r["pcie_cap"], where + ".pcie_cap")) {
      const double v = wrap(c, f, [&] { return parse_bandwidth(scalar(c, n, f), "PCIe cap"); });
      if (std::none_of(e.caps.begin(), e.caps.end(), [&](const ExperimentCap& x) { return x.bytes_per_s == v; }))
        c.fail_at(f, "'", scalar(c, n, f), "' is not one of the PCIe caps");
      rule.caps.push_back(v);
    }
  if (r["tier"])
    for (const auto& [f, n] : items(c, r["tier"], where + ".tier")) {
      const int64_t v = wrap(c, f, [&] { return parse_token_count(scalar(c, n, f), "tier"); });
      if (std::find(e.tiers.begin(), e.tiers.end(), v) == e.tiers.end()) c.fail_at(f, v, " is not one of the tiers");
      rule.tiers.push_back(v);
    }
  if (r["schedule"])
    for (const auto& [f, n] : items(c, r["schedule"], where + ".schedule")) {
      const Schedule v = wrap(c, f, [&] { return parse_schedule(scalar(c, n, f)); });
      if (std::find(e.schedules.begin(), e.schedules.end(), v) == e.schedules.end())
        c.fail_at(f, schedule_name(v), " is not one of the schedules");
      rule.schedules.push_back(v);
    }
  return rule;
}

void parse_exclusions(const Ctx& c, const YAML::Node& root, Experiment& e) {
  if (!root["exclude"]) return;
  for (const auto& [where, r] : items(c, root["exclude"], "exclude", true)) {
    check_keys(c, r, where, kRuleKeys);
    if (r.size() == 0) c.fail_at(where, "an exclusion must name at least one field");
    e.exclude.push_back(parse_exclusion(c, r, where, e));
  }
}

// A vision encoder experiment's model: a builtin spec's tower (synthetic:), an HF directory of a
// vision-language model (its config.json read here) or an mmproj .gguf (read when the sweep loads it).
void check_vision_model(const Ctx& c, const std::string& field, const ExperimentModel& m) {
  if (m.weights.compare(0, 10, "synthetic:") == 0) {
    SyntheticModel sm;
    wrap(c, field + ".weights", [&] { return synthetic_tower_spec(m.open_path.substr(10), &sm); });
    return;
  }
  const bool gguf = m.open_path.size() > 5 && m.open_path.compare(m.open_path.size() - 5, 5, ".gguf") == 0;
  if (gguf) {
    if (!std::filesystem::is_regular_file(m.open_path)) c.fail_at(field + ".weights", "cannot open ", m.weights);
    return;
  }
  const std::string config = m.open_path + "/config.json";
  if (!std::filesystem::is_regular_file(config))
    c.fail_at(field + ".weights", m.weights,
              " is neither an HF directory of a vision-language model (no config.json) nor an mmproj .gguf");
  wrap(c, field + ".weights", [&] { return vision_spec_from_hf_config(read_text_file(config), config); });
}

void parse_images(const Ctx& c, const YAML::Node& root, Experiment& e) {
  for (const auto& [field, n] : items(c, root["images"], "images")) {
    ExperimentImage im;
    im.text = scalar(c, n, field);
    long long w = 0, h = 0;
    char tail = 0;
    if (std::sscanf(im.text.c_str(), "%lldx%lld%c", &w, &h, &tail) != 2 || w < 1 || h < 1 || w > kMaxImageSide ||
        h > kMaxImageSide)
      c.fail_at(field, "'", im.text, "': expected WIDTHxHEIGHT in pixels (each 1 to ", kMaxImageSide,
                "), e.g. 1920x1080");
    im.width = w, im.height = h;
    for (const auto& o : e.images)
      if (o.width == w && o.height == h) c.fail_at(field, "'", im.text, "' appears twice");
    e.images.push_back(im);
  }
  if (e.images.empty()) c.fail_at("images", "empty (give image sizes, e.g. [1280x720, 1920x1080])");
  if (e.images.size() > kMaxImages) c.fail_at("images", e.images.size(), " image sizes: at most ", kMaxImages);
}

// An experiment with `images`: the vision encoders of its models under its budgets at its image sizes.
Experiment parse_vision_experiment(const Ctx& c, const YAML::Node& root, Experiment e) {
  for (const std::string& k : kLanguageOnlyKeys)
    if (root[k]) c.fail_at(k, "does not apply to a vision encoder experiment (one with `images`)");
  parse_models(c, root, e, "an HF directory of a vision-language model",
               [&](const std::string& field, const ExperimentModel& m) { check_vision_model(c, field, m); });
  parse_budgets(c, root, e);
  for (size_t i = 0; i < e.budgets.size(); ++i)
    if (e.budgets[i].fraction > 0)
      c.fail_at("budgets[" + std::to_string(i) + "]", "'", e.budgets[i].text,
                "': a vision encoder experiment's budgets are sizes (e.g. 4G)");
  parse_images(c, root, e);
  parse_measure(c, root, e);
  if (root["exclude"])
    for (const auto& [where, r] : items(c, root["exclude"], "exclude", true)) {
      check_keys(c, r, where, {"model", "budget"});
      if (r.size() == 0) c.fail_at(where, "an exclusion must name at least one field");
      e.exclude.push_back(parse_exclusion(c, r, where, e));
    }
  return e;
}

}  // namespace

Experiment parse_experiment_text(const std::string& text, const std::string& path) {
  const Ctx c{path};
  const YAML::Node root = load_yaml(text, path);
  if (!root.IsMap()) fail(path, ": expected a mapping at the top level (name, hardware, models, budgets, ...)");
  check_keys(c, root, "", kTopKeys);
  Experiment e;
  e.path = path;
  e.text = text;
  e.name = root["name"] ? scalar(c, root["name"], "name") : default_model_name(path);
  if (e.name.size() > 5 && is_yaml_path(e.name)) e.name = e.name.substr(0, e.name.rfind('.'));
  if (root["description"]) e.description = scalar(c, root["description"], "description");
  parse_machine(c, root, e);
  if (root["images"]) return parse_vision_experiment(c, root, std::move(e));
  parse_models(c, root, e, "e.g. synthetic:nemo8b?dtype=f16&seed=1 or a .gguf path",
               [&](const std::string& field, const ExperimentModel& m) {
                 wrap(c, field + ".weights", [&] { return experiment_model_spec(m.open_path); });
               });
  parse_budgets(c, root, e);
  parse_axes(c, root, e);
  parse_schedules(c, root, e);
  parse_measure(c, root, e);
  parse_filters(c, root, e);
  parse_exclusions(c, root, e);
  return e;
}

Experiment load_experiment(const std::string& path) {
  return parse_experiment_text(read_text_file(path), path);
}

void use_profile(Experiment& e, const std::string& path) {
  if (path.empty()) fail("--profile: give a ProfileDB file (from `shardwise profile`)");
  if (!file_exists(path)) fail("--profile ", path, ": cannot open it (give a ProfileDB file from `shardwise profile`)");
  const ProfileDB db = load_profile(path);
  if (!db.has_gpu() && e.hardware.empty())
    fail("--profile ", path, ": it has no GPU rows (measured on a machine without a GPU) and ", e.path,
         " names no `hardware:` to stand in for the GPU: use a GPU profile");
  e.profile = path;
  e.profile_path = path;
}

std::string Experiment::effective_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["description"] = description;
  j["hardware"] = hardware;
  if (!profile.empty()) j["profile"] = profile;  // absent for datasheet experiments (their hash is unchanged)
  nlohmann::ordered_json ms = nlohmann::ordered_json::array();
  for (const auto& m : models)
    ms.push_back({{"name", m.name}, {"weights", m.weights}});  // as written: no paths of this machine
  j["models"] = ms;
  std::vector<std::string> b, caps_text, sched;
  for (const auto& x : budgets) b.push_back(x.text);
  for (const auto& x : caps) caps_text.push_back(x.text);
  for (Schedule s : schedules) sched.push_back(schedule_name(s));
  j["budgets"] = b;
  j["ctx"] = ctxs;
  j["threads"] = threads;
  j["pcie_caps"] = caps_text;
  j["tiers"] = tiers;
  j["schedules"] = sched;
  j["kv_dtype"] = kv_dtype;
  j["token_seed"] = token_seed;
  j["measure"] = {{"warmup", measure.warmup},           {"min_repeats", measure.min_repeats},
                  {"max_repeats", measure.max_repeats}, {"target_spread", measure.target_spread},
                  {"row_seconds", measure.row_seconds}, {"expensive_repeats", measure.expensive_repeats},
                  {"max_step_ms", measure.max_step_ms}};
  if (measure.rounds != 1) j["measure"]["rounds"] = measure.rounds;  // (absent: one, as before it existed)
  j["filters"] = {{"budget_below_model", filters.budget_below_model}, {"plannable", filters.plannable}};
  nlohmann::ordered_json ex = nlohmann::ordered_json::array();
  for (const auto& r : exclude) {
    nlohmann::ordered_json x;
    if (!r.models.empty()) x["model"] = r.models;
    if (!r.budgets.empty()) x["budget"] = r.budgets;
    if (!r.ctxs.empty()) x["ctx"] = r.ctxs;
    if (!r.threads.empty()) x["threads"] = r.threads;
    if (!r.caps.empty()) x["pcie_cap_bytes_per_s"] = r.caps;
    if (!r.tiers.empty()) x["tier"] = r.tiers;
    if (!r.schedules.empty()) {
      std::vector<std::string> s;
      for (Schedule v : r.schedules) s.push_back(schedule_name(v));
      x["schedule"] = s;
    }
    ex.push_back(x);
  }
  j["exclude"] = ex;
  if (vision()) {  // (absent from language experiments: their hash is unchanged)
    std::vector<std::string> im;
    for (const auto& x : images) im.push_back(x.text);
    j["images"] = im;
  }
  return j.dump();
}

std::string Experiment::hash() const {
  return fnv1a_hex(effective_json());
}

std::vector<Configuration> expand_configurations(const Experiment& e, std::vector<std::string>* dropped) {
  std::vector<Configuration> out;
  auto note = [&](const std::string& s) {
    if (dropped) dropped->push_back(s);
  };
  for (size_t mi = 0; mi < e.models.size(); ++mi) {
    const ExperimentModel& m = e.models[mi];
    const uint64_t model_bytes = experiment_model_spec(m.open_path).total_bytes();
    for (const auto& b : e.budgets) {
      uint64_t bytes = b.bytes;
      if (b.fraction > 0) {
        const uint64_t g = 64u << 10;  // share budgets are rounded up to 64 KiB
        bytes = (static_cast<uint64_t>(std::ceil(b.fraction * static_cast<double>(model_bytes))) + g - 1) / g * g;
      }
      for (int64_t ctx : e.ctxs)
        for (int threads : e.threads)
          for (const auto& cap : e.caps) {
            Configuration c;
            c.model = static_cast<int>(mi);
            c.model_name = m.name;
            c.weights = m.weights;
            c.open_path = m.open_path;
            c.budget_text = b.text;
            c.budget_bytes = bytes;
            c.ctx = ctx;
            c.threads = threads;
            c.pcie_cap_text = cap.text;
            c.pcie_cap_bytes_per_s = cap.bytes_per_s;
            c.tiers = e.tiers;
            c.schedules = e.schedules;
            c.config_id = make_config_id(c.weights, c.budget_bytes, c.ctx, c.threads, c.pcie_cap_bytes_per_s);
            const std::string label =
                str_cat(m.name, " budget ", b.text, " ctx ", ctx, " threads ", threads, " cap ", cap.text);
            auto in = [](const auto& list, const auto& v) {
              return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
            };
            bool excluded = false;
            for (const auto& r : e.exclude) {
              const bool config_match = in(r.models, m.name) && in(r.budgets, b.text) && in(r.ctxs, ctx) &&
                                        in(r.threads, threads) && in(r.caps, cap.bytes_per_s);
              if (!config_match) continue;
              if (!r.row_level()) {
                note(label + ": excluded by " + r.where);
                excluded = true;
                break;
              }
              for (int64_t t : c.tiers)
                for (Schedule s : c.schedules)
                  if (in(r.tiers, t) && in(r.schedules, s) && !c.row_excluded(t, s)) c.excluded_rows.emplace_back(t, s);
            }
            if (excluded) continue;
            if (e.filters.budget_below_model && bytes >= model_bytes) {
              note(str_cat(label, ": filtered (budget_below_model: the budget holds all ", format_bytes(model_bytes),
                           " of weights)"));
              continue;
            }
            if (c.excluded_rows.size() == c.tiers.size() * c.schedules.size()) {
              note(label + ": every row is excluded");
              continue;
            }
            c.index = static_cast<int>(out.size());
            out.push_back(std::move(c));
          }
    }
  }
  // Two spellings of one configuration would measure it twice under one id.
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < out.size(); ++i) {
    auto [it, fresh] = seen.emplace(out[i].config_id, i);
    if (!fresh)
      fail(e.path, ": budgets: '", out[i].budget_text, "' and '", out[it->second].budget_text,
           "' give the same budget (", out[i].budget_bytes, " bytes) for ", out[i].model_name);
  }
  return out;
}

}  // namespace shardwise

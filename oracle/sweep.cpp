// oracle/sweep.cpp — the sweep runner: plan every configuration, predict the running time, then
// measure every feasible (tier, schedule) through the Runtime and append rows.
#include "oracle/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/builtin_yaml.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/hardware_spec.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "costmodel/cost_model.h"
#include "costmodel/profile_db.h"
#include "engine/cost_source.h"
#include "engine/planning.h"
#include "engine/run_setup.h"
#include "executor/cuda/cuda_device.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/model/model_weights.h"
#include "executor/runtime/runtime.h"
#include "executor/runtime/timeline_trace.h"
#include "oracle/results.h"
#include "oracle/sweep_common.h"
#include "oracle/vision_sweep.h"
#include "planner/planner.h"

namespace shardwise {

extern const char* const kOracleBuildGitRev;  // generated at build time (oracle/git_rev.cmake)

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool is_synthetic(const std::string& weights) {
  return weights.compare(0, 10, "synthetic:") == 0;
}

// Assumptions behind the running-time prediction where no plan says anything: host weights are
// synthesised (or read) at ~2 GB/s, and each CUDA device set-up (context, arena, registering the
// model's host memory for DMA) costs 0.3 s plus the model's bytes at ~30 GB/s (the H200 host: 224
// set-ups of study v5, 16-17 GB models, took 0.82 s median, barely more with more VRAM to fill —
// 10 GB/s had predicted 2 s each and made --max-minutes stop calls early). The ETA corrects them
// by what it observes.
constexpr double kLoadBytesPerS = 2e9;
constexpr double kProbeSeconds = 1.5;  // one machine probe (SweepOptions::probe_machine): an estimate, not measured yet
constexpr double kRegisterBytesPerS = 30e9;
constexpr double kDeviceSetupS = 0.3;

// 16 hex digits identifying what a plan makes the executor do: its placements, KV homes and
// actions with their dependencies, but not its schedule's name, notes or predictions. Two
// candidates with one signature (Dynamic with nothing worth running on the CPU is GPU-only) are the
// same computation: the report counts them as one.
std::string plan_signature(const Plan& plan) {
  std::ostringstream s;
  for (const ShardPlacement& p : plan.placements)
    s << 'p' << p.shard << ',' << static_cast<int>(p.home) << ',' << static_cast<int>(p.exec) << ',' << p.streamed
      << ',' << p.arena_offset << ',' << p.bytes << ';';
  for (bool kv : plan.kv_on_gpu) s << (kv ? 'G' : 'H');
  for (const Action& a : plan.actions) {
    s << "\na" << a.id << ',' << static_cast<int>(a.resource) << ',' << static_cast<int>(a.kind) << ','
      << static_cast<int>(a.part) << ',' << static_cast<int>(a.payload) << ',' << a.shard << ',' << a.layer << ','
      << a.slot << ',' << a.row_begin << ',' << a.row_end << ',' << a.bytes << ':';
    for (int d : a.deps) s << d << ',';
  }
  return fnv1a_hex(s.str());
}

// One row's plan: what the planner predicted and decided.
struct RowPlan {
  int64_t tier = 0;
  Schedule schedule = Schedule::Static;
  bool feasible = false;
  std::string reason;  // why infeasible / skipped
  double predicted_ms = 0;
  uint64_t vram_bytes = 0;
  std::string plan_signature;  // what the executor runs, whatever the schedule's name (plan_signature())
  int kv_layers_gpu = -1;      // layers whose KV cache the plan keeps in VRAM (-1: no feasible plan)
  bool chosen = false;
  std::string planner_choice;  // the chosen schedule at this tier ("none": no candidate fits)
  bool skip = false;           // predicted above measure.max_step_ms
};

struct ConfigPlan {
  Configuration config;
  bool plannable = true;
  std::string error;
  std::vector<RowPlan> rows;  // excluded rows omitted
  uint64_t model_bytes = 0;
  std::string machine;                          // cost model description
  std::map<int64_t, double> experts_per_layer;  // MoE: distinct experts per layer the plan assumed, per tier
};

// An MoE model's measured routing (engine: measure_routing) at the experiment's tiers, on the step
// tokens; its guess rate on the first kNextLayerTokens of them (0 in records of binaries before it: no
// speculation).
constexpr int64_t kNextLayerTokens = 64;

// The routing an earlier call of this results file (`path`) recorded for a model (same weights and
// tokens: the experiment hash is checked before), if it was measured on the same token counts. A count
// no routing of this model can have (n tokens touch between top_k and min(experts, n·top_k) distinct
// experts) is refused: the file is not this model's, or was edited.
std::optional<MeasuredRouting> recorded_routing(const std::vector<json>& sweeps, const std::string& model,
                                                const std::string& weights, uint64_t token_seed,
                                                const std::vector<int64_t>& tokens, int64_t measured_on,
                                                const ModelSpec& spec, const std::string& path) {
  for (auto it = sweeps.rbegin(); it != sweeps.rend(); ++it) {
    MeasuredRouting got;
    try {  // a header of another shape (an older binary, an edited file) is passed over
      // Measured on the same weights and tokens (another experiment may name other weights alike).
      const json& cfg = it->at("effective_config");
      if (cfg.at("token_seed").get<uint64_t>() != token_seed) continue;
      bool same_weights = false;
      for (const json& m : cfg.at("models"))
        same_weights =
            same_weights || (m.at("name").get<std::string>() == model && m.at("weights").get<std::string>() == weights);
      if (!same_weights) continue;
      const json& r = it->at("routing").at(model);
      if (r.at("measured_on_tokens").get<int64_t>() != measured_on) continue;
      got.tokens = r.at("tokens").get<std::vector<int64_t>>();
      got.experts = r.at("experts").get<std::vector<double>>();
      got.measured_on = measured_on;
      got.next_layer_hits = r.contains("next_layer_hits") ? r.at("next_layer_hits").get<double>() : 0.0;
    } catch (const std::exception&) {
      continue;
    }
    if (got.tokens != tokens || got.experts.size() != tokens.size()) continue;
    // Checked outside the try above, which passes over headers of other shapes: a guess rate outside
    // [0, 1] is this model's record edited or corrupt, refused, not silently re-measured.
    if (!std::isfinite(got.next_layer_hits) || got.next_layer_hits < 0 || got.next_layer_hits > 1)
      fail(path, ": the routing recorded for ", model, " guesses ", got.next_layer_hits,
           " of the next layer's experts (a fraction in [0, 1]): give the results file of a sweep of this experiment");
    const int64_t k = std::min(spec.num_experts_per_tok, spec.num_experts);
    for (size_t i = 0; i < got.tokens.size(); ++i) {
      const double most = static_cast<double>(std::min<int64_t>(spec.num_experts, got.tokens[i] * k));
      SW_CHECK(std::isfinite(got.experts[i]) && got.experts[i] >= static_cast<double>(k) - 1e-9 &&
                   got.experts[i] <= most + 1e-9,
               path, ": the routing recorded for ", model, " has ", got.experts[i], " distinct experts per layer at ",
               got.tokens[i], " tokens, which no routing of this model has (", k, " .. ", most,
               "): give the results file of a sweep of this experiment");
    }
    return got;
  }
  return std::nullopt;
}

// The configuration's planner config: the experiment's choices, every schedule (so `chosen` is the
// planner's real pick whatever the experiment measures), the model's facts and its measured routing.
PlannerConfig planner_config(const Experiment& e, const Configuration& c, const ModelSpec& spec,
                             const ModelFacts& facts, const MeasuredRouting* routing = nullptr) {
  PlannerChoices choices;
  choices.budget_bytes = c.budget_bytes;
  choices.ctx = c.ctx;
  choices.threads = c.threads;
  choices.kv_dtype = parse_dtype(e.kv_dtype);
  choices.tiers = c.tiers;
  ModelFacts named = facts;
  named.name = c.weights;
  PlannerConfig cfg = planner_config(spec, choices, named);
  if (routing) use_routing(cfg, *routing);
  return cfg;
}

ConfigPlan plan_config(const Experiment& e, const Configuration& c, const ModelSpec& spec, const ModelFacts& file,
                       const SweepCost& source, const MeasuredRouting* routing, PlanTable* table_out = nullptr) {
  ConfigPlan p;
  p.config = c;
  p.model_bytes = spec.total_bytes();
  const CostModel& cost = source.make(c.pcie_cap_bytes_per_s);
  p.machine = cost.describe();
  PlanTable table;
  try {
    const PlannerConfig cfg = planner_config(e, c, spec, file, routing);
    if (spec.is_moe())
      for (int64_t t : c.tiers) {
        const double d = routing_experts_for(spec, cfg, t);
        p.experts_per_layer[t] = d > 0 ? d : expected_distinct_experts(t, spec.num_experts_per_tok, spec.num_experts);
      }
    table = plan_table(spec, cost, cfg, NextLayerHits{}, c.pcie_cap_bytes_per_s).table;
  } catch (const Error& err) {
    p.plannable = false;
    p.error = err.what();
    table.pcie_cap_gbps = c.pcie_cap_bytes_per_s / 1e9;
  }
  for (int64_t tier : c.tiers) {
    const TierEntry* entry = p.plannable ? table.find_tier(tier) : nullptr;
    for (Schedule s : c.schedules) {
      if (c.row_excluded(tier, s)) continue;
      RowPlan r;
      r.tier = tier;
      r.schedule = s;
      r.planner_choice = entry && entry->feasible ? schedule_name(entry->chosen) : "none";
      const Plan* plan = entry ? entry->find(s) : nullptr;
      if (!p.plannable) {
        r.reason = p.error;
      } else if (!plan) {
        r.reason = "not planned";
      } else {
        r.feasible = plan->feasible;
        r.reason = plan->infeasible_reason;
        r.predicted_ms = plan->predicted_ms;
        r.vram_bytes = plan->vram_bytes;
        if (plan->feasible) {
          r.plan_signature = plan_signature(*plan);
          r.kv_layers_gpu = static_cast<int>(std::count(plan->kv_on_gpu.begin(), plan->kv_on_gpu.end(), true));
        }
        r.chosen = entry->feasible && schedule_is_candidate(s) && entry->chosen == s;
        if (r.feasible && e.measure.max_step_ms > 0 && r.predicted_ms > e.measure.max_step_ms) {
          r.skip = true;
          char buf[160];
          std::snprintf(buf, sizeof buf, "predicted %.0f ms per step exceeds measure.max_step_ms (%.0f ms)",
                        r.predicted_ms, e.measure.max_step_ms);
          r.reason = buf;
        }
      }
      p.rows.push_back(r);
    }
  }
  if (table_out) *table_out = std::move(table);
  return p;
}

// Rounds a row is measured in: measure.rounds for a candidate whose repeats are not cut by row_seconds
// (an expensive step, already measured only a few times, is measured once: another round would cost
// another warm-up step), else one.
int row_rounds(const MeasureSettings& m, const RowPlan& r) {
  if (!schedule_is_candidate(r.schedule) || m.rounds <= 1) return 1;
  return planned_repeats(m, r.predicted_ms) >= m.min_repeats ? m.rounds : 1;
}

// One round's share of a row's measurement: its repeats, its seconds (each round warms up itself:
// switching schedules re-uploads what the plans pin).
MeasureSettings round_share(const MeasureSettings& m, int rounds) {
  if (rounds <= 1) return m;
  auto part = [rounds](int n) { return std::max(1, (n + rounds - 1) / rounds); };
  MeasureSettings r = m;
  r.min_repeats = part(m.min_repeats);
  r.max_repeats = std::max(r.min_repeats, part(m.max_repeats));
  r.expensive_repeats = std::min(r.min_repeats, part(m.expensive_repeats));
  r.row_seconds = m.row_seconds / rounds;
  r.rounds = 1;
  return r;
}

// One step of `tier` new tokens over a cache filled to ctx: set_n_past(ctx - tier), then step.
// One step of `tier` tokens over a cache filled to ctx (the row's unit of measurement).
const RuntimeStep& step_at(Runtime& rt, int64_t ctx, int64_t tier, const std::vector<int32_t>& tokens,
                           std::vector<float>& logits) {
  rt.set_n_past(ctx - tier);
  rt.step(tokens.data(), tier, logits.data());
  return rt.steps().back();
}

Measurement measure_row(Runtime& rt, int64_t ctx, int64_t tier, const std::vector<int32_t>& tokens,
                        const MeasureSettings& m, std::vector<float>& logits) {
  int64_t plan_tier = 0, chunks = 0;
  Measurement r = measure_samples(m, [&] {
    const RuntimeStep& s = step_at(rt, ctx, tier, tokens, logits);
    plan_tier = s.tier;
    chunks = s.chunks;
    return s.ms;
  });
  r.plan_tier = plan_tier;
  r.chunks = chunks;
  int64_t chunk = 0;
  rt.plan_for(tier, &chunk);
  r.chunk_tokens = chunk;
  return r;
}

// A model loaded to measure its configurations (once per sweep: configurations are ordered model by
// model).
struct SweepModel {
  int index = -1;
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<ModelWeights> weights;
  ModelFacts file;
  double load_ms = 0;
};

std::string fmt_minutes(double s) {
  char buf[64];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60.0);
  return buf;
}

}  // namespace

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

ExistingResults open_sweep_results(const SweepOptions& o, const Experiment& e, const std::string& git_rev,
                                   std::unique_ptr<ResultsWriter>* writer) {
  *writer = std::make_unique<ResultsWriter>(o.out_path);
  ExistingResults existing = read_results(o.out_path);
  const bool has_content = !existing.rows.empty() || !existing.sweeps.empty() || existing.bad_lines > 0;
  if (has_content && !o.resume)
    fail(o.out_path, " already holds results: pass --resume to continue it, or choose another --out");
  for (const auto& s : existing.sweeps)
    if (s.value("experiment_hash", "") != e.hash())
      fail(o.out_path, ": written by a different experiment (", s.value("experiment", "?"), ", hash ",
           s.value("experiment_hash", "?"), "; this one is ", e.name, ", hash ", e.hash(),
           "): a changed experiment needs a new --out");
  for (const auto& r : existing.rows) {
    if (r.value("git_rev", "") != git_rev)
      fail(o.out_path, ": rows were measured by revision ", r.value("git_rev", "?"), " and this binary is ", git_rev,
           ": a changed cost model or executor means re-running the sweep into a new --out");
    if (r.value("device", "") != o.device)
      fail(o.out_path, ": rows were measured on device ", r.value("device", "?"), ", this call uses --device ",
           o.device);
  }
  return existing;
}

void add_samples(nlohmann::json& j, const Measurement& m) {
  j["status"] = "measured";
  j["reason"] = "";
  j["measured_ms"] = m.median_ms;
  j["measured_spread_ms"] = m.spread_ms;
  j["measured_min_ms"] = *std::min_element(m.samples_ms.begin(), m.samples_ms.end());
  j["measured_max_ms"] = *std::max_element(m.samples_ms.begin(), m.samples_ms.end());
  j["samples_ms"] = m.samples_ms;
  j["warmup_ms"] = m.warmup_ms;
  j["repeats"] = m.samples_ms.size();
}

nlohmann::json sweep_end_record(const Experiment& e, const SweepOptions& o, const SweepResult& r, int present) {
  return json{{"record", "sweep_end"},
              {"experiment", e.name},
              {"shard", str_cat(o.shard_index, "/", o.shard_count)},
              {"rows_written", r.rows_written},
              {"rows_measured", r.rows_measured},
              {"rows_left", r.rows_total - present},
              {"complete", r.complete},
              {"stopped_by_time", r.stopped_by_time},
              {"rows_deferred", r.rows_deferred},
              {"elapsed_s", r.elapsed_seconds},
              {"ended", utc_now()}};
}

void Measurement::add(const Measurement& m) {
  warmup_ms.insert(warmup_ms.end(), m.warmup_ms.begin(), m.warmup_ms.end());
  samples_ms.insert(samples_ms.end(), m.samples_ms.begin(), m.samples_ms.end());
  median_ms = median_of(samples_ms);
  spread_ms = iqr_of(samples_ms);
  plan_tier = m.plan_tier;
  chunk_tokens = m.chunk_tokens;
  chunks = m.chunks;
}

Measurement measure_samples(const MeasureSettings& m, const std::function<double()>& once) {
  Measurement r;
  for (int i = 0; i < m.warmup; ++i) r.warmup_ms.push_back(once());
  double spent_ms = 0;
  for (;;) {
    r.samples_ms.push_back(once());
    spent_ms += r.samples_ms.back();
    const int n = static_cast<int>(r.samples_ms.size());
    if (n >= m.max_repeats) break;
    const double med = median_of(r.samples_ms);
    if (n >= m.min_repeats && med > 0 && iqr_of(r.samples_ms) / med <= m.target_spread) break;
    if (spent_ms >= m.row_seconds * 1000.0 && n >= m.expensive_repeats) break;
  }
  r.median_ms = median_of(r.samples_ms);
  r.spread_ms = iqr_of(r.samples_ms);
  return r;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double iqr_of(std::vector<double> v) {
  if (v.size() < 2) return 0;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) {
    const double pos = p * static_cast<double>(v.size() - 1);
    const size_t i = static_cast<size_t>(std::floor(pos));
    const double f = pos - static_cast<double>(i);
    return i + 1 < v.size() ? v[i] + f * (v[i + 1] - v[i]) : v[i];
  };
  return q(0.75) - q(0.25);
}

int planned_repeats(const MeasureSettings& m, double step_ms) {
  // The loop above with a small spread: min_repeats, unless row_seconds runs out first.
  int n = m.min_repeats;
  if (step_ms > 0) {
    const int by_time = static_cast<int>(std::ceil(m.row_seconds * 1000.0 / step_ms));
    n = std::min(n, std::max(by_time, m.expensive_repeats));
  }
  return std::max(1, n);
}

double predicted_row_seconds(const MeasureSettings& m, double step_ms) {
  return (m.warmup + planned_repeats(m, step_ms)) * step_ms / 1000.0;
}

std::string profile_hash(const std::string& hardware, double pcie_cap_bytes_per_s) {
  // A builtin by its name and embedded text; a file by its text only (not where it lies).
  std::string text;
  for (int i = 0; i < kBuiltinHardwareCount; ++i)
    if (hardware == kBuiltinHardware[i].name) text = str_cat("builtin:", hardware, "\n", kBuiltinHardware[i].yaml);
  if (text.empty()) text = "file:\n" + read_text_file(hardware);
  return fnv1a_hex(str_cat(text, "\npcie_cap_bytes_per_s=", std::llround(pcie_cap_bytes_per_s)));
}

std::string build_git_rev() {
  const char* env = std::getenv("SHARDWISE_GIT_REV");
  if (env && *env) return env;
  return kOracleBuildGitRev && *kOracleBuildGitRev ? kOracleBuildGitRev : "unknown";
}

std::string machine_fingerprint(const std::string& device) {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, 10, "model name") == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(colon + 2);
      break;
    }
  std::string gpu = "emulated device (host memory)";
  if (device == "cuda") {
    const CudaDeviceInfo info = cuda_device_info(0);
    gpu = info.name + ", " + format_bytes(info.total_bytes);
  }
  return str_cat(cpu, " x", std::thread::hardware_concurrency(), " | ", gpu);
}

namespace {

// A row's keys that say what was planned and predicted (the results row and the --predict record share
// them): its configuration, tier, schedule and the plan's prediction.
json planned_keys(const Experiment& e, const ConfigPlan& p, const RowPlan& r, const std::string& profile_hash,
                  const std::string& git_rev) {
  const Configuration& c = p.config;
  json j{{"config_id", c.config_id},
         {"experiment", e.name},
         {"model", c.model_name},
         {"weights", c.weights},
         {"budget", c.budget_text},
         {"budget_bytes", c.budget_bytes},
         {"ctx", c.ctx},
         {"threads", c.threads},
         {"pcie_cap", c.pcie_cap_text},
         {"pcie_cap_gbps", c.pcie_cap_bytes_per_s / 1e9},
         {"tier", r.tier},
         {"schedule", schedule_name(r.schedule)},
         {"candidate", schedule_is_candidate(r.schedule)},
         {"feasible", r.feasible},
         {"predicted_ms", r.feasible ? json(r.predicted_ms) : json(nullptr)},
         {"vram_bytes", r.vram_bytes},
         {"plan_signature", r.plan_signature.empty() ? json(nullptr) : json(r.plan_signature)},
         {"kv_layers_gpu", r.kv_layers_gpu < 0 ? json(nullptr) : json(r.kv_layers_gpu)},
         {"chosen", r.chosen},
         {"planner_choice", r.planner_choice},
         {"hardware", p.machine},
         {"profile_hash", profile_hash},
         {"git_rev", git_rev},
         {"kv_dtype", e.kv_dtype}};
  auto ex = p.experts_per_layer.find(r.tier);
  if (ex != p.experts_per_layer.end()) j["moe_experts_per_layer"] = ex->second;  // what the prediction assumed
  return j;
}

}  // namespace

namespace {

// A configuration's measurement: its rows left, the plan table and pool it runs with, the machine
// probes, and one device and runtime for its candidates (switched from schedule to schedule).
struct ConfigRun {
  const ConfigPlan* plan = nullptr;
  std::vector<const RowPlan*> todo;
  PlanTable table;
  std::unique_ptr<ThreadPool> pool;
  double machine_slowdown = 0;         // 0: not probed
  std::vector<double> machine_probes;  // every probe of this configuration, the last one's is machine_slowdown
  // The configuration's cost model with its CPU work scaled by the probe: each row's plan predicted
  // again for the machine as it ran (predicted_ms_at_probe), to tell its drift from the model's error.
  std::unique_ptr<CostModel> at_probe;
  PlannerConfig at_probe_cfg;
  std::unique_ptr<Device> device;
  std::unique_ptr<Runtime> rt;
  std::string setup_error;
  double setup_ms = 0;
  std::map<const RowPlan*, Measurement> earlier;  // rows' measurements of the rounds before
  std::set<const RowPlan*> written;
  ~ConfigRun() {
    rt.reset();  // before the device it runs on
    device.reset();
  }
};

// A pass over one schedule's rows: the candidates measure.rounds times, the baselines once.
struct Pass {
  Schedule schedule;
  int round;
};

std::vector<Pass> passes_of(const Experiment& e, const Configuration& c) {
  std::vector<Pass> passes;
  for (int k = 0; k < std::max(1, e.measure.rounds); ++k)
    for (Schedule s : c.schedules)
      if (schedule_is_candidate(s)) passes.push_back({s, k});
  for (Schedule s : c.schedules)
    if (!schedule_is_candidate(s)) passes.push_back({s, 0});
  return passes;
}

void check_sweep_options(const SweepOptions& o) {
  if (o.device != "cuda" && o.device != "emu") fail("--device '", o.device, "': the oracle runs on cuda or emu");
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count)
    fail("--shard: bad shard ", o.shard_index, "/", o.shard_count);
}

// The measured keys of a row from its measurement and the runtime's memory.
void add_measurement(json& j, const Measurement& m, const RuntimeMemory& mem) {
  add_samples(j, m);
  j["plan_tier"] = m.plan_tier;
  j["chunk_tokens"] = m.chunk_tokens;
  j["chunks"] = m.chunks;
  j["arena_peak_bytes"] = mem.arena_peak_bytes;
  j["device_peak_bytes"] = mem.device_peak_bytes;
  j["context_bytes"] = mem.context_bytes;
  j["uploaded_bytes"] = mem.uploaded_bytes;
}

// One sweep call: plan every configuration of this shard, predict the running time, then measure the
// rows left, configuration by configuration.
class Sweep {
 public:
  Sweep(const Experiment& e, const SweepOptions& o)
      : e_(e), o_(o), t_start_(Clock::now()), git_rev_(build_git_rev()), cost_(e) {}

  SweepResult run() {
    select_configurations();
    check_outputs();
    if (!o_.predict_only) open_results();
    plan_all();
    check_profile_hashes();
    predict_running_time();
    print_prediction();
    if (o_.predict_only && !o_.out_path.empty()) write_predictions();
    const int rows_left = res_.rows_total - res_.rows_present;
    if (o_.predict_only || rows_left == 0) {
      res_.complete = rows_left == 0;
      res_.elapsed_seconds = seconds_since(t_start_);
      return res_;
    }
    write_header();
    progress_ = std::make_unique<Progress>(
        "sweep", static_cast<uint64_t>(std::max(1.0, res_.predicted_seconds * 1000.0)), o_.progress);
    for (const auto& p : plans_) {
      measure_configuration(p);
      if (res_.stopped_by_time) break;
    }
    progress_->finish();
    finish();
    return res_;
  }

 private:
  // --- before planning ---

  void select_configurations() {
    for (const auto& c : expand_configurations(e_, &res_.dropped))
      if (c.index % o_.shard_count == o_.shard_index) mine_.push_back(c);
  }

  void check_outputs() {
    if (!o_.routing_from.empty() && !std::ifstream(o_.routing_from).good())
      fail(o_.routing_from, ": no such file (--routing-from: a results file of `shardwise sweep` of this experiment)");
    if (o_.predict_only && !o_.out_path.empty() && std::ifstream(o_.out_path).good())
      fail(o_.out_path, " exists: --predict writes a new file of predictions, choose another --out");
    if (!o_.predict_only && !o_.timelines_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o_.timelines_dir, ec);
      if (ec || !std::filesystem::is_directory(o_.timelines_dir))
        fail("--timelines ", o_.timelines_dir, ": cannot create the directory (",
             ec ? ec.message() : "a file is in the way", "): give a directory the traces can go to");
    }
  }

  // The output's lock first, then what it holds: a second sweep on the file is refused before any work.
  // Existing rows (resume) and the checks that keep one file to one experiment and one revision.
  void open_results() {
    existing_ = open_sweep_results(o_, e_, git_rev_, &writer_);
    if (existing_.bad_lines > 0)
      log_warn(o_.out_path, ": skipped ", existing_.bad_lines,
               " torn, unparsable or incomplete line(s); their rows are measured again");
  }

  // --- planning ---

  // Plan every configuration first: the predictions, the rows and the running-time estimate.
  void plan_all() {
    const auto t_plan = Clock::now();
    for (const auto& c : mine_) {
      if (!specs_.count(c.model)) prepare_model(c);
      ConfigPlan p = plan_config(e_, c, specs_[c.model], facts_[c.model], cost_, routing_of(c.model));
      if (!p.plannable && e_.filters.plannable) {
        res_.dropped.push_back(str_cat(c.model_name, " budget ", c.budget_text, " ctx ", c.ctx, " threads ", c.threads,
                                       " cap ", c.pcie_cap_text, ": filtered (plannable: ", p.error, ")"));
        continue;
      }
      config_profile_[c.config_id] = cost_.hash(e_, c.pcie_cap_bytes_per_s);
      plans_.push_back(std::move(p));
    }
    plan_s_ = seconds_since(t_plan);
  }

  const MeasuredRouting* routing_of(int model) const {
    const auto it = routing_.find(model);
    return it == routing_.end() ? nullptr : &it->second;
  }

  // A model's spec and facts (a file is opened once, for planning, and reused to run), and an MoE
  // model's routing.
  void prepare_model(const Configuration& c) {
    if (is_synthetic(c.open_path)) {
      specs_[c.model] = experiment_model_spec(c.open_path);
      facts_[c.model] = facts_of_spec(specs_[c.model], c.weights);
    } else {
      auto src = open_weights(c.open_path);
      specs_[c.model] = src->spec();
      facts_[c.model] = facts_of(*src, c.weights);
      opened_[c.model] = std::move(src);
    }
    if (specs_[c.model].is_moe()) prepare_routing(c);
  }

  // How many experts a step's tokens really touch decides what streaming costs: measure it on the
  // weights (one CPU pass over the steps' own tokens), rather than assume uniform routing. An earlier
  // call of this file recorded what it measured: reuse it rather than spend the seconds again.
  void prepare_routing(const Configuration& c) {
    int64_t n = 64;
    for (int64_t t : c.tiers) n = std::max(n, t);
    n = std::min<int64_t>(n, 1024);
    std::vector<int64_t> curve_tokens = c.tiers;
    std::sort(curve_tokens.begin(), curve_tokens.end());
    if (std::optional<MeasuredRouting> recorded = routing_recorded(c, curve_tokens, n)) {
      log_info(c.model_name, ": routing as measured by an earlier call of ",
               o_.routing_from.empty() ? o_.out_path : o_.routing_from);
      routing_[c.model] = std::move(*recorded);
    } else if (!o_.predict_only) {
      routing_[c.model] = measure_model_routing(c, curve_tokens, n);
    }
  }

  // The routing --routing-from recorded (which must hold it), or an earlier call of this file.
  std::optional<MeasuredRouting> routing_recorded(const Configuration& c, const std::vector<int64_t>& curve_tokens,
                                                  int64_t n) {
    const ModelSpec& spec = specs_[c.model];
    if (!o_.routing_from.empty()) {
      if (!routing_source_) routing_source_ = std::make_unique<ExistingResults>(read_results(o_.routing_from));
      auto recorded = recorded_routing(routing_source_->sweeps, c.model_name, c.weights, e_.token_seed, curve_tokens, n,
                                       spec, o_.routing_from);
      if (!recorded)
        fail(o_.routing_from, ": no sweep record holds ", c.model_name, "'s routing measured on ", n,
             " tokens of token_seed ", e_.token_seed, " for this experiment's tiers and weights (", c.weights,
             "): give the results file of a sweep of this experiment");
      return recorded;
    }
    if (o_.predict_only) return std::nullopt;
    return recorded_routing(existing_.sweeps, c.model_name, c.weights, e_.token_seed, curve_tokens, n, spec,
                            o_.out_path);
  }

  MeasuredRouting measure_model_routing(const Configuration& c, const std::vector<int64_t>& curve_tokens, int64_t n) {
    const auto t0 = Clock::now();
    OpenOptions oo;
    oo.threads = 0;
    std::unique_ptr<WeightSource> tmp;
    const WeightSource* src =
        opened_.count(c.model) ? opened_[c.model].get() : (tmp = open_weights(c.open_path, oo)).get();
    const ModelWeights w = ModelWeights::from_source(*src);
    ThreadPool pool(0);
    const MeasuredRouting r =
        measure_routing(w, pool, step_tokens(n, w.spec.vocab_size, e_.token_seed), curve_tokens, kNextLayerTokens);
    std::string curve;
    for (size_t i = 0; i < r.tokens.size(); ++i)
      curve += str_cat(i ? ", " : "", r.tokens[i], ": ", format_fixed(r.experts[i], 1));
    log_info(c.model_name, ": routing measured on ", n, " tokens in ", format_fixed(seconds_since(t0), 2),
             " s — distinct experts per layer by step tokens {", curve, "} of ", w.spec.num_experts,
             "; the next layer's experts guessed at ", format_fixed(100 * r.next_layer_hits, 1), "%");
    return r;
  }

  void check_profile_hashes() const {
    for (const auto& r : existing_.rows) {
      auto it = config_profile_.find(r.value("config_id", ""));
      if (it != config_profile_.end() && r.value("profile_hash", "") != it->second)
        fail(o_.out_path, ": rows of configuration ", it->first, " were predicted with profile ",
             r.value("profile_hash", "?"), " and the cost model now gives ", it->second,
             ": a changed profile means re-running the sweep into a new --out");
    }
  }

  // --- the running-time prediction ---

  bool row_done(const Configuration& c, const RowPlan& r) const {
    return existing_.keys.count(RowKey{c.config_id, r.tier, schedule_name(r.schedule)}) != 0;
  }

  // Predicted seconds of a configuration's device and runtime set-up (its candidates share it).
  double setup_seconds(const ConfigPlan& p) const {
    return o_.device == "cuda" ? kDeviceSetupS + static_cast<double>(p.model_bytes) / kRegisterBytesPerS : 0.01;
  }
  // Predicted seconds of a schedule's first step's uploads of what its plans pin.
  double upload_seconds(const ConfigPlan& p, const RowPlan& r) const {
    const double uncapped = cost_.pcie_h2d_gbps() * 1e9;
    const double pcie =
        p.config.pcie_cap_bytes_per_s > 0 ? std::min(p.config.pcie_cap_bytes_per_s, uncapped) : uncapped;
    return static_cast<double>(r.vram_bytes) / pcie;
  }

  // What is left, and how long it should take (the ETA and --max-minutes use it).
  void predict_running_time() {
    res_.configurations = static_cast<int>(plans_.size());
    std::map<int, bool> model_needed;
    for (const auto& p : plans_) {
      std::map<Schedule, bool> runtime_counted;
      bool setup_counted = false;
      for (const auto& r : p.rows) {
        ++res_.rows_total;
        if (row_done(p.config, r)) {
          ++res_.rows_present;
          continue;
        }
        if (!r.feasible || r.skip) continue;
        ++measured_left_;
        model_needed[p.config.model] = true;
        if (!setup_counted) {
          setup_counted = true;
          setup_s_ += setup_seconds(p);
          if (o_.probe_machine) probe_total_s_ += kProbeSeconds;
        }
        // A candidate runs in measure.rounds rounds, each warming up after its schedule's uploads.
        const int rounds = row_rounds(e_.measure, r);
        if (!runtime_counted[r.schedule]) {
          runtime_counted[r.schedule] = true;
          setup_s_ += (schedule_is_candidate(r.schedule) ? std::max(1, e_.measure.rounds) : 1) * upload_seconds(p, r);
        }
        steps_s_ += rounds * predicted_row_seconds(round_share(e_.measure, rounds), r.predicted_ms);
      }
    }
    for (const auto& m : model_needed) load_s_ += static_cast<double>(specs_[m.first].total_bytes()) / kLoadBytesPerS;
    res_.predicted_seconds = load_s_ + setup_s_ + steps_s_ + probe_total_s_;
  }

  void print_prediction() const {
    if (res_.configurations == 0) return;  // all dropped: the caller's one error line says why
    const int rows_left = res_.rows_total - res_.rows_present;
    std::fprintf(
        stderr,
        "sweep %s: %d configurations%s (%zu dropped), %d rows: %d present, %d to write (%d to measure)\n"
        "  predicted running time %s on %s: model loads %s, device set-up %s, steps %s%s (planning took %.1f s)\n",
        e_.name.c_str(), res_.configurations,
        o_.shard_count > 1 ? str_cat(" in shard ", o_.shard_index, "/", o_.shard_count).c_str() : "",
        res_.dropped.size(), res_.rows_total, res_.rows_present, rows_left, measured_left_,
        fmt_minutes(res_.predicted_seconds).c_str(), cost_.name.c_str(), fmt_minutes(load_s_).c_str(),
        fmt_minutes(setup_s_).c_str(), fmt_minutes(steps_s_).c_str(),
        probe_total_s_ > 0 ? str_cat(", machine probes ", fmt_minutes(probe_total_s_)).c_str() : "", plan_s_);
    if (o_.device == "emu")
      std::fprintf(stderr, "  device emu: the emulated device runs on the CPU; its timings are not GPU numbers\n");
    for (const auto& d : res_.dropped) log_info("dropped ", d);
  }

  // One prediction record per row, a new file.
  void write_predictions() {
    ResultsWriter pred(o_.out_path);
    for (const auto& p : plans_)
      for (const auto& r : p.rows) {
        json j = planned_keys(e_, p, r, config_profile_[p.config.config_id], git_rev_);
        j["record"] = "prediction";
        pred.append(j);
        ++res_.rows_written;
      }
    std::fprintf(stderr, "%d predictions written to %s\n", res_.rows_written, o_.out_path.c_str());
  }

  // --- measuring ---

  // The sweep's header record, with the routing each MoE model was planned with, by model name (a
  // later --resume call reuses it).
  void write_header() {
    json routing_record = json::object();
    for (const auto& c : mine_)
      if (routing_.count(c.model) && !routing_record.contains(c.model_name)) {
        const MeasuredRouting& r = routing_.at(c.model);
        routing_record[c.model_name] = {{"tokens", r.tokens},
                                        {"experts", r.experts},
                                        {"measured_on_tokens", r.measured_on},
                                        {"next_layer_hits", r.next_layer_hits}};
      }
    json deferred_json = json::object();  // thread count -> the machine check's slowdown there
    for (const auto& [t, g] : o_.deferred_threads) deferred_json[std::to_string(t)] = g;
    machine_ = machine_fingerprint(o_.device);
    gpu_name_ = o_.device == "cuda" ? cuda_device_info(0).name : "emulated device";
    writer_->append(
        json{{"record", "sweep"},
             {"experiment", e_.name},
             {"experiment_path", e_.path},
             {"experiment_hash", e_.hash()},
             {"effective_config", json::parse(e_.effective_json())},
             {"yaml", e_.text},
             {"git_rev", git_rev_},
             {"machine", machine_},
             {"device", o_.device},
             {"shard", str_cat(o_.shard_index, "/", o_.shard_count)},
             {"max_minutes", o_.max_minutes},
             {"started", utc_now()},
             {"configurations", res_.configurations},
             {"rows_total", res_.rows_total},
             {"rows_present", res_.rows_present},
             {"predicted_s", res_.predicted_seconds},
             {"dropped", res_.dropped},
             {"routing", routing_record},
             {"machine_check", o_.machine_check_json.empty() ? json(nullptr) : json::parse(o_.machine_check_json)},
             {"deferred_threads", deferred_json}});
  }

  // Work done: its predicted and actual seconds correct the estimate used by --max-minutes.
  void account(double predicted_s, double actual_s) {
    done_predicted_s_ += predicted_s;
    done_actual_s_ += actual_s;
    progress_->add(static_cast<uint64_t>(predicted_s * 1000.0));
  }

  // Whether the next piece of work, predicted to take predicted_s, would end past --max-minutes (then
  // the sweep stops; the first piece runs anyway).
  bool out_of_time(double predicted_s) {
    const double ratio = done_predicted_s_ > 1e-3 ? done_actual_s_ / done_predicted_s_ : 1.0;
    const double need = predicted_s * std::max(ratio, 0.05);
    const double limit_s = o_.max_minutes > 0 ? o_.max_minutes * 60.0 : INFINITY;
    if (seconds_since(t_start_) + need <= limit_s) return false;
    if (!did_work_) {
      log_warn("the next step is predicted to take ", fmt_minutes(need), ", past --max-minutes; running it anyway");
      return false;
    }
    res_.stopped_by_time = true;
    return true;
  }

  json base_row(const ConfigPlan& p, const RowPlan& r) {
    json j = planned_keys(e_, p, r, config_profile_[p.config.config_id], git_rev_);
    j["record"] = "row";
    j["measured_ms"] = nullptr;
    j["measured_spread_ms"] = nullptr;
    j["machine"] = machine_;
    j["device"] = o_.device;
    j["gpu"] = gpu_name_;
    j["shard"] = str_cat(o_.shard_index, "/", o_.shard_count);
    return j;
  }

  void write_row(json j) {
    j["time"] = utc_now();
    writer_->append(j);
    ++res_.rows_written;
  }

  void measure_configuration(const ConfigPlan& p) {
    const Configuration& c = p.config;
    ConfigRun run;
    run.plan = &p;
    for (const auto& r : p.rows)
      if (!row_done(c, r)) run.todo.push_back(&r);
    if (run.todo.empty()) return;
    bool any_to_measure = false;  // rows that are not run are written at once
    for (const RowPlan* r : run.todo) any_to_measure |= r->feasible && !r->skip;
    double deferral_probe = 0;
    if (any_to_measure && o_.deferred_threads.count(c.threads) && !back_within_profile(run, &deferral_probe)) return;
    if (any_to_measure && !load_and_replan(run)) return;
    if (any_to_measure && o_.probe_machine && !probe_machine(run, deferral_probe)) return;
    for (const Pass& pass : passes_of(e_, c)) {
      measure_pass(run, pass);
      if (res_.stopped_by_time) break;
    }
  }

  // A deferred thread count: measured only if a probe finds the machine back within the tolerance (that
  // probe is then the configuration's, `probe`). False: deferred, or out of time.
  bool back_within_profile(const ConfigRun& run, double* probe) {
    const Configuration& c = run.plan->config;
    double now = 0;
    if (o_.probe_machine) {
      if (out_of_time(probe_s_)) return false;
      const auto t_probe = Clock::now();
      now = o_.probe_machine(c.threads);
      probe_s_ = seconds_since(t_probe);
    }
    const double tol = 1 + o_.defer_tolerance;
    if (!(now > 0 && now <= tol && now >= 1 / tol)) {
      log_info(c.config_id, ": deferred (", c.threads, " thread", c.threads == 1 ? "" : "s",
               ": the machine check read ", o_.deferred_threads.at(c.threads), "x the profile",
               now > 0 ? str_cat(", the probe now ", now, "x") : std::string(), "); run again with --resume");
      res_.rows_deferred += static_cast<int>(run.todo.size());
      return false;
    }
    log_info(c.config_id, ": the machine is back within its profile at ", c.threads, " thread(s) (", now,
             "x): measured");
    *probe = now;
    return true;
  }

  // Loads the configuration's model where the one loaded is another. False: out of time.
  bool load_model(const Configuration& c) {
    if (model_.index == c.model) return true;
    const double predicted = static_cast<double>(specs_[c.model].total_bytes()) / kLoadBytesPerS;
    if (out_of_time(predicted)) return false;
    const auto t0 = Clock::now();
    model_ = SweepModel{};
    if (opened_.count(c.model)) {
      model_.source = std::move(opened_[c.model]);
    } else {
      OpenOptions oo;
      oo.threads = 0;
      model_.source = open_weights(c.open_path, oo);
    }
    model_.weights = std::make_unique<ModelWeights>(ModelWeights::from_source(*model_.source));
    model_.file = facts_of(*model_.source, c.weights);
    model_.index = c.model;
    model_.load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    account(predicted, model_.load_ms / 1000.0);
    log_info("loaded ", c.model_name, " (", c.weights, ") in ", format_fixed(model_.load_ms / 1000.0, 2), " s");
    return true;
  }

  // Re-plans with the loaded file's facts (the predictions must be those announced) and makes the pool.
  bool load_and_replan(ConfigRun& run) {
    const ConfigPlan& p = *run.plan;
    const Configuration& c = p.config;
    if (!load_model(c)) return false;
    const ConfigPlan again =
        plan_config(e_, c, model_.source->spec(), model_.file, cost_, routing_of(c.model), &run.table);
    for (size_t i = 0; i < again.rows.size() && i < p.rows.size(); ++i)
      if (again.rows[i].feasible != p.rows[i].feasible ||
          std::fabs(again.rows[i].predicted_ms - p.rows[i].predicted_ms) > 1e-6 * (1 + p.rows[i].predicted_ms))
        log_warn(c.config_id, ": re-planning with the loaded weights changed the prediction of ",
                 schedule_name(p.rows[i].schedule), " at tier ", p.rows[i].tier, " (", p.rows[i].predicted_ms, " -> ",
                 again.rows[i].predicted_ms, " ms)");
    run.pool = std::make_unique<ThreadPool>(c.threads);
    return true;
  }

  // How much slower the machine is now than its profile, waiting for a neighbour's burst to pass
  // (SweepOptions::calm_slowdown). False: out of time.
  bool probe_machine(ConfigRun& run, double deferral_probe) {
    const Configuration& c = run.plan->config;
    if (deferral_probe > 0) {
      run.machine_slowdown = deferral_probe;
    } else {
      if (out_of_time(probe_s_)) return false;
      const auto t_probe = Clock::now();
      run.machine_slowdown = o_.probe_machine(c.threads);
      probe_s_ = seconds_since(t_probe);
    }
    run.machine_probes.push_back(run.machine_slowdown);
    for (int retry = 0; o_.calm_slowdown > 0 && run.machine_slowdown > 1 + o_.calm_slowdown && retry < o_.calm_retries;
         ++retry) {
      const double limit_s = o_.max_minutes > 0 ? o_.max_minutes * 60.0 : INFINITY;
      if (seconds_since(t_start_) + o_.calm_pause_s + probe_s_ >= limit_s) break;  // no time to wait: measured as it is
      log_info(c.config_id, ": the machine is ", run.machine_slowdown, "x slower than its profile at ", c.threads,
               " thread(s); waiting ", o_.calm_pause_s, " s for it to calm (", retry + 1, " of ", o_.calm_retries, ")");
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.calm_pause_s));
      run.machine_slowdown = o_.probe_machine(c.threads);
      run.machine_probes.push_back(run.machine_slowdown);
    }
    if (run.machine_slowdown > 0 && run.plan->plannable) {
      run.at_probe_cfg = planner_config(e_, c, model_.source->spec(), model_.file, routing_of(c.model));
      run.at_probe = make_cpu_scaled_cost_model(cost_.make(c.pcie_cap_bytes_per_s), run.machine_slowdown);
    }
    account(kProbeSeconds, probe_s_);
    return true;
  }

  // The pass's rows; those that are not run (infeasible, skipped) written at once, the runnable returned.
  std::vector<const RowPlan*> runnable_rows(ConfigRun& run, const Pass& pass) {
    std::vector<const RowPlan*> runnable;
    for (const RowPlan* r : run.todo) {
      if (r->schedule != pass.schedule || run.written.count(r) || pass.round >= row_rounds(e_.measure, *r)) continue;
      if (r->feasible && !r->skip) {
        runnable.push_back(r);
        continue;
      }
      json j = base_row(*run.plan, *r);
      j["status"] = !r->feasible ? "infeasible" : "skipped";
      j["reason"] = r->reason;
      write_row(j);
      run.written.insert(r);
    }
    return runnable;
  }

  // A row is written after its last round (a call stopped in between measures it again on --resume).
  void measure_pass(ConfigRun& run, const Pass& pass) {
    const ConfigPlan& p = *run.plan;
    const std::vector<const RowPlan*> runnable = runnable_rows(run, pass);
    if (runnable.empty() || res_.stopped_by_time) return;
    const RowPlan& first = *runnable.front();
    const double first_row_s =
        upload_seconds(p, first) +
        predicted_row_seconds(round_share(e_.measure, row_rounds(e_.measure, first)), first.predicted_ms);
    if (out_of_time((run.device ? 0.0 : setup_seconds(p)) + first_row_s)) return;
    const std::string schedule_error = set_up_for(run, pass.schedule);
    // This schedule's uploads of what its plans pin (made by its first row's warm-up).
    const double predicted = upload_seconds(p, first);
    done_predicted_s_ += predicted;
    progress_->add(static_cast<uint64_t>(predicted * 1000.0));
    std::vector<float> logits(static_cast<size_t>(model_.source->spec().vocab_size));
    for (size_t i = 0; i < runnable.size(); ++i) {
      const MeasureSettings ms = round_share(e_.measure, row_rounds(e_.measure, *runnable[i]));
      const double predicted_s = predicted_row_seconds(ms, runnable[i]->predicted_ms);
      if (i > 0 && out_of_time(predicted_s)) break;
      const auto t_row = Clock::now();
      measure_one(run, *runnable[i], pass, schedule_error, logits);
      did_work_ = true;
      account(predicted_s, seconds_since(t_row));
    }
  }

  // One device and one runtime for the configuration, set up for its first schedule with rows to
  // measure; the later schedules switch it (Runtime::set_schedule). Candidates measured in one set-up:
  // separate set-ups had measured one plan under two names up to ~6% apart. A baseline keeping the KV
  // cache elsewhere than the candidates (layer-split) gets a set-up of its own. Returns the error of
  // switching to `s` (empty: none).
  std::string set_up_for(ConfigRun& run, Schedule s) {
    if (run.rt && !run.rt->keeps_kv_as(s)) {
      run.rt.reset();
      run.device.reset();
    }
    if (!run.device && run.setup_error.empty()) {
      set_up_runtime(run, s);
    } else if (run.rt) {
      try {
        run.rt->set_schedule(s);
      } catch (const std::exception& err) {
        return err.what();
      }
    }
    return "";
  }

  void set_up_runtime(ConfigRun& run, Schedule s) {
    const Configuration& c = run.plan->config;
    const auto t_setup = Clock::now();
    try {
      run.device = make_run_device(o_.device);
      RuntimeOptions ro;
      ro.schedule = s;
      ro.pcie_cap_bytes_per_s = c.pcie_cap_bytes_per_s;
      run.rt = std::make_unique<Runtime>(*model_.source, *model_.weights, *run.device, *run.pool, run.table, ro);
      // The rows step over a cache filled to ctx without a prefill: give the host caches data.
      run.rt->fill_host_cache(c.ctx, e_.token_seed);
    } catch (const std::exception& err) {
      run.setup_error = err.what();
    }
    run.setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();
    account(setup_seconds(*run.plan), run.setup_ms / 1000.0);
  }

  // A row's keys before its measurement: the probes, the prediction at the probe, the set-up.
  json row_keys(const ConfigRun& run, const RowPlan& r) {
    json j = base_row(*run.plan, r);
    j["machine_slowdown"] = run.machine_slowdown > 0 ? json(run.machine_slowdown) : json(nullptr);
    j["machine_probes"] = run.machine_probes;
    j["predicted_ms_at_probe"] = nullptr;
    if (run.at_probe)
      if (const TierEntry* te = run.table.find_tier(r.tier))
        if (const Plan* pl = te->find(r.schedule); pl && pl->feasible)
          j["predicted_ms_at_probe"] = repredict(*pl, model_.source->spec(), *run.at_probe, run.at_probe_cfg);
    j["setup_ms"] = run.setup_ms;
    j["model_load_ms"] = model_.load_ms;
    j["rounds"] = row_rounds(e_.measure, r);
    return j;
  }

  // One round of a row; the row written after its last round, or on an error.
  void measure_one(ConfigRun& run, const RowPlan& r, const Pass& pass, const std::string& schedule_error,
                   std::vector<float>& logits) {
    json j = row_keys(run, r);
    bool write = true;
    if (!run.setup_error.empty() || !schedule_error.empty()) {
      j["status"] = "error";
      j["reason"] = run.setup_error.empty() ? schedule_error : run.setup_error;
    } else {
      try {
        write = measure_round(run, r, pass, logits, j);
      } catch (const std::exception& err) {
        j["status"] = "error";
        j["reason"] = err.what();
        write = true;
      }
    }
    if (write) {
      write_row(j);
      run.written.insert(&r);
    }
  }

  // Measures one round; after the last, fills the row (and records its timeline). Returns whether the
  // row is complete.
  bool measure_round(ConfigRun& run, const RowPlan& r, const Pass& pass, std::vector<float>& logits, json& j) {
    const Configuration& c = run.plan->config;
    const int rounds = row_rounds(e_.measure, r);
    const auto tokens = step_tokens(r.tier, model_.source->spec().vocab_size, e_.token_seed);
    Measurement& m = run.earlier[&r];
    m.add(measure_row(*run.rt, c.ctx, r.tier, tokens, round_share(e_.measure, rounds), logits));
    if (pass.round != rounds - 1) return false;
    add_measurement(j, m, run.rt->memory());
    if (m.plan_tier != r.tier)
      log_warn(c.config_id, ": ", schedule_name(r.schedule), " at tier ", r.tier, " ran the plan of tier ",
               m.plan_tier);
    if (!o_.timelines_dir.empty()) {  // one more step, recorded (not a sample)
      const std::string name = str_cat(c.config_id, "_t", r.tier, "_", schedule_name(r.schedule), ".json");
      run.rt->record_timeline(static_cast<int>(std::max<int64_t>(1, m.chunks)));
      step_at(*run.rt, c.ctx, r.tier, tokens, logits);
      log_info(c.config_id, ": ", write_timeline_trace(*run.rt, o_.timelines_dir + "/" + name, "--timelines"));
      run.rt->record_timeline(0);
      j["timeline"] = name;
    }
    ++res_.rows_measured;
    return true;
  }

  // Complete when every row of the shard is in the file now.
  void finish() {
    const ExistingResults now = read_results(o_.out_path);
    int present = 0;
    for (const auto& p : plans_)
      for (const auto& r : p.rows)
        present += now.keys.count(RowKey{p.config.config_id, r.tier, schedule_name(r.schedule)}) != 0;
    res_.complete = present == res_.rows_total;
    res_.elapsed_seconds = seconds_since(t_start_);
    writer_->append(sweep_end_record(e_, o_, res_, present));
  }

  const Experiment& e_;
  const SweepOptions& o_;
  const Clock::time_point t_start_;
  const std::string git_rev_;
  const SweepCost cost_;
  SweepResult res_;
  std::vector<Configuration> mine_;  // the configurations of this shard
  ExistingResults existing_;
  std::unique_ptr<ResultsWriter> writer_;
  std::map<int, ModelSpec> specs_;
  std::map<int, ModelFacts> facts_;
  std::map<int, std::unique_ptr<WeightSource>> opened_;  // file models opened for planning, reused to run
  std::map<int, MeasuredRouting> routing_;               // MoE models: measured before planning
  std::unique_ptr<ExistingResults> routing_source_;      // o.routing_from, read once
  std::vector<ConfigPlan> plans_;
  std::map<std::string, std::string> config_profile_;
  double plan_s_ = 0, load_s_ = 0, setup_s_ = 0, steps_s_ = 0, probe_total_s_ = 0;
  int measured_left_ = 0;
  std::string machine_, gpu_name_;
  std::unique_ptr<Progress> progress_;
  double done_predicted_s_ = 0, done_actual_s_ = 0;  // work done so far: observed / predicted corrects the ETA
  bool did_work_ = false;
  double probe_s_ = kProbeSeconds;  // the last machine probe's duration (the guess before the first)
  SweepModel model_;
};

}  // namespace

SweepResult run_sweep(const Experiment& e, const SweepOptions& o) {
  if (e.vision()) return run_vision_sweep(e, o);
  check_sweep_options(o);
  Sweep sweep(e, o);
  return sweep.run();
}

}  // namespace shardwise

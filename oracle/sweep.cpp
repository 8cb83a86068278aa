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
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
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
#include "executor/cuda/cuda_device.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/model/model_weights.h"
#include "executor/runtime/timeline_trace.h"
#include "executor/runtime/runtime.h"
#include "oracle/results.h"
#include "planner/planner.h"

namespace shardwise {

extern const char* const kOracleBuildGitRev;  // generated at build time (oracle/git_rev.cmake)

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}


bool is_synthetic(const std::string& weights) { return weights.compare(0, 10, "synthetic:") == 0; }

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
    s << 'p' << p.shard << ',' << static_cast<int>(p.home) << ',' << static_cast<int>(p.exec) << ',' << p.streamed << ','
      << p.arena_offset << ',' << p.bytes << ';';
  for (bool kv : plan.kv_on_gpu) s << (kv ? 'G' : 'H');
  for (const Action& a : plan.actions) {
    s << "\na" << a.id << ',' << static_cast<int>(a.resource) << ',' << static_cast<int>(a.kind) << ',' << static_cast<int>(a.part)
      << ',' << static_cast<int>(a.payload) << ',' << a.shard << ',' << a.layer << ',' << a.slot << ',' << a.row_begin << ','
      << a.row_end << ',' << a.bytes << ':';
    for (int d : a.deps) s << d << ',';
  }
  return fnv1a_hex(s.str());
}

// One row's plan: what the planner predicted and decided.
struct RowPlan {
  int64_t tier = 0;
  Schedule schedule = Schedule::Static;
  bool feasible = false;
  std::string reason;        // why infeasible / skipped
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
  std::string machine;        // cost model description
  std::map<int64_t, double> experts_per_layer;  // MoE: distinct experts per layer the plan assumed, per tier
};

// An MoE model's measured routing (executor: measure_experts_touched): distinct experts per layer
// that n consecutive tokens are routed to, at the experiment's tiers.
struct Routing {
  std::vector<int64_t> tokens;
  std::vector<double> experts;
  int64_t measured_on = 0;  // the step tokens it was measured on
  // The fraction of each token's experts a layer's router picks from the layer before's MoE input
  // (measure_next_layer_routing, on the first kNextLayerTokens of those tokens): what speculative expert
  // prefetch gets right. 0 in records of binaries before it: no speculation.
  double next_layer_hits = 0;
};
constexpr int64_t kNextLayerTokens = 64;

// The routing an earlier call of this results file (`path`) recorded for a model (same weights and
// tokens: the experiment hash is checked before), if it was measured on the same token counts. A count
// no routing of this model can have (n tokens touch between top_k and min(experts, n·top_k) distinct
// experts) is refused: the file is not this model's, or was edited.
std::optional<Routing> recorded_routing(const std::vector<json>& sweeps, const std::string& model,
                                        const std::string& weights, uint64_t token_seed, const std::vector<int64_t>& tokens,
                                        int64_t measured_on, const ModelSpec& spec, const std::string& path) {
  for (auto it = sweeps.rbegin(); it != sweeps.rend(); ++it) {
    Routing got;
    try {  // a header of another shape (an older binary, an edited file) is passed over
      // Measured on the same weights and tokens (another experiment may name other weights alike).
      const json& cfg = it->at("effective_config");
      if (cfg.at("token_seed").get<uint64_t>() != token_seed) continue;
      bool same_weights = false;
      for (const json& m : cfg.at("models"))
        same_weights = same_weights || (m.at("name").get<std::string>() == model && m.at("weights").get<std::string>() == weights);
      if (!same_weights) continue;
      const json& r = it->at("routing").at(model);
      if (r.at("measured_on_tokens").get<int64_t>() != measured_on) continue;
      got = Routing{r.at("tokens").get<std::vector<int64_t>>(), r.at("experts").get<std::vector<double>>(), measured_on,
                    r.contains("next_layer_hits") ? r.at("next_layer_hits").get<double>() : 0.0};
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
      SW_CHECK(std::isfinite(got.experts[i]) && got.experts[i] >= static_cast<double>(k) - 1e-9 && got.experts[i] <= most + 1e-9,
               path, ": the routing recorded for ", model, " has ", got.experts[i], " distinct experts per layer at ",
               got.tokens[i], " tokens, which no routing of this model has (", k, " .. ", most,
               "): give the results file of a sweep of this experiment");
    }
    return got;
  }
  return std::nullopt;
}

// What the planner needs of a model's file beyond its spec: its tensors' storage dtypes and how many
// copies the runtime makes of a streamed expert.
struct FileFacts {
  TensorDtypes dtypes;
  int expert_copies = 3;
};

PlannerConfig planner_config(const Experiment& e, const Configuration& c, const FileFacts& file,
                             const Routing* routing = nullptr) {
  PlannerConfig cfg;
  if (routing) {
    cfg.routing_tokens = routing->tokens;
    cfg.routing_experts = routing->experts;
    cfg.next_layer_hits = routing->next_layer_hits;
  }
  cfg.budget_bytes = c.budget_bytes;
  cfg.ctx = c.ctx;
  cfg.threads = c.threads;
  cfg.kv_dtype = parse_dtype(e.kv_dtype);
  cfg.tiers = c.tiers;
  // All five, so `chosen` is the planner's real pick whatever the experiment measures.
  cfg.schedules = {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe};
  cfg.model_name = c.weights;
  cfg.tensor_dtypes = file.dtypes;
  cfg.expert_copies = file.expert_copies;
  return cfg;
}

// The experiment's cost model: a measured profile (with the hardware datasheet standing in for the
// GPU of a CPU-only profile), or the hardware datasheet.
struct CostSource {
  bool measured = false;
  HardwareSpec hw;  // the datasheet (measured: only when the experiment names one)
  bool has_hw = false;
  ProfileDB db;
  std::string name;  // for messages

  explicit CostSource(const Experiment& e) {
    has_hw = !e.hardware_path.empty();
    if (has_hw) hw = resolve_hardware(e.hardware_path);
    measured = !e.profile_path.empty();
    if (measured) {
      db = load_profile(e.profile_path);
      db_hash = profile_hash(db);
    }
    name = measured ? str_cat("profile ", e.profile) : hw.name;
  }
  // One cost model per PCIe cap, built on first use (a measured one indexes and fits the whole
  // profile: rebuilding it for each of a study's configurations was a fifth of the planning).
  const CostModel& make(double pcie_cap_bytes_per_s) const {
    std::unique_ptr<CostModel>& m = models_[std::llround(pcie_cap_bytes_per_s)];
    if (m) return *m;
    if (!measured) {
      m = make_analytic_cost_model(hw, pcie_cap_bytes_per_s);
    } else {
      MeasuredOptions mo;
      mo.pcie_cap_bytes_per_s = pcie_cap_bytes_per_s;
      if (!db.has_gpu() && has_hw) mo.gpu_fallback = &hw;
      m = make_measured_cost_model(db, mo);
    }
    return *m;
  }
  // The identity of the cost model's inputs for rows (see sweep.h): the datasheet path is unchanged;
  // a profile is its content hash (plus the datasheet standing in for a missing GPU) and the cap.
  std::string hash(const Experiment& e, double pcie_cap_bytes_per_s) const {
    if (!measured) return profile_hash(e.hardware_path, pcie_cap_bytes_per_s);
    std::string text = "profile:" + db_hash;
    if (!db.has_gpu() && has_hw) text += "\ngpu_fallback:" + profile_hash(e.hardware_path, 0);
    return fnv1a_hex(str_cat(text, "\npcie_cap_bytes_per_s=", std::llround(pcie_cap_bytes_per_s)));
  }
  // Uncapped host-to-device rate (GB/s), for the running-time estimate.
  double pcie_h2d_gbps() const { return measured ? make(0).pcie_gbps(Direction::HostToDevice) : hw.pcie_h2d_gbps; }

 private:
  std::string db_hash;
  mutable std::map<long long, std::unique_ptr<CostModel>> models_;
};

ConfigPlan plan_config(const Experiment& e, const Configuration& c, const ModelSpec& spec, const FileFacts& file,
                       const CostSource& source, const Routing* routing, PlanTable* table_out = nullptr) {
  ConfigPlan p;
  p.config = c;
  p.model_bytes = spec.total_bytes();
  const CostModel& cost = source.make(c.pcie_cap_bytes_per_s);
  p.machine = cost.describe();
  PlanTable table;
  try {
    const PlannerConfig cfg = planner_config(e, c, file, routing);
    if (spec.is_moe())
      for (int64_t t : c.tiers) {
        const double d = routing_experts_for(spec, cfg, t);
        p.experts_per_layer[t] = d > 0 ? d : expected_distinct_experts(t, spec.num_experts_per_tok, spec.num_experts);
      }
    table = build_plan_table(spec, cost, cfg);
  } catch (const Error& err) {
    p.plannable = false;
    p.error = err.what();
  }
  table.pcie_cap_gbps = c.pcie_cap_bytes_per_s / 1e9;
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
          std::snprintf(buf, sizeof buf, "predicted %.0f ms per step exceeds measure.max_step_ms (%.0f ms)", r.predicted_ms,
                        e.measure.max_step_ms);
          r.reason = buf;
        }
      }
      p.rows.push_back(r);
    }
  }
  if (table_out) *table_out = std::move(table);
  return p;
}

struct Measurement {
  std::vector<double> warmup_ms, samples_ms;
  double median_ms = 0, spread_ms = 0;
  int64_t plan_tier = 0, chunk_tokens = 0, chunks = 0;
  // Another round's measurement of the same row: its samples join these, the figures are over all.
  void add(const Measurement& m) {
    warmup_ms.insert(warmup_ms.end(), m.warmup_ms.begin(), m.warmup_ms.end());
    samples_ms.insert(samples_ms.end(), m.samples_ms.begin(), m.samples_ms.end());
    median_ms = median_of(samples_ms);
    spread_ms = iqr_of(samples_ms);
    plan_tier = m.plan_tier;
    chunk_tokens = m.chunk_tokens;
    chunks = m.chunks;
  }
};

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
const RuntimeStep& step_at(Runtime& rt, int64_t ctx, int64_t tier, const std::vector<int32_t>& tokens, std::vector<float>& logits) {
  rt.set_n_past(ctx - tier);
  rt.step(tokens.data(), tier, logits.data());
  return rt.steps().back();
}

Measurement measure_row(Runtime& rt, int64_t ctx, int64_t tier, const std::vector<int32_t>& tokens, const MeasureSettings& m,
                        std::vector<float>& logits) {
  Measurement r;
  auto once = [&] {
    const RuntimeStep& s = step_at(rt, ctx, tier, tokens, logits);
    r.plan_tier = s.tier;
    r.chunks = s.chunks;
    return s.ms;
  };
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
  int64_t chunk = 0;
  rt.plan_for(tier, &chunk);
  r.chunk_tokens = chunk;
  return r;
}


struct LoadedModel {
  int index = -1;
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<ModelWeights> weights;
  FileFacts file;
  double load_ms = 0;
};

std::string fmt_minutes(double s) {
  char buf[64];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else std::snprintf(buf, sizeof buf, "%.1f min", s / 60.0);
  return buf;
}

}  // namespace

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

SweepResult run_sweep(const Experiment& e, const SweepOptions& o) {
  const auto t_start = Clock::now();
  SweepResult res;
  if (o.device != "cuda" && o.device != "emu") fail("--device '", o.device, "': the oracle runs on cuda or emu");
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count) fail("--shard: bad shard ", o.shard_index, "/", o.shard_count);
  const std::string git_rev = build_git_rev();
  const CostSource cost_source(e);

  // The configurations of this shard.
  std::vector<Configuration> all = expand_configurations(e, &res.dropped);
  std::vector<Configuration> mine;
  for (const auto& c : all)
    if (c.index % o.shard_count == o.shard_index) mine.push_back(c);

  // Existing rows (resume) and the checks that keep one file to one experiment and one revision.
  ExistingResults existing;
  if (!o.routing_from.empty() && !std::ifstream(o.routing_from).good())
    fail(o.routing_from, ": no such file (--routing-from: a results file of `shardwise sweep` of this experiment)");
  if (o.predict_only && !o.out_path.empty() && std::ifstream(o.out_path).good())
    fail(o.out_path, " exists: --predict writes a new file of predictions, choose another --out");
  if (!o.predict_only && !o.timelines_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.timelines_dir, ec);
    if (ec || !std::filesystem::is_directory(o.timelines_dir))
      fail("--timelines ", o.timelines_dir, ": cannot create the directory (", ec ? ec.message() : "a file is in the way",
           "): give a directory the traces can go to");
  }
  // The output's lock first, then what it holds: a second sweep on the file is refused before any work.
  std::unique_ptr<ResultsWriter> writer;
  if (!o.predict_only) {
    writer = std::make_unique<ResultsWriter>(o.out_path);
    existing = read_results(o.out_path);
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
        fail(o.out_path, ": rows were measured on device ", r.value("device", "?"), ", this call uses --device ", o.device);
    }
    if (existing.bad_lines > 0)
      log_warn(o.out_path, ": skipped ", existing.bad_lines, " torn, unparsable or incomplete line(s); their rows are measured again");
  }

  // Plan every configuration first: the predictions, the rows and the running-time estimate.
  const auto t_plan = Clock::now();
  std::map<int, ModelSpec> specs;
  std::map<int, FileFacts> plan_files;
  std::map<int, std::unique_ptr<WeightSource>> opened;  // file models opened for planning, reused to run
  std::map<int, Routing> routing;                        // MoE models: measured before planning
  std::vector<ConfigPlan> plans;
  std::map<std::string, std::string> config_profile;
  std::unique_ptr<ExistingResults> routing_source;       // o.routing_from, read once
  for (const auto& c : mine) {
    if (!specs.count(c.model)) {
      if (is_synthetic(c.open_path)) {
        specs[c.model] = experiment_model_spec(c.open_path);
        plan_files[c.model].expert_copies = synthetic_expert_copies(specs[c.model]);
      } else {
        auto src = open_weights(c.open_path);
        specs[c.model] = src->spec();
        plan_files[c.model] = {tensor_dtypes_of(*src), expert_copies_of(*src)};
        opened[c.model] = std::move(src);
      }
      // How many experts a step's tokens really touch decides what streaming costs: measure it on the
      // weights (one CPU pass over the steps' own tokens), rather than assume uniform routing.
      // An earlier call of this file recorded what it measured: reuse it rather than spend the
      // seconds again.
      int64_t n = 64;
      for (int64_t t : c.tiers) n = std::max(n, t);
      n = std::min<int64_t>(n, 1024);
      std::vector<int64_t> curve_tokens = c.tiers;
      std::sort(curve_tokens.begin(), curve_tokens.end());
      std::optional<Routing> recorded;
      if (specs[c.model].is_moe() && !o.routing_from.empty()) {
        if (!routing_source) routing_source = std::make_unique<ExistingResults>(read_results(o.routing_from));
        recorded = recorded_routing(routing_source->sweeps, c.model_name, c.weights, e.token_seed, curve_tokens, n, specs[c.model],
                                    o.routing_from);
        if (!recorded)
          fail(o.routing_from, ": no sweep record holds ", c.model_name, "'s routing measured on ", n,
               " tokens of token_seed ", e.token_seed, " for this experiment's tiers and weights (", c.weights,
               "): give the results file of a sweep of this experiment");
      }
      if (specs[c.model].is_moe() && !o.predict_only && !recorded)
        recorded = recorded_routing(existing.sweeps, c.model_name, c.weights, e.token_seed, curve_tokens, n, specs[c.model], o.out_path);
      if (recorded) {
        log_info(c.model_name, ": routing as measured by an earlier call of ",
                 o.routing_from.empty() ? o.out_path : o.routing_from);
        routing[c.model] = *recorded;
      } else if (specs[c.model].is_moe() && !o.predict_only) {
        const auto t0 = Clock::now();
        OpenOptions oo;
        oo.threads = 0;
        std::unique_ptr<WeightSource> tmp;
        const WeightSource* src = opened.count(c.model) ? opened[c.model].get() : (tmp = open_weights(c.open_path, oo)).get();
        const ModelWeights w = ModelWeights::from_source(*src);
        ThreadPool pool(0);
        Routing r;
        r.tokens = curve_tokens;
        r.measured_on = n;
        const std::vector<int32_t> toks = step_tokens(n, w.spec.vocab_size, e.token_seed);
        r.experts = measure_experts_touched(w, pool, toks, r.tokens);
        const double next = measure_next_layer_routing(
            w, pool, std::vector<int32_t>(toks.begin(), toks.begin() + std::min<std::ptrdiff_t>(kNextLayerTokens, static_cast<std::ptrdiff_t>(toks.size()))));
        r.next_layer_hits = std::isfinite(next) ? next : 0;
        std::string curve;
        for (size_t i = 0; i < r.tokens.size(); ++i) curve += str_cat(i ? ", " : "", r.tokens[i], ": ", r.experts[i]);
        log_info(c.model_name, ": routing measured on ", n, " tokens in ",
                 std::chrono::duration<double>(Clock::now() - t0).count(), " s — distinct experts per layer by step tokens {",
                 curve, "} of ", w.spec.num_experts, "; the next layer's experts guessed at ", 100 * r.next_layer_hits, "%");
        routing[c.model] = std::move(r);
      }
    }
    ConfigPlan p = plan_config(e, c, specs[c.model], plan_files[c.model], cost_source,
                               routing.count(c.model) ? &routing[c.model] : nullptr);
    if (!p.plannable && e.filters.plannable) {
      res.dropped.push_back(str_cat(c.model_name, " budget ", c.budget_text, " ctx ", c.ctx, " threads ", c.threads, " cap ",
                                    c.pcie_cap_text, ": filtered (plannable: ", p.error, ")"));
      continue;
    }
    config_profile[c.config_id] = cost_source.hash(e, c.pcie_cap_bytes_per_s);
    plans.push_back(std::move(p));
  }
  const double plan_s = seconds_since(t_plan);
  for (const auto& r : existing.rows) {
    auto it = config_profile.find(r.value("config_id", ""));
    if (it != config_profile.end() && r.value("profile_hash", "") != it->second)
      fail(o.out_path, ": rows of configuration ", it->first, " were predicted with profile ", r.value("profile_hash", "?"),
           " and the cost model now gives ", it->second, ": a changed profile means re-running the sweep into a new --out");
  }

  // What is left, and how long it should take.
  res.configurations = static_cast<int>(plans.size());
  double load_s = 0, setup_s = 0, steps_s = 0, probe_total_s = 0;
  int measured_left = 0;
  std::map<int, bool> model_needed;
  auto row_done = [&](const Configuration& c, const RowPlan& r) {
    return existing.keys.count(RowKey{c.config_id, r.tier, schedule_name(r.schedule)}) != 0;
  };
  // Predicted seconds of a schedule's runtime set-up and of a row (used for the ETA and --max-minutes).
  const double cap_min_gbps = cost_source.pcie_h2d_gbps();
  // One device and runtime per configuration (its candidates share the set-up); each schedule's first
  // step uploads what its plans pin.
  auto setup_seconds = [&](const ConfigPlan& p) {
    return o.device == "cuda" ? kDeviceSetupS + static_cast<double>(p.model_bytes) / kRegisterBytesPerS : 0.01;
  };
  auto upload_seconds = [&](const ConfigPlan& p, const RowPlan& r) {
    const double pcie = p.config.pcie_cap_bytes_per_s > 0 ? std::min(p.config.pcie_cap_bytes_per_s, cap_min_gbps * 1e9) : cap_min_gbps * 1e9;
    return static_cast<double>(r.vram_bytes) / pcie;
  };
  for (const auto& p : plans) {
    std::map<Schedule, bool> runtime_counted;
    bool setup_counted = false;
    for (const auto& r : p.rows) {
      ++res.rows_total;
      if (row_done(p.config, r)) {
        ++res.rows_present;
        continue;
      }
      if (!r.feasible || r.skip) continue;
      ++measured_left;
      model_needed[p.config.model] = true;
      if (!setup_counted) {
        setup_counted = true;
        setup_s += setup_seconds(p);
        if (o.probe_machine) probe_total_s += kProbeSeconds;
      }
      // A candidate runs in measure.rounds rounds, each warming up after its schedule's uploads.
      const int rounds = row_rounds(e.measure, r);
      if (!runtime_counted[r.schedule]) {
        runtime_counted[r.schedule] = true;
        setup_s += (schedule_is_candidate(r.schedule) ? std::max(1, e.measure.rounds) : 1) * upload_seconds(p, r);
      }
      steps_s += rounds * predicted_row_seconds(round_share(e.measure, rounds), r.predicted_ms);
    }
  }
  for (const auto& m : model_needed) load_s += static_cast<double>(specs[m.first].total_bytes()) / kLoadBytesPerS;
  res.predicted_seconds = load_s + setup_s + steps_s + probe_total_s;
  const int rows_left = res.rows_total - res.rows_present;
  std::fprintf(stderr,
               "sweep %s: %d configurations%s (%zu dropped), %d rows: %d present, %d to write (%d to measure)\n"
               "  predicted running time %s on %s: model loads %s, device set-up %s, steps %s%s (planning took %.1f s)\n",
               e.name.c_str(), res.configurations,
               o.shard_count > 1 ? str_cat(" in shard ", o.shard_index, "/", o.shard_count).c_str() : "", res.dropped.size(),
               res.rows_total, res.rows_present, rows_left, measured_left, fmt_minutes(res.predicted_seconds).c_str(),
               cost_source.name.c_str(), fmt_minutes(load_s).c_str(), fmt_minutes(setup_s).c_str(), fmt_minutes(steps_s).c_str(),
               probe_total_s > 0 ? str_cat(", machine probes ", fmt_minutes(probe_total_s)).c_str() : "", plan_s);
  if (o.device == "emu")
    std::fprintf(stderr, "  device emu: the emulated device runs on the CPU; its timings are not GPU numbers\n");
  for (const auto& d : res.dropped) log_info("dropped ", d);
  if (o.predict_only && !o.out_path.empty()) {  // one prediction record per row, a new file
    ResultsWriter pred(o.out_path);
    for (const auto& p : plans)
      for (const auto& r : p.rows) {
        json j = planned_keys(e, p, r, config_profile[p.config.config_id], git_rev);
        j["record"] = "prediction";
        pred.append(j);
        ++res.rows_written;
      }
    std::fprintf(stderr, "%d predictions written to %s\n", res.rows_written, o.out_path.c_str());
  }
  if (o.predict_only || rows_left == 0) {
    res.complete = rows_left == 0;
    res.elapsed_seconds = seconds_since(t_start);
    return res;
  }

  // Run.
  // The routing each MoE model was planned with, by model name (a later --resume call reuses it).
  json routing_record = json::object();
  for (const auto& c : mine)
    if (routing.count(c.model) && !routing_record.contains(c.model_name)) {
      const Routing& r = routing[c.model];
      routing_record[c.model_name] = {{"tokens", r.tokens}, {"experts", r.experts}, {"measured_on_tokens", r.measured_on},
                                      {"next_layer_hits", r.next_layer_hits}};
    }
  json deferred_json = json::object();  // thread count -> the machine check's slowdown there
  for (const auto& [t, g] : o.deferred_threads) deferred_json[std::to_string(t)] = g;
  const std::string machine = machine_fingerprint(o.device);
  const std::string gpu_name = o.device == "cuda" ? cuda_device_info(0).name : "emulated device";
  ResultsWriter& out = *writer;
  out.append(json{{"record", "sweep"},
                  {"experiment", e.name},
                  {"experiment_path", e.path},
                  {"experiment_hash", e.hash()},
                  {"effective_config", json::parse(e.effective_json())},
                  {"yaml", e.text},
                  {"git_rev", git_rev},
                  {"machine", machine},
                  {"device", o.device},
                  {"shard", str_cat(o.shard_index, "/", o.shard_count)},
                  {"max_minutes", o.max_minutes},
                  {"started", utc_now()},
                  {"configurations", res.configurations},
                  {"rows_total", res.rows_total},
                  {"rows_present", res.rows_present},
                  {"predicted_s", res.predicted_seconds},
                  {"dropped", res.dropped},
                  {"routing", routing_record},
                  {"machine_check", o.machine_check_json.empty() ? json(nullptr) : json::parse(o.machine_check_json)},
                  {"deferred_threads", deferred_json}});

  Progress progress("sweep", static_cast<uint64_t>(std::max(1.0, res.predicted_seconds * 1000.0)), o.progress);
  // Observed / predicted time of the work done so far; corrects the estimate used by --max-minutes.
  double done_predicted_s = 0, done_actual_s = 0;
  auto calibrated = [&](double predicted_s) {
    const double ratio = done_predicted_s > 1e-3 ? done_actual_s / done_predicted_s : 1.0;
    return predicted_s * std::max(ratio, 0.05);
  };
  const double limit_s = o.max_minutes > 0 ? o.max_minutes * 60.0 : INFINITY;
  bool did_work = false;
  auto out_of_time = [&](double predicted_s) {
    const double need = calibrated(predicted_s);
    if (seconds_since(t_start) + need <= limit_s) return false;
    if (!did_work) {
      log_warn("the next step is predicted to take ", fmt_minutes(need), ", past --max-minutes; running it anyway");
      return false;
    }
    res.stopped_by_time = true;
    return true;
  };

  LoadedModel model;
  auto base_row = [&](const ConfigPlan& p, const RowPlan& r) {
    json j = planned_keys(e, p, r, config_profile[p.config.config_id], git_rev);
    j["record"] = "row";
    j["measured_ms"] = nullptr;
    j["measured_spread_ms"] = nullptr;
    j["machine"] = machine;
    j["device"] = o.device;
    j["gpu"] = gpu_name;
    j["shard"] = str_cat(o.shard_index, "/", o.shard_count);
    return j;
  };
  auto write_row = [&](json j) {
    j["time"] = utc_now();
    out.append(j);
    ++res.rows_written;
  };

  double probe_s = kProbeSeconds;  // the last machine probe's duration (the guess before the first)
  for (const auto& p : plans) {
    const Configuration& c = p.config;
    std::vector<const RowPlan*> todo;
    for (const auto& r : p.rows)
      if (!row_done(c, r)) todo.push_back(&r);
    if (todo.empty()) continue;
    if (res.stopped_by_time) break;

    // Rows that are not run are written at once.
    bool any_to_measure = false;
    for (const RowPlan* r : todo) any_to_measure |= r->feasible && !r->skip;

    // A deferred thread count: measured only if a probe finds the machine back within the tolerance
    // (that probe is then the configuration's, below).
    double deferral_probe = 0;
    if (any_to_measure && o.deferred_threads.count(c.threads)) {
      double now = 0;
      if (o.probe_machine) {
        if (out_of_time(probe_s)) break;
        const auto t_probe = Clock::now();
        now = o.probe_machine(c.threads);
        probe_s = seconds_since(t_probe);
      }
      const double tol = 1 + o.defer_tolerance;
      if (!(now > 0 && now <= tol && now >= 1 / tol)) {
        log_info(c.config_id, ": deferred (", c.threads, " thread", c.threads == 1 ? "" : "s", ": the machine check read ",
                 o.deferred_threads.at(c.threads), "x the profile", now > 0 ? str_cat(", the probe now ", now, "x") : std::string(),
                 "); run again with --resume");
        res.rows_deferred += static_cast<int>(todo.size());
        continue;
      }
      log_info(c.config_id, ": the machine is back within its profile at ", c.threads, " thread(s) (", now, "x): measured");
      deferral_probe = now;
    }

    PlanTable table;
    std::unique_ptr<ThreadPool> pool;
    if (any_to_measure) {
      // Load the model once per sweep (configurations are ordered model by model).
      if (model.index != c.model) {
        if (out_of_time(static_cast<double>(specs[c.model].total_bytes()) / kLoadBytesPerS)) break;
        const auto t0 = Clock::now();
        model = LoadedModel{};
        if (opened.count(c.model)) {
          model.source = std::move(opened[c.model]);
        } else {
          OpenOptions oo;
          oo.threads = 0;
          model.source = open_weights(c.open_path, oo);
        }
        model.weights = std::make_unique<ModelWeights>(ModelWeights::from_source(*model.source));
        model.file = {tensor_dtypes_of(*model.source), expert_copies_of(*model.source)};
        model.index = c.model;
        model.load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        const double predicted = static_cast<double>(specs[c.model].total_bytes()) / kLoadBytesPerS;
        done_predicted_s += predicted;
        done_actual_s += model.load_ms / 1000.0;
        progress.add(static_cast<uint64_t>(predicted * 1000.0));
        log_info("loaded ", c.model_name, " (", c.weights, ") in ", model.load_ms / 1000.0, " s");
      }
      // Re-plan with the loaded file's dtypes; the predictions must be those announced.
      const ConfigPlan again = plan_config(e, c, model.source->spec(), model.file, cost_source,
                                           routing.count(c.model) ? &routing[c.model] : nullptr, &table);
      for (size_t i = 0; i < again.rows.size() && i < p.rows.size(); ++i)
        if (again.rows[i].feasible != p.rows[i].feasible || std::fabs(again.rows[i].predicted_ms - p.rows[i].predicted_ms) > 1e-6 * (1 + p.rows[i].predicted_ms))
          log_warn(c.config_id, ": re-planning with the loaded weights changed the prediction of ", schedule_name(p.rows[i].schedule),
                   " at tier ", p.rows[i].tier, " (", p.rows[i].predicted_ms, " -> ", again.rows[i].predicted_ms, " ms)");
      pool = std::make_unique<ThreadPool>(c.threads);
    }
    double machine_slowdown = 0;  // 0: not probed
    std::vector<double> machine_probes;  // every probe of this configuration, the last one's is machine_slowdown
    // The configuration's cost model with its CPU work scaled by the probe: each row's plan predicted
    // again for the machine as it ran (predicted_ms_at_probe), to tell its drift from the model's error.
    std::unique_ptr<CostModel> at_probe;
    PlannerConfig at_probe_cfg;
    if (any_to_measure && o.probe_machine) {
      if (deferral_probe > 0) {
        machine_slowdown = deferral_probe;
      } else {
        if (out_of_time(probe_s)) break;
        const auto t_probe = Clock::now();
        machine_slowdown = o.probe_machine(c.threads);
        probe_s = seconds_since(t_probe);
      }
      machine_probes.push_back(machine_slowdown);
      for (int retry = 0; o.calm_slowdown > 0 && machine_slowdown > 1 + o.calm_slowdown && retry < o.calm_retries; ++retry) {
        if (seconds_since(t_start) + o.calm_pause_s + probe_s >= limit_s) break;  // no time to wait: measured as it is
        log_info(c.config_id, ": the machine is ", machine_slowdown, "x slower than its profile at ", c.threads,
                 " thread(s); waiting ", o.calm_pause_s, " s for it to calm (", retry + 1, " of ", o.calm_retries, ")");
        std::this_thread::sleep_for(std::chrono::duration<double>(o.calm_pause_s));
        machine_slowdown = o.probe_machine(c.threads);
        machine_probes.push_back(machine_slowdown);
      }
      if (machine_slowdown > 0 && p.plannable) {
        at_probe_cfg = planner_config(e, c, model.file, routing.count(c.model) ? &routing[c.model] : nullptr);
        at_probe = make_cpu_scaled_cost_model(cost_source.make(c.pcie_cap_bytes_per_s), machine_slowdown);
      }
      done_predicted_s += kProbeSeconds;
      done_actual_s += probe_s;
      progress.add(static_cast<uint64_t>(kProbeSeconds * 1000.0));
    }

    std::unique_ptr<Device> device;
    std::unique_ptr<Runtime> rt;
    std::string setup_error;
    double setup_ms = 0;
    // Passes over the schedules: the candidates measure.rounds times, each of their rows in its rounds
    // (row_rounds) with its share of the repeats, then the baselines once. A row is written after its
    // last round (a call stopped in between measures it again on --resume).
    struct Pass {
      Schedule schedule;
      int round;
    };
    std::vector<Pass> passes;
    for (int k = 0; k < std::max(1, e.measure.rounds); ++k)
      for (Schedule s : c.schedules)
        if (schedule_is_candidate(s)) passes.push_back({s, k});
    for (Schedule s : c.schedules)
      if (!schedule_is_candidate(s)) passes.push_back({s, 0});
    std::map<const RowPlan*, Measurement> earlier;  // rows' measurements of the rounds before
    std::set<const RowPlan*> written;
    for (const Pass& pass : passes) {
      const Schedule s = pass.schedule;
      std::string schedule_error;
      std::vector<const RowPlan*> rows;
      for (const RowPlan* r : todo)
        if (r->schedule == s && !written.count(r) && pass.round < row_rounds(e.measure, *r)) rows.push_back(r);
      if (rows.empty()) continue;
      std::vector<const RowPlan*> runnable;
      for (const RowPlan* r : rows) {
        if (r->feasible && !r->skip) {
          runnable.push_back(r);
          continue;
        }
        json j = base_row(p, *r);
        j["status"] = !r->feasible ? "infeasible" : "skipped";
        j["reason"] = r->reason;
        write_row(j);
        written.insert(r);
      }
      if (runnable.empty() || res.stopped_by_time) continue;
      const RowPlan& first = *runnable.front();
      const double first_row_s =
          upload_seconds(p, first) + predicted_row_seconds(round_share(e.measure, row_rounds(e.measure, first)), first.predicted_ms);
      if (out_of_time((device ? 0.0 : setup_seconds(p)) + first_row_s)) break;

      // One device and one runtime for the configuration, set up for its first schedule with rows to
      // measure; the later schedules switch it (Runtime::set_schedule). Candidates measured in one
      // set-up: separate set-ups had measured one plan under two names up to ~6% apart
      // (results/planner_accuracy_v6/README.md). A baseline keeping the KV cache elsewhere than the
      // candidates (layer-split) gets a set-up of its own.
      if (rt && !rt->keeps_kv_as(s)) {
        rt.reset();
        device.reset();
      }
      if (!device && setup_error.empty()) {
        const auto t_setup = Clock::now();
        try {
          if (o.device == "cuda") {
            device = make_cuda_device(0);
          } else {
            EmuOptions eo;
            eo.max_delay_us = 0;
            device = make_emu_device(eo);
          }
          RuntimeOptions ro;
          ro.schedule = s;
          ro.pcie_cap_bytes_per_s = c.pcie_cap_bytes_per_s;
          rt = std::make_unique<Runtime>(*model.source, *model.weights, *device, *pool, table, ro);
          // The rows step over a cache filled to ctx without a prefill: give the host caches data.
          rt->fill_host_cache(c.ctx, e.token_seed);
        } catch (const std::exception& err) {
          setup_error = err.what();
        }
        setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();
        const double predicted = setup_seconds(p);
        done_predicted_s += predicted;
        done_actual_s += setup_ms / 1000.0;
        progress.add(static_cast<uint64_t>(predicted * 1000.0));
      } else if (rt) {
        try {
          rt->set_schedule(s);
        } catch (const std::exception& err) {
          schedule_error = err.what();
        }
      }
      {  // this schedule's uploads of what its plans pin (made by its first row's warm-up)
        const double predicted = upload_seconds(p, *runnable.front());
        done_predicted_s += predicted;
        progress.add(static_cast<uint64_t>(predicted * 1000.0));
      }
      std::vector<float> logits(static_cast<size_t>(model.source->spec().vocab_size));
      for (size_t i = 0; i < runnable.size(); ++i) {
        const RowPlan* r = runnable[i];
        const int r_rounds = row_rounds(e.measure, *r);
        const bool last_round = pass.round == r_rounds - 1;
        const MeasureSettings ms = round_share(e.measure, r_rounds);
        const double predicted_s = predicted_row_seconds(ms, r->predicted_ms);
        if (i > 0 && out_of_time(predicted_s)) break;
        json j = base_row(p, *r);
        j["machine_slowdown"] = machine_slowdown > 0 ? json(machine_slowdown) : json(nullptr);
        j["machine_probes"] = machine_probes;
        j["predicted_ms_at_probe"] = nullptr;
        if (at_probe)
          if (const TierEntry* te = table.find_tier(r->tier))
            if (const Plan* pl = te->find(r->schedule); pl && pl->feasible)
              j["predicted_ms_at_probe"] = repredict(*pl, model.source->spec(), *at_probe, at_probe_cfg);
        j["setup_ms"] = setup_ms;
        j["model_load_ms"] = model.load_ms;
        j["rounds"] = r_rounds;
        const auto t_row = Clock::now();
        bool write = true;
        if (!setup_error.empty() || !schedule_error.empty()) {
          j["status"] = "error";
          j["reason"] = setup_error.empty() ? schedule_error : setup_error;
        } else {
          try {
            const auto tokens = step_tokens(r->tier, model.source->spec().vocab_size, e.token_seed);
            Measurement& m = earlier[r];
            m.add(measure_row(*rt, c.ctx, r->tier, tokens, ms, logits));
            write = last_round;
            if (write) {
              const RuntimeMemory mem = rt->memory();
              j["status"] = "measured";
              j["reason"] = "";
              j["measured_ms"] = m.median_ms;
              j["measured_spread_ms"] = m.spread_ms;
              j["measured_min_ms"] = *std::min_element(m.samples_ms.begin(), m.samples_ms.end());
              j["measured_max_ms"] = *std::max_element(m.samples_ms.begin(), m.samples_ms.end());
              j["samples_ms"] = m.samples_ms;
              j["warmup_ms"] = m.warmup_ms;
              j["repeats"] = m.samples_ms.size();
              j["plan_tier"] = m.plan_tier;
              j["chunk_tokens"] = m.chunk_tokens;
              j["chunks"] = m.chunks;
              j["arena_peak_bytes"] = mem.arena_peak_bytes;
              j["device_peak_bytes"] = mem.device_peak_bytes;
              j["context_bytes"] = mem.context_bytes;
              j["uploaded_bytes"] = mem.uploaded_bytes;
              if (m.plan_tier != r->tier)
                log_warn(c.config_id, ": ", schedule_name(s), " at tier ", r->tier, " ran the plan of tier ", m.plan_tier);
              if (!o.timelines_dir.empty()) {  // one more step, recorded (not a sample)
                const std::string name = str_cat(c.config_id, "_t", r->tier, "_", schedule_name(s), ".json");
                rt->record_timeline(static_cast<int>(std::max<int64_t>(1, m.chunks)));
                step_at(*rt, c.ctx, r->tier, tokens, logits);
                log_info(c.config_id, ": ", write_timeline_trace(*rt, o.timelines_dir + "/" + name, "--timelines"));
                rt->record_timeline(0);
                j["timeline"] = name;
              }
              ++res.rows_measured;
            }
          } catch (const std::exception& err) {
            j["status"] = "error";
            j["reason"] = err.what();
            write = true;
          }
        }
        if (write) {
          write_row(j);
          written.insert(r);
        }
        did_work = true;
        done_predicted_s += predicted_s;
        done_actual_s += seconds_since(t_row);
        progress.add(static_cast<uint64_t>(predicted_s * 1000.0));
      }
      if (res.stopped_by_time) break;
    }
    rt.reset();  // before the device it runs on
    device.reset();
  }
  progress.finish();

  // Complete when every row of the shard is in the file now.
  const ExistingResults now = read_results(o.out_path);
  int present = 0;
  for (const auto& p : plans)
    for (const auto& r : p.rows) present += now.keys.count(RowKey{p.config.config_id, r.tier, schedule_name(r.schedule)}) != 0;
  res.complete = present == res.rows_total;
  res.elapsed_seconds = seconds_since(t_start);
  out.append(json{{"record", "sweep_end"},
                  {"experiment", e.name},
                  {"shard", str_cat(o.shard_index, "/", o.shard_count)},
                  {"rows_written", res.rows_written},
                  {"rows_measured", res.rows_measured},
                  {"rows_left", res.rows_total - present},
                  {"complete", res.complete},
                  {"stopped_by_time", res.stopped_by_time},
                  {"rows_deferred", res.rows_deferred},
                  {"elapsed_s", res.elapsed_seconds},
                  {"ended", utc_now()}});
  return res;
}

}  // namespace shardwise

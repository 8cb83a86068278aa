// oracle/experiment.h — an experiment YAML (experiments/*.yaml) turned into validated
// configurations: the cartesian product of models × budgets × contexts × threads × PCIe caps, minus
// explicit exclusions and filters, each with its tiers and schedules (the rows to measure).
// Every field error names the file and the field. This header knows nothing about running.
//
// A configuration is identified by config_id: a deterministic hash of (model weights, budget bytes,
// ctx, threads, PCIe cap), stable across runs, machines and builds (DESIGN.md §6).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "planner/plan.h"

namespace shardwise {

// What an experiment may expand to (checked when it is read): the product of its lists, and the tiers
// of each configuration.
constexpr int64_t kMaxConfigurations = 100000;
constexpr size_t kMaxTiers = 64;

struct ExperimentModel {
  std::string name;  // the `model` field of every row
  // As written in the file (what config_id hashes, so ids do not depend on the working directory):
  // a .gguf, an HF directory, or synthetic:SPEC?dtype=&seed= (SPEC: builtin name or spec .yaml).
  std::string weights;
  std::string open_path;  // the same with relative paths resolved against the experiment file
};

// A budget as written: absolute ("4G", "2000MB") or a share of the model's weight bytes ("25%").
struct ExperimentBudget {
  std::string text;
  uint64_t bytes = 0;   // absolute budgets
  double fraction = 0;  // share budgets (0 < fraction), resolved per model
};

// An image size of a vision encoder experiment, as written ("1920x1080").
struct ExperimentImage {
  std::string text;
  int64_t width = 0, height = 0;
};

struct ExperimentCap {
  std::string text;        // "16GB/s" or "none"
  double bytes_per_s = 0;  // 0 = no cap
};

// How each row is measured: warm-up steps, then repeats until the spread (interquartile range /
// median) is at most target_spread, at least min_repeats and at most max_repeats; steps that are
// expensive get fewer: once repeats have taken row_seconds, expensive_repeats suffice.
// Rows whose predicted step exceeds max_step_ms are not run (status "skipped"; 0 = run all).
struct MeasureSettings {
  int warmup = 1;
  int min_repeats = 3;
  int max_repeats = 10;
  double target_spread = 0.03;
  double row_seconds = 2.0;
  int expensive_repeats = 2;
  double max_step_ms = 0;
  // The candidate schedules of a configuration are measured in this many rounds (gpu-only, static,
  // dynamic, then again ...), each with its share of the repeats (and its own warm-up), and a row's
  // figures are over all its rounds: the machine's drift over the configuration's seconds then falls on
  // every candidate alike instead of on whichever ran last (16-thread CPU decode moved up to 15% between
  // two measurements of one plan seconds apart: planner_accuracy_v11). Baselines run once.
  int rounds = 1;
};

// Drops configurations (or single rows): the rule matches when every field it names matches one of
// its values. Config-level fields: model, budget, ctx, threads, pcie_cap; row-level: tier, schedule.
struct ExclusionRule {
  std::string where;  // "exclude[2]", for messages
  std::vector<std::string> models;
  std::vector<std::string> budgets;  // as written in `budgets`
  std::vector<int64_t> ctxs;
  std::vector<int> threads;
  std::vector<double> caps;  // bytes/s, 0 = none
  std::vector<int64_t> tiers;
  std::vector<Schedule> schedules;
  bool row_level() const { return !tiers.empty() || !schedules.empty(); }
};

struct ExperimentFilters {
  bool budget_below_model = false;  // drop configurations whose budget holds the whole model
  bool plannable = true;            // drop configurations the planner rejects (budget below its minimum)
};

struct Experiment {
  std::string path;  // the file (messages)
  std::string text;  // the YAML as read
  std::string name;
  std::string description;
  std::string hardware;       // cost model: builtin machine name or hardware YAML path, as written
  std::string hardware_path;  // the same with a relative path resolved against the experiment file
  // Measured cost model (`profile: PATH`, a ProfileDB from `shardwise profile`): used instead of
  // `hardware` when present; `hardware` is then optional and only stands in for the GPU of a
  // CPU-only profile.
  std::string profile;       // as written
  std::string profile_path;  // resolved against the experiment file
  std::vector<ExperimentModel> models;
  std::vector<ExperimentBudget> budgets;
  std::vector<int64_t> ctxs;
  std::vector<int> threads;
  std::vector<ExperimentCap> caps;
  std::vector<int64_t> tiers;       // ascending
  std::vector<Schedule> schedules;  // default: the three + the two baselines
  std::string kv_dtype = "f32";
  uint64_t token_seed = 1;  // seed of the token ids fed to each step
  MeasureSettings measure;
  ExperimentFilters filters;
  std::vector<ExclusionRule> exclude;
  // A vision encoder experiment (oracle/vision_sweep.h) when not empty: each model's encoder (an HF
  // directory of a vision-language model, or an mmproj .gguf) measured at each of these image sizes under
  // each budget; ctx, threads, pcie_caps, tiers, schedules and the language model's settings do not apply.
  std::vector<ExperimentImage> images;
  bool vision() const { return !images.empty(); }

  // The effective configuration (every field, defaults filled in) as JSON text, and its hash.
  std::string effective_json() const;
  std::string hash() const;
};

struct Configuration {
  int index = 0;  // position in the expanded list (shards split by it)
  std::string config_id;
  int model = 0;                    // index into Experiment::models
  std::string model_name, weights;  // weights as written (rows, config_id)
  std::string open_path;            // what open_weights() is given
  std::string budget_text;
  uint64_t budget_bytes = 0;
  int64_t ctx = 0;
  int threads = 1;
  std::string pcie_cap_text;
  double pcie_cap_bytes_per_s = 0;
  std::vector<int64_t> tiers;
  std::vector<Schedule> schedules;
  // (tier, schedule) pairs dropped by row-level exclusions.
  std::vector<std::pair<int64_t, Schedule>> excluded_rows;
  bool row_excluded(int64_t tier, Schedule s) const;
};

// Parses and validates; throws Error("<file>: <field>: what is wrong").
Experiment parse_experiment_text(const std::string& text, const std::string& path);
Experiment load_experiment(const std::string& path);

// Plans `e` from another measured profile than its own (the same experiment on another machine:
// `shardwise sweep --profile`). `path` is taken from the working directory and replaces `profile`
// in the effective config, so the experiment's hash and every results file say which one was used.
// Throws Error (one line) if it cannot be read, or has no GPU rows and `e` names no hardware.
void use_profile(Experiment& e, const std::string& path);

// The spec of a model's weights without materialising them (synthetic specs are computed; files are
// opened and validated). `weights` as in ExperimentModel.
ModelSpec experiment_model_spec(const std::string& weights);

// The cartesian product minus exclusions and the budget_below_model filter, in a fixed order (model
// outermost, so a sweep loads each model once). `dropped` (optional) receives one line per dropped
// configuration and why.
std::vector<Configuration> expand_configurations(const Experiment& e, std::vector<std::string>* dropped = nullptr);

// Deterministic: 16 hex digits of FNV-1a over a canonical text of the five fields.
std::string make_config_id(const std::string& weights, uint64_t budget_bytes, int64_t ctx, int threads,
                           double pcie_cap_bytes_per_s);

// 64-bit FNV-1a as 16 hex digits (the hash used for ids).
std::string fnv1a_hex(const std::string& text);

// "--shard i/n" (0 <= i < n): throws Error naming the flag on bad text.
void parse_shard(const std::string& text, int* index, int* count);

}  // namespace shardwise

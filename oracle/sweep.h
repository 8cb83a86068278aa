// oracle/sweep.h — the oracle: for every configuration of an experiment, build the plan table with
// the cost model (the predictions), then run each feasible (tier, schedule) through the executor's
// Runtime for real — one step of `tier` new tokens over a KV cache filled to ctx (host-resident
// caches written with seeded data first, Runtime::fill_host_cache, as a prefill would), after warm-up,
// repeated until the spread is small (fewer repeats for expensive steps) — and append one JSONL row
// per (configuration, tier, schedule) with the DESIGN.md §6 keys.
// Crash-safe and resumable (results.h), splittable (--shard i/n), time-boxed (--max-minutes, stops
// between rows), with its own running-time prediction computed from the plans before it starts.
// Each model is loaded once per sweep; every configuration is re-planned; one Device and one
// Runtime per configuration, switched from schedule to schedule (Runtime::set_schedule) and destroyed
// after: a configuration's candidates are measured in one set-up (rows' setup_ms is that set-up's,
// device_peak_bytes the peak since it; arena_peak_bytes and uploaded_bytes are the schedule's own),
// in measure.rounds rounds (the candidates one after the other, then again; a row's figures over all
// its rounds), the baselines after them once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/planning.h"  // step_tokens: the tokens of a measured step
#include "oracle/experiment.h"

namespace shardwise {

struct SweepOptions {
  std::string out_path;  // the JSONL file; with predict_only (optional) one prediction per row
  // MoE models: plan with the routing recorded in this results file's sweep records (a study's own
  // measurement), instead of measuring it again (needed with predict_only to re-predict a study).
  std::string routing_from;
  bool resume = false;  // continue an existing file, skipping rows present
  int shard_index = 0;  // --shard i/n: this process runs configurations with index % n == i
  int shard_count = 1;
  double max_minutes = 0;      // stop cleanly between rows once the next would end past this; 0 = none
  std::string device = "emu";  // "cuda" or "emu" (the emulated device: timings are not GPU numbers)
  // Plan and print the predicted running time; run nothing. With out_path: write one "prediction"
  // record per row (the row's keys without measurements) — a study's rows re-predicted by this
  // binary's cost model (scripts/analysis/repredict.py compares them with the study's measurements).
  bool predict_only = false;
  bool progress = true;  // progress bar with ETA on stderr
  // The machine check made before this call (cli: microbench's check_machine against the
  // experiment's profile), as JSON text; recorded in the sweep's header record. Empty: none made.
  std::string machine_check_json;
  // Before a configuration's rows are measured: how much slower the machine is now than the profile
  // at the configuration's thread count (cli: microbench's MachineProbe, about a second), written into
  // its rows as machine_slowdown, so that a report can tell the machine's drift from the planner's
  // error. Empty: not probed (the rows' machine_slowdown is null).
  std::function<double(int threads)> probe_machine;
  // With probe_machine: a configuration whose probe finds the machine more than calm_slowdown slower
  // than its profile (0.3: 1.3x) waits calm_pause_s and is probed again, up to calm_retries times,
  // before its rows are measured: a neighbour's burst on a shared host passes, and measuring through it
  // puts the burst, not the planner, into the study (planner_accuracy_v13: four configurations measured
  // at 1.3-1.6x, their CPU steps 3-5x slower, minutes before and after measured as predicted). A machine
  // that stays slow is measured anyway. Every probe goes into the rows (machine_probes). 0: never wait.
  double calm_slowdown = 0;
  int calm_retries = 3;
  double calm_pause_s = 15;
  // Thread counts the machine check found outside its tolerance while another of the experiment's was
  // within it (cli: sweep), with the check's slowdown: their configurations are deferred — left for a
  // later --resume call — unless probe_machine, just before one of them, finds the machine back within
  // a factor of 1 + defer_tolerance of the profile at that thread count. The GPU host's one-thread speed
  // moves by 1.3x within minutes (planner_accuracy_v15: a call refused for it ten minutes after one that
  // passed) while its sixteen-thread rows can still be measured.
  std::map<int, double> deferred_threads;
  double defer_tolerance = 0.2;
  // `--timelines DIR`: after each measured row's repeats, one more step of it with its timeline recorded
  // (Runtime::record_timeline; not a sample: recording costs timestamps), written as a Chrome trace to
  // DIR/<config_id>_t<tier>_<schedule>.json (scripts/analysis/timeline_gap.py reads it) and named in the
  // row's `timeline`. Shows where a study's step went in the sweep's own process. Created if missing.
  std::string timelines_dir;
};

struct SweepResult {
  int configurations = 0;        // in this shard, after exclusions and filters
  int rows_total = 0;            // rows of this shard
  int rows_present = 0;          // already in the file when the sweep started
  int rows_written = 0;          // by this call
  int rows_measured = 0;         // ... of which were run on the device
  bool complete = false;         // every row of the shard is in the file
  bool stopped_by_time = false;  // --max-minutes ended the call
  int rows_deferred = 0;         // rows of configurations deferred (SweepOptions::deferred_threads)
  double predicted_seconds = 0;  // the rows left, predicted before starting
  double elapsed_seconds = 0;
  std::vector<std::string> dropped;  // configurations removed by exclusions/filters, and why
};

// Runs (or with predict_only, plans) the sweep; a vision experiment's is run_vision_sweep's
// (vision_sweep.h). Progress and messages go to stderr.
SweepResult run_sweep(const Experiment& experiment, const SweepOptions& options);

// The identity of the cost model's inputs, written into every row. Until the profiler exists this
// hashes the HardwareSpec (the builtin's embedded YAML text, or the file's text) and the PCIe cap;
// the profiler issue replaces it with the ProfileDB's hash.
std::string profile_hash(const std::string& hardware, double pcie_cap_bytes_per_s);

// The revision the binary was built from ("<sha>" or "<sha>-dirty"), $SHARDWISE_GIT_REV when set,
// else "unknown".
std::string build_git_rev();

// "CPU model ×cores | GPU name, memory" — the machine the rows were measured on.
std::string machine_fingerprint(const std::string& device);

// How a row is measured, given its step time in ms (predicted or observed): the number of repeats
// the rules settle on when the spread is already small, and the seconds the row takes including
// warm-up.
int planned_repeats(const MeasureSettings& m, double step_ms);
double predicted_row_seconds(const MeasureSettings& m, double step_ms);

// A row's samples: warm-up steps, then repeats until the settings' spread, count or seconds say stop
// (MeasureSettings). `once` runs one step and returns its ms.
struct Measurement {
  std::vector<double> warmup_ms, samples_ms;
  double median_ms = 0, spread_ms = 0;
  int64_t plan_tier = 0, chunk_tokens = 0, chunks = 0;  // a language step's plan (0 elsewhere)
  // Another round's measurement of the same row: its samples join these, the figures are over all.
  void add(const Measurement& m);
};
Measurement measure_samples(const MeasureSettings& m, const std::function<double()>& once);

// The time now in UTC, as rows and records write it ("2026-12-07T13:55:35Z").
std::string utc_now();

// Interquartile range (linear interpolation between order statistics, as numpy's default) and
// median of samples.
double median_of(std::vector<double> v);
double iqr_of(std::vector<double> v);

}  // namespace shardwise

// cli/verb_sweep.cpp — `shardwise sweep`: run an experiment's oracle sweep (oracle/sweep.h) and print
// a one-line JSON summary; progress and the predicted running time go to stderr.
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "cli/common.h"
#include "cli/machine_check.h"
#include "core/error.h"
#include "core/log.h"
#include "costmodel/profile_db.h"
#include "executor/cuda/cuda_device.h"
#include "microbench/profiler.h"
#include "oracle/experiment.h"
#include "oracle/sweep.h"
#include "oracle/vision_sweep.h"

namespace shardwise::cli {
namespace {

struct SweepArgs {
  std::string file, out, shard = "0/1", device = "auto", routing_from, timelines, profile;
  std::string machine_check = "auto", machine_probe = "auto";
  bool resume = false, predict = false, no_progress = false;
  double max_minutes = 0, machine_tolerance = 0.2, calm = 0.3;
};

// --device auto|cuda|emu for the oracle (auto: the GPU when there is one, else the emulated device).
std::string sweep_device(const SweepArgs& a) {
  if (a.device == "auto") {
    const std::string device = cuda_device_count() > 0 ? "cuda" : "emu";
    if (device == "emu") log_info("note: no GPU here: --device auto runs the emulated device");
    return device;
  }
  // Clear errors without CUDA or a GPU (predicting the GPU machine's running time needs neither).
  if (a.device == "cuda") return a.predict ? "cuda" : resolve_device("cuda");
  if (a.device == "emu") return "emu";
  fail("--device '", a.device, "': the oracle runs on cuda or emu (or auto)");
}

SweepOptions sweep_options(const SweepArgs& a) {
  SweepOptions o;
  o.out_path = a.out;
  o.resume = a.resume;
  parse_shard(a.shard, &o.shard_index, &o.shard_count);
  if (a.max_minutes < 0) fail("--max-minutes ", a.max_minutes, " must be positive (0 = no limit)");
  o.max_minutes = a.max_minutes;
  o.predict_only = a.predict;
  o.routing_from = a.routing_from;
  if (a.predict && !a.timelines.empty())
    fail("--timelines records measured rows: not with --predict, which runs nothing");
  o.timelines_dir = a.timelines;
  o.progress = !a.no_progress && log_level() <= LogLevel::Info;
  o.device = sweep_device(a);
  if (!o.predict_only && o.out_path.empty())
    fail("give --out F.jsonl (or --predict to only print the predicted running time)");
  return o;
}

// An auto|on|off option that measures the machine against the experiment's profile (auto: on with the GPU).
bool machine_option(const SweepArgs& a, const Experiment& e, const SweepOptions& o, const std::string& value,
                    const char* flag, const char* needs) {
  if (value != "auto" && value != "on" && value != "off") fail(flag, " '", value, "': give auto, on or off");
  if (value == "on" && e.profile_path.empty()) fail(flag, " on: ", a.file, " names no profile ", needs);
  return !o.predict_only && !e.profile_path.empty() && (value == "on" || (value == "auto" && o.device == "cuda"));
}

// Rows measured on a machine other than the profile's test that machine, not the planner: on the GPU
// (where a study's calls may land on different machines of one kind) a few of the profile's rows are
// measured again first, and the sweep refuses a machine that differs.
void check_sweep_machine(const SweepArgs& a, const Experiment& e, const ProfileDB& db, SweepOptions& o) {
  // On the GPU the profile's GPU is compared by name too: the rows below measure only the CPU.
  const MachineCheck mc = check_machine(db, a.machine_tolerance, o.device == "cuda");
  o.machine_check_json = machine_check_json(mc, e.profile, a.machine_tolerance).dump();
  // Off at some of the experiment's thread counts and within at others: the same machine drifting
  // (its one-thread speed), so those thread counts are deferred (SweepOptions::deferred_threads). Off
  // at all of them, or other hardware by name: another machine, refused.
  bool some_within = false;
  for (int t : e.threads) {
    const auto it = mc.slowdown_by_threads.find(t);
    if (it == mc.slowdown_by_threads.end()) continue;
    const double g = it->second;
    if (g > 1 + a.machine_tolerance || g < 1 / (1 + a.machine_tolerance))
      o.deferred_threads[t] = g;
    else
      some_within = true;
  }
  if (!some_within || o.deferred_threads.empty() || !mc.hardware_difference.empty()) {
    o.deferred_threads.clear();
    require_same_machine(
        mc, e.profile, a.machine_tolerance,
        "its predictions would not describe this machine; profile it (shardwise profile) and point the "
        "experiment at that profile, or pass --machine-check off to measure anyway");
  }
  o.defer_tolerance = a.machine_tolerance;
  if (log_level() <= LogLevel::Info) std::fputs(mc.text().c_str(), stderr);
  for (const auto& [t, g] : o.deferred_threads) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "%.3g", g);
    log_warn("the machine is ", factor, "x its profile at ", t, t == 1 ? " thread" : " threads", " (tolerance ",
             a.machine_tolerance * 100,
             "%): those configurations are deferred unless a probe finds it back within "
             "the tolerance; run again with --resume");
  }
}

void print_sweep_result(const Experiment& e, const SweepOptions& o, const SweepResult& r) {
  if (!o.predict_only && log_level() <= LogLevel::Info) {
    if (r.stopped_by_time)
      std::fprintf(stderr, "stopped by --max-minutes after %.1f min: %d rows left; run again with --resume\n",
                   r.elapsed_seconds / 60.0, r.rows_total - r.rows_present - r.rows_written);
    else if (r.complete)
      std::fprintf(stderr, "sweep complete: %d rows in %s\n", r.rows_total, o.out_path.c_str());
    if (r.rows_deferred > 0)
      std::fprintf(stderr,
                   "%d rows deferred: the machine was off its profile at their thread count; run again with --resume\n",
                   r.rows_deferred);
  }
  print_json({{"experiment", e.name},
              {"configurations", r.configurations},
              {"rows_total", r.rows_total},
              {"rows_present", r.rows_present},
              {"rows_written", r.rows_written},
              {"rows_measured", r.rows_measured},
              {"rows_left", r.rows_total - r.rows_present - r.rows_written},
              {"complete", r.complete},
              {"stopped_by_time", r.stopped_by_time},
              {"rows_deferred", r.rows_deferred},
              {"predicted_s", r.predicted_seconds},
              {"elapsed_s", r.elapsed_seconds},
              {"device", o.device}});
}

// A sweep whose configurations were all dropped (exclusions, filters) has nothing to measure: an error
// saying why, not a "complete" sweep of no rows.
[[noreturn]] void fail_all_dropped(const SweepArgs& a, int shard_count, const std::vector<std::string>& dropped) {
  fail(a.file, ": nothing to measure, every configuration", shard_count > 1 ? " of shard " + a.shard : std::string(),
       " was dropped: ", dropped.front(), dropped.size() > 1 ? str_cat(" (and ", dropped.size() - 1, " more)") : "",
       "; change the experiment's budgets, exclusions or filters");
}

// Dropped before planning: no configuration is left once exclusions and filters apply. Returns the
// configurations left to this shard (a shard may have none where the experiment has fewer than shards).
int check_some_configuration(const SweepArgs& a, const Experiment& e) {
  int shard_index = 0, shard_count = 1;
  parse_shard(a.shard, &shard_index, &shard_count);
  std::vector<std::string> dropped;
  const std::vector<Configuration> left = expand_configurations(e, &dropped);
  if (left.empty() && !dropped.empty()) fail_all_dropped(a, 1, dropped);
  int mine = 0;
  for (const auto& c : left) mine += c.index % shard_count == shard_index;
  return mine;
}

// run_sweep, refusing a sweep whose `selected` configurations the planner dropped, every one (the
// plannable filter); the empty results file such a sweep opened is removed.
SweepResult run_sweep_checked(const SweepArgs& a, const Experiment& e, const SweepOptions& o, int selected) {
  struct stat st;
  const bool out_existed = !o.out_path.empty() && ::stat(o.out_path.c_str(), &st) == 0;
  SweepResult r = run_sweep(e, o);
  if (selected == 0 || r.configurations > 0 || r.dropped.empty()) return r;
  if (!out_existed && ::stat(o.out_path.c_str(), &st) == 0 && st.st_size == 0) std::remove(o.out_path.c_str());
  fail_all_dropped(a, o.shard_count, r.dropped);
}

// A vision encoder experiment (oracle/vision_sweep.h): its rows run on the device alone, so the language
// sweep's machine check and probes of the CPU at a thread count do not apply.
void run_vision_sweep_verb(const SweepArgs& a, const Experiment& e) {
  if (!a.routing_from.empty()) fail("--routing-from: ", a.file, " is a vision encoder experiment (no MoE routing)");
  if (!a.timelines.empty()) fail("--timelines: not recorded for a vision encoder experiment (", a.file, ")");
  if (a.machine_check == "on" || a.machine_probe == "on")
    fail("--machine-check and --machine-probe measure the CPU at the experiment's thread counts; ", a.file,
         " is a vision encoder experiment (the device alone)");
  std::vector<std::string> dropped;
  if (expand_vision_configurations(e, &dropped).empty()) fail_all_dropped(a, 1, dropped);
  const SweepOptions o = sweep_options(a);
  print_sweep_result(e, o, run_sweep(e, o));
}

void run_sweep_verb(const SweepArgs& a) {
  Experiment e = load_experiment(a.file);
  if (!a.profile.empty()) use_profile(e, a.profile);
  if (e.vision()) return run_vision_sweep_verb(a, e);
  const int selected = check_some_configuration(a, e);
  SweepOptions o = sweep_options(a);
  const bool check = machine_option(a, e, o, a.machine_check, "--machine-check", "to check against");
  // The machine drifts within minutes (one-thread CPU speed by 1.2-1.5x between a study's calls and
  // within them): each configuration's rows record the machine's state just before they were measured.
  const bool probe = machine_option(a, e, o, a.machine_probe, "--machine-probe", "to compare the machine with");
  if (!(a.machine_tolerance > 0 && a.machine_tolerance < 10))
    fail("--machine-tolerance ", a.machine_tolerance, " must be in (0, 10)");
  std::unique_ptr<ProfileDB> db;
  if (check || probe) db = std::make_unique<ProfileDB>(load_profile(e.profile_path));
  if (check) check_sweep_machine(a, e, *db, o);
  std::unique_ptr<MachineProbe> prober;
  if (probe) {
    prober = std::make_unique<MachineProbe>(*db);
    o.probe_machine = [&prober](int threads) { return prober->slowdown(threads); };
  }
  if (!(a.calm >= 0 && a.calm < 10)) fail("--calm ", a.calm, " must be in [0, 10) (0: never wait)");
  o.calm_slowdown = a.calm;
  print_sweep_result(e, o, run_sweep_checked(a, e, o, selected));
}

}  // namespace

void register_sweep(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* sub = app.add_subcommand(
      "sweep", "Run every candidate schedule of an experiment for real and record predicted vs measured (the oracle)");
  sub->add_option("FILE", a->file, "Experiment YAML (experiments/*.yaml)")->required();
  sub->add_option("--out", a->out, "Results file (JSON lines, appended crash-safely)");
  sub->add_option("--profile", a->profile,
                  "Plan from this measured profile instead of the experiment's own (the same study on another machine: "
                  "profile it with `shardwise profile`); recorded as the experiment's profile in the results");
  sub->add_flag("--resume", a->resume, "Continue an existing results file: rows already there are skipped");
  sub->add_option("--shard", a->shard,
                  "Run only shard i of n (i/n, numbered from 0): configurations with index % n == i");
  sub->add_option("--max-minutes", a->max_minutes,
                  "Stop cleanly between rows before this many minutes pass (0 = no limit)");
  sub->add_option("--device", a->device,
                  "auto|cuda|emu (emu: the host-emulated device; its timings are not GPU numbers)");
  sub->add_flag("--predict", a->predict,
                "Plan every configuration and print the predicted running time; run nothing. With --out: write each "
                "row's prediction to that new file (re-predict a study: scripts/analysis/repredict.py)");
  sub->add_option("--routing-from", a->routing_from,
                  "MoE models: plan with the routing a results file of this experiment recorded (as --resume does) "
                  "instead of measuring it");
  sub->add_option("--timelines", a->timelines,
                  "Directory: after each measured row, one more step of it recorded as a Chrome trace, measured beside "
                  "the planner's simulated timeline (DIR/<config_id>_t<tier>_<schedule>.json; "
                  "scripts/analysis/timeline_gap.py reads them)");
  sub->add_flag("--no-progress", a->no_progress, "No progress bar");
  sub->add_option(
      "--machine-check", a->machine_check,
      "auto|on|off: measure a few of the experiment's profile rows again first and refuse a machine that "
      "differs at every thread count of the experiment; thread counts off while another is within are "
      "deferred (measured only where the probe finds the machine back; --resume later) (auto: on with --device cuda)");
  sub->add_option("--machine-probe", a->machine_probe,
                  "auto|on|off: before each configuration, measure how much slower the machine is than the profile at "
                  "its thread count (about a second; rows' machine_slowdown; auto: on with --device cuda)");
  sub->add_option("--calm", a->calm,
                  "With the machine probe: a configuration probed more than this fraction slower than the profile "
                  "(0.3: 1.3x) waits 15 s and is probed again, up to 3 times, before it is measured (0: never wait)");
  sub->add_option("--machine-tolerance", a->machine_tolerance,
                  "The factor --machine-check allows either way, as a fraction (0.2)");
  sub->callback([a] { run_sweep_verb(*a); });
}

}  // namespace shardwise::cli

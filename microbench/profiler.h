// microbench/profiler.h — `shardwise profile`: measures this machine's kernels (the executor's own CPU
// and CUDA kernels), copies and DRAM bandwidth, alone and under PCIe / DRAM contention, over a grid
// of model-family shapes, token counts and thread counts, and returns a fitted ProfileDB; and
// validates a profile on cases its grid never saw (other models' shapes, other token counts, a
// longer context), reporting predicted against measured per op class.
//
// Good practice followed: weight sets larger than the last-level cache where DRAM is the point,
// rotated; random non-zero data of each dtype; a warm-up run, then repeats until enough time has
// passed; the median and the spread (max - min) / median recorded; noisy points re-run once.
// Expensive points are skipped adaptively (a shape's larger token counts once one repeat exceeds the
// per-point limit): the fit extrapolates there. Nothing here plans.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/profile_db.h"

namespace shardwise {

struct ProfileOptions {
  std::vector<int> threads;                         // empty: {1, all hardware threads}
  std::vector<double> pcie_caps_bytes_per_s = {0};  // 0 = none
  bool quick = false;                               // a small grid (~30 s), for tests and CPU-only demos
  std::string device = "auto";                      // auto | cuda | cpu
  bool progress = true;                             // bar with ETA on stderr
  std::string git_rev;                              // recorded in the profile
  // --validate --rescore: the measured times of an earlier validation, by (class, case) — and its
  // CPU cases under copy traffic with the copy rate they ran under. The predictions are made again
  // (e.g. by a changed cost model) and nothing is measured; cases without a recorded time are left out.
  struct Recorded {
    std::map<std::pair<std::string, std::string>, double> cases, contention;
    double contention_gbps = 0;
  };
  std::optional<Recorded> recorded;
};

ProfileDB run_profile(const ProfileOptions& options);

// The first run of a grid point, as the adaptive skipping judges it: a run over limit_ms is run
// again and the faster of the two counts. A shape's first launch can load a library kernel lazily
// (cuBLAS took 68 ms for its first 16-token f16 GEMM on the H200: that single run stood in the
// profile for ~20 µs, and every tier above 4 tokens was planned as chunks of 4).
double first_run_ms(const std::function<double()>& once, double limit_ms);

// Predicted against measured, per case and per op class.
struct ValidationCase {
  std::string op_class;  // e.g. "cpu matmul q4_0 t16", "gpu attention"
  std::string label;     // shape and token count
  double predicted_ms = 0, measured_ms = 0;
  double rel_error() const;  // |predicted - measured| / measured
};
struct ValidationClass {
  std::string op_class;
  int cases = 0;
  double median_error = 0, p90_error = 0;
};
struct ValidationReport {
  std::vector<ValidationCase> cases;
  std::vector<ValidationClass> classes;  // per backend x op kind
  ValidationClass all_cpu, all_gpu;
  // CPU shards measured while the copy engines stream (the hybrid schedules' condition), predicted
  // with and without the profile's contention rows.
  std::vector<ValidationCase> contention_with, contention_without;
  double contention_median_with = 0, contention_median_without = 0;
  double contention_gbps = 0;  // the copy rate the contention cases ran under
  std::string text() const;    // the printed table
};

// Measures the validation cases on this machine with the profile's thread counts and predicts them
// from `db`. The cases must not be in the profile's grid (checked: an Error if one is).
ValidationReport validate_profile(const ProfileDB& db, const ProfileOptions& options);

// Is this the machine the profile describes? Re-measures, with the profiler's own runner and
// policy, a few of the profile's rows: DRAM read bandwidth and, per thread count, the f16 matmul at
// one token over the largest matrix (DRAM-bound) and at the largest token count measured in under
// 300 ms (compute-bound). A few seconds. Two GPU machines of one kind can differ (the planner-accuracy
// study once ran its CPU work 1.3-1.9x slower than the profile's machine, rows of the same
// configurations measured on the profile's machine did not): rows measured on another machine test
// the machine, not the planner.
struct MachineCheckRow {
  std::string what;  // "dram read t16", "cpu matmul f16 5120x4096 t1 x1"
  int threads = 1;
  double profile_value = 0, measured_value = 0;
  bool is_rate = false;  // GB/s (higher is faster), else milliseconds
  // How much slower this machine is than the profile's (< 1: faster).
  double slowdown() const;
};
struct MachineCheck {
  std::vector<MachineCheckRow> rows;
  // Per thread count, the geometric mean of its rows' slowdowns (one row can be off on the profile's
  // own machine: a one-thread matmul grid sat 17-40% from its validation a minute later);
  // the largest and smallest of those means.
  std::map<int, double> slowdown_by_threads;
  // Thread counts measured a second time because their first mean was outside the tolerance, with
  // that first mean; their rows and slowdown_by_threads hold the second measurement.
  std::map<int, double> first_slowdown_by_threads;
  double max_slowdown = 1, min_slowdown = 1;
  // Where the profile's machine and this one differ by name (hardware_difference below); empty when
  // they match. The rows measure the CPU alone: two GPU machines whose CPUs run alike can carry
  // different GPUs (an H100 and an H200 host), which only the names tell apart.
  std::string hardware_difference;
  // Same hardware by name, and every thread count's mean within a factor of (1 + tolerance) of the
  // profile, either way.
  bool within(double tolerance) const;
  std::string text() const;
};
// A thread count whose mean is outside the tolerance is measured once more after a pause and judged
// by that second measurement: on the profile's own machine one row ran 1.53x slow a minute after the
// profile and within 10% ten minutes later, where a
// different machine differs both times. tolerance <= 0: one measurement.
// compare_gpu: also compare the profile's GPU with this machine's first (the sweep on the GPU).
MachineCheck check_machine(const ProfileDB& db, double tolerance = 0, bool compare_gpu = false);

// This machine by name, as a profile records it (CPU model, cores, ISA, DRAM; with `with_gpu` and a
// GPU present, the first GPU's name, driver and memory). Measures nothing.
MachineFingerprint this_machine(bool with_gpu);

// What differs by name between a profile's machine and `here`: the CPU model, and the GPU's name when
// both name one (a profile without a GPU, or a check without one, compares the CPU alone). Empty when
// nothing does; else one phrase naming both sides ("GPU 'NVIDIA H100 80GB HBM3' here, 'NVIDIA H200' in
// the profile").
std::string hardware_difference(const MachineFingerprint& profile, const MachineFingerprint& here);

// The check's rows at one thread count, measured once with fewer repeats (about a second), by a
// runner kept between calls: the oracle probes the machine before each configuration, because the
// machine's CPU speed drifts within minutes. `db` must
// outlive the probe.
class MachineProbe {
 public:
  explicit MachineProbe(const ProfileDB& db);
  ~MachineProbe();
  MachineProbe(const MachineProbe&) = delete;
  MachineProbe& operator=(const MachineProbe&) = delete;
  // Geometric mean of the rows' slowdowns against the profile at `threads` (> 1: this machine is
  // slower now); 0 when the profile has no rows at that thread count.
  double slowdown(int threads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwise

// oracle/sweep_common.h — what the oracle's sweeps share (the language model's, sweep.h, and the vision
// encoder's, vision_sweep.h): the experiment's cost model and what rows record of it, the checks of a
// results file before writing to it, and the record that ends a call.
#pragma once

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "engine/cost_source.h"
#include "oracle/experiment.h"
#include "oracle/results.h"
#include "oracle/sweep.h"

namespace shardwise {

// The experiment's cost model (engine: a measured profile, with the hardware datasheet standing in for
// the GPU of a CPU-only profile, or the hardware datasheet), and what rows record of it.
struct SweepCost {
  CostSource source;
  std::string name;  // for messages

  explicit SweepCost(const Experiment& e) : source(MachineChoice{e.hardware_path, std::nullopt, e.profile_path}) {
    name = source.measured() ? str_cat("profile ", e.profile) : source.datasheet()->name;
    if (source.measured()) db_hash_ = profile_hash(*source.profile());
  }
  const CostModel& make(double pcie_cap_bytes_per_s) const { return source.at_cap(pcie_cap_bytes_per_s); }
  // The identity of the cost model's inputs for rows (see sweep.h): the datasheet path is unchanged;
  // a profile is its content hash (plus the datasheet standing in for a missing GPU) and the cap.
  std::string hash(const Experiment& e, double pcie_cap_bytes_per_s) const {
    if (!source.measured()) return profile_hash(e.hardware_path, pcie_cap_bytes_per_s);
    std::string text = "profile:" + db_hash_;
    if (source.datasheet()) text += "\ngpu_fallback:" + profile_hash(e.hardware_path, 0);
    return fnv1a_hex(str_cat(text, "\npcie_cap_bytes_per_s=", std::llround(pcie_cap_bytes_per_s)));
  }
  // Uncapped host-to-device rate (GB/s), for the running-time estimate.
  double pcie_h2d_gbps() const { return make(0).pcie_gbps(Direction::HostToDevice); }

 private:
  std::string db_hash_;
};

// Opens the results file of options.out_path for appending (ResultsWriter) and reads what it holds:
// refused (Error) when it holds results and options.resume is off, when a sweep of another experiment
// wrote it, or when its rows come from another revision (git_rev) or device.
ExistingResults open_sweep_results(const SweepOptions& options, const Experiment& e, const std::string& git_rev,
                                   std::unique_ptr<ResultsWriter>* writer);

// A measured row's keys from its samples: status "measured", the median, spread, min, max, the samples
// and warm-ups and their count.
void add_samples(nlohmann::json& j, const Measurement& m);

// The "sweep_end" record of a call: its counts, whether the shard is complete (`present` of its rows are
// in the file) and whether time stopped it.
nlohmann::json sweep_end_record(const Experiment& e, const SweepOptions& options, const SweepResult& r, int present);

}  // namespace shardwise

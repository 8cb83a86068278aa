// oracle/sweep_cost.h — what the oracle's sweeps share (the language model's, sweep.h, and the vision
// encoder's, vision_sweep.h): the experiment's cost model and what rows record of it.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"
#include "engine/cost_source.h"
#include "oracle/experiment.h"
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

}  // namespace shardwise

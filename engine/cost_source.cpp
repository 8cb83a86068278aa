// engine/cost_source.cpp — see cost_source.h.
#include "engine/cost_source.h"

#include <cmath>

#include "core/error.h"

namespace shardwise {

CostSource::CostSource(const MachineChoice& choice) : profile_path_(choice.profile) {
  const bool has_hw = choice.hw_spec.has_value() || !choice.hw.empty();
  auto datasheet = [&] { return choice.hw_spec ? *choice.hw_spec : resolve_hardware(choice.hw); };
  if (choice.profile.empty()) {
    if (!has_hw) fail("no machine to plan for: give a hardware datasheet or a measured profile");
    hw_ = datasheet();
    return;
  }
  db_ = load_profile(choice.profile);
  if (!has_hw) return;
  if (db_->has_gpu()) {
    note_ =
        str_cat(choice.hw_option, " ", choice.hw_spec ? choice.hw_spec->name : choice.hw, " is not used: the profile ",
                choice.profile, " has GPU rows (", choice.profile_option, " takes precedence)");
  } else {
    hw_ = datasheet();  // stands in for the GPU the profile did not measure
  }
}

const CostModel& CostSource::at_cap(double pcie_cap_bytes_per_s) const {
  std::unique_ptr<CostModel>& m = models_[std::llround(pcie_cap_bytes_per_s)];
  if (m) return *m;
  if (!db_) {
    m = make_analytic_cost_model(*hw_, pcie_cap_bytes_per_s);
  } else {
    MeasuredOptions mo;
    mo.pcie_cap_bytes_per_s = pcie_cap_bytes_per_s;
    mo.gpu_fallback = datasheet();
    m = make_measured_cost_model(*db_, mo);
  }
  return *m;
}

std::string CostSource::label() const {
  if (!db_) return hw_->name;
  const auto slash = profile_path_.find_last_of('/');
  return slash == std::string::npos ? profile_path_ : profile_path_.substr(slash + 1);
}

}  // namespace shardwise

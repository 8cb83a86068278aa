// cli/machine_check.cpp — see machine_check.h.
#include "cli/machine_check.h"

#include <cmath>

#include "core/error.h"

namespace shardwise::cli {

nlohmann::json machine_check_json(const MachineCheck& mc, const std::string& profile_path, double tolerance) {
  auto rows = nlohmann::json::array();
  for (const MachineCheckRow& r : mc.rows)
    rows.push_back({{"what", r.what},
                    {"threads", r.threads},
                    {"unit", r.is_rate ? "GB/s" : "ms"},
                    {"profile", r.profile_value},
                    {"here", r.measured_value},
                    {"slowdown", r.slowdown()}});
  return {{"profile", profile_path},
          {"rows", rows},
          {"max_slowdown", mc.max_slowdown},
          {"min_slowdown", mc.min_slowdown},
          {"tolerance", tolerance},
          {"same_machine", mc.within(tolerance)}};
}

void require_same_machine(const MachineCheck& mc, const std::string& profile_path, double tolerance,
                          const std::string& what_to_do) {
  if (mc.within(tolerance)) return;
  const MachineCheckRow* worst = nullptr;
  for (const MachineCheckRow& r : mc.rows)
    if (!worst || std::fabs(std::log(r.slowdown())) > std::fabs(std::log(worst->slowdown()))) worst = &r;
  const double f = worst->slowdown();
  fail("machine check: this machine is ", f >= 1 ? f : 1 / f, "x ", f >= 1 ? "slower" : "faster", " than ", profile_path,
       "'s on ", worst->what, " (", worst->measured_value, " ", worst->is_rate ? "GB/s" : "ms", " here, ",
       worst->profile_value, " in the profile; tolerance ", tolerance * 100, "%): ", what_to_do);
}

}  // namespace shardwise::cli

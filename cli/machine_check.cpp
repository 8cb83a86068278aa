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
  auto by_threads = nlohmann::json::object();
  for (const auto& [t, g] : mc.slowdown_by_threads) by_threads[std::to_string(t)] = g;
  auto first = nlohmann::json::object();
  for (const auto& [t, g] : mc.first_slowdown_by_threads) first[std::to_string(t)] = g;
  return {{"profile", profile_path},
          {"first_slowdown_by_threads", first},
          {"rows", rows},
          {"slowdown_by_threads", by_threads},
          {"max_slowdown", mc.max_slowdown},
          {"min_slowdown", mc.min_slowdown},
          {"tolerance", tolerance},
          {"hardware_difference",
           mc.hardware_difference.empty() ? nlohmann::json(nullptr) : nlohmann::json(mc.hardware_difference)},
          {"same_machine", mc.within(tolerance)}};
}

void require_same_machine(const MachineCheck& mc, const std::string& profile_path, double tolerance,
                          const std::string& what_to_do) {
  if (mc.within(tolerance)) return;
  if (!mc.hardware_difference.empty())
    fail("machine check: ", profile_path, " describes another machine (", mc.hardware_difference, "): ", what_to_do);
  int threads = 0;
  double f = 1;
  for (const auto& [t, g] : mc.slowdown_by_threads)
    if (std::fabs(std::log(g)) > std::fabs(std::log(f))) threads = t, f = g;
  std::string rows;
  for (const MachineCheckRow& r : mc.rows)
    if (r.threads == threads) rows += str_cat(rows.empty() ? "" : ", ", r.what, " ", r.slowdown(), "x");
  const auto first = mc.first_slowdown_by_threads.find(threads);
  const std::string twice =
      first == mc.first_slowdown_by_threads.end() ? "" : str_cat(", and ", first->second, "x when first measured");
  fail("machine check: this machine is ", f >= 1 ? f : 1 / f, "x ", f >= 1 ? "slower" : "faster", " than ",
       profile_path, "'s at ", threads, " thread", threads == 1 ? "" : "s", " (", rows, twice, "; tolerance ",
       tolerance * 100, "%): ", what_to_do);
}

}  // namespace shardwise::cli

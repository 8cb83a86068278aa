// cli/machine_check.h — the CLI's side of microbench's check_machine: its JSON form (recorded in a
// sweep's header and printed by `profile --check`) and the one-line refusal when this machine is not
// the profile's. Measures nothing itself.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "microbench/profiler.h"

namespace shardwise::cli {

nlohmann::json machine_check_json(const MachineCheck& mc, const std::string& profile_path, double tolerance);

// Fails (one line and what to do) on another machine by name (the check's hardware_difference), and
// unless every row is within a factor of 1 + tolerance of the profile (naming the row furthest off, the
// factor and the tolerance). `what_to_do` ends the message.
void require_same_machine(const MachineCheck& mc, const std::string& profile_path, double tolerance,
                          const std::string& what_to_do);

}  // namespace shardwise::cli

// executor/runtime/timeline_trace.h — writes a Runtime's recorded plan runs (RuntimeOptions::timeline_runs,
// Runtime::record_timeline) as a Chrome trace (chrome://tracing, Perfetto): per run one process of the
// measured actions and one of the planner's simulated timeline of the same plan ("run N: tier T, SCHEDULE
// (measured)" / "(predicted)"), one thread per resource; scripts/analysis/timeline_gap.py reads it. Used by
// `run --timeline` and `sweep --timelines`. It only formats what the runtime recorded: it never runs a step.
#pragma once

#include <string>

#include "executor/runtime/runtime.h"

namespace shardwise {

// Writes the trace to `path` and returns a one-line summary (per run: measured / predicted / host enqueue
// done, ms). Errors name `option` (the flag that asked for the file) and the path.
std::string write_timeline_trace(const Runtime& rt, const std::string& path, const std::string& option);

}  // namespace shardwise

// oracle/vision_sweep.h — the oracle for a vision-language model's encoder (an experiment with `images`,
// experiment.h): for every model × budget × image size, the encoder's plans the planner chooses among are
// priced by the cost model and run for real on the device within the budget — each encode timed after
// warm-up until the spread is small (MeasureSettings), with the device's measured peak — and written one
// JSONL row per (configuration, schedule) in the language sweep's results format (results.h: the row's
// tier is the image's patch count, `part` is "vision"). The schedules:
//   gpu-only  every block resident (feasible where they all fit);
//   partial   two slots the other blocks stream through, and as many resident blocks as fit beside them,
//             at most depth - 2 (feasible where at least one does; else it is `streamed`);
//   streamed  every block through the two slots (the least memory).
// The planner's own plan (plan_vision_encoder) is gpu-only where it fits, else partial, else streamed:
// that row is `chosen`. Each row says whether the device's peak stayed within the budget. Resumable and
// time-boxed like the language sweep, with the same options (out_path, resume, max_minutes, device,
// predict_only, progress, shards).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oracle/experiment.h"
#include "oracle/sweep.h"

namespace shardwise {

struct VisionConfiguration {
  int index = 0;
  // make_config_id of the weights with the image size appended ("DIR?image=1920x1080"), the budget, and
  // no context, threads or cap.
  std::string config_id;
  int model = 0;  // index into Experiment::models
  std::string model_name, weights, open_path;
  std::string budget_text;
  uint64_t budget_bytes = 0;
  ExperimentImage image;
};

// models × budgets × images minus the exclusions, model outermost (each model is loaded once).
std::vector<VisionConfiguration> expand_vision_configurations(const Experiment& e,
                                                              std::vector<std::string>* dropped = nullptr);

// Runs (or with predict_only, plans) the sweep of a vision experiment (e.vision()). Messages go to stderr.
SweepResult run_vision_sweep(const Experiment& e, const SweepOptions& o);

}  // namespace shardwise

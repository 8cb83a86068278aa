// engine/run_setup.cpp — see run_setup.h.
#include "engine/run_setup.h"

#include "core/error.h"
#include "executor/model/cpu_model.h"

namespace shardwise {

std::unique_ptr<Device> make_run_device(const std::string& device) {
  if (device == "cuda") return make_cuda_device(0);
  if (device != "emu") fail("device '", device, "' cannot run a plan (cuda or emu)");
  EmuOptions eo;
  eo.max_delay_us = 0;  // no artificial delays for real runs
  return make_emu_device(eo);
}

LoadedModel::LoadedModel(const WeightSource& src, int threads)
    : source(src), pool(threads), weights(ModelWeights::from_source(src)) {}

RunSetup::RunSetup(LoadedModel& model, const RunSetupOptions& options, const std::vector<int32_t>& prompt) {
  if (options.device == "cpu") {
    engine_ = std::make_unique<CpuEngine>(model.weights, model.pool, options.ctx, options.runtime.slots);
    return;
  }
  PlanTable table = options.table ? *options.table : plan(model, options, prompt);
  device_ = make_run_device(options.device);
  auto rt =
      std::make_unique<Runtime>(model.source, model.weights, *device_, model.pool, std::move(table), options.runtime);
  runtime_ = rt.get();
  engine_ = std::move(rt);
}

RunSetup::~RunSetup() {
  engine_.reset();  // the runtime before the device it runs on
  device_.reset();
}

PlanTable RunSetup::plan(LoadedModel& model, const RunSetupOptions& options, const std::vector<int32_t>& prompt) {
  const CostSource source(options.machine);
  const CostModel& cost = source.at_cap(options.pcie_cap_bytes_per_s);
  PlannerChoices choices = options.planner;
  choices.ctx = options.ctx;
  choices.threads = model.pool.size();
  choices.sequences = options.runtime.slots;
  const PlannerConfig cfg = planner_config(model.weights.spec, choices, facts_of(model.source, model.source.origin()));
  PlannedTable planned =
      plan_table(model.weights.spec, cost, cfg, choices.next_layer_hits, options.pcie_cap_bytes_per_s,
                 [&] { return measure_guess_on_prompt(model.weights, model.pool, prompt); });
  next_layer_hits_ = planned.config.next_layer_hits;
  return std::move(planned.table);
}

}  // namespace shardwise

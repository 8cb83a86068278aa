// engine/run_setup.cpp — see run_setup.h.
#include "engine/run_setup.h"

#include <chrono>

#include "core/error.h"
#include "core/size.h"
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

RunSetup::RunSetup(LoadedModel& model, const RunSetupOptions& options, const std::vector<int32_t>& prompt)
    : model_(model), options_(options), probe_(prompt) {
  if (options.device == "cpu") {
    engine_ = std::make_unique<CpuEngine>(model.weights, model.pool, options.ctx, options.runtime.slots,
                                          options.planner.kv_dtype);
    return;
  }
  PlanTable table = options.table ? *options.table : plan(model, options, prompt);
  device_ = make_run_device(options.device);
  start_runtime(std::move(table));
}

DType RunSetup::kv_dtype() const {
  return runtime_ ? parse_dtype(runtime_->table().kv_dtype) : options_.planner.kv_dtype;
}

void RunSetup::start_runtime(PlanTable table) {
  auto rt = std::make_unique<Runtime>(model_.source, model_.weights, *device_, model_.pool, std::move(table),
                                      options_.runtime);
  runtime_ = rt.get();
  engine_ = std::move(rt);
}

BudgetChange RunSetup::change_budget(uint64_t budget) {
  SW_CHECK(runtime_ != nullptr, "the budget of a CPU run cannot change: it has no device");
  SW_CHECK(!options_.table, "this run executes a saved plan table (--plan), whose budget is fixed");
  BudgetChange c;
  c.previous_bytes = runtime_->table().budget_bytes;
  c.budget_bytes = budget;
  auto t0 = std::chrono::steady_clock::now();
  RunSetupOptions next = options_;
  next.planner.budget_bytes = budget;
  PlanTable table = plan(model_, next, probe_);  // throws with the old runtime untouched
  c.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  PlanTable old = runtime_->table();
  engine_.reset();
  runtime_ = nullptr;
  device_->release_arena();
  try {
    start_runtime(std::move(table));
  } catch (const std::exception& e) {  // e.g. the GPU cannot provide the new arena: back to the old one
    device_->release_arena();
    start_runtime(std::move(old));
    fail("a budget of ", format_bytes(budget), " could not be set up (", e.what(), "); the budget stays ",
         format_bytes(c.previous_bytes));
  }
  options_.planner.budget_bytes = budget;
  c.setup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  c.device_peak_bytes = runtime_->memory().device_peak_bytes;
  return c;
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

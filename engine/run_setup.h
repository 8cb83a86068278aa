// engine/run_setup.h — a model made ready to generate: its weights loaded with the CPU pool that runs
// them, then on a device the plan table (planned, or a saved one), the device and the Runtime that
// executes the table, or on the CPU the CPU engine. `run` uses it; the sweep makes its devices here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "engine/cost_source.h"
#include "engine/planning.h"
#include "executor/device/device.h"
#include "executor/model/model_weights.h"
#include "executor/runtime/runtime.h"
#include "executor/session/step_engine.h"

namespace shardwise {

// "cuda" (GPU 0) or "emu" (the emulated device, without the artificial delays its tests use).
std::unique_ptr<Device> make_run_device(const std::string& device);

// A model's weights as the kernels read them (the source, mapped, must outlive it), and the pool.
struct LoadedModel {
  LoadedModel(const WeightSource& source, int threads);
  const WeightSource& source;
  ThreadPool pool;
  ModelWeights weights;
};

struct RunSetupOptions {
  std::string device = "cpu";      // "cuda", "emu" or "cpu"
  int64_t ctx = 0;                 // the KV capacity
  std::optional<PlanTable> table;  // a saved table to execute instead of planning (a device run)
  MachineChoice machine;           // the planner's cost model
  double pcie_cap_bytes_per_s = 0;
  // The planner's choices; ctx and threads are the run's (the model's pool). planner.kv_dtype is the
  // CPU engine's cache type too.
  PlannerChoices planner;
  RuntimeOptions runtime;  // runtime.slots: sequences at once, on the CPU too (ctx shared by them)
};

// What a budget change did (RunSetup::change_budget).
struct BudgetChange {
  uint64_t previous_bytes = 0, budget_bytes = 0;
  double plan_ms = 0;              // planning the new table
  double setup_ms = 0;             // the old runtime and arena gone, the new ones set up (pinned shards uploaded)
  uint64_t device_peak_bytes = 0;  // device memory the new arena's set-up took (the arena, and no more)
};

class RunSetup {
 public:
  // On the CPU: the CPU engine. On a device: the table (options.table, or planned from the model's
  // facts with the routing policy, the guess measured on `prompt`), the device, the Runtime.
  RunSetup(LoadedModel& model, const RunSetupOptions& options, const std::vector<int32_t>& prompt);
  ~RunSetup();
  RunSetup(const RunSetup&) = delete;
  RunSetup& operator=(const RunSetup&) = delete;

  // On a device: plans the table for a new budget (every other choice as set up), then replaces the
  // runtime: the old one and its arena go before the new arena is allocated, so device memory never
  // holds both. The weights stay loaded and pinned; every slot's cache is empty afterwards (engine()
  // is a new engine). Throws Error with the old budget's runtime set up again when the new budget
  // cannot be planned or allocated, or for a saved --plan table (its budget is fixed).
  BudgetChange change_budget(uint64_t budget);

  StepEngine& engine() { return *engine_; }
  Runtime* runtime() const { return runtime_; }  // null on the CPU
  const Device* device() const { return device_.get(); }
  double next_layer_hits() const { return next_layer_hits_; }  // what the plans were told (0: no guesses)
  // The KV cache's element type: the plan table's on a device, options.planner.kv_dtype on the CPU.
  DType kv_dtype() const;

 private:
  PlanTable plan(LoadedModel& model, const RunSetupOptions& options, const std::vector<int32_t>& prompt);

  void start_runtime(PlanTable table);

  LoadedModel& model_;
  RunSetupOptions options_;
  std::vector<int32_t> probe_;      // the routing guess's tokens
  std::unique_ptr<Device> device_;  // declared before the engine: the runtime synchronises it when destroyed
  std::unique_ptr<StepEngine> engine_;
  Runtime* runtime_ = nullptr;
  double next_layer_hits_ = 0;
};

}  // namespace shardwise

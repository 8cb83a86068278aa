// tests/runtime_suite.h — the plan runtime's behaviour, written once and run on any Device: every
// schedule reproduces the CPU engine's logits with the arena and the device within the budget, over
// streamed weights, attention staged over host caches, MoE layers split between CPU and GPU,
// speculative expert copies, CUDA graphs, schedule and tier switches, device routing and an LM head
// in row pieces. tests/unit/executor/test_runtime.cpp runs it on the emulated device and
// tests/gpu/test_gpu_runtime.cpp on CUDA, each with its own models and planner settings; what only one
// device can show (random queue delays, dropped waits, the PCIe cap, a fresh process) stays in those
// files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "executor/device/device.h"
#include "executor/model/model_weights.h"
#include "executor/runtime/runtime.h"
#include "executor/session/step_engine.h"
#include "planner/planner.h"

namespace shardwise::test {

// Where the suite runs: a device and the planner settings of its plan tables.
struct RuntimeTarget {
  std::string name;
  // A fresh device. The options drive the emulated device's queues (random delays, unequal speeds);
  // other devices ignore them.
  std::function<std::unique_ptr<Device>(const EmuOptions&)> device;
  std::string hardware;  // the analytic cost model's builtin hardware
  int64_t ctx = 64;
  int threads = 2;  // the planner's CPU threads
  std::vector<int64_t> tiers;
  // What a budget fraction is a fraction of: the source's weight bytes, or the spec's bytes.
  bool fraction_of_source = false;
  // The device takes memory in granules of this many bytes (CUDA's driver: 2 MiB): its peak may reach
  // the budget rounded up to a granule, and no more.
  uint64_t device_granule = 1;
  // The plan tables' KV cache type (a SuiteModel's CPU engine must keep the same for an exact match).
  DType kv_dtype = DType::F32;
  // The device runs the CPU's own kernels (the emulated device): the schedule checks then require the
  // CPU engine's greedy tokens as well as its logits within 1e-4.
  bool same_tokens = false;
  RuntimeTarget with_ctx(int64_t c) const {
    RuntimeTarget t = *this;
    t.ctx = c;
    return t;
  }
  RuntimeTarget with_kv_dtype(DType kv) const {
    RuntimeTarget t = *this;
    t.kv_dtype = kv;
    return t;
  }
};

// The emulated device's options as test files write them: seed, largest random delay (µs), dropped wait.
EmuOptions emu(uint64_t seed, int max_delay_us, int drop_wait = 0);

// A small model of each family (8 heads of 32, 2 KV heads, 4 layers, vocabulary 512; qwen3_moe: 8
// experts, 2 per token) big enough that small budgets force every kind of placement.
ModelSpec suite_spec(const char* family, DType dt);
// Token ids of a step sequence, spread over the vocabulary by seed.
std::vector<int32_t> token_seq(int n, int64_t vocab, uint32_t seed);
// Last-token logits after each step of `steps` (token counts).
std::vector<float> run_steps(StepEngine& engine, const std::vector<int32_t>& toks, const std::vector<int>& steps);

// A model of the suite: its weights, the tokens of its steps, and the CPU engine's logits after each step
// (over a KV cache of kv_dtype).
struct SuiteModel {
  std::unique_ptr<WeightSource> src;
  ModelWeights w;
  std::vector<int32_t> tokens;
  std::vector<int> steps;
  std::vector<float> ref;
  int64_t vocab() const { return src->spec().vocab_size; }
};
SuiteModel suite_model(std::unique_ptr<WeightSource> src, int64_t ctx, const std::vector<int>& steps,
                       uint32_t token_seed, ThreadPool& pool, int n_tokens = 40, DType kv_dtype = DType::F32);

// ---- plan tables of a target ------------------------------------------------------------------------------
PlannerConfig planner_config(const RuntimeTarget& t, const WeightSource& src, uint64_t budget);
uint64_t min_budget(const RuntimeTarget& t, const WeightSource& src);
uint64_t model_bytes(const RuntimeTarget& t, const WeightSource& src);
// max(the minimum + 256 KiB, frac x the model's bytes).
uint64_t budget_at(const RuntimeTarget& t, const WeightSource& src, double frac);
PlanTable plan_table(const RuntimeTarget& t, const WeightSource& src, uint64_t budget,
                     PlannerConfig::HostKvAttention host_kv = PlannerConfig::HostKvAttention::Choose);
bool feasible_somewhere(const PlanTable& table, Schedule s);
const std::vector<Schedule>& all_schedules();
// The budget contract: the arena's peak and the device's (rounded up to its granule) within the budget.
void check_memory(const RuntimeTarget& t, const RuntimeMemory& m, uint64_t budget);
// The model's steps through a runtime on a fresh device: the CPU engine's logits within 1e-4 (and its
// greedy tokens where the target says same_tokens), memory within the budget.
void check_run(const RuntimeTarget& t, const SuiteModel& m, const PlanTable& table, const RuntimeOptions& o,
               const EmuOptions& dev, uint64_t budget, ThreadPool& pool);

// ---- the behaviours --------------------------------------------------------------------------------------

// Every feasible schedule of `schedules` on the table at `budget`, then the table's own choice per tier
// (on a device of seed + 4). Returns how many of the schedules' one-token plans copy weights.
int check_every_schedule(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget,
                         const std::vector<Schedule>& schedules, const EmuOptions& dev, ThreadPool& pool);

// One layer's KV on the device, the others' on the host, their GPU attention staged: GPU-only, Static
// and Dynamic exact. Returns how many of the schedules run staged attention somewhere.
int check_staged_attention(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                           ThreadPool& pool);

// An MoE model's table at `budget` with each CPU FFN layer split `share` of top_k experts: every split
// layer has a CPU share, a GPU share, a partial's copy and an add; Dynamic runs exactly on each device.
PlanTable check_moe_split(const RuntimeTarget& t, const SuiteModel& m, int share, uint64_t budget,
                          const std::vector<EmuOptions>& devs, ThreadPool& pool);

// A table of `sched` alone whose streamed MoE layers' experts are copied on the layer before's guess
// (Dynamic: its split layers' GPU shares); REQUIREs speculative copies.
PlanTable speculative_table(const RuntimeTarget& t, const SuiteModel& m, Schedule sched, uint64_t budget);
// One run with guesses made `mode`'s way: exact, within the budget, and the guesses counted as the mode
// makes them (hits among the routed experts; misses with the lowest logits and half of them).
RuntimeGuesses check_guesses(const RuntimeTarget& t, const SuiteModel& m, const PlanTable& table, Schedule sched,
                             RuntimeOptions::GuessTest mode, const EmuOptions& dev, uint64_t budget, ThreadPool& pool);

// A device-resident table (everything fits at `budget`): decode steps as graphs give the logits without
// graphs bit for bit. Returns the graph launches and what the plans' compute actions make expected.
struct GraphCount {
  uint64_t launches = 0, expected = 0;
};
GraphCount check_graphs(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                        ThreadPool& pool);
// Streamed weights (and for MoE the host's routing) keep every step off graphs; still exact.
void check_streaming_runs_no_graphs(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                                    ThreadPool& pool);

// One runtime switching schedules between steps (Runtime::set_schedule) stays exact and within the
// budget; what the last schedule's slots overwrote is uploaded again (expect_reuploads); back on the
// table's own choice, exact again.
void check_schedule_switching(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, bool expect_reuploads,
                              const EmuOptions& dev, ThreadPool& pool);
// A schedule without a feasible plan is refused by set_schedule, and the runtime keeps its schedule.
void check_infeasible_schedule_refused(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool);

// MoE decode tiers route on the device when every layer's experts are resident (no router-logits
// copy), the largest tier on the host; with the experts streamed, the host routes every tier. Exact.
void check_device_routing(const RuntimeTarget& t, const SuiteModel& m, const EmuOptions& dev, ThreadPool& pool);

// Dynamic plans that stream the attention of layers whose KV is in VRAM (searched over budgets) run
// exactly, as do GPU-only ones at those budgets.
void check_dynamic_streams_attention(const RuntimeTarget& t, const SuiteModel& m, const EmuOptions& dev,
                                     ThreadPool& pool);

// Everything fits: pinned weights are uploaded once across tier switches; a step past the context is
// refused, and so is a table of another model.
void check_pinned_across_tiers(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool);

// An LM head larger than the budget streams in row pieces: such plans load (a streamed shard off its
// slot's offset does not) and run exactly with each schedule that has them.
void check_lm_head_pieces(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool);

}  // namespace shardwise::test

namespace shardwise::test {

// Batched steps (StepEngine::step_batch) over three slots: prefill chunks and decode tokens of several
// sequences in one step, a sequence joining late, one cut back (truncate_slot) and continued with other
// tokens, a step larger than the largest tier. Every sequence's logits after each of its steps equal
// (within 1e-4, same argmax) those of a one-slot CPU engine stepped with that sequence alone (both over
// t's KV cache type). Runs the
// CPU engine with three slots, then a runtime per feasible schedule of `schedules` at `budget` (the
// table planned for three sequences over three times t.ctx; `staged`: one layer's KV in VRAM, the others'
// on the host, attended on the GPU staged). Returns the runtimes run.
int check_batched(const RuntimeTarget& t, const WeightSource& src, const ModelWeights& w, double budget_frac,
                  const std::vector<Schedule>& schedules, const EmuOptions& dev, ThreadPool& pool, bool staged = false);

}  // namespace shardwise::test

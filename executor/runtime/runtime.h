// executor/runtime/runtime.h — runs plans: real inference across the CPU and a device under a hard
// VRAM budget. Per step it looks up the PlanTable by new tokens (larger steps run as chunks of a tier)
// and executes that plan's action list: device work on the compute queue, weight and activation copies
// on the copy queues, CPU shards on the thread pool, joined by events as the plan's dependencies say.
// One arena of exactly the budget holds everything on the device, carved as the plan says; pinned
// shards stay resident across steps and tiers (only missing ones are uploaded). The runtime makes no
// placement decision of its own: it does what the plan says, or refuses it with a clear error.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/weight_source.h"
#include "executor/device/device.h"
#include "executor/model/cpu_blocks.h"
#include "executor/model/model_weights.h"
#include "executor/session/step_engine.h"
#include "executor/traits.h"
#include "planner/plan.h"
#include "planner/shard_layout.h"

namespace shardwise {

class KvCache;
class ThreadPool;

struct RuntimeOptions {
  std::optional<Schedule> schedule;  // run this schedule at every tier (baselines included); else the chosen one
  double pcie_cap_bytes_per_s = 0;   // 0 = no cap
  // Record when every action of `timeline_runs` plan runs from run `timeline_first` on (counted from
  // 0) started and ended (device actions by timestamps on their queue, CPU actions by the host clock):
  // `run --timeline`. Costs two timestamps per device action while recording; 0 = off. Starting past
  // the first runs records steady decode steps instead of the prefill and the first, colder ones.
  int timeline_runs = 0;
  int timeline_first = 0;
  // Plan runs [profiler_runs_begin, profiler_runs_end) run inside the device's profiler range
  // (Device::profiler_range): an external profiler that starts with recording off sees only them.
  int profiler_runs_begin = -1, profiler_runs_end = -1;
  // Decode steps (n <= kDeviceRoutingMaxTokens) of device-resident plans — every shard's weights and
  // the KV in VRAM, no CPU work but the embedding rows, no weight copies — run their GPU work as one
  // CUDA graph per step (captured each step, the executable updated in place): one launch instead of
  // one per kernel. Timeline runs are not captured (their timestamps sit between the kernels).
  // A graph holds at most kGraphMaxActions actions: the host captures the next graph while the
  // device runs the last one, instead of capturing the whole step before anything runs.
  bool cuda_graphs = false;
  // Tests of speculative expert prefetch (plan.h router_next): guess each token's experts with the
  // lowest guessed logits (Lowest: nearly every guess misses), or half of them with the highest and half
  // with the lowest (Mixed: hits and misses in one layer), instead of the router's top_k.
  enum class GuessTest { Router, Lowest, Mixed };
  GuessTest guess_test = GuessTest::Router;
  // Pin the host weights in place (Device::pin_host) so that streamed copies run at PCIe speed; off
  // leaves them pageable, where copies run several times slower (`run --no-pin-weights`, for systems
  // where pinning fails or hangs).
  bool pin_host_weights = true;
  // Sequences the KV cache holds at once (StepEngine::slots): the table's context is shared by them,
  // ctx / slots positions each. The plans must have been made for as many (PlannerChoices::sequences:
  // a step's logits rows live in their scratch).
  int slots = 1;
};
constexpr int kGraphMaxActions = 8;

// A routed expert's gate, up and down slices (g, u, d: the expert's slices of its layer's host tensors)
// into its place `blk` in a stream slot laid out as L, as few strided copies (Device::HostCopy rows) as
// their distances allow — slices of one size at one distance from each other on the host and in the place
// go as one — instead of three (fewer copies decoded GPU-only 10-13% faster, Dynamic at 2G 24%). A
// synthetic model's storage (gate, up, down back to back) gives one; llama.cpp's files (down, gate, up)
// give two (gate and up, then down).
void push_expert_copies(std::vector<Device::HostCopy>& out, uint8_t* blk, const ShardLayout& L, const TensorView& g,
                        const TensorView& u, const TensorView& d);

// One action of one plan run, measured: ms since the run began.
struct TimelineEntry {
  int run = 0;       // plan runs counted from the first step (a chunked step runs its plan several times)
  int64_t tier = 0;  // the plan's tier and schedule
  Schedule schedule = Schedule::Static;
  int action = 0;  // the action's id in that plan
  Resource resource = Resource::Cpu;
  std::string label;
  double start_ms = 0, end_ms = 0;
  // Device actions: when the host began and finished enqueuing the action (host clock, same time 0);
  // -1 for CPU actions. A device action that starts as soon as it is enqueued was waiting for the host.
  double enqueue_start_ms = -1, enqueue_end_ms = -1;
};

struct RuntimeStep {
  int64_t tokens = 0;  // new tokens of the step
  int64_t tier = 0;    // the plan's tier
  int64_t chunks = 1;  // how many runs of that plan the step took
  Schedule schedule = Schedule::Static;
  double ms = 0;
};

// Speculative expert prefetch so far (plan.h router_next): experts copied on a guess, how many of them
// the layer's routing then picked, and how many experts those layers' routing picked in all.
struct RuntimeGuesses {
  uint64_t guessed = 0, hits = 0, routed = 0;
};

struct RuntimeMemory {
  uint64_t budget_bytes = 0;
  uint64_t arena_peak_bytes = 0;   // the largest extent of the arena any executed plan used
  uint64_t device_peak_bytes = 0;  // device memory taken since the arena was allocated (§6)
  uint64_t context_bytes = 0;      // CUDA context and modules, outside the budget
  uint64_t uploaded_bytes = 0;     // pinned-shard uploads so far
};

class Runtime : public StepEngine {
 public:
  // `weights` must be arranged from `source`; the plan table must have been built for this model
  // (shard layout and dtypes are checked).
  Runtime(const WeightSource& source, const ModelWeights& weights, Device& device, ThreadPool& pool, PlanTable table,
          const RuntimeOptions& options);
  ~Runtime() override;

  const ModelSpec& spec() const override { return spec_; }
  int slots() const override { return slots_; }
  int64_t capacity() const override { return slot_capacity_; }
  int64_t n_past_of(int slot) const override;
  void step_batch(const std::vector<SeqStep>& seqs) override;
  void truncate_slot(int slot, int64_t n_past) override;
  std::string device() const override { return device_.kind(); }

  // Drops every slot's cache (positions restart at 0) without freeing anything.
  void reset() { std::fill(n_past_.begin(), n_past_.end(), 0); }
  // Slot 0's positions already cached are kept as if filled (for measuring a step at a given context).
  void set_n_past(int64_t n);
  // Writes deterministic data (|values| < 1, from `seed`) into positions [0, n) of every cache this
  // table's plans keep on the host, as a prefill would have: a step measured over set_n_past(n)
  // without a prefill would otherwise read pages never written — the kernel's shared zero page, from
  // cache instead of DRAM (CPU attention over a 16K context read ~2x faster than it runs). Device
  // caches need no fill (the arena is backed memory). Does not move n_past.
  void fill_host_cache(int64_t n, uint64_t seed);
  // Records the timelines of the next `runs` plan runs (as RuntimeOptions::timeline_runs, from the next run
  // on), dropping what was recorded before; 0 stops recording. `sweep --timelines` records one step per row
  // this way, after the row's measured repeats (recording costs timestamps the measured steps must not pay).
  void record_timeline(int runs);

  // Runs `schedule` at every tier from the next step on (nullopt: the table's choice per tier), as
  // RuntimeOptions::schedule does from the start: the oracle measures every candidate of a
  // configuration in one set-up. What stays pinned stays; the next step uploads what the new plans
  // pin and the old ones did not. Resets arena_peak_bytes and uploaded_bytes (this schedule's).
  // Errors if the schedule has no feasible plan at any tier, or if its plans keep the KV cache
  // elsewhere than this runtime's (see keeps_kv_as).
  void set_schedule(std::optional<Schedule> schedule);
  // Whether `schedule`'s plans (nullopt: the table's choices) keep each layer's KV cache where this
  // runtime keeps it. The candidates of a table share one placement; a baseline (layer-split,
  // cpu-moe) has its own, and needs a runtime of its own.
  bool keeps_kv_as(std::optional<Schedule> schedule) const;

  const PlanTable& table() const { return table_; }
  const std::vector<RuntimeStep>& steps() const { return steps_; }
  // Forgets the records of the steps after the first (a server steps without end, and the list would
  // grow by one entry per token); the first stays, so a later step is not taken for the first.
  void forget_steps() {
    if (steps_.size() > 1) steps_.resize(1);
  }
  const std::vector<TimelineEntry>& timeline() const { return timeline_; }
  RuntimeMemory memory();
  uint64_t graph_launches() const { return device_.graph_launches(); }
  RuntimeGuesses guesses() const;
  // Which plan a step of n tokens runs (and in chunks of how many tokens).
  const Plan& plan_for(int64_t n, int64_t* chunk_tokens) const;

 private:
  struct Buffers;
  class StepRun;  // one run of a plan (runtime.cpp)
  void set_up_host_staging();
  void run_plan(const Plan& plan, const int32_t* tokens, const std::vector<StepSegment>& segments,
                const std::vector<float*>& logits, const float* rows = nullptr);
  void ensure_resident(const Plan& plan);
  // The device weights a compute of layer's `kind` shard reads: only that shard's own tensors.
  DevLayer device_layer(int layer, ShardKind kind, const Plan& plan, const std::vector<uint8_t*>& shard_base) const;
  const uint8_t* host_tensor(const std::string& name, uint64_t* bytes) const;
  void copy_shard(const Shard& s, uint8_t* dst, int64_t row0, int64_t row1);
  void copy_shard_tensors(const Shard& s, uint8_t* dst, int64_t row0, int64_t row1);
  void validate_plan(const Plan& p) const;
  void validate_action(const Plan& p, const Action& a, const std::string& where,
                       const ArenaRegion* const slot_region[2], const ArenaRegion* staging,
                       const TensorView& head) const;
  // The table's file in messages, or "plan table" for one made in memory.
  std::string plan_origin() const { return table_.origin.empty() ? "plan table" : table_.origin; }
  void require_feasible(Schedule s) const;
  // Where the plans of `schedule` (nullopt: the table's choices) keep each layer's KV cache.
  const std::vector<bool>& kv_placement(std::optional<Schedule> schedule) const;
  void check_region(const uint8_t* p, uint64_t bytes, const char* what) const;
  const float* test_guess(const float* g, int64_t n, std::vector<float>& out) const;

  const WeightSource& source_;
  const ModelWeights& weights_;
  Device& device_;
  ThreadPool& pool_;
  PlanTable table_;
  RuntimeOptions options_;
  ModelSpec spec_;
  ShardSet shards_;
  std::vector<ShardLayout> layouts_;
  TensorDtypes dtypes_;
  DType kv_dtype_ = DType::F32;  // the KV caches' element type (the plan table's), host and device alike
  CpuBlocks cpu_;
  DeviceKernels* kernels_ = nullptr;
  std::unique_ptr<KvCache> host_kv_;
  uint8_t* arena_ = nullptr;
  std::map<int, int64_t> resident_;  // shard -> arena offset of its pinned copy
  std::vector<bool> kv_on_gpu_;
  bool kv_fixed_ = false;
  bool trace_ = false;  // SHARDWISE_TRACE_ACTIONS: log each action before it runs
  int slots_ = 1;
  int64_t slot_capacity_ = 0;
  std::vector<int64_t> n_past_;  // per slot
  uint64_t arena_peak_ = 0, uploaded_ = 0;
  std::vector<RuntimeStep> steps_;
  std::vector<TimelineEntry> timeline_;
  int plan_runs_ = 0;
  std::unique_ptr<Buffers> buf_;
};

// The actual storage dtypes of a source's tensors (for planning the real file).
TensorDtypes tensor_dtypes_of(const WeightSource& source);

// How many copies the runtime makes of one streamed routed expert (push_expert_copies of layer 0's
// expert 0 into the planner's layout of its FFN): 1 to 3; 3 for a model without experts. For
// executor_traits (traits.h), so that the plan times the copies the runtime makes.
int expert_copies_of(const WeightSource& source);
// The same for synthetic:SPEC weights without making them (their tensors where make_synthetic_weights
// puts them).
int synthetic_expert_copies(const ModelSpec& spec);

}  // namespace shardwise

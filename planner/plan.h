// planner/plan.h — THE CONTRACT between planner and executor (DESIGN.md §3): plain data with a
// versioned JSON round trip.
// A Plan is one schedule for one token tier: where each shard's weights live (pinned in VRAM or on
// the host), where it executes (GPU or CPU), which stream slot it uses, where each layer's KV cache
// lives, the arena layout with offsets, and one ordered action list per resource (GPU compute, H2D
// copy engine, D2H copy engine, CPU pool) with dependencies. The simulator times that list; the
// executor runs it. A PlanTable holds, for every tier, every candidate plan with its prediction and
// the chosen one; pinned shards keep their arena offsets in every tier (a canonical pinned prefix)
// and KV placement is the same in every tier, so switching tiers never re-uploads what stays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardwise {

constexpr int kPlanFormatVersion = 1;

// H2D carries weights; H2DAct the small host-to-device activation copies (a CPU shard's output going
// back to the GPU), on a queue of their own so that they never wait behind a weight copy for a later
// shard (the link is shared: both draw on one PCIe cap).
enum class Resource { GpuCompute = 0, H2D = 1, D2H = 2, Cpu = 3, H2DAct = 4 };
constexpr int kNumResources = 5;

const char* resource_name(Resource r);

enum class Schedule { GpuOnly, Static, Dynamic, LayerSplit, CpuMoe };
const char* schedule_name(Schedule s);             // "gpu-only", "static", "dynamic", "layer-split", "cpu-moe"
Schedule parse_schedule(const std::string& name);  // throws Error listing the names
// The three the planner chooses among; the two baselines are reference rows.
bool schedule_is_candidate(Schedule s);

enum class ActionKind {
  Embed,            // CPU: gather embedding rows of the step's tokens (host activations)
  Compute,          // run a shard's block (part: full / attn_pre / attn_core / attn_post) on GPU or CPU
  CopyWeights,      // H2D: a shard's weights (MoE: the routed experts) into a stream slot
  CopyActivations,  // H2D or D2H: activations between host and device
  CopyLogits,       // D2H: the step's row of logits
};
const char* action_kind_name(ActionKind k);

// attn_staged: the whole attention block on the GPU for a layer whose KV cache is on the host, over a
// copy of that cache staged in the arena (the "kv staging" region): the cached K, V go up (payload
// kv_past), the step's new K, V rows come back (kv_new). A prefill then runs every layer's attention
// on the GPU whatever the decode layout keeps on the host.
// moe_cpu_share / moe_gpu_share / moe_share_add: an MoE FFN whose routed experts are split between the
// CPU and the GPU (Dynamic): the CPU computes `cpu_experts` of each token's top_k experts from host memory
// into a partial sum (payload moe_partial goes up), while the others are copied into a stream slot and run
// on the GPU into x meanwhile (moe_gpu_share, enqueued before the CPU's share, after x went down for it);
// moe_share_add then adds the CPU's partial to x (split_routing in executor/model/moe_routing.h says which
// experts go where).
// router_next: speculative expert prefetch. On the GPU, right after layer l - 1's attention, layer l's
// router (its attention shard's, which must be on the device) applied to x as it is then, before layer
// l - 1's FFN: a guess at layer l's routing (payload router_guess goes down to the host), from which a
// CopyWeights marked `speculative` copies layer l's guessed experts (of a split layer, the GPU's share of
// them, with its cpu_experts) while layer l - 1 still runs; layer l's own CopyWeights then copies only the
// routed experts the guess missed.
enum class ComputePart {
  Full,
  AttnPre,
  AttnCore,
  AttnPost,
  AttnStaged,
  MoeCpuShare,
  MoeGpuShare,
  MoeShareAdd,
  RouterNext
};
const char* compute_part_name(ComputePart p);

// What a CopyActivations moves: the residual stream x [n, hidden]; q, k, v [n, q_dim + 2 kv_dim]
// of a split attention; its output [n, q_dim]; an MoE layer's router logits [n, experts]; a host
// cache's K and V rows [0, n_past) into the kv staging (kv_past); or the step's new K and V rows
// from it back to the host cache (kv_new, [n, 2 kv_dim]); an MoE layer's CPU share of its experts'
// weighted outputs (moe_partial, [n, hidden]); a router_next's guessed logits of its layer
// (router_guess, [n, experts]).
enum class Payload { None, Residual, Qkv, AttnOut, RouterLogits, KvPast, KvNew, MoePartial, RouterGuess };
const char* payload_name(Payload p);

struct Action {
  int id = 0;
  Resource resource = Resource::Cpu;
  ActionKind kind = ActionKind::Compute;
  ComputePart part = ComputePart::Full;
  Payload payload = Payload::None;  // CopyActivations only
  int shard = -1;                   // shard id, -1 for none
  int layer = -1;
  int slot = -1;  // stream slot of a CopyWeights (and of the Compute that reads it)
  // A piece of a shard streamed in parts (the LM head, whose rows can exceed a slot): rows
  // [row_begin, row_end) of its matrix; 0, 0 = the whole shard.
  int64_t row_begin = 0, row_end = 0;
  uint64_t bytes = 0;  // bytes moved (copies) or weight bytes read (compute)
  int copies = 1;      // CopyWeights: separate copies the bytes go as (a routed MoE FFN: 3 per expert + its norm)
  // An MoE FFN split between CPU and GPU (its CopyWeights and both share computes): how many of each
  // token's top_k routed experts the CPU computes; 0 = no split.
  int cpu_experts = 0;
  // CopyWeights of a streamed MoE FFN: the experts its layer's router_guess picks (the layer's later,
  // non-speculative CopyWeights into the same slot then copies only the routed experts still missing).
  bool speculative = false;
  double flops = 0;
  std::vector<int> deps;  // ids of earlier actions that must finish first
  std::string label;
  // Filled by the simulator:
  double start_ms = 0, end_ms = 0;
};

enum class WeightHome { Pinned, Host };
enum class ExecDevice { Gpu, Cpu };

struct ShardPlacement {
  int shard = 0;
  std::string name;
  WeightHome home = WeightHome::Host;
  ExecDevice exec = ExecDevice::Cpu;
  bool streamed = false;      // host weights copied into a slot to run on the GPU
  int64_t arena_offset = -1;  // pinned: offset of its weights; KV on the GPU: offset of the cache
  uint64_t bytes = 0;
};

struct ArenaRegion {
  std::string name;  // "pinned", "slot0", "slot1", "scratch", "kv staging" (attn_staged), "kv"
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct Plan {
  int version = kPlanFormatVersion;
  Schedule schedule = Schedule::Static;
  int64_t tier = 1;  // new tokens per step this plan is built for
  bool feasible = false;
  std::string infeasible_reason;
  uint64_t budget_bytes = 0;
  uint64_t vram_bytes = 0;  // arena bytes this plan uses (<= budget)
  double predicted_ms = 0;
  std::vector<ShardPlacement> placements;  // one per shard (embedding included, always host)
  std::vector<ArenaRegion> arena;
  std::vector<Action> actions;  // topological order; each resource runs its actions in this order
  std::vector<bool> kv_on_gpu;  // per layer
  int64_t pinned_prefix = 0;    // shards of the canonical order that are pinned
  std::string notes;            // how the schedule was chosen (e.g. Dynamic's streamed set)
};

struct TierEntry {
  int64_t tokens = 0;
  Schedule chosen = Schedule::Static;
  bool feasible = false;  // some candidate schedule fits this tier
  // > 0: steps of this tier run faster as chunks of this smaller tier (or it is infeasible).
  int64_t chunk_tokens = 0;
  std::vector<Plan> candidates;
  const Plan* find(Schedule s) const;
  const Plan& chosen_plan() const;
};

// JSON fields the executor reads: budget_bytes, ctx, kv_dtype, kv_on_gpu and the tiers (tokens,
// chosen, feasible, chunk_tokens, candidates); of a plan everything but the informational ones. Read,
// checked for type, and otherwise informational (the executor never acts on them): the table's model,
// machine, device, threads, pcie_cap_gbps, canonical_order and canonical_offsets; a plan's
// infeasible_reason, predicted_ms, pinned_prefix and notes; an action's label, flops, start_ms and
// end_ms. A field this version does not know is refused (planner/verify.h: what a plan must keep).
struct PlanTable {
  int version = kPlanFormatVersion;
  std::string origin;  // where the table was read from (not saved): named in errors
  std::string model;
  std::string machine;             // cost model description
  std::string device = "planned";  // plans are predictions: no device ran them
  uint64_t budget_bytes = 0;
  int64_t ctx = 0;
  int threads = 1;
  double pcie_cap_gbps = 0;  // 0 = none
  std::string kv_dtype = "f32";
  std::vector<int64_t> canonical_order;     // shard ids in pinned-prefix order
  std::vector<uint64_t> canonical_offsets;  // arena offset of each, in that order
  std::vector<bool> kv_on_gpu;
  std::vector<TierEntry> tiers;

  // The tier whose chosen plan runs a step of n new tokens: the smallest tier >= n (above the
  // largest tier: the largest), followed to the smaller tier it runs as chunks of when that is
  // faster or it is infeasible. If the result's tokens < n, the step runs in chunks of it.
  const TierEntry& lookup(int64_t n_tokens) const;
  const TierEntry* find_tier(int64_t tokens) const;
};

// JSON (the plan table and single plans). Throws Error naming the field on malformed input or an
// unsupported version.
std::string plan_to_json(const Plan& plan, int indent = -1);
Plan plan_from_json(const std::string& text, const std::string& context);
std::string plan_table_to_json(const PlanTable& table, int indent = -1);
PlanTable plan_table_from_json(const std::string& text, const std::string& context);

}  // namespace shardwise

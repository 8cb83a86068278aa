// cli/planner_flags.h — the planner's flags, declared once for every verb that plans (`run`, `plan`):
// the machine (--hw, --profile), the budget, context, threads, PCIe cap, KV and MoE choices, the guess
// rate, and the schedule choice. Each verb keeps its own help text where its meaning differs (run's
// --ctx defaults to the prompt's needs, run's --threads are this machine's); the values come back
// typed as the engine's options.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "costmodel/cost_model.h"
#include "engine/cost_source.h"
#include "engine/planning.h"

namespace shardwise::cli {

// Run and Serve execute on this machine (they take the same flags; --ctx's default differs); Plan plans for one.
enum class PlannerVerb { Run, Serve, Plan };

// The flags' text as given (CLI11 binds them); the accessors check and convert them.
struct PlannerFlags {
  PlannerVerb verb = PlannerVerb::Plan;
  std::string hw, profile, budget, pcie_cap = "none", kv_dtype = "f16", host_kv_attention = "choose";
  std::string next_layer_hits = "auto";
  std::string only;               // plan --only S
  std::string schedule = "auto";  // run --schedule S
  int threads = 0, kv_layers = -1, moe_split = -1;
  int64_t ctx = 4096;          // run: 0 (the prompt's needs)
  int64_t routing_tokens = 0;  // plan --routing-tokens
  uint64_t token_seed = 1;     // plan --token-seed
  CLI::Option* hw_option = nullptr;
  CLI::Option* kv_dtype_option = nullptr;
  // llama.cpp's flags (-ngl, -fa, -ctk, -ctv after cli/args.h's rewrite), kept to answer in our terms.
  std::string n_gpu_layers, flash_attn, cache_type_k, cache_type_v;
  CLI::Option *n_gpu_layers_option = nullptr, *flash_attn_option = nullptr;

  // The cost model's machine: --profile, and --hw where it is used (run's default --hw is the machine
  // only without a profile; given beside one, it may stand in for a CPU-only profile's GPU).
  MachineChoice machine() const;
  double pcie_cap_bytes_per_s() const;
  uint64_t budget_bytes() const;  // --vram-budget, checked
  NextLayerHits hits() const;
  // The schedule whose own table is planned (plan --only, run --schedule other than auto).
  std::optional<Schedule> only_schedule() const;
  // The typed choices; threads as resolved by the caller (run: this machine's; plan: the cost model's).
  PlannerChoices choices(int resolved_threads) const;
  // The KV cache type: --kv-dtype, or -ctk/-ctv (llama.cpp's names for it; given together, the three
  // must agree: K and V share one type). An error names the flag of a type `run` does not keep.
  DType kv_type() const;
  // llama.cpp's flags: -ngl and -fa have no counterpart here (an error saying what to use instead);
  // -ctk and -ctv name the KV cache type as --kv-dtype does. Called first by the verb.
  void check_llama_flags() const;
};

// The KV cache types `run` executes (f32, f16, bf16 and q8_0; a device that keeps f32 only says so).
extern const char* const kRunnableKvDtypes;
// Checks a KV cache type given as `flag`: one `run` executes (returned), else an error naming those.
DType check_kv_dtype(const std::string& text, const char* flag);
// The KV cache type of --kv-dtype (kv_dtype_given: on the command line) and llama.cpp's -ctk/-ctv (empty:
// not given); given together they must agree, K and V sharing one type. Errors name the flag.
DType resolve_kv_dtype(const std::string& kv_dtype, bool kv_dtype_given, const std::string& cache_type_k,
                       const std::string& cache_type_v);
// Declares --kv-dtype (help shown) and the hidden --cache-type-k/-v that -ctk/-ctv become (cli/args.h).
void add_kv_dtype_flags(CLI::App* sub, std::string& kv_dtype, std::string& cache_type_k, std::string& cache_type_v,
                        CLI::Option** kv_dtype_option);

// Declares the planner's flags on `sub` with their names and help as `verb` has them.
std::shared_ptr<PlannerFlags> add_planner_flags(CLI::App* sub, PlannerVerb verb);

}  // namespace shardwise::cli

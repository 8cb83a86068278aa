// cli/planner_flags.cpp — see planner_flags.h.
#include "cli/planner_flags.h"

#include <utility>

#include "cli/common.h"
#include "core/error.h"
#include "core/size.h"
#include "planner/planner.h"

namespace shardwise::cli {
namespace {

const char* const kHostKvAttentionHelp =
    "GPU attention of layers whose KV is on the host: choose (the faster), split (core on the CPU) or "
    "staged (the cache copied to the GPU)";
const char* const kKvDtypeHelp =
    "KV cache element type: f32 (exact against an f32 reference), f16 or bf16 (half the memory: K and V rounded as "
    "they are stored) or q8_0 (about a quarter: ggml's 8-bit blocks of 32, head_dim a multiple of 32); -ctk/-ctv, "
    "as llama.cpp spells them, name it too";
const char* const kMoeSplitHelp =
    "MoE, Dynamic: experts per token that the CPU computes while the GPU runs the others (copied), "
    "in each CPU FFN layer: -1 chooses (default), 0 never splits, N splits with N";

void add_run_flags(CLI::App* sub, PlannerFlags& f) {
  f.ctx = 0;
  f.hw = "h200-host";
  sub->add_option("-t,--threads", f.threads, kThreadsHelp);
  sub->add_option("-c,--ctx,--ctx-size", f.ctx,
                  f.verb == PlannerVerb::Serve
                      ? "KV capacity in tokens, at most 4194304: a request's prompt and reply together (default: 4096, "
                        "or the model's positions where fewer)"
                      : "KV capacity in tokens, at most 4194304 (default: max(4096, prompt + n))");
  sub->add_option(
      "--vram-budget", f.budget,
      "Everything the model allocates on the device (weights, KV, scratch, slots, workspaces), e.g. 4G, at most "
      "1024T (1 PiB); default on CUDA: free memory minus 1 GiB");
  sub->add_option("--schedule", f.schedule,
                  "auto (the planner's pick per tier) or gpu-only|static|dynamic|layer-split|cpu-moe")
      ->capture_default_str();
  sub->add_option("--pcie-cap", f.pcie_cap,
                  "Throttle host-device copies to this rate, 100MB/s to 1TB/s, e.g. 16GB/s, or none")
      ->capture_default_str();
  sub->add_option("--host-kv-attention", f.host_kv_attention, kHostKvAttentionHelp)->capture_default_str();
  sub->add_option("--moe-split", f.moe_split, kMoeSplitHelp);
  sub->add_option("--next-layer-hits", f.next_layer_hits,
                  "MoE: how well a layer's router, applied a layer early, guesses its experts — plans may then copy "
                  "streamed experts on that guess while the layer before runs: auto measures it on the prompt's first "
                  "tokens (a CPU pass, where a plan streams experts), off never guesses, or a fraction in (0, 1]");
  f.hw_option = sub->add_option("--hw", f.hw, "Machine the planner's cost model describes (builtin or .yaml)")
                    ->capture_default_str();
  sub->add_option(
      "--profile", f.profile,
      "Measured ProfileDB (`shardwise profile`) the planner's cost model answers from; takes precedence over --hw");
}

void add_plan_flags(CLI::App* sub, PlannerFlags& f) {
  f.hw_option = sub->add_option(
      "--hw", f.hw,
      "Machine: builtin (cli1, cli2, cli3, h200-host) or a hardware .yaml; with a CPU-only --profile, the GPU "
      "that stands in for the missing GPU rows");
  sub->add_option("--profile", f.profile, "Measured ProfileDB from `shardwise profile` (takes precedence over --hw)");
  sub->add_option("--vram-budget", f.budget,
                  "VRAM budget for everything the model allocates, e.g. 4G (at most 1024T = 1 PiB)")
      ->required();
  sub->add_option("-t,--threads", f.threads, "CPU threads of the planned machine (0 = its cores; at most 1024)");
  sub->add_option("-c,--ctx,--ctx-size", f.ctx,
                  "KV capacity in tokens, 1 to 4194304 (steps are planned with the cache full)");
  sub->add_option("--pcie-cap", f.pcie_cap, "PCIe bandwidth cap, 100MB/s to 1TB/s, e.g. 16GB/s, or none");
  sub->add_option("--kv-layers", f.kv_layers,
                  "Layers whose KV stays in VRAM (the first N; their attention is streamed where not pinned); "
                  "default -1: chosen by simulating a request");
  sub->add_option("--host-kv-attention", f.host_kv_attention, kHostKvAttentionHelp)->capture_default_str();
  sub->add_option("--moe-split", f.moe_split, kMoeSplitHelp);
  sub->add_option(
      "--routing-tokens", f.routing_tokens,
      "MoE: measure the weights' routing on N tokens (a CPU pass) and plan with it instead of uniform routing");
  sub->add_option("--next-layer-hits", f.next_layer_hits,
                  "MoE: the fraction of each layer's experts its router guesses a layer early (what --routing-tokens "
                  "measures): plans may copy streamed experts on that guess; 0 never guesses");
  sub->add_option("--token-seed", f.token_seed, "Seed of the --routing-tokens tokens (as the oracle's token_seed)")
      ->check(kUnsignedInteger);
  sub->add_option("--only", f.only,
                  "Plan the table of one schedule alone, with the layout best for it, as `run --schedule` does "
                  "(gpu-only|static|dynamic|layer-split|cpu-moe)");
}

// llama.cpp's flags, hidden from --help (check_llama_flags answers them); -fa may carry on|off|auto.
void add_llama_flags(CLI::App* sub, PlannerFlags& f) {
  f.n_gpu_layers_option = sub->add_option("--n-gpu-layers,--gpu-layers", f.n_gpu_layers)->group("");
  f.flash_attn_option = sub->add_option("--flash-attn", f.flash_attn)->expected(0, 1)->group("");
}

}  // namespace

const char* const kRunnableKvDtypes = "f32, f16, bf16, q8_0";

DType check_kv_dtype(const std::string& text, const char* flag) {
  if (text != "f32" && text != "f16" && text != "bf16" && text != "q8_0")
    fail(flag, " ", text, ": not a KV cache type `run` executes (accepted: ", kRunnableKvDtypes, ")");
  return parse_dtype(text);
}

std::shared_ptr<PlannerFlags> add_planner_flags(CLI::App* sub, PlannerVerb verb) {
  auto f = std::make_shared<PlannerFlags>();
  f->verb = verb;
  if (verb != PlannerVerb::Plan)
    add_run_flags(sub, *f);
  else
    add_plan_flags(sub, *f);
  add_llama_flags(sub, *f);
  add_kv_dtype_flags(sub, f->kv_dtype, f->cache_type_k, f->cache_type_v, &f->kv_dtype_option);
  return f;
}

void PlannerFlags::check_llama_flags() const {
  const bool run = verb != PlannerVerb::Plan;
  if (n_gpu_layers_option->count() > 0)
    fail("-ngl/--n-gpu-layers ", n_gpu_layers,
         ": shardwise takes no layer count, it places layers under a VRAM budget: give --vram-budget SIZE (the "
         "planner's choice), ",
         run ? "--schedule" : "--only",
         " layer-split --vram-budget SIZE (llama.cpp's split: as many layers as SIZE "
         "holds)",
         run ? " or --device cpu (-ngl 0)" : "");
  if (flash_attn_option->count() > 0)
    fail("-fa/--flash-attn: shardwise has no flash-attention switch (its attention kernels are fixed); drop the flag");
  kv_type();
}

DType resolve_kv_dtype(const std::string& kv_dtype, bool kv_dtype_given, const std::string& cache_type_k,
                       const std::string& cache_type_v) {
  DType t = check_kv_dtype(kv_dtype, "--kv-dtype");
  std::string chosen = kv_dtype, from = "--kv-dtype";
  bool given = kv_dtype_given;
  const std::pair<const std::string*, const char*> aliases[] = {{&cache_type_k, "-ctk/--cache-type-k"},
                                                                {&cache_type_v, "-ctv/--cache-type-v"}};
  for (const auto& [text, flag] : aliases) {
    if (text->empty()) continue;
    t = check_kv_dtype(*text, flag);
    if (given && *text != chosen)
      fail(flag, " ", *text, " differs from ", from, " ", chosen, ": K and V are kept in one type (give one of them)");
    chosen = *text;
    from = flag;
    given = true;
  }
  return t;
}

void add_kv_dtype_flags(CLI::App* sub, std::string& kv_dtype, std::string& cache_type_k, std::string& cache_type_v,
                        CLI::Option** kv_dtype_option) {
  *kv_dtype_option = sub->add_option("--kv-dtype", kv_dtype, kKvDtypeHelp)->capture_default_str();
  sub->add_option("--cache-type-k", cache_type_k)->group("");
  sub->add_option("--cache-type-v", cache_type_v)->group("");
}

DType PlannerFlags::kv_type() const {
  return resolve_kv_dtype(kv_dtype, kv_dtype_option && kv_dtype_option->count() > 0, cache_type_k, cache_type_v);
}

MachineChoice PlannerFlags::machine() const {
  MachineChoice m;
  m.profile = profile;
  const bool hw_given = hw_option && hw_option->count() > 0;
  if (profile.empty() || verb == PlannerVerb::Plan || hw_given) m.hw = hw;
  return m;
}

double PlannerFlags::pcie_cap_bytes_per_s() const {
  return parse_pcie_cap(pcie_cap, "--pcie-cap");
}

uint64_t PlannerFlags::budget_bytes() const {
  return parse_vram_budget(budget, "--vram-budget");
}

NextLayerHits PlannerFlags::hits() const {
  return parse_next_layer_hits(next_layer_hits, "--next-layer-hits");
}

std::optional<Schedule> PlannerFlags::only_schedule() const {
  if (verb != PlannerVerb::Plan) {
    if (schedule == "auto") return std::nullopt;
    return parse_schedule(schedule);
  }
  if (only.empty()) return std::nullopt;
  return parse_schedule(only);
}

PlannerChoices PlannerFlags::choices(int resolved_threads) const {
  PlannerChoices c;
  c.ctx = ctx;
  c.threads = resolved_threads;
  c.kv_dtype = kv_type();
  c.kv_layers = kv_layers;
  c.host_kv_attention = parse_host_kv_attention(host_kv_attention);
  c.moe_split = moe_split;
  c.only = only_schedule();
  c.next_layer_hits = hits();
  return c;
}

}  // namespace shardwise::cli

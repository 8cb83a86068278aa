// cli/verb_plan.cpp — `shardwise plan`: the schedule explorer. For every tier, every schedule's
// predicted step latency, tokens/s and VRAM, the chosen one marked; predicted TTFT for the context
// and decode tokens/s; --explain lists shards with placement, bytes, time and why; --trace writes a
// Chrome trace of a plan's simulated timeline; --save writes the full plan table (the executor's input).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/hardware_spec.h"
#include "core/size.h"
#include "core/log.h"
#include "costmodel/cost_model.h"
#include "costmodel/profile_db.h"
#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "oracle/sweep.h"
#include "executor/runtime/runtime.h"
#include "planner/planner.h"

namespace shardwise::cli {
namespace {

struct PlanArgs {
  std::string model, hw, profile, budget, pcie_cap = "none", kv_dtype = "f32", trace, save, schedule, tier_text, only;
  std::string host_kv_attention = "choose";
  int moe_split = -1;
  int threads = 0, kv_layers = -1;
  int64_t ctx = 4096, routing_tokens = 0;
  double next_layer_hits = -1;  // --next-layer-hits; < 0: as measured by --routing-tokens, else none
  uint64_t token_seed = 1;
  bool json = false, explain = false, brief = false;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, ": cannot create");
  out << text;
  if (!out) fail(path, ": write failed");
}

// Prefill of `ctx` tokens in chunks of one feasible tier (the fastest choice), and decode at tier 1.
void predicted_latencies(const PlanTable& t, int64_t ctx, double* ttft_ms, int64_t* chunk, double* decode_tps) {
  *ttft_ms = INFINITY;
  *chunk = 0;
  for (const auto& e : t.tiers) {
    if (!e.feasible || e.chunk_tokens > 0) continue;
    const double total = std::ceil(static_cast<double>(ctx) / static_cast<double>(e.tokens)) * e.chosen_plan().predicted_ms;
    if (total < *ttft_ms) {
      *ttft_ms = total;
      *chunk = e.tokens;
    }
  }
  const TierEntry& d = t.lookup(1);
  *decode_tps = 1000.0 / d.chosen_plan().predicted_ms;
}

// The cost model: a measured profile when given (it takes precedence over --hw, which then only
// stands in for the GPU of a CPU-only profile), else the datasheet of --hw. `label` names the machine
// in one word (--brief).
std::unique_ptr<CostModel> make_cost_model(const PlanArgs& a, double cap, std::string* label) {
  if (a.profile.empty()) {
    const HardwareSpec hw = resolve_hardware(a.hw);
    *label = hw.name;
    return make_analytic_cost_model(hw, cap);
  }
  const ProfileDB db = load_profile(a.profile);
  MeasuredOptions mo;
  mo.pcie_cap_bytes_per_s = cap;
  HardwareSpec fallback;
  if (!a.hw.empty()) {
    if (db.has_gpu()) {
      log_info("--hw ", a.hw, " is not used: the profile ", a.profile, " has GPU rows (--profile takes precedence)");
    } else {
      fallback = resolve_hardware(a.hw);
      mo.gpu_fallback = &fallback;
    }
  }
  const auto slash = a.profile.find_last_of('/');
  *label = slash == std::string::npos ? a.profile : a.profile.substr(slash + 1);
  return make_measured_cost_model(db, mo);
}

void run_plan(const PlanArgs& a) {
  if (a.hw.empty() && a.profile.empty()) fail("give --hw NAME|FILE (builtin: cli1, cli2, cli3, h200-host) or --profile FILE");
  if (a.budget.empty()) fail("give --vram-budget (e.g. 4G)");
  for (const auto& out : {std::make_pair("--save", &a.save), std::make_pair("--trace", &a.trace)})
    if (!out.second->empty()) check_output_path(*out.second, out.first);
  std::string origin;
  DType dt;
  bool has_weights;
  const ModelSpec spec = resolve_model_spec(a.model, &origin, &dt, &has_weights);
  const double cap = parse_pcie_cap(a.pcie_cap, "--pcie-cap");
  std::string machine_label;
  auto cost = make_cost_model(a, cap, &machine_label);
  PlannerConfig cfg;
  cfg.budget_bytes = parse_vram_budget(a.budget, "--vram-budget");
  cfg.ctx = a.ctx;
  cfg.threads = a.threads == 0 ? cost->max_threads() : a.threads;
  if (cfg.threads < 1 || cfg.threads > kMaxPoolThreads)
    fail("--threads ", a.threads, " is out of range: 0 (the machine's cores) or 1 to ", kMaxPoolThreads);
  cfg.kv_dtype = parse_dtype(a.kv_dtype);
  cfg.kv_layers = a.kv_layers;
  cfg.host_kv_attention = parse_host_kv_attention(a.host_kv_attention);
  cfg.moe_cpu_experts = a.moe_split;
  cfg.model_name = origin;
  // The copies `run` would make of a streamed expert: as the file lays its experts out, or (a synthetic
  // or builtin spec) as synthetic weights do.
  cfg.executor = executor_traits(spec);
  if (spec.is_moe()) cfg.executor.expert_copies = has_weights ? expert_copies_of(*open_weights(a.model)) : synthetic_expert_copies(spec);
  // One schedule's own table, as `run --schedule S` plans it (its best layout, not the mix's).
  if (!a.only.empty()) cfg.schedules = {parse_schedule(a.only)};
  if (a.routing_tokens != 0) {
    // Plan with the weights' own MoE routing, measured on the oracle's step tokens (a CPU pass).
    if (a.routing_tokens < 1 || a.routing_tokens > 16384) fail("--routing-tokens ", a.routing_tokens, " must be 1..16384");
    if (!spec.is_moe()) fail("--routing-tokens: ", a.model, " is not a mixture-of-experts model");
    if (!has_weights && a.model.rfind("synthetic:", 0) != 0)
      fail("--routing-tokens needs weights (a .gguf, an HF directory or synthetic:SPEC), not only a shape");
    auto src = open_weights(a.model);
    const ModelWeights w = ModelWeights::from_source(*src);
    ThreadPool pool(cfg.threads);
    cfg.routing_tokens = cfg.tiers;
    const std::vector<int32_t> toks = step_tokens(a.routing_tokens, spec.vocab_size, a.token_seed);
    cfg.routing_experts = measure_experts_touched(w, pool, toks, cfg.routing_tokens);
    const double next = measure_next_layer_routing(w, pool, toks);
    if (std::isfinite(next)) cfg.next_layer_hits = next;  // plans may prefetch experts on the guess
    std::string curve;
    for (size_t i = 0; i < cfg.routing_tokens.size(); ++i)
      curve += str_cat(i ? ", " : "", cfg.routing_tokens[i], ": ", cfg.routing_experts[i]);
    std::fprintf(stderr, "routing measured on %lld tokens: distinct experts per layer by step tokens {%s} of %lld\n",
                 static_cast<long long>(a.routing_tokens), curve.c_str(), static_cast<long long>(spec.num_experts));
    if (std::isfinite(next))
      std::fprintf(stderr,
                   "next layer's experts picked by its router from this layer's MoE input: %.1f%% (uniform guessing: %.1f%%)\n",
                   100.0 * next, 100.0 * static_cast<double>(spec.num_experts_per_tok) / static_cast<double>(spec.num_experts));
  }
  if (a.next_layer_hits != -1) {  // given
    if (!(a.next_layer_hits >= 0 && a.next_layer_hits <= 1)) fail("--next-layer-hits ", a.next_layer_hits, " must be a fraction in [0, 1]");
    cfg.next_layer_hits = a.next_layer_hits;
  }
  const auto t0 = std::chrono::steady_clock::now();
  PlanTable table = build_plan_table(spec, *cost, cfg);
  table.pcie_cap_gbps = cap / 1e9;
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  double ttft, tps;
  int64_t chunk;
  predicted_latencies(table, cfg.ctx, &ttft, &chunk, &tps);

  if (!a.save.empty()) write_text(a.save, plan_table_to_json(table, 1));
  int64_t focus_tier = a.tier_text.empty() ? 1 : parse_token_count(a.tier_text, "--tier");
  const TierEntry& focus = table.lookup(focus_tier);
  const Plan* focus_plan = a.schedule.empty() ? &focus.chosen_plan() : focus.find(parse_schedule(a.schedule));
  if (!focus_plan) fail("--schedule ", a.schedule, " was not planned");
  if (!a.trace.empty()) {
    if (!focus_plan->feasible) fail("--trace: the ", schedule_name(focus_plan->schedule), " plan for ", focus.tokens,
                                    " tokens is infeasible (", focus_plan->infeasible_reason, ")");
    write_text(a.trace, chrome_trace_json(*focus_plan, std::string(schedule_name(focus_plan->schedule)) + " " +
                                                           std::to_string(focus.tokens) + " tokens"));
  }

  if (a.json) {
    nlohmann::json j;
    j["model"] = origin;
    j["machine"] = table.machine;
    j["device"] = table.device;
    j["budget_bytes"] = table.budget_bytes;
    j["ctx"] = table.ctx;
    j["threads"] = table.threads;
    j["pcie_cap_gbps"] = table.pcie_cap_gbps;
    j["kv_dtype"] = table.kv_dtype;
    j["kv_layers_on_gpu"] = std::count(table.kv_on_gpu.begin(), table.kv_on_gpu.end(), true);
    j["predicted_ttft_ms"] = ttft;
    j["ttft_chunk_tokens"] = chunk;
    j["predicted_decode_tokens_per_s"] = tps;
    j["planning_ms"] = plan_ms;
    nlohmann::json tiers = nlohmann::json::array();
    for (const auto& e : table.tiers) {
      nlohmann::json c = nlohmann::json::array();
      for (const auto& p : e.candidates) {
        nlohmann::json x = {{"schedule", schedule_name(p.schedule)}, {"feasible", p.feasible},
                            {"predicted_ms", p.feasible ? p.predicted_ms : 0.0}, {"vram_bytes", p.vram_bytes}};
        if (!p.feasible) x["reason"] = p.infeasible_reason;
        else x["notes"] = p.notes;
        c.push_back(x);
      }
      tiers.push_back({{"tokens", e.tokens}, {"chosen", e.feasible ? schedule_name(e.chosen) : "none"},
                       {"feasible", e.feasible}, {"chunk_tokens", e.chunk_tokens}, {"candidates", c}});
    }
    j["tiers"] = tiers;
    print_json(j);
    return;
  }
  if (a.brief) {
    // One line: the chosen schedules' predictions next to the llama.cpp-style layer split.
    auto baseline = [&](int64_t tier) -> double {
      const TierEntry* e = table.find_tier(tier);
      const Plan* p = e ? e->find(Schedule::LayerSplit) : nullptr;
      return p && p->feasible ? p->predicted_ms : INFINITY;
    };
    const TierEntry& d = table.lookup(1);
    const TierEntry& pf = table.lookup(chunk > 0 ? chunk : 512);  // the tier the TTFT goes in chunks of
    const double ls_ttft = std::ceil(static_cast<double>(cfg.ctx) / 512.0) * baseline(512);
    std::printf("%-8s %-10s %6s  decode %7.2f t/s (%-8s) | TTFT(%lld) %9.1f ms (%-8s) | layer-split: %6.2f t/s, %9.1f ms\n",
                spec.name.c_str(), machine_label.c_str(), a.budget.c_str(), tps, schedule_name(d.chosen), (long long)cfg.ctx, ttft,
                schedule_name(pf.chosen), 1000.0 / baseline(1), ls_ttft);
    return;
  }
  std::printf("plan  %s on %s, budget %s, ctx %lld, %d threads, PCIe cap %s, KV %s (%lld of %lld layers in VRAM)\n",
              origin.c_str(), table.machine.c_str(), format_bytes(cfg.budget_bytes).c_str(), (long long)cfg.ctx,
              cfg.threads, a.pcie_cap.c_str(), table.kv_dtype.c_str(),
              (long long)std::count(table.kv_on_gpu.begin(), table.kv_on_gpu.end(), true), (long long)spec.num_hidden_layers);
  std::printf("%7s", "tier");
  for (const auto& p : table.tiers.front().candidates) std::printf(" | %-24s", schedule_name(p.schedule));
  std::printf("\n");
  for (const auto& e : table.tiers) {
    std::printf("%7lld", (long long)e.tokens);
    for (const auto& p : e.candidates) {
      char cell[64];
      if (!p.feasible) std::snprintf(cell, sizeof cell, "-");
      else
        std::snprintf(cell, sizeof cell, "%s%9.2fms %7.0ft/s %5.1fG",
                      e.feasible && e.chunk_tokens == 0 && p.schedule == e.chosen ? "*" : " ",
                      p.predicted_ms, 1000.0 * static_cast<double>(e.tokens) / p.predicted_ms,
                      static_cast<double>(p.vram_bytes) / (1u << 30));
      std::printf(" | %-24s", cell);
    }
    if (e.chunk_tokens > 0) std::printf(" -> chunks of %lld", (long long)e.chunk_tokens);
    std::printf("\n");
  }
  std::printf("* = chosen (fastest of gpu-only/static/dynamic; layer-split and cpu-moe are llama.cpp-style baselines);\n"
              "-> chunks of N: a step of this size runs faster as (or only fits as) steps of N tokens\n");
  std::printf("predicted TTFT for a %lld-token prompt: %.1f ms (chunks of %lld); decode: %.2f tokens/s; planned in %.0f ms\n",
              (long long)cfg.ctx, ttft, (long long)chunk, tps, plan_ms);
  if (a.explain) std::printf("\n%s", explain_plan(*focus_plan, spec, *cost, cfg).c_str());
}

}  // namespace

void register_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand("plan", "Plan every token tier under a VRAM budget and show the predictions");
  sub->add_option("--model", a->model, "Builtin spec name, .yaml, .gguf, HF directory or synthetic:SPEC")->required();
  sub->add_option("--hw", a->hw,
                  "Machine: builtin (cli1, cli2, cli3, h200-host) or a hardware .yaml; with a CPU-only --profile, the GPU "
                  "that stands in for the missing GPU rows");
  sub->add_option("--profile", a->profile, "Measured ProfileDB from `shardwise profile` (takes precedence over --hw)");
  sub->add_option("--vram-budget", a->budget, "VRAM budget for everything the model allocates, e.g. 4G (at most 1024T = 1 PiB)")->required();
  sub->add_option("--threads", a->threads, "CPU threads of the planned machine (0 = its cores; at most 1024)");
  sub->add_option("--ctx", a->ctx, "KV capacity in tokens, 1 to 4194304 (steps are planned with the cache full)");
  sub->add_option("--pcie-cap", a->pcie_cap, "PCIe bandwidth cap, 100MB/s to 1TB/s, e.g. 16GB/s, or none");
  sub->add_option("--kv-dtype", a->kv_dtype, "KV cache element type (f32 = exact; f16 halves its size)");
  sub->add_option("--kv-layers", a->kv_layers,
                  "Layers whose KV stays in VRAM (the first N; their attention is streamed where not pinned); "
                  "default -1: chosen by simulating a request");
  sub->add_option("--host-kv-attention", a->host_kv_attention,
                  "GPU attention of layers whose KV is on the host: choose (the faster), split (core on the CPU) or "
                  "staged (the cache copied to the GPU)")
      ->capture_default_str();
  sub->add_option("--moe-split", a->moe_split,
                  "MoE, Dynamic: experts per token that the CPU computes while the GPU runs the others (copied), "
                  "in each CPU FFN layer: -1 chooses (default), 0 never splits, N splits with N");
  sub->add_option("--routing-tokens", a->routing_tokens,
                  "MoE: measure the weights' routing on N tokens (a CPU pass) and plan with it instead of uniform routing");
  sub->add_option("--next-layer-hits", a->next_layer_hits,
                  "MoE: the fraction of each layer's experts its router guesses a layer early (what --routing-tokens "
                  "measures): plans may copy streamed experts on that guess; 0 never guesses");
  sub->add_option("--token-seed", a->token_seed, "Seed of the --routing-tokens tokens (as the oracle's token_seed)")->check(kUnsignedInteger);
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_flag("--brief", a->brief, "One line: predicted decode tokens/s and TTFT, chosen schedules, the layer-split baseline");
  sub->add_flag("--explain", a->explain, "List the shards of one plan (--tier, --schedule) with placement and why");
  sub->add_option("--trace", a->trace, "Write the Chrome trace of one plan's simulated timeline");
  sub->add_option("--tier", a->tier_text, "Tier for --explain/--trace (default 1)");
  sub->add_option("--schedule", a->schedule, "Schedule for --explain/--trace (default: the chosen one)");
  sub->add_option("--save", a->save, "Write the full plan table (JSON) for `run --plan`");
  sub->add_option("--only", a->only,
                  "Plan the table of one schedule alone, with the layout best for it, as `run --schedule` does "
                  "(gpu-only|static|dynamic|layer-split|cpu-moe)");
  sub->callback([a] { run_plan(*a); });
}

}  // namespace shardwise::cli

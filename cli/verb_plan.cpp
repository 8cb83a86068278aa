// cli/verb_plan.cpp — `shardwise plan`: the schedule explorer. For every tier, every schedule's
// predicted step latency, tokens/s and VRAM, the chosen one marked; predicted TTFT for the context
// and decode tokens/s; --explain lists shards with placement, bytes, time and why; --trace writes a
// Chrome trace of a plan's simulated timeline; --save writes the full plan table (the executor's input).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "cli/common.h"
#include "cli/planner_flags.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/size.h"
#include "engine/cost_source.h"
#include "engine/planning.h"
#include "engine/run_setup.h"
#include "engine/vision_planning.h"
#include "planner/planner.h"

namespace shardwise::cli {
namespace {

struct PlanArgs {
  std::string model, trace, save, schedule, tier_text;
  std::vector<std::string> image_sizes;  // --image-size WxH: plan a vision-language model's encoder too
  bool json = false, explain = false, brief = false;
  std::shared_ptr<PlannerFlags> planner;
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
    const double total =
        std::ceil(static_cast<double>(ctx) / static_cast<double>(e.tokens)) * e.chosen_plan().predicted_ms;
    if (total < *ttft_ms) {
      *ttft_ms = total;
      *chunk = e.tokens;
    }
  }
  const TierEntry& d = t.lookup(1);
  *decode_tps = 1000.0 / d.chosen_plan().predicted_ms;
}

// The model to plan: its spec, the name it is known by, whether weights back it.
struct PlanModel {
  ModelSpec spec;
  std::string origin;
  bool has_weights = false;
};

PlanModel plan_model(const std::string& model) {
  PlanModel m;
  DType dt;
  m.spec = resolve_model_spec(model, &m.origin, &dt, &m.has_weights);
  return m;
}

// What the planner needs of the model beyond its spec: as `run` reads it from a weight file, or (a
// synthetic or builtin spec) as synthetic weights lay it out.
ModelFacts plan_facts(const std::string& model, const PlanModel& m) {
  if (m.has_weights) return facts_of(*open_weights(model), m.origin);
  return facts_of_spec(m.spec, m.origin);
}

// --routing-tokens: plan with the weights' own MoE routing, measured on the oracle's step tokens (a CPU
// pass), and say what was measured.
void measure_plan_routing(const PlanArgs& a, const PlanModel& m, PlannerConfig& cfg) {
  const int64_t n = a.planner->routing_tokens;
  if (n < 1 || n > 16384) fail("--routing-tokens ", n, " must be 1..16384");
  if (!m.spec.is_moe()) fail("--routing-tokens: ", a.model, " is not a mixture-of-experts model");
  if (!m.has_weights && a.model.rfind("synthetic:", 0) != 0)
    fail("--routing-tokens needs weights (a .gguf, an HF directory or synthetic:SPEC), not only a shape");
  auto src = open_weights(a.model);
  LoadedModel loaded(*src, cfg.threads);
  const std::vector<int32_t> toks = step_tokens(n, m.spec.vocab_size, a.planner->token_seed);
  const MeasuredRouting r = measure_routing(loaded.weights, loaded.pool, toks, cfg.tiers, toks.size());
  use_routing(cfg, r);
  if (log_level() > LogLevel::Info) return;  // the table below is information (--quiet leaves it out)
  const double E = static_cast<double>(m.spec.num_experts), k = static_cast<double>(m.spec.num_experts_per_tok);
  std::fprintf(stderr,
               "routing measured on %lld tokens, distinct experts per layer of %lld (a load-balanced router: "
               "E(N) = E (1 - (1 - k/E)^N)):\n%8s %10s %13s %8s\n",
               static_cast<long long>(n), static_cast<long long>(m.spec.num_experts), "tokens N", "mean",
               "fewest layer", "E(N)");
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const double uniform = E * (1 - std::pow(1 - k / E, static_cast<double>(std::min<int64_t>(r.tokens[i], n))));
    std::fprintf(stderr, "%8lld %10.1f %13.1f %8.1f\n", static_cast<long long>(r.tokens[i]), r.experts[i], r.fewest[i],
                 uniform);
  }
  if (r.next_layer_measured)
    std::fprintf(
        stderr,
        "next layer's experts picked by its router from this layer's MoE input: %.1f%% (uniform guessing: %.1f%%)\n",
        100.0 * r.next_layer_hits,
        100.0 * static_cast<double>(m.spec.num_experts_per_tok) / static_cast<double>(m.spec.num_experts));
}

// What a plan call computed, for its outputs.
struct PlanResult {
  PlanModel model;
  PlannedTable planned;
  std::string machine_label;  // the machine in one word (--brief)
  double plan_ms = 0;
  double ttft_ms = 0, decode_tps = 0;
  int64_t ttft_chunk = 0;
  std::optional<VisionPart> vision;  // --image-size
};

// The plan of --tier and --schedule (--explain, --trace); --save and --trace written.
const Plan& write_plan_files(const PlanArgs& a, const PlanTable& table) {
  if (!a.save.empty()) write_text(a.save, plan_table_to_json(table, 1));
  const int64_t focus_tier = a.tier_text.empty() ? 1 : parse_token_count(a.tier_text, "--tier");
  const TierEntry& focus = table.lookup(focus_tier);
  const Plan* focus_plan = a.schedule.empty() ? &focus.chosen_plan() : focus.find(parse_schedule(a.schedule));
  if (!focus_plan) fail("--schedule ", a.schedule, " was not planned");
  if (!a.trace.empty()) {
    if (!focus_plan->feasible)
      fail("--trace: the ", schedule_name(focus_plan->schedule), " plan for ", focus.tokens, " tokens is infeasible (",
           focus_plan->infeasible_reason, ")");
    write_text(a.trace, chrome_trace_json(*focus_plan, std::string(schedule_name(focus_plan->schedule)) + " " +
                                                           std::to_string(focus.tokens) + " tokens"));
  }
  return *focus_plan;
}

nlohmann::json tier_json(const TierEntry& e) {
  nlohmann::json c = nlohmann::json::array();
  for (const auto& p : e.candidates) {
    nlohmann::json x = {{"schedule", schedule_name(p.schedule)},
                        {"feasible", p.feasible},
                        {"predicted_ms", p.feasible ? p.predicted_ms : 0.0},
                        {"vram_bytes", p.vram_bytes}};
    if (!p.feasible)
      x["reason"] = p.infeasible_reason;
    else
      x["notes"] = p.notes;
    c.push_back(x);
  }
  return {{"tokens", e.tokens},
          {"chosen", e.feasible ? schedule_name(e.chosen) : "none"},
          {"feasible", e.feasible},
          {"chunk_tokens", e.chunk_tokens},
          {"candidates", c}};
}

// The vision encoder's plan for images of the given sizes under the same budget, on CUDA (its arena lives
// before the language model's, so each has the whole budget), and its predicted time. Null without
// --image-size.
std::optional<VisionPart> plan_vision(const PlanArgs& a, uint64_t budget, const CostModel& cost) {
  if (a.image_sizes.empty()) return std::nullopt;
  std::vector<std::array<int64_t, 2>> sizes;
  for (const std::string& size : a.image_sizes) sizes.push_back(parse_image_size(size, "--image-size"));
  return plan_vision_part(a.model, sizes, budget, cost);
}

nlohmann::json vision_plan_json(const VisionPart& v) {
  const VisionPlan& p = v.plan;
  return {{"predicted_ms", v.cost.predicted_ms},
          {"predicted_block_ms", v.cost.block_compute_ms},
          {"predicted_full_block_ms", v.cost.full_block_compute_ms},
          {"predicted_block_copy_ms", v.cost.copy_ms},
          {"schedule", p.schedule()},
          {"patches", p.n_patches},
          {"blocks", p.depth},
          {"resident_blocks", p.resident_blocks},
          {"slots", p.slots},
          {"mlp_chunk", p.mlp_chunk},
          {"arena_bytes", p.arena_bytes},
          {"activation_bytes", p.activation_bytes},
          {"workspace_bytes", p.workspace_bytes},
          {"weight_bytes", p.weight_bytes()}};
}

void print_plan_json(const PlanResult& r) {
  const PlanTable& table = r.planned.table;
  nlohmann::json j;
  j["model"] = r.model.origin;
  j["machine"] = table.machine;
  j["device"] = table.device;
  j["budget_bytes"] = table.budget_bytes;
  j["ctx"] = table.ctx;
  j["threads"] = table.threads;
  j["pcie_cap_gbps"] = table.pcie_cap_gbps;
  j["kv_dtype"] = table.kv_dtype;
  j["kv_layers_on_gpu"] = std::count(table.kv_on_gpu.begin(), table.kv_on_gpu.end(), true);
  j["predicted_ttft_ms"] = r.ttft_ms;
  j["ttft_chunk_tokens"] = r.ttft_chunk;
  j["predicted_decode_tokens_per_s"] = r.decode_tps;
  j["planning_ms"] = r.plan_ms;
  if (r.vision) j["vision"] = vision_plan_json(*r.vision);
  nlohmann::json tiers = nlohmann::json::array();
  for (const auto& e : table.tiers) tiers.push_back(tier_json(e));
  j["tiers"] = tiers;
  print_json(j);
}

// One line: the chosen schedules' predictions next to the llama.cpp-style layer split.
void print_plan_brief(const PlanResult& r, const std::string& budget_text) {
  const PlanTable& table = r.planned.table;
  const int64_t ctx = r.planned.config.ctx;
  auto baseline = [&](int64_t tier) -> double {
    const TierEntry* e = table.find_tier(tier);
    const Plan* p = e ? e->find(Schedule::LayerSplit) : nullptr;
    return p && p->feasible ? p->predicted_ms : INFINITY;
  };
  const TierEntry& d = table.lookup(1);
  const TierEntry& pf = table.lookup(r.ttft_chunk > 0 ? r.ttft_chunk : 512);  // the tier the TTFT goes in chunks of
  const double ls_ttft = std::ceil(static_cast<double>(ctx) / 512.0) * baseline(512);
  std::printf(
      "%-8s %-10s %6s  decode %7.2f t/s (%-8s) | TTFT(%lld) %9.1f ms (%-8s) | layer-split: %6.2f t/s, %9.1f ms\n",
      r.model.spec.name.c_str(), r.machine_label.c_str(), budget_text.c_str(), r.decode_tps, schedule_name(d.chosen),
      (long long)ctx, r.ttft_ms, schedule_name(pf.chosen), 1000.0 / baseline(1), ls_ttft);
}

// The table: a row per tier, a cell per schedule (the chosen one marked).
void print_plan_tiers(const PlanTable& table) {
  std::printf("%7s", "tier");
  for (const auto& p : table.tiers.front().candidates) std::printf(" | %-30s", schedule_name(p.schedule));
  std::printf("\n%7s", "tokens");
  for (size_t i = 0; i < table.tiers.front().candidates.size(); ++i)
    std::printf(" | %1s%11s %10s %6s", "", "step time", "tokens/s", "VRAM");
  std::printf("\n");
  for (const auto& e : table.tiers) {
    std::printf("%7lld", (long long)e.tokens);
    for (const auto& p : e.candidates) {
      char cell[64];
      if (!p.feasible)
        std::snprintf(cell, sizeof cell, "-");
      else
        std::snprintf(cell, sizeof cell, "%s%9.2fms %7.0ft/s %5.1fG",
                      e.feasible && e.chunk_tokens == 0 && p.schedule == e.chosen ? "*" : " ", p.predicted_ms,
                      1000.0 * static_cast<double>(e.tokens) / p.predicted_ms,
                      static_cast<double>(p.vram_bytes) / (1u << 30));
      std::printf(" | %-30s", cell);
    }
    if (e.chunk_tokens > 0) std::printf(" -> chunks of %lld", (long long)e.chunk_tokens);
    std::printf("\n");
  }
}

void print_plan_text(const PlanResult& r, const std::string& pcie_cap_text) {
  const PlanTable& table = r.planned.table;
  const PlannerConfig& cfg = r.planned.config;
  std::printf("plan  %s on %s, budget %s, ctx %lld, %d threads, PCIe cap %s, KV %s (%lld of %lld layers in VRAM)\n",
              r.model.origin.c_str(), table.machine.c_str(), format_bytes(cfg.budget_bytes).c_str(), (long long)cfg.ctx,
              cfg.threads, pcie_cap_text.c_str(), table.kv_dtype.c_str(),
              (long long)std::count(table.kv_on_gpu.begin(), table.kv_on_gpu.end(), true),
              (long long)r.model.spec.num_hidden_layers);
  print_plan_tiers(table);
  std::printf(
      "tier: a step of that many new tokens; per schedule the predicted step time, tokens/s (tier / step time) "
      "and the VRAM the plan uses\n"
      "* = chosen (fastest of gpu-only/static/dynamic; layer-split and cpu-moe are llama.cpp-style baselines);\n"
      "-> chunks of N: a step of this size runs faster as (or only fits as) steps of N tokens\n");
  std::printf(
      "predicted TTFT for a %lld-token prompt: %.1f ms (chunks of %lld); decode: %.2f tokens/s; planned in %.0f ms\n",
      (long long)cfg.ctx, r.ttft_ms, (long long)r.ttft_chunk, r.decode_tps, r.plan_ms);
}

void check_plan_args(const PlanArgs& a) {
  const PlannerFlags& f = *a.planner;
  f.check_llama_flags();
  if (f.hw.empty() && f.profile.empty())
    fail("give --hw NAME|FILE (builtin: cli1, cli2, cli3, h200-host) or --profile FILE");
  if (f.budget.empty()) fail("give --vram-budget (e.g. 4G)");
  for (const auto& out : {std::make_pair("--save", &a.save), std::make_pair("--trace", &a.trace)})
    if (!out.second->empty()) check_output_path(*out.second, out.first);
}

void run_plan(const PlanArgs& a) {
  check_plan_args(a);
  const PlannerFlags& f = *a.planner;
  PlanResult r;
  r.model = plan_model(a.model);
  const double cap = f.pcie_cap_bytes_per_s();
  // A measured profile takes precedence over --hw, which then only stands in for the GPU of a
  // CPU-only profile.
  const CostSource source(f.machine());
  if (!source.unused_datasheet_note().empty()) log_info(source.unused_datasheet_note());
  r.machine_label = source.label();
  const CostModel& cost = source.at_cap(cap);
  const uint64_t budget = f.budget_bytes();
  PlannerChoices choices = f.choices(planner_threads(f.threads, cost, "--threads"));
  choices.budget_bytes = budget;
  PlannerConfig cfg = planner_config(r.model.spec, choices, plan_facts(a.model, r.model));
  if (f.routing_tokens != 0) measure_plan_routing(a, r.model, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  r.planned = plan_table(r.model.spec, cost, cfg, choices.next_layer_hits, cap);
  r.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  predicted_latencies(r.planned.table, r.planned.config.ctx, &r.ttft_ms, &r.ttft_chunk, &r.decode_tps);
  r.vision = plan_vision(a, budget, cost);
  const Plan& focus = write_plan_files(a, r.planned.table);
  if (a.json) return print_plan_json(r);
  if (a.brief) return print_plan_brief(r, f.budget);
  print_plan_text(r, f.pcie_cap);
  if (r.vision)
    std::printf(
        "%s; predicted encode %.1f ms (a block %.2f ms, with full attention %.2f ms, its copy %.2f ms); its arena is "
        "released before the language model's, so each part has the whole budget\n",
        r.vision->plan.describe().c_str(), r.vision->cost.predicted_ms, r.vision->cost.block_compute_ms,
        r.vision->cost.full_block_compute_ms, r.vision->cost.copy_ms);
  if (a.explain) std::printf("\n%s", explain_plan(focus, r.model.spec, cost, r.planned.config).c_str());
}

}  // namespace

void register_plan(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand("plan", "Plan every token tier under a VRAM budget and show the predictions");
  sub->add_option("-m,--model", a->model, "Builtin spec name, .yaml, .gguf, HF directory or synthetic:SPEC")
      ->required();
  a->planner = add_planner_flags(sub, PlannerVerb::Plan);
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_flag("--brief", a->brief,
                "One line: predicted decode tokens/s and TTFT, chosen schedules, the layer-split baseline");
  sub->add_flag("--explain", a->explain, "List the shards of one plan (--tier, --schedule) with placement and why");
  sub->add_option("--trace", a->trace, "Write the Chrome trace of one plan's simulated timeline");
  sub->add_option("--tier", a->tier_text, "Tier for --explain/--trace (default 1)");
  sub->add_option("--schedule", a->schedule, "Schedule for --explain/--trace (default: the chosen one)");
  sub->add_option("--save", a->save, "Write the full plan table (JSON) for `run --plan`");
  sub->add_option("--image-size", a->image_sizes,
                  "WIDTHxHEIGHT of an image (repeat for several) for a vision-language HF directory: plan its "
                  "vision encoder too, within the same budget (on CUDA)");
  sub->callback([a] { run_plan(*a); });
}

}  // namespace shardwise::cli

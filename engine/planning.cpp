// engine/planning.cpp — see planning.h.
#include "engine/planning.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"
#include "executor/model/cpu_model.h"
#include "executor/runtime/runtime.h"
#include "executor/traits.h"
#include "planner/shard_layout.h"

namespace shardwise {

NextLayerHits NextLayerHits::given(double fraction) {
  NextLayerHits h;
  h.mode = fraction == 0 ? Mode::Off : Mode::Given;
  h.fraction = fraction;
  return h;
}

NextLayerHits parse_next_layer_hits(const std::string& text, const char* flag) {
  NextLayerHits h;
  if (text == "auto") return h;
  if (text == "off") return NextLayerHits::given(0);
  char* end = nullptr;
  errno = 0;
  const double f = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(f))
    fail(flag, " '", text, "': expected auto, off or a fraction in [0, 1]");
  if (!(f >= 0 && f <= 1)) fail(flag, " ", text, " must be a fraction in [0, 1] (or auto, off)");
  return NextLayerHits::given(f);
}

int planner_threads(int requested, const CostModel& cost, const char* flag) {
  const int threads = requested == 0 ? cost.max_threads() : requested;
  if (threads < 1 || threads > kMaxPoolThreads)
    fail(flag, " ", requested, " is out of range: 0 (the machine's cores) or 1 to ", kMaxPoolThreads);
  return threads;
}

ModelFacts facts_of(const WeightSource& source, const std::string& name) {
  return {name, tensor_dtypes_of(source), expert_copies_of(source)};
}

ModelFacts facts_of_spec(const ModelSpec& spec, const std::string& name) {
  ModelFacts f;
  f.name = name;
  f.expert_copies = synthetic_expert_copies(spec);
  return f;
}

PlannerConfig planner_config(const ModelSpec& spec, const PlannerChoices& c, const ModelFacts& facts) {
  PlannerConfig cfg;
  cfg.budget_bytes = c.budget_bytes;
  cfg.ctx = c.ctx;
  cfg.threads = c.threads;
  cfg.kv_dtype = c.kv_dtype;
  cfg.kv_layers = c.kv_layers;
  cfg.host_kv_attention = c.host_kv_attention;
  cfg.moe_cpu_experts = c.moe_split;
  if (c.only) cfg.schedules = {*c.only};
  if (!c.tiers.empty()) cfg.tiers = c.tiers;
  cfg.model_name = facts.name;
  cfg.tensor_dtypes = facts.tensor_dtypes;
  cfg.executor = executor_traits(spec, facts.expert_copies, c.sequences);
  return cfg;
}

MeasuredRouting measure_routing(const ModelWeights& weights, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                std::vector<int64_t> curve_tokens, size_t next_layer_tokens) {
  MeasuredRouting r;
  std::sort(curve_tokens.begin(), curve_tokens.end());
  r.tokens = std::move(curve_tokens);
  r.measured_on = static_cast<int64_t>(tokens.size());
  r.experts = measure_experts_touched(weights, pool, tokens, r.tokens, &r.fewest);
  const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(std::min(next_layer_tokens, tokens.size()));
  const double next = measure_next_layer_routing(weights, pool, std::vector<int32_t>(tokens.begin(), first));
  r.next_layer_measured = std::isfinite(next);
  r.next_layer_hits = r.next_layer_measured ? next : 0;
  return r;
}

void use_routing(PlannerConfig& cfg, const MeasuredRouting& routing) {
  cfg.routing_tokens = routing.tokens;
  cfg.routing_experts = routing.experts;
  cfg.next_layer_hits = routing.next_layer_hits;
}

std::vector<int32_t> step_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

double measure_guess_on_prompt(const ModelWeights& weights, ThreadPool& pool, const std::vector<int32_t>& prompt) {
  if (!weights.spec.is_moe() || prompt.empty()) return 0;
  const Phase phase("measuring how well routers guess the next layer's experts");
  constexpr size_t kProbeTokens = 4;  // ~k·4 experts per layer read once on the CPU: ~0.1 s for qwen30b
  const std::vector<int32_t> probe(prompt.begin(),
                                   prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), kProbeTokens)));
  const double f = measure_next_layer_routing(weights, pool, probe);
  return std::isfinite(f) ? f : 0;
}

bool plans_stream_experts(const PlanTable& table, const ModelSpec& spec) {
  if (!spec.is_moe()) return false;
  const ShardSet shards = make_shards(spec, table.ctx, DType::F32);
  for (const auto& t : table.tiers)
    for (const Plan& p : t.candidates)
      for (const ShardPlacement& pl : p.placements)
        if (p.feasible && pl.streamed && shards.at(pl.shard).kind == ShardKind::Ffn) return true;
  return false;
}

PlannedTable plan_table(const ModelSpec& spec, const CostModel& cost, PlannerConfig cfg, const NextLayerHits& hits,
                        double pcie_cap_bytes_per_s, const std::function<double()>& measure_guess) {
  if (hits.mode != NextLayerHits::Mode::Auto) cfg.next_layer_hits = hits.fraction;
  if (!spec.is_moe()) cfg.next_layer_hits = 0;  // no router to guess with
  PlannedTable out;
  {
    const Phase phase("planning");
    out.table = build_plan_table(spec, cost, cfg);
  }
  if (hits.mode == NextLayerHits::Mode::Auto && cfg.next_layer_hits == 0 && measure_guess &&
      plans_stream_experts(out.table, spec)) {
    out.guess_measured = true;
    cfg.next_layer_hits = measure_guess();
    if (cfg.next_layer_hits > 0) {
      const Phase phase("planning again with the measured guesses");
      out.table = build_plan_table(spec, cost, cfg);
    }
  }
  out.table.pcie_cap_gbps = pcie_cap_bytes_per_s / 1e9;
  out.config = std::move(cfg);
  return out;
}

}  // namespace shardwise

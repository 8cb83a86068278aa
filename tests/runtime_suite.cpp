// tests/runtime_suite.cpp — the runtime behaviour suite (see runtime_suite.h).
#include "runtime_suite.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "costmodel/cost_model.h"
#include "executor/model/cpu_model.h"
#include "planner/shard_layout.h"
#include "test_util.h"

namespace shardwise::test {

using Catch::Matchers::Contains;

EmuOptions emu(uint64_t seed, int max_delay_us, int drop_wait) {
  EmuOptions o;
  o.seed = seed;
  o.max_delay_us = max_delay_us;
  o.drop_wait = drop_wait;
  return o;
}

ModelSpec suite_spec(const char* family, DType dt) {
  std::string y = std::string("name: rt\nfamily: ") + family +
                  "\nhidden_size: 256\nnum_hidden_layers: 4\nnum_attention_heads: 8\nnum_key_value_heads: 2\n"
                  "head_dim: 32\nvocab_size: 512\nrope_theta: 10000\nrms_norm_eps: 1e-6\n";
  if (std::string(family) == "qwen3_moe")
    y += "num_experts: 8\nnum_experts_per_tok: 2\nmoe_intermediate_size: 128\nnorm_topk_prob: true\n";
  else
    y += "intermediate_size: 640\n";
  ModelSpec s = parse_spec_yaml_text(y, "rt.yaml");
  s.dtype = dt;
  return s;
}

std::vector<int32_t> token_seq(int n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>((seed * 2654435761u + 40503u * static_cast<uint32_t>(i)) % vocab));
  return t;
}

std::vector<float> run_steps(StepEngine& engine, const std::vector<int32_t>& toks, const std::vector<int>& steps) {
  std::vector<float> out, logits(static_cast<size_t>(engine.spec().vocab_size));
  size_t at = 0;
  for (int n : steps) {
    engine.step(toks.data() + at, n, logits.data());
    out.insert(out.end(), logits.begin(), logits.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

SuiteModel suite_model(std::unique_ptr<WeightSource> src, int64_t ctx, const std::vector<int>& steps,
                       uint32_t token_seed, ThreadPool& pool, int n_tokens, DType kv_dtype) {
  SuiteModel m;
  m.src = std::move(src);
  m.w = ModelWeights::from_source(*m.src);
  m.tokens = token_seq(n_tokens, m.src->spec().vocab_size, token_seed);
  m.steps = steps;
  CpuEngine cpu(m.w, pool, ctx, 1, kv_dtype);
  m.ref = run_steps(cpu, m.tokens, m.steps);
  return m;
}

// ---- plan tables of a target ------------------------------------------------------------------------------

PlannerConfig planner_config(const RuntimeTarget& t, const WeightSource& src, uint64_t budget) {
  PlannerConfig cfg;
  cfg.budget_bytes = budget;
  cfg.ctx = t.ctx;
  cfg.threads = t.threads;
  cfg.tiers = t.tiers;
  cfg.tensor_dtypes = tensor_dtypes_of(src);
  cfg.executor = executor_traits(src.spec());
  cfg.kv_dtype = t.kv_dtype;
  return cfg;
}

uint64_t min_budget(const RuntimeTarget& t, const WeightSource& src) {
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  // Rounded up to 1 MiB: the slack these tests were written with (the planner's minimum is exact to
  // the arena's alignment), which leaves the planner a choice of schedules.
  return (minimum_budget(src.spec(), *cost, planner_config(t, src, 1)) + (1 << 20) - 1) / (1 << 20) * (1 << 20);
}

uint64_t model_bytes(const RuntimeTarget& t, const WeightSource& src) {
  return t.fraction_of_source ? src.weight_bytes() : src.spec().total_bytes();
}

uint64_t budget_at(const RuntimeTarget& t, const WeightSource& src, double frac) {
  return std::max<uint64_t>(min_budget(t, src) + (256u << 10),
                            static_cast<uint64_t>(frac * static_cast<double>(model_bytes(t, src))));
}

PlanTable plan_table(const RuntimeTarget& t, const WeightSource& src, uint64_t budget,
                     PlannerConfig::HostKvAttention host_kv) {
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  PlannerConfig cfg = planner_config(t, src, budget);
  cfg.host_kv_attention = host_kv;
  return build_plan_table(src.spec(), *cost, cfg);
}

bool feasible_somewhere(const PlanTable& table, Schedule s) {
  for (const auto& tier : table.tiers)
    if (const Plan* p = tier.find(s); p && p->feasible) return true;
  return false;
}

const std::vector<Schedule>& all_schedules() {
  static const std::vector<Schedule> s = {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit,
                                          Schedule::CpuMoe};
  return s;
}

namespace {

// Each sequence's logits within 1e-4 of the reference's, with the same greedy tokens.
void check_same_sequences(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& ref,
                          int64_t V) {
  REQUIRE(got.size() == ref.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO("slot " << s);
    REQUIRE(got[s].size() == ref[s].size());
    CHECK(max_rel_error(got[s], ref[s], V) <= 1e-4);
    for (size_t r = 0; r < ref[s].size() / static_cast<size_t>(V); ++r) {
      const auto row = [&](const std::vector<float>& v) {
        const auto b = v.begin() + static_cast<int64_t>(r) * V;
        return std::max_element(b, b + V) - b;
      };
      CHECK(row(got[s]) == row(ref[s]));  // the greedy token
    }
  }
}

// A run's logits after each step against the model's CPU engine: within 1e-4, and with the same greedy
// tokens on a target that runs the CPU's kernels.
void check_steps(const RuntimeTarget& t, const SuiteModel& m, const std::vector<float>& got) {
  if (t.same_tokens)
    check_same_sequences({got}, {m.ref}, m.vocab());
  else
    CHECK(max_rel_error(got, m.ref, m.vocab()) <= 1e-4);
}

}  // namespace

void check_memory(const RuntimeTarget& t, const RuntimeMemory& m, uint64_t budget) {
  const uint64_t g = t.device_granule;
  INFO(t.name << ": arena peak " << m.arena_peak_bytes << ", device peak " << m.device_peak_bytes << " bytes, budget "
              << budget << " bytes, context " << m.context_bytes << " bytes");
  CHECK(m.arena_peak_bytes <= budget);
  CHECK(m.device_peak_bytes <= (budget + g - 1) / g * g);
}

void check_run(const RuntimeTarget& t, const SuiteModel& m, const PlanTable& table, const RuntimeOptions& o,
               const EmuOptions& dev, uint64_t budget, ThreadPool& pool) {
  auto d = t.device(dev);
  Runtime rt(*m.src, m.w, *d, pool, table, o);
  check_steps(t, m, run_steps(rt, m.tokens, m.steps));
  check_memory(t, rt.memory(), budget);
}

// ---- the behaviours --------------------------------------------------------------------------------------

int check_every_schedule(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget,
                         const std::vector<Schedule>& schedules, const EmuOptions& dev, ThreadPool& pool) {
  const PlanTable table = plan_table(t, *m.src, budget);
  int streamed = 0;
  for (Schedule s : schedules) {
    if (!feasible_somewhere(table, s)) continue;
    INFO(t.name << " " << m.src->spec().name << " budget " << budget << " schedule " << schedule_name(s));
    auto d = t.device(dev);
    RuntimeOptions o;
    o.schedule = s;
    Runtime rt(*m.src, m.w, *d, pool, table, o);
    check_steps(t, m, run_steps(rt, m.tokens, m.steps));
    int64_t chunk = 0;
    for (const auto& a : rt.plan_for(1, &chunk).actions) streamed += a.kind == ActionKind::CopyWeights;
    check_memory(t, rt.memory(), budget);
  }
  INFO(t.name << " " << m.src->spec().name << " budget " << budget << ": the table's own choice");
  EmuOptions own = dev;
  own.seed += 4;
  check_run(t, m, table, {}, own, budget, pool);
  return streamed;
}

int check_staged_attention(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                           ThreadPool& pool) {
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  PlannerConfig cfg = planner_config(t, *m.src, budget);
  cfg.kv_layers = 1;
  cfg.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
  const PlanTable table = build_plan_table(m.src->spec(), *cost, cfg);
  int staged = 0;
  for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
    if (!feasible_somewhere(table, s)) continue;
    bool stages = false;
    for (const auto& tier : table.tiers)
      if (const Plan* p = tier.find(s); p && p->feasible)
        for (const Action& a : p->actions) stages = stages || a.part == ComputePart::AttnStaged;
    staged += stages;
    INFO(t.name << " " << m.src->spec().name << " " << schedule_name(s) << (stages ? " (staged)" : ""));
    RuntimeOptions o;
    o.schedule = s;
    check_run(t, m, table, o, dev, budget, pool);
  }
  return staged;
}

PlanTable check_moe_split(const RuntimeTarget& t, const SuiteModel& m, int share, uint64_t budget,
                          const std::vector<EmuOptions>& devs, ThreadPool& pool) {
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  PlannerConfig cfg = planner_config(t, *m.src, budget);
  cfg.moe_cpu_experts = share;
  const PlanTable table = build_plan_table(m.src->spec(), *cost, cfg);
  int cpu_shares = 0, gpu_shares = 0, partials = 0, adds = 0;
  for (const auto& tier : table.tiers)
    if (const Plan* p = tier.find(Schedule::Dynamic); p && p->feasible)
      for (const Action& a : p->actions) {
        cpu_shares += a.part == ComputePart::MoeCpuShare;
        gpu_shares += a.part == ComputePart::MoeGpuShare;
        partials += a.payload == Payload::MoePartial;
        adds += a.part == ComputePart::MoeShareAdd;
        if (a.part == ComputePart::MoeCpuShare || a.part == ComputePart::MoeGpuShare ||
            a.part == ComputePart::MoeShareAdd)
          CHECK(a.cpu_experts == share);
      }
  INFO(t.name << " " << m.src->spec().name << " share " << share << ": " << cpu_shares << " split layers");
  REQUIRE(cpu_shares > 0);  // the premise: the budget leaves CPU FFN layers to split
  CHECK(gpu_shares == cpu_shares);
  CHECK(partials == cpu_shares);
  CHECK(adds == cpu_shares);
  RuntimeOptions o;
  o.schedule = Schedule::Dynamic;
  for (const EmuOptions& dev : devs) {
    INFO("device seed " << dev.seed);
    check_run(t, m, table, o, dev, budget, pool);
  }
  return table;
}

PlanTable speculative_table(const RuntimeTarget& t, const SuiteModel& m, Schedule sched, uint64_t budget) {
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  PlannerConfig cfg = planner_config(t, *m.src, budget);
  cfg.next_layer_hits = 1.0;
  cfg.always_speculate = true;  // (tiny models' copies are too short for the guess to pay)
  cfg.schedules = {sched};
  cfg.moe_cpu_experts = sched == Schedule::Dynamic ? 1 : -1;
  const PlanTable table = build_plan_table(m.src->spec(), *cost, cfg);
  int speculative = 0, split = 0;
  for (const auto& tier : table.tiers)
    if (const Plan* p = tier.find(sched); p && p->feasible)
      for (const Action& a : p->actions) {
        speculative += a.speculative;
        split += a.speculative && a.cpu_experts == 1;
      }
  INFO(t.name << " " << m.src->spec().name << " " << schedule_name(sched) << ": " << speculative
              << " speculative copies");
  REQUIRE(speculative > 0);                            // the premise: the plans copy experts on guesses
  if (sched == Schedule::Dynamic) REQUIRE(split > 0);  // ... split layers' GPU shares among them
  return table;
}

RuntimeGuesses check_guesses(const RuntimeTarget& t, const SuiteModel& m, const PlanTable& table, Schedule sched,
                             RuntimeOptions::GuessTest mode, const EmuOptions& dev, uint64_t budget, ThreadPool& pool) {
  using G = RuntimeOptions::GuessTest;
  auto d = t.device(dev);
  RuntimeOptions o;
  o.schedule = sched;
  o.guess_test = mode;
  Runtime rt(*m.src, m.w, *d, pool, table, o);
  INFO(t.name << " " << m.src->spec().name << " " << schedule_name(sched) << " guess " << static_cast<int>(mode)
              << " device seed " << dev.seed);
  CHECK(max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, m.vocab()) <= 1e-4);
  check_memory(t, rt.memory(), budget);
  const RuntimeGuesses g = rt.guesses();
  CHECK(g.guessed > 0);
  // A guess picks as many experts per token as the routing (of a split layer, the GPU's share of them).
  CHECK(g.guessed * 4 <= g.routed * 5);
  CHECK(g.hits <= g.guessed);
  CHECK(g.hits <= g.routed);
  if (mode != G::Lowest) CHECK(g.hits > 0);
  if (mode != G::Router) CHECK(g.hits < g.routed);  // misses beside the hits (how many: the model's top_k of n)
  return g;
}

GraphCount check_graphs(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                        ThreadPool& pool) {
  const PlanTable table = plan_table(t, *m.src, budget);
  std::vector<float> plain;
  GraphCount count;
  for (bool graphs : {false, true}) {
    INFO(t.name << " " << m.src->spec().name << (graphs ? " with graphs" : " without graphs"));
    auto d = t.device(dev);
    RuntimeOptions o;
    o.schedule = Schedule::GpuOnly;
    o.cuda_graphs = graphs;
    Runtime rt(*m.src, m.w, *d, pool, table, o);
    int64_t chunk = 0;
    for (const Action& a : rt.plan_for(1, &chunk).actions)  // the premise: a device-resident decode plan
      REQUIRE((a.resource != Resource::Cpu || a.kind == ActionKind::Embed));
    const auto got = run_steps(rt, m.tokens, m.steps);
    CHECK(max_rel_error(got, m.ref, m.vocab()) <= 1e-4);
    check_memory(t, rt.memory(), budget);
    // Per decode step: its GPU compute actions in graphs of at most kGraphMaxActions.
    uint64_t expected = 0;
    for (int n : m.steps) {
      if (n > kDeviceRoutingMaxTokens) continue;
      int computes = 0;
      for (const Action& a : rt.plan_for(n, &chunk).actions) computes += a.resource == Resource::GpuCompute;
      expected += static_cast<uint64_t>((computes + kGraphMaxActions - 1) / kGraphMaxActions);
    }
    if (!graphs) {
      CHECK(rt.graph_launches() == 0u);
      plain = got;
    } else {
      CHECK(rt.graph_launches() > 0u);
      CHECK(got == plain);  // the same kernels in the same order: bit for bit
      count = {rt.graph_launches(), expected};
    }
  }
  return count;
}

void check_streaming_runs_no_graphs(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, const EmuOptions& dev,
                                    ThreadPool& pool) {
  const PlanTable table = plan_table(t, *m.src, budget);
  for (Schedule s : {Schedule::GpuOnly, Schedule::Static}) {
    INFO(t.name << " " << m.src->spec().name << " " << schedule_name(s) << " with streamed weights");
    auto d = t.device(dev);
    RuntimeOptions o;
    o.schedule = s;
    o.cuda_graphs = true;
    Runtime rt(*m.src, m.w, *d, pool, table, o);
    CHECK(max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, m.vocab()) <= 1e-4);
    CHECK(rt.graph_launches() == 0u);
  }
}

void check_schedule_switching(const RuntimeTarget& t, const SuiteModel& m, uint64_t budget, bool expect_reuploads,
                              const EmuOptions& dev, ThreadPool& pool) {
  const PlanTable table = plan_table(t, *m.src, budget);
  std::vector<Schedule> feasible;
  for (Schedule s : all_schedules())
    if (feasible_somewhere(table, s)) feasible.push_back(s);
  INFO(t.name << " " << m.src->spec().name << " budget " << budget << ": " << feasible.size() << " feasible schedules");
  REQUIRE(feasible.size() >= 2);
  auto d = t.device(dev);
  RuntimeOptions o;
  o.schedule = feasible.front();
  Runtime rt(*m.src, m.w, *d, pool, table, o);
  std::vector<float> got, logits(static_cast<size_t>(m.vocab()));
  size_t at = 0;
  uint64_t reuploaded = 0;
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const Schedule s = feasible[i % feasible.size()];
    if (i > 0) rt.set_schedule(s);
    rt.step(m.tokens.data() + at, m.steps[i], logits.data());
    got.insert(got.end(), logits.begin(), logits.end());
    at += static_cast<size_t>(m.steps[i]);
    CHECK(rt.steps().back().schedule == s);
    check_memory(t, rt.memory(), budget);
    if (i >= feasible.size()) reuploaded += rt.memory().uploaded_bytes;  // a schedule's second turn
  }
  CHECK(max_rel_error(got, m.ref, m.vocab()) <= 1e-4);
  // Back to the table's own choice per tier.
  rt.set_schedule(std::nullopt);
  rt.reset();
  CHECK(max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, m.vocab()) <= 1e-4);
  if (expect_reuploads) CHECK(reuploaded > 0);  // slots had overwritten pinned shards: uploaded again
}

void check_infeasible_schedule_refused(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool) {
  const ModelSpec spec = suite_spec("llama", DType::F16);
  auto src = make_synthetic_weights(spec, 3, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = plan_table(t, *src, 64u << 20);  // everything fits
  auto d = t.device(dev);
  Runtime rt(*src, w, *d, pool, table, {});
  CHECK_THROWS_WITH(rt.set_schedule(Schedule::CpuMoe), Contains("no feasible plan"));
  std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
  const auto toks = token_seq(4, spec.vocab_size, 1);
  rt.step(toks.data(), 4, logits.data());
  CHECK(rt.steps().back().schedule != Schedule::CpuMoe);
}

void check_device_routing(const RuntimeTarget& t, const SuiteModel& m, const EmuOptions& dev, ThreadPool& pool) {
  const ModelSpec& spec = m.src->spec();
  auto router_copies = [](const Plan& p) {
    int c = 0;
    for (const auto& a : p.actions) c += a.payload == Payload::RouterLogits;
    return c;
  };
  RuntimeOptions o;
  o.schedule = Schedule::GpuOnly;
  {  // everything fits: decode tiers route every layer on the device, the 16-token tier on the host
    const PlanTable all = plan_table(t, *m.src, 2 * spec.total_bytes());
    auto d = t.device(dev);
    Runtime rt(*m.src, m.w, *d, pool, all, o);
    int64_t chunk = 0;
    INFO(t.name << " everything resident");
    CHECK(router_copies(rt.plan_for(1, &chunk)) == 0);
    CHECK(router_copies(rt.plan_for(4, &chunk)) == 0);
    CHECK(router_copies(rt.plan_for(16, &chunk)) == spec.num_hidden_layers);
    CHECK(max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, m.vocab()) <= 1e-4);
  }
  {  // experts streamed: the host must know the routing to copy them, at every tier
    const PlanTable small =
        plan_table(t, *m.src, static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20));
    EmuOptions dev2 = dev;
    dev2.seed += 1;
    auto d = t.device(dev2);
    Runtime rt(*m.src, m.w, *d, pool, small, o);
    int64_t chunk = 0;
    const Plan& p1 = rt.plan_for(1, &chunk);
    int streamed_ffn = 0;
    for (const auto& a : p1.actions) streamed_ffn += a.kind == ActionKind::CopyWeights && a.layer >= 0;
    INFO(t.name << " experts streamed");
    REQUIRE(streamed_ffn > 0);
    CHECK(router_copies(p1) > 0);
    CHECK(max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, m.vocab()) <= 1e-4);
  }
}

void check_dynamic_streams_attention(const RuntimeTarget& t, const SuiteModel& m, const EmuOptions& dev,
                                     ThreadPool& pool) {
  const ModelSpec& spec = m.src->spec();
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  bool found = false;
  for (double frac : {0.06, 0.1, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65}) {
    PlannerConfig cfg =
        planner_config(t, *m.src, static_cast<uint64_t>(frac * static_cast<double>(spec.total_bytes())) + (2u << 20));
    cfg.kv_layers = static_cast<int>(spec.num_hidden_layers);
    PlanTable table;
    try {
      table = build_plan_table(spec, *cost, cfg);
    } catch (const Error&) {
      continue;
    }
    const Plan* dyn = table.find_tier(1)->find(Schedule::Dynamic);
    if (!dyn->feasible) continue;
    bool streams_attention = false;
    for (const Action& a : dyn->actions)
      streams_attention |= a.kind == ActionKind::CopyWeights && a.shard >= 0 &&
                           dyn->placements[static_cast<size_t>(a.shard)].name.find("attn") != std::string::npos;
    if (!streams_attention) continue;
    found = true;
    for (Schedule s : {Schedule::Dynamic, Schedule::GpuOnly}) {
      if (!table.find_tier(1)->find(s)->feasible) continue;  // GPU-only: two slots of an FFN beside all KV
      INFO(t.name << " " << spec.name << " budget " << cfg.budget_bytes << " " << schedule_name(s));
      RuntimeOptions o;
      o.schedule = s;
      check_run(t, m, table, o, dev, cfg.budget_bytes, pool);
    }
  }
  INFO(t.name << " " << spec.name);
  CHECK(found);
}

void check_pinned_across_tiers(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool) {
  const ModelSpec spec = suite_spec("qwen3", DType::F16);
  auto src = make_synthetic_weights(spec, 2, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = plan_table(t, *src, 64u << 20);
  auto d = t.device(dev);
  Runtime rt(*src, w, *d, pool, table, {});
  const auto toks = token_seq(30, spec.vocab_size, 1);
  std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
  rt.step(toks.data(), 16, logits.data());
  const uint64_t after_first = rt.memory().uploaded_bytes;
  CHECK(after_first > 0);
  for (int i = 0; i < 4; ++i) rt.step(toks.data() + 16 + i, 1, logits.data());
  rt.step(toks.data() + 20, 4, logits.data());
  CHECK(rt.memory().uploaded_bytes == after_first);  // everything fits: nothing is uploaded twice
  std::vector<int32_t> long_step(static_cast<size_t>(t.ctx), 1);
  CHECK_THROWS_WITH(rt.step(long_step.data(), t.ctx, logits.data()), Contains("context is full"));
  // A table for a different model is refused.
  auto src2 = make_synthetic_weights(suite_spec("qwen3", DType::Q8_0), 2, &pool);
  const PlanTable t2 = plan_table(t, *src2, 64u << 20);
  auto d2 = t.device(dev);
  CHECK_THROWS_WITH(Runtime(*src, w, *d2, pool, t2, {}), Contains("another"));
}

void check_lm_head_pieces(const RuntimeTarget& t, const EmuOptions& dev, ThreadPool& pool) {
  ModelSpec spec = suite_spec("llama", DType::F16);
  spec.vocab_size = 16384;  // an 8 MiB LM head; the layers are ~5 MiB
  auto src = make_synthetic_weights(spec, 7, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  const uint64_t head_bytes = static_cast<uint64_t>(spec.vocab_size) * static_cast<uint64_t>(spec.hidden_size) * 2;
  PlannerConfig cfg = planner_config(t, *src, head_bytes - (1 << 20));
  cfg.lm_head_piece_bytes = 1 << 20;  // as nemo8b's 1 GiB head against 256 MiB pieces
  const PlanTable table = build_plan_table(spec, *cost, cfg);
  bool pieces = false;
  for (const auto& tier : table.tiers)
    for (const Plan& p : tier.candidates)
      for (const Action& a : p.actions) pieces = pieces || (p.feasible && a.row_end > a.row_begin);
  INFO(t.name);
  REQUIRE(pieces);
  SuiteModel m;
  m.src = std::move(src);
  m.w = std::move(w);
  m.tokens = token_seq(24, spec.vocab_size, 3);
  m.steps = {16, 4, 1, 1, 1};
  {
    CpuEngine cpu(m.w, pool, t.ctx);
    m.ref = run_steps(cpu, m.tokens, m.steps);
  }
  {  // a streamed shard must name a stream slot's offset
    PlanTable bad = table;
    int edited = 0;
    for (auto& tier : bad.tiers)
      for (Plan& p : tier.candidates)
        for (ShardPlacement& sp : p.placements)
          if (p.feasible && sp.streamed) sp.arena_offset += 64, ++edited;
    REQUIRE(edited > 0);
    auto d = t.device(emu(1, 0));
    CHECK_THROWS_WITH(Runtime(*m.src, m.w, *d, pool, bad, {}), Contains("must run on the GPU from a stream slot"));
  }
  int ran = 0;
  for (Schedule sched : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
    if (!feasible_somewhere(table, sched)) continue;
    INFO("schedule " << schedule_name(sched));
    RuntimeOptions o;
    o.schedule = sched;
    check_run(t, m, table, o, dev, cfg.budget_bytes, pool);
    ++ran;
  }
  CHECK(ran >= 2);
}

}  // namespace shardwise::test

namespace shardwise::test {
namespace {

// One step of the batched script: per sequence (slot) its new tokens; a negative count cuts the slot
// back to -count positions before the step (and adds no tokens).
using BatchScript = std::vector<std::vector<std::pair<int, int>>>;

const BatchScript& batch_script() {
  static const BatchScript s = {
      {{0, 7}, {1, 3}},           // two prompts in one step
      {{0, 1}, {1, 1}},           // both decode
      {{0, 1}, {1, 5}, {2, 9}},   // a decode, a second prompt chunk and a late prompt
      {{2, 1}, {0, 1}, {1, 1}},   // three decodes, not in slot order
      {{1, -4}, {1, 2}, {2, 1}},  // slot 1 cut back to 4 positions, continued with other tokens
      {{0, 20}, {1, 1}, {2, 1}},  // a step over the largest tier: run in chunks
      {{2, 1}},
  };
  return s;
}

// Each sequence's logits after each of its steps, in script order, run on `engine` in batched steps.
// Tokens come from streams[slot] in order (a cut-back slot goes on with the stream's next tokens).
std::vector<std::vector<float>> run_batch_script(StepEngine& engine, const std::vector<std::vector<int32_t>>& streams) {
  const int64_t V = engine.spec().vocab_size;
  std::vector<size_t> at(streams.size(), 0);
  std::vector<std::vector<float>> out(streams.size());
  for (const auto& step : batch_script()) {
    std::vector<SeqStep> seqs;
    std::vector<std::vector<float>> logits;
    logits.reserve(step.size());
    for (const auto& [slot, n] : step) {
      if (n < 0) {
        engine.truncate_slot(slot, -n);
        continue;
      }
      logits.emplace_back(static_cast<size_t>(V));
      seqs.push_back(
          {slot, streams[static_cast<size_t>(slot)].data() + at[static_cast<size_t>(slot)], n, logits.back().data()});
      at[static_cast<size_t>(slot)] += static_cast<size_t>(n);
    }
    engine.step_batch(seqs);
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto& o = out[static_cast<size_t>(seqs[i].slot)];
      o.insert(o.end(), logits[i].begin(), logits[i].end());
    }
  }
  return out;
}

// The same script, each sequence alone on a one-slot CPU engine over a KV cache of kv_dtype.
std::vector<std::vector<float>> alone_script(const ModelWeights& w, ThreadPool& pool, int64_t ctx,
                                             const std::vector<std::vector<int32_t>>& streams, DType kv_dtype) {
  std::vector<std::vector<float>> out(streams.size());
  for (size_t s = 0; s < streams.size(); ++s) {
    CpuEngine alone(w, pool, ctx, 1, kv_dtype);
    size_t at = 0;
    std::vector<float> logits(static_cast<size_t>(w.spec.vocab_size));
    for (const auto& step : batch_script())
      for (const auto& [slot, n] : step) {
        if (slot != static_cast<int>(s)) continue;
        if (n < 0) {
          alone.truncate(-n);
          continue;
        }
        alone.step(streams[s].data() + at, n, logits.data());
        at += static_cast<size_t>(n);
        out[s].insert(out[s].end(), logits.begin(), logits.end());
      }
  }
  return out;
}

}  // namespace

int check_batched(const RuntimeTarget& t, const WeightSource& src, const ModelWeights& w, double budget_frac,
                  const std::vector<Schedule>& schedules, const EmuOptions& dev, ThreadPool& pool, bool staged) {
  const int slots = 3;
  const int64_t V = src.spec().vocab_size;
  std::vector<std::vector<int32_t>> streams;
  for (int s = 0; s < slots; ++s) streams.push_back(token_seq(40, V, 100 + static_cast<uint32_t>(s)));
  const auto ref = alone_script(w, pool, t.ctx, streams, t.kv_dtype);
  {
    INFO(t.name << ": the CPU engine with " << slots << " slots");
    CpuEngine cpu(w, pool, t.ctx * slots, slots, t.kv_dtype);
    check_same_sequences(run_batch_script(cpu, streams), ref, V);
  }
  const RuntimeTarget shared = t.with_ctx(t.ctx * slots);
  const uint64_t budget = budget_at(shared, src, budget_frac);
  auto cost = make_analytic_cost_model(builtin_hardware(t.hardware));
  PlannerConfig cfg = planner_config(shared, src, budget);
  cfg.executor = executor_traits(src.spec(), 3, slots);
  if (staged) {
    cfg.kv_layers = 1;
    cfg.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
  }
  const PlanTable table = build_plan_table(src.spec(), *cost, cfg);
  int runs = 0, staged_runs = 0;
  for (Schedule s : schedules) {
    if (!feasible_somewhere(table, s)) continue;
    INFO(t.name << " " << src.spec().name << " budget " << budget << " schedule " << schedule_name(s));
    bool stages = false;
    for (const auto& tier : table.tiers)
      if (const Plan* p = tier.find(s); p && p->feasible)
        for (const Action& a : p->actions) stages = stages || a.part == ComputePart::AttnStaged;
    staged_runs += stages;
    auto d = t.device(dev);
    RuntimeOptions o;
    o.schedule = s;
    o.slots = slots;
    Runtime rt(src, w, *d, pool, table, o);
    check_same_sequences(run_batch_script(rt, streams), ref, V);
    check_memory(t, rt.memory(), budget);
    ++runs;
  }
  if (staged) CHECK(staged_runs >= 1);  // (elsewhere the planner stages where it chooses to)
  return runs;
}

}  // namespace shardwise::test

// Tests for the plan runtime on the emulated device: every schedule and baseline, at budgets that
// force streaming, produces the CPU reference's logits; switching tiers keeps pinned weights; a
// dropped dependency shows up as a wrong result; bad plans are refused.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/thread_pool.h"
#include "costmodel/cost_model.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/runtime/runtime.h"
#include "executor/session/kv_cache.h"
#include "planner/planner.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

// A model big enough that small budgets force every kind of placement, small enough for CI.
ModelSpec test_model(const char* family, DType dt) {
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
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seed * 2654435761u + 40503u * static_cast<uint32_t>(i)) % vocab));
  return t;
}

// Last-token logits after each step of `steps` (token counts), through the runtime.
std::vector<float> run_steps(Runtime& rt, const std::vector<int32_t>& toks, const std::vector<int>& steps) {
  std::vector<float> out;
  std::vector<float> logits(static_cast<size_t>(rt.spec().vocab_size));
  size_t at = 0;
  for (int n : steps) {
    rt.step(toks.data() + at, n, logits.data());
    out.insert(out.end(), logits.begin(), logits.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

// The same through the CPU-only model.
std::vector<float> reference_steps(const WeightSource& src, const std::vector<int32_t>& toks, const std::vector<int>& steps,
                                   int64_t ctx) {
  ThreadPool pool(2);
  ModelWeights w = ModelWeights::from_source(src);
  CpuEngine cpu(w, pool, ctx);
  std::vector<float> out, logits(static_cast<size_t>(src.spec().vocab_size));
  size_t at = 0;
  for (int n : steps) {
    cpu.step(toks.data() + at, n, logits.data());
    out.insert(out.end(), logits.begin(), logits.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

// The smallest budget the planner accepts for tiers {1, 4, 16} (on the cli2 cost model), rounded up
// to 1 MiB: the slack these tests were written with, which leaves the planner a choice of schedules.
uint64_t min_budget_for(const WeightSource& src, int64_t ctx) {
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlannerConfig c;
  c.budget_bytes = 1;
  c.ctx = ctx;
  c.tiers = {1, 4, 16};
  c.tensor_dtypes = tensor_dtypes_of(src);
  return (minimum_budget(src.spec(), *cost, c) + (1 << 20) - 1) / (1 << 20) * (1 << 20);
}

PlanTable table_for(const WeightSource& src, uint64_t budget, int64_t ctx, std::vector<int64_t> tiers,
                    PlannerConfig::HostKvAttention host_kv = PlannerConfig::HostKvAttention::Choose) {
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlannerConfig cfg;
  cfg.host_kv_attention = host_kv;
  cfg.budget_bytes = budget;
  cfg.ctx = ctx;
  cfg.threads = 2;
  cfg.tiers = std::move(tiers);
  cfg.tensor_dtypes = tensor_dtypes_of(src);
  return build_plan_table(src.spec(), *cost, cfg);
}

// Some tier of the table has a feasible plan of schedule s.
bool feasible_at_some_tier(const PlanTable& table, Schedule s) {
  for (const auto& t : table.tiers)
    if (const Plan* p = t.find(s); p && p->feasible) return true;
  return false;
}

// Some feasible plan of schedule s runs a host-KV layer's attention staged (plan.h, attn_staged).
bool stages_somewhere(const PlanTable& table, Schedule s) {
  for (const auto& t : table.tiers)
    if (const Plan* p = t.find(s); p && p->feasible)
      for (const Action& a : p->actions)
        if (a.part == ComputePart::AttnStaged) return true;
  return false;
}

}  // namespace

TEST_CASE("runtime on the emulated device matches the CPU model for every schedule", "[runtime]") {
  for (const char* family : {"llama", "qwen3", "qwen3_moe"}) {
    for (DType dt : {DType::F16, DType::Q8_0}) {
      const ModelSpec spec = test_model(family, dt);
      ThreadPool pool(2);
      auto src = make_synthetic_weights(spec, 17, &pool);
      ModelWeights w = ModelWeights::from_source(*src);
      const int64_t ctx = 64;
      const std::vector<int> steps = {13, 1, 1, 5, 1, 16, 1};  // prefill, decode, a small batch, chunks
      const auto toks = token_seq(40, spec.vocab_size, 3);
      const auto ref = reference_steps(*src, toks, steps, ctx);
      // Budgets from "almost nothing fits" to "everything fits".
      const uint64_t model_bytes = spec.total_bytes();
      int streamed_plans = 0;
      for (double frac : {0.15, 0.5, 2.0}) {
        const uint64_t min_b = min_budget_for(*src, ctx);
        const uint64_t budget = std::max<uint64_t>(min_b + (256u << 10), static_cast<uint64_t>(frac * static_cast<double>(model_bytes)));
        const PlanTable table = table_for(*src, budget, ctx, {1, 4, 16});
        for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe}) {
          if (!feasible_at_some_tier(table, s)) continue;
          INFO(family << " " << dtype_name(dt) << " budget " << budget << " schedule " << schedule_name(s));
          auto dev = make_emu_device({7, 50, 0});
          RuntimeOptions o;
          o.schedule = s;
          Runtime rt(*src, w, *dev, pool, table, o);
          const auto got = run_steps(rt, toks, steps);
          int64_t chunk = 0;
          for (const auto& a : rt.plan_for(1, &chunk).actions) streamed_plans += a.kind == ActionKind::CopyWeights;
          CHECK(test::max_rel_error(got, ref, spec.vocab_size) <= 1e-4);
          const RuntimeMemory m = rt.memory();
          CHECK(m.arena_peak_bytes <= budget);
          CHECK(m.device_peak_bytes <= budget);
        }
        // And the planner's own choice per tier.
        auto dev = make_emu_device({11, 50, 0});
        Runtime rt(*src, w, *dev, pool, table, {});
        CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      }
      CHECK(streamed_plans > 0);  // the small budgets made some plans stream weights
    }
  }
}

TEST_CASE("runtime: HF and llama.cpp fixtures on the emulated device", "[runtime][fixtures]") {
  const std::string fx = test::fixtures_dir();
  for (const std::string& path : {fx + "/hf/llama", fx + "/hf/qwen3moe_nonorm", fx + "/llamacpp/gguf/llama_small.q8_0.gguf",
                                 fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf"}) {
    auto src = open_weights(path);
    ModelWeights w = ModelWeights::from_source(*src);
    ThreadPool pool(2);
    const auto toks = token_seq(12, src->spec().vocab_size, 5);
    const std::vector<int> steps = {9, 1, 1, 1};
    const auto ref = reference_steps(*src, toks, steps, 32);
    const PlanTable table = table_for(*src, 2u << 20, 32, {1, 4, 16});
    for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
      if (!feasible_at_some_tier(table, s)) continue;
      INFO(path << " " << schedule_name(s));
      auto dev = make_emu_device({3, 30, 0});
      RuntimeOptions o;
      o.schedule = s;
      Runtime rt(*src, w, *dev, pool, table, o);
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, src->spec().vocab_size) <= 1e-4);
    }
  }
}

TEST_CASE("runtime: MoE decode routes on the device when the layer's experts are resident", "[runtime][moe]") {
  const ModelSpec spec = test_model("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 23, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  const std::vector<int> steps = {13, 1, 1, 4, 1, 9, 1};
  const auto toks = token_seq(40, spec.vocab_size, 4);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  auto router_copies = [](const Plan& p) {
    int c = 0;
    for (const auto& a : p.actions) c += a.payload == Payload::RouterLogits;
    return c;
  };
  // Everything fits: decode tiers route every layer on the device (no router-logits copy), the
  // 16-token tier on the host (one copy per layer).
  const PlanTable all = table_for(*src, 2 * spec.total_bytes(), ctx, {1, 4, 16});
  {
    RuntimeOptions o;
    o.schedule = Schedule::GpuOnly;
    auto dev = make_emu_device({3, 50, 0});
    Runtime rt(*src, w, *dev, pool, all, o);
    int64_t chunk = 0;
    CHECK(router_copies(rt.plan_for(1, &chunk)) == 0);
    CHECK(router_copies(rt.plan_for(4, &chunk)) == 0);
    CHECK(router_copies(rt.plan_for(16, &chunk)) == spec.num_hidden_layers);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
  }
  // Experts streamed: the host must know the routing to copy them, at every tier.
  const PlanTable small = table_for(*src, static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20), ctx, {1, 4, 16});
  {
    RuntimeOptions o;
    o.schedule = Schedule::GpuOnly;
    auto dev = make_emu_device({4, 50, 0});
    Runtime rt(*src, w, *dev, pool, small, o);
    int64_t chunk = 0;
    const Plan& p1 = rt.plan_for(1, &chunk);
    int streamed_ffn = 0;
    for (const auto& a : p1.actions) streamed_ffn += a.kind == ActionKind::CopyWeights && a.layer >= 0;
    REQUIRE(streamed_ffn > 0);
    CHECK(router_copies(p1) > 0);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
  }
}

TEST_CASE("runtime: Dynamic streams the attention of KV-in-VRAM layers that are not pinned, exactly", "[runtime]") {
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::Q8_0);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 41, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const std::vector<int> steps = {13, 1, 1, 4, 1, 20, 1};
    const auto toks = token_seq(41, spec.vocab_size, 8);
    const auto ref = reference_steps(*src, toks, steps, ctx);
    INFO(family);
    auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
    bool found = false;
    for (double frac : {0.06, 0.1, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65}) {
      PlannerConfig cfg;
      cfg.budget_bytes = static_cast<uint64_t>(frac * static_cast<double>(spec.total_bytes())) + (2u << 20);
      cfg.ctx = ctx;
      cfg.threads = 2;
      cfg.tiers = {1, 4, 16};
      cfg.tensor_dtypes = tensor_dtypes_of(*src);
      cfg.kv_layers = static_cast<int>(spec.num_hidden_layers);
      PlanTable t;
      try {
        t = build_plan_table(spec, *cost, cfg);
      } catch (const Error&) {
        continue;
      }
      const Plan* dyn = t.find_tier(1)->find(Schedule::Dynamic);
      if (!dyn->feasible) continue;
      bool streams_attention = false;
      for (const Action& a : dyn->actions)
        streams_attention |= a.kind == ActionKind::CopyWeights && a.shard >= 0 &&
                             dyn->placements[static_cast<size_t>(a.shard)].name.find("attn") != std::string::npos;
      if (!streams_attention) continue;
      found = true;
      INFO("budget " << cfg.budget_bytes);
      for (Schedule s : {Schedule::Dynamic, Schedule::GpuOnly}) {
        if (!t.find_tier(1)->find(s)->feasible) continue;  // GPU-only: two slots of an FFN beside all KV
        RuntimeOptions o;
        o.schedule = s;
        auto dev = make_emu_device({7, 60, 0});
        Runtime rt(*src, w, *dev, pool, t, o);
        CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      }
    }
    CHECK(found);
  }
}

TEST_CASE("runtime: decode steps of device-resident plans run as graphs, exactly", "[runtime][graphs]") {
  // The emulated device holds the CUDA rules of a capture: no queue and not the host may wait for
  // work recorded inside it, nor the capturing queue for another queue — a runtime that broke them
  // fails here with an error, one that left a captured action's event unset gives wrong logits.
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::Q8_0);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 31, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const std::vector<int> steps = {13, 1, 1, 4, 1, 9, 1, 1};  // 6 decode-sized steps (<= 8 tokens)
    const auto toks = token_seq(40, spec.vocab_size, 6);
    const auto ref = reference_steps(*src, toks, steps, ctx);
    INFO(family);
    const PlanTable all = table_for(*src, 4 * spec.total_bytes() + (64u << 20), ctx, {1, 4, 16});
    std::vector<float> plain;
    for (bool graphs : {false, true}) {
      RuntimeOptions o;
      o.schedule = Schedule::GpuOnly;
      o.cuda_graphs = graphs;
      auto dev = make_emu_device({5, 60, 0, {3, 1, 1, 1}});
      Runtime rt(*src, w, *dev, pool, all, o);
      const auto got = run_steps(rt, toks, steps);
      CHECK(test::max_rel_error(got, ref, spec.vocab_size) <= 1e-4);
      // Per decode step: its GPU compute actions in graphs of at most kGraphMaxActions.
      uint64_t expected = 0;
      for (int n : steps) {
        if (n > kDeviceRoutingMaxTokens) continue;
        int64_t chunk = 0;
        int computes = 0;
        for (const Action& a : rt.plan_for(n, &chunk).actions) computes += a.resource == Resource::GpuCompute;
        expected += static_cast<uint64_t>((computes + kGraphMaxActions - 1) / kGraphMaxActions);
      }
      REQUIRE(expected > 6);  // 9 compute actions per step: two graphs each
      CHECK(rt.graph_launches() == (graphs ? expected : 0u));
      if (!graphs) plain = got;
      else CHECK(got == plain);  // the same kernels in the same order: bit for bit
    }
    // Streamed weights (and for MoE the host's routing) keep the step off graphs; still exact.
    const PlanTable small = table_for(*src, static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20), ctx, {1, 4, 16});
    for (Schedule s : {Schedule::GpuOnly, Schedule::Static}) {
      RuntimeOptions o;
      o.schedule = s;
      o.cuda_graphs = true;
      auto dev = make_emu_device({6, 60, 0});
      Runtime rt(*src, w, *dev, pool, small, o);
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      CHECK(rt.graph_launches() == 0);
    }
  }
}

TEST_CASE("runtime: the measured timeline covers every action and respects every dependency", "[runtime][timeline]") {
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::F16);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 31, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const auto toks = token_seq(20, spec.vocab_size, 6);
    const std::vector<int> steps = {6, 1, 1};
    const PlanTable table = table_for(*src, static_cast<uint64_t>(0.4 * static_cast<double>(spec.total_bytes())) + (4u << 20), ctx, {1, 4, 16});
    for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
      if (!feasible_at_some_tier(table, s)) continue;
      INFO(family << " " << schedule_name(s));
      auto dev = make_emu_device({13, 80, 0});
      RuntimeOptions o;
      o.schedule = s;
      o.timeline_runs = 2;  // the first two plan runs of three steps
      Runtime rt(*src, w, *dev, pool, table, o);
      run_steps(rt, toks, steps);
      const auto& tl = rt.timeline();
      int64_t chunk = 0;
      const Plan& p6 = rt.plan_for(6, &chunk);
      const Plan& p1 = rt.plan_for(1, &chunk);
      REQUIRE(tl.size() == p6.actions.size() + p1.actions.size());
      for (int run = 0; run < 2; ++run) {
        const Plan& p = run == 0 ? p6 : p1;
        std::vector<const TimelineEntry*> by_id(p.actions.size(), nullptr);
        for (const auto& t : tl)
          if (t.run == run) by_id.at(static_cast<size_t>(t.action)) = &t;
        for (const Action& a : p.actions) {
          const TimelineEntry* t = by_id[static_cast<size_t>(a.id)];
          REQUIRE(t != nullptr);
          CHECK(t->resource == a.resource);
          CHECK(t->start_ms >= 0);
          CHECK(t->end_ms >= t->start_ms);
          for (int d : a.deps) CHECK(t->start_ms >= by_id[static_cast<size_t>(d)]->end_ms);
          if (a.resource == Resource::Cpu) {
            CHECK(t->enqueue_start_ms == -1);
          } else {  // a device action cannot start before the host enqueued it
            CHECK(t->enqueue_start_ms >= 0);
            CHECK(t->enqueue_end_ms >= t->enqueue_start_ms);
            CHECK(t->start_ms >= t->enqueue_start_ms - 0.05);
          }
        }
      }
    }
  }
}

TEST_CASE("a dropped dependency shows up as a wrong result", "[runtime]") {
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 5, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const auto toks = token_seq(8, spec.vocab_size, 9);
  // A budget where GPU-only streams most shards through the two slots: the host-KV layers' attention
  // split (one step of 8 tokens, as when this count was calibrated), and staged over host caches in
  // three steps (the rows a step copies back are what the next one stages: kv_new, kv_past).
  const uint64_t budget = static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20);
  for (auto hk : {PlannerConfig::HostKvAttention::Split, PlannerConfig::HostKvAttention::Staged}) {
    const std::vector<int> steps = hk == PlannerConfig::HostKvAttention::Split ? std::vector<int>{8} : std::vector<int>{5, 1, 2};
    const auto ref = reference_steps(*src, toks, steps, 16);
    const PlanTable table = table_for(*src, budget, 16, {1, 16}, hk);
    RuntimeOptions o;
    o.schedule = Schedule::GpuOnly;
    if (hk == PlannerConfig::HostKvAttention::Staged) {
      bool stages = false;
      for (const Action& a : table.find_tier(16)->find(Schedule::GpuOnly)->actions) stages = stages || a.payload == Payload::KvNew;
      REQUIRE(stages);  // the premise: this table's layout keeps some KV on the host
    }
    {
      auto dev = make_emu_device({1, 300, 0});
      Runtime rt(*src, w, *dev, pool, table, o);
      REQUIRE(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    }
    // Not every wait guards a race that the random delays expose in one run (about 1 in 3 does), so
    // many single drops: with none of them effective the runtime would need no waits at all.
    int wrong = 0;
    const int drops = hk == PlannerConfig::HostKvAttention::Split ? 24 : 48;  // three steps: more waits
    for (int drop = 1; drop <= drops; ++drop) {
      auto dev = make_emu_device({static_cast<uint64_t>(drop), 300, drop});
      Runtime rt(*src, w, *dev, pool, table, o);
      const double err = test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size);
      if (!(err <= 1e-4)) ++wrong;
    }
    WARN(wrong << " of " << drops << " runs with one dropped wait were wrong ("
                << (hk == PlannerConfig::HostKvAttention::Split ? "split" : "staged") << ")");
    CHECK(wrong >= 3);
  }
}

TEST_CASE("runtime: attention staged over a host KV cache matches the CPU reference", "[runtime]") {
  // One layer's KV in VRAM, the others' on the host; every GPU attention of those runs staged: the
  // cached rows go up in the host's head-major layout, are laid out for the device, attended, and the
  // step's rows come back — prefill from an empty cache, then steps over a filled one.
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::F16);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 29, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const std::vector<int> steps = {13, 1, 5, 16, 1, 3, 1};
    const auto toks = token_seq(40, spec.vocab_size, 9);
    const auto ref = reference_steps(*src, toks, steps, ctx);
    auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
    PlannerConfig cfg;
    cfg.budget_bytes = spec.total_bytes();  // room to pin much; slots and the staging fit
    cfg.ctx = ctx;
    cfg.threads = 2;
    cfg.tiers = {1, 4, 16};
    cfg.tensor_dtypes = tensor_dtypes_of(*src);
    cfg.kv_layers = 1;
    cfg.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
    const PlanTable table = build_plan_table(spec, *cost, cfg);
    int staged_plans = 0;
    for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
      if (!feasible_at_some_tier(table, s)) continue;
      const bool stages = stages_somewhere(table, s);
      staged_plans += stages;
      INFO(family << " " << schedule_name(s) << (stages ? " (staged)" : ""));
      auto dev = make_emu_device({19, 50, 0});
      RuntimeOptions o;
      o.schedule = s;
      Runtime rt(*src, w, *dev, pool, table, o);
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      CHECK(rt.memory().arena_peak_bytes <= cfg.budget_bytes);
    }
    CHECK(staged_plans > 0);
  }
}

TEST_CASE("emulated device: work behind a host fence waits until the host raises it", "[runtime][device]") {
  auto dev = make_emu_device({5, 20, 0});
  uint8_t* arena = dev->allocate_arena(4096);
  std::vector<uint8_t> host(64, 7), back(64, 0);
  const Event f1 = dev->host_fence(), f2 = dev->host_fence();
  REQUIRE(f1.valid());
  CHECK(f1.queue == kHostFenceQueue);
  CHECK_FALSE(dev->event_done(f1));
  dev->wait(Queue::H2DAct, f2);
  dev->copy_h2d(arena, host.data(), 64, Queue::H2DAct);  // behind fence 2
  const Event copied = dev->record(Queue::H2DAct);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(dev->event_done(copied));  // held
  CHECK_THROWS_WITH(dev->host_wait(f1), Contains("has not raised"));  // would never return
  dev->raise_fence(f1);
  CHECK(dev->event_done(f1));
  CHECK_FALSE(dev->event_done(f2));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(dev->event_done(copied));  // fence 1 raised, not 2
  dev->raise_fence(f2);
  dev->host_wait(copied);
  dev->copy_d2h(back.data(), arena, 64);
  dev->synchronize();
  CHECK(back == host);
  // Raising a later fence raises the ones before it; a device without fences gives an invalid one.
  const Event f3 = dev->host_fence(), f4 = dev->host_fence();
  dev->raise_fence(f4);
  CHECK(dev->event_done(f3));
  EmuOptions none;
  none.host_fences = false;
  CHECK_FALSE(make_emu_device(none)->host_fence().valid());
  // A fence made and never raised does not hang the device's teardown.
  auto other = make_emu_device({6, 0, 0});
  uint8_t* a2 = other->allocate_arena(4096);
  other->wait(Queue::H2D, other->host_fence());
  other->copy_h2d(a2, host.data(), 64);
}

TEST_CASE("runtime: an MoE layer's experts split between CPU and GPU (Dynamic) match the CPU reference", "[runtime][moe]") {
  // Every CPU FFN layer of the Dynamic plans split with share c: the CPU computes c of each token's 2
  // experts from host memory while the GPU's are copied and run, then adds the CPU's partial — decode
  // and prefill steps, queues with random delays (a missing dependency would read a stale partial or x).
  const ModelSpec spec = test_model("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 31, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  const std::vector<int> steps = {13, 1, 5, 16, 1, 3, 1};
  const auto toks = token_seq(40, spec.vocab_size, 13);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlannerConfig cfg;
  cfg.budget_bytes = min_budget_for(*src, ctx) + spec.total_bytes() / 8;  // some FFNs stay on the host
  cfg.ctx = ctx;
  cfg.threads = 2;
  cfg.tiers = {1, 4, 16};
  cfg.tensor_dtypes = tensor_dtypes_of(*src);
  cfg.moe_cpu_experts = 1;
  const PlanTable table = build_plan_table(spec, *cost, cfg);
  int cpu_shares = 0, gpu_shares = 0, partials = 0, adds = 0;
  for (const auto& t : table.tiers)
    if (const Plan* p = t.find(Schedule::Dynamic); p && p->feasible)
      for (const Action& a : p->actions) {
        cpu_shares += a.part == ComputePart::MoeCpuShare;
        gpu_shares += a.part == ComputePart::MoeGpuShare;
        partials += a.payload == Payload::MoePartial;
        adds += a.part == ComputePart::MoeShareAdd;
        if (a.part == ComputePart::MoeCpuShare || a.part == ComputePart::MoeGpuShare || a.part == ComputePart::MoeShareAdd)
          CHECK(a.cpu_experts == 1);
      }
  REQUIRE(cpu_shares > 0);  // the premise: the budget leaves CPU FFN layers to split
  CHECK(gpu_shares == cpu_shares);
  CHECK(partials == cpu_shares);
  CHECK(adds == cpu_shares);
  // Equal random delays, then copies down slow (x must reach the host before the GPU's experts add to it).
  for (uint64_t seed : {23u, 24u, 25u}) {
    EmuOptions eo;
    eo.seed = seed;
    eo.max_delay_us = 60;
    if (seed == 25u) eo.queue_scale[static_cast<int>(Queue::D2H)] = 6;
    auto dev = make_emu_device(eo);
    RuntimeOptions o;
    o.schedule = Schedule::Dynamic;
    Runtime rt(*src, w, *dev, pool, table, o);
    INFO("seed " << seed);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    CHECK(rt.memory().arena_peak_bytes <= cfg.budget_bytes);
  }
  // With a pool of two, a split layer's CPU share starts before the host enqueues the layer's routed
  // expert copy and GPU share (it enqueues them while the other thread computes); with one thread, or
  // SHARDWISE_SHARE_FIRST=0, it enqueues them first. Exact either way.
  for (const auto& [threads, env] : std::vector<std::pair<int, const char*>>{{2, nullptr}, {1, nullptr}, {2, "0"}}) {
    const bool first = threads > 1 && !env;
    if (env) setenv("SHARDWISE_SHARE_FIRST", env, 1);
    ThreadPool p(threads);
    auto dev = make_emu_device({29, 40, 0});
    RuntimeOptions o;
    o.schedule = Schedule::Dynamic;
    o.timeline_runs = 1000;
    Runtime rt(*src, w, *dev, p, table, o);
    unsetenv("SHARDWISE_SHARE_FIRST");
    INFO(threads << " thread(s), SHARDWISE_SHARE_FIRST " << (env ? env : "unset"));
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    struct Layer {
      double share_start = -1, first_enqueue = 1e300, last_enqueue_end = -1;
    };
    std::map<std::pair<int, std::string>, Layer> layers;  // (run, shard) of every split layer
    for (const TimelineEntry& t : rt.timeline()) {
      const std::string shard = t.label.substr(0, t.label.find(' '));
      const bool routed = t.label.find("moe_gpu_share") != std::string::npos ||
                          (t.resource == Resource::H2D && t.label.find("guessed") == std::string::npos &&
                           (t.label.find("weights") != std::string::npos || t.label.find("missed") != std::string::npos));
      Layer& l = layers[{t.run, shard}];
      if (t.label.find("moe_cpu_share") != std::string::npos) l.share_start = t.start_ms;
      if (routed) {
        l.first_enqueue = std::min(l.first_enqueue, t.enqueue_start_ms);
        l.last_enqueue_end = std::max(l.last_enqueue_end, t.enqueue_end_ms);
      }
    }
    int split = 0, beside = 0, before = 0;
    for (const auto& [key, l] : layers) {
      if (l.share_start < 0 || l.last_enqueue_end < 0) continue;
      ++split;
      beside += l.first_enqueue >= l.share_start;
      before += l.last_enqueue_end <= l.share_start;
    }
    REQUIRE(split > 0);
    CHECK((first ? beside : before) == split);
  }
  // With host fences (SHARDWISE_HOST_FENCE=1) the work after a split layer's CPU share — its partial's
  // copy up — is enqueued before the share ends, and runs after it; exact under random queue delays.
  for (const char* fence : {"1", "0"}) {
    setenv("SHARDWISE_HOST_FENCE", fence, 1);
    for (uint64_t seed : {41u, 42u}) {
      ThreadPool p(2);
      auto dev = make_emu_device({seed, 60, 0});
      RuntimeOptions o;
      o.schedule = Schedule::Dynamic;
      o.timeline_runs = 1000;
      Runtime rt(*src, w, *dev, p, table, o);
      INFO("SHARDWISE_HOST_FENCE=" << fence << ", seed " << seed);
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      std::map<std::pair<int, std::string>, double> share_end, partial_enqueued, partial_start;
      for (const TimelineEntry& t : rt.timeline()) {
        const std::pair<int, std::string> key{t.run, t.label.substr(0, t.label.find(' '))};
        if (t.label.find("moe_cpu_share") != std::string::npos) share_end[key] = t.end_ms;
        if (t.resource == Resource::H2DAct && t.label.find("cpu share") != std::string::npos) {
          partial_enqueued[key] = t.enqueue_start_ms;
          partial_start[key] = t.start_ms;
        }
      }
      REQUIRE(!share_end.empty());
      int ahead = 0;
      for (const auto& [key, end] : share_end) {
        REQUIRE(partial_enqueued.count(key));
        ahead += partial_enqueued[key] < end;
        CHECK(partial_start[key] >= end - 0.05);  // never before the share is computed
      }
      if (std::string(fence) == "1") CHECK(ahead == static_cast<int>(share_end.size()));
      else CHECK(ahead == 0);
    }
  }
  unsetenv("SHARDWISE_HOST_FENCE");
  // A bad value of either switch is refused when the runtime is made, naming it.
  for (const auto& [var, value] : std::vector<std::pair<const char*, const char*>>{{"SHARDWISE_HOST_FENCE", "2"},
                                                                                  {"SHARDWISE_SHARE_FIRST", "yes"}}) {
    setenv(var, value, 1);
    auto dev = make_emu_device({1, 0, 0});
    RuntimeOptions o;
    o.schedule = Schedule::Dynamic;
    CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, table, o), Contains(std::string(var) + "=" + value + ": give 1"));
    unsetenv(var);
  }
  // A plan that splits a dense model's FFN, or names a share of all top_k, is refused at load.
  PlanTable bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (auto& a : p.actions)
        if (a.part == ComputePart::MoeCpuShare) a.cpu_experts = static_cast<int>(spec.num_experts_per_tok);
  auto dev = make_emu_device({1, 0, 0});
  RuntimeOptions o;
  o.schedule = Schedule::Dynamic;
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("cpu_experts 2 must be 1 .. 1"));
  // A split layer whose CPU share is gone (run whole instead: its experts would be computed twice), or
  // whose expert copy brings every routed expert while the shares split them, is refused at load.
  bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (auto& a : p.actions)
        if (a.part == ComputePart::MoeCpuShare) {
          a.part = ComputePart::Full;
          a.cpu_experts = 0;
        }
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("moe_cpu_share) runs on cpu but its shard and part belong on the GPU"));
  // A plan saved before the GPU share ran beside the CPU's (the share added the partial itself): refused.
  bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (auto& a : p.actions)
        if (a.part == ComputePart::MoeShareAdd) a.part = ComputePart::Full;
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("layer 0's FFN is not computed exactly once"));
  bad = table;
  int copies = 0;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (auto& a : p.actions)
        if (a.kind == ActionKind::CopyWeights && a.cpu_experts > 0) {
          a.cpu_experts = 0;
          ++copies;
        }
  REQUIRE(copies > 0);  // the premise: some split layer's experts are copied
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("name different cpu_experts"));
}

namespace {
// A device that forwards everything to another and counts the host's waits on the weight-copy queue's
// events: the host needs to wait only for routing (copied down) and for what CPU work reads; waiting
// on a weight copy stalls the host for a layer's bytes while later copies could be enqueued.
class CopyWaitCounter : public Device {
 public:
  explicit CopyWaitCounter(Device& d) : d_(d) {}
  int host_waits_on_copies = 0;
  std::map<uint64_t, int> batch_copies_by_rows;  // copy_h2d_batch's copies (Device::HostCopy) by their rows
  std::string kind() const override { return d_.kind(); }
  std::string name() const override { return d_.name(); }
  uint8_t* allocate_arena(uint64_t bytes) override { return d_.allocate_arena(bytes); }
  void pin_host(const void* ptr, uint64_t bytes) override { d_.pin_host(ptr, bytes); }
  void unpin_host(const void* ptr, uint64_t bytes) override { d_.unpin_host(ptr, bytes); }
  uint64_t pinned_host_bytes() const override { return d_.pinned_host_bytes(); }
  void set_pcie_cap(double bytes_per_s) override { d_.set_pcie_cap(bytes_per_s); }
  void copy_h2d(uint8_t* dev, const void* host, uint64_t bytes, Queue q) override { d_.copy_h2d(dev, host, bytes, q); }
  void copy_h2d_batch(const HostCopy* copies, size_t count, Queue q) override {
    for (size_t i = 0; i < count; ++i) batch_copies_by_rows[copies[i].rows] += 1;
    d_.copy_h2d_batch(copies, count, q);
  }
  void copy_d2h(void* host, const uint8_t* dev, uint64_t bytes) override { d_.copy_d2h(host, dev, bytes); }
  void copy_d2d(uint8_t* dst, const uint8_t* src, uint64_t bytes) override { d_.copy_d2d(dst, src, bytes); }
  Event record(Queue q) override { return d_.record(q); }
  void wait(Queue q, const Event& e) override { d_.wait(q, e); }
  void host_wait(const Event& e) override {
    host_waits_on_copies += e.queue == static_cast<int>(Queue::H2D);
    d_.host_wait(e);
  }
  bool event_done(const Event& e) override { return d_.event_done(e); }
  void synchronize() override { d_.synchronize(); }
  void begin_timeline() override { d_.begin_timeline(); }
  Event timestamp(Queue q) override { return d_.timestamp(q); }
  double timestamp_ms(const Event& e) override { return d_.timestamp_ms(e); }
  DeviceKernels& kernels(const ModelSpec& spec, RopeStyle rope) override { return d_.kernels(spec, rope); }
  uint64_t context_bytes() const override { return d_.context_bytes(); }
  uint64_t device_peak_bytes() override { return d_.device_peak_bytes(); }

 private:
  Device& d_;
};
}  // namespace

TEST_CASE("runtime: experts prefetched on the layer before's guess match the CPU reference, guesses right or wrong",
          "[runtime][moe]") {
  // Streamed MoE FFNs; with speculative expert prefetch (plan.h router_next) each layer's
  // guessed experts are copied into its slot while the layer before runs, and its own copy then brings
  // only the routed experts the guess missed into the places of the guesses not routed. Guessing with
  // the router, with the lowest logits (nearly all wrong) and half and half, under random queue delays.
  const ModelSpec spec = test_model("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 37, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  const std::vector<int> steps = {13, 1, 5, 16, 1, 3, 1};
  const auto toks = token_seq(40, spec.vocab_size, 17);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlannerConfig cfg;
  cfg.budget_bytes = min_budget_for(*src, ctx) + spec.total_bytes() / 3;  // the attention pinned, experts streamed
  cfg.ctx = ctx;
  cfg.threads = 2;
  cfg.tiers = {1, 4, 16};
  cfg.tensor_dtypes = tensor_dtypes_of(*src);
  cfg.next_layer_hits = 1.0;
  cfg.always_speculate = true;  // (this tiny model's copies are too short for the guess to pay)
  // GPU-only (whole layers' experts guessed), and Dynamic with its CPU layers split (the GPU's share guessed).
  PlanTable table;
  for (Schedule sched : {Schedule::GpuOnly, Schedule::Dynamic}) {
    cfg.schedules = {sched};
    cfg.moe_cpu_experts = sched == Schedule::Dynamic ? 1 : -1;
    const PlanTable t = build_plan_table(spec, *cost, cfg);
    if (sched == Schedule::GpuOnly) table = t;
    int speculative = 0, split = 0;
    for (const auto& tier : t.tiers)
      if (const Plan* p = tier.find(sched); p && p->feasible)
        for (const Action& a : p->actions) {
          speculative += a.speculative;
          split += a.speculative && a.cpu_experts == 1;
        }
    INFO(schedule_name(sched));
    REQUIRE(speculative > 0);  // the premise: the plans copy experts on guesses
    if (sched == Schedule::Dynamic) REQUIRE(split > 0);  // ... split layers' GPU shares among them
    using G = RuntimeOptions::GuessTest;
    for (G mode : {G::Router, G::Lowest, G::Mixed})
      for (uint64_t seed : {41u, 42u}) {
        EmuOptions eo;
        eo.seed = seed;
        eo.max_delay_us = 60;
        if (seed == 42u) eo.queue_scale[static_cast<int>(Queue::H2D)] = 6;  // copies slow: a missing wait reads old experts
        auto dev = make_emu_device(eo);
        RuntimeOptions o;
        o.schedule = sched;
        o.guess_test = mode;
        Runtime rt(*src, w, *dev, pool, t, o);
        INFO("seed " << seed << ", guess " << static_cast<int>(mode));
        CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
        const RuntimeGuesses g = rt.guesses();
        CHECK(g.guessed > 0);
        // A guess picks as many experts per token as the routing (of a split layer, the GPU's share of them).
        CHECK(g.guessed * 4 <= g.routed * 5);
        CHECK(g.hits <= g.guessed);
        CHECK(g.hits <= g.routed);
        if (mode == G::Lowest) CHECK(g.hits < g.routed / 2);  // most routed experts were copied after the routing
        else CHECK(g.hits > 0);
        if (mode == G::Mixed) CHECK(g.hits < g.routed);  // hits kept in their places, misses beside them
      }
    // The host never waits for a weight copy: with the routing slow to come down (so the miss copies
    // are the host's earliest work, waiting for it) and copies slow, the next layer's guess is still
    // enqueued while this layer's guessed experts are being copied.
    EmuOptions eo;
    eo.seed = 43;
    eo.max_delay_us = 60;
    eo.queue_scale[static_cast<int>(Queue::H2D)] = 6;
    eo.queue_scale[static_cast<int>(Queue::D2H)] = 3;
    auto emu = make_emu_device(eo);
    CopyWaitCounter dev(*emu);
    RuntimeOptions o;
    o.schedule = sched;
    Runtime rt(*src, w, dev, pool, t, o);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    CHECK(dev.host_waits_on_copies == 0);
  }
  // A speculative copy without its layer's guess, or without the layer's own copy after it, is refused.
  auto dev = make_emu_device({1, 0, 0});
  RuntimeOptions o;
  o.schedule = Schedule::GpuOnly;
  PlanTable bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (auto& a : p.actions)
        if (a.speculative) a.deps.erase(std::remove_if(a.deps.begin(), a.deps.end(), [&](int d) {
                                          return p.actions[static_cast<size_t>(d)].payload == Payload::RouterGuess;
                                        }), a.deps.end());
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("depends on its layer's guessed router logits"));
  bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (size_t i = 0; i < p.actions.size(); ++i)
        if (p.actions[i].speculative)
          for (size_t j = i + 1; j < p.actions.size(); ++j)
            if (p.actions[j].kind == ActionKind::CopyWeights && p.actions[j].shard == p.actions[i].shard) p.actions[j].slot = 1 - p.actions[j].slot;
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("into the same slot"));
}

TEST_CASE("runtime: strided expert copies keep every step exact (one copy per expert in a synthetic model)", "[runtime][moe]") {
  // RuntimeOptions::strided_expert_copies: a streamed routed expert's gate, up and down slices go as
  // strided copies (Device::HostCopy rows) where their host distances allow. A synthetic model stores a
  // layer's gate, up and down expert tensors back to back: one copy of three rows per expert.
  const ModelSpec spec = test_model("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 43, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 48;
  const std::vector<int> steps = {9, 1, 4, 1, 1};
  const auto toks = token_seq(16, spec.vocab_size, 9);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  const PlanTable table = table_for(*src, min_budget_for(*src, ctx) + spec.total_bytes() / 4, ctx, {1, 4, 16});  // experts streamed
  for (Schedule s : {Schedule::GpuOnly, Schedule::Dynamic}) {
    if (!feasible_at_some_tier(table, s)) continue;
    for (bool strided : {false, true}) {
      INFO(schedule_name(s) << (strided ? " strided" : " split"));
      EmuOptions eo;
      eo.seed = 47;
      eo.max_delay_us = 40;
      eo.queue_scale[static_cast<int>(Queue::H2D)] = 4;  // copies slow: a row landing late reads old experts
      auto emu = make_emu_device(eo);
      CopyWaitCounter dev(*emu);
      RuntimeOptions o;
      o.schedule = s;
      o.strided_expert_copies = strided;
      Runtime rt(*src, w, dev, pool, table, o);
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      const auto& by_rows = dev.batch_copies_by_rows;
      if (strided) {
        CHECK(by_rows.count(3));  // the experts, one copy each
        CHECK(!by_rows.count(2));
      } else {
        CHECK(by_rows.count(1));
        CHECK(by_rows.size() == 1);
      }
    }
  }
  // A strided copy whose rows would overlap is refused with one line.
  auto dev = make_emu_device({1, 0, 0});
  uint8_t* arena = dev->allocate_arena(1 << 16);
  std::vector<uint8_t> host(1 << 16);
  const Device::HostCopy overlap{arena, host.data(), 4096, 3, 1024, 4096};
  CHECK_THROWS_WITH(dev->copy_h2d_batch(&overlap, 1), Contains("would overlap its own rows"));
}

TEST_CASE("expert_copies_of: the copies a streamed expert takes, for the planner, as the runtime makes them", "[runtime][moe]") {
  // Synthetic weights (gate, up, down tensors in that order): one strided copy, whether counted on the
  // weights or on the spec alone (the sweep plans synthetic models before making them); three split.
  for (DType dt : {DType::F16, DType::Q8_0}) {
    const ModelSpec spec = test_model("qwen3_moe", dt);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 5, &pool);
    INFO(dtype_name(dt));
    CHECK(expert_copies_of(*src, true) == 1);
    CHECK(synthetic_expert_copies(spec, true) == 1);
    CHECK(expert_copies_of(*src, false) == 3);
    CHECK(synthetic_expert_copies(spec, false) == 3);
  }
  // llama.cpp's files (down, gate, up): gate and up as one copy, down alone.
  for (const char* f : {"qwen3moe_small.f16.gguf", "qwen3moe_small.q8_0.gguf"}) {
    auto src = open_weights(test::fixtures_dir() + "/llamacpp/gguf/" + f);
    INFO(f);
    CHECK(expert_copies_of(*src, true) == 2);
  }
  // A dense model has no experts to copy.
  const ModelSpec dense = test_model("llama", DType::F16);
  CHECK(synthetic_expert_copies(dense, true) == 3);
}

TEST_CASE("push_expert_copies: an expert's slices as few strided copies as their host distances allow", "[runtime][moe]") {
  // A place of gate, up, down (128-byte slices, 128 apart) and three host tensors of 8 experts each; the
  // expert's slices where the tensors lie in a synthetic model's order, llama.cpp's, or apart.
  ShardLayout L;
  L.expert_up_offset = 128;
  L.expert_down_offset = 256;
  std::vector<uint8_t> host(1 << 16), place(384);
  const uint64_t T = 8 * 128;  // one tensor's bytes
  auto view = [&](uint64_t off, uint64_t bytes = 128) {
    TensorView v;
    v.data = host.data() + off;
    v.nbytes = bytes;
    return v;
  };
  auto copies = [&](uint64_t g, uint64_t u, uint64_t d, bool strided, uint64_t bytes_d = 128) {
    std::vector<Device::HostCopy> out;
    push_expert_copies(out, place.data(), L, view(g), view(u), view(d, bytes_d), strided);
    uint64_t bytes = 0;
    for (const auto& c : out) bytes += c.bytes * c.rows;
    CHECK(bytes == 256 + bytes_d);  // every byte once
    return out;
  };
  const uint64_t e = 3 * 128;  // expert 3's slices
  // Split: three copies whatever the layout.
  CHECK(copies(e, T + e, 2 * T + e, false).size() == 3);
  // gate, up, down back to back: one copy of three rows, T apart on the host, 128 in the place.
  auto one = copies(e, T + e, 2 * T + e, true);
  REQUIRE(one.size() == 1);
  CHECK(one[0].rows == 3);
  CHECK(one[0].host_pitch == T);
  CHECK(one[0].dev_pitch == 128);
  CHECK(one[0].dev == place.data());
  CHECK(one[0].host == host.data() + e);
  // llama.cpp's down, gate, up: gate and up as one copy of two rows, down alone.
  auto two = copies(T + e, 2 * T + e, e, true);
  REQUIRE(two.size() == 2);
  CHECK(two[0].rows == 2);
  CHECK(two[0].dev == place.data());
  CHECK(two[0].host == host.data() + T + e);
  CHECK(two[1].rows == 1);
  CHECK(two[1].dev == place.data() + 256);
  CHECK(two[1].host == host.data() + e);
  // up, down back to back after a gate elsewhere: gate alone, then up and down as one.
  auto tail = copies(5 * T + e, e, T + e, true);
  REQUIRE(tail.size() == 2);
  CHECK(tail[0].rows == 1);
  CHECK(tail[1].rows == 2);
  // Unequal distances: the pair at one distance as one copy, the third alone.
  CHECK(copies(e, T + e, 3 * T + e, true).size() == 2);
  CHECK(copies(e, T + e, 2 * T + e, true, 64).size() == 2);  // down of another size alone
  // Host addresses falling in the place's order (no row after the one before), or rows closer than their
  // size: three copies.
  CHECK(copies(2 * T + e, T + e, e, true).size() == 3);
  CHECK(copies(e, e + 64, e + 128, true).size() == 3);
}

TEST_CASE("runtime: switching schedules between steps keeps every step exact (the oracle's one set-up)", "[runtime]") {
  // The sweep measures all candidates of a configuration with one runtime, switching its schedule
  // (Runtime::set_schedule): the plans of different schedules pin different prefixes and put their
  // stream slots over each other's pinned shards, so every switch must re-upload what the last
  // schedule's slots overwrote.
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::F16);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 23, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const std::vector<int> steps = {13, 1, 1, 5, 1, 16, 1, 1, 1, 1};
    const auto toks = token_seq(41, spec.vocab_size, 5);
    const auto ref = reference_steps(*src, toks, steps, ctx);
    for (double frac : {0.15, 0.5}) {
      const uint64_t budget = std::max<uint64_t>(min_budget_for(*src, ctx) + (256u << 10),
                                                 static_cast<uint64_t>(frac * static_cast<double>(spec.total_bytes())));
      const PlanTable table = table_for(*src, budget, ctx, {1, 4, 16});
      std::vector<Schedule> feasible;
      for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe}) {
        if (feasible_at_some_tier(table, s)) feasible.push_back(s);
      }
      INFO(family << " budget " << budget << ": " << feasible.size() << " feasible schedules");
      REQUIRE(feasible.size() >= 2);
      auto dev = make_emu_device({13, 50, 0});
      RuntimeOptions o;
      o.schedule = feasible.front();
      Runtime rt(*src, w, *dev, pool, table, o);
      std::vector<float> got, logits(static_cast<size_t>(spec.vocab_size));
      size_t at = 0;
      uint64_t reuploaded = 0;
      for (size_t i = 0; i < steps.size(); ++i) {
        const Schedule s = feasible[i % feasible.size()];
        if (i > 0) rt.set_schedule(s);
        rt.step(toks.data() + at, steps[i], logits.data());
        got.insert(got.end(), logits.begin(), logits.end());
        at += static_cast<size_t>(steps[i]);
        CHECK(rt.steps().back().schedule == s);
        const RuntimeMemory m = rt.memory();
        CHECK(m.arena_peak_bytes <= budget);
        if (i >= feasible.size()) reuploaded += m.uploaded_bytes;  // a schedule's second turn
      }
      CHECK(test::max_rel_error(got, ref, spec.vocab_size) <= 1e-4);
      // Back to the table's own choice per tier.
      rt.set_schedule(std::nullopt);
      rt.reset();
      CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
      if (frac < 0.2) CHECK(reuploaded > 0);  // slots had overwritten pinned shards: uploaded again
    }
  }
  // A schedule without a feasible plan is refused, and the runtime keeps its schedule.
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 3, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = table_for(*src, 64u << 20, 64, {1, 4, 16});  // everything fits
  auto dev = make_emu_device({3, 10, 0});
  Runtime rt(*src, w, *dev, pool, table, {});
  CHECK_THROWS_WITH(rt.set_schedule(Schedule::CpuMoe), Contains("no feasible plan"));
  std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
  const auto toks = token_seq(4, spec.vocab_size, 1);
  rt.step(toks.data(), 4, logits.data());
  CHECK(rt.steps().back().schedule != Schedule::CpuMoe);
}

TEST_CASE("runtime: pinned weights survive tier switches, and bad plans are refused", "[runtime]") {
  const ModelSpec spec = test_model("qwen3", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 2, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = table_for(*src, 64u << 20, 64, {1, 4, 16});
  auto dev = make_emu_device({2, 10, 0});
  Runtime rt(*src, w, *dev, pool, table, {});
  const auto toks = token_seq(30, spec.vocab_size, 1);
  std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
  rt.step(toks.data(), 16, logits.data());
  const uint64_t after_first = rt.memory().uploaded_bytes;
  CHECK(after_first > 0);
  for (int i = 0; i < 4; ++i) rt.step(toks.data() + 16 + i, 1, logits.data());
  rt.step(toks.data() + 20, 4, logits.data());
  // Everything fits: nothing is uploaded twice.
  CHECK(rt.memory().uploaded_bytes == after_first);
  CHECK_THROWS_WITH(rt.step(toks.data(), 64, logits.data()), Contains("context is full"));
  // A table for a different model is refused.
  const ModelSpec other = test_model("qwen3", DType::Q8_0);
  auto src2 = make_synthetic_weights(other, 2, &pool);
  const PlanTable t2 = table_for(*src2, 64u << 20, 64, {1, 4, 16});
  auto dev2 = make_emu_device({2, 10, 0});
  CHECK_THROWS_WITH(Runtime(*src, w, *dev2, pool, t2, {}), Contains("another"));
}


// The activations crossing PCIe are staged in pinned host memory sized for the largest tier; the
// runtime unpins it before unmapping it (a freed range left registered would have the driver copy
// to its old pages), also when its set-up throws after pinning.
TEST_CASE("runtime: the pinned activation staging is unpinned when the runtime goes, also after a failed set-up",
          "[runtime]") {
  for (const char* family : {"llama", "qwen3_moe"}) {
    INFO(family);
    const ModelSpec spec = test_model(family, DType::F16);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 4, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const PlanTable table = table_for(*src, 64u << 20, 64, {1, 4, 16});
    auto dev = make_emu_device({3, 10, 0});
    REQUIRE(dev->pinned_host_bytes() == 0);
    uint64_t with_runtime = 0;
    {
      Runtime rt(*src, w, *dev, pool, table, {});
      with_runtime = dev->pinned_host_bytes();
      // A second runtime on this device fails at its arena, after pinning its own staging.
      CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, table, {}), Contains("arena"));
      CHECK(dev->pinned_host_bytes() == with_runtime);
      const auto toks = token_seq(20, spec.vocab_size, 2);
      std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
      rt.step(toks.data(), 16, logits.data());
      rt.step(toks.data() + 16, 1, logits.data());
      CHECK(std::isfinite(logits[0]));
      CHECK(dev->pinned_host_bytes() == with_runtime);  // steps pin nothing more
    }
    // What stays pinned is the weights (the source outlives the runtime): less than before by at
    // least the staging of 16 tokens' x, q/k/v and attention output and the logits.
    const uint64_t staged = static_cast<uint64_t>(
        16 * (spec.hidden_size + spec.q_dim() + 2 * spec.kv_dim() + spec.q_dim()) + spec.vocab_size) * 4;
    CHECK(dev->pinned_host_bytes() > 0);
    CHECK(dev->pinned_host_bytes() + staged <= with_runtime);
  }
}
// A plan table is input (run --plan FILE): every row range, offset and slot it names is checked
// against the model and the budget when the runtime loads it, with one error naming the plan, the
// action and the value; none of these may reach a kernel (found by tests/fuzz: a row_end of 2^40 on
// the LM head's piece read past the arena).
TEST_CASE("runtime: plans naming rows, offsets, slots or shards outside the model or budget are refused", "[runtime]") {
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 6, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = table_for(*src, min_budget_for(*src, 32), 32, {1, 4, 16});
  // The first feasible plan's LM head computation (a piece of it when streamed in pieces).
  int ti = -1, ci = -1, ai = -1;
  for (size_t t = 0; t < table.tiers.size() && ai < 0; ++t)
    for (size_t c = 0; c < table.tiers[t].candidates.size() && ai < 0; ++c) {
      const Plan& p = table.tiers[t].candidates[c];
      if (!p.feasible) continue;
      for (const Action& a : p.actions)
        if (a.kind == ActionKind::Compute && a.label.rfind("output", 0) == 0) {
          ti = static_cast<int>(t), ci = static_cast<int>(c), ai = a.id;
          break;
        }
    }
  REQUIRE(ai >= 0);
  {
    auto dev = make_emu_device({1, 0, 0});
    CHECK_NOTHROW(Runtime(*src, w, *dev, pool, table, {}));  // the unedited table loads
  }
  auto refused = [&](const std::function<void(Plan&)>& edit, const std::string& says) {
    PlanTable bad = table;
    edit(bad.tiers[static_cast<size_t>(ti)].candidates[static_cast<size_t>(ci)]);
    auto dev = make_emu_device({1, 0, 0});
    CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, {}), Contains(says));
  };
  const size_t a = static_cast<size_t>(ai);
  refused([&](Plan& p) { p.actions[a].row_end = int64_t(1) << 40; }, "the LM head's row pieces end at row 1099511627776");
  refused([&](Plan& p) { p.actions[a].row_end = spec.vocab_size + 1; }, "the LM head's row pieces end at row");
  refused([&](Plan& p) { p.actions[a].slot = 2; }, "stream slot 2");
  refused([&](Plan& p) { p.actions[a].shard = 100000; }, "names shard 100000");
  refused([&](Plan& p) { p.actions[a].layer = static_cast<int>(spec.num_hidden_layers); }, "names layer");
  refused([&](Plan& p) { p.arena.back().offset = table.budget_bytes; }, "lies outside the budget");
  refused([&](Plan& p) { p.arena.back().bytes = ~uint64_t(0); }, "lies outside the budget");
  refused([&](Plan& p) {
    for (ShardPlacement& sp : p.placements)
      if (sp.arena_offset >= 0 && sp.home == WeightHome::Pinned) sp.arena_offset = static_cast<int64_t>(table.budget_bytes);
  }, "lies outside the 'pinned' region");
  refused([&](Plan& p) { p.kv_on_gpu.pop_back(); }, "kv_on_gpu names");
  refused([&](Plan& p) {  // two shards of equal size (two layers' attention) named in each other's place
    for (size_t i = 0; i < p.placements.size(); ++i)
      for (size_t j = i + 1; j < p.placements.size(); ++j)
        if (p.placements[i].bytes == p.placements[j].bytes && p.placements[i].name != p.placements[j].name) {
          std::swap(p.placements[i].shard, p.placements[j].shard);
          return;
        }
  }, "placements are listed by shard id");
}

// Regression (the H200 study of badb9e5: every nemo8b plan at 2G refused): a streamed LM head larger
// than the space from its stream slot to the end of the budget is valid — it goes in row pieces — and
// the load-time checks must accept it. And each piece's GEMV must read its own slot: the copy of the
// next piece (into the other slot) is issued before it, so "the slot the head was copied into last"
// is the wrong one (every piece but the last computed from its successor's rows).
TEST_CASE("runtime: an LM head larger than the budget streams in row pieces, loads and runs exactly", "[runtime]") {
  ModelSpec spec = test_model("llama", DType::F16);
  spec.vocab_size = 16384;  // an 8 MiB LM head; the layers are ~5 MiB
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 7, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 32;
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlannerConfig cfg;
  cfg.ctx = ctx;
  cfg.threads = 2;
  cfg.tiers = {1, 4, 16};
  cfg.tensor_dtypes = tensor_dtypes_of(*src);
  cfg.lm_head_piece_bytes = 1 << 20;  // as nemo8b's 1 GiB head against 256 MiB pieces
  const uint64_t head_bytes = static_cast<uint64_t>(spec.vocab_size) * static_cast<uint64_t>(spec.hidden_size) * 2;
  cfg.budget_bytes = head_bytes - (1 << 20);
  const PlanTable table = build_plan_table(spec, *cost, cfg);
  bool pieces = false;
  for (const auto& tier : table.tiers)
    for (const Plan& p : tier.candidates)
      for (const Action& a : p.actions) pieces = pieces || (p.feasible && a.row_end > a.row_begin);
  REQUIRE(pieces);
  const std::vector<int32_t> toks = token_seq(24, spec.vocab_size, 3);
  const std::vector<int> steps = {16, 4, 1, 1, 1};
  const std::vector<float> ref = reference_steps(*src, toks, steps, ctx);
  {  // a streamed shard must name a stream slot's offset
    PlanTable bad = table;
    int edited = 0;
    for (auto& tier : bad.tiers)
      for (Plan& p : tier.candidates)
        for (ShardPlacement& sp : p.placements)
          if (p.feasible && sp.streamed) sp.arena_offset += 64, ++edited;
    REQUIRE(edited > 0);
    auto dev = make_emu_device({1, 0, 0});
    CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, {}), Contains("must run on the GPU from a stream slot"));
  }
  int ran = 0;
  for (Schedule sched : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
    if (!feasible_at_some_tier(table, sched)) continue;
    INFO("schedule " << schedule_name(sched));
    auto dev = make_emu_device({5, 50, 0});
    RuntimeOptions opt;
    opt.schedule = sched;
    Runtime rt(*src, w, *dev, pool, table, opt);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    ++ran;
  }
  CHECK(ran >= 2);
}

// Regression: on an MoE model, gpu-only at the smallest budget streams both shards of every layer
// (attention into one slot, the routed experts into the other). The experts' block read the FFN norm
// from the attention shard's slot, which the plan only protects until the attention has run: the copy
// of the next attention shard into that slot could overwrite it while the experts ran (rarely with the
// emulated device's per-item delays; every time with none, the copy queue running ahead of the compute
// queue's wake-up — as on a GPU, whose copy engine runs ahead of the kernels). Each compute must read
// only its own shard's weights.
TEST_CASE("runtime: gpu-only MoE experts never read the attention shard's stream slot", "[runtime]") {
  const ModelSpec spec = test_model("qwen3_moe", DType::Q8_0);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 17, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  const std::vector<int> steps = {13, 1, 1, 5, 1, 16, 1};
  const auto toks = token_seq(40, spec.vocab_size, 3);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  // The budget the first test case fails at (its smallest: the minimum plus 256 KiB).
  const uint64_t budget = min_budget_for(*src, ctx) + (256u << 10);
  const PlanTable table = table_for(*src, budget, ctx, {1, 4, 16});
  RuntimeOptions o;
  o.schedule = Schedule::GpuOnly;
  // The race needs an attention shard and its layer's experts both streamed: check that the plans
  // still stream them (else this test no longer tests anything).
  const TensorDtypes dtypes = tensor_dtypes_of(*src);
  const ShardSet shards = make_shards(spec, ctx, DType::F32, &dtypes);
  int feasible = 0;
  for (const auto& t : table.tiers) {
    const Plan* p = t.find(Schedule::GpuOnly);
    if (!p || !p->feasible) continue;
    ++feasible;
    std::vector<bool> attn_streamed(static_cast<size_t>(spec.num_hidden_layers), false);
    int both = 0;
    for (const auto& a : p->actions)
      if (a.kind == ActionKind::CopyWeights && a.shard >= 0) {
        const Shard& s = shards.at(a.shard);
        if (s.kind == ShardKind::Attention) attn_streamed[static_cast<size_t>(s.layer)] = true;
        if (s.kind == ShardKind::Ffn && attn_streamed[static_cast<size_t>(s.layer)]) ++both;
      }
    INFO("tier " << t.tokens << ", budget " << budget);
    REQUIRE(both >= 2);
  }
  REQUIRE(feasible > 0);
  // Many seeds: no delays (the copy queue runs ahead), small ones and larger ones (other orders).
  int runs = 0, wrong = 0;
  for (const int delay_us : {0, 20, 200})
    for (uint64_t seed = 1; seed <= (delay_us == 0 ? 16u : delay_us == 20 ? 5u : 4u); ++seed) {
      auto dev = make_emu_device({seed, delay_us, 0});
      Runtime rt(*src, w, *dev, pool, table, o);
      const double err = test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size);
      ++runs;
      if (!(err <= 1e-4)) {
        ++wrong;
        UNSCOPED_INFO("emu seed " << seed << ", max delay " << delay_us << " us: max_rel_error " << err);
      }
    }
  INFO(wrong << " of " << runs << " runs were wrong");
  CHECK(wrong == 0);
}

TEST_CASE("runtime: queues at unequal speeds keep every schedule exact", "[runtime]") {
  // One queue running many items ahead of another is what exposes a slot or buffer reused too early
  // (equal random delays rarely do): compute slow with copies instant, copies slow, D2H slow.
  const double skews[][kNumQueues] = {{4, 0, 0, 0}, {0, 4, 1, 0}, {0, 1, 4, 4}};
  for (const char* family : {"llama", "qwen3", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::Q8_0);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 23, &pool);
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 64;
    const std::vector<int> steps = {13, 1, 1, 5, 1, 16, 1};
    const auto toks = token_seq(40, spec.vocab_size, 9);
    const auto ref = reference_steps(*src, toks, steps, ctx);
    const uint64_t min_b = min_budget_for(*src, ctx);
    for (uint64_t budget : {min_b + (256u << 10), std::max<uint64_t>(min_b + (256u << 10), spec.total_bytes() / 2)}) {
      const PlanTable table = table_for(*src, budget, ctx, {1, 4, 16});
      for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe}) {
        if (!feasible_at_some_tier(table, s)) continue;
        for (int k = 0; k < 3; ++k) {
          INFO(family << " budget " << budget << " schedule " << schedule_name(s) << " skew " << k);
          EmuOptions eo;
          eo.seed = 5 + static_cast<uint64_t>(k);
          eo.max_delay_us = 60;
          for (int q = 0; q < kNumQueues; ++q) eo.queue_scale[q] = skews[k][q];
          auto dev = make_emu_device(eo);
          RuntimeOptions o;
          o.schedule = s;
          Runtime rt(*src, w, *dev, pool, table, o);
          CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
        }
      }
    }
  }
}

TEST_CASE("runtime: a schedule keeping the KV cache elsewhere is refused by set_schedule, runs in its own runtime",
          "[runtime]") {
  // layer-split keeps the KV of its last N layers in VRAM, the candidates of a table the first k: at a
  // budget where they differ, one runtime cannot serve both (its caches are placed once).
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 29, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 1024;  // llama.cpp's 512-token compute buffer dwarfs this model: budgets of MiBs
  const std::vector<int> steps = {9, 1, 1};
  const auto toks = token_seq(11, spec.vocab_size, 4);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  int differing = 0;
  for (uint64_t mib = 8; mib <= 24; mib += 2) {
    const uint64_t budget = mib << 20;
    if (budget < min_budget_for(*src, ctx)) continue;
    const PlanTable table = table_for(*src, budget, ctx, {1, 4, 16});
    const Plan* ls = nullptr;
    for (const auto& t : table.tiers)
      if (const Plan* p = t.find(Schedule::LayerSplit); p && p->feasible) ls = p;
    if (!ls || ls->kv_on_gpu == table.kv_on_gpu) continue;
    ++differing;
    INFO("budget " << budget);
    auto dev = make_emu_device({11, 50, 0});
    Runtime rt(*src, w, *dev, pool, table, {});
    CHECK(rt.keeps_kv_as(std::nullopt));
    CHECK_FALSE(rt.keeps_kv_as(Schedule::LayerSplit));
    CHECK_THROWS_WITH(rt.set_schedule(Schedule::LayerSplit), Contains("KV cache elsewhere"));
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);  // still the table's
    auto dev2 = make_emu_device({11, 50, 0});
    RuntimeOptions o;
    o.schedule = Schedule::LayerSplit;
    Runtime own(*src, w, *dev2, pool, table, o);
    CHECK(own.keeps_kv_as(Schedule::LayerSplit));
    CHECK_FALSE(own.keeps_kv_as(std::nullopt));
    CHECK(test::max_rel_error(run_steps(own, toks, steps), ref, spec.vocab_size) <= 1e-4);
    CHECK(own.steps().back().schedule == Schedule::LayerSplit);
  }
  CHECK(differing > 0);  // the premise: some budget makes the placements differ
}

TEST_CASE("runtime: fill_host_cache gives the host caches data that a step over them reads", "[runtime]") {
  // The oracle measures a step over a cache filled to ctx without a prefill; pages never written would
  // be read as the shared zero page, from cache. The fill must reach exactly the caches on the host.
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 17, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  const PlanTable table = table_for(*src, min_budget_for(*src, ctx) + (256u << 10), ctx, {1, 4, 16});
  int host_layers = 0;
  for (bool g : table.kv_on_gpu) host_layers += g ? 0 : 1;
  REQUIRE(host_layers > 0);
  const auto toks = token_seq(1, spec.vocab_size, 9);
  auto step_after = [&](int fill_seed) {
    auto dev = make_emu_device({7, 50, 0});
    Runtime rt(*src, w, *dev, pool, table, {});
    if (fill_seed >= 0) rt.fill_host_cache(ctx - 1, static_cast<uint64_t>(fill_seed));
    CHECK(rt.n_past() == 0);
    rt.set_n_past(ctx - 1);
    std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
    rt.step(toks.data(), 1, logits.data());
    CHECK_THROWS_WITH(rt.fill_host_cache(ctx + 1, 1), Contains("outside the context"));
    return logits;
  };
  const auto a = step_after(5), b = step_after(5), unfilled = step_after(-1), other = step_after(6);
  CHECK(a == b);                                                  // deterministic by seed
  CHECK(test::max_rel_error(a, unfilled, spec.vocab_size) > 1e-3);  // the step read the filled rows
  CHECK(test::max_rel_error(a, other, spec.vocab_size) > 1e-3);
  for (float x : a) CHECK(std::isfinite(x));
}

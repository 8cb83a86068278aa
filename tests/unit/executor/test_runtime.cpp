// Tests for the plan runtime on the emulated device: the runtime behaviour suite (runtime_suite.h,
// which CUDA runs too) with the emulated device's models and planner settings, then what only the
// emulated device shows: random and unequal queue delays, a dropped dependency as a wrong result, the
// measured timeline, host waits and copies counted, and bad plans refused.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
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
#include "runtime_suite.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;

namespace {

// The suite's target here: the emulated device, planned on the cli2 machine at ctx 64, tiers 1, 4, 16.
RuntimeTarget emulated() {
  RuntimeTarget t;
  t.name = "emulated";
  t.device = [](const EmuOptions& o) { return make_emu_device(o); };
  t.hardware = "cli2";
  t.ctx = 64;
  t.threads = 2;
  t.tiers = {1, 4, 16};
  t.same_tokens = true;
  return t;
}

ModelSpec test_model(const char* family, DType dt) {
  return suite_spec(family, dt);
}

// The CPU engine's last-token logits after each step.
std::vector<float> reference_steps(const WeightSource& src, const std::vector<int32_t>& toks,
                                   const std::vector<int>& steps, int64_t ctx) {
  ThreadPool pool(2);
  ModelWeights w = ModelWeights::from_source(src);
  CpuEngine cpu(w, pool, ctx);
  return run_steps(cpu, toks, steps);
}

// The smallest budget the planner accepts at ctx for the emulated target's tiers.
uint64_t min_budget_for(const WeightSource& src, int64_t ctx) {
  return min_budget(emulated().with_ctx(ctx), src);
}

PlanTable table_for(const WeightSource& src, uint64_t budget, int64_t ctx, std::vector<int64_t> tiers,
                    PlannerConfig::HostKvAttention host_kv = PlannerConfig::HostKvAttention::Choose) {
  RuntimeTarget t = emulated().with_ctx(ctx);
  t.tiers = std::move(tiers);
  return plan_table(t, src, budget, host_kv);
}

bool feasible_at_some_tier(const PlanTable& table, Schedule s) {
  return feasible_somewhere(table, s);
}

// A step at the last position over host caches filled by fill_host_cache (not by a prefill), on a plan
// of t keeping some layers' KV on the host: the fill is deterministic by seed and the step reads it.
void check_fill_host_cache(const WeightSource& src, const ModelWeights& w, const RuntimeTarget& t, ThreadPool& pool) {
  const ModelSpec& spec = src.spec();
  const int64_t ctx = t.ctx;
  const PlanTable table = plan_table(t, src, min_budget(t, src) + (256u << 10));
  CHECK(table.kv_dtype == dtype_name(t.kv_dtype));
  int host_layers = 0;
  for (bool g : table.kv_on_gpu) host_layers += g ? 0 : 1;
  REQUIRE(host_layers > 0);
  const auto toks = token_seq(1, spec.vocab_size, 9);
  auto step_after = [&](int fill_seed) {
    auto dev = make_emu_device({7, 50, 0});
    Runtime rt(src, w, *dev, pool, table, {});
    if (fill_seed >= 0) rt.fill_host_cache(ctx - 1, static_cast<uint64_t>(fill_seed));
    CHECK(rt.n_past() == 0);
    rt.set_n_past(ctx - 1);
    std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
    rt.step(toks.data(), 1, logits.data());
    CHECK_THROWS_WITH(rt.fill_host_cache(ctx + 1, 1), Contains("outside the context"));
    return logits;
  };
  const auto a = step_after(5), b = step_after(5), unfilled = step_after(-1), other = step_after(6);
  CHECK(a == b);                                                    // deterministic by seed
  CHECK(test::max_rel_error(a, unfilled, spec.vocab_size) > 1e-3);  // the step read the filled rows
  CHECK(test::max_rel_error(a, other, spec.vocab_size) > 1e-3);
  for (float x : a) CHECK(std::isfinite(x));
}

}  // namespace

// ---- the runtime behaviour suite on the emulated device ----------------------------------------------------

TEST_CASE(
    "runtime suite (emulated): every schedule and the table's choice match the CPU model at budgets from almost "
    "nothing to everything",
    "[runtime]") {
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3", "qwen3_moe", "qwen2"}) {
    for (DType dt : {DType::F16, DType::Q8_0}) {
      ThreadPool pool(2);
      const SuiteModel m = suite_model(make_synthetic_weights(test_model(family, dt), 17, &pool), t.ctx,
                                       {13, 1, 1, 5, 1, 16, 1}, 3, pool);
      int streamed = 0;
      for (double frac : {0.15, 0.5, 2.0})
        streamed += check_every_schedule(t, m, budget_at(t, *m.src, frac), all_schedules(), emu(7, 50), pool);
      INFO(family << " " << dtype_name(dt));
      CHECK(streamed > 0);  // the small budgets made some plans stream weights
    }
  }
}

// A 16-bit or q8_0 KV cache: the device's caches, the host's, and the staging between them hold f16 (or
// bf16) rows (half the bytes), or q8_0 blocks (17/64 of them); every schedule matches the CPU engine over
// the same cache type (logits and greedy tokens) as the f32 ones match f32.
TEST_CASE("runtime suite (emulated): with an f16, bf16 or q8_0 KV cache every schedule matches the CPU engine",
          "[runtime][kv_f16]") {
  for (const auto& [family, kv] :
       {std::pair{"llama", DType::F16}, std::pair{"qwen3_moe", DType::F16}, std::pair{"qwen2", DType::F16},
        std::pair{"qwen3_moe", DType::BF16}, std::pair{"qwen3_moe", DType::Q8_0}, std::pair{"qwen2", DType::Q8_0}}) {
    const RuntimeTarget t = emulated().with_kv_dtype(kv);
    ThreadPool pool(2);
    const SuiteModel m = suite_model(make_synthetic_weights(test_model(family, DType::Q8_0), 17, &pool), t.ctx,
                                     {13, 1, 1, 5, 1, 16, 1}, 3, pool, 40, kv);
    const SuiteModel m32 = suite_model(make_synthetic_weights(test_model(family, DType::Q8_0), 17, &pool), t.ctx,
                                       {13, 1, 1, 5, 1, 16, 1}, 3, pool);
    INFO(family << " " << dtype_name(kv));
    CHECK(m.ref != m32.ref);  // the reference really keeps a 16-bit or q8_0 cache
    const PlanTable table = plan_table(t, *m.src, budget_at(t, *m.src, 0.5));
    CHECK(table.kv_dtype == dtype_name(kv));
    for (double frac : {0.15, 0.5, 2.0})
      check_every_schedule(t, m, budget_at(t, *m.src, frac), all_schedules(), emu(7, 50), pool);
    CHECK(check_staged_attention(t, m, budget_at(t, *m.src, 2.0), emu(19, 50), pool) > 0);
    if (kv == DType::Q8_0)  // several sequences' rows in one cache, on the device and on the host (staged)
      CHECK(check_batched(t, *m.src, m.w, 0.5, {Schedule::GpuOnly, Schedule::Dynamic}, emu(6, 40), pool, true) >= 1);
  }
}

TEST_CASE("runtime: a device whose kernels keep f32 KV only refuses an f16 plan table in one line",
          "[runtime][kv_f16]") {
  const RuntimeTarget t = emulated().with_kv_dtype(DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(test_model("llama", DType::F16), 5, &pool);
  const ModelWeights w = ModelWeights::from_source(*src);
  EmuOptions o = emu(1, 0);
  o.kv_f16 = false;
  auto dev = make_emu_device(o);
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, plan_table(t, *src, budget_at(t, *src, 0.5)), RuntimeOptions{}),
                    Contains("keeps the KV cache in f32 only") && Contains("f16") && Contains("--kv-dtype f32"));
}

TEST_CASE("runtime suite (emulated): HF and llama.cpp fixtures run every schedule", "[runtime][fixtures]") {
  const RuntimeTarget t = emulated().with_ctx(32);
  const std::string fx = test::fixtures_dir();
  for (const std::string& path :
       {fx + "/hf/llama", fx + "/hf/qwen3moe_nonorm", fx + "/llamacpp/gguf/llama_small.q8_0.gguf",
        fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf"}) {
    ThreadPool pool(2);
    const SuiteModel m = suite_model(open_weights(path), t.ctx, {9, 1, 1, 1}, 5, pool, 12);
    check_every_schedule(t, m, 2u << 20, {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}, emu(3, 30), pool);
  }
}

// llama-quantize's mixes (tests/fixtures/kquants): tensors of several block types in one model, laid out,
// streamed and computed per tensor, at a budget that holds part of the model.
TEST_CASE("runtime suite (emulated): llama-quantize's K-quant mixes run every schedule", "[runtime][kquants]") {
  const RuntimeTarget t = emulated().with_ctx(32);
  const std::string fx = test::fixtures_dir() + "/kquants/";
  for (const char* f : {"kq_llama.Q4_K_M.gguf", "kq_llama.Q3_K_M.gguf", "kq_moe.Q2_K.gguf"}) {
    INFO(f);
    ThreadPool pool(2);
    const SuiteModel m = suite_model(open_weights(fx + f), t.ctx, {9, 1, 1, 1}, 5, pool, 12);
    check_every_schedule(t, m, budget_at(t, *m.src, 0.4), {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic},
                         emu(3, 30), pool);
  }
}

TEST_CASE("runtime suite (emulated): MoE decode routes on the device when the layer's experts are resident",
          "[runtime][moe]") {
  const RuntimeTarget t = emulated();
  ThreadPool pool(2);
  const SuiteModel m = suite_model(make_synthetic_weights(test_model("qwen3_moe", DType::F16), 23, &pool), t.ctx,
                                   {13, 1, 1, 4, 1, 9, 1}, 4, pool);
  check_device_routing(t, m, emu(3, 50), pool);
}

TEST_CASE("runtime suite (emulated): Dynamic streams the attention of KV-in-VRAM layers that are not pinned, exactly",
          "[runtime]") {
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3_moe"}) {
    ThreadPool pool(2);
    const SuiteModel m = suite_model(make_synthetic_weights(test_model(family, DType::Q8_0), 41, &pool), t.ctx,
                                     {13, 1, 1, 4, 1, 20, 1}, 8, pool, 41);
    check_dynamic_streams_attention(t, m, emu(7, 60), pool);
  }
}

TEST_CASE("runtime suite (emulated): decode steps of device-resident plans run as graphs, exactly",
          "[runtime][graphs]") {
  // The emulated device holds the CUDA rules of a capture: no queue and not the host may wait for
  // work recorded inside it, nor the capturing queue for another queue — a runtime that broke them
  // fails here with an error, one that left a captured action's event unset gives wrong logits.
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::Q8_0);
    ThreadPool pool(2);
    // 6 decode-sized steps (<= 8 tokens)
    const SuiteModel m =
        suite_model(make_synthetic_weights(spec, 31, &pool), t.ctx, {13, 1, 1, 4, 1, 9, 1, 1}, 6, pool);
    INFO(family);
    EmuOptions slow_compute = emu(5, 60);
    slow_compute.queue_scale[0] = 3;
    const GraphCount g = check_graphs(t, m, 4 * spec.total_bytes() + (64u << 20), slow_compute, pool);
    REQUIRE(g.expected > 6);  // 9 compute actions per step: two graphs each
    CHECK(g.launches == g.expected);
    check_streaming_runs_no_graphs(
        t, m, static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20), emu(6, 60), pool);
  }
}

TEST_CASE("runtime suite (emulated): attention staged over a host KV cache matches the CPU reference", "[runtime]") {
  // One layer's KV in VRAM, the others' on the host; every GPU attention of those runs staged: the
  // cached rows go up in the host's head-major layout, are laid out for the device, attended, and the
  // step's rows come back — prefill from an empty cache, then steps over a filled one.
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = test_model(family, DType::F16);
    ThreadPool pool(2);
    const SuiteModel m = suite_model(make_synthetic_weights(spec, 29, &pool), t.ctx, {13, 1, 5, 16, 1, 3, 1}, 9, pool);
    INFO(family);
    // Room to pin much; slots and the staging fit.
    CHECK(check_staged_attention(t, m, spec.total_bytes(), emu(19, 50), pool) > 0);
  }
}

TEST_CASE(
    "runtime suite (emulated): switching schedules between steps keeps every step exact (the oracle's one set-up)",
    "[runtime]") {
  // The sweep measures all candidates of a configuration with one runtime, switching its schedule
  // (Runtime::set_schedule): the plans of different schedules pin different prefixes and put their
  // stream slots over each other's pinned shards, so every switch must re-upload what the last
  // schedule's slots overwrote.
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3_moe"}) {
    ThreadPool pool(2);
    const SuiteModel m = suite_model(make_synthetic_weights(test_model(family, DType::F16), 23, &pool), t.ctx,
                                     {13, 1, 1, 5, 1, 16, 1, 1, 1, 1}, 5, pool, 41);
    for (double frac : {0.15, 0.5})
      check_schedule_switching(t, m, budget_at(t, *m.src, frac), frac < 0.2, emu(13, 50), pool);
  }
  ThreadPool pool(2);
  check_infeasible_schedule_refused(t, emu(3, 10), pool);
}

TEST_CASE("runtime suite (emulated): pinned weights survive tier switches, and bad plans are refused", "[runtime]") {
  ThreadPool pool(2);
  check_pinned_across_tiers(emulated(), emu(2, 10), pool);
}

// A streamed LM head larger than the space from its stream slot to the end of the budget is valid — it
// goes in row pieces — and the load-time checks must accept it; each piece's GEMV must read its own
// slot (the copy of the next piece, into the other slot, is issued before it).
TEST_CASE("runtime suite (emulated): an LM head larger than the budget streams in row pieces, loads and runs exactly",
          "[runtime]") {
  ThreadPool pool(2);
  check_lm_head_pieces(emulated().with_ctx(32), emu(5, 50), pool);
}

// ---- what the emulated device alone shows -------------------------------------------------------------------

TEST_CASE("runtime: a device refuses a model with a weight type its kernels lack and names the tensor", "[runtime]") {
  ThreadPool pool(2);
  auto src = open_weights(test::fixtures_dir() + "/kquants/kq_llama.Q4_K_M.gguf");
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = table_for(*src, budget_at(emulated(), *src, 1.0), 32, {1, 4});
  EmuOptions cuda_like;
  cuda_like.dtypes = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  auto dev = make_emu_device(cuda_like);
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, table, RuntimeOptions{}),
                    Contains("q4_K") && Contains(".weight") && Contains("emu device cannot compute"));
  EmuOptions all;
  auto dev_all = make_emu_device(all);
  CHECK_NOTHROW(Runtime(*src, w, *dev_all, pool, table, RuntimeOptions{}));
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
    const PlanTable table = table_for(
        *src, static_cast<uint64_t>(0.4 * static_cast<double>(spec.total_bytes())) + (4u << 20), ctx, {1, 4, 16});
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
    const std::vector<int> steps =
        hk == PlannerConfig::HostKvAttention::Split ? std::vector<int>{8} : std::vector<int>{5, 1, 2};
    const auto ref = reference_steps(*src, toks, steps, 16);
    const PlanTable table = table_for(*src, budget, 16, {1, 16}, hk);
    RuntimeOptions o;
    o.schedule = Schedule::GpuOnly;
    if (hk == PlannerConfig::HostKvAttention::Staged) {
      bool stages = false;
      for (const Action& a : table.find_tier(16)->find(Schedule::GpuOnly)->actions)
        stages = stages || a.payload == Payload::KvNew;
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

TEST_CASE(
    "runtime suite (emulated): an MoE layer's experts split between CPU and GPU (Dynamic) match the CPU reference",
    "[runtime][moe]") {
  // Every CPU FFN layer of the Dynamic plans split with share c: the CPU computes c of each token's 2
  // experts from host memory while the GPU's are copied and run, then adds the CPU's partial — decode
  // and prefill steps, queues with random delays (a missing dependency would read a stale partial or x).
  // The suite's check, then the order of the host's work (the timeline) and refused plans.
  const RuntimeTarget t = emulated();
  const ModelSpec spec = suite_spec("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  const SuiteModel m = suite_model(make_synthetic_weights(spec, 31, &pool), t.ctx, {13, 1, 5, 16, 1, 3, 1}, 13, pool);
  const WeightSource* src = m.src.get();
  const ModelWeights& w = m.w;
  const std::vector<int32_t>& toks = m.tokens;
  const std::vector<int>& steps = m.steps;
  const std::vector<float>& ref = m.ref;
  const uint64_t budget = min_budget(t, *src) + spec.total_bytes() / 8;  // some FFNs stay on the host
  // Equal random delays, then copies down slow (x must reach the host before the GPU's experts add to it).
  std::vector<EmuOptions> devs = {emu(23, 60), emu(24, 60), emu(25, 60)};
  devs.back().queue_scale[static_cast<int>(Queue::D2H)] = 6;
  const PlanTable table = check_moe_split(t, m, 1, budget, devs, pool);
  // With a pool of two, a split layer's CPU share starts before the host enqueues the layer's routed
  // expert copy and GPU share (it enqueues them while the other thread computes); with one thread it
  // enqueues them first. Exact either way.
  for (int threads : {2, 1}) {
    const bool first = threads > 1;
    ThreadPool p(threads);
    auto dev = make_emu_device({29, 40, 0});
    RuntimeOptions o;
    o.schedule = Schedule::Dynamic;
    o.timeline_runs = 1000;
    Runtime rt(*src, w, *dev, p, table, o);
    INFO(threads << " thread(s)");
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    struct Layer {
      double share_start = -1, first_enqueue = 1e300, last_enqueue_end = -1;
    };
    std::map<std::pair<int, std::string>, Layer> layers;  // (run, shard) of every split layer
    for (const TimelineEntry& t : rt.timeline()) {
      const std::string shard = t.label.substr(0, t.label.find(' '));
      const bool routed =
          t.label.find("moe_gpu_share") != std::string::npos ||
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
  // The work after a split layer's CPU share — its partial's copy up — is enqueued once the share is
  // computed, and runs after it; exact under random queue delays.
  for (uint64_t seed : {41u, 42u}) {
    ThreadPool p(2);
    auto dev = make_emu_device({seed, 60, 0});
    RuntimeOptions o;
    o.schedule = Schedule::Dynamic;
    o.timeline_runs = 1000;
    Runtime rt(*src, w, *dev, p, table, o);
    INFO("seed " << seed);
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
    for (const auto& [key, end] : share_end) {
      REQUIRE(partial_enqueued.count(key));
      CHECK(partial_enqueued[key] >= end);
      CHECK(partial_start[key] >= end - 0.05);  // never before the share is computed
    }
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
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o),
                    Contains("moe_cpu_share) runs on cpu but its shard and part belong on the GPU"));
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
  void pin_host(const void* ptr, uint64_t bytes, HostAccess access) override { d_.pin_host(ptr, bytes, access); }
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

TEST_CASE(
    "runtime suite (emulated): experts prefetched on the layer before's guess match the CPU reference, guesses right "
    "or wrong",
    "[runtime][moe]") {
  // Streamed MoE FFNs; with speculative expert prefetch (plan.h router_next) each layer's
  // guessed experts are copied into its slot while the layer before runs, and its own copy then brings
  // only the routed experts the guess missed into the places of the guesses not routed. Guessing with
  // the router, with the lowest logits (nearly all wrong) and half and half, under random queue delays.
  // The suite's check, then the host's waits counted and refused plans.
  const RuntimeTarget t = emulated();
  const ModelSpec spec = suite_spec("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  const SuiteModel m = suite_model(make_synthetic_weights(spec, 37, &pool), t.ctx, {13, 1, 5, 16, 1, 3, 1}, 17, pool);
  const WeightSource* src = m.src.get();
  const ModelWeights& w = m.w;
  const uint64_t budget = min_budget(t, *src) + spec.total_bytes() / 3;  // the attention pinned, experts streamed
  // GPU-only (whole layers' experts guessed), and Dynamic with its CPU layers split (the GPU's share guessed).
  PlanTable table;
  for (Schedule sched : {Schedule::GpuOnly, Schedule::Dynamic}) {
    const PlanTable tt = speculative_table(t, m, sched, budget);
    if (sched == Schedule::GpuOnly) table = tt;
    using G = RuntimeOptions::GuessTest;
    for (G mode : {G::Router, G::Lowest, G::Mixed})
      for (uint64_t seed : {41u, 42u}) {
        EmuOptions eo = emu(seed, 60);
        if (seed == 42u)
          eo.queue_scale[static_cast<int>(Queue::H2D)] = 6;  // copies slow: a missing wait reads old experts
        const RuntimeGuesses g = check_guesses(t, m, tt, sched, mode, eo, budget, pool);
        // 2 of 8 experts per token: the lowest logits' guesses miss most routed experts.
        if (mode == G::Lowest) CHECK(g.hits < g.routed / 2);
      }
    // The host never waits for a weight copy: with the routing slow to come down (so the miss copies
    // are the host's earliest work, waiting for it) and copies slow, the next layer's guess is still
    // enqueued while this layer's guessed experts are being copied.
    EmuOptions eo;
    eo.seed = 43;
    eo.max_delay_us = 60;
    eo.queue_scale[static_cast<int>(Queue::H2D)] = 6;
    eo.queue_scale[static_cast<int>(Queue::D2H)] = 3;
    auto inner = make_emu_device(eo);
    CopyWaitCounter dev(*inner);
    RuntimeOptions o;
    o.schedule = sched;
    Runtime rt(*src, w, dev, pool, tt, o);
    CHECK(test::max_rel_error(run_steps(rt, m.tokens, m.steps), m.ref, spec.vocab_size) <= 1e-4);
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
        if (a.speculative)
          a.deps.erase(
              std::remove_if(a.deps.begin(), a.deps.end(),
                             [&](int d) { return p.actions[static_cast<size_t>(d)].payload == Payload::RouterGuess; }),
              a.deps.end());
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("depends on its layer's guessed router logits"));
  bad = table;
  for (auto& t : bad.tiers)
    for (auto& p : t.candidates)
      for (size_t i = 0; i < p.actions.size(); ++i)
        if (p.actions[i].speculative)
          for (size_t j = i + 1; j < p.actions.size(); ++j)
            if (p.actions[j].kind == ActionKind::CopyWeights && p.actions[j].shard == p.actions[i].shard)
              p.actions[j].slot = 1 - p.actions[j].slot;
  CHECK_THROWS_WITH(Runtime(*src, w, *dev, pool, bad, o), Contains("into the same slot"));
}

TEST_CASE("runtime: strided expert copies keep every step exact (one copy per expert in a synthetic model)",
          "[runtime][moe]") {
  // A streamed routed expert's gate, up and down slices go as strided copies (Device::HostCopy rows) where
  // their host distances allow. A synthetic model stores a layer's gate, up and down expert tensors back
  // to back: one copy of three rows per expert.
  const ModelSpec spec = test_model("qwen3_moe", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 43, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 48;
  const std::vector<int> steps = {9, 1, 4, 1, 1};
  const auto toks = token_seq(16, spec.vocab_size, 9);
  const auto ref = reference_steps(*src, toks, steps, ctx);
  const PlanTable table =
      table_for(*src, min_budget_for(*src, ctx) + spec.total_bytes() / 4, ctx, {1, 4, 16});  // experts streamed
  for (Schedule s : {Schedule::GpuOnly, Schedule::Dynamic}) {
    if (!feasible_at_some_tier(table, s)) continue;
    INFO(schedule_name(s));
    EmuOptions eo;
    eo.seed = 47;
    eo.max_delay_us = 40;
    eo.queue_scale[static_cast<int>(Queue::H2D)] = 4;  // copies slow: a row landing late reads old experts
    auto emu = make_emu_device(eo);
    CopyWaitCounter dev(*emu);
    RuntimeOptions o;
    o.schedule = s;
    Runtime rt(*src, w, dev, pool, table, o);
    CHECK(test::max_rel_error(run_steps(rt, toks, steps), ref, spec.vocab_size) <= 1e-4);
    const auto& by_rows = dev.batch_copies_by_rows;
    CHECK(by_rows.count(3));  // the experts, one copy each
    CHECK(!by_rows.count(2));
  }
  // A strided copy whose rows would overlap is refused with one line.
  auto dev = make_emu_device({1, 0, 0});
  uint8_t* arena = dev->allocate_arena(1 << 16);
  std::vector<uint8_t> host(1 << 16);
  const Device::HostCopy overlap{arena, host.data(), 4096, 3, 1024, 4096};
  CHECK_THROWS_WITH(dev->copy_h2d_batch(&overlap, 1), Contains("would overlap its own rows"));
}

TEST_CASE("expert_copies_of: the copies a streamed expert takes, for the planner, as the runtime makes them",
          "[runtime][moe]") {
  // Synthetic weights (gate, up, down tensors in that order): one strided copy, whether counted on the
  // weights or on the spec alone (the sweep plans synthetic models before making them).
  for (DType dt : {DType::F16, DType::Q8_0}) {
    const ModelSpec spec = test_model("qwen3_moe", dt);
    ThreadPool pool(2);
    auto src = make_synthetic_weights(spec, 5, &pool);
    INFO(dtype_name(dt));
    CHECK(expert_copies_of(*src) == 1);
    CHECK(synthetic_expert_copies(spec) == 1);
  }
  // llama.cpp's files (down, gate, up): gate and up as one copy, down alone.
  for (const char* f : {"qwen3moe_small.f16.gguf", "qwen3moe_small.q8_0.gguf"}) {
    auto src = open_weights(test::fixtures_dir() + "/llamacpp/gguf/" + f);
    INFO(f);
    CHECK(expert_copies_of(*src) == 2);
  }
  // A dense model has no experts to copy.
  const ModelSpec dense = test_model("llama", DType::F16);
  CHECK(synthetic_expert_copies(dense) == 3);
}

TEST_CASE("push_expert_copies: an expert's slices as few strided copies as their host distances allow",
          "[runtime][moe]") {
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
  auto copies = [&](uint64_t g, uint64_t u, uint64_t d, uint64_t bytes_d = 128) {
    std::vector<Device::HostCopy> out;
    push_expert_copies(out, place.data(), L, view(g), view(u), view(d, bytes_d));
    uint64_t bytes = 0;
    for (const auto& c : out) bytes += c.bytes * c.rows;
    CHECK(bytes == 256 + bytes_d);  // every byte once
    return out;
  };
  const uint64_t e = 3 * 128;  // expert 3's slices
  // gate, up, down back to back: one copy of three rows, T apart on the host, 128 in the place.
  auto one = copies(e, T + e, 2 * T + e);
  REQUIRE(one.size() == 1);
  CHECK(one[0].rows == 3);
  CHECK(one[0].host_pitch == T);
  CHECK(one[0].dev_pitch == 128);
  CHECK(one[0].dev == place.data());
  CHECK(one[0].host == host.data() + e);
  // llama.cpp's down, gate, up: gate and up as one copy of two rows, down alone.
  auto two = copies(T + e, 2 * T + e, e);
  REQUIRE(two.size() == 2);
  CHECK(two[0].rows == 2);
  CHECK(two[0].dev == place.data());
  CHECK(two[0].host == host.data() + T + e);
  CHECK(two[1].rows == 1);
  CHECK(two[1].dev == place.data() + 256);
  CHECK(two[1].host == host.data() + e);
  // up, down back to back after a gate elsewhere: gate alone, then up and down as one.
  auto tail = copies(5 * T + e, e, T + e);
  REQUIRE(tail.size() == 2);
  CHECK(tail[0].rows == 1);
  CHECK(tail[1].rows == 2);
  // Unequal distances: the pair at one distance as one copy, the third alone.
  CHECK(copies(e, T + e, 3 * T + e).size() == 2);
  CHECK(copies(e, T + e, 2 * T + e, 64).size() == 2);  // down of another size alone
  // Host addresses falling in the place's order (no row after the one before), or rows closer than their
  // size: three copies.
  CHECK(copies(2 * T + e, T + e, e).size() == 3);
  CHECK(copies(e, e + 64, e + 128).size() == 3);
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
    const uint64_t staged =
        static_cast<uint64_t>(16 * (spec.hidden_size + spec.q_dim() + 2 * spec.kv_dim() + spec.q_dim()) +
                              spec.vocab_size) *
        4;
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
  refused([&](Plan& p) { p.actions[a].row_end = int64_t(1) << 40; },
          "the LM head's row pieces end at row 1099511627776");
  refused([&](Plan& p) { p.actions[a].row_end = spec.vocab_size + 1; }, "the LM head's row pieces end at row");
  refused([&](Plan& p) { p.actions[a].slot = 2; }, "stream slot 2");
  refused([&](Plan& p) { p.actions[a].shard = 100000; }, "names shard 100000");
  refused([&](Plan& p) { p.actions[a].layer = static_cast<int>(spec.num_hidden_layers); }, "names layer");
  refused([&](Plan& p) { p.arena.back().offset = table.budget_bytes; }, "lies outside the budget");
  refused([&](Plan& p) { p.arena.back().bytes = ~uint64_t(0); }, "lies outside the budget");
  refused(
      [&](Plan& p) {
        for (ShardPlacement& sp : p.placements)
          if (sp.arena_offset >= 0 && sp.home == WeightHome::Pinned)
            sp.arena_offset = static_cast<int64_t>(table.budget_bytes);
      },
      "lies outside the 'pinned' region");
  refused([&](Plan& p) { p.kv_on_gpu.pop_back(); }, "kv_on_gpu names");
  refused(
      [&](Plan& p) {  // two shards of equal size (two layers' attention) named in each other's place
        for (size_t i = 0; i < p.placements.size(); ++i)
          for (size_t j = i + 1; j < p.placements.size(); ++j)
            if (p.placements[i].bytes == p.placements[j].bytes && p.placements[i].name != p.placements[j].name) {
              std::swap(p.placements[i].shard, p.placements[j].shard);
              return;
            }
      },
      "placements are listed by shard id");
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
      for (Schedule s :
           {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe}) {
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
  // be read as the shared zero page, from cache. The fill must reach exactly the caches on the host, in
  // their type (f32 values, or q8_0 blocks).
  const ModelSpec spec = test_model("llama", DType::F16);
  ThreadPool pool(2);
  auto src = make_synthetic_weights(spec, 17, &pool);
  ModelWeights w = ModelWeights::from_source(*src);
  const int64_t ctx = 64;
  for (DType kv : {DType::F32, DType::Q8_0}) {
    INFO(dtype_name(kv));
    check_fill_host_cache(*src, w, emulated().with_ctx(ctx).with_kv_dtype(kv), pool);
  }
}

// Weights read from a file are pinned in place like in-memory ones: every tensor's bytes are pinned
// while the runtime lives (read-only), and --no-pin-weights (pin_host_weights = false) leaves them
// pageable, pinning only the activation staging. The file is mapped shared: the kernel pins a private
// file mapping only after unsharing its pages, which never finished on the GPU machine's kernel.
TEST_CASE("runtime: weights mapped from a GGUF file are pinned in place, or left pageable when asked", "[runtime]") {
  const ModelSpec spec = test_model("qwen3_moe", DType::Q8_0);
  ThreadPool pool(2);
  auto synth = make_synthetic_weights(spec, 5, &pool);
  const std::string path = test::temp_path("pinned_weights.gguf");
  write_gguf(*synth, path, DType::Q8_0, &pool);
  auto src = open_weights(path);
  ModelWeights w = ModelWeights::from_source(*src);
  const PlanTable table = table_for(*src, 64u << 20, 64, {1, 4, 16});
  uint64_t pinned[2] = {0, 0};
  for (bool pin : {true, false}) {
    INFO("pin_host_weights " << pin);
    auto dev = make_emu_device({3, 10, 0});
    RuntimeOptions o;
    o.pin_host_weights = pin;
    Runtime rt(*src, w, *dev, pool, table, o);
    pinned[pin ? 1 : 0] = dev->pinned_host_bytes();
    const auto toks = token_seq(5, spec.vocab_size, 3);
    std::vector<float> logits(static_cast<size_t>(spec.vocab_size));
    rt.step(toks.data(), 4, logits.data());
    rt.step(toks.data() + 4, 1, logits.data());
    CHECK(std::isfinite(logits[0]));
  }
  // Pinning adds every tensor's bytes (whole pages: at least the weights, at most a page more per tensor).
  const uint64_t weights = src->weight_bytes();
  CHECK(pinned[1] - pinned[0] >= weights);
  CHECK(pinned[1] - pinned[0] <= weights + 4096 * (src->tensors().size() + 1));
  std::string maps = test::read_file("/proc/self/maps"), line;
  bool shared = false;
  for (std::istringstream in(maps); std::getline(in, line);)
    if (line.find("pinned_weights.gguf") != std::string::npos)
      shared = shared || line.find(" r--s ") != std::string::npos;
  CHECK(shared);
}

TEST_CASE("runtime suite (emulated): batched steps of several sequences give each one its tokens alone",
          "[runtime][batch]") {
  const RuntimeTarget t = emulated();
  for (const char* family : {"llama", "qwen3_moe"}) {
    ThreadPool pool(2);
    auto src = make_synthetic_weights(test_model(family, DType::Q8_0), 29, &pool);
    const ModelWeights w = ModelWeights::from_source(*src);
    for (double frac : {0.15, 2.0}) {
      const int runs =
          check_batched(t, *src, w, frac, {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}, emu(5, 40), pool);
      CHECK(runs >= 2);
    }
    // Host caches staged on the device: each sequence's rows go up and come back.
    CHECK(check_batched(t, *src, w, 0.5, {Schedule::GpuOnly, Schedule::Dynamic}, emu(6, 40), pool, true) >= 1);
  }
}

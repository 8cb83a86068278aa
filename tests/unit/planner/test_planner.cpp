// Tests for costmodel/ and planner/: hand-checkable plans on a made-up machine, invariants over the
// paper's configuration space, the action-list contract, JSON round trips and budget errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/size.h"
#include "costmodel/cost_model.h"
#include "executor/traits.h"
#include "planner/planner.h"
#include "planner/shard_ops.h"
#include "planner/simulator.h"
#include "planner/verify.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t MiB = 1ull << 20, GiB = 1ull << 30;

// A 2-layer llama in f16: attention shard 32 MiB, FFN shard 96 MiB, LM head 4 MiB.
ModelSpec hand_model() {
  return parse_spec_yaml_text(
      "name: hand2\nfamily: llama\ndtype: f16\nhidden_size: 2048\nnum_hidden_layers: 2\nnum_attention_heads: 16\n"
      "num_key_value_heads: 16\nhead_dim: 128\nintermediate_size: 8192\nvocab_size: 1024\n",
      "hand2");
}

// CPU reads DRAM at 10 GB/s with any thread count and computes 100 GFLOP/s per thread; PCIe moves
// 1 GB/s; the GPU is effectively infinite; no overheads, no contention.
HardwareSpec hand_machine() {
  return parse_hardware_yaml_text(
      "name: hand\napproximate: false\n"
      "cpu: {cores: 1, dram_read_gbps: {1: 10}, dram_contention: [[0, 1.0]], "
      "matmul_gflops_per_thread: {f16: 100, f32: 100}, attention_gflops_per_thread: 1000000, op_overhead_us: 0}\n"
      "pcie: {h2d_gbps: 1, d2h_gbps: 1, pageable_gbps: 1, latency_us: 0}\n"
      "gpu: {name: ideal, vram: 1GB, mem_gbps: 1000000000, matmul_tflops: {f16: 1000000, f32: 1000000}, "
      "attention_tflops: 1000000, launch_us: 0, sync_us: 0}\n",
      "hand");
}

// Plans for `spec` as the CLI makes them: with the executor's traits for the model.
PlannerConfig config(const ModelSpec& spec, uint64_t budget, int64_t ctx, int threads) {
  PlannerConfig c;
  c.executor = executor_traits(spec);
  c.budget_bytes = budget;
  c.ctx = ctx;
  c.threads = threads;
  return c;
}

}  // namespace

TEST_CASE("cost model: roofline arithmetic and expected experts", "[costmodel]") {
  auto cost = make_analytic_cost_model(hand_machine());
  Op mm;
  mm.kind = OpKind::Matmul;
  mm.dtype = DType::F16;
  mm.tokens = 1;
  mm.rows = 4096;
  mm.cols = 1024;
  ExecEnv cpu{Backend::Cpu, 1, 0};
  // 8 MiB of f16 weights at 10 GB/s (activations are 20 KB more).
  CHECK(cost->op_ms(mm, cpu) == Approx((8.0 * MiB + 4.0 * (4096 + 1024)) / 10e9 * 1e3).epsilon(1e-6));
  mm.tokens = 4096;  // compute-bound: 2·4096·4096·1024 FLOPs at 100 GFLOP/s · m/(m+6)
  CHECK(cost->op_ms(mm, cpu) == Approx(2.0 * 4096 * 4096 * 1024 / (100e9 * 4096.0 / 4102.0) * 1e3).epsilon(1e-6));
  CHECK(cost->transfer_ms(1000000000, Direction::HostToDevice) == Approx(1000.0));
  auto capped = make_analytic_cost_model(hand_machine(), 0.5e9);
  CHECK(capped->transfer_ms(1000000000, Direction::HostToDevice) == Approx(2000.0));
  CHECK(expected_distinct_experts(1, 8, 128) == Approx(8.0));
  CHECK(expected_distinct_experts(4096, 8, 128) == Approx(128.0).epsilon(1e-6));
  CHECK(expected_distinct_experts(16, 8, 128) == Approx(128.0 * (1 - std::pow(120.0 / 128.0, 16))));
}

TEST_CASE("hand-checkable: decode reads FFNs on the CPU, prefill streams them", "[planner]") {
  const ModelSpec spec = hand_model();
  auto cost = make_analytic_cost_model(hand_machine());
  {
    // 256 MiB: the arena keeps 32 MiB of library workspace and 2 MiB of KV; Static pins both
    // attention shards and one FFN (160 MiB); the second FFN (96 MiB) and the LM head (4 MiB) run
    // on the CPU, which reads them at 10 GB/s: 10.5 ms (the GPU is infinitely fast, the residual's
    // PCIe hops take microseconds). GPU-only must stream ~260 MiB at 1 GB/s: 272 ms.
    const PlanTable t = build_plan_table(spec, *cost, config(spec, 256 * MiB, 64, 1));
    const TierEntry& decode = *t.find_tier(1);
    REQUIRE(decode.feasible);
    const Plan* st = decode.find(Schedule::Static);
    REQUIRE(st->feasible);
    uint64_t cpu_bytes = 0;
    for (const auto& sp : st->placements)
      if (sp.exec == ExecDevice::Cpu && sp.name.find("ffn") != std::string::npos) cpu_bytes += sp.bytes;
    CHECK(cpu_bytes == 96 * MiB + 2048 * 4);  // one FFN shard (+ its f32 norm)
    const double expect_ms = (96.0 + 4.0) * MiB / 10e9 * 1e3;
    CHECK(st->predicted_ms > expect_ms);
    CHECK(st->predicted_ms < expect_ms * 1.02);
    const Plan* go = decode.find(Schedule::GpuOnly);
    REQUIRE(go->feasible);
    uint64_t streamed = 0;
    for (const auto& a : go->actions)
      if (a.kind == ActionKind::CopyWeights) streamed += a.bytes;
    CHECK(streamed >= 192 * MiB);
    CHECK(go->predicted_ms >= static_cast<double>(streamed) / 1e9 * 1e3);
    // Dynamic streams the LM head (4 MiB at 1 GB/s: 4.2 ms) while the CPU reads the FFN (10.1 ms):
    // the head's weights and the residual's hop back to the GPU travel on separate queues, so the
    // copy overlaps the CPU and the step is the FFN's read alone.
    const Plan* dy = decode.find(Schedule::Dynamic);
    REQUIRE(dy->feasible);
    const double ffn_ms = (96.0 * MiB + 2048 * 4) / 10e9 * 1e3;
    INFO("dynamic " << dy->predicted_ms << " ms (" << dy->notes << "), static " << st->predicted_ms << " ms");
    CHECK(dy->predicted_ms > ffn_ms);
    CHECK(dy->predicted_ms < ffn_ms * 1.02);
    CHECK(dy->predicted_ms < st->predicted_ms);
    CHECK(decode.chosen == Schedule::Dynamic);
  }
  {
    // 300 MiB at 512 tokens: Static keeps one FFN on the CPU: 2·512·3·8192·2048 FLOPs at
    // 100 GFLOP/s · 512/518 = 0.52 s; GPU-only streams everything (~260 MiB at 1 GB/s = 0.27 s).
    PlannerConfig cfg = config(spec, 300 * MiB, 64, 1);
    cfg.tiers = {1, 512};
    const PlanTable t = build_plan_table(spec, *cost, cfg);
    const TierEntry& prefill = *t.find_tier(512);
    REQUIRE(prefill.feasible);
    const Plan* st = prefill.find(Schedule::Static);
    const Plan* go = prefill.find(Schedule::GpuOnly);
    REQUIRE(st->feasible);
    REQUIRE(go->feasible);
    CHECK(st->predicted_ms == Approx(2.0 * 512 * 3 * 8192 * 2048 / (100e9 * 512.0 / 518.0) * 1e3).epsilon(0.05));
    CHECK(go->predicted_ms == Approx(260.0 * MiB / 1e9 * 1e3).epsilon(0.05));
    CHECK(prefill.chosen != Schedule::Static);
  }
}

TEST_CASE("a budget that holds everything gives an all-resident plan without streaming", "[planner]") {
  const ModelSpec spec = hand_model();
  auto cost = make_analytic_cost_model(hand_machine());
  const PlanTable t = build_plan_table(spec, *cost, config(spec, 4 * GiB, 256, 1));
  for (const auto& e : t.tiers) {
    const Plan* go = e.find(Schedule::GpuOnly);
    INFO("tier " << e.tokens << ": " << go->infeasible_reason);
    REQUIRE(go->feasible);
    CHECK(go->pinned_prefix == static_cast<int64_t>(t.canonical_order.size()));
    for (const auto& a : go->actions) CHECK(a.kind != ActionKind::CopyWeights);
    for (bool kv : go->kv_on_gpu) CHECK(kv);
  }
}

TEST_CASE("the LM head is pinned before MoE experts, whose decode reads a small share of them", "[planner]") {
  // qwen30b at 4G: the pinned order attention > KV > FFN > output leaves the 175 MB q4_0 LM head on the
  // CPU (read whole every step) while 340 MB layers of experts (8 of 128 read per token) stay pinned.
  // The table's layout pins it right after the attention shards, and its decode is predicted faster.
  const ModelSpec moe = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(moe, 4 * GiB, 1024, 16);
  cfg.tiers = {1, 512};
  const PlanTable t = build_plan_table(moe, *cost, cfg);
  const ShardSet S = make_shards(moe, cfg.ctx, cfg.kv_dtype);
  REQUIRE(t.canonical_order.size() == static_cast<size_t>(2 * S.n_layers + 1));
  CHECK(t.canonical_order[static_cast<size_t>(S.n_layers)] == S.output);
  const Plan* st = t.find_tier(1)->find(Schedule::Static);
  REQUIRE(st->feasible);
  CHECK(st->placements[static_cast<size_t>(S.output)].home == WeightHome::Pinned);
  CHECK(st->placements[static_cast<size_t>(S.output)].exec == ExecDevice::Gpu);
  // A dense model's decode reads every FFN byte as it reads the LM head's: nemo8b at 2G keeps the
  // paper's order (its 1 GiB f16 LM head pinned early would only displace as many FFN bytes).
  const PlanTable dense =
      build_plan_table(builtin_spec("nemo8b"), *cost, config(builtin_spec("nemo8b"), 2 * GiB, 1024, 16));
  const ShardSet D = make_shards(builtin_spec("nemo8b"), 1024, cfg.kv_dtype);
  CHECK(dense.canonical_order.back() == D.output);
}

TEST_CASE("Dynamic splits an MoE layer's experts between CPU and GPU where that overlaps their work",
          "[planner][moe]") {
  // qwen30b at 4G on the h200-host datasheet: a CPU FFN layer's 8 routed experts take the CPU ~0.3 ms;
  // copying a layer's experts takes longer (and waits for its routing), so streaming whole layers never
  // overlaps the CPU's work, while c experts on the CPU beside 8 - c copied and run on the GPU do.
  const ModelSpec moe = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(moe, 4 * GiB, 4096, 16);
  cfg.tiers = {1};
  const ShardSet S = make_shards(moe, cfg.ctx, cfg.kv_dtype);
  auto shares = [&](const Plan& p, int* c) {
    int n = 0;
    for (const Action& a : p.actions)
      if (a.part == ComputePart::MoeCpuShare) {
        ++n;
        *c = a.cpu_experts;
      }
    return n;
  };
  const PlanTable t = build_plan_table(moe, *cost, cfg);
  const Plan* st = t.find_tier(1)->find(Schedule::Static);
  const Plan* dy = t.find_tier(1)->find(Schedule::Dynamic);
  REQUIRE(st->feasible);
  REQUIRE(dy->feasible);
  int c = 0;
  const int split = shares(*dy, &c);
  int cpu_ffn = 0;
  for (int l = 0; l < S.n_layers; ++l) cpu_ffn += st->placements[static_cast<size_t>(S.ffn[l])].exec == ExecDevice::Cpu;
  CHECK(split == cpu_ffn);  // every layer Static runs on the CPU
  CHECK(c >= 1);
  CHECK(c < moe.num_experts_per_tok);
  // Faster than Static (on this datasheet by ~1%: each share pays the block's three launches, the
  // GPU's also the add; on the H200 host's profile by 12-14% at 1K and 4K contexts).
  CHECK(dy->predicted_ms < st->predicted_ms);
  CHECK(t.find_tier(1)->chosen == Schedule::Dynamic);
  // Each split layer: the CPU share waits for x's copy and the routing; the GPU share for x's copy (it
  // then adds to x) and the copy of the GPU's experts, which holds 3 (k - c) copies and the norm, not for
  // the CPU (it comes first in the host's order, so the two run at once); the add for both.
  int adds = 0;
  for (const Action& a : dy->actions) {
    if (a.part == ComputePart::MoeShareAdd) {
      ++adds;
      bool partial = false, gpu_share = false;
      for (int d : a.deps) {
        const Action& b = dy->actions[static_cast<size_t>(d)];
        partial = partial || b.payload == Payload::MoePartial;
        gpu_share = gpu_share || (b.part == ComputePart::MoeGpuShare && b.layer == a.layer);
      }
      CHECK(partial);
      CHECK(gpu_share);
      CHECK(a.resource == Resource::GpuCompute);
      continue;
    }
    if (a.part != ComputePart::MoeGpuShare) continue;
    bool partial = false, weights = false, x_down = false;
    for (int d : a.deps) {
      const Action& b = dy->actions[static_cast<size_t>(d)];
      partial = partial || b.payload == Payload::MoePartial;
      x_down = x_down || (b.payload == Payload::Residual && b.resource == Resource::D2H && b.layer == a.layer);
      if (b.kind == ActionKind::CopyWeights) {
        weights = true;
        CHECK(b.cpu_experts == c);
        CHECK(b.copies == 1 + 3 * (moe.num_experts_per_tok - c));
      }
    }
    CHECK_FALSE(partial);
    CHECK(weights);
    CHECK(x_down);
    const Action& next = dy->actions[static_cast<size_t>(a.id) + 1];
    CHECK(next.part == ComputePart::MoeCpuShare);
    CHECK(next.layer == a.layer);
    // Simulated, the GPU's experts run while the CPU computes its share.
    CHECK(a.start_ms < next.end_ms);
  }
  CHECK(adds == split);
  CHECK_THAT(explain_plan(*dy, moe, *cost, cfg), Contains(str_cat("experts split: ", c, " of 8 per token on the CPU")));
  // The split survives a JSON round trip; 0 never splits; a share of every expert is refused.
  CHECK(plan_to_json(plan_from_json(plan_to_json(*dy), "plan.json")) == plan_to_json(*dy));
  cfg.moe_cpu_experts = 0;
  const PlanTable none = build_plan_table(moe, *cost, cfg);
  CHECK(shares(*none.find_tier(1)->find(Schedule::Dynamic), &c) == 0);
  cfg.moe_cpu_experts = 8;
  CHECK_THROWS_WITH(build_plan_table(moe, *cost, cfg), Contains("--moe-split 8: 1 .. 7"));
  cfg.moe_cpu_experts = 1;
  CHECK_THROWS_WITH(build_plan_table(builtin_spec("nemo8b"), *cost, cfg), Contains("no experts"));
}

TEST_CASE("speculative expert prefetch: a streamed MoE layer's experts are copied on the layer before's guess",
          "[planner][moe]") {
  // qwen30b's GPU-only decode at 4G streams every layer's routed experts, and each copy waits for its
  // layer's routing. With the next layer's routing guessed (next_layer_hits), each layer's guessed
  // experts are copied while the layer before runs, then only the misses: the copy engine stays busy.
  const ModelSpec moe = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(moe, 4 * GiB, 1024, 16);
  cfg.tiers = {1};
  cfg.schedules = {Schedule::GpuOnly};
  const ShardSet S = make_shards(moe, cfg.ctx, cfg.kv_dtype);
  const Plan plain = build_plan(moe, *cost, cfg, Schedule::GpuOnly, 1);
  REQUIRE(plain.feasible);
  for (const Action& a : plain.actions) {  // no measured guess rate: no speculation
    CHECK(!a.speculative);
    CHECK(a.part != ComputePart::RouterNext);
  }
  cfg.next_layer_hits = 0.98;
  const Plan guessed = build_plan(moe, *cost, cfg, Schedule::GpuOnly, 1);
  REQUIRE(guessed.feasible);
  CHECK(guessed.predicted_ms < 0.9 * plain.predicted_ms);
  CHECK_THAT(guessed.notes, Contains("98% hits"));
  // Per guessed layer: its router on the GPU right after the layer before's attention (before that
  // layer's FFN), the guess down, a speculative copy of about as many bytes as the plain copy, then the
  // misses (2% of the experts' bytes) after the layer's own routing; the H2D queue runs the layer
  // before's misses, then this layer's guess, then its misses.
  std::map<int, const Action*> next, down, spec, miss;
  for (const Action& a : guessed.actions) {
    if (a.part == ComputePart::RouterNext) next[a.layer] = &a;
    if (a.payload == Payload::RouterGuess) down[a.layer] = &a;
    if (a.kind == ActionKind::CopyWeights && a.speculative) spec[a.layer] = &a;
    if (a.kind == ActionKind::CopyWeights && !a.speculative && a.shard >= 0 && S.at(a.shard).kind == ShardKind::Ffn)
      miss[a.layer] = &a;
  }
  // Every layer after the first whose FFN is streamed (its attention pinned: attention comes first in the
  // pinned order) is guessed; nothing comes before layer 0 to guess from.
  size_t streamed = 0;
  for (int l = 1; l < S.n_layers; ++l)
    streamed += guessed.placements[static_cast<size_t>(S.ffn[static_cast<size_t>(l)])].streamed &&
                guessed.placements[static_cast<size_t>(S.attention[static_cast<size_t>(l)])].home == WeightHome::Pinned;
  REQUIRE(streamed >= static_cast<size_t>(S.n_layers / 2));  // the premise: most layers' experts are streamed
  CHECK(spec.size() == streamed);
  CHECK(spec.count(0) == 0);
  for (const auto& [l, sp] : spec) {
    INFO("layer " << l);
    REQUIRE(next.count(l));
    REQUIRE(down.count(l));
    REQUIRE(miss.count(l));
    const Action& g = *next.at(l);
    CHECK(g.resource == Resource::GpuCompute);
    CHECK(g.shard == S.attention[static_cast<size_t>(l)]);
    CHECK(std::find(down.at(l)->deps.begin(), down.at(l)->deps.end(), g.id) != down.at(l)->deps.end());
    CHECK(std::find(sp->deps.begin(), sp->deps.end(), down.at(l)->id) != sp->deps.end());
    CHECK(std::find(miss.at(l)->deps.begin(), miss.at(l)->deps.end(), sp->id) != miss.at(l)->deps.end());
    CHECK(sp->slot == miss.at(l)->slot);
    // The guess runs before the layer before's FFN (which changes x) on the one compute queue.
    for (const Action& a : guessed.actions)
      if (a.resource == Resource::GpuCompute && a.layer == l - 1 && a.shard == S.ffn[static_cast<size_t>(l - 1)])
        CHECK(g.id < a.id);
    if (miss.count(l - 1)) {
      CHECK(miss.at(l - 1)->id < sp->id);
    }
    CHECK(sp->id < miss.at(l)->id);
    const uint64_t experts = sp->bytes - S.at(sp->shard).expert_base;
    CHECK(miss.at(l)->bytes < experts / 20);
    CHECK(miss.at(l)->end_ms > sp->end_ms);
  }
  // The same plan at 0 hits would copy every expert twice: it is not chosen over the plain one, and a
  // guess rate outside [0, 1] is refused.
  cfg.next_layer_hits = 1e-6;
  CHECK(build_plan(moe, *cost, cfg, Schedule::GpuOnly, 1).predicted_ms == Approx(plain.predicted_ms));
  cfg.next_layer_hits = 1.5;
  CHECK_THROWS_WITH(build_plan(moe, *cost, cfg, Schedule::GpuOnly, 1),
                    Contains("next_layer_hits 1.5 must be within [0, 1]"));
  // The JSON round trip keeps what is speculative.
  const Plan back = plan_from_json(plan_to_json(guessed), "test");
  size_t n = 0;
  for (size_t i = 0; i < back.actions.size(); ++i) {
    CHECK(back.actions[i].speculative == guessed.actions[i].speculative);
    CHECK(back.actions[i].part == guessed.actions[i].part);
    CHECK(back.actions[i].payload == guessed.actions[i].payload);
    n += back.actions[i].speculative;
  }
  CHECK(n == spec.size());
  // A saved plan marking anything but a weight copy speculative is refused with the action named.
  const std::string saved = plan_to_json(guessed);
  const std::regex compute_action("(\"kind\":\"compute\"[^{}]*\"speculative\":)false");
  std::smatch m;
  REQUIRE(std::regex_search(saved, m, compute_action));
  const std::string edited =
      saved.substr(0, static_cast<size_t>(m.position(0))) + m[1].str() + "true" + m.suffix().str();
  CHECK_THROWS_WITH(plan_from_json(edited, "edited.json"),
                    Contains("edited.json") && Contains("only a weight copy can be speculative"));
}

TEST_CASE("KV in VRAM for layers whose attention is not pinned: GPU-only and Dynamic stream that attention",
          "[planner]") {
  // nemo8b at 2G/1K: pinning attention for every KV-in-VRAM layer allowed KV for 15 of 40 layers, so
  // a 1024-token prefill ran 25 layers' attention on the CPU (876 ms predicted with the GPU host's
  // profile, against the paper artifact's 0.40 s). With every layer's KV in VRAM the prefill streams
  // all attention to the GPU, and decode streams the attention of the layers that are not pinned.
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(spec, 2 * GiB, 1024, 16);
  cfg.tiers = {1, 512, 1024};
  const PlanTable all = [&] {
    PlannerConfig c = cfg;
    c.kv_layers = static_cast<int>(spec.num_hidden_layers);
    return build_plan_table(spec, *cost, c);
  }();
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
  for (bool kv : all.kv_on_gpu) CHECK(kv);
  const Plan* dyn = all.find_tier(1)->find(Schedule::Dynamic);
  REQUIRE(dyn->feasible);
  int streamed_attention = 0;
  for (int l = 0; l < S.n_layers; ++l) {
    const ShardPlacement& a = dyn->placements[static_cast<size_t>(S.attention[l])];
    CHECK(a.exec == ExecDevice::Gpu);  // with its KV
    streamed_attention += a.streamed;
    if (a.home == WeightHome::Host) CHECK(a.streamed);
  }
  CHECK(streamed_attention > 0);
  const Plan* st = all.find_tier(1)->find(Schedule::Static);
  CHECK_FALSE(st->feasible);
  CHECK_THAT(st->infeasible_reason, Contains("neither pinned nor streamed"));
  const Plan* pre = all.find_tier(1024)->find(Schedule::GpuOnly);
  REQUIRE(pre->feasible);
  for (const Action& a : pre->actions) CHECK((a.resource != Resource::Cpu || a.kind == ActionKind::Embed));
  // Left to choose with the attention of host-KV layers split, the table takes this layout: the
  // prefill saves more than decode loses. (Staged, the prefill runs on the GPU whatever the layout:
  // test "GPU attention over a host KV cache runs staged where that is faster".)
  PlannerConfig split_cfg = cfg;
  split_cfg.host_kv_attention = PlannerConfig::HostKvAttention::Split;
  const PlanTable chosen = build_plan_table(spec, *cost, split_cfg);
  CHECK(chosen.kv_on_gpu == all.kv_on_gpu);
  PlannerConfig bad = cfg;
  bad.kv_layers = 41;
  CHECK_THROWS_WITH(build_plan_table(spec, *cost, bad), Contains("out of range"));
}

// Real files mix types per tensor (a Q4_K_M file keeps some layers' attn_v and ffn_down, and the output, in
// q6_K): every op is priced at its own tensor's stored type, the spec's rule elsewhere.
TEST_CASE("ops are priced at each tensor's stored type", "[planner]") {
  ModelSpec spec = builtin_spec("tiny_llama");
  spec.dtype = DType::Q8_0;
  const TensorDtypes file = {
      {"blk.1.attn_v.weight", DType::F16}, {"blk.1.ffn_down.weight", DType::BF16}, {"output.weight", DType::F16}};
  const ShardSet S = make_shards(spec, 64, DType::F32, &file);
  auto matmul_types = [](const std::vector<Op>& ops) {
    std::vector<DType> t;
    for (const Op& op : ops)
      if (op.kind == OpKind::Matmul) t.push_back(op.dtype);
    return t;
  };
  using V = std::vector<DType>;
  CHECK(matmul_types(attention_ops(spec, S, 0, 1, 64, DType::F32, 0).pre) == V{DType::Q8_0, DType::Q8_0, DType::Q8_0});
  CHECK(matmul_types(attention_ops(spec, S, 1, 1, 64, DType::F32, 0).pre) == V{DType::Q8_0, DType::Q8_0, DType::F16});
  CHECK(matmul_types(ffn_ops(spec, S, 0, 1)) == V{DType::Q8_0, DType::Q8_0, DType::Q8_0});
  CHECK(matmul_types(ffn_ops(spec, S, 1, 1)) == V{DType::Q8_0, DType::Q8_0, DType::BF16});
  CHECK(matmul_types(output_ops(spec, S)) == V{DType::F16});
  // A shard set made without a file prices at the spec's rule.
  CHECK(matmul_types(output_ops(spec, make_shards(spec, 64, DType::F32))) == V{DType::Q8_0});
}

TEST_CASE("a GPU attention block is costed as the GPU runs it: fused Q/K/V GEMV, q/k norms inside RoPE", "[planner]") {
  // The CUDA blocks project Q, K and V in one batched GEMV for steps of up to gpu_fused_qkv_max_tokens
  // tokens (same dtype) and apply the q/k norms in the RoPE kernel: costing them as 5-6 launches
  // predicted qwen30b's decode attention block at 94 us where it ran in 75 (executor README, sixth
  // session). The CPU runs them one by one.
  const ModelSpec spec = builtin_spec("qwen30b");
  const ShardSet S = make_shards(spec, 1024, DType::F32);
  const int64_t QD = spec.q_dim(), KVD = spec.kv_dim(), H = spec.hidden_size;
  const int64_t fused = executor_traits(spec).gpu_fused_qkv_max_tokens;
  REQUIRE(fused >= 1);
  const AttentionOps one = attention_ops(spec, S, 0, 1, 1024, DType::F32, fused);
  REQUIRE(spec.has_qk_norm());
  CHECK(one.pre.size() == 6);        // norm, q, k, v, q/k norms, RoPE
  REQUIRE(one.pre_gpu.size() == 3);  // norm, q|k|v, q/k norms + RoPE
  CHECK(one.pre_gpu[1].kind == OpKind::Matmul);
  CHECK(one.pre_gpu[1].rows == QD + 2 * KVD);
  CHECK(one.pre_gpu[1].cols == H);
  CHECK(one.pre_gpu[2].kind == OpKind::Rope);
  CHECK(attention_ops(spec, S, 0, fused, 1024, DType::F32, fused).pre_gpu.size() == 3);
  const AttentionOps many = attention_ops(spec, S, 0, fused + 1, 1024, DType::F32, fused);
  CHECK(many.pre_gpu.size() == 5);  // GEMMs one by one; the norms still inside RoPE
  // The simulator times a GPU attention action from pre_gpu, a CPU one from pre.
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  StepShape st;
  st.tokens = 1;
  st.keys = 1024;
  st.threads = 16;
  st.gpu_fused_qkv_max_tokens = fused;
  Action a;
  a.kind = ActionKind::Compute;
  a.shard = S.attention[0];
  a.part = ComputePart::AttnPre;
  ExecEnv gpu;
  gpu.backend = Backend::Gpu;
  gpu.threads = 16;
  ExecEnv cpu = gpu;
  cpu.backend = Backend::Cpu;
  double g = 0, c = 0;
  for (const Op& op : one.pre_gpu) g += cost->op_ms(op, gpu);
  for (const Op& op : one.pre) c += cost->op_ms(op, cpu);
  a.resource = Resource::GpuCompute;
  CHECK(action_ms(a, spec, S, *cost, st) == Approx(g).epsilon(1e-12));
  a.resource = Resource::Cpu;
  CHECK(action_ms(a, spec, S, *cost, st) == Approx(c).epsilon(1e-12));
}

TEST_CASE("a split MoE layer's shares each pay the block's fixed part once, and the partial's add is an f32 add",
          "[planner]") {
  // The share of c of k experts is not c/k of the block: the block's launches (GPU) or the pool's
  // dispatch (CPU) run once per share whatever its experts. The fixed part comes from the block's 1- and
  // 4-token times (their experts carry ~1 token each); the analytic model's is its launch overheads.
  const ModelSpec spec = builtin_spec("qwen30b");
  const ShardSet S = make_shards(spec, 1024, DType::F32);
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  StepShape st;
  st.tokens = 1;
  st.keys = 1024;
  st.threads = 16;
  const int64_t k = spec.num_experts_per_tok;
  REQUIRE(k == 8);
  Action a;
  a.kind = ActionKind::Compute;
  a.shard = S.ffn[3];
  auto t = [&](Resource r, ComputePart part, int c) {
    a.resource = r;
    a.part = part;
    a.cpu_experts = c;
    return action_ms(a, spec, S, *cost, st);
  };
  for (Resource r : {Resource::GpuCompute, Resource::Cpu}) {
    const ComputePart share = r == Resource::Cpu ? ComputePart::MoeCpuShare : ComputePart::MoeGpuShare;
    const double whole = t(r, ComputePart::Full, 0);
    // Its experts' share of the time: c on the CPU, k - c on the GPU.
    auto experts = [&](int c) { return r == Resource::Cpu ? c : static_cast<int>(k) - c; };
    const double per_expert = (t(r, share, 1) - t(r, share, 2)) / (experts(1) - experts(2));
    REQUIRE(per_expert > 0);
    const double fixed = t(r, share, 1) - experts(1) * per_expert;
    for (int c = 1; c < k; ++c) {
      INFO((r == Resource::Cpu ? "cpu" : "gpu") << " share, c = " << c);
      // Linear in its experts, from a fixed part that is positive and smaller than the whole block.
      CHECK(t(r, share, c) == Approx(fixed + experts(c) * per_expert).epsilon(1e-9));
      CHECK(t(r, share, c) > whole * experts(c) / k);
    }
    CHECK(fixed > 0);
    CHECK(fixed < whole);
  }
  // The GPU share extended to all k experts is the whole block; the CPU's partial is added by an action of
  // its own (one f32 add over the rows), whatever c.
  const double g1 = t(Resource::GpuCompute, ComputePart::MoeGpuShare, 1),
               g2 = t(Resource::GpuCompute, ComputePart::MoeGpuShare, 2);
  CHECK(g1 + (g1 - g2) ==
        Approx(t(Resource::GpuCompute, ComputePart::Full, 0)).epsilon(1e-9));  // k experts: one more than c = 1
  const double add = t(Resource::GpuCompute, ComputePart::MoeShareAdd, 3);
  CHECK(add == t(Resource::GpuCompute, ComputePart::MoeShareAdd, 1));
  Op add_op;
  add_op.kind = OpKind::Elementwise;
  add_op.dtype = DType::F32;
  add_op.tokens = 1;
  add_op.elems = spec.hidden_size;
  ExecEnv gpu;
  gpu.backend = Backend::Gpu;
  CHECK(add == Approx(cost->op_ms(add_op, gpu)).epsilon(1e-9));
}

TEST_CASE("GPU attention over a host KV cache runs staged where that is faster", "[planner]") {
  // nemo8b at 2G/1K with the KV of 10 of 40 layers in VRAM: split, a 1024-token GPU-only prefill runs
  // the other 30 layers' attention core on the CPU; staged, it copies each such layer's cache to the
  // arena, attends on the GPU and copies the step's rows back.
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(spec, 2 * GiB, 1024, 16);
  cfg.tiers = {1, 512, 1024};
  cfg.kv_layers = 10;
  PlannerConfig split_cfg = cfg;
  split_cfg.host_kv_attention = PlannerConfig::HostKvAttention::Split;
  const PlanTable chosen = build_plan_table(spec, *cost, cfg), split = build_plan_table(spec, *cost, split_cfg);
  auto count = [](const Plan& p, ComputePart part) {
    int k = 0;
    for (const Action& a : p.actions) k += a.part == part && a.kind == ActionKind::Compute;
    return k;
  };
  const Plan* st = chosen.find_tier(1024)->find(Schedule::GpuOnly);
  const Plan* sp = split.find_tier(1024)->find(Schedule::GpuOnly);
  REQUIRE(st->feasible);
  REQUIRE(sp->feasible);
  CHECK(count(*st, ComputePart::AttnStaged) == 30);
  CHECK(count(*st, ComputePart::AttnCore) == 0);
  CHECK(count(*sp, ComputePart::AttnStaged) == 0);
  CHECK(count(*sp, ComputePart::AttnCore) == 30);
  CHECK(st->predicted_ms < sp->predicted_ms);
  CHECK(st->vram_bytes <= cfg.budget_bytes);
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
  const uint64_t layer_kv = S.at(S.kv[0]).bytes;
  bool region = false;
  for (const ArenaRegion& r : st->arena) region = region || (r.name == "kv staging" && r.bytes >= 2 * layer_kv);
  CHECK(region);
  for (const ArenaRegion& r : sp->arena) CHECK(r.name != "kv staging");
  // Each staged layer: its cached rows up (none at tier 1024: the step fills the 1024-token cache),
  // the compute after them, the step's rows back; the next layer's upload waits for that copy back.
  const uint64_t row = 2 * dtype_row_bytes(cfg.kv_dtype, spec.kv_dim());
  int last_new = -1, staged_layers = 0;
  for (const Action& a : st->actions) {
    if (a.payload == Payload::KvPast) {
      CHECK(a.bytes == 0);
      CHECK(a.resource == Resource::H2DAct);
      if (last_new >= 0) CHECK(std::find(a.deps.begin(), a.deps.end(), last_new) != a.deps.end());
    }
    if (a.payload == Payload::KvNew) {
      CHECK(a.bytes == 1024 * row);
      CHECK(a.resource == Resource::D2H);
      const Action& c = st->actions[static_cast<size_t>(a.deps.at(0))];
      CHECK(c.part == ComputePart::AttnStaged);
      CHECK(c.layer == a.layer);
      CHECK_FALSE(chosen.kv_on_gpu[static_cast<size_t>(a.layer)]);
      last_new = a.id;
      ++staged_layers;
    }
  }
  CHECK(staged_layers == 30);
  // At tier 512 the other 512 cached positions go up; with an f16 cache, half the bytes; with a q8_0
  // cache, 34 bytes per 32 values of each head (nemo8b: 8 KV heads of 128 values, 1024 a row: f32 4096
  // bytes, f16 2048, q8_0 8 * 4 * 34 = 1088). The KV shards, the staging region, the model's bytes per
  // token and the table's (and its JSON's) cache type say the same.
  CHECK(row == 2 * 4096);
  for (const Action& a : chosen.find_tier(512)->find(Schedule::GpuOnly)->actions)
    if (a.payload == Payload::KvPast) CHECK(a.bytes == 512 * row);
  for (const auto& [kv, row_bytes] : {std::pair{DType::F16, uint64_t{2048}}, std::pair{DType::Q8_0, uint64_t{1088}}}) {
    INFO(dtype_name(kv));
    PlannerConfig kv_cfg = cfg;
    kv_cfg.kv_dtype = kv;
    kv_cfg.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
    const ShardSet K = make_shards(spec, cfg.ctx, kv);
    CHECK(K.at(K.kv[0]).bytes == 1024 * 2 * row_bytes);
    CHECK(spec.kv_bytes_per_token(kv) == 40 * 2 * row_bytes);
    int staged = 0;
    const PlanTable kv_table = build_plan_table(spec, *cost, kv_cfg);
    CHECK(kv_table.kv_dtype == dtype_name(kv));
    CHECK(plan_table_from_json(plan_table_to_json(kv_table), "kv.json").kv_dtype == dtype_name(kv));
    const Plan& p512 = *kv_table.find_tier(512)->find(Schedule::GpuOnly);
    for (const Action& a : p512.actions)
      if (a.payload == Payload::KvPast && a.bytes > 0) {
        CHECK(a.bytes == 512 * 2 * row_bytes);
        ++staged;
      }
    CHECK(staged > 0);
    bool staging = false;
    for (const ArenaRegion& r : p512.arena)
      staging = staging || (r.name == "kv staging" && r.bytes >= 4 * 1024 * row_bytes);
    CHECK(staging);
  }
  // A q8_0 cache's blocks must not straddle two heads: tiny_llama's head_dim of 48 is refused, named.
  CHECK_THROWS_WITH(make_shards(builtin_spec("tiny_llama"), 64, DType::Q8_0),
                    Contains("planner") && Contains("q8_0") && Contains("head_dim is 48"));
  // Forced staged, the decode tier stages too; and the plans survive the JSON round trip.
  PlannerConfig staged_cfg = cfg;
  staged_cfg.host_kv_attention = PlannerConfig::HostKvAttention::Staged;
  const PlanTable forced = build_plan_table(spec, *cost, staged_cfg);
  CHECK(count(*forced.find_tier(1)->find(Schedule::GpuOnly), ComputePart::AttnStaged) == 30);
  const PlanTable back = plan_table_from_json(plan_table_to_json(forced), "round trip");
  const Plan* f = forced.find_tier(1)->find(Schedule::GpuOnly);
  const Plan* g = back.find_tier(1)->find(Schedule::GpuOnly);
  REQUIRE(f->actions.size() == g->actions.size());
  for (size_t i = 0; i < f->actions.size(); ++i) {
    CHECK(f->actions[i].part == g->actions[i].part);
    CHECK(f->actions[i].payload == g->actions[i].payload);
  }
}

TEST_CASE("a table of one schedule takes the layout best for it (run --schedule static)", "[planner]") {
  // nemo8b at 2G/1K: the mixed table keeps every layer's KV in VRAM (test above), where Static cannot
  // run; `run --schedule static` plans a table of Static alone, which must choose a layout it can run
  // in: the layers whose attention is not pinned keep their KV on the host (CPU attention).
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(spec, 2 * GiB, 1024, 16);
  cfg.tiers = {1, 512, 1024};
  cfg.host_kv_attention = PlannerConfig::HostKvAttention::Split;  // the layout of the test above
  const PlanTable mixed = build_plan_table(spec, *cost, cfg);
  REQUIRE_FALSE(mixed.find_tier(1)->find(Schedule::Static)->feasible);  // the premise
  PlannerConfig only = cfg;
  only.schedules = {Schedule::Static};
  const PlanTable st = build_plan_table(spec, *cost, only);
  const Plan* p = st.find_tier(1)->find(Schedule::Static);
  REQUIRE(p != nullptr);
  REQUIRE(p->feasible);
  CHECK(st.find_tier(1)->chosen == Schedule::Static);
  CHECK(std::find(st.kv_on_gpu.begin(), st.kv_on_gpu.end(), false) != st.kv_on_gpu.end());
  // A table of Dynamic alone may keep the mixed layout: Dynamic runs in it.
  only.schedules = {Schedule::Dynamic};
  CHECK(build_plan_table(spec, *cost, only).find_tier(1)->find(Schedule::Dynamic)->feasible);
}

TEST_CASE("a table of baselines alone picks among them (run --schedule layer-split)", "[planner]") {
  // Baselines are reference rows in a mixed table, never picked; a table of layer-split alone must
  // pick it, or every tier is infeasible and the error names a 'smallest budget' below the budget given.
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig cfg = config(spec, 2 * GiB, 1024, 16);
  cfg.tiers = {1, 512, 1024};
  cfg.schedules = {Schedule::LayerSplit};
  const PlanTable t = build_plan_table(spec, *cost, cfg);
  for (const int64_t n : {int64_t(1), int64_t(512)}) {
    INFO("tier " << n);
    REQUIRE(t.find_tier(n)->feasible);
    CHECK(t.find_tier(n)->chosen == Schedule::LayerSplit);
  }
  CHECK_FALSE(t.find_tier(1024)->find(Schedule::LayerSplit)->feasible);  // above llama.cpp's micro-batch
  CHECK(t.find_tier(1024)->chunk_tokens == 512);                         // runs as two 512-token steps
  // The smallest budget is the baseline's own: the table builds there and not 2 MiB below.
  const uint64_t min_b = minimum_budget(spec, *cost, cfg);
  PlannerConfig at = cfg;
  at.budget_bytes = min_b;
  CHECK_NOTHROW(build_plan_table(spec, *cost, at));
  at.budget_bytes = min_b - 2 * MiB;
  CHECK_THROWS_WITH(build_plan_table(spec, *cost, at), Contains("smallest budget") && Contains(std::to_string(min_b)));
  // In a mixed table the baseline stays a reference row.
  cfg.schedules = {Schedule::Static, Schedule::LayerSplit};
  CHECK(build_plan_table(spec, *cost, cfg).find_tier(1)->chosen == Schedule::Static);
}

namespace {
// A machine like `base` but for its copies: `beside_cpu` times slower while CPU work reads DRAM beside
// them, bursts of copies (the routed experts) `burst` times their bytes as one copy, and (issue_ms >= 0)
// that much host time to enqueue each.
class SlowerCopies : public CostModel {
 public:
  SlowerCopies(const CostModel& base, double beside_cpu, double burst, double issue_ms = -1)
      : base_(base), beside_cpu_(beside_cpu), burst_(burst), issue_ms_(issue_ms) {}
  double op_ms(const Op& op, const ExecEnv& env) const override { return base_.op_ms(op, env); }
  double transfer_ms(uint64_t bytes, Direction dir, bool pinned) const override {
    return base_.transfer_ms(bytes, dir, pinned);
  }
  double transfer_burst_ms(uint64_t bytes, int copies, Direction dir) const override {
    return (copies > 1 ? burst_ : 1.0) * base_.transfer_ms(bytes, dir, true);
  }
  double pcie_gbps(Direction dir) const override { return base_.pcie_gbps(dir); }
  double copy_slowdown(Direction, double cpu_dram_gbps) const override { return cpu_dram_gbps > 0 ? beside_cpu_ : 1.0; }
  double sync_ms() const override { return base_.sync_ms(); }
  double copy_issue_ms() const override { return issue_ms_ >= 0 ? issue_ms_ : base_.copy_issue_ms(); }
  double launch_ms() const override { return base_.launch_ms(); }
  int max_threads() const override { return base_.max_threads(); }
  uint64_t vram_bytes() const override { return base_.vram_bytes(); }
  std::string describe() const override { return base_.describe(); }

 private:
  const CostModel& base_;
  double beside_cpu_, burst_, issue_ms_;
};
}  // namespace

TEST_CASE(
    "simulation: the host enqueues a split layer's expert copies and GPU share beside its CPU share, or with one "
    "thread before it",
    "[planner][simulate]") {
  // runtime.cpp's issue order: once a layer's routing is on the host, the host thread enqueues the GPU
  // share's expert copies one by one (the first starts once it is enqueued) and its kernels — with one
  // thread, then it computes the CPU share; with more, while the pool's other threads compute it
  // (ThreadPool::set_caller_work), the share longer by that work over the threads.
  const ModelSpec spec = builtin_spec("qwen30b");
  auto base = make_analytic_cost_model(builtin_hardware("h200-host"));
  for (int threads : {1, 16}) {
    INFO(threads << " thread(s)");
    PlannerConfig cfg = config(spec, 4 * GiB, 4096, threads);
    cfg.tiers = {1};
    const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
    const PlanTable t = build_plan_table(spec, *base, cfg);
    const Plan* dy = t.find_tier(1)->find(Schedule::Dynamic);
    REQUIRE(dy->feasible);
    StepShape step;
    step.tokens = 1;
    step.keys = cfg.ctx;
    step.threads = cfg.threads;
    step.gpu_fused_qkv_max_tokens = cfg.executor.gpu_fused_qkv_max_tokens;
    const double issue = 0.01;                // 10 us a copy: large, to see it
    const double launch = base->launch_ms();  // the datasheet's kernel launch
    REQUIRE(launch > 0);
    const SlowerCopies issuing(*base, 1.0, 1.0, issue), free_issue(*base, 1.0, 1.0, 0.0);
    Plan with = *dy, without = *dy;
    const double t_with = simulate(with, spec, S, issuing, step),
                 t_without = simulate(without, spec, S, free_issue, step);
    int shares = 0;
    for (const Action& a : with.actions) {
      if (a.part != ComputePart::MoeCpuShare) continue;
      const Action* copy = nullptr;
      for (const Action& b : with.actions)
        if (b.kind == ActionKind::CopyWeights && b.layer == a.layer) copy = &b;
      REQUIRE(copy != nullptr);
      double routed = 0;  // when the copy's dependencies (the routing) were done
      for (int d : copy->deps) routed = std::max(routed, with.actions[static_cast<size_t>(d)].end_ms);
      double share_ready = 0;
      for (int d : a.deps) share_ready = std::max(share_ready, with.actions[static_cast<size_t>(d)].end_ms);
      const Action& gpu = with.actions[static_cast<size_t>(a.id) - 1];  // enqueued just before the CPU share
      REQUIRE(gpu.part == ComputePart::MoeGpuShare);
      CHECK(copy->copies > 1);
      const double work = copy->copies * issue + 4 * launch;  // simulator.cpp kGpuShareLaunches
      const Action& alone = without.actions[static_cast<size_t>(a.id)];
      if (threads == 1) {
        CHECK(a.start_ms >= routed + copy->copies * issue + 2 * launch - 1e-9);  // the GPU share's kernels issued first
        CHECK(gpu.start_ms >= routed + copy->copies * issue + launch - 1e-9);
        CHECK(copy->start_ms >= routed + issue - 1e-9);
        CHECK(copy->start_ms < routed + copy->copies * issue - 1e-9);
      } else {
        CHECK(a.start_ms < routed + copy->copies * issue);  // not held back by the enqueues
        // Enqueued beside it, from the routing (the share's x arrives a few us later: not waited for here).
        CHECK(copy->start_ms >= routed + issue - 1e-9);
        CHECK(copy->start_ms < a.start_ms + 2 * issue);
        CHECK(gpu.start_ms >= routed + copy->copies * issue + launch - 1e-9);
        // The share took the host's enqueue work over the threads longer than it does with none (give
        // or take the DRAM contention of copies that moved).
        CHECK(a.end_ms - a.start_ms ==
              Approx(alone.end_ms - alone.start_ms + work / threads).margin(0.1 * work / threads));
      }
      ++shares;
    }
    CHECK(shares > 0);
    CHECK(t_with > t_without);
    // With no copy issue time the schedule is the planner's own.
    CHECK(t_without == Approx(dy->predicted_ms).epsilon(1e-9));
  }
}

TEST_CASE("simulation: copies beside CPU work take the cost model's slowdown", "[planner][simulate]") {
  const ModelSpec spec = builtin_spec("nemo8b");
  auto base = make_analytic_cost_model(builtin_hardware("h200-host"));
  const SlowerCopies slow(*base, 1.25, 1.0);  // 25% slower beside CPU work
  PlannerConfig cfg = config(spec, 4 * GiB, 1024, 16);
  cfg.tiers = {1};
  cfg.kv_layers = 0;
  const Plan d0 = build_plan(spec, *base, cfg, Schedule::Dynamic, 1);
  REQUIRE(d0.feasible);
  // The same plan simulated on the slower machine: its weight copies 25% longer where CPU FFNs run
  // beside them.
  Plan d1 = d0;
  StepShape step;
  step.tokens = 1;
  step.keys = cfg.ctx;
  step.threads = cfg.threads;
  step.gpu_fused_qkv_max_tokens = cfg.executor.gpu_fused_qkv_max_tokens;
  const ShardSet S = make_shards(spec, cfg.ctx, cfg.kv_dtype);
  const double slow_ms = simulate(d1, spec, S, slow, step);
  Plan again = d0;
  CHECK(simulate(again, spec, S, *base, step) == Approx(d0.predicted_ms).epsilon(1e-12));  // the planner's simulation
  int slowed = 0;
  for (size_t i = 0; i < d0.actions.size(); ++i) {
    const Action& a = d0.actions[i];
    const Action& b = d1.actions[i];
    if (a.kind != ActionKind::CopyWeights) continue;
    // (Beside the activation queue's copies each also shares the link, so not exactly 1.25x.)
    const double ta = a.end_ms - a.start_ms, tb = b.end_ms - b.start_ms;
    CHECK(tb >= ta * 0.999);
    CHECK(tb <= ta * 1.25 * 1.05);
    slowed += tb >= 1.2 * ta;
  }
  CHECK(slowed > 0);
  CHECK(slow_ms > d0.predicted_ms);
  // GPU-only runs no CPU work beside its copies: unchanged.
  CHECK(build_plan(spec, slow, cfg, Schedule::GpuOnly, 1).predicted_ms ==
        Approx(build_plan(spec, *base, cfg, Schedule::GpuOnly, 1).predicted_ms).epsilon(1e-12));
}

TEST_CASE("simulation: the two host-to-device queues share the link", "[planner][simulate]") {
  // Weights go on one queue, activations and staged KV caches on another; the executor paces both
  // as one link (and without a cap the link is one). Two equal copies side by side take twice one.
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  const ShardSet S = make_shards(spec, 1024, DType::F32);
  StepShape step;
  auto copy = [](int id, Resource r, uint64_t bytes) {
    Action a;
    a.id = id;
    a.resource = r;
    a.kind = r == Resource::H2D ? ActionKind::CopyWeights : ActionKind::CopyActivations;
    a.bytes = bytes;
    return a;
  };
  const uint64_t big = 256ull << 20;
  const double alone = cost->transfer_ms(big, Direction::HostToDevice);
  Plan p;
  p.actions = {copy(0, Resource::H2D, big), copy(1, Resource::H2DAct, big)};
  CHECK(simulate(p, spec, S, *cost, step) == Approx(2 * alone).epsilon(1e-9));
  // A tenth beside it: the big copy finishes when the link has moved both (1.1x, within 1%).
  p.actions = {copy(0, Resource::H2D, big), copy(1, Resource::H2DAct, big / 10)};
  CHECK(simulate(p, spec, S, *cost, step, 8) == Approx(1.1 * alone).epsilon(0.01));
  // A device-to-host copy uses the other direction: no sharing.
  p.actions = {copy(0, Resource::H2D, big), copy(1, Resource::D2H, big)};
  const double d2h = cost->transfer_ms(big, Direction::DeviceToHost);
  CHECK(simulate(p, spec, S, *cost, step) == Approx(std::max(alone, d2h)).epsilon(1e-9));
  // One after the other (a dependency): no overlap, no sharing.
  p.actions = {copy(0, Resource::H2D, big), copy(1, Resource::H2DAct, big)};
  p.actions[1].deps = {0};
  CHECK(simulate(p, spec, S, *cost, step) == Approx(2 * alone).epsilon(1e-9));
  p.actions[1].bytes = big / 2;
  CHECK(simulate(p, spec, S, *cost, step) ==
        Approx(alone + cost->transfer_ms(big / 2, Direction::HostToDevice)).epsilon(1e-9));
}

TEST_CASE("repredict: a plan simulated again gives its prediction, and with slower CPU work a slower one",
          "[planner][simulate]") {
  int scaled_up = 0;
  for (const char* model : {"nemo8b", "qwen30b"}) {
    const ModelSpec spec = builtin_spec(model);
    auto base = make_analytic_cost_model(builtin_hardware("h200-host"), 16e9);
    const auto slow = make_cpu_scaled_cost_model(*base, 2.0);
    for (uint64_t budget : {2 * GiB, 8 * GiB}) {
      PlannerConfig cfg = config(spec, budget, 4096, 16);
      cfg.tiers = {1, 512};
      const PlanTable t = build_plan_table(spec, *base, cfg);
      for (const auto& e : t.tiers)
        for (const Plan& p : e.candidates) {
          if (!p.feasible) continue;
          INFO(model << " " << budget << " " << schedule_name(p.schedule) << " tier " << p.tier);
          CHECK(repredict(p, spec, *base, cfg) == Approx(p.predicted_ms).epsilon(1e-9));
          const double s = repredict(p, spec, *slow, cfg);
          CHECK(s >= p.predicted_ms * 0.99);  // (slower CPU work beside copies slows them less)
          CHECK(s <= 2.0 * p.predicted_ms * (1 + 1e-9));
          scaled_up += s > 1.2 * p.predicted_ms;
        }
    }
  }
  CHECK(scaled_up > 4);  // plans with CPU work on their critical path
  auto base = make_analytic_cost_model(builtin_hardware("cli3"));
  CHECK_THROWS_WITH(make_cpu_scaled_cost_model(*base, 0), Contains("must be positive"));
}

TEST_CASE("an impossible budget names the smallest budget that works", "[planner]") {
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  const PlannerConfig cfg = config(spec, 16 * MiB, 4096, 16);
  const uint64_t min_b = minimum_budget(spec, *cost, cfg);
  CHECK(min_b > 16 * MiB);
  CHECK_THROWS_WITH(build_plan_table(spec, *cost, cfg), Contains("smallest budget") && Contains(std::to_string(min_b)));
  CHECK_NOTHROW(build_plan_table(spec, *cost, config(spec, min_b, 4096, 16)));
}

TEST_CASE("the smallest budget named is exact to the arena's alignment of 256 bytes", "[planner]") {
  // A bisection stopped at 1 MiB named a budget up to 1 MiB above the smallest one that works.
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  for (const auto& [model, ctx] :
       {std::pair<const char*, int64_t>{"tiny_llama", 256}, {"tiny_moe", 1024}, {"nemo4b", 4096}}) {
    const ModelSpec spec = builtin_spec(model);
    const PlannerConfig cfg = config(spec, 1 << 30, ctx, 8);
    const uint64_t min_b = minimum_budget(spec, *cost, cfg);
    INFO(model << ": " << min_b);
    CHECK(min_b % 256 == 0);
    CHECK_NOTHROW(build_plan_table(spec, *cost, config(spec, min_b, ctx, 8)));
    CHECK_THROWS_WITH(
        build_plan_table(spec, *cost, config(spec, min_b - 256, ctx, 8)),
        Contains("the smallest budget that works is") && Contains("(" + std::to_string(min_b) + " bytes)"));
  }
}

namespace {

// Checks the contract of every feasible plan of a table.
void check_table(const PlanTable& t, const ModelSpec& spec) {
  std::map<int, int64_t> pinned_offset;  // shard -> offset, must agree across tiers and schedules
  for (const auto& e : t.tiers) {
    for (const Plan& p : e.candidates) {
      if (!p.feasible) continue;
      INFO(schedule_name(p.schedule) << " tier " << p.tier);
      REQUIRE(p.vram_bytes <= t.budget_bytes);
      // Arena regions inside the budget and disjoint.
      std::vector<std::pair<uint64_t, uint64_t>> regions;
      for (const auto& r : p.arena) {
        REQUIRE(r.offset + r.bytes <= t.budget_bytes);
        if (r.bytes) regions.push_back({r.offset, r.offset + r.bytes});
      }
      std::sort(regions.begin(), regions.end());
      for (size_t i = 1; i < regions.size(); ++i) REQUIRE(regions[i].first >= regions[i - 1].second);
      // Actions: ids are positions, deps point backwards, times are consistent.
      for (size_t i = 0; i < p.actions.size(); ++i) {
        const Action& a = p.actions[i];
        REQUIRE(a.id == static_cast<int>(i));
        for (int d : a.deps) {
          REQUIRE(d < a.id);
          REQUIRE(p.actions[static_cast<size_t>(d)].end_ms <= a.start_ms + 1e-9);
        }
        REQUIRE(a.end_ms >= a.start_ms);
        REQUIRE(a.end_ms <= p.predicted_ms + 1e-9);
        if (a.kind == ActionKind::Compute && a.resource == Resource::GpuCompute && a.slot >= 0 &&
            (a.part == ComputePart::Full || a.part == ComputePart::AttnPre || a.part == ComputePart::MoeGpuShare)) {
          bool has_copy = false;
          for (int d : a.deps)
            has_copy |= p.actions[static_cast<size_t>(d)].kind == ActionKind::CopyWeights &&
                        p.actions[static_cast<size_t>(d)].shard == a.shard;
          REQUIRE(has_copy);
        }
      }
      // One compute of each layer's FFN and attention, in layer order on its resource; a layer whose
      // experts are split (Dynamic, MoE) has one CPU share and one GPU share of the same split instead.
      int ffn_computes = 0, cpu_shares = 0, gpu_shares = 0;
      for (const auto& a : p.actions) {
        if (a.kind != ActionKind::Compute || a.layer < 0 ||
            p.placements[static_cast<size_t>(a.shard)].name.find("ffn") == std::string::npos)
          continue;
        ffn_computes += a.part == ComputePart::Full;
        cpu_shares += a.part == ComputePart::MoeCpuShare;
        gpu_shares += a.part == ComputePart::MoeGpuShare;
        if (a.part == ComputePart::MoeCpuShare) REQUIRE(a.resource == Resource::Cpu);
        if (a.part == ComputePart::MoeGpuShare) REQUIRE(a.resource == Resource::GpuCompute);
        if (a.part != ComputePart::Full) {
          REQUIRE(p.schedule == Schedule::Dynamic);
          REQUIRE(spec.is_moe());
          REQUIRE(a.cpu_experts >= 1);
          REQUIRE(a.cpu_experts < spec.num_experts_per_tok);
        }
      }
      REQUIRE(cpu_shares == gpu_shares);
      REQUIRE(ffn_computes + cpu_shares == spec.num_hidden_layers);
      if (p.schedule == Schedule::LayerSplit || p.schedule == Schedule::CpuMoe) continue;
      REQUIRE(p.kv_on_gpu == t.kv_on_gpu);
      for (const auto& sp : p.placements) {
        if (sp.home != WeightHome::Pinned || sp.name.find("kv") != std::string::npos) continue;
        auto it = pinned_offset.find(sp.shard);
        if (it == pinned_offset.end())
          pinned_offset[sp.shard] = sp.arena_offset;
        else
          REQUIRE(it->second == sp.arena_offset);
      }
    }
  }
}

}  // namespace

TEST_CASE("invariants over models, machines, budgets, threads and PCIe caps", "[planner]") {
  int compared_caps = 0;
  for (const char* model : {"nemo8b", "qwen30b"}) {
    const ModelSpec spec = builtin_spec(model);
    for (const char* hw_name : {"cli3", "h200-host"}) {
      const HardwareSpec hw = builtin_hardware(hw_name);
      for (int64_t ctx : {4096, 16384}) {
        double prev_decode = INFINITY, prev_prefill = INFINITY;
        for (uint64_t budget : {2 * GiB, 4 * GiB, 8 * GiB, 16 * GiB, 40 * GiB}) {
          auto cost = make_analytic_cost_model(hw);
          PlannerConfig cfg = config(spec, budget, ctx, 16);
          cfg.tiers = {1, 16, 512, 4096};
          INFO(model << " " << hw_name << " ctx " << ctx << " budget " << budget);
          const PlanTable t = build_plan_table(spec, *cost, cfg);
          check_table(t, spec);
          // A larger budget never predicts slower for the chosen plan.
          const double decode = t.lookup(1).chosen_plan().predicted_ms;
          const double prefill =
              t.lookup(512).chosen_plan().predicted_ms * (512.0 / static_cast<double>(t.lookup(512).tokens));
          CHECK(decode <= prev_decode * 1.001);
          CHECK(prefill <= prev_prefill * 1.001);
          prev_decode = decode;
          prev_prefill = prefill;
          // A lower PCIe cap never makes GPU-only faster; more threads never make Static slower.
          auto capped = make_analytic_cost_model(hw, 16e9);
          PlannerConfig one = cfg;
          one.tiers = {1, 512};
          const PlanTable tc = build_plan_table(spec, *capped, one);
          const PlanTable tu = build_plan_table(spec, *cost, one);
          for (int64_t tier : {1, 512}) {
            const Plan* a = tc.find_tier(tier)->find(Schedule::GpuOnly);
            const Plan* b = tu.find_tier(tier)->find(Schedule::GpuOnly);
            // (in one layout: each table picks its own, and GPU-only is slow in some that others win)
            if (a->feasible && b->feasible && tc.kv_on_gpu == tu.kv_on_gpu) {
              CHECK(a->predicted_ms >= b->predicted_ms * 0.999);
              ++compared_caps;
            }
          }
          PlannerConfig few = one;
          few.threads = 1;
          const PlanTable t1 = build_plan_table(spec, *cost, few);
          for (int64_t tier : {1, 512}) {
            const Plan* a = t1.find_tier(tier)->find(Schedule::Static);
            const Plan* b = tu.find_tier(tier)->find(Schedule::Static);
            if (a->feasible && b->feasible && t1.kv_on_gpu == tu.kv_on_gpu)
              CHECK(b->predicted_ms <= a->predicted_ms * 1.001);
          }
        }
      }
    }
  }
  CHECK(compared_caps > 40);  // of 80 (model x machine x ctx x budget x tier)
}

TEST_CASE("plan table JSON round trip and lookup", "[planner]") {
  const ModelSpec spec = builtin_spec("qwen30b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli2"));
  PlanTable t = build_plan_table(spec, *cost, config(spec, 4 * GiB, 4096, 8));
  const std::string j = plan_table_to_json(t);
  const PlanTable back = plan_table_from_json(j, "table.json");
  CHECK(plan_table_to_json(back) == j);
  const Plan& p = t.lookup(3).chosen_plan();
  CHECK(plan_to_json(plan_from_json(plan_to_json(p), "plan.json")) == plan_to_json(p));
  CHECK(t.lookup(3).tokens == 4);
  CHECK(t.lookup(1).tokens == 1);
  CHECK(t.lookup(600).tokens <= 1024);
  CHECK(t.lookup(100000).tokens <= 16384);
  CHECK_THROWS_WITH(plan_from_json("{\"version\": 99}", "p.json"), Contains("version 99"));
  CHECK_THROWS_WITH(plan_from_json("{nope", "p.json"), Contains("p.json") && Contains("malformed"));
  std::string bad = plan_to_json(p);
  const auto pos = bad.find("\"deps\":[0");
  REQUIRE(pos != std::string::npos);
  bad.insert(pos + 8, "999999,");
  CHECK_THROWS_WITH(plan_from_json(bad, "p.json"), Contains("dependency"));
  // `copies` (how many copies a weight copy goes as): out of range is refused; plans saved before it
  // had one load as one copy each.
  const std::string good = plan_to_json(p);
  const auto c = good.find("\"copies\":");
  REQUIRE(c != std::string::npos);
  const auto c_end = good.find(',', c);
  CHECK_THROWS_WITH(plan_from_json(good.substr(0, c) + "\"copies\":0" + good.substr(c_end), "p.json"),
                    Contains("p.json") && Contains("copies: 0 must be"));
  const std::string old_plan = std::regex_replace(good, std::regex("\"copies\":[0-9]+,"), "");
  REQUIRE(old_plan.find("copies") == std::string::npos);
  for (const Action& a : plan_from_json(old_plan, "old.json").actions) CHECK(a.copies == 1);
}

TEST_CASE("planning every tier of qwen235b is fast", "[planner]") {
  const ModelSpec spec = builtin_spec("qwen235b");
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  const auto t0 = std::chrono::steady_clock::now();
  const PlanTable t = build_plan_table(spec, *cost, config(spec, 4 * GiB, 16384, 16));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("qwen235b, 11 tiers x 5 schedules planned in " << s << " s");
  CHECK(s < 10.0);  // well under a second in a release build; sanitizer builds are slower
  CHECK(t.lookup(1).feasible);
}

TEST_CASE("winner shares over the paper's configuration space (reported)", "[planner][report]") {
  for (const char* hw_name : {"cli3", "h200-host"}) {
    std::map<int64_t, std::map<std::string, int>> wins;  // tier -> schedule -> count
    int total = 0;
    for (const char* model : {"nemo8b", "qwen30b"}) {
      const ModelSpec spec = builtin_spec(model);
      for (double cap : {16e9, 0.0})
        for (int threads : {1, 16})
          for (int64_t ctx : {4096, 16384})
            for (uint64_t budget : {2 * GiB, 4 * GiB, 8 * GiB, 16 * GiB}) {
              auto cost = make_analytic_cost_model(builtin_hardware(hw_name), cap);
              PlannerConfig cfg = config(spec, budget, ctx, threads);
              cfg.tiers = {1, 512};
              const PlanTable t = build_plan_table(spec, *cost, cfg);
              for (const auto& e : t.tiers)
                if (e.feasible) {
                  ++wins[e.tokens][schedule_name(e.chosen)];
                  ++total;
                }
            }
    }
    std::ostringstream os;
    os << hw_name << ": " << total << " (configuration, tier) decisions.";
    for (const auto& tier : wins) {
      int n = 0;
      for (const auto& w : tier.second) n += w.second;
      os << " Tier " << tier.first << ":";
      for (const auto& w : tier.second) os << " " << w.first << " " << (100.0 * w.second / n) << "%";
      os << ".";
    }
    WARN(os.str());
    CHECK(total == 2 * 2 * 2 * 2 * 4 * 2);
  }
}

TEST_CASE("measured MoE routing: the curve, and what a step streams and costs", "[planner][routing]") {
  const ModelSpec moe = builtin_spec("qwen30b");  // 128 experts, top-8
  PlannerConfig cfg = config(moe, 4 * GiB, 4096, 16);
  cfg.tiers = {1, 512};
  CHECK(routing_experts_for(moe, cfg, 512) == 0);  // not measured: the uniform expectation applies
  cfg.routing_tokens = {1, 16, 512};
  cfg.routing_experts = {8, 20, 40};
  CHECK(routing_experts_for(moe, cfg, 1) == 8);
  CHECK(routing_experts_for(moe, cfg, 512) == 40);
  CHECK(routing_experts_for(moe, cfg, 4096) == 40);  // beyond: the last count
  CHECK(routing_experts_for(moe, cfg, 64) == Approx(20 * std::pow(2.0, std::log(4.0) / std::log(32.0))));  // log-log
  CHECK(routing_experts_for(moe, cfg, 2) == Approx(8 * std::pow(20.0 / 8.0, 0.25)).epsilon(1e-9));
  CHECK(routing_experts_for(hand_model(), cfg, 512) == 0);  // dense models have no routing
  PlannerConfig bad = cfg;
  bad.routing_experts = {8, 20};
  CHECK_THROWS_WITH(routing_experts_for(moe, bad, 4), Contains("routing curve"));
  bad.routing_experts = {8, 0, 40};
  CHECK_THROWS_WITH(routing_experts_for(moe, bad, 4), Contains("routing curve"));
  // Held within [k, min(E, n·k)]: 2 tokens cannot touch more than 16 experts.
  PlannerConfig wide = cfg;
  wide.routing_experts = {100, 120, 128};
  CHECK(routing_experts_for(moe, wide, 2) == 16);

  // A GPU-only prefill streams the routed experts only: with 40 experts per layer measured (instead
  // of all 128 for 512 uniform tokens) each FFN copy carries the non-expert part plus 40 experts, and
  // the step is predicted faster.
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"), 16e9);
  PlannerConfig uni = cfg;
  uni.routing_tokens.clear();
  uni.routing_experts.clear();
  const Plan p_uni = build_plan(moe, *cost, uni, Schedule::GpuOnly, 512);
  const Plan p_meas = build_plan(moe, *cost, cfg, Schedule::GpuOnly, 512);
  REQUIRE(p_uni.feasible);
  REQUIRE(p_meas.feasible);
  const ShardSet S = make_shards(moe, cfg.ctx, cfg.kv_dtype);
  const Shard& ffn = S.at(S.ffn.back());
  uint64_t copied_uni = 0, copied_meas = 0;
  for (const Action& a : p_uni.actions)
    if (a.kind == ActionKind::CopyWeights && a.shard == ffn.id) copied_uni += a.bytes;
  for (const Action& a : p_meas.actions)
    if (a.kind == ActionKind::CopyWeights && a.shard == ffn.id) copied_meas += a.bytes;
  CHECK(copied_meas == ffn_bytes_touched(moe, ffn, 512, false, 40.0));
  CHECK(copied_uni == ffn_bytes_touched(moe, ffn, 512, false));
  CHECK(copied_meas < copied_uni);
  CHECK(p_meas.predicted_ms < 0.6 * p_uni.predicted_ms);
  // Decode streams the same experts: one token touches top-k either way. (The predicted step may
  // differ: the table's layout — KV layers, the LM head's place — is chosen for a whole request,
  // whose prefill the measured routing makes cheaper.)
  for (const PlannerConfig* c : {&cfg, &uni}) {
    const Plan d = build_plan(moe, *cost, *c, Schedule::GpuOnly, 1);
    REQUIRE(d.feasible);
    uint64_t copied = 0;
    for (const Action& a : d.actions)
      if (a.kind == ActionKind::CopyWeights && a.shard == ffn.id) copied += a.bytes;
    CHECK(copied == ffn_bytes_touched(moe, ffn, 1, false));
  }
  // Each routed FFN copy says how many copies the runtime issues for it (gate, up and down of every
  // routed expert, and the norm), and the simulation prices them as a burst of that many.
  auto ffn_copies = [&](const Plan& p) {
    std::vector<int> c;
    for (const Action& a : p.actions)
      if (a.kind == ActionKind::CopyWeights && a.shard == ffn.id) c.push_back(a.copies);
    return c;
  };
  CHECK(ffn_copies(p_meas) == std::vector<int>{1 + 3 * 40});
  CHECK(ffn_copies(p_uni) ==
        std::vector<int>{1 + static_cast<int>(std::llround(3 * expected_distinct_experts(512, 8, 128)))});
  const Plan d1 = build_plan(moe, *cost, uni, Schedule::GpuOnly, 1);
  CHECK(ffn_copies(d1) == std::vector<int>{1 + 3 * 8});
  // With strided copies the runtime makes fewer per expert (ExecutorTraits::expert_copies): the plan
  // says so; 0 or 4 copies an expert is refused.
  for (int per : {1, 2}) {
    PlannerConfig fewer = uni;
    fewer.executor.expert_copies = per;
    CHECK(ffn_copies(build_plan(moe, *cost, fewer, Schedule::GpuOnly, 1)) == std::vector<int>{1 + per * 8});
  }
  for (int bad : {0, 4}) {
    PlannerConfig b = uni;
    b.executor.expert_copies = bad;
    CHECK_THROWS_WITH(build_plan_table(moe, *cost, b), Contains("expert copies"));
  }
  // Without the executor's traits nothing is planned (no scratch size, no token limits).
  PlannerConfig none = uni;
  none.executor = ExecutorTraits{};
  CHECK_THROWS_WITH(build_plan_table(moe, *cost, none), Contains("no executor traits"));
  CHECK_THROWS_WITH(minimum_budget(moe, *cost, none), Contains("no executor traits"));
  const SlowerCopies slow(*cost, 1.0, 2.0);  // bursts twice their bytes as one copy
  Plan d1_slow = d1;
  StepShape shape;
  shape.tokens = 1;
  shape.keys = uni.ctx;
  shape.threads = uni.threads;
  shape.kv_dtype = uni.kv_dtype;
  shape.gpu_fused_qkv_max_tokens = uni.executor.gpu_fused_qkv_max_tokens;
  const double fast_ms = simulate(d1_slow, moe, S, *cost, shape);
  const double slow_ms = simulate(d1_slow, moe, S, slow, shape);
  int bursts = 0;
  for (const Action& a : d1_slow.actions)
    if (a.kind == ActionKind::CopyWeights && a.copies > 1 &&
        a.layer > 0) {  // (layer 0's may share the link with the input)
      ++bursts;
      CHECK(a.end_ms - a.start_ms == Approx(2 * cost->transfer_ms(a.bytes, Direction::HostToDevice)).epsilon(1e-12));
    }
  CHECK(bursts > 0);
  CHECK(slow_ms > fast_ms);

  // The experts op carries the measured count, and the cost model reads fewer expert bytes.
  Op e;
  e.kind = OpKind::MoeExperts;
  e.dtype = DType::Q4_0;
  e.tokens = 512;
  e.rows = 768;
  e.cols = 2048;
  e.n_experts = 128;
  e.top_k = 8;
  const double w_uni = e.weight_bytes();
  e.active_experts = 40;
  CHECK(e.weight_bytes() == Approx(w_uni * 40.0 / expected_distinct_experts(512, 8, 128)));
}

namespace {
// The plan without the actions `drop` selects: ids renumbered, dependencies on dropped actions removed.
Plan without(const Plan& p, const std::function<bool(const Action&)>& drop) {
  Plan out = p;
  out.actions.clear();
  std::vector<int> new_id(p.actions.size(), -1);
  for (const Action& a : p.actions) {
    if (drop(a)) continue;
    Action b = a;
    b.id = static_cast<int>(out.actions.size());
    b.deps.clear();
    for (int d : a.deps)
      if (new_id[static_cast<size_t>(d)] >= 0) b.deps.push_back(new_id[static_cast<size_t>(d)]);
    new_id[static_cast<size_t>(a.id)] = b.id;
    out.actions.push_back(b);
  }
  return out;
}

struct Verified {
  ModelSpec spec;
  PlannerConfig cfg;
  PlanTable table;
  ShardSet shards;
};

// A table whose chosen plans stream weights through both slots (budget: a third of the weights).
// `extra`: budget beyond the smallest that plans (0: the weights stream; large: everything fits).
Verified streaming_table(const std::string& model, Schedule s, uint64_t extra = 1 << 20) {
  Verified v;
  v.spec = builtin_spec(model);
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  v.cfg = config(v.spec, 1 << 30, 1024, 8);
  v.cfg.budget_bytes = std::max(v.spec.total_bytes() / 3, minimum_budget(v.spec, *cost, v.cfg) + extra);
  v.cfg.schedules = {s};
  v.table = build_plan_table(v.spec, *cost, v.cfg);
  v.shards = make_shards(v.spec, v.cfg.ctx, v.cfg.kv_dtype);
  return v;
}

std::string verify_error(const Verified& v, const Plan& p) {
  try {
    verify_plan(p, v.spec, v.shards, v.table.budget_bytes, "t.json: tiers[0]");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("plan verifier: the planner's tables keep every rule, for every schedule, model and budget",
          "[planner][verify]") {
  auto cost = make_analytic_cost_model(builtin_hardware("cli3"));
  for (const char* model : {"tiny_llama", "tiny_moe", "nemo4b", "qwen30b"}) {
    const ModelSpec spec = builtin_spec(model);
    for (double share : {0.2, 0.5, 1.5}) {
      PlannerConfig cfg =
          config(spec, static_cast<uint64_t>(share * static_cast<double>(spec.total_bytes())) + (64 << 20), 2048, 8);
      cfg.schedules = {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe};
      INFO(model << " at " << share << " of its weights");
      PlanTable t;
      try {
        t = build_plan_table(spec, *cost, cfg);  // verifies its own output
      } catch (const Error& e) {
        CHECK_THAT(std::string(e.what()), !Contains("internal error"));
        continue;
      }
      CHECK_NOTHROW(verify_plan_table(t, spec, make_shards(spec, cfg.ctx, cfg.kv_dtype), "t.json"));
    }
  }
}

TEST_CASE("plan verifier: plans that would run wrong are refused, naming the rule", "[planner][verify]") {
  for (Schedule sched : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}) {
    const Verified v = streaming_table("tiny_llama", sched);
    const Plan& good = v.table.tiers.front().chosen_plan();
    INFO(schedule_name(sched));
    REQUIRE(verify_error(v, good) == "");
    bool streams = false;
    for (const Action& a : good.actions) streams = streams || a.kind == ActionKind::CopyWeights;
    REQUIRE((streams || sched == Schedule::Static));  // Static runs what is not pinned on the CPU

    Plan p = good;  // every region at offset 0
    for (ArenaRegion& r : p.arena) r.offset = 0;
    CHECK_THAT(verify_error(v, p), Contains("t.json: tiers[0]") && Contains("overlap"));

    // No compute at all (tokens [0, 0, 0] before), one layer's FFN missing, one attention twice.
    CHECK_THAT(verify_error(v, without(good, [](const Action& a) { return a.kind == ActionKind::Compute; })),
               Contains("is not computed exactly once"));
    const int ffn1 = v.shards.ffn[1];
    CHECK_THAT(verify_error(
                   v, without(good, [&](const Action& a) { return a.kind == ActionKind::Compute && a.shard == ffn1; })),
               Contains("layer 1's FFN is not computed exactly once"));
    p = good;
    for (const Action& a : good.actions)
      if (a.kind == ActionKind::Compute && a.shard == v.shards.attention[0]) {
        Action twice = a;
        twice.id = static_cast<int>(p.actions.size());
        twice.deps = {a.id};
        p.actions.push_back(twice);
        break;
      }
    CHECK_THAT(verify_error(v, p), Contains("layer 0's attention is not computed exactly once"));

    // The residual stream's copies between host and GPU removed.
    CHECK_THAT(verify_error(v, without(good, [](const Action& a) { return a.payload == Payload::Residual; })),
               Contains("residual stream") || Contains("does not wait"));
    // The logits never come back.
    if (std::any_of(good.actions.begin(), good.actions.end(),
                    [](const Action& a) { return a.kind == ActionKind::CopyLogits; }))
      CHECK_THAT(verify_error(v, without(good, [](const Action& a) { return a.kind == ActionKind::CopyLogits; })),
                 Contains("no logits copy"));
    if (!streams) continue;
    // A weight copy that no longer waits for the compute reading the slot before it.
    p = good;
    bool cut = false;
    for (Action& a : p.actions)
      if (!cut && a.kind == ActionKind::CopyWeights)
        for (size_t i = 0; i < a.deps.size() && !cut; ++i)
          if (p.actions[static_cast<size_t>(a.deps[i])].kind == ActionKind::Compute &&
              p.actions[static_cast<size_t>(a.deps[i])].resource == Resource::GpuCompute) {
            a.deps.erase(a.deps.begin() + static_cast<std::ptrdiff_t>(i));
            cut = true;
          }
    REQUIRE(cut);
    CHECK_THAT(verify_error(v, p), Contains("overwrites stream slot"));
    // A compute of a streamed shard naming the other slot.
    p = good;
    for (Action& a : p.actions)
      if (a.kind == ActionKind::Compute && a.slot >= 0 && a.resource == Resource::GpuCompute) {
        a.slot = 1 - a.slot;
        break;
      }
    CHECK_THAT(verify_error(v, p), Contains("reads stream slot"));
  }
}

TEST_CASE("plan verifier: KV caches and pinned weights stay in their regions, apart", "[planner][verify]") {
  const Verified v = streaming_table("tiny_llama", Schedule::GpuOnly, 64 << 20);  // everything fits
  const Plan& good = v.table.tiers.front().chosen_plan();
  REQUIRE(verify_error(v, good) == "");
  std::vector<size_t> kv, pinned;
  for (size_t i = 0; i < good.placements.size(); ++i)
    if (good.placements[i].home == WeightHome::Pinned)
      (v.shards.at(good.placements[i].shard).kind == ShardKind::Kv ? kv : pinned).push_back(i);
  REQUIRE(kv.size() >= 2);
  REQUIRE(pinned.size() >= 2);
  Plan p = good;  // a layer's KV cache on top of pinned weights
  p.placements[kv[1]].arena_offset = 0;
  CHECK_THAT(verify_error(v, p), Contains("t.json: tiers[0]") && Contains("outside the 'kv' region"));
  p = good;  // two layers' caches in one place
  p.placements[kv[1]].arena_offset = p.placements[kv[0]].arena_offset;
  CHECK_THAT(verify_error(v, p), Contains("overlap in the arena"));
  p = good;  // two pinned shards in one place
  p.placements[pinned[1]].arena_offset = p.placements[pinned[0]].arena_offset;
  CHECK_THAT(verify_error(v, p), Contains("overlap in the arena"));
  p = good;  // a cache the plan says is on the host
  p.kv_on_gpu[0] = false;
  CHECK_THAT(verify_error(v, p), Contains("kv_on_gpu says the opposite"));
}

TEST_CASE("plan verifier: a table's KV layout is one across its chosen plans, and budgets and contexts are bounded",
          "[planner][verify]") {
  Verified v = streaming_table("tiny_llama", Schedule::GpuOnly, 64 << 20);  // every cache in VRAM
  REQUIRE(v.table.tiers.size() > 1);
  PlanTable t = v.table;
  CHECK_NOTHROW(verify_plan_table(t, v.spec, v.shards, "t.json"));
  // Move the KV cache of one tier's plan (within its region, still disjoint): a cache would move.
  REQUIRE(t.tiers[1].feasible);
  Plan& p = t.tiers[1].candidates.front();
  bool moved = false;
  for (ShardPlacement& sp : p.placements)
    if (!moved && v.shards.at(sp.shard).kind == ShardKind::Kv && sp.home == WeightHome::Pinned) {
      for (ShardPlacement& other : p.placements)
        if (&other != &sp && v.shards.at(other.shard).kind == ShardKind::Kv && other.home == WeightHome::Pinned) {
          std::swap(sp.arena_offset, other.arena_offset);
          moved = true;
          break;
        }
    }
  REQUIRE(moved);
  CHECK_THROWS_WITH(verify_plan_table(t, v.spec, v.shards, "t.json"),
                    Contains("t.json: tiers[") && Contains("KV caches lie elsewhere"));
  t = v.table;
  t.budget_bytes = kMaxVramBudget + 1;
  CHECK_THROWS_WITH(verify_plan_table(t, v.spec, v.shards, "t.json"),
                    Contains("t.json: budget_bytes") && Contains("1 PiB"));
  t = v.table;
  t.tiers.front().chunk_tokens = 7;
  CHECK_THROWS_WITH(verify_plan_table(t, v.spec, v.shards, "t.json"), Contains("t.json: tiers[0]: chunk_tokens 7"));
}

TEST_CASE("plan table JSON: errors name the file and the field, and unknown fields are refused", "[planner][verify]") {
  const Verified v = streaming_table("tiny_llama", Schedule::Static);
  const std::string good = plan_table_to_json(v.table);
  auto error_of = [](const std::string& text) {
    try {
      plan_table_from_json(text, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    const auto at = good.find(from);
    REQUIRE(at != std::string::npos);
    return good.substr(0, at) + to + good.substr(at + from.size());
  };
  CHECK(error_of(good) == "");
  CHECK_THAT(
      error_of(replaced("\"kind\":\"embed\"", "\"kind\":\"teleport\"")),
      Contains(
          "t.json: tiers[0].candidates[0].actions[0].kind: unknown action kind 'teleport' (one of embed, compute"));
  auto value_replaced = [&](const std::string& key, const std::string& value) {  // the first "key":number
    return std::regex_replace(good, std::regex("\"" + key + "\":-?[0-9]+"), "\"" + key + "\":" + value,
                              std::regex_constants::format_first_only);
  };
  CHECK_THAT(error_of(value_replaced("budget_bytes", "-1")),
             Contains("t.json: budget_bytes: must be a non-negative integer, got -1"));
  CHECK_THAT(error_of(replaced("\"tokens\":", "\"tokenz\":1,\"tokens\":")),
             Contains("t.json: tiers[0]: unknown field 'tokenz'"));
  CHECK_THAT(error_of(value_replaced("shard", "\"zero\"")),
             Contains("t.json: tiers[0].candidates[0].") && Contains(".shard: must be an integer, got \"zero\""));
  CHECK_THAT(error_of(value_replaced("slot", "99999999999")),
             Contains("t.json: tiers[0].candidates[0].actions[0].slot: must be an integer"));
  CHECK_THAT(error_of(value_replaced("ctx", "1e3")), Contains("t.json: ctx: must be an integer, got 1000.0"));
}

// A batched engine's sequences share the context: a token attends to its own sequence's share of it, so
// a table planned for 8 sequences prices each token's attention over ctx / 8 keys, and a step of 8
// decode tokens (one per sequence) costs less than 8 tokens of one sequence at the full context.
TEST_CASE("plans for several sequences price each token's attention over its own slot", "[planner]") {
  const ModelSpec spec = builtin_spec("nemo8b");
  auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
  PlannerConfig one = config(spec, 64 * GiB, 65536, 16);
  one.tiers = {1, 8};
  PlannerConfig eight = one;
  eight.executor = executor_traits(spec, 3, 8);
  const PlanTable a = build_plan_table(spec, *cost, one), b = build_plan_table(spec, *cost, eight);
  for (int64_t tier : {int64_t(1), int64_t(8)}) {
    const Plan* pa = a.find_tier(tier)->find(Schedule::GpuOnly);
    const Plan* pb = b.find_tier(tier)->find(Schedule::GpuOnly);
    REQUIRE(pa != nullptr);
    REQUIRE(pb != nullptr);
    REQUIRE(pa->feasible);
    REQUIRE(pb->feasible);
    INFO("tier " << tier << ": " << pa->predicted_ms << " ms for one sequence, " << pb->predicted_ms << " for 8");
    CHECK(pb->predicted_ms < pa->predicted_ms);
  }
}

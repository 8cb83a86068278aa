// GPU suite, runtime part: the CUDA device's queues, events, arena and PCIe cap, and the plan runtime
// on CUDA against the CPU reference for every schedule (runs on the GPU machine; see test_gpu.cpp).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "core/hardware_spec.h"
#include "core/host_buffer.h"
#include "core/thread_pool.h"
#include "costmodel/cost_model.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/runtime/runtime.h"
#include "planner/planner.h"
#include "test_util.h"

using namespace shardwise;

namespace {

std::vector<int32_t> seq(int n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((seed * 2654435761u + 40503u * static_cast<uint32_t>(i)) % vocab));
  return t;
}

std::vector<float> steps_of(StepEngine& e, const std::vector<int32_t>& toks, const std::vector<int>& steps) {
  std::vector<float> out, l(static_cast<size_t>(e.spec().vocab_size));
  size_t at = 0;
  for (int n : steps) {
    e.step(toks.data() + at, n, l.data());
    out.insert(out.end(), l.begin(), l.end());
    at += static_cast<size_t>(n);
  }
  return out;
}

}  // namespace

TEST_CASE("CUDA device: copies, events and the arena", "[gpu]") {
  auto dev = make_cuda_device(0);
  uint8_t* arena = dev->allocate_arena(64u << 20);
  const auto x = test::random_floats(1 << 20, 3);
  std::vector<float> y(x.size(), -1.0f);
  dev->pin_host(x.data(), x.size() * 4);
  dev->copy_h2d(arena, x.data(), x.size() * 4);
  const Event e = dev->record(Queue::H2D);
  dev->wait(Queue::Compute, e);
  dev->copy_d2d(arena + (16u << 20), arena, x.size() * 4);
  const Event c = dev->record(Queue::Compute);
  dev->wait(Queue::D2H, c);
  dev->copy_d2h(y.data(), arena + (16u << 20), y.size() * 4);
  dev->synchronize();
  CHECK(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  CHECK(dev->device_peak_bytes() >= (64u << 20));
  CHECK(dev->context_bytes() > 0);
}

TEST_CASE("CUDA device: the PCIe cap holds within 5% at 8, 16 and 32 GB/s", "[gpu]") {
  auto dev = make_cuda_device(0);
  const uint64_t bytes = 1ull << 30;
  uint8_t* arena = dev->allocate_arena(bytes);
  HostBuffer host(bytes);
  std::memset(host.data(), 1, bytes);
  dev->pin_host(host.data(), bytes);
  for (double cap : {8e9, 16e9, 32e9}) {
    dev->set_pcie_cap(cap);
    dev->copy_h2d(arena, host.data(), 64u << 20);  // warm up
    dev->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    dev->copy_h2d(arena, host.data(), bytes);
    dev->synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = static_cast<double>(bytes) / s;
    WARN("PCIe cap " << cap / 1e9 << " GB/s: achieved " << rate / 1e9 << " GB/s");
    CHECK(rate <= cap * 1.05);
    CHECK(rate >= cap * 0.95);
  }
  dev->set_pcie_cap(0);
  const auto t0 = std::chrono::steady_clock::now();
  dev->copy_h2d(arena, host.data(), bytes);
  dev->synchronize();
  WARN("PCIe uncapped: " << static_cast<double>(bytes) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9 << " GB/s");
}

TEST_CASE("CUDA runtime reproduces the CPU reference for every schedule", "[gpu]") {
  const std::string fx = test::fixtures_dir();
  std::vector<std::string> models = {fx + "/hf/mistral", fx + "/hf/qwen3", fx + "/hf/llama", fx + "/hf/qwen3moe_norm",
                                     fx + "/llamacpp/gguf/llama_small.q8_0.gguf", fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf",
                                     "synthetic:tiny_llama?dtype=q4_0&seed=4", "synthetic:tiny_moe?dtype=q8_0&seed=4",
                                     "synthetic:tiny_qwen3?dtype=bf16&seed=4"};
  ThreadPool pool(4);
  for (const auto& m : models) {
    auto src = open_weights(m);  // any head_dim runs (the HF fixtures have 8, 16, 24 and 32, tiny_llama 48)
    ModelWeights w = ModelWeights::from_source(*src);
    const int64_t ctx = 48;
    const auto toks = seq(40, src->spec().vocab_size, 7);
    const std::vector<int> steps = {17, 1, 1, 4, 1, 9, 1};
    CpuEngine cpu(w, pool, ctx);
    const auto ref = steps_of(cpu, toks, steps);
    for (double frac : {0.3, 3.0}) {
      auto cost = make_analytic_cost_model(builtin_hardware("h200-host"));
      PlannerConfig cfg;
      cfg.ctx = ctx;
      cfg.threads = 4;
      cfg.tiers = {1, 4, 16, 32};
      cfg.tensor_dtypes = tensor_dtypes_of(*src);
      cfg.budget_bytes = 1;
      const uint64_t min_b = minimum_budget(src->spec(), *cost, cfg);
      cfg.budget_bytes = std::max<uint64_t>(min_b + (256u << 10), static_cast<uint64_t>(frac * static_cast<double>(src->weight_bytes())));
      const PlanTable table = build_plan_table(src->spec(), *cost, cfg);
      for (Schedule s : {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic, Schedule::LayerSplit, Schedule::CpuMoe}) {
        bool feasible = false;
        for (const auto& t : table.tiers) feasible |= t.find(s) && t.find(s)->feasible;
        if (!feasible) continue;
        INFO(m << " budget " << cfg.budget_bytes << " " << schedule_name(s));
        auto dev = make_cuda_device(0);
        RuntimeOptions o;
        o.schedule = s;
        Runtime rt(*src, w, *dev, pool, table, o);
        const auto got = steps_of(rt, toks, steps);
        CHECK(test::max_rel_error(got, ref, src->spec().vocab_size) <= 1e-4);
        const RuntimeMemory mem = rt.memory();
        CHECK(mem.arena_peak_bytes <= cfg.budget_bytes);
        // Nothing but the arena is allocated (DESIGN.md §6); the driver hands out device memory in
        // 2 MiB granules, so a budget that is not a multiple of that is rounded up by it.
        const uint64_t granule = 2u << 20;
        CHECK(mem.device_peak_bytes <= (cfg.budget_bytes + granule - 1) / granule * granule);
      }
    }
  }
}

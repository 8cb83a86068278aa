// GPU suite, runtime part: the CUDA device's queues, events, arena and PCIe cap; the runtime behaviour
// suite (runtime_suite.h, which the emulated device runs too) on CUDA with the HF and llama.cpp
// fixtures and synthetic models, under the budget contract (device memory taken after the arena <= the
// budget, in the driver's 2 MiB granules); then what CUDA alone shows: the activation staging pinned
// and unpinned, a model's first step in a fresh process, whose kernels the set-up's warm-up must have
// loaded, and the warm-up itself (runs on the GPU machine; see test_gpu.cpp).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/hardware_spec.h"
#include "core/host_buffer.h"
#include "core/mapped_file.h"
#include "core/model_spec.h"
#include "core/thread_pool.h"
#include "core/watchdog.h"
#include "core/weight_source.h"
#include "costmodel/cost_model.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/runtime/runtime.h"
#include "planner/planner.h"
#include "runtime_suite.h"
#include "test_util.h"
#ifdef SHARDWISE_HAVE_CUDA
#include "executor/cuda/cuda_kernels.h"
#include "vision/encoder.h"
#include "vision/vision_runtime.h"
#endif

extern char** environ;

using namespace shardwise;
using namespace shardwise::test;

namespace {

// The suite's target here: the first CUDA device, planned on the h200-host machine at ctx 48, tiers
// 1, 4, 16, 32, budgets a fraction of the source's weights. The arena is one cudaMalloc of exactly the
// budget, which the driver backs in 2 MiB granules (a budget that is not a multiple of that takes the
// next one); there is no other allowance: not for the first launch of a kernel, nor for cuBLAS (the
// set-up loads them all).
RuntimeTarget cuda_target() {
  RuntimeTarget t;
  t.name = "cuda";
  t.device = [](const EmuOptions&) { return make_cuda_device(0); };
  t.hardware = "h200-host";
  t.ctx = 48;
  t.threads = 4;
  t.tiers = {1, 4, 16, 32};
  t.fraction_of_source = true;
  t.device_granule = 2u << 20;
  return t;
}

std::vector<int32_t> seq(int n, int64_t vocab, uint32_t seed) {
  return token_seq(n, vocab, seed);
}

// The plan table of the CUDA-only tests: the target's settings at `frac` of the weights (+ extra_bytes).
PlanTable test_table(const WeightSource& src, double frac, PlannerConfig* cfg_out, uint64_t extra_bytes = 0) {
  const RuntimeTarget t = cuda_target();
  *cfg_out = planner_config(t, src, budget_at(t, src, frac) + extra_bytes);
  return plan_table(t, src, cfg_out->budget_bytes);
}

// A small MoE model whose experts outweigh the scratch (8 experts, 3 per token), in `dt`.
ModelSpec small_moe(const char* name, DType dt) {
  ModelSpec spec = parse_spec_yaml_text(
      std::string("name: ") + name +
          "\nfamily: qwen3_moe\nhidden_size: 256\nnum_hidden_layers: 4\nnum_attention_heads: 8\n"
          "num_key_value_heads: 2\nhead_dim: 32\nvocab_size: 512\nrope_theta: 10000\nrms_norm_eps: 1e-6\n"
          "num_experts: 8\nnum_experts_per_tok: 3\nmoe_intermediate_size: 128\nnorm_topk_prob: true\n",
      std::string(name) + ".yaml");
  spec.dtype = dt;
  return spec;
}

// A model's first step in this process: "model|schedule|budget fraction" in this variable selects the
// child's case (the parent runs each case in a fresh process: modules loaded by earlier tests of a
// process would hide what a first step loads).
constexpr const char* kFreshTest = "CUDA runtime first step of a fresh process stays within the budget";
constexpr const char* kFreshEnv = "SHARDWISE_TEST_FRESH_RUN";

// Runs this test binary again with only `test` selected and `var` (NAME=value) in its environment;
// returns its exit status (Catch's: the number of failed assertions), or -1 if it could not run.
int run_child(const std::string& test, const std::string& var) {
  std::vector<char> exe(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (len <= 0) return -1;
  const std::string prefix = var.substr(0, var.find('=') + 1);
  std::vector<std::string> vars;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) vars.emplace_back(*e);
  vars.push_back(var);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(&v[0]);
  envp.push_back(nullptr);
  std::string name = test;
  char* argv[] = {exe.data(), &name[0], nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.data(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

// A CUDA device with an arena of `arena_bytes` and a pinned host buffer of `host_bytes` filled with `fill`
// (the set-up of the PCIe cap cases).
struct PinnedLink {
  std::unique_ptr<Device> dev;
  uint8_t* arena;
  HostBuffer host;
  PinnedLink(uint64_t arena_bytes, uint64_t host_bytes, int fill)
      : dev(make_cuda_device(0)), arena(dev->allocate_arena(arena_bytes)), host(host_bytes) {
    std::memset(host.data(), fill, host_bytes);
    dev->pin_host(host.data(), host_bytes);
  }
};

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

// Weights read from a file are a read-only shared mapping (core/mapped_file.h): the device pins it in
// place (a private mapping's pin never returned on the GPU machine's kernel; the watchdog would end
// this test with an error naming the pin) and copies from it at pinned speed, byte for byte.
TEST_CASE("CUDA device: a file mapping is pinned read-only in place and copied from", "[gpu]") {
  const std::string path = test::temp_path("pinned_file.bin");
  std::vector<uint8_t> bytes(48u << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  test::write_file(path, std::string(bytes.begin(), bytes.end()));
  const MappedFile file(path);
  auto dev = make_cuda_device(0);
  uint8_t* arena = dev->allocate_arena(64u << 20);
  const StallGuard guard("pinning a 48 MiB file mapping", 60);
  dev->pin_host(file.data(), file.size(), HostAccess::ReadOnly);
  CHECK(dev->pinned_host_bytes() >= file.size());
  std::vector<uint8_t> back(bytes.size(), 0);
  dev->pin_host(back.data(), back.size());
  dev->copy_h2d(arena, file.data(), file.size());
  dev->wait(Queue::D2H, dev->record(Queue::H2D));
  dev->copy_d2h(back.data(), arena, back.size());
  dev->synchronize();
  CHECK(back == bytes);
  dev->unpin_host(back.data(), back.size());
  dev->unpin_host(file.data(), file.size());
}

TEST_CASE("CUDA device: a batch of copies lands as its copies one by one, capped at the cap's rate", "[gpu]") {
  // 24 copies of odd sizes from a pinned buffer and, in a second batch, one from pageable memory among
  // them, to scattered places; read back.
  const uint64_t host_bytes = 96ull << 20;
  PinnedLink link(256ull << 20, host_bytes, 0);
  auto& dev = link.dev;
  for (uint64_t i = 0; i < host_bytes; ++i) link.host.data()[i] = static_cast<uint8_t>(i * 131 + (i >> 11));
  std::vector<uint8_t> pageable(3 << 20);
  for (size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<uint8_t>(i * 7 + 1);
  for (double cap : {0.0, 16e9}) {
    for (bool with_pageable : {false, true}) {
      dev->set_pcie_cap(cap);
      std::vector<Device::HostCopy> copies;
      uint64_t src = 0, dst = 0, total = 0;
      for (int i = 0; i < 24; ++i) {
        const uint64_t bytes = (1ull << 20) + static_cast<uint64_t>(i) * 4099;
        const bool page = with_pageable && i == 7;
        copies.push_back(
            {link.arena + dst,
             page ? static_cast<const void*>(pageable.data()) : static_cast<const void*>(link.host.data() + src),
             bytes});
        src += bytes + 12345;
        dst += bytes + 4096 * static_cast<uint64_t>(i % 5) + 2;
        total += bytes;
      }
      REQUIRE(src <= host_bytes);
      const auto t0 = std::chrono::steady_clock::now();
      dev->copy_h2d_batch(copies.data(), copies.size());
      const Event done = dev->record(Queue::H2D);
      dev->host_wait(done);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<uint8_t> back(copies.back().bytes);
      for (const auto& c : copies) {
        back.resize(c.bytes);
        dev->copy_d2h(back.data(), c.dev, c.bytes);
        dev->synchronize();
        INFO("cap " << cap << " pageable " << with_pageable);
        CHECK(std::memcmp(back.data(), c.host, c.bytes) == 0);
      }
      if (cap > 0) {  // the batch's bytes arrive no faster than the cap allows, and not much slower
        const double rate = static_cast<double>(total) / s;
        WARN("24 copies at a " << cap / 1e9 << " GB/s cap: " << rate / 1e9 << " GB/s");
        CHECK(rate <= cap * 1.05);
        CHECK(rate >= cap * 0.8);
      }
    }
  }
  dev->set_pcie_cap(0);
}

TEST_CASE("CUDA device: strided copies (an expert's slices as rows) land row by row, pinned or pageable, capped or not",
          "[gpu]") {
  // Device::HostCopy rows: row i from host + i * host_pitch to dev + i * dev_pitch. One cudaMemcpy2DAsync
  // where the rows' host range is pinned and uncapped; row by row under a cap and from pageable memory.
  // Odd widths and pitches, three and two rows, beside plain copies in one batch; read back row by row
  // against the host.
  const uint64_t host_bytes = 64ull << 20;
  PinnedLink link(128ull << 20, host_bytes, 0);
  auto& dev = link.dev;
  for (uint64_t i = 0; i < host_bytes; ++i) link.host.data()[i] = static_cast<uint8_t>(i * 29 + (i >> 13));
  std::vector<uint8_t> pageable(12 << 20);
  for (size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<uint8_t>(i * 11 + 5);
  for (double cap : {0.0, 16e9})
    for (bool from_pageable : {false, true}) {
      dev->set_pcie_cap(cap);
      std::vector<Device::HostCopy> copies;
      uint64_t dst = 0;
      for (int i = 0; i < 6; ++i) {
        const uint64_t width = (768ull << 10) + static_cast<uint64_t>(i) * 4099;
        const uint64_t rows = i % 3 == 2 ? 1 : 3 - static_cast<uint64_t>(i % 2);  // 3, 2, 1, 2, 3, 1
        const uint64_t host_pitch = rows > 1 ? (3ull << 20) + 17 * static_cast<uint64_t>(i) : 0;
        const uint64_t dev_pitch = rows > 1 ? width + 256 * static_cast<uint64_t>(i % 3) : 0;
        const uint8_t* base =
            from_pageable && i == 4 ? pageable.data() : link.host.data() + static_cast<uint64_t>(i) * (9ull << 20);
        copies.push_back({link.arena + dst, base, width, rows, host_pitch, dev_pitch});
        dst += (rows - 1) * dev_pitch + width + 8192;
      }
      const std::vector<uint8_t> zeros(dst, 0);  // the last round's rows must not pass for this one's
      dev->copy_h2d(link.arena, zeros.data(), dst);
      dev->synchronize();
      dev->copy_h2d_batch(copies.data(), copies.size());
      dev->synchronize();
      for (const auto& c : copies)
        for (uint64_t r = 0; r < c.rows; ++r) {
          std::vector<uint8_t> back(c.bytes);
          dev->copy_d2h(back.data(), c.dev + r * c.dev_pitch, c.bytes);
          dev->synchronize();
          INFO("cap " << cap << " pageable " << from_pageable << " rows " << c.rows << " row " << r);
          CHECK(std::memcmp(back.data(), static_cast<const uint8_t*>(c.host) + r * c.host_pitch, c.bytes) == 0);
        }
    }
  dev->set_pcie_cap(0);
}

TEST_CASE("CUDA device: the PCIe cap holds within 5% at 8, 16 and 32 GB/s", "[gpu]") {
  const uint64_t bytes = 1ull << 30;
  PinnedLink link(bytes, bytes, 1);
  auto& dev = link.dev;
  uint8_t* arena = link.arena;
  HostBuffer& host = link.host;
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
  WARN("PCIe uncapped: " << static_cast<double>(bytes) /
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9
                         << " GB/s");
}

TEST_CASE("CUDA device: under a PCIe cap, copies under 64 KiB are not held but still count against the cap", "[gpu]") {
  // An activation row on a capped link takes about the link's latency, not a host callback's: 200
  // synchronised 8 KiB round trips take about as long capped as uncapped. Their bytes are charged to
  // the next paced copy, so a stream of small copies between large ones stays at the cap.
  const uint64_t bytes = 256ull << 20;
  PinnedLink link(bytes, bytes, 3);
  auto& dev = link.dev;
  uint8_t* arena = link.arena;
  HostBuffer& host = link.host;
  auto small_round_trips = [&](double cap) {
    dev->set_pcie_cap(cap);
    dev->copy_h2d(arena, host.data(), 8192);
    dev->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) {
      dev->copy_h2d(arena, host.data(), 8192);
      dev->copy_d2h(host.data() + (1u << 20), arena, 8192);
      dev->synchronize();
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const double free_ms = small_round_trips(0), capped_ms = small_round_trips(16e9);
  WARN("200 round trips of 8 KiB: uncapped " << free_ms << " ms, capped at 16 GB/s " << capped_ms << " ms");
  CHECK(capped_ms < 1.5 * free_ms + 2.0);
  // Mixed traffic: 1 MiB copies interleaved with 16 KiB ones, 1 GiB in all, at the cap.
  dev->set_pcie_cap(16e9);
  uint64_t moved = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (moved < (1ull << 30)) {
    dev->copy_h2d(arena, host.data(), 1u << 20);
    for (int i = 0; i < 16; ++i) dev->copy_h2d(arena + (2u << 20), host.data() + (2u << 20), 16384);
    moved += (1u << 20) + 16 * 16384;
  }
  dev->synchronize();
  const double rate =
      static_cast<double>(moved) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("mixed copies at a 16 GB/s cap: " << rate / 1e9 << " GB/s");
  CHECK(rate <= 16e9 * 1.05);
  dev->set_pcie_cap(0);
}

TEST_CASE("CUDA device: activation uploads land byte for byte and do not wait behind a weight copy", "[gpu]") {
  // Uploads on Queue::H2DAct of up to 1 MiB from pinned memory are read by a kernel; larger ones and those
  // from pageable memory by the copy engine. Odd sizes and offsets (16-byte, 4-byte and byte pieces),
  // rewritten between uploads from the same place, capped or not.
  const uint64_t weights = 512ull << 20;
  PinnedLink link(weights + (8ull << 20), weights + (4ull << 20), 0);
  auto& dev = link.dev;
  uint8_t* const staging = link.host.data() + weights;  // pinned: the runtime's activation staging is
  std::vector<uint8_t> pageable(3u << 20), back(2u << 20);
  uint8_t* const dst = link.arena + weights;
  uint32_t salt = 1;
  for (double cap : {0.0, 16e9})
    for (uint64_t bytes : {16384ull, 16ull, 3ull, 4100ull, 65537ull, 1ull << 20, (1ull << 20) + 16})
      for (uint64_t off : {0ull, 4ull, 1ull})
        for (bool pinned : {true, false}) {
          dev->set_pcie_cap(cap);
          uint8_t* src = (pinned ? staging : pageable.data()) + off;
          for (int round = 0; round < 2; ++round) {  // the second upload from the same place sees the new bytes
            ++salt;
            for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + salt * 31 + (i >> 9));
            dev->copy_h2d(dst + off, src, bytes, Queue::H2DAct);
            const Event up = dev->record(Queue::H2DAct);
            dev->wait(Queue::D2H, up);
            dev->copy_d2h(back.data(), dst + off, bytes);
            dev->synchronize();
            INFO("cap " << cap << " bytes " << bytes << " offset " << off << " pinned " << pinned << " round "
                        << round);
            CHECK(std::memcmp(back.data(), src, bytes) == 0);
          }
        }
  dev->set_pcie_cap(0);
  // Behind a 512 MiB weight copy (~10 ms at PCIe speed), a 16 KiB activation upload issued after it lands
  // first (the order, not a time, is checked).
  dev->synchronize();
  dev->copy_h2d(link.arena, link.host.data(), weights, Queue::H2D);
  const Event w = dev->record(Queue::H2D);
  std::memset(staging, 0x5a, 16384);
  dev->copy_h2d(dst, staging, 16384, Queue::H2DAct);
  const Event a = dev->record(Queue::H2DAct);
  dev->host_wait(a);
  const bool weights_done = dev->event_done(w);
  dev->synchronize();
  CHECK_FALSE(weights_done);
}

TEST_CASE("CUDA device: a capped link banks no credit while idle", "[gpu]") {
  // A copy issued after the link was idle takes its full time at the cap from its start, as on a slower
  // link. The pacer before counted up to 1 ms of idle link as already carried: a synchronised 1 MiB copy
  // at 16 GB/s took 39 us instead of 65.5 (the profile's capped row), and qwen30b's routed experts, each
  // layer's issued once its router's result was back, arrived as if the link had carried them meanwhile.
  const uint64_t bytes = 1u << 20;
  PinnedLink link(4 * bytes, 4 * bytes, 7);
  auto& dev = link.dev;
  uint8_t* arena = link.arena;
  HostBuffer& host = link.host;
  dev->set_pcie_cap(16e9);
  dev->copy_h2d(arena, host.data(), bytes);
  dev->synchronize();
  double total_ms = 0, min_ms = 1e9;
  const int n = 40;
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // the link idles
    const auto t0 = std::chrono::steady_clock::now();
    dev->copy_h2d(arena, host.data(), bytes);
    dev->synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total_ms += ms;
    min_ms = std::min(min_ms, ms);
  }
  dev->set_pcie_cap(0);
  const double expected_ms = static_cast<double>(bytes) / 16e9 * 1e3;
  WARN("1 MiB after an idle link at 16 GB/s: mean " << total_ms / n << " ms, fastest " << min_ms
                                                    << " ms (the cap: " << expected_ms << " ms)");
  CHECK(min_ms >= 0.97 * expected_ms);
  CHECK(total_ms / n < expected_ms + 0.1);
}

TEST_CASE("CUDA device: paced copies neither stall the host nor slow down while every core computes", "[gpu]") {
  // Two 270 MiB shards (nemo8b FFNs) streamed at 16 GB/s while the host's cores all compute, as in
  // a Dynamic decode step. With host-callback pacing the enqueue stalled the host ~20 ms and the
  // copies ran at 5-11 GB/s (each callback's wake-up waited for a core).
  const uint64_t shard = 270ull << 20;
  PinnedLink link(2 * shard, 2 * shard, 5);
  auto& dev = link.dev;
  uint8_t* arena = link.arena;
  HostBuffer& host = link.host;
  dev->set_pcie_cap(16e9);
  dev->copy_h2d(arena, host.data(), 1u << 20);
  dev->synchronize();
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < cores; ++i)
    busy.emplace_back([&stop] {
      volatile double s = 0;
      while (!stop.load(std::memory_order_relaxed)) s = s + 1.0;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  dev->copy_h2d(arena, host.data(), shard);
  dev->copy_h2d(arena + shard, host.data() + shard, shard);
  const double enqueue_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  dev->synchronize();
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stop.store(true);
  for (auto& t : busy) t.join();
  dev->set_pcie_cap(0);
  const double expected_ms = 2.0 * static_cast<double>(shard) / 16e9 * 1e3;
  WARN("2 x 270 MiB at 16 GB/s with " << cores << " cores busy: enqueued in " << enqueue_ms << " ms, done in "
                                      << total_ms << " ms (the cap: " << expected_ms << " ms)");
  CHECK(enqueue_ms < 5.0);
  CHECK(total_ms < 1.10 * expected_ms);
  CHECK(total_ms > 0.95 * expected_ms);
}

// ---- the runtime behaviour suite on CUDA ------------------------------------------------------------------

TEST_CASE("runtime suite (cuda): every schedule and the table's choice reproduce the CPU reference", "[gpu]") {
  const RuntimeTarget t = cuda_target();
  const std::string fx = test::fixtures_dir();
  const std::vector<std::string> models = {fx + "/hf/mistral",
                                           fx + "/hf/qwen3",
                                           fx + "/hf/llama",
                                           fx + "/hf/qwen3moe_norm",
                                           fx + "/llamacpp/gguf/llama_small.q8_0.gguf",
                                           fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf",
                                           "synthetic:tiny_llama?dtype=q4_0&seed=4",
                                           "synthetic:tiny_moe?dtype=q8_0&seed=4",
                                           "synthetic:tiny_qwen3?dtype=bf16&seed=4",
                                           "synthetic:tiny_qwen2?dtype=q8_0&seed=4"};
  ThreadPool pool(4);
  for (const auto& path : models) {  // any head_dim runs (the HF fixtures have 8, 16, 24 and 32, tiny_llama 48)
    const SuiteModel m = suite_model(open_weights(path), t.ctx, {17, 1, 1, 4, 1, 9, 1}, 7, pool);
    for (double frac : {0.3, 3.0})
      check_every_schedule(t, m, budget_at(t, *m.src, frac), all_schedules(), emu(1, 0), pool);
  }
}

// An f16 KV cache on the device: RoPE stores K and V rounded to nearest even (as the CPU does), attention
// reads the halves; every schedule, attention staged over the host's f16 cache and batched steps match
// the CPU engine over an f16 cache. Head dims 8 to 48 (padded and not), dense, MoE and qwen2's biases;
// then bf16, and q8_0 on the models whose head_dim is whole blocks of 32.
TEST_CASE(
    "runtime suite (cuda): with an f16, bf16 or q8_0 KV cache every schedule, staged attention and batched steps match",
    "[gpu][kv_f16]") {
  const RuntimeTarget t = cuda_target().with_kv_dtype(DType::F16);
  const std::string fx = test::fixtures_dir();
  ThreadPool pool(4);
  int staged = 0;
  for (const std::string& path :
       {fx + "/hf/qwen3", fx + "/hf/llama", std::string("synthetic:tiny_llama?dtype=q4_0&seed=4"),
        std::string("synthetic:tiny_moe?dtype=q8_0&seed=4"), std::string("synthetic:tiny_qwen2?dtype=f16&seed=4")}) {
    INFO(path);
    const SuiteModel m = suite_model(open_weights(path), t.ctx, {17, 1, 1, 4, 1, 9, 1}, 7, pool, 40, DType::F16);
    for (double frac : {0.3, 3.0})
      check_every_schedule(t, m, budget_at(t, *m.src, frac), all_schedules(), emu(1, 0), pool);
    staged += check_staged_attention(t, m, budget_at(t, *m.src, 3.0), emu(1, 0), pool);
  }
  CHECK(staged >= 5);
  {  // bf16 likewise
    const RuntimeTarget tb = cuda_target().with_kv_dtype(DType::BF16);
    const SuiteModel m = suite_model(open_weights("synthetic:tiny_moe?dtype=q8_0&seed=4"), tb.ctx,
                                     {17, 1, 1, 4, 1, 9, 1}, 7, pool, 40, DType::BF16);
    for (double frac : {0.3, 3.0})
      check_every_schedule(tb, m, budget_at(tb, *m.src, frac), all_schedules(), emu(1, 0), pool);
  }
  // q8_0 (head_dim 32: tiny_moe and tiny_qwen3, with q/k norms; 128: two layers of small_llama, four
  // blocks a head row): RoPE quantises each head's row a warp per block, attention dequantises as it
  // loads, a staged host cache's blocks move as 16-bit words.
  int staged_q8 = 0, batched_q8 = 0;
  for (const char* path : {"synthetic:tiny_moe?dtype=q8_0&seed=4", "synthetic:tiny_qwen3?dtype=f16&seed=4",
                           "synthetic:small_llama?dtype=q4_0&layers=2&seed=4"}) {
    INFO(path << " q8_0 cache");
    const RuntimeTarget tq = cuda_target().with_kv_dtype(DType::Q8_0);
    const SuiteModel m = suite_model(open_weights(path), tq.ctx, {17, 1, 1, 4, 1, 9, 1}, 7, pool, 40, DType::Q8_0);
    for (double frac : {0.3, 3.0})
      check_every_schedule(tq, m, budget_at(tq, *m.src, frac), all_schedules(), emu(1, 0), pool);
    staged_q8 += check_staged_attention(tq, m, budget_at(tq, *m.src, 3.0), emu(1, 0), pool);
    const int runs =
        check_batched(tq, *m.src, m.w, 0.5, {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}, emu(1, 0), pool);
    CHECK(runs >= 1);
    batched_q8 += runs;
  }
  CHECK(staged_q8 >= 1);
  CHECK(batched_q8 >= 4);  // two schedules each for the tiny models; small_llama's half budget fits one
  auto src = open_weights("synthetic:tiny_moe?dtype=q8_0&seed=4");
  const ModelWeights w = ModelWeights::from_source(*src);
  CHECK(check_batched(t, *src, w, 0.5, {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}, emu(1, 0), pool) >= 2);
}

// A Qwen2.5-VL prompt on CUDA: the images encoded on the CPU, the language model planned on the GPU under
// a budget holding part of it; the image rows and M-RoPE positions go through the plan runtime, and HF
// transformers' greedy tokens come out (tests/fixtures/vl), in each schedule and with an f16 KV cache.
TEST_CASE("runtime (cuda): a Qwen2.5-VL image prompt generates HF's greedy tokens in every schedule", "[gpu][vl]") {
  const std::string dir = test::fixtures_dir() + "/vl/qwen2_5_vl";
  const std::string img = dir + "/images/img_300x200/image.png";
  // prompts/one_image with its image's run of placeholders cut to one (the form --tokens takes)
  std::vector<int32_t> ids = test::load_npy_ints(dir + "/prompts/one_image/input_ids.npy"), tokens;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != 292 || i == 0 || ids[i - 1] != 292) tokens.push_back(ids[i]);
  std::string list;
  for (int32_t id : tokens) list += (list.empty() ? "" : ",") + std::to_string(id);
  const std::vector<int32_t> greedy = test::load_npy_ints(dir + "/prompts/one_image/greedy_ids.npy");
  for (const char* how : {"--vram-budget 1500K --schedule gpu-only", "--vram-budget 1500K --schedule static",
                          "--vram-budget 1500K --schedule dynamic",
                          "--vram-budget 1500K --schedule static --kv-dtype f16", "--vram-budget 64M"}) {
    std::string out;
    const int rc = test::run_command("(" + test::shardwise_bin() + " run -m " + dir + " --image " + img + " --tokens " +
                                         list + " -n " + std::to_string(greedy.size()) +
                                         " --greedy --ignore-eos --json --device cuda " + how + " -t 4 2>/dev/null)",
                                     &out);
    INFO(how << ": " << out);
    REQUIRE(rc == 0);
    const nlohmann::json run = nlohmann::json::parse(out);
    CHECK(run["device"] == "cuda");
    CHECK(run["n_prompt_tokens"].get<size_t>() == ids.size());
    CHECK(run["generated_ids"].get<std::vector<int32_t>>() == greedy);
  }
}

// llama-quantize's files (tests/fixtures/kquants): every block type, alone and in llama.cpp's mixes, laid
// out, streamed and computed per tensor by the CUDA kernels, at a budget holding part of the model and all.
TEST_CASE("runtime suite (cuda): llama-quantize's K-quant files run every schedule", "[gpu][kquants]") {
  const RuntimeTarget t = cuda_target();
  const std::string fx = test::fixtures_dir() + "/kquants/";
  ThreadPool pool(4);
  for (const char* f :
       {"kq_llama.Q4_K_M.gguf", "kq_llama.Q5_K_M.gguf", "kq_llama.Q6_K.gguf", "kq_llama.Q3_K_M.gguf",
        "kq_llama.Q2_K.gguf", "kq_llama.Q4_0.gguf", "kq_llama.pure_Q4_1.gguf", "kq_llama.pure_Q5_0.gguf",
        "kq_llama.pure_Q5_1.gguf", "kq_llama.pure_IQ4_NL.gguf", "kq_moe.Q2_K.gguf"}) {
    INFO(f);
    const SuiteModel m = suite_model(open_weights(fx + f), t.ctx, {17, 1, 1, 4, 1, 9, 1}, 7, pool);
    for (double frac : {0.3, 3.0})
      check_every_schedule(t, m, budget_at(t, *m.src, frac), all_schedules(), emu(1, 0), pool);
  }
}

// Several sequences in one step: each one's tokens at its own positions and cache rows (RoPE, the cache
// appends and attention run per sequence), the LM head once for every sequence ending in the step.
TEST_CASE("runtime suite (cuda): batched steps of several sequences give each one its tokens alone", "[gpu][batch]") {
  const RuntimeTarget t = cuda_target();
  ThreadPool pool(4);
  for (const char* spec : {"synthetic:tiny_llama?dtype=q4_0&seed=4", "synthetic:tiny_moe?dtype=q8_0&seed=4",
                           "synthetic:tiny_qwen2?dtype=f16&seed=4"}) {
    auto src = open_weights(spec);
    const ModelWeights w = ModelWeights::from_source(*src);
    for (double frac : {0.3, 3.0})
      CHECK(check_batched(t, *src, w, frac, {Schedule::GpuOnly, Schedule::Static, Schedule::Dynamic}, emu(1, 0),
                          pool) >= 2);
    CHECK(check_batched(t, *src, w, 0.5, {Schedule::GpuOnly, Schedule::Dynamic}, emu(1, 0), pool, true) >= 1);
  }
}

// Attention over a host KV cache staged in the arena (attn_staged): the cached rows go up per head,
// the kv_layout kernel lays them out for the device, the step's rows go back — on every head_dim the
// fixtures have, dense and MoE, from an empty cache and over a filled one.
TEST_CASE("runtime suite (cuda): attention staged over host KV caches reproduces the CPU reference", "[gpu]") {
  const RuntimeTarget t = cuda_target();
  const std::string fx = test::fixtures_dir();
  const std::vector<std::string> models = {fx + "/hf/qwen3", fx + "/hf/llama", fx + "/hf/qwen3moe_norm",
                                           "synthetic:tiny_llama?dtype=q4_0&seed=4"};
  ThreadPool pool(4);
  int staged = 0;
  for (const auto& path : models) {
    const SuiteModel m = suite_model(open_weights(path), t.ctx, {17, 1, 4, 1, 9, 1}, 11, pool);
    staged += check_staged_attention(t, m, budget_at(t, *m.src, 3.0), emu(1, 0), pool);
  }
  CHECK(staged >= 4);
}

TEST_CASE("runtime suite (cuda): MoE experts split between CPU and GPU (Dynamic) reproduce the CPU reference",
          "[gpu]") {
  // Every CPU FFN layer of the Dynamic plans split with each share: the GPU's experts copied and run
  // (the device MoE path with part of each token's experts), the CPU's partial uploaded and added. A
  // model whose experts outweigh the scratch, so that a small budget leaves FFN layers on the CPU.
  const RuntimeTarget t = cuda_target();
  for (DType dt : {DType::F16, DType::Q4_0}) {
    const ModelSpec spec = small_moe("split", dt);
    ThreadPool pool(4);
    const SuiteModel m = suite_model(make_synthetic_weights(spec, 37, &pool), t.ctx, {17, 1, 4, 1, 9, 1}, 12, pool);
    const uint64_t budget = budget_at(t, *m.src, 0.0) + m.src->weight_bytes() / 8;
    int split_runs = 0;
    for (int share = 1; share < spec.num_experts_per_tok; ++share) {
      INFO(dtype_name(dt) << " share " << share);
      check_moe_split(t, m, share, budget, {emu(1, 0)}, pool);
      ++split_runs;
    }
    CHECK(split_runs == spec.num_experts_per_tok - 1);
  }
}

TEST_CASE(
    "runtime suite (cuda): experts copied on the layer before's guess (speculative prefetch) reproduce the CPU "
    "reference",
    "[gpu]") {
  // GPU-only plans that guess each streamed MoE layer's experts with its router a layer early (plan.h
  // router_next): the guess's logits computed and copied down, the guessed experts copied, then the
  // misses into the unused guesses' places — with the router's guess, nearly all wrong and half wrong.
  const RuntimeTarget t = cuda_target();
  for (DType dt : {DType::F16, DType::Q4_0}) {
    const ModelSpec spec = small_moe("guess", dt);
    ThreadPool pool(4);
    const SuiteModel m = suite_model(make_synthetic_weights(spec, 41, &pool), t.ctx, {17, 1, 4, 1, 9, 1}, 13, pool);
    const uint64_t budget = budget_at(t, *m.src, 0.0) + m.src->weight_bytes() / 3;
    const PlanTable table = speculative_table(t, m, Schedule::GpuOnly, budget);
    using G = RuntimeOptions::GuessTest;
    for (G mode : {G::Router, G::Lowest, G::Mixed})
      check_guesses(t, m, table, Schedule::GpuOnly, mode, emu(1, 0), budget, pool);
  }
}

TEST_CASE("runtime suite (cuda): decode steps as graphs give the same logits bit for bit", "[gpu]") {
  // Device-resident plans (the whole model in VRAM): every decode-sized step (<= 8 tokens) is one
  // graph, captured each step and updated in place; prefill steps run kernel by kernel. The graph
  // executables are the driver's: their device memory counts against the budget.
  const RuntimeTarget t = cuda_target();
  const std::string fx = test::fixtures_dir();
  ThreadPool pool(4);
  for (const std::string& path :
       {fx + "/hf/llama", fx + "/hf/qwen3moe_norm", std::string("synthetic:tiny_llama?dtype=q4_0&seed=4"),
        std::string("synthetic:tiny_moe?dtype=q8_0&seed=4")}) {
    const SuiteModel m =
        suite_model(open_weights(path), t.ctx, {17, 1, 1, 4, 1, 9, 1, 1}, 9, pool);  // 6 decode-sized steps
    // Room for everything on the device: at 3x the weights alone the fixtures' KV went to the host
    // (CPU attention), and a plan with CPU work runs no graphs.
    const GraphCount g = check_graphs(t, m, budget_at(t, *m.src, 3.0) + (64u << 20), emu(1, 0), pool);
    INFO(path << ": " << g.launches << " graph launches, " << g.expected << " expected");
    CHECK(g.launches >= 6u);  // per decode step, a graph per kGraphMaxActions compute actions
  }
  for (const char* family : {"llama", "qwen3_moe"}) {  // streamed weights keep every step off graphs
    const ModelSpec spec = suite_spec(family, DType::Q8_0);
    const SuiteModel m =
        suite_model(make_synthetic_weights(spec, 31, &pool), t.ctx, {13, 1, 1, 4, 1, 9, 1, 1}, 6, pool);
    check_streaming_runs_no_graphs(
        t, m, static_cast<uint64_t>(0.3 * static_cast<double>(spec.total_bytes())) + (4u << 20), emu(1, 0), pool);
  }
}

#ifdef SHARDWISE_HAVE_CUDA
TEST_CASE("runtime suite (cuda): images encoded on a device of their own beside decode steps captured as graphs",
          "[gpu][vision]") {
  // A server's layout (serve --vision-budget): the language model's device captures and launches decode
  // graphs on this thread while the encoder's device, on the same GPU, encodes images in the arena it holds
  // on another. Nothing either does may synchronise the whole GPU (that invalidates a capture in progress),
  // so both stay exact. Catch2 asserts on this thread only: the encoder's thread keeps its results.
  const RuntimeTarget t = cuda_target();
  ThreadPool pool(4);
  const SuiteModel m =
      suite_model(open_weights("synthetic:tiny_llama?dtype=q4_0&seed=4"), t.ctx, {17, 1, 1, 4, 1, 9, 1, 1}, 9, pool);
  VisionSpec s;
  s.depth = 2;
  s.hidden_size = 128;  // 2 heads of 64
  s.intermediate_size = 256;
  s.num_heads = 2;
  s.out_hidden_size = 128;
  s.patch_size = 14;
  s.window_size = 112;
  s.fullatt_block_indexes = {1};
  const VisionWeights w = random_vision_weights(s, 5, 0.05f);
  const std::vector<GridThw> grids = {{1, 8, 12}};
  const std::vector<float> pix =
      test::random_floats(static_cast<size_t>(vision_patch_count(grids) * s.patch_dim()), 6, -2.0f, 2.0f);
  const std::vector<float> want = encode_images(s, w, pix.data(), grids, pool);
  std::unique_ptr<Device> vdev = make_cuda_device(0);
  vdev->vision_kernels(s.head_dim());
  const uint64_t held = 64u << 20;
  uint8_t* arena = vdev->allocate_arena(held);
  std::atomic<bool> stop{false};
  std::atomic<int> encodes{0};
  std::string error;
  double worst = 0;
  std::thread encoder([&] {
    try {
      while (!stop.load()) {
        const std::vector<float> got = encode_images_in_arena(*vdev, arena, held, s, w, pix.data(), grids);
        double err = got.size() == want.size() ? 0 : 1, scale = 1e-30;
        for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
          err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
          scale = std::max(scale, static_cast<double>(std::abs(want[i])));
        }
        worst = std::max(worst, err / scale);
        ++encodes;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  struct Join {  // the encoder's thread ends however this thread's checks end
    std::atomic<bool>& stop;
    std::thread& th;
    ~Join() {
      stop = true;
      th.join();
    }
  };
  GraphCount g;
  {
    Join join{stop, encoder};
    for (int round = 0; round < 20 && (round < 2 || encodes.load() < 3); ++round)
      g = check_graphs(t, m, budget_at(t, *m.src, 3.0) + (64u << 20), emu(1, 0), pool);
  }
  INFO(encodes.load() << " encodes beside the graphs; " << g.launches << " graph launches");
  CHECK(error.empty());
  CHECK(encodes.load() >= 3);
  CHECK(worst <= 1e-4);
  CHECK(g.launches >= 6u);
}
#endif

TEST_CASE("runtime suite (cuda): switching schedules between steps keeps every step exact", "[gpu]") {
  const RuntimeTarget t = cuda_target();
  ThreadPool pool(4);
  for (const char* family : {"llama", "qwen3_moe"}) {
    const SuiteModel m = suite_model(make_synthetic_weights(suite_spec(family, DType::F16), 23, &pool), t.ctx,
                                     {13, 1, 1, 5, 1, 16, 1, 1, 1, 1}, 5, pool, 41);
    for (double frac : {0.15, 0.5})
      check_schedule_switching(t, m, budget_at(t, *m.src, frac), frac < 0.2, emu(1, 0), pool);
  }
  check_infeasible_schedule_refused(t, emu(1, 0), pool);
}

TEST_CASE("runtime suite (cuda): MoE decode routes on the device, Dynamic streams attention, pinned weights stay",
          "[gpu]") {
  const RuntimeTarget t = cuda_target();
  ThreadPool pool(4);
  {
    const SuiteModel m = suite_model(make_synthetic_weights(suite_spec("qwen3_moe", DType::F16), 23, &pool), t.ctx,
                                     {13, 1, 1, 4, 1, 9, 1}, 4, pool);
    check_device_routing(t, m, emu(1, 0), pool);
  }
  for (const char* family : {"llama", "qwen3_moe"}) {
    const SuiteModel m = suite_model(make_synthetic_weights(suite_spec(family, DType::Q8_0), 41, &pool), t.ctx,
                                     {13, 1, 1, 4, 1, 20, 1}, 8, pool, 41);
    check_dynamic_streams_attention(t, m, emu(1, 0), pool);
  }
  check_pinned_across_tiers(t, emu(1, 0), pool);
}

TEST_CASE("runtime suite (cuda): an LM head larger than the budget streams in row pieces and runs exactly", "[gpu]") {
  ThreadPool pool(4);
  check_lm_head_pieces(cuda_target().with_ctx(32), emu(1, 0), pool);
}

// ---- what CUDA alone shows ------------------------------------------------------------------------------------

// The activations that cross PCIe are staged in pinned host memory while a runtime lives, and
// unpinned before it is freed (the next runtime's staging may be mapped at the same address).
TEST_CASE("CUDA runtime: the activation staging is pinned while the runtime lives and unpinned after", "[gpu]") {
  ThreadPool pool(4);
  auto src = open_weights("synthetic:tiny_moe?dtype=q8_0&seed=5");
  ModelWeights w = ModelWeights::from_source(*src);
  PlannerConfig cfg;
  const PlanTable table = test_table(*src, 0.3, &cfg);
  const auto toks = seq(12, src->spec().vocab_size, 3);
  std::vector<float> out[2];
  for (int run = 0; run < 2; ++run) {  // the second runtime's staging is perhaps at the first one's address
    auto dev = make_cuda_device(0);
    const uint64_t before = dev->pinned_host_bytes();
    uint64_t during = 0;
    {
      Runtime rt(*src, w, *dev, pool, table, {});
      during = dev->pinned_host_bytes();
      CHECK(during > before);
      out[run] = run_steps(rt, toks, {8, 1, 1});
    }
    CHECK(dev->pinned_host_bytes() < during);  // the weights stay pinned (by this device), the staging does not
  }
  CHECK(test::max_rel_error(out[1], out[0], src->spec().vocab_size) <= 1e-6);
}

// The first step of a model in a fresh process: nothing has loaded any kernel before the runtime's
// set-up, so every kernel and cuBLAS configuration the step uses must come from the warm-up (before
// the arena), or the device peak exceeds the budget. Each case runs in a child process of its own.
TEST_CASE(kFreshTest, "[gpu]") {
  const char* run = std::getenv(kFreshEnv);
  if (run == nullptr) {  // the parent: one fresh process per case
    const std::string fx = test::fixtures_dir();
    const std::vector<std::string> cases = {
        fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf|gpu-only|3.0",  // measured 6 MiB over a 4 MiB budget before
        "synthetic:tiny_qwen3?dtype=bf16&seed=4|gpu-only|3.0",       // ditto, 6 MiB over 4 MiB (2.25 MiB budget)
        fx + "/llamacpp/gguf/llama_small.q8_0.gguf|gpu-only|3.0",   fx + "/hf/mistral|gpu-only|3.0",
        "synthetic:tiny_moe?dtype=q8_0&seed=4|dynamic|0.3",         "synthetic:tiny_llama?dtype=q4_0&seed=4|static|0.3",
    };
    for (const auto& c : cases) {
      INFO("fresh process: " << c);
      CHECK(run_child(kFreshTest, std::string(kFreshEnv) + "=" + c) == 0);
    }
    return;
  }
  // The child: model | schedule | budget fraction.
  const std::string spec = run;
  const size_t a = spec.find('|'), b = spec.rfind('|');
  REQUIRE((a != std::string::npos && b > a));
  const std::string m = spec.substr(0, a);
  const Schedule sched = parse_schedule(spec.substr(a + 1, b - a - 1));
  const double frac = std::stod(spec.substr(b + 1));
  INFO(m << " " << schedule_name(sched) << " at " << frac << " of the weights");
  ThreadPool pool(4);
  auto src = open_weights(m);
  ModelWeights w = ModelWeights::from_source(*src);
  PlannerConfig cfg;
  const PlanTable table = test_table(*src, frac, &cfg);
  REQUIRE(feasible_somewhere(table, sched));
  const auto toks = seq(40, src->spec().vocab_size, 7);
  const std::vector<int> steps = {17, 1, 4, 9, 1};
  CpuEngine cpu(w, pool, cfg.ctx);
  const auto ref = run_steps(cpu, toks, steps);

  auto dev = make_cuda_device(0);
  RuntimeOptions o;
  o.schedule = sched;
  Runtime rt(*src, w, *dev, pool, table, o);
  const int64_t V = src->spec().vocab_size;
  std::vector<float> got, l(static_cast<size_t>(V));
  size_t at = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    rt.step(toks.data() + at, steps[i], l.data());
    got.insert(got.end(), l.begin(), l.end());
    at += static_cast<size_t>(steps[i]);
    INFO("after step " << i << " (" << steps[i] << " tokens)");
    check_memory(cuda_target(), rt.memory(), cfg.budget_bytes);  // the first step (a prefill) most of all
  }
  CHECK(test::max_rel_error(got, ref, V) <= 1e-4);
  const RuntimeMemory mem = rt.memory();
  CHECK(mem.arena_peak_bytes <= cfg.budget_bytes);
  WARN(m << " " << schedule_name(sched) << ": budget " << cfg.budget_bytes << ", device peak " << mem.device_peak_bytes
         << ", context " << mem.context_bytes << " bytes");
}

#ifdef SHARDWISE_HAVE_CUDA
// The set-up's warm-up itself: runs clean, in little temporary memory and well under a second, for
// the fixtures (their own shapes) and for real models' specs (shrunk shapes), and frees what it took.
TEST_CASE("CUDA kernel warm-up runs every block of a model cheaply", "[gpu]") {
  struct Case {
    std::string name;
    ModelSpec spec;
    RopeStyle rope;
  };
  std::vector<Case> cases;
  const std::string fx = test::fixtures_dir();
  for (const std::string& m :
       {fx + "/hf/llama", fx + "/hf/qwen3", fx + "/hf/qwen3moe_norm", fx + "/llamacpp/gguf/qwen3moe_small.f16.gguf",
        std::string("synthetic:tiny_qwen3?dtype=bf16&seed=4"), std::string("synthetic:tiny_qwen2?dtype=f16&seed=4")}) {
    auto src = open_weights(m);
    cases.push_back({m, src->spec(), src->rope_style()});
  }
  for (const char* b : {"nemo8b", "qwen30b", "qwen235b"}) cases.push_back({b, builtin_spec(b), RopeStyle::Neox});
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  cublasHandle_t blas = nullptr;
  REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetStream(blas, stream) == CUBLAS_STATUS_SUCCESS);
  for (const Case& c : cases) {
    INFO(c.name);
    std::unique_ptr<DeviceKernels> k = make_cuda_kernels(c.spec, c.rope, stream, blas);
    const CudaWarmUpStats st = cuda_kernels_warm_up(*k);
    WARN(c.name << ": " << (st.exact_shapes ? "own" : "shrunk") << " shapes, " << st.steps << " steps, " << st.matmuls
                << " matmuls, " << st.launches << " launcher calls, " << st.temp_bytes << " temporary bytes, " << st.ms
                << " ms");
    REQUIRE(st.error.empty());
    CHECK(st.steps > 0);
    CHECK(st.matmuls > 0);
    CHECK(st.temp_bytes <= (16u << 20));
    CHECK(st.ms < 1000.0);
    // Again, for a new kernels object of the same model: everything is loaded, and the temporary
    // memory is given back, so the device's free memory drops by less than that temporary memory.
    size_t free0 = 0, free1 = 0, total = 0;
    REQUIRE(cudaMemGetInfo(&free0, &total) == cudaSuccess);
    k = make_cuda_kernels(c.spec, c.rope, stream, blas);
    const CudaWarmUpStats again = cuda_kernels_warm_up(*k);
    REQUIRE(again.error.empty());
    REQUIRE(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    const uint64_t drop = free0 > free1 ? free0 - free1 : 0;
    WARN(c.name << ": second warm-up " << again.ms << " ms, free memory dropped by " << drop << " bytes");
    CHECK(drop < again.temp_bytes);
  }
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
}
#endif

// microbench/gpu_bench.h — the GPU side of the profiler: times the executor's own CUDA kernels
// (cuda_matmul, the attention and element-wise kernels of the blocks, the MoE FFN block) with CUDA
// events on device-resident random weights, the executor's copy path (CudaDevice, with its PCIe cap)
// for transfers, and keeps the copy engines busy for contention measurements. No CUDA types here,
// so the CPU-side profiler includes it in every build; without CUDA, open() throws.
// It never plans and never writes a profile.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "costmodel/cost_model.h"

namespace shardwise {

class GpuBench {
 public:
  virtual ~GpuBench() = default;
  // The first CUDA device; throws Error when this build has no CUDA or the machine no GPU.
  static std::unique_ptr<GpuBench> open(uint64_t weight_set_bytes);

  virtual std::string name() const = 0;
  virtual int driver_version() const = 0;
  virtual uint64_t vram_bytes() const = 0;

  // One timed execution (ms, CUDA events) of the op on the GPU. Matmul / MoeExperts weights rotate
  // over a device-resident set larger than the L2 cache; Attention runs `tokens` queries after `ctx`
  // cached positions; Norm / Elementwise over `elems` f32 values. Other kinds: Error.
  virtual double time_op(const Op& op) = 0;

  // Host-side costs: one stream synchronisation with nothing pending; one small kernel launch.
  virtual double sync_ms() = 0;
  virtual double launch_ms() = 0;

  // One copy of `bytes` through the executor's copy path (pinned or pageable host memory) under a
  // PCIe cap (bytes/s, 0 = none), wall-clock including the synchronisation.
  virtual double time_copy(Direction dir, bool pinned, uint64_t bytes, double cap_bytes_per_s) = 0;
  // `count` copies of `bytes` each from pinned host memory to consecutive places, uncapped, issued back
  // to back through the same path, then one synchronisation: wall-clock per copy (what a copy costs in
  // a queue of many, as the routed experts of an MoE layer go).
  virtual double time_copy_burst(Direction dir, uint64_t bytes, int count) = 0;
  // Host time (ms) per copy to enqueue `count` 1 MiB pinned host-to-device copies through the
  // executor's path for a layer's experts (Device::copy_h2d_batch) under a PCIe cap (bytes/s, 0 = none): the enqueue
  // only, the copies then waited for.
  virtual double copy_issue_ms(double cap_bytes_per_s, int count) = 0;

  // Background copies of pinned buffers host to device (as the executor streams weights), continuously,
  // until stop; stop returns the rate achieved meanwhile (GB/s). The profile records them as "h2d"
  // (ProfileDB::copy_traffic; older profiles copied both ways).
  virtual void start_copy_traffic() = 0;
  virtual double stop_copy_traffic() = 0;
};

}  // namespace shardwise

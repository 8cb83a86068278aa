// executor/device/device.h — a compute device as the runtime sees it: one arena allocation (the VRAM
// budget), four in-order queues (compute, H2D weight copies, D2H copies, H2D activation copies) with
// events between them, timestamps for measured timelines, and the model's blocks (DeviceKernels)
// enqueued on the compute queue. Implementations: CUDA
// (executor/cuda/) and the host-emulated device (emu_device.cpp), which exists so that CI can test
// the runtime's slots, events and arena without a GPU; its timings are never GPU numbers.
// The runtime never dereferences device memory; devices never plan.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "executor/model/moe_routing.h"
#include "executor/session/step_engine.h"

namespace shardwise {

class VisionKernels;  // vision_kernels.h

// H2DAct: small activation uploads, which must not queue behind weight copies (planner/plan.h).
enum class Queue { Compute = 0, H2D = 1, D2H = 2, H2DAct = 3 };
constexpr int kNumQueues = 4;

// A point in one queue's order: done once everything enqueued on that queue before it is done.
struct Event {
  int queue = -1;
  uint64_t seq = 0;
  bool valid() const { return queue >= 0; }
};

// A weight matrix in device memory: rows x cols of dtype, rows contiguous.
struct DevMat {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
};

// One layer's weights in device memory (only what the block being run needs must be set).
struct DevLayer {
  const float* attn_norm = nullptr;  // [hidden] f32
  const float* q_norm = nullptr;     // [head_dim] f32 (qwen3 families)
  const float* k_norm = nullptr;
  const float* q_bias = nullptr;    // [q_dim] f32 (qwen2)
  const float* k_bias = nullptr;    // [kv_dim] f32
  const float* v_bias = nullptr;    // [kv_dim] f32
  const float* ffn_norm = nullptr;  // [hidden] f32
  DevMat wq, wk, wv, wo;
  DevMat gate, up, down;  // dense FFN
  DevMat router;          // MoE: (experts, hidden)
  // MoE: per expert, its gate/up (F x H) and down (H x F) matrices; nullptr = not on the device
  // (then no token may be routed to it).
  DType gate_dtype = DType::F32, up_dtype = DType::F32, down_dtype = DType::F32;
  std::vector<const uint8_t*> gate_exp, up_exp, down_exp;
};

// The blocks of cpu_blocks.h over device memory, enqueued on the compute queue in call order.
// Host arguments (routing) are copied at call time. Buffers: x [n, hidden]; qkv [n, q_dim + 2 kv_dim];
// attn [n, q_dim]; logits [n, experts] or [rows]; caches [capacity, kv_dim] of elements of the KV
// dtype (set_kv_dtype; f32 unless set).
class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;
  // The element type of the KV caches attention() writes and reads and kv_layout() copies, set before
  // the blocks run. Kernels keep f32 unless they override this: the default refuses anything else,
  // naming it (the CUDA kernels keep f32 only so far).
  virtual void set_kv_dtype(DType t) {
    SW_CHECK(t == DType::F32, "this device's kernels keep the KV cache in f32, not ", dtype_name(t),
             " (run with --kv-dtype f32, or --device cpu)");
  }
  // Device temporaries for the blocks come from this region (part of the plan's scratch).
  virtual void set_workspace(uint8_t* dev, uint64_t bytes) = 0;
  // The step's sequences (step_engine.h): each segment's tokens at its positions, its cache rows from
  // its row0 (the caches the blocks are given hold every slot).
  virtual void prepare_segments(const std::vector<StepSegment>& segments) = 0;
  // One sequence at positions pos0 .. pos0 + n - 1.
  void prepare_step(int64_t pos0, int64_t n) { prepare_segments({StepSegment{0, n, pos0, 0}}); }
  virtual void attention(const DevLayer& w, float* x, int64_t n, void* k_cache, void* v_cache) = 0;
  virtual void attention_pre(const DevLayer& w, const float* x, int64_t n, float* qkv) = 0;
  virtual void attention_post(const DevLayer& w, float* x, const float* attn, int64_t n) = 0;
  virtual void router(const DevLayer& w, const float* x, int64_t n, float* logits) = 0;
  virtual void ffn(const DevLayer& w, float* x, int64_t n, const MoeRouting* routing) = 0;
  // MoE FFN routed on the device from router logits already there ([n, experts], from router()):
  // the same top-k as moe_routing.h, then as ffn(). Every expert of the layer must be resident, and
  // n <= kDeviceRoutingMaxTokens (executor/traits.h): decode steps skip the host round trip per layer.
  virtual void ffn_routed(const DevLayer& w, float* x, int64_t n, const float* router_logits) = 0;
  // x[i] += y[i], i < count (an MoE layer's CPU share added to the GPU's, plan.h moe_gpu_share).
  virtual void add(float* x, const float* y, int64_t count) = 0;
  // Final norm of x's rows `rows` ([n, hidden]), then head rows [0, head.rows) into row i of logits
  // (logits + i * ld; the caller offsets logits for a piece of the LM head): one pass over the head.
  virtual void output_rows(const float* out_norm, const DevMat& head, const float* x, const std::vector<int64_t>& rows,
                           float* logits, int64_t ld) = 0;
  // One row: x_row's logits into logits[0 .. head.rows).
  void output(const float* out_norm, const DevMat& head, const float* x_row, float* logits) {
    output_rows(out_norm, head, x_row, {0}, logits, head.rows);
  }
  // Positions [p0, p1) of one K or V cache of `capacity` positions (elements of the KV dtype) between
  // the host's head-major layout [kv_heads, capacity, head_dim] (kv_cache.h) and the device's
  // position-major one [capacity, kv_dim]: to_positions copies head-major src into position-major dst,
  // else the reverse. A step's attention over a host cache staged on the device (plan.h, attn_staged).
  virtual void kv_layout(const void* src, void* dst, int64_t capacity, int64_t p0, int64_t p1, bool to_positions) = 0;
};

enum class HostAccess { ReadWrite, ReadOnly };

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string kind() const = 0;  // "cuda" or "emu"
  virtual std::string name() const = 0;  // e.g. "NVIDIA H200" / "emulated device"
  // Whether this device's kernels compute with weights of that type (the runtime refuses a model with a
  // tensor of a type its device cannot use, naming the tensor).
  virtual bool supports_dtype(DType t) const {
    (void)t;
    return true;
  }
  // Whether this device's kernels keep a KV cache of that element type (DeviceKernels::set_kv_dtype):
  // f32 unless a device says more (the runtime refuses a plan table of another, before any set-up).
  virtual bool supports_kv_dtype(DType t) const { return t == DType::F32; }

  // The arena: exactly `bytes` of device memory, one at a time. Throws Error when unavailable.
  virtual uint8_t* allocate_arena(uint64_t bytes) = 0;
  // Waits for every queue and frees the arena (and whatever was captured over it), so that another of
  // a new size can be allocated: a budget changed while the model stays loaded. Pinned host memory and
  // the kernels stay.
  virtual void release_arena() { fail(kind(), " device: its arena cannot be released"); }
  // Pins host memory for full-speed asynchronous copies; on failure warns and copies still work.
  // ReadOnly memory (weights mapped from a file) is only ever a copy's source.
  virtual void pin_host(const void* ptr, uint64_t bytes, HostAccess access = HostAccess::ReadWrite) = 0;
  // Waits for every queue, then unpins what pin_host pinned inside [ptr, ptr + bytes). Memory that is
  // freed while pinned must be unpinned first: the driver would keep copying to its old pages.
  virtual void unpin_host(const void* ptr, uint64_t bytes) = 0;
  // Host bytes pinned now (whole pages), for tests of who pins what.
  virtual uint64_t pinned_host_bytes() const = 0;
  // Throttles copies to this rate (bytes/s; 0 = no cap), to emulate a slower PCIe link.
  virtual void set_pcie_cap(double bytes_per_s) = 0;

  // On Queue::H2D, or Queue::H2DAct for activations (both draw on the one PCIe cap).
  virtual void copy_h2d(uint8_t* dev, const void* host, uint64_t bytes, Queue q = Queue::H2D) = 0;
  // Several host-to-device copies on q (a layer's routed experts), with the same effect as copy_h2d on
  // each, in order. CUDA issues them one call per copy (one batched call decoded slower).
  // A copy of `rows` rows of `bytes` each: row i from host + i * host_pitch to dev + i * dev_pitch (both
  // pitches at least `bytes` when rows > 1) — e.g. an expert's gate, up and down slices, which lie at one
  // distance from each other in three same-sized tensors, as one strided copy (CUDA: cudaMemcpy2DAsync where
  // the rows' host range is pinned and no cap paces the link; else row by row). rows = 1: one plain copy.
  struct HostCopy {
    uint8_t* dev = nullptr;
    const void* host = nullptr;
    uint64_t bytes = 0;
    uint64_t rows = 1, host_pitch = 0, dev_pitch = 0;
  };
  virtual void copy_h2d_batch(const HostCopy* copies, size_t count, Queue q = Queue::H2D) {
    for (size_t i = 0; i < count; ++i) {
      const HostCopy& c = copies[i];
      check_rows(c);
      for (uint64_t r = 0; r < c.rows; ++r)
        copy_h2d(c.dev + r * c.dev_pitch, static_cast<const uint8_t*>(c.host) + r * c.host_pitch, c.bytes, q);
    }
  }
  // Refuses a strided copy whose rows would overlap (a pitch below the row's bytes).
  static void check_rows(const HostCopy& c) {
    SW_CHECK(c.rows >= 1 && (c.rows == 1 || (c.host_pitch >= c.bytes && c.dev_pitch >= c.bytes)), "device: a copy of ",
             c.rows, " rows of ", c.bytes, " bytes with pitches ", c.host_pitch, " (host) and ", c.dev_pitch,
             " (device) would overlap its own rows");
  }
  virtual void copy_d2h(void* host, const uint8_t* dev, uint64_t bytes) = 0;  // on Queue::D2H
  // Copy of device memory on the compute queue (e.g. moving activations within the arena).
  virtual void copy_d2d(uint8_t* dst, const uint8_t* src, uint64_t bytes) = 0;
  virtual Event record(Queue q) = 0;
  virtual void wait(Queue q, const Event& e) = 0;  // later work on q waits for e
  virtual void host_wait(const Event& e) = 0;
  virtual bool event_done(const Event& e) = 0;  // non-blocking: has e completed?
  virtual void synchronize() = 0;

  // Measured step timelines (`run --timeline`): begin_timeline() sets time 0 (call it with every
  // queue idle); timestamp(q) is a point on queue q, reached once the queue gets there (it is not an
  // event to wait on); timestamp_ms() reads it after synchronize(), in ms since time 0, on a clock
  // that the host's steady clock started at begin_timeline() matches to within microseconds.
  virtual void begin_timeline() = 0;
  virtual Event timestamp(Queue q) = 0;
  virtual double timestamp_ms(const Event& e) = 0;

  // Graphs (CUDA graphs; the runtime's decode steps of device-resident plans, runtime.h): work
  // enqueued on q between begin_capture and end_capture is recorded, not run; end_capture turns it
  // into an executable graph — the one kept under `key` updated in place when only kernel
  // parameters changed (positions, sizes), else a new one — and launches it on q. While capturing,
  // no other queue and not the host may wait for q (record(q) is not a point to wait on until
  // end_capture). begin_capture returns false where the device has no graphs; then nothing is
  // recorded and the work runs as usual.
  virtual bool begin_capture(Queue q) {
    (void)q;
    return false;
  }
  virtual void end_capture(Queue q, uint64_t key) {
    (void)q;
    (void)key;
  }
  virtual uint64_t graph_launches() const { return 0; }

  // Marks where an external profiler (Nsight Compute's --profile-from-start off) should record: on
  // from the next enqueued work until profiler_range(false). A diagnostic; devices without one ignore it.
  virtual void profiler_range(bool on) { (void)on; }

  // The model's blocks; set up once per model.
  virtual DeviceKernels& kernels(const ModelSpec& spec, RopeStyle rope) = 0;

  // A vision encoder's operations (vision_kernels.h) on this device's compute queue; set up (loaded and
  // warmed up) at the first call, which must come before the arena is allocated for the same reason as
  // kernels(). Throws Error where the device has none.
  virtual VisionKernels& vision_kernels(int64_t head_dim) {
    (void)head_dim;
    fail(kind(), " device: no vision encoder kernels");
  }

  // Memory accounting (DESIGN.md §6): bytes taken by the context and modules (not in the budget),
  // and the peak of device memory taken since the arena was allocated, measured from free memory.
  virtual uint64_t context_bytes() const = 0;
  virtual uint64_t device_peak_bytes() = 0;
};

struct EmuOptions {
  uint64_t seed = 1;
  int max_delay_us = 200;  // each queue sleeps a random 0..max before each item (0 = none)
  // Test hook: the n-th call to wait() (counting from 1) is dropped, to prove that a missing
  // dependency shows up as a wrong result. 0 = never.
  int drop_wait = 0;
  // Per-queue multipliers of max_delay_us (compute, H2D, D2H, H2DAct): unequal speeds let one queue run many
  // items ahead of another, which equal random delays rarely do (that is how a slot reused too early
  // shows up). {1, 1, 1} = equal.
  double queue_scale[kNumQueues] = {1, 1, 1, 1};
  // The weight types the device computes with (empty: every type), to stand in for a device whose
  // kernels lack some.
  std::vector<DType> dtypes = {};
  // Whether the device keeps f16 KV caches, and bf16 and q8_0 ones (false: f32 only), to stand in for
  // a device whose kernels keep f32 only.
  bool kv_f16 = true;
};
std::unique_ptr<Device> make_emu_device(const EmuOptions& options = {});
// Throws Error when the build has no CUDA or the machine no GPU.
std::unique_ptr<Device> make_cuda_device(int ordinal = 0);

}  // namespace shardwise

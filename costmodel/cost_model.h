// costmodel/cost_model.h — how long an operation or a copy takes on a backend: the interface the
// planner asks, and the analytic roofline built from a HardwareSpec datasheet.
// Time of an op = max(bytes / bandwidth, FLOPs / rate · efficiency(shape)) + a fixed per-launch (or
// per-dispatch) cost. CPU bandwidth depends on the thread count and drops while PCIe copies run
// (DRAM contention, measured on the GPU machine). A later issue adds a measured ProfileDB behind the
// same interface. This module never plans and never runs kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/hardware_spec.h"

namespace shardwise {

enum class Backend { Cpu, Gpu };
const char* backend_name(Backend b);

enum class OpKind {
  Matmul,      // tokens x (rows, cols) weight
  MoeExperts,  // the whole routed MoE block as the blocks run it (the profiler times CpuBlocks::ffn and
               // DeviceKernels::ffn): FFN norm, gate/up/down of the experts the tokens touch, their
               // SwiGLU and the weighted combine into the residual
  Attention,   // score/softmax/value over a KV cache (no projections)
  Norm,        // RMSNorm, per-head norms
  Rope,
  Elementwise,  // residual adds, SwiGLU
  Embed,        // gather embedding rows (host)
  // A vision encoder's attention (VisionKernels::attention): `tokens` patch rows in segments of `ctx`
  // rows (windows, or whole frames), each row attending every row of its segment, no mask; q, k and v
  // from the step's own f32 rows. The profiler times it on the GPU, where the encoder runs.
  VisionAttention,
};
const char* op_kind_name(OpKind k);

struct Op {
  OpKind kind = OpKind::Matmul;
  DType dtype = DType::F16;  // weight dtype (Matmul, MoeExperts); KV dtype (Attention)
  int64_t tokens = 1;        // new tokens in the step
  // Matmul: weight (rows, cols). MoeExperts: one expert's FFN width (rows) and hidden size (cols).
  int64_t rows = 0, cols = 0;
  int64_t n_experts = 0, top_k = 0;  // MoeExperts
  // Attention: keys attended per query on average, cached keys read, and the head layout.
  // VisionAttention: the segment's rows (n_kv_heads = n_heads).
  int64_t ctx = 0;
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t elems = 0;  // Norm / Rope / Elementwise / Embed: f32 elements touched
  // MoeExperts: distinct experts the step's tokens are routed to, per layer, where the model's routing
  // was measured; 0 = tokens pick experts uniformly at random (expected_distinct_experts).
  double active_experts = 0;

  double experts_touched() const;  // MoeExperts: active_experts, or the uniform expectation

  double flops() const;
  double weight_bytes() const;      // bytes of weights (or KV) that must be read
  double activation_bytes() const;  // f32 inputs + outputs
};

// Expected number of distinct experts touched when n tokens each pick top_k of E experts
// uniformly: E · (1 − (1 − k/E)^n). Prefill touches whole expert sets; decode touches ~k.
double expected_distinct_experts(int64_t n_tokens, int64_t top_k, int64_t n_experts);

enum class Direction { HostToDevice, DeviceToHost };

struct ExecEnv {
  Backend backend = Backend::Cpu;
  int threads = 1;                  // CPU threads (ignored on the GPU)
  double concurrent_pcie_gbps = 0;  // copy traffic running meanwhile (lowers CPU DRAM bandwidth)
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual double op_ms(const Op& op, const ExecEnv& env) const = 0;
  // Time of one copy of `bytes` (pinned or pageable host memory), capped by the PCIe cap.
  virtual double transfer_ms(uint64_t bytes, Direction dir, bool pinned = true) const = 0;
  // Time of `bytes` moved as `copies` equal copies issued back to back into one queue (the routed
  // experts of one MoE layer: three matrices each), pinned. Where the machine's numbers do not time
  // such bursts: one copy of all the bytes.
  virtual double transfer_burst_ms(uint64_t bytes, int copies, Direction dir) const {
    (void)copies;
    return transfer_ms(bytes, dir, true);
  }
  // Sustained copy rate in GB/s (after the cap), used to model contention.
  virtual double pcie_gbps(Direction dir) const = 0;
  // How much longer a copy takes while CPU work reads `cpu_dram_gbps` from host DRAM beside it (>= 1;
  // 1 where the machine's numbers do not say).
  virtual double copy_slowdown(Direction dir, double cpu_dram_gbps) const {
    (void)dir;
    (void)cpu_dram_gbps;
    return 1.0;
  }
  virtual double sync_ms() const = 0;  // one host-device synchronisation
  // Host time to enqueue one weight copy (under this model's PCIe cap, a paced one): an MoE layer's
  // expert copies are issued by the host thread one by one once their routing is known, before it can
  // compute; each starts once it is enqueued.
  // 0 where the machine's numbers do not say.
  virtual double copy_issue_ms() const { return 0; }
  // Host time to enqueue one kernel: what the host spends issuing a split MoE layer's GPU share before
  // it can compute the CPU's (steps with host routing run kernel by kernel). 0 where not measured.
  virtual double launch_ms() const { return 0; }
  virtual int max_threads() const = 0;
  virtual uint64_t vram_bytes() const = 0;
  virtual std::string describe() const = 0;  // machine name + source of the numbers
};

// The datasheet roofline. pcie_cap_bytes_per_s = 0 means no cap.
std::unique_ptr<CostModel> make_analytic_cost_model(const HardwareSpec& hw, double pcie_cap_bytes_per_s = 0);

// `base` with every CPU op `cpu_factor` times as long (GPU ops and copies unchanged): the profile's
// machine as it ran at some moment (the oracle's machine probe measures that factor). `base` must
// outlive the result.
std::unique_ptr<CostModel> make_cpu_scaled_cost_model(const CostModel& base, double cpu_factor);

}  // namespace shardwise

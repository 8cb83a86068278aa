// costmodel/analytic_cost_model.cpp — roofline cost model from a HardwareSpec (see cost_model.h).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "costmodel/cost_model.h"

namespace shardwise {

const char* backend_name(Backend b) {
  return b == Backend::Cpu ? "cpu" : "gpu";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Matmul:
      return "matmul";
    case OpKind::MoeExperts:
      return "moe_experts";
    case OpKind::Attention:
      return "attention";
    case OpKind::Norm:
      return "norm";
    case OpKind::Rope:
      return "rope";
    case OpKind::Elementwise:
      return "elementwise";
    case OpKind::Embed:
      return "embed";
    case OpKind::VisionAttention:
      return "vision_attention";
  }
  return "?";
}

double expected_distinct_experts(int64_t n, int64_t k, int64_t e) {
  if (e <= 0 || k <= 0 || n <= 0) return 0;
  const double p = static_cast<double>(k) / static_cast<double>(e);
  return static_cast<double>(e) * (1.0 - std::pow(1.0 - p, static_cast<double>(n)));
}

double Op::experts_touched() const {
  return active_experts > 0 ? active_experts : expected_distinct_experts(tokens, top_k, n_experts);
}

double Op::flops() const {
  const double m = static_cast<double>(tokens);
  switch (kind) {
    case OpKind::Matmul:
      return 2.0 * m * static_cast<double>(rows) * static_cast<double>(cols);
    case OpKind::MoeExperts:
      return m * static_cast<double>(top_k) * 3.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(cols);
    case OpKind::Attention:
    case OpKind::VisionAttention:
      return 4.0 * m * static_cast<double>(ctx) * static_cast<double>(n_heads) * static_cast<double>(head_dim);
    default:
      return static_cast<double>(elems) * 4.0;
  }
}

double Op::weight_bytes() const {
  switch (kind) {
    case OpKind::Matmul:
      return static_cast<double>(rows) * static_cast<double>(dtype_row_bytes(dtype, cols));
    case OpKind::MoeExperts:
      return experts_touched() * 3.0 * static_cast<double>(rows) * static_cast<double>(dtype_row_bytes(dtype, cols));
    case OpKind::Attention:
      // The keys and values of the cache, read once per step (tiles of queries share them).
      return 2.0 * static_cast<double>(ctx) * static_cast<double>(n_kv_heads) * static_cast<double>(head_dim) *
             dtype_bits_per_elem(dtype) / 8.0;
    default:
      return 0;
  }
}

double Op::activation_bytes() const {
  const double m = static_cast<double>(tokens);
  switch (kind) {
    case OpKind::Matmul:
      return 4.0 * m * static_cast<double>(rows + cols);
    case OpKind::MoeExperts:
      return 4.0 * m * static_cast<double>(top_k) * static_cast<double>(2 * cols + 3 * rows);
    case OpKind::Attention:
      return 4.0 * m * 2.0 * static_cast<double>(n_heads * head_dim);
    case OpKind::VisionAttention:  // the q, k, v rows read, the output written
      return 4.0 * m * 4.0 * static_cast<double>(n_heads * head_dim);
    default:
      return 8.0 * static_cast<double>(elems);
  }
}

namespace {

class AnalyticCostModel : public CostModel {
 public:
  AnalyticCostModel(const HardwareSpec& hw, double cap) : hw_(hw), cap_gbps_(cap / 1e9) {
    hw_.validate(hw.name);
    if (cap < 0) fail("PCIe cap must not be negative");
  }

  double op_ms(const Op& op, const ExecEnv& env) const override {
    return env.backend == Backend::Cpu ? cpu_ms(op, env) : gpu_ms(op);
  }

  double transfer_ms(uint64_t bytes, Direction dir, bool pinned) const override {
    if (bytes == 0) return 0;
    const double gbps = pinned ? pcie_gbps(dir) : std::min(pcie_gbps(dir), hw_.pcie_pageable_gbps);
    return static_cast<double>(bytes) / (gbps * 1e6) + hw_.pcie_latency_us / 1e3;
  }

  double pcie_gbps(Direction dir) const override {
    const double raw = dir == Direction::HostToDevice ? hw_.pcie_h2d_gbps : hw_.pcie_d2h_gbps;
    return cap_gbps_ > 0 ? std::min(raw, cap_gbps_) : raw;
  }

  double sync_ms() const override { return hw_.gpu_sync_us / 1e3; }
  double launch_ms() const override { return hw_.gpu_launch_us / 1e3; }
  int max_threads() const override { return hw_.cpu_cores; }
  uint64_t vram_bytes() const override { return hw_.vram_bytes; }
  std::string describe() const override {
    return hw_.name + (hw_.approximate ? " (datasheet, approximate)" : " (measured datasheet)");
  }

 private:
  // Fraction of the peak GEMM rate reached with m rows of activations (small m cannot fill the
  // register tiles / tensor-core tiles).
  static double gemm_efficiency(double m, double half) { return m / (m + half); }

  double cpu_ms(const Op& op, const ExecEnv& env) const {
    const double threads = std::max(1, std::min(env.threads, hw_.cpu_cores));
    const double bw = hw_.dram_gbps(threads, env.concurrent_pcie_gbps) * 1e9;  // bytes/s
    const double overhead = hw_.cpu_op_overhead_us * 1e-6;
    double t = 0;
    switch (op.kind) {
      case OpKind::Matmul:
      case OpKind::MoeExperts: {
        const double bytes = op.weight_bytes() + op.activation_bytes();
        // The CPU runs decode-sized MoE steps as two parallel loops over all routed experts,
        // larger ones as three threaded matmuls per expert.
        const double per_launch = op.kind != OpKind::MoeExperts ? 1.0
                                  : op.tokens <= 4              ? 2.0
                                                                : 3.0 * op.experts_touched();
        // Tokens per weight matrix decide GEMV (bandwidth) or GEMM (compute) behaviour.
        const double m = op.kind == OpKind::MoeExperts
                             ? static_cast<double>(op.tokens * op.top_k) / std::max(1.0, op.experts_touched())
                             : static_cast<double>(op.tokens);
        // Below 8 tokens the SIMD GEMV kernels stream the weights once (no GEMM tiling to fill).
        const double rate = threads * hw_.cpu_matmul_gflops(op.dtype) * 1e9 * (m < 8 ? 1.0 : gemm_efficiency(m, 6.0));
        t = std::max(bytes / bw, op.flops() / rate) + per_launch * overhead;
        break;
      }
      case OpKind::Attention:
      case OpKind::VisionAttention: {
        const double rate = threads * hw_.cpu_attention_gflops_per_thread * 1e9;
        t = std::max((op.weight_bytes() + op.activation_bytes()) / bw, op.flops() / rate) + overhead;
        break;
      }
      case OpKind::Embed:
        t = op.activation_bytes() / bw + 1e-6;
        break;
      default:
        t = op.activation_bytes() / bw + overhead;
    }
    return t * 1e3;
  }

  double gpu_ms(const Op& op) const {
    const double bw = hw_.gpu_mem_gbps * 1e9;
    const double launch = hw_.gpu_launch_us * 1e-6;
    double t = 0;
    switch (op.kind) {
      case OpKind::Matmul:
      case OpKind::MoeExperts: {
        const double bytes = op.weight_bytes() + op.activation_bytes();
        const double m = op.kind == OpKind::MoeExperts
                             ? static_cast<double>(op.tokens * op.top_k) / std::max(1.0, op.experts_touched())
                             : static_cast<double>(op.tokens);
        const double rate = hw_.gpu_matmul_tflops_for(op.dtype) * 1e12 * gemm_efficiency(m, 64.0);
        const double launches = op.kind == OpKind::MoeExperts ? 3.0 : 1.0;
        t = std::max(bytes / bw, op.flops() / rate) + launches * launch;
        break;
      }
      case OpKind::Attention:
      case OpKind::VisionAttention: {
        const double rate = hw_.gpu_attention_tflops * 1e12 * gemm_efficiency(static_cast<double>(op.tokens), 16.0);
        t = std::max((op.weight_bytes() + op.activation_bytes()) / bw, op.flops() / rate) + launch;
        break;
      }
      default:
        t = op.activation_bytes() / bw + launch;
    }
    return t * 1e3;
  }

  HardwareSpec hw_;
  double cap_gbps_;
};

}  // namespace

std::unique_ptr<CostModel> make_analytic_cost_model(const HardwareSpec& hw, double cap) {
  return std::make_unique<AnalyticCostModel>(hw, cap);
}

}  // namespace shardwise

namespace shardwise {
namespace {

class CpuScaledCostModel : public CostModel {
 public:
  CpuScaledCostModel(const CostModel& base, double factor) : base_(base), factor_(factor) {}
  double op_ms(const Op& op, const ExecEnv& env) const override {
    const double ms = base_.op_ms(op, env);
    return env.backend == Backend::Cpu ? ms * factor_ : ms;
  }
  double transfer_ms(uint64_t bytes, Direction dir, bool pinned) const override {
    return base_.transfer_ms(bytes, dir, pinned);
  }
  double transfer_burst_ms(uint64_t bytes, int copies, Direction dir) const override {
    return base_.transfer_burst_ms(bytes, copies, dir);
  }
  double pcie_gbps(Direction dir) const override { return base_.pcie_gbps(dir); }
  double copy_slowdown(Direction dir, double cpu_dram_gbps) const override {
    return base_.copy_slowdown(dir, cpu_dram_gbps);
  }
  double sync_ms() const override { return base_.sync_ms(); }
  double copy_issue_ms() const override { return base_.copy_issue_ms(); }
  double launch_ms() const override { return base_.launch_ms(); }
  int max_threads() const override { return base_.max_threads(); }
  uint64_t vram_bytes() const override { return base_.vram_bytes(); }
  std::string describe() const override { return str_cat(base_.describe(), ", CPU x", factor_); }

 private:
  const CostModel& base_;
  double factor_;
};

}  // namespace

std::unique_ptr<CostModel> make_cpu_scaled_cost_model(const CostModel& base, double cpu_factor) {
  SW_CHECK(cpu_factor > 0 && std::isfinite(cpu_factor), "CPU cost factor ", cpu_factor, " must be positive");
  return std::make_unique<CpuScaledCostModel>(base, cpu_factor);
}

}  // namespace shardwise

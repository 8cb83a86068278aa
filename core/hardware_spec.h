// core/hardware_spec.h — what a machine can do, for the analytic cost model: CPU cores, DRAM read
// bandwidth by thread count (alone, and lowered while the copy engines run), CPU GEMM rate per
// thread per dtype, PCIe bandwidths, GPU memory bandwidth and matmul rate per dtype, VRAM, launch
// and synchronisation overheads. Loaded from configs/hardware/*.yaml (builtins: cli1, cli2, cli3 from
// the paper's table with datasheet GPU figures, h200-host from measurements of the GPU machine).
// Pure data; no timing logic beyond interpolating its own tables.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace shardwise {

struct HardwareSpec {
  std::string name;
  std::string description;
  bool approximate = true;  // datasheet figures rather than measurements

  // CPU
  int cpu_cores = 1;
  std::vector<std::pair<double, double>> dram_read_gbps;   // (threads, GB/s), ascending threads
  std::vector<std::pair<double, double>> dram_contention;  // (concurrent PCIe GB/s, multiplier)
  std::map<DType, double> cpu_matmul_gflops_per_thread;
  double cpu_attention_gflops_per_thread = 10;
  double cpu_op_overhead_us = 5;

  // PCIe (one direction each; both can run at once)
  double pcie_h2d_gbps = 16;
  double pcie_d2h_gbps = 16;
  double pcie_pageable_gbps = 6;
  double pcie_latency_us = 10;

  // GPU
  std::string gpu_name;
  uint64_t vram_bytes = 0;
  double gpu_mem_gbps = 500;
  std::map<DType, double> gpu_matmul_tflops;
  double gpu_attention_tflops = 20;
  double gpu_launch_us = 5;
  double gpu_sync_us = 10;

  // CPU DRAM read GB/s with `threads` threads while `pcie_gbps` of copies run (interpolated,
  // flat beyond the table's ends).
  double dram_gbps(double threads, double pcie_gbps = 0) const;
  double cpu_matmul_gflops(DType t) const;  // per thread
  double gpu_matmul_tflops_for(DType t) const;
  void validate(const std::string& context) const;
};

HardwareSpec load_hardware_yaml(const std::string& path);
HardwareSpec parse_hardware_yaml_text(const std::string& text, const std::string& context);
HardwareSpec builtin_hardware(const std::string& name);
std::vector<std::string> builtin_hardware_names();
// A builtin name or a .yaml path.
HardwareSpec resolve_hardware(const std::string& name_or_path);

// Linear interpolation in a sorted (x, y) table, flat outside it.
double interpolate(const std::vector<std::pair<double, double>>& table, double x);

}  // namespace shardwise

// core/hardware_spec.cpp — HardwareSpec loading and table lookups.
#include "core/hardware_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/builtin_yaml.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/size.h"
#include "core/yaml_util.h"

namespace shardwise {

double interpolate(const std::vector<std::pair<double, double>>& t, double x) {
  if (t.empty()) return 0;
  if (x <= t.front().first) return t.front().second;
  if (x >= t.back().first) return t.back().second;
  for (size_t i = 1; i < t.size(); ++i) {
    if (x <= t[i].first) {
      const double f = (x - t[i - 1].first) / (t[i].first - t[i - 1].first);
      return t[i - 1].second + f * (t[i].second - t[i - 1].second);
    }
  }
  return t.back().second;
}

double HardwareSpec::dram_gbps(double threads, double pcie_gbps) const {
  return interpolate(dram_read_gbps, threads) *
         (dram_contention.empty() ? 1.0 : interpolate(dram_contention, pcie_gbps));
}

double HardwareSpec::cpu_matmul_gflops(DType t) const {
  auto it = cpu_matmul_gflops_per_thread.find(t);
  if (it != cpu_matmul_gflops_per_thread.end()) return it->second;
  auto f = cpu_matmul_gflops_per_thread.find(DType::F32);
  return f != cpu_matmul_gflops_per_thread.end() ? f->second : 10.0;
}

double HardwareSpec::gpu_matmul_tflops_for(DType t) const {
  auto it = gpu_matmul_tflops.find(t);
  if (it != gpu_matmul_tflops.end()) return it->second;
  auto f = gpu_matmul_tflops.find(DType::F16);
  return f != gpu_matmul_tflops.end() ? f->second : 10.0;
}

void HardwareSpec::validate(const std::string& ctx) const {
  auto positive = [&](const char* field, double v) {
    if (!(v > 0) || v > 1e9) fail(ctx, ": ", field, " = ", v, " must be positive");
  };
  if (cpu_cores < 1 || cpu_cores > 4096) fail(ctx, ": cpu.cores = ", cpu_cores, " is out of range");
  if (dram_read_gbps.empty()) fail(ctx, ": cpu.dram_read_gbps needs at least one (threads: GB/s) entry");
  for (size_t i = 0; i < dram_read_gbps.size(); ++i) {
    positive("cpu.dram_read_gbps", dram_read_gbps[i].second);
    if (i && dram_read_gbps[i].first <= dram_read_gbps[i - 1].first)
      fail(ctx, ": cpu.dram_read_gbps thread counts must ascend");
  }
  for (size_t i = 0; i < dram_contention.size(); ++i) {
    if (!(dram_contention[i].second > 0 && dram_contention[i].second <= 1))
      fail(ctx, ": cpu.dram_contention multipliers must be in (0, 1]");
    if (i && dram_contention[i].first <= dram_contention[i - 1].first)
      fail(ctx, ": cpu.dram_contention GB/s must ascend");
  }
  for (const auto& kv : cpu_matmul_gflops_per_thread) positive("cpu.matmul_gflops_per_thread", kv.second);
  for (const auto& kv : gpu_matmul_tflops) positive("gpu.matmul_tflops", kv.second);
  positive("cpu.attention_gflops_per_thread", cpu_attention_gflops_per_thread);
  positive("pcie.h2d_gbps", pcie_h2d_gbps);
  positive("pcie.d2h_gbps", pcie_d2h_gbps);
  positive("pcie.pageable_gbps", pcie_pageable_gbps);
  positive("gpu.mem_gbps", gpu_mem_gbps);
  positive("gpu.attention_tflops", gpu_attention_tflops);
  if (vram_bytes == 0) fail(ctx, ": gpu.vram must be given (e.g. 16GB)");
}

namespace {

void check_keys(const YAML::Node& node, const std::string& where, std::initializer_list<const char*> known,
                const std::string& ctx) {
  if (!node.IsMap()) fail(ctx, ": '", where, "' must be a mapping");
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) fail(ctx, ": unknown field '", where.empty() ? "" : where + ".", key, "'");
  }
}

template <typename T>
T get(const YAML::Node& n, const char* key, const std::string& where, const std::string& ctx, T fallback,
      bool required = false) {
  YAML::Node v = n[key];
  if (!v || v.IsNull()) {
    if (required) fail(ctx, ": missing field '", where, ".", key, "'");
    return fallback;
  }
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    fail(ctx, ": field '", where, ".", key, "' has an invalid value");
  }
}

std::map<DType, double> dtype_map(const YAML::Node& n, const std::string& field, const std::string& ctx) {
  std::map<DType, double> out;
  if (!n) return out;
  if (!n.IsMap()) fail(ctx, ": '", field, "' must map dtypes to numbers");
  for (auto it = n.begin(); it != n.end(); ++it) {
    DType t;
    try {
      t = parse_dtype(it->first.as<std::string>());
    } catch (const Error& e) {
      fail(ctx, ": '", field, "': ", e.what());
    }
    try {
      out[t] = it->second.as<double>();
    } catch (const YAML::Exception&) {
      fail(ctx, ": '", field, ".", it->first.as<std::string>(), "' must be a number");
    }
  }
  return out;
}

}  // namespace

HardwareSpec parse_hardware_yaml_text(const std::string& text, const std::string& ctx) {
  const YAML::Node root = load_yaml(text, ctx);
  if (!root.IsMap()) fail(ctx, ": expected a mapping at the top level");
  check_keys(root, "", {"name", "description", "approximate", "cpu", "pcie", "gpu"}, ctx);
  HardwareSpec h;
  h.name = get<std::string>(root, "name", "", ctx, "machine");
  h.description = get<std::string>(root, "description", "", ctx, "");
  h.approximate = get<bool>(root, "approximate", "", ctx, true);
  const YAML::Node cpu = root["cpu"], pcie = root["pcie"], gpu = root["gpu"];
  if (!cpu || !pcie || !gpu) fail(ctx, ": needs the sections cpu, pcie and gpu");
  check_keys(cpu, "cpu",
             {"cores", "dram_read_gbps", "dram_contention", "matmul_gflops_per_thread", "attention_gflops_per_thread",
              "op_overhead_us"},
             ctx);
  check_keys(pcie, "pcie", {"h2d_gbps", "d2h_gbps", "pageable_gbps", "latency_us"}, ctx);
  check_keys(gpu, "gpu", {"name", "vram", "mem_gbps", "matmul_tflops", "attention_tflops", "launch_us", "sync_us"},
             ctx);
  h.cpu_cores = get<int>(cpu, "cores", "cpu", ctx, 1, true);
  const YAML::Node bw = cpu["dram_read_gbps"];
  if (!bw || !bw.IsMap()) fail(ctx, ": 'cpu.dram_read_gbps' must map thread counts to GB/s");
  for (auto it = bw.begin(); it != bw.end(); ++it) {
    try {
      h.dram_read_gbps.emplace_back(it->first.as<double>(), it->second.as<double>());
    } catch (const YAML::Exception&) {
      fail(ctx, ": 'cpu.dram_read_gbps' entries must be numbers");
    }
  }
  std::sort(h.dram_read_gbps.begin(), h.dram_read_gbps.end());
  if (const YAML::Node c = cpu["dram_contention"]) {
    if (!c.IsSequence()) fail(ctx, ": 'cpu.dram_contention' must be a list of [GB/s, multiplier]");
    for (const auto& e : c) {
      if (!e.IsSequence() || e.size() != 2) fail(ctx, ": 'cpu.dram_contention' entries must be [GB/s, multiplier]");
      try {
        h.dram_contention.emplace_back(e[0].as<double>(), e[1].as<double>());
      } catch (const YAML::Exception&) {
        fail(ctx, ": 'cpu.dram_contention' entries must be numbers");
      }
    }
  }
  h.cpu_matmul_gflops_per_thread = dtype_map(cpu["matmul_gflops_per_thread"], "cpu.matmul_gflops_per_thread", ctx);
  if (h.cpu_matmul_gflops_per_thread.empty()) fail(ctx, ": missing field 'cpu.matmul_gflops_per_thread'");
  h.cpu_attention_gflops_per_thread = get<double>(cpu, "attention_gflops_per_thread", "cpu", ctx, 10.0);
  h.cpu_op_overhead_us = get<double>(cpu, "op_overhead_us", "cpu", ctx, 5.0);
  h.pcie_h2d_gbps = get<double>(pcie, "h2d_gbps", "pcie", ctx, 0, true);
  h.pcie_d2h_gbps = get<double>(pcie, "d2h_gbps", "pcie", ctx, h.pcie_h2d_gbps);
  h.pcie_pageable_gbps = get<double>(pcie, "pageable_gbps", "pcie", ctx, h.pcie_h2d_gbps / 4);
  h.pcie_latency_us = get<double>(pcie, "latency_us", "pcie", ctx, 10.0);
  h.gpu_name = get<std::string>(gpu, "name", "gpu", ctx, "GPU");
  const std::string vram = get<std::string>(gpu, "vram", "gpu", ctx, "", true);
  h.vram_bytes = parse_size(vram, ctx + ": gpu.vram");
  h.gpu_mem_gbps = get<double>(gpu, "mem_gbps", "gpu", ctx, 0, true);
  h.gpu_matmul_tflops = dtype_map(gpu["matmul_tflops"], "gpu.matmul_tflops", ctx);
  if (h.gpu_matmul_tflops.empty()) fail(ctx, ": missing field 'gpu.matmul_tflops'");
  h.gpu_attention_tflops = get<double>(gpu, "attention_tflops", "gpu", ctx, 20.0);
  h.gpu_launch_us = get<double>(gpu, "launch_us", "gpu", ctx, 5.0);
  h.gpu_sync_us = get<double>(gpu, "sync_us", "gpu", ctx, 10.0);
  h.validate(ctx);
  return h;
}

HardwareSpec load_hardware_yaml(const std::string& path) {
  return parse_hardware_yaml_text(read_text_file(path), path);
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> v;
  for (int i = 0; i < kBuiltinHardwareCount; ++i) v.emplace_back(kBuiltinHardware[i].name);
  return v;
}

HardwareSpec builtin_hardware(const std::string& name) {
  for (int i = 0; i < kBuiltinHardwareCount; ++i)
    if (name == kBuiltinHardware[i].name)
      return parse_hardware_yaml_text(kBuiltinHardware[i].yaml, "configs/hardware/" + name + ".yaml");
  std::string known;
  for (const auto& n : builtin_hardware_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown hardware '", name, "' (builtin: ", known, "; or give a .yaml path)");
}

HardwareSpec resolve_hardware(const std::string& name_or_path) {
  const std::string& s = name_or_path;
  if ((s.size() > 5 && s.compare(s.size() - 5, 5, ".yaml") == 0) ||
      (s.size() > 4 && s.compare(s.size() - 4, 4, ".yml") == 0))
    return load_hardware_yaml(s);
  return builtin_hardware(s);
}

}  // namespace shardwise

// core/size.h — parsing and printing of sizes and bandwidths (docs/DESIGN.md §6 "Units").
// K/M/G/T and KiB/MiB/GiB/TiB are binary (4G = 4*2^30 bytes); KB/MB/GB/TB are decimal.
#pragma once

#include <cstdint>
#include <string>

namespace shardwise {

// Limits of sizes that come from outside (flags, experiment files, plan tables); README "Limits".
constexpr uint64_t kMaxVramBudget = uint64_t(1) << 50;  // 1 PiB: far above any GPU
constexpr double kMinPcieCap = 100e6;                   // 100 MB/s: slower never finishes a model
constexpr double kMaxPcieCap = 1e12;                    // 1 TB/s: above any PCIe or NVLink-C2C link
constexpr int64_t kMaxContext = int64_t(1) << 22;       // tokens of KV capacity

// "4G", "512M", "2000MB", "1.5GiB", "123" (bytes). Throws Error naming `what` on bad text.
uint64_t parse_size(const std::string& text, const std::string& what = "size");

// "16GB/s" (decimal), "13.5GB/s", "500MB/s"; "none"/"0" gives 0 (= no cap). Bytes per second.
double parse_bandwidth(const std::string& text, const std::string& what = "bandwidth");

// A VRAM budget: parse_size, then 1 byte to kMaxVramBudget.
uint64_t parse_vram_budget(const std::string& text, const std::string& what);
// A PCIe cap: parse_bandwidth, then 0 (none) or kMinPcieCap to kMaxPcieCap.
double parse_pcie_cap(const std::string& text, const std::string& what);

// Token counts: "512", "1K" (=1024), "16K".
int64_t parse_token_count(const std::string& text, const std::string& what = "token count");

// Human-readable binary size: "15.7 GiB", "512.0 MiB", "34 B".
std::string format_bytes(uint64_t bytes);

// A number for people to read: `decimals` digits after the point ("1.23"), as printf's %.Nf.
std::string format_fixed(double value, int decimals);

}  // namespace shardwise

// core/size.h — parsing and printing of sizes and bandwidths (DESIGN.md §6 "Units").
// K/M/G/T and KiB/MiB/GiB/TiB are binary (4G = 4*2^30 bytes); KB/MB/GB/TB are decimal.
#pragma once

#include <cstdint>
#include <string>

namespace shardwise {

// "4G", "512M", "2000MB", "1.5GiB", "123" (bytes). Throws Error naming `what` on bad text.
uint64_t parse_size(const std::string& text, const std::string& what = "size");

// "16GB/s" (decimal), "13.5GB/s", "500MB/s"; "none"/"0" gives 0 (= no cap). Bytes per second.
double parse_bandwidth(const std::string& text, const std::string& what = "bandwidth");

// Token counts: "512", "1K" (=1024), "16K".
int64_t parse_token_count(const std::string& text, const std::string& what = "token count");

// Human-readable binary size: "15.7 GiB", "512.0 MiB", "34 B".
std::string format_bytes(uint64_t bytes);

}  // namespace shardwise

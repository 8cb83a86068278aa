// core/size.cpp — size/bandwidth text parsing (see size.h for the unit rules).
#include "core/size.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace shardwise {
namespace {

struct Number {
  double value;
  std::string unit;
};

Number split_number(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == start) fail(what, ": '", text, "' is not a number with an optional unit (e.g. 4G, 512MiB, 2000MB)");
  std::string num = text.substr(start, i - start);
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end == nullptr || *end != '\0' || !std::isfinite(v)) fail(what, ": '", text, "' is not a valid number");
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  return {v, unit};
}

double unit_multiplier(const std::string& unit, const std::string& text, const std::string& what) {
  if (unit.empty() || unit == "B") return 1.0;
  static const struct {
    const char* name;
    double mult;
  } kUnits[] = {
      {"K", 1024.0},   {"M", 1048576.0},   {"G", 1073741824.0},   {"T", 1099511627776.0},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"k", 1024.0},   {"m", 1048576.0},   {"g", 1073741824.0},   {"KB", 1e3},
      {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12},          {"kB", 1e3},
  };
  for (const auto& u : kUnits)
    if (unit == u.name) return u.mult;
  fail(what, ": unknown unit '", unit, "' in '", text, "' (use K/M/G, KiB/MiB/GiB = binary; KB/MB/GB = decimal)");
}

}  // namespace

uint64_t parse_size(const std::string& text, const std::string& what) {
  Number n = split_number(text, what);
  double bytes = n.value * unit_multiplier(n.unit, text, what);
  if (bytes < 0 || bytes > 9.0e18) fail(what, ": '", text, "' is out of range");
  return static_cast<uint64_t>(std::llround(bytes));
}

double parse_bandwidth(const std::string& text, const std::string& what) {
  if (text == "none" || text == "0") return 0.0;
  std::string t = text;
  const std::string suffix = "/s";
  if (t.size() < suffix.size() || t.compare(t.size() - suffix.size(), suffix.size(), suffix) != 0)
    fail(what, ": '", text, "' must end in /s (e.g. 16GB/s) or be 'none'");
  t.resize(t.size() - suffix.size());
  Number n = split_number(t, what);
  double bps = n.value * unit_multiplier(n.unit, text, what);
  if (bps <= 0) fail(what, ": '", text, "' must be positive (or 'none')");
  return bps;
}

uint64_t parse_vram_budget(const std::string& text, const std::string& what) {
  const uint64_t b = parse_size(text, what);
  if (b == 0 || b > kMaxVramBudget) fail(what, ": '", text, "' must be from 1 byte to 1 PiB");
  return b;
}

double parse_pcie_cap(const std::string& text, const std::string& what) {
  const double bps = parse_bandwidth(text, what);
  if (bps != 0 && (bps < kMinPcieCap || bps > kMaxPcieCap))
    fail(what, ": '", text, "' must be from 100MB/s to 1TB/s (or 'none')");
  return bps;
}

int64_t parse_token_count(const std::string& text, const std::string& what) {
  Number n = split_number(text, what);
  double mult = 1.0;
  if (n.unit == "K" || n.unit == "k")
    mult = 1024.0;
  else if (!n.unit.empty())
    fail(what, ": '", text, "' must be a count such as 512 or 4K");
  double v = n.value * mult;
  if (v < 1 || v > 1e9 || v != std::floor(v)) fail(what, ": '", text, "' must be a whole count between 1 and 1e9");
  return static_cast<int64_t>(v);
}

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::min(std::max(decimals, 0), 12), value);
  return buf;
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace shardwise

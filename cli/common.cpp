// cli/common.cpp — shared verb helpers.
#include "cli/common.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/thread_pool.h"

namespace shardwise::cli {

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t comma = text.find(',', i);
    std::string item = text.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 10)
      fail("--tokens: '", item, "' at item ", ids.size() + 1, " is not a token id (give e.g. --tokens 1,2,3)");
    long long v = std::stoll(item);
    if (v > INT32_MAX) fail("--tokens: id ", v, " is too large");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

int resolve_threads(int threads) {
  if (threads < 0 || threads > 4096) fail("--threads ", threads, " is out of range (0 = all cores)");
  return threads == 0 ? hardware_threads() : threads;
}

std::string resolve_cpu_device(const std::string& device) {
  if (device == "auto" || device == "cpu") return "cpu";
  if (device == "cuda" || device == "emu")
    fail("--device ", device, " is not available yet: the GPU/emulated executor has not landed; use --device cpu");
  fail("--device '", device, "' is unknown (auto, cuda, emu, cpu)");
}

void print_json(const nlohmann::json& j) {
  std::string s = j.dump();
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace shardwise::cli

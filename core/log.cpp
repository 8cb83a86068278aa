// core/log.cpp — stderr logger.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace shardwise {
namespace {
LogLevel initial_level() {
  const char* env = std::getenv("SHARDWISE_LOG");
  if (env == nullptr) return LogLevel::Info;
  std::string v = env;
  if (v == "debug") return LogLevel::Debug;
  if (v == "warn") return LogLevel::Warn;
  if (v == "error") return LogLevel::Error;
  if (v == "quiet") return LogLevel::Quiet;
  return LogLevel::Info;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mu;
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const std::string& message) {
  static const char* kPrefix[] = {"debug: ", "", "warning: ", "error: ", ""};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s%s\n", kPrefix[static_cast<int>(level)], message.c_str());
}

}  // namespace shardwise

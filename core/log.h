// core/log.h — leveled logging to stderr. Results go to stdout; everything else goes here.
#pragma once

#include <chrono>
#include <string>

#include "core/error.h"

namespace shardwise {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Quiet = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_level() <= LogLevel::Info) log_message(LogLevel::Info, str_cat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_level() <= LogLevel::Warn) log_message(LogLevel::Warn, str_cat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_level() <= LogLevel::Debug) log_message(LogLevel::Debug, str_cat(args...));
}

// Whether stderr is a terminal (status lines and progress are drawn only there).
bool stderr_is_terminal();

// One phase of a long set-up (loading a model, pinning its weights, planning, the first step): logged
// at debug level when it starts and when it ends, with its time. On a terminal at the info level its
// name stands on a status line while it runs (cleared when it ends; log lines print above it), so a
// phase that stalls is never silent. note() adds what is done so far ("3 of 16 GiB").
class Phase {
 public:
  explicit Phase(std::string name);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;
  void note(const std::string& detail);
  double seconds() const;

 private:
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace shardwise

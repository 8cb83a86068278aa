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

// The status line is the last line of a terminal's stderr: a progress bar while one runs, else the
// running Phase's name. A log line clears it, prints on a line of its own and draws it again below,
// so a log line never lands on a bar. set_progress_line() puts a bar there ("" removes it; the Phase's
// name, if any, comes back); nothing is drawn when stderr is not a terminal.
void set_progress_line(const std::string& text);

// One phase of a long set-up (loading a model, pinning its weights, planning, the first step): logged
// at debug level when it starts and when it ends, with its time. On a terminal at the info level its
// name stands on the status line while it runs (unless a progress bar does; when it ends, the Phase it
// ran within shows again; log lines print above it), so a phase that stalls is never silent. note()
// adds what is done so far ("3 of 16 GiB").
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
  std::string outer_;  // the status of the Phase this one runs within, shown again when this one ends
  std::chrono::steady_clock::time_point start_;
};

}  // namespace shardwise

// core/log.h — leveled logging to stderr. Results go to stdout; everything else goes here.
#pragma once

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

}  // namespace shardwise

// core/log.cpp — stderr logger.
#include "core/log.h"

#include <unistd.h>

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
// What the status line shows, guarded by g_mu: a progress bar's text before a Phase's ("" = none).
std::string g_bar;
std::string g_phase;
std::string g_shown;  // what stands on the terminal now

bool status_lines() {
  return stderr_is_terminal() && log_level() <= LogLevel::Info;
}

// Draws the status line again when what it should show changed (g_mu held).
void redraw_status() {
  const std::string& text = g_bar.empty() ? g_phase : g_bar;
  if (text == g_shown) return;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
  g_shown = text;
}
}  // namespace

bool stderr_is_terminal() {
  static const bool tty = ::isatty(2) == 1;
  return tty;
}

void set_progress_line(const std::string& text) {
  if (!stderr_is_terminal()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_bar = text;
  redraw_status();
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}
LogLevel log_level() {
  return static_cast<LogLevel>(g_level.load());
}

void log_message(LogLevel level, const std::string& message) {
  static const char* kPrefix[] = {"debug: ", "", "warning: ", "error: ", ""};
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_shown.empty()) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s%s\n", kPrefix[static_cast<int>(level)], message.c_str());
  if (!g_shown.empty()) {
    std::fputs(g_shown.c_str(), stderr);
    std::fflush(stderr);
  }
}

Phase::Phase(std::string name) : name_(std::move(name)), start_(std::chrono::steady_clock::now()) {
  log_debug("phase: ", name_);
  if (!status_lines()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  outer_ = g_phase;
  g_phase = name_ + " ...";
  redraw_status();
}

Phase::~Phase() {
  if (status_lines()) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_phase = outer_;
    redraw_status();
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", seconds());
  log_debug("phase: ", name_, ": done in ", buf, " s");
}

void Phase::note(const std::string& detail) {
  if (!status_lines()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_phase = name_ + " ... " + detail;
  redraw_status();
}

double Phase::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace shardwise

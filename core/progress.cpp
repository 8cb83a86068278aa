// core/progress.cpp — stderr progress bar, drawn on the log's status line.
#include "core/progress.h"

#include <cstdio>
#include <limits>

#include "core/log.h"

namespace shardwise {
namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

bool Progress::should_draw(bool terminal, double elapsed_s, double since_last_draw_s) {
  return terminal && elapsed_s >= kFirstDrawSeconds && since_last_draw_s >= kRedrawSeconds;
}

std::string Progress::format(const std::string& label, double fraction, double elapsed_s, bool final) {
  if (!(fraction > 0)) fraction = 0;  // NaN too
  if (fraction > 1) fraction = 1;
  const int width = 30;
  std::string bar(static_cast<size_t>(fraction * width), '#');
  bar.resize(width, '.');
  char tail[96];
  if (final) {
    std::snprintf(tail, sizeof tail, "] %5.1f%%  %.1f s", 100 * fraction, elapsed_s);
  } else {
    const double eta = fraction > 0 ? elapsed_s * (1 - fraction) / fraction : 0;
    std::snprintf(tail, sizeof tail, "] %5.1f%%  %.1f s elapsed, ETA %.1f s", 100 * fraction, elapsed_s, eta);
  }
  return label + " [" + bar + tail;
}

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total == 0 ? 1 : total),
      enabled_(enabled),
      terminal_(stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (drawn_) set_progress_line("");
}

void Progress::add(uint64_t n) {
  done_.fetch_add(n);
  if (!enabled_ || !terminal_) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since = drawn_ ? seconds_between(last_draw_, now) : std::numeric_limits<double>::infinity();
  if (!should_draw(terminal_, seconds_between(start_, now), since)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  done_.store(total_);
  if (drawn_) draw(true);
}

void Progress::draw(bool final) {
  const double fraction = static_cast<double>(done_.load()) / static_cast<double>(total_);
  const std::string text = format(label_, fraction, seconds_between(start_, std::chrono::steady_clock::now()), final);
  drawn_ = true;
  if (!final) {
    set_progress_line(text);
    return;
  }
  // The final bar stays, as a line of its own.
  set_progress_line("");
  log_message(LogLevel::Info, text);
}

}  // namespace shardwise

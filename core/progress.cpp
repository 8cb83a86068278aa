// core/progress.cpp — stderr progress bar.
#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace shardwise {

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total == 0 ? 1 : total),
      enabled_(enabled && isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  finish();
}

void Progress::add(uint64_t n) {
  done_.fetch_add(n);
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || !enabled_) return;
  finished_ = true;
  done_.store(total_);
  draw(true);
}

void Progress::draw(bool final) {
  double frac = static_cast<double>(done_.load()) / static_cast<double>(total_);
  if (frac > 1) frac = 1;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  const int width = 30;
  int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%%  %.1fs elapsed, ETA %.1fs%s", label_.c_str(), bar.c_str(), 100 * frac,
               elapsed, eta, final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace shardwise

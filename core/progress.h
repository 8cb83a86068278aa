// core/progress.h — a progress bar with ETA on stderr for long work (synth, profile, sweep).
// Drawn only when stderr is a terminal: in a pipe or a log, stderr carries what the command reports
// and, on failure, its one error line, never progress. Work that ends within a second shows no bar.
// The bar stands on the log's status line (core/log.h), so a log line printed meanwhile clears it and is
// printed on a line of its own, and the bar is drawn again below it. Thread-safe add().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace shardwise {

class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled = true);
  // Without finish() (an error unwinding), removes the bar and prints nothing more.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void add(uint64_t n);
  // The work is done: a bar that was drawn is replaced by its final line (100% and the time taken).
  void finish();

  // The first draw waits this long: a bar that would flash and vanish is noise.
  static constexpr double kFirstDrawSeconds = 1.0;
  // Redraws are at least this far apart.
  static constexpr double kRedrawSeconds = 0.1;
  // Whether to draw now: on a terminal only, once the work has run kFirstDrawSeconds, then every
  // kRedrawSeconds. since_last_draw_s is infinite before the first draw.
  static bool should_draw(bool terminal, double elapsed_s, double since_last_draw_s);
  // The bar: "LABEL [#########.....]  42.0%  3.1 s elapsed, ETA 4.3 s"; the final one
  // "LABEL [###...###] 100.0%  7.4 s". fraction is clamped to [0, 1].
  static std::string format(const std::string& label, double fraction, double elapsed_s, bool final);

 private:
  void draw(bool final);  // mu_ held
  std::string label_;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  bool enabled_;   // asked for
  bool terminal_;  // stderr is a terminal
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace shardwise

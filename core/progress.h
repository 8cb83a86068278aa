// core/progress.h — a progress bar with ETA on stderr for long work (synth, profile, sweep).
// Draws only when stderr is a terminal: in a pipe or a log, stderr carries what the command reports
// and, on failure, its one error line, never progress. Thread-safe add().
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
  ~Progress();
  void add(uint64_t n);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  bool enabled_;  // asked for, and stderr is a terminal
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace shardwise

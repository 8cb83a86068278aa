// core/watchdog.h — bounded waits. A call that may never return (a driver call that pins memory, a
// wait on a device queue, a wait for other threads) runs under a StallGuard. If it lasts longer than
// its limit, one error line names what was waited for (and what to do), and the process ends with
// exit code 1: a stalled run is never silent. The check is a monitor thread that wakes a few times a
// second; a guard costs an uncontended lock, so guards may sit on per-step waits.
//
// Ending the process, rather than throwing, is deliberate: the stalled call is still on its thread's
// stack (a kernel call, a spinning wait) and cannot be unwound from another thread.
#pragma once

#include <string>
#include <string_view>

namespace shardwise {

// The limit of guards that name none, in seconds (0 = unbounded); default 600. Set from the CLI's
// --wait-timeout.
void set_wait_limit_s(double seconds);
double wait_limit_s();

class StallGuard {
 public:
  // `what` names the wait ("pinning 1.0 GiB of host weights from model.gguf"); `hint` says what to do
  // (empty = nothing); both are copied (a literal costs no allocation). limit_s <= 0 takes
  // wait_limit_s(); both 0 means no limit. Guards nest up to
  // kMaxDepth per thread (deeper ones are not watched).
  explicit StallGuard(std::string_view what, double limit_s = 0, std::string_view hint = {});
  ~StallGuard();
  StallGuard(const StallGuard&) = delete;
  StallGuard& operator=(const StallGuard&) = delete;

  static constexpr int kMaxDepth = 4;

 private:
  int depth_ = -1;  // this guard's entry in its thread's stack, -1 = not watched
};

// The message the monitor prints (without "error: "), for tests.
std::string stall_message(const std::string& what, double limit_s, const std::string& hint);

}  // namespace shardwise

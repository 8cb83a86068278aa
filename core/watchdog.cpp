// core/watchdog.cpp — StallGuard's per-thread stacks of deadlines and the monitor thread that checks them.
#include "core/watchdog.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace shardwise {
namespace {

using Clock = std::chrono::steady_clock;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

std::atomic<double> g_limit_s{600.0};

// One thread's open guards. Texts are copied into fixed buffers: the monitor may read an entry while
// the guard that wrote it is being destroyed, so it must never point at the guard's own strings.
struct Slot {
  struct Entry {
    double deadline = 0, limit = 0;
    char what[224] = {};
    char hint[224] = {};
  };
  std::mutex mu;
  Entry entries[StallGuard::kMaxDepth];
  int depth = 0;
};

// The slots of live threads. Leaked on purpose: the monitor may outlive static destruction.
struct Registry {
  std::mutex mu;
  std::vector<Slot*> slots;
};

// Whether this process's monitor runs; a forked child has none (threads do not survive fork) and starts
// its own.
std::atomic<bool> g_monitor_started{false};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

[[noreturn]] void report(const Slot::Entry& e) {
  // On a terminal the line first clears a status line (log.h Phase).
  const std::string line =
      std::string(stderr_is_terminal() ? "\r\033[K" : "") + "error: " + stall_message(e.what, e.limit, e.hint) + "\n";
  // One write: the line is not interleaved with other threads' output.
  (void)!::write(2, line.data(), line.size());
  std::_Exit(1);
}

void monitor_loop() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const double now = now_s();
    for (Slot* s : r.slots) {
      std::lock_guard<std::mutex> slot_lock(s->mu);
      for (int i = 0; i < s->depth; ++i)
        if (s->entries[i].deadline > 0 && now > s->entries[i].deadline) report(s->entries[i]);
    }
  }
}

void ensure_monitor() {
  if (g_monitor_started.load(std::memory_order_acquire)) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (g_monitor_started.load(std::memory_order_relaxed)) return;
  static const int atfork = ::pthread_atfork(nullptr, nullptr, [] { g_monitor_started.store(false); });
  (void)atfork;
  std::thread(monitor_loop).detach();
  g_monitor_started.store(true, std::memory_order_release);
}

struct ThreadSlot {
  Slot slot;
  ThreadSlot() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.slots.push_back(&slot);
  }
  ~ThreadSlot() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.slots.erase(std::remove(r.slots.begin(), r.slots.end(), &slot), r.slots.end());
  }
};

Slot& this_thread_slot() {
  thread_local ThreadSlot ts;
  return ts.slot;
}

void copy_text(char* dst, size_t cap, std::string_view src) {
  const size_t n = std::min(cap - 1, src.size());
  if (n > 0) std::memcpy(dst, src.data(), n);  // an empty view may hold no pointer at all
  dst[n] = '\0';
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s >= 10 ? "%.0f" : "%.1f", s);
  return buf;
}

}  // namespace

void set_wait_limit_s(double seconds) {
  SW_CHECK(std::isfinite(seconds) && seconds >= 0, "wait limit ", seconds, " s: give a number of seconds >= 0");
  g_limit_s.store(seconds);
}
double wait_limit_s() {
  return g_limit_s.load();
}

std::string stall_message(const std::string& what, double limit_s, const std::string& hint) {
  std::string m = what + " did not finish within " + seconds_text(limit_s) + " s";
  if (!hint.empty()) m += " (" + hint + ")";
  return m;
}

StallGuard::StallGuard(std::string_view what, double limit_s, std::string_view hint) {
  const double limit = limit_s > 0 ? limit_s : wait_limit_s();
  if (limit <= 0) return;
  ensure_monitor();
  Slot& s = this_thread_slot();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.depth >= kMaxDepth) return;
  Slot::Entry& e = s.entries[s.depth];
  e.deadline = now_s() + limit;
  e.limit = limit;
  copy_text(e.what, sizeof e.what, what);
  copy_text(e.hint, sizeof e.hint, hint);
  depth_ = s.depth++;
}

StallGuard::~StallGuard() {
  if (depth_ < 0) return;
  Slot& s = this_thread_slot();
  std::lock_guard<std::mutex> lock(s.mu);
  s.depth = depth_;  // guards end in reverse order of their start
  s.entries[depth_].deadline = 0;
}

}  // namespace shardwise

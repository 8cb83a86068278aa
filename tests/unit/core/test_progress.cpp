// core/progress: when a bar is drawn (a terminal only, not before a second of work, then at most every
// 0.1 s), what it says, and how it shares a terminal with log lines and a Phase's status (a child
// process on a pseudo-terminal, its output replayed as a terminal shows it). The binary's bars are
// checked the same way in tests/python/test_progress_tty.py.
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/progress.h"

using namespace shardwise;

namespace {

constexpr int kNotATerminal = 77;

// Runs body() in a child whose stdout and stderr are a pseudo-terminal; returns its exit code and
// everything it wrote.
template <class Body>
std::pair<int, std::string> on_terminal(Body body) {
  int leader = -1;
  const pid_t pid = ::forkpty(&leader, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // stderr_is_terminal() caches its answer: a parent that asked before the fork leaves "no" behind.
    if (!stderr_is_terminal()) std::_Exit(kNotATerminal);
    body();
    std::fflush(stderr);
    std::_Exit(0);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(leader, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(leader);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Whether the child could not test on a terminal: stderr_is_terminal() answered before the fork (warned).
bool asked_before_fork(const std::pair<int, std::string>& r) {
  if (r.first != kNotATerminal) return false;
  WARN("stderr_is_terminal() answered before the fork: run this case in a process of its own (as CTest does)");
  return true;
}

// The lines a terminal shows for out: '\r' returns to column 0, ESC[K clears to the end of the line,
// '\n' ends a line (the pseudo-terminal writes "\r\n"), other bytes overwrite. The unfinished last line
// is included.
std::vector<std::string> screen_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::string cur;
  size_t col = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 3, "\033[K") == 0) {
      cur.resize(std::min(cur.size(), col));
      i += 2;
    } else if (out[i] == '\r') {
      col = 0;
    } else if (out[i] == '\n') {
      lines.push_back(cur);
      cur.clear();
      col = 0;
    } else {
      if (col < cur.size())
        cur[col] = out[i];
      else
        cur.push_back(out[i]);
      ++col;
    }
  }
  lines.push_back(cur);
  return lines;
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

TEST_CASE("progress: the replayed terminal overwrites and clears and ends lines", "[progress]") {
  using V = std::vector<std::string>;
  CHECK(screen_lines("bar\rlog\r\n") == V{"log", ""});
  CHECK(screen_lines("a long bar\r\033[Klog\r\nbar") == V{"log", "bar"});
  CHECK(screen_lines("bar [###]log\r\n") == V{"bar [###]log", ""});
}

TEST_CASE("progress: no bar off a terminal and none in the first second and then redraws 0.1 s apart", "[progress]") {
  const double never = std::numeric_limits<double>::infinity();
  // Not a terminal: never, however long the work runs.
  CHECK_FALSE(Progress::should_draw(false, 0.0, never));
  CHECK_FALSE(Progress::should_draw(false, 60.0, never));
  // Work under a second shows no bar.
  CHECK_FALSE(Progress::should_draw(true, 0.0, never));
  CHECK_FALSE(Progress::should_draw(true, 0.5, never));
  CHECK_FALSE(Progress::should_draw(true, 0.999, never));
  // From a second on: the first draw at once, then at most every 0.1 s.
  CHECK(Progress::should_draw(true, 1.0, never));
  CHECK(Progress::should_draw(true, 5.0, never));
  CHECK_FALSE(Progress::should_draw(true, 1.05, 0.05));
  CHECK(Progress::should_draw(true, 1.2, 0.1));
}

TEST_CASE("progress: the bar shows the share done with the time and the ETA and the final one the time taken",
          "[progress]") {
  const std::string half = Progress::format("synthesise x", 0.5, 2.0, false);
  CHECK(half == "synthesise x [###############...............]  50.0%  2.0 s elapsed, ETA 2.0 s");
  const std::string done = Progress::format("synthesise x", 1.0, 4.3, true);
  CHECK(done == "synthesise x [##############################] 100.0%  4.3 s");
  // Out-of-range shares are clamped; nothing done yet has no ETA to divide by.
  CHECK(Progress::format("p", 1.5, 1.0, false).find("100.0%") != std::string::npos);
  CHECK(Progress::format("p", -1, 1.0, false) == "p [..............................]   0.0%  1.0 s elapsed, ETA 0.0 s");
}

TEST_CASE("progress: a Progress off a terminal takes work from many adds and finishes quietly", "[progress]") {
  // The tests' stderr is not a terminal: nothing may be drawn, and add/finish/destroy must still be safe.
  Progress p("quiet", 10);
  for (int i = 0; i < 20; ++i) p.add(1);
  p.finish();
  p.finish();
  Progress unfinished("unfinished", 10);
  unfinished.add(3);
}

TEST_CASE("progress: on a terminal log lines print on lines of their own while a bar runs", "[progress]") {
  const auto r = on_terminal([] {
    Progress p("work", 100);
    sleep_s(Progress::kFirstDrawSeconds + 0.05);
    p.add(40);  // the first draw
    log_info("a log line");
    log_warn("a warning");
    sleep_s(Progress::kRedrawSeconds + 0.05);
    p.add(10);
    log_info("another log line");
    p.finish();
    log_info("after the bar");
  });
  if (asked_before_fork(r)) return;
  REQUIRE(r.first == 0);
  const std::vector<std::string> lines = screen_lines(r.second);
  INFO(r.second);
  REQUIRE(lines.size() == 6);
  CHECK(lines[0] == "a log line");
  CHECK(lines[1] == "warning: a warning");
  CHECK(lines[2] == "another log line");
  // The final bar stays on a line of its own; nothing is left on the status line.
  CHECK(lines[3].rfind("work [##############################] 100.0%  1.", 0) == 0);
  CHECK(lines[4] == "after the bar");
  CHECK(lines[5].empty());
  // The bar was drawn at 40% and the log lines printed over a cleared line, never after it.
  CHECK(r.second.find("work [############..................]  40.0%") != std::string::npos);
}

TEST_CASE("progress: on a terminal work under a second draws nothing", "[progress]") {
  const auto r = on_terminal([] {
    Progress p("quick work", 10);
    for (int i = 0; i < 10; ++i) p.add(1);
    p.finish();
    Progress failed("failed work", 10);
    failed.add(5);  // destroyed without finish(): an error unwinding
  });
  if (asked_before_fork(r)) return;
  CHECK(r.first == 0);
  CHECK(r.second.empty());
}

TEST_CASE("progress: on a terminal a bar stands in for the status of a Phase which comes back after it", "[progress]") {
  const auto r = on_terminal([] {
    const Phase phase("loading");
    Progress p("copy", 10);
    sleep_s(Progress::kFirstDrawSeconds + 0.05);
    p.add(5);
    {
      const Phase inner("pinning");  // hidden under the bar
    }
    log_info("a log line");
    p.finish();
    std::fputs("|end", stderr);  // marks the cursor: after what the status line shows
  });
  if (asked_before_fork(r)) return;
  REQUIRE(r.first == 0);
  const std::vector<std::string> lines = screen_lines(r.second);
  INFO(r.second);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "a log line");
  CHECK(lines[1].rfind("copy [##############################] 100.0%", 0) == 0);
  // Below the final bar the outer Phase's status is back (it is cleared when that Phase ends).
  CHECK(r.second.find("\r\nloading ...|end") != std::string::npos);
  CHECK(lines[2].empty());
  CHECK(r.second.find("pinning") == std::string::npos);
}

// core/watchdog: a guarded wait that outlasts its limit ends the process with exit code 1 and one
// error line naming the wait and the hint; a wait that ends in time, or a guard with no limit, does
// nothing. Each case runs in a forked child, since a stall ends the whole process.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "core/watchdog.h"

using namespace shardwise;

namespace {

struct ChildResult {
  int exit_code = -1;
  std::string err;
  double seconds = 0;
};

// Runs body() in a child process with stderr captured; the child exits 0 when body returns.
template <class Body>
ChildResult in_child(Body body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    body();
    std::_Exit(0);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) r.err.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

TEST_CASE("watchdog: a wait past its limit ends the process with one error line naming it", "[core][watchdog]") {
  const ChildResult r = in_child([] {
    const StallGuard outer("the outer wait", 30);
    const StallGuard g("pinning 1.0 GiB of host weights of m.gguf", 0.3, "give --no-pin-weights");
    sleep_s(20);
  });
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 5);
  CHECK(r.err ==
        "error: " + stall_message("pinning 1.0 GiB of host weights of m.gguf", 0.3, "give --no-pin-weights") + "\n");
  CHECK(r.err.find("pinning 1.0 GiB of host weights of m.gguf did not finish within 0.3 s (give --no-pin-weights)") !=
        std::string::npos);
}

TEST_CASE("watchdog: waits that end in time, ended guards and unlimited guards never fire", "[core][watchdog]") {
  const ChildResult r = in_child([] {
    for (int i = 0; i < 100; ++i) {
      const StallGuard g("a short wait", 0.2);
    }
    { const StallGuard g("a wait that ends", 0.3); }
    set_wait_limit_s(0);
    const StallGuard unlimited("a wait with no limit");
    sleep_s(0.8);  // past every limit above
  });
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
}

TEST_CASE("watchdog: guards on other threads are watched, and the default limit applies", "[core][watchdog]") {
  const ChildResult r = in_child([] {
    set_wait_limit_s(0.25);
    std::thread t([] {
      const StallGuard g("a worker's wait");
      sleep_s(20);
    });
    t.join();
  });
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("error: a worker's wait did not finish within ", 0) == 0);
  CHECK(r.seconds < 5);
  CHECK_THROWS(set_wait_limit_s(-1));
}

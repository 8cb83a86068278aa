// core/thread_pool: parallel loops cover their range once, a loop never waits for a worker that has not
// started, run_on_all runs once on every thread, exceptions come back to the caller, and host work
// handed to the next loop (set_caller_work) runs once, on the calling thread, beside the workers.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

using namespace shardwise;

TEST_CASE("thread pool: parallel_for covers 0 to n-1 exactly once, for every pool size", "[core][pool]") {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000)}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) CHECK(h.load() == 1);
    }
  }
}

namespace {
// A worker held by a signal: its handler waits (nanosleep is async-signal-safe) until released —
// a thread the host does not run, as a descheduled vCPU or a worker slow to wake would be.
std::atomic<int> g_held{0};
std::atomic<bool> g_release{false};
extern "C" void hold_worker(int) {
  g_held.fetch_add(1);
  while (!g_release.load()) {
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
}
}  // namespace

TEST_CASE("thread pool: a loop does not wait for a worker that has not started", "[core][pool]") {
  // Workers spin up to a second between loops, so the held one is caught spinning, holding no lock.
  ThreadPool pool(3, 1000000);
  std::vector<pthread_t> ids(3);
  pool.run_on_all([&](int t) { ids[static_cast<size_t>(t)] = pthread_self(); });
  struct sigaction sa {
  }, old{};
  sa.sa_handler = hold_worker;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR2, &sa, &old) == 0);
  g_release = false;
  g_held = 0;
  REQUIRE(pthread_kill(ids[2], SIGUSR2) == 0);
  for (int i = 0; i < 10000 && g_held.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(g_held.load() == 1);

  // A pool that waited for every worker would finish no loop until the watchdog lets worker 2 go.
  std::atomic<bool> loops_done{false}, watchdog_fired{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 1000 && !loops_done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!loops_done.load()) watchdog_fired = true;
    g_release = true;
  });
  std::vector<std::atomic<int>> hits(1000);
  std::vector<std::atomic<int64_t>> by_thread(3);
  for (int loop = 0; loop < 50; ++loop) {
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      by_thread[static_cast<size_t>(t)].fetch_add(e - b);
    });
  }
  loops_done = true;
  g_release = true;
  watchdog.join();
  sigaction(SIGUSR2, &old, nullptr);
  CHECK_FALSE(watchdog_fired.load());
  CHECK(by_thread[2].load() == 0);
  CHECK(by_thread[0].load() + by_thread[1].load() == 50 * 1000);
  for (auto& h : hits) CHECK(h.load() == 50);

  // Released, the worker takes part again: run_on_all runs on each thread once.
  std::vector<std::atomic<int>> ran(3);
  pool.run_on_all([&](int t) { ran[static_cast<size_t>(t)].fetch_add(1); });
  for (auto& r : ran) CHECK(r.load() == 1);
}

TEST_CASE("thread pool: run_on_all runs once on every thread, between loops that late workers miss", "[core][pool]") {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> ran(4);
  std::vector<std::thread::id> who(4);
  std::atomic<int64_t> covered{0};
  for (int r = 0; r < 300; ++r) {
    pool.parallel_for(8, 1, [&](int64_t b, int64_t e, int) { covered.fetch_add(e - b); });
    pool.run_on_all([&](int t) {
      ran[static_cast<size_t>(t)].fetch_add(1);
      who[static_cast<size_t>(t)] = std::this_thread::get_id();
    });
  }
  CHECK(covered.load() == 300 * 8);
  for (auto& x : ran) CHECK(x.load() == 300);
  for (size_t a = 0; a < who.size(); ++a)
    for (size_t b = a + 1; b < who.size(); ++b) CHECK(who[a] != who[b]);  // four threads, not one twice
}

TEST_CASE("thread pool: an exception in any chunk comes back to the caller once the loop is done", "[core][pool]") {
  ThreadPool pool(3);
  for (int r = 0; r < 20; ++r) {
    std::vector<std::atomic<int>> hits(1000);
    CHECK_THROWS_WITH(pool.parallel_for(1000, 1,
                                        [&](int64_t b, int64_t e, int) {
                                          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
                                          if (b <= 500 && 500 < e) throw std::runtime_error("chunk failed");
                                        }),
                      "chunk failed");
    for (auto& h : hits) CHECK(h.load() == 1);  // the other chunks all ran, once
  }
  CHECK_THROWS_WITH(pool.run_on_all([](int t) {
    if (t == 2) throw std::runtime_error("thread 2 failed");
  }),
                    "thread 2 failed");
  std::atomic<int64_t> covered{0};  // the pool still works
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e, int) { covered.fetch_add(e - b); });
  CHECK(covered.load() == 100);
}

TEST_CASE("thread pool: caller work runs once, on the caller, while the workers take the loop", "[core][pool]") {
  const std::thread::id caller = std::this_thread::get_id();
  SECTION("two threads: the workers compute while the caller is busy") {
    ThreadPool pool(2);
    std::atomic<bool> release{false};
    std::atomic<int64_t> by_worker{0};
    std::thread::id ran_on;
    int runs = 0;
    pool.set_caller_work([&] {
      ran_on = std::this_thread::get_id();
      ++runs;
      // The caller waits here until the other thread has done part of the loop: the loop started first.
      while (by_worker.load() == 0) std::this_thread::yield();
      release = true;
    });
    std::vector<std::atomic<int>> hits(64);
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      if (t != 0) by_worker.fetch_add(e - b);
    });
    CHECK(release.load());
    CHECK(runs == 1);
    CHECK(ran_on == caller);
    for (auto& h : hits) CHECK(h.load() == 1);
    // Consumed: the next loop and run_caller_work run nothing more.
    pool.parallel_for(8, 1, [](int64_t, int64_t, int) {});
    pool.run_caller_work();
    CHECK(runs == 1);
  }
  SECTION("one thread, a loop run inline, or no loop at all: it runs before the loop, or when asked") {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<int> order;
      pool.set_caller_work([&] { order.push_back(0); });
      pool.parallel_for(1, 4, [&](int64_t, int64_t, int) { order.push_back(1); });  // n <= grain: inline
      CHECK(order == std::vector<int>{0, 1});
      pool.set_caller_work([&] { order.push_back(2); });
      pool.parallel_for(0, 1, [&](int64_t, int64_t, int) { order.push_back(9); });  // an empty loop takes none
      pool.run_caller_work();
      CHECK(order == std::vector<int>{0, 1, 2});
    }
  }
  SECTION("its exception is rethrown after the loop, which still completes") {
    ThreadPool pool(3);
    pool.set_caller_work([] { throw std::runtime_error("caller work failed"); });
    std::vector<std::atomic<int>> hits(100);
    CHECK_THROWS_WITH(pool.parallel_for(100, 1,
                                        [&](int64_t b, int64_t e, int) {
                                          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
                                        }),
                      "caller work failed");
    for (auto& h : hits) CHECK(h.load() == 1);
    std::atomic<int64_t> covered{0};  // the pool still works, with no caller work left
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e, int) { covered.fetch_add(e - b); });
    CHECK(covered.load() == 10);
    CHECK_NOTHROW(pool.run_caller_work());
  }
}

#if !defined(__SANITIZE_ADDRESS__)
namespace {
// Bytes of address space this process maps now (/proc/self/statm, first field, in pages).
uint64_t mapped_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0;
  if (f) {
    if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// In a child process whose address space allows `spare` more bytes: a pool of `threads` threads.
// Exit 0: one Error naming the thread that could not start; 1: the pool started; 2: another error;
// killed by SIGALRM: the constructor hung.
int pool_in_limited_child(uint64_t spare, int threads) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = mapped_bytes() + spare;
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
    try {
      ThreadPool pool(threads);
      _exit(1);
    } catch (const Error& e) {
      const bool named = std::strstr(e.what(), "cannot start thread") && std::strstr(e.what(), "give fewer threads") &&
                         !std::strchr(e.what(), '\n');
      _exit(named ? 0 : 2);
    } catch (...) {
      _exit(2);
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}
}  // namespace
#endif

TEST_CASE("thread pool: a thread that cannot be started is one error, once the started ones are joined",
          "[core][pool]") {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer's own thread bookkeeping aborts when the address space runs out, before ours runs.
  WARN("skipped under AddressSanitizer");
#else
  // Thread stacks take 8 MiB of address space each: a few start, then std::thread throws. Before the
  // fix the started workers were left waiting on a condition variable being destroyed: a hang.
  for (uint64_t spare_mib : {uint64_t(40), uint64_t(100)}) {
    INFO(spare_mib << " MiB of address space to spare");
    CHECK(pool_in_limited_child(spare_mib << 20, 600) == 0);
  }
#endif
}

TEST_CASE("thread pool: at most kMaxPoolThreads threads, and the CLI allows 4 x the hardware threads", "[core][pool]") {
  CHECK_THROWS_AS(ThreadPool(kMaxPoolThreads + 1), Error);
  CHECK(max_cli_threads() == std::min(kMaxPoolThreads, 4 * hardware_threads()));
  CHECK(max_cli_threads() >= 4);
}

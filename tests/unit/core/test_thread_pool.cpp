// core/thread_pool: parallel loops cover their range once, and host work handed to the next loop
// (set_caller_work) runs once, on the calling thread, beside the workers.
#include <atomic>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

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

TEST_CASE("thread pool: SHARDWISE_POOL_SPIN_US is microseconds from 0 to 1000000", "[core][pool]") {
  CHECK(shardwise::parse_pool_spin_us(nullptr) == -1);
  CHECK(shardwise::parse_pool_spin_us("0") == 0);
  CHECK(shardwise::parse_pool_spin_us("2500") == 2500);
  CHECK(shardwise::parse_pool_spin_us("1000000") == 1000000);
  for (const char* bad : {"", "x", "-1", "1000001", "12 ", "3us", "99999999999999999999"}) {
    INFO(bad);
    CHECK(shardwise::parse_pool_spin_us(bad) == -2);
  }
}

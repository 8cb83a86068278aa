// core/thread_pool.cpp — spin-then-sleep worker pool (see thread_pool.h).
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>

#include "core/error.h"
#include "core/size.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SW_PAUSE() _mm_pause()
#else
#define SW_PAUSE() std::this_thread::yield()
#endif

namespace shardwise {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

int64_t parse_pool_spin_us(const char* text) { return parse_env_count(text, 1000000); }

namespace {
int64_t pool_spin_us() {
  static const int64_t v = parse_pool_spin_us(std::getenv("SHARDWISE_POOL_SPIN_US"));
  return v;
}
}  // namespace

void check_thread_pool_env() {
  SW_CHECK(pool_spin_us() != -2, "SHARDWISE_POOL_SPIN_US=", std::getenv("SHARDWISE_POOL_SPIN_US"),
           ": expected microseconds from 0 to 1000000 (or leave it unset: 20000 pauses)");
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : hardware_threads()) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    epoch_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  const int64_t spin_us = pool_spin_us();
  for (;;) {
    // Spin for a short while: consecutive loops of a decode step arrive microseconds apart.
    if (spin_us < 0) {
      int spins = 0;
      while (epoch_.load(std::memory_order_acquire) == seen && spins < 20000) {
        SW_PAUSE();
        ++spins;
      }
    } else if (spin_us > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
      for (int spins = 1; epoch_.load(std::memory_order_acquire) == seen; ++spins) {
        SW_PAUSE();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
    }
    if (epoch_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return epoch_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    (*task_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::set_caller_work(std::function<void()> work) { caller_work_ = std::move(work); }

void ThreadPool::run_caller_work() {
  if (!caller_work_) return;
  const std::function<void()> work = std::move(caller_work_);
  caller_work_ = nullptr;
  work();
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    run_caller_work();
    fn(0);
    return;
  }
  task_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  std::exception_ptr failed;  // the workers use fn until they are done: rethrown only after that
  try {
    run_caller_work();
  } catch (...) {
    failed = std::current_exception();
  }
  fn(0);
  while (pending_.load(std::memory_order_acquire) != 0) SW_PAUSE();
  task_ = nullptr;
  if (failed) std::rethrow_exception(failed);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    run_caller_work();
    fn(0, n, 0);
    return;
  }
  // Chunks: about 4 per thread for balance, never smaller than grain.
  const int64_t chunk = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
  std::atomic<int64_t> next{0};
  run_on_all([&](int t) {
    for (;;) {
      int64_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) break;
      fn(begin, std::min(n, begin + chunk), t);
    }
  });
}

}  // namespace shardwise

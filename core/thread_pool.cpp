// core/thread_pool.cpp — spin-then-sleep worker pool (see thread_pool.h).
#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>

#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SW_PAUSE() _mm_pause()
#else
#define SW_PAUSE() std::this_thread::yield()
#endif

namespace shardwise {

int hardware_threads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

int max_cli_threads() {
  return std::min(kMaxPoolThreads, 4 * hardware_threads());
}

namespace {
// Spins until done(); a wait that lasts past a few milliseconds runs under a StallGuard naming it (a
// worker stuck in its chunk must not hang the run silently). Short waits cost no guard.
template <class Done>
void spin_until(Done&& done, const char* what) {
  for (uint32_t spins = 0; !done(); ++spins) {
    if (spins == (1u << 16)) {
      const StallGuard guard(what, 0, "a worker thread stopped making progress; --wait-timeout raises the limit");
      while (!done()) SW_PAUSE();
      return;
    }
    SW_PAUSE();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, int64_t spin_us)
    : n_threads_(n_threads > 0 ? n_threads : hardware_threads()), spin_us_(std::max<int64_t>(-1, spin_us)) {
  SW_CHECK(n_threads_ <= kMaxPoolThreads, "a thread pool of ", n_threads_, " threads: at most ", kMaxPoolThreads);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  try {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::exception& e) {
    // The workers already started wait on cv_: stop and join them before the members go (destroying
    // a condition variable that threads wait on blocks forever).
    const size_t started = workers_.size();
    stop_workers();
    fail("cannot start thread ", started + 1, " of ", n_threads_, " (", e.what(),
         "): the process or container limits threads or address space; give fewer threads");
  }
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    epoch_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  uint64_t ran = 0;  // the last run_on_all job this worker ran
  const int64_t spin_us = spin_us_;
  for (;;) {
    // Spin for a short while: consecutive loops of a decode step arrive microseconds apart.
    if (spin_us < 0) {
      int spins = 0;
      while (epoch_.load(std::memory_order_acquire) == seen && spins < 20000) {
        SW_PAUSE();
        ++spins;
      }
    } else {
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
    // Count in, then look: either the caller, closing the job, sees this worker inside and waits for
    // it, or this worker sees the job closed (or the next one open, whose fields are then set).
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (open_.load(std::memory_order_seq_cst)) {
      if (all_fn_ != nullptr) {
        if (ran != job_) {
          ran = job_;
          try {
            (*all_fn_)(index);
          } catch (...) {
            record_failure();
          }
          done_.fetch_add(1, std::memory_order_acq_rel);
        }
      } else {
        take_chunks(index);
      }
    }
    inside_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ThreadPool::record_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) failed_ = std::current_exception();
}

void ThreadPool::take_chunks(int index) {
  const auto& fn = *for_fn_;
  const int64_t n = for_n_, chunk = for_chunk_;
  for (;;) {
    const int64_t begin = next_.fetch_add(chunk, std::memory_order_relaxed);
    if (begin >= n) return;
    const int64_t end = std::min(n, begin + chunk);
    try {
      fn(begin, end, index);
    } catch (...) {
      record_failure();
    }
    done_.fetch_add(end - begin, std::memory_order_acq_rel);
  }
}

void ThreadPool::set_caller_work(std::function<void()> work) {
  caller_work_ = std::move(work);
}

void ThreadPool::run_caller_work() {
  if (!caller_work_) return;
  const std::function<void()> work = std::move(caller_work_);
  caller_work_ = nullptr;
  work();
}

void ThreadPool::run_job(int64_t target, const std::function<void()>& share) {
  ++job_;
  open_.store(true, std::memory_order_seq_cst);  // publishes the job's fields
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  std::exception_ptr caller_failed;  // the workers use the job until it is closed: rethrown after that
  try {
    run_caller_work();
  } catch (...) {
    caller_failed = std::current_exception();
  }
  try {
    share();
  } catch (...) {
    record_failure();
  }
  spin_until([&] { return done_.load(std::memory_order_acquire) >= target; }, "a parallel loop's worker threads");
  open_.store(false, std::memory_order_seq_cst);
  spin_until([&] { return inside_.load(std::memory_order_seq_cst) == 0; }, "a parallel loop's worker threads");
  all_fn_ = nullptr;
  for_fn_ = nullptr;
  std::exception_ptr failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = failed_;
    failed_ = nullptr;
  }
  if (caller_failed) std::rethrow_exception(caller_failed);
  if (failed) std::rethrow_exception(failed);
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    run_caller_work();
    fn(0);
    return;
  }
  all_fn_ = &fn;
  for_fn_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  run_job(n_threads_ - 1, [&] { fn(0); });
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
  all_fn_ = nullptr;
  for_fn_ = &fn;
  for_n_ = n;
  for_chunk_ = std::max(grain, (n + 4 * n_threads_ - 1) / (4 * n_threads_));
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  run_job(n, [&] { take_chunks(0); });
}

}  // namespace shardwise

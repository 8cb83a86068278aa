// core/thread_pool.h — a persistent pool of worker threads for data-parallel loops.
// Decode steps issue hundreds of short parallel loops per token, so dispatch must cost
// microseconds: workers spin briefly on an epoch counter before sleeping on a condition variable
// (20000 pauses; SHARDWISE_POOL_SPIN_US=N spins N microseconds instead, 0 sleeps at once — a knob to
// measure whether a loop waits for workers to wake, e.g. a Dynamic step's CPU shares some hundred
// microseconds apart). Every loop waits until each worker has taken part.
// The calling thread takes part as worker 0. Not re-entrant: a task must not call parallel_for on
// the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardwise {

class ThreadPool {
 public:
  // n_threads total including the caller; 0 = hardware concurrency.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index) once on each of the pool's threads and waits for all.
  void run_on_all(const std::function<void(int)>& fn);

  // Splits [0, n) into chunks of at least `grain` and runs fn(begin, end, thread_index) on them,
  // dynamically balanced; waits for all. Runs inline when n is small or the pool has one thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& fn);

  // Host work to overlap with the next loop: that loop (run_on_all or parallel_for, from the calling
  // thread) wakes the workers, runs `work` on the caller, then the caller's own share — the workers
  // take the chunks the caller has no time for. A pool of one thread, or a loop run inline, runs it
  // first. An exception from it is rethrown once the loop is done. `work` must not use this pool.
  void set_caller_work(std::function<void()> work);
  // Runs the caller work no loop has taken (e.g. the task started no loop), and clears it.
  void run_caller_work();

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* task_ = nullptr;
  std::function<void()> caller_work_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

// Number of hardware threads (>= 1).
int hardware_threads();

// SHARDWISE_POOL_SPIN_US read from `text`: microseconds (0 to 1000000), -1 when text is null (unset),
// -2 when malformed or out of range.
int64_t parse_pool_spin_us(const char* text);
// Throws Error for a malformed SHARDWISE_POOL_SPIN_US (the CLI calls it before any verb runs: a
// pool made later would otherwise ignore it silently).
void check_thread_pool_env();

}  // namespace shardwise

// core/thread_pool.h — a persistent pool of worker threads for data-parallel loops.
// Decode steps issue hundreds of short parallel loops per token, so dispatch must cost
// microseconds: workers spin briefly on an epoch counter (20000 pauses) before sleeping on a condition
// variable.
// A parallel_for never waits for a worker that has not started: its chunks go to whichever threads
// arrive (the caller first), and a worker that wakes late — descheduled by the host, or slow to wake
// from sleep — finds the loop done and takes nothing, so one late thread of sixteen costs a loop
// nothing rather than the time until the host runs it again. A loop waits only for the chunks taken.
// run_on_all is the exception: it runs its function once on every thread and waits for each.
// The calling thread takes part as thread 0. Not re-entrant: a task must not call parallel_for on
// the same pool, and only one thread at a time may start loops on a pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardwise {

// The most threads a pool takes (the CLI allows fewer: max_cli_threads()).
constexpr int kMaxPoolThreads = 1024;

class ThreadPool {
 public:
  // n_threads total including the caller; 0 = hardware concurrency; at most kMaxPoolThreads. spin_us: how
  // long an idle worker spins before it sleeps, in microseconds; -1 (the default) 20000 pauses. Tests that
  // must find a worker spinning, holding no lock, give it a long one. Throws Error when a thread cannot be
  // started (the threads started are stopped and joined first).
  explicit ThreadPool(int n_threads = 0, int64_t spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index) once on each of the pool's threads and waits for all (a benchmark's
  // per-thread work, a warm-up of every worker).
  void run_on_all(const std::function<void(int)>& fn);

  // Splits [0, n) into chunks of at least `grain` and runs fn(begin, end, thread_index) on them,
  // each chunk once, on whichever threads arrive to take them; waits for the chunks, not for threads
  // that never came. Runs inline when n is small or the pool has one thread. An exception from fn is
  // rethrown on the caller once every chunk is done.
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
  void stop_workers();  // wakes every worker with stop_ set and joins it
  // Opens a job to the workers (fields set by the caller beforehand), runs the caller work and
  // `share` on the caller, waits until `done_` reaches `target`, then closes the job and waits until
  // no worker is inside it. Rethrows the caller work's exception, else the job's first one.
  void run_job(int64_t target, const std::function<void()>& share);
  void take_chunks(int index);
  void record_failure();

  int n_threads_;
  int64_t spin_us_;  // -1: 20000 pauses
  std::vector<std::thread> workers_;
  // The open job: its kind and fields are written by the caller before `open_` turns true and read
  // by a worker only after it has counted itself in `inside_` and seen `open_` true; the caller closes
  // the job and waits until `inside_` is 0 before it returns, so they never change under a worker.
  const std::function<void(int)>* all_fn_ = nullptr;
  const std::function<void(int64_t, int64_t, int)>* for_fn_ = nullptr;
  int64_t for_n_ = 0, for_chunk_ = 1;
  uint64_t job_ = 0;           // numbers run_on_all jobs, so a worker runs each once
  std::exception_ptr failed_;  // under mu_
  std::function<void()> caller_work_;
  alignas(64) std::atomic<uint64_t> epoch_{0};  // bumped per job: what idle workers watch
  alignas(64) std::atomic<int64_t> next_{0};    // parallel_for: the next unclaimed index
  alignas(64) std::atomic<int64_t> done_{0};    // indices finished, or run_on_all's workers finished
  alignas(64) std::atomic<int> inside_{0};
  std::atomic<bool> open_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

// Number of hardware threads (>= 1).
int hardware_threads();
// The most threads a --threads flag may ask for: 4 x the hardware threads, at most kMaxPoolThreads
// (more only time-slices the cores: 4096 threads took 64 s for 3 tokens of a 2 MB model on 2 cores).
int max_cli_threads();

}  // namespace shardwise

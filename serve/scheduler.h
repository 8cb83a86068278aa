// serve/scheduler.h — the one model's generations: a worker thread, the only user of the StepEngine
// while it runs, takes requests from a bounded queue and runs each on a slot, sending its text and end
// through the request's Channel.
//
// A slot is one sequence of the engine's KV cache, with the tokens it holds. A request goes to the idle
// slot whose cached tokens share the longest prefix with its prompt (else the least recently used);
// the slot's cache is cut back to that prefix (StepEngine::truncate) and only the rest of the prompt is
// computed, as llama-server does. The engine runs one sequence per step today, so there is one slot and
// a request runs from prefill to its last token before the next starts. Batched execution plugs in
// here: a slot per sequence of a batched engine, and the worker's loop stepping every busy slot by one
// token per engine step instead of running one request to its end (run_one); the queue, the slots'
// prefix reuse, the channels and the HTTP side stay as they are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "executor/session/step_engine.h"
#include "serve/channel.h"
#include "serve/metrics.h"
#include "text/tokenizer.h"

namespace shardwise::serve {

struct SchedulerOptions {
  int parallel = 1;             // slots: sequences run at once (1 until the engine batches)
  int64_t queue_limit = 64;     // requests waiting for a slot beyond which submit refuses
  int64_t prefill_chunk = 512;  // prompt tokens per step (0: the whole rest of the prompt; the runtime cuts it)
  // Runs on the worker after each request, while the engine is idle (reads the device's counters).
  std::function<void()> after_request;
};

class Scheduler {
 public:
  // The engine and tokenizer must outlive the scheduler; nothing else may step the engine meanwhile.
  // Refuses parallel other than 1 (the engine runs one sequence at a time).
  Scheduler(StepEngine& engine, const Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admit { Queued, QueueFull, Stopping };
  // Queues a generation whose events go to `out` (Started when it begins, then Delta..., then Done or
  // Failed); QueueFull when queue_limit requests already wait.
  Admit submit(GenerationRequest request, std::shared_ptr<Channel> out);

  // Stops taking requests, fails those waiting (503), ends the running one at its next token, joins the
  // worker. Idempotent.
  void stop();

  // The tokens slot 0's KV cache holds now (for tests; locks out the worker while it copies).
  std::vector<int32_t> cached_tokens() const;

 private:
  struct Job {
    GenerationRequest request;
    std::shared_ptr<Channel> out;
  };
  struct Slot {
    std::vector<int32_t> cached;  // the tokens at positions 0 .. engine.n_past()-1
    uint64_t last_used = 0;
  };

  void loop();
  size_t pick_slot(const std::vector<int32_t>& prompt) const;
  void run_one(Job& job, Slot& slot);
  // Runs the generation, streaming its tokens; returns the event that ends it (none when cancelled),
  // which run_one sends once the metrics no longer count the request as running.
  std::optional<Event> generate_on(Job& job, Slot& slot, int64_t reuse);

  StepEngine& engine_;
  const Tokenizer& tok_;
  Metrics& metrics_;
  SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::vector<Slot> slots_;
  uint64_t uses_ = 0;
  std::atomic<bool> stopping_{false};  // read by the generation at every token
  std::thread worker_;
};

}  // namespace shardwise::serve

// serve/scheduler.h — the one model's generations with continuous batching: a worker thread, the only
// user of the StepEngine while it runs, takes requests from a bounded queue onto the engine's slots and
// steps every running one together, sending each one's text and end through its request's Channel.
//
// A slot is one sequence of the engine's KV cache, with the tokens it holds. A request goes to the free
// slot whose cached tokens share the longest prefix with its prompt (else the least recently used); the
// slot's cache is cut back to that prefix (StepEngine::truncate_slot) and only the rest of the prompt is
// computed, as llama-server does. Each engine step carries one new token of every decoding request and
// chunks of the prompts being read (at most prefill_chunk tokens in all, decode tokens first), so a long
// prompt never stalls the others' tokens for more than one chunk; the engine picks its plan by the
// step's total. A request joins at the next step after a slot frees, and leaves as soon as it ends.
// A prompt with images (GenerationRequest::image) steps its prompt rows as the encoder's input rows at
// their M-RoPE positions, batched with the others; its cache is reused only before its first image.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "executor/session/step_engine.h"
#include "serve/channel.h"
#include "serve/metrics.h"
#include "text/tokenizer.h"

namespace shardwise::serve {

struct SchedulerOptions {
  int parallel = 1;             // slots: sequences run at once (at most the engine's slots)
  int64_t queue_limit = 64;     // requests waiting for a slot beyond which submit refuses
  int64_t prefill_chunk = 512;  // new tokens per step, all sequences together (0: whole prompts)
  // Runs on the worker after each request ends, between steps (reads the device's counters).
  std::function<void()> after_request;
  // A new VRAM budget for the model (change_budget): re-plans and sets the engine up anew (the old one is
  // gone), returns what it did as JSON; throws Error when it cannot (the engine then is the old budget's,
  // set up again). Null: the budget is fixed (a CPU run). `engine` gives the engine to step from then on.
  std::function<nlohmann::json(uint64_t bytes)> change_budget;
  std::function<StepEngine&()> engine;
};

class Scheduler {
 public:
  // The engine and tokenizer must outlive the scheduler; nothing else may step the engine meanwhile.
  // Refuses a parallel outside 1 .. engine.slots().
  Scheduler(StepEngine& engine, const Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admit { Queued, QueueFull, Stopping };
  // Queues a generation whose events go to `out` (Started when it begins, then Delta..., then Done or
  // Failed); QueueFull when queue_limit requests already wait.
  Admit submit(GenerationRequest request, std::shared_ptr<Channel> out);

  // A new VRAM budget, applied by the worker between two steps: the running requests pause, and go on
  // once their caches are computed again on the new engine (their tokens are the ones they would have
  // had). Its report (JSON: the change's and the pause's times, the device peak) comes through `out` as a
  // Done event whose text is the JSON, or a Failed one (400: the budget cannot be planned or allocated).
  // Stopping when the scheduler stops; false (nothing queued) when the budget is fixed.
  bool can_change_budget() const { return static_cast<bool>(options_.change_budget); }
  Admit change_budget(uint64_t bytes, std::shared_ptr<Channel> out);

  // Stops taking requests, fails those waiting (503), ends the running ones at their next step, joins
  // the worker. Idempotent.
  void stop();

  // The tokens a slot's KV cache holds now (for tests; locks out the worker while it copies).
  std::vector<int32_t> cached_tokens(int slot = 0) const;

 private:
  struct Job {
    GenerationRequest request;
    std::shared_ptr<Channel> out;
  };
  struct Running;  // a request on a slot (scheduler.cpp)
  struct Slot {
    std::vector<int32_t> cached;  // the tokens at the slot's positions 0 .. engine.n_past_of(slot)-1
    uint64_t last_used = 0;
    std::unique_ptr<Running> run;  // the request running on it, if any
  };

  struct BudgetJob {
    uint64_t bytes = 0;
    std::shared_ptr<Channel> out;
  };

  void loop();
  void apply_budget(const BudgetJob& job);
  // Steps each running request's cached tokens into the (new, empty) engine; returns the tokens stepped.
  int64_t refill(const std::vector<std::vector<int32_t>>& held);
  // Moves queued requests onto free slots; false when nothing runs and the scheduler stops.
  bool admit();
  size_t pick_slot(const std::vector<int32_t>& prompt) const;
  void start(Job job, size_t slot);
  // One engine step of every running request; ends those that finish.
  void step_all();
  // The step of `n` rows of the slot's request from row `from` (its history's `tokens`): for a prompt with
  // images, the prompt rows' input rows and M-RoPE positions, or the generated rows' positions (row +
  // delta, held by the request until the step ran); n is cut so that the rows are all of one kind.
  SeqStep rows_step(size_t slot, const int32_t* tokens, int64_t from, int64_t n);
  // After a step: the request's prompt progress, or its next token sampled and sent.
  void advance(size_t slot, int64_t n, const float* logits);
  // Ends a request: `last` goes to its client once the metrics no longer count it (none when cancelled).
  void finish(size_t slot, std::optional<Event> last);
  void fail_request(size_t slot, const std::exception& e);
  // Ends the running requests that were cancelled, timed out or stopped (checked before each step).
  void end_stopped();
  // Sends what the request's text held back, counts the request as answered; its Done event.
  Event done_event(Running& r);
  size_t busy() const;  // slots running a request

  StepEngine* engine_;
  const Tokenizer& tok_;
  Metrics& metrics_;
  SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::deque<BudgetJob> budget_jobs_;
  std::vector<Slot> slots_;
  uint64_t uses_ = 0;
  size_t prefill_turn_ = 0;    // the slot whose prompt goes first when prompts share a step's tokens
  std::vector<float> logits_;  // a step's logits, a row per sequence
  std::atomic<bool> stopping_{false};
  std::thread worker_;
};

}  // namespace shardwise::serve

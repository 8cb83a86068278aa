// serve/scheduler.cpp — see scheduler.h.
#include "serve/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "executor/session/generator.h"
#include "text/text_stream.h"

namespace shardwise::serve {
namespace {

Event failed(int status, const char* type, const char* code, const std::string& message) {
  Event e;
  e.kind = Event::Kind::Failed;
  e.error = {status, type, code, message};
  return e;
}

Event shutting_down() {
  return failed(503, "unavailable_error", "shutting_down", "the server is shutting down");
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

Scheduler::Scheduler(StepEngine& engine, const Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options)
    : engine_(engine), tok_(tokenizer), metrics_(metrics), options_(std::move(options)) {
  SW_CHECK(options_.parallel == 1, "--parallel ", options_.parallel,
           ": batched execution of several sequences is not implemented yet (give --parallel 1)");
  SW_CHECK(options_.queue_limit >= 0, "--queue-limit ", options_.queue_limit, " is negative");
  slots_.resize(static_cast<size_t>(options_.parallel));
  // Whatever the engine holds is unknown to us: start from an empty cache.
  engine_.truncate(0);
  worker_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

Scheduler::Admit Scheduler::submit(GenerationRequest request, std::shared_ptr<Channel> out) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Admit::Stopping;
    if (static_cast<int64_t>(queue_.size()) >= options_.queue_limit) return Admit::QueueFull;
    queue_.push_back({std::move(request), std::move(out)});
    metrics_.queued = static_cast<int64_t>(queue_.size());
    ++metrics_.requests;
  }
  wake_.notify_one();
  return Admit::Queued;
}

void Scheduler::stop() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    metrics_.queued = 0;
  }
  wake_.notify_all();
  for (Job& j : dropped) j.out->push(shutting_down());
  if (worker_.joinable()) worker_.join();
}

std::vector<int32_t> Scheduler::cached_tokens() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_[0].cached;
}

void Scheduler::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      metrics_.queued = static_cast<int64_t>(queue_.size());
    }
    try {
      run_one(job, slots_[pick_slot(job.request.prompt)]);
      if (options_.after_request) options_.after_request();
    } catch (const std::exception& e) {  // out of memory while reporting: the next request may fare better
      log_warn("serve: ", e.what());
    }
  }
}

size_t Scheduler::pick_slot(const std::vector<int32_t>& prompt) const {
  size_t best = 0, best_prefix = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const size_t p = common_prefix(slots_[i].cached, prompt);
    if (p > best_prefix || (p == best_prefix && slots_[i].last_used < slots_[best].last_used)) {
      best = i;
      best_prefix = p;
    }
  }
  return best;
}

void Scheduler::run_one(Job& job, Slot& slot) {
  const GenerationRequest& rq = job.request;
  if (job.out->cancelled()) {  // the client left while it waited
    ++metrics_.requests_cancelled;
    return;
  }
  if (rq.deadline && Clock::now() >= *rq.deadline) {
    ++metrics_.requests_timed_out;
    job.out->push(failed(503, "unavailable_error", "timeout",
                         "the request waited in the queue past its --timeout without starting"));
    return;
  }
  // The prefix this prompt shares with the slot's cache, less its last token: that one is always
  // computed, for the logits it gives.
  int64_t reuse = 0;
  if (rq.cache_prompt)
    reuse = std::min<int64_t>(static_cast<int64_t>(common_prefix(slot.cached, rq.prompt)),
                              static_cast<int64_t>(rq.prompt.size()) - 1);
  slot.last_used = ++uses_;
  ++metrics_.in_flight;
  metrics_.batch_size = 1;
  std::optional<Event> last;
  try {
    last = generate_on(job, slot, reuse);
  } catch (const std::exception& e) {
    // The cache may hold part of a step: forget it all.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot.cached.clear();
    }
    try {
      engine_.truncate(0);
    } catch (const std::exception&) {
    }
    ++metrics_.requests_failed;
    log_warn("serve: a generation failed: ", e.what());
    last = failed(500, "server_error", "internal_error", e.what());
  }
  // The request stops counting as running before its client can read the end (and then /metrics).
  metrics_.batch_size = 0;
  --metrics_.in_flight;
  if (last) job.out->push(std::move(*last));
}

std::optional<Event> Scheduler::generate_on(Job& job, Slot& slot, int64_t reuse) {
  const GenerationRequest& rq = job.request;
  Channel& out = *job.out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    engine_.truncate(reuse);
    slot.cached.resize(static_cast<size_t>(reuse));
  }
  Event started;
  started.kind = Event::Kind::Started;
  out.push(std::move(started));
  GenerateOptions go;
  go.n_predict = rq.max_tokens;
  go.prefill_chunk = options_.prefill_chunk;
  go.sampling = rq.sampling;
  go.cached_prompt = reuse;
  if (!rq.ignore_eos) go.stop_ids = tok_.eog_ids();
  tok::TextStream stream(rq.stop);
  bool timed_out = false;
  go.stop_requested = [&] {
    if (rq.deadline && Clock::now() >= *rq.deadline) timed_out = true;
    return stream.stopped() || out.cancelled() || timed_out || stopping_;
  };
  const auto on_token = [&](int32_t id) {
    Event e;
    e.tokens.push_back(id);
    if (rq.ignore_eos || !tok_.is_eog(id)) e.text = stream.push(tok_.piece(id));  // the end token is not text
    out.push(std::move(e));
  };
  const GenerateResult r = generate(engine_, rq.prompt, go, on_token);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot.cached = rq.prompt;
    slot.cached.insert(slot.cached.end(), r.generated.begin(), r.generated.end());
    slot.cached.resize(static_cast<size_t>(engine_.n_past()));  // the last token sampled was never stepped
  }
  metrics_.prompt_tokens += static_cast<uint64_t>(r.n_prompt);
  metrics_.cached_prompt_tokens += static_cast<uint64_t>(r.n_cached);
  metrics_.generated_tokens += r.generated.size();
  if (out.cancelled()) {
    ++metrics_.requests_cancelled;
    return std::nullopt;
  }
  if (stopping_) {
    ++metrics_.requests_failed;
    return shutting_down();
  }
  Event tail;
  tail.text = stream.finish();
  if (!tail.text.empty()) out.push(std::move(tail));
  const bool eog = !rq.ignore_eos && !r.generated.empty() && tok_.is_eog(r.generated.back());
  Event done;
  done.kind = Event::Kind::Done;
  done.finish = stream.stopped() || eog ? Finish::Stop : Finish::Length;
  done.timed_out = timed_out && done.finish == Finish::Length;
  done.usage = {r.n_prompt, r.n_cached, static_cast<int64_t>(r.generated.size()), r.ttft_ms, r.decode_tokens_per_s};
  metrics_.last_tokens_per_s = r.decode_tokens_per_s;
  ++metrics_.requests_done;
  if (done.timed_out) ++metrics_.requests_timed_out;
  return done;
}

}  // namespace shardwise::serve

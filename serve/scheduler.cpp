// serve/scheduler.cpp — see scheduler.h.
#include "serve/scheduler.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "executor/session/sampling.h"
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

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// A request on a slot: its prompt read so far, its sampler and text, the tokens it generated.
struct Scheduler::Running {
  Running(Job j, int64_t reuse)
      : job(std::move(j)),
        sampler(job.request.sampling),
        stream(job.request.stop),
        history(job.request.prompt),
        next_prompt(reuse),
        cached(reuse),
        t0(Clock::now()) {}
  bool prefilling() const { return next_prompt < static_cast<int64_t>(job.request.prompt.size()); }

  Job job;
  Sampler sampler;
  tok::TextStream stream;
  std::vector<int32_t> history;  // prompt, then the generated tokens
  std::vector<int32_t> generated;
  int64_t next_prompt = 0;    // the first prompt token not yet in the cache
  int64_t cached = 0;         // prompt tokens whose KV was reused
  int32_t next = -1;          // the last token sampled: the next step's input
  std::vector<int64_t> pos3;  // a prompt with images: the M-RoPE positions of the generated rows stepped
  bool timed_out = false;
  Clock::time_point t0, first;
  double ttft_ms = 0;
};

Scheduler::Scheduler(StepEngine& engine, const Tokenizer& tokenizer, Metrics& metrics, SchedulerOptions options)
    : engine_(&engine), tok_(tokenizer), metrics_(metrics), options_(std::move(options)) {
  SW_CHECK(!options_.change_budget || options_.engine, "serve: a budget change needs the engine's getter");
  SW_CHECK(options_.parallel >= 1 && options_.parallel <= engine_->slots(), "--parallel ", options_.parallel,
           " is out of range: 1 to the engine's ", engine_->slots(), " slots");
  SW_CHECK(options_.queue_limit >= 0, "--queue-limit ", options_.queue_limit, " is negative");
  slots_.resize(static_cast<size_t>(options_.parallel));
  // Whatever the engine holds is unknown to us: start from empty caches.
  for (int s = 0; s < options_.parallel; ++s) engine_->truncate_slot(s, 0);
  logits_.resize(static_cast<size_t>(options_.parallel) * static_cast<size_t>(engine_->spec().vocab_size));
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

Scheduler::Admit Scheduler::change_budget(uint64_t bytes, std::shared_ptr<Channel> out) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Admit::Stopping;
    if (!options_.change_budget) return Admit::QueueFull;
    budget_jobs_.push_back({bytes, std::move(out)});
  }
  wake_.notify_one();
  return Admit::Queued;
}

void Scheduler::stop() {
  std::deque<Job> dropped;
  std::deque<BudgetJob> budgets;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    dropped.swap(queue_);
    budgets.swap(budget_jobs_);
    metrics_.queued = 0;
  }
  wake_.notify_all();
  metrics_.requests_failed += dropped.size();  // admitted, ended by the shutdown
  for (Job& j : dropped) j.out->push(shutting_down());
  for (BudgetJob& b : budgets) b.out->push(shutting_down());
  if (worker_.joinable()) worker_.join();
}

std::vector<int32_t> Scheduler::cached_tokens(int slot) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_.at(static_cast<size_t>(slot)).cached;
}

size_t Scheduler::busy() const {
  size_t n = 0;
  for (const Slot& s : slots_) n += s.run != nullptr;
  return n;
}

void Scheduler::loop() {
  while (admit()) {
    try {
      for (;;) {  // budget changes first: between two steps, the running requests paused
        std::optional<BudgetJob> b;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (budget_jobs_.empty() || stopping_) break;
          b = std::move(budget_jobs_.front());
          budget_jobs_.pop_front();
        }
        apply_budget(*b);
      }
      step_all();
    } catch (const std::exception& e) {  // out of memory while reporting: the next step may fare better
      log_warn("serve: ", e.what());
    }
  }
}

void Scheduler::apply_budget(const BudgetJob& job) {
  const auto t0 = Clock::now();
  // What each running request's cache holds, to compute again on the new engine.
  std::vector<std::vector<int32_t>> held(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i)
    if (const Running* r = slots_[i].run.get())
      held[i].assign(r->history.begin(), r->history.begin() + engine_->n_past_of(static_cast<int>(i)));
  nlohmann::json report;
  std::string error;
  try {
    report = options_.change_budget(job.bytes);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // A new engine (or the old budget's set up again) has empty caches; one the change never replaced (it
  // could not even be planned) holds them still.
  engine_ = &options_.engine();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const size_t had = slots_[i].run ? held[i].size() : slots_[i].cached.size();
    if (static_cast<size_t>(engine_->n_past_of(static_cast<int>(i))) == had) {
      held[i].clear();
      continue;
    }
    engine_->truncate_slot(static_cast<int>(i), 0);
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[i].cached.clear();
  }
  const auto t1 = Clock::now();
  const int64_t refilled = refill(held);
  report["pause_ms"] = ms_between(t0, Clock::now());
  report["refill_ms"] = ms_between(t1, Clock::now());
  report["refilled_tokens"] = refilled;
  report["running_requests"] = busy();
  try {  // the device's new counters, in /metrics before the change is answered
    if (options_.after_request) options_.after_request();
  } catch (const std::exception& e) {
    log_warn("serve: ", e.what());
  }
  if (!error.empty()) {
    job.out->push(failed(400, "invalid_request_error", "invalid_value", error));
    return;
  }
  Event done;
  done.kind = Event::Kind::Done;
  done.text = report.dump();
  job.out->push(std::move(done));
}

int64_t Scheduler::refill(const std::vector<std::vector<int32_t>>& held) {
  const int64_t chunk = options_.prefill_chunk > 0 ? options_.prefill_chunk : std::numeric_limits<int64_t>::max();
  const int64_t V = engine_->spec().vocab_size;
  std::vector<size_t> at(held.size(), 0);
  int64_t total = 0;
  for (;;) {
    std::vector<SeqStep> seqs;
    int64_t used = 0;
    for (size_t i = 0; i < held.size() && used < chunk; ++i) {
      const int64_t rest = static_cast<int64_t>(held[i].size() - at[i]);
      if (rest <= 0 || !slots_[i].run) continue;
      SeqStep q = rows_step(i, held[i].data() + at[i], static_cast<int64_t>(at[i]), std::min(rest, chunk - used));
      q.logits = logits_.data() + seqs.size() * static_cast<size_t>(V);
      seqs.push_back(q);
      used += q.n;
    }
    if (seqs.empty()) return total;
    try {
      engine_->step_batch(seqs);
    } catch (const std::exception& e) {
      for (const SeqStep& q : seqs) fail_request(static_cast<size_t>(q.slot), e);
      continue;
    }
    for (const SeqStep& q : seqs) at[static_cast<size_t>(q.slot)] += static_cast<size_t>(q.n);
    total += used;
  }
}

bool Scheduler::admit() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || busy() > 0 || !budget_jobs_.empty(); });
  if (stopping_) return busy() > 0;  // the next step ends the running ones
  while (!queue_.empty() && busy() < slots_.size()) {
    Job job = std::move(queue_.front());
    queue_.pop_front();
    metrics_.queued = static_cast<int64_t>(queue_.size());
    const size_t slot = pick_slot(job.request.prompt);
    lock.unlock();
    start(std::move(job), slot);
    lock.lock();
  }
  return true;
}

size_t Scheduler::pick_slot(const std::vector<int32_t>& prompt) const {
  size_t best = slots_.size(), best_prefix = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].run) continue;
    const size_t p = common_prefix(slots_[i].cached, prompt);
    if (best == slots_.size() || p > best_prefix ||
        (p == best_prefix && slots_[i].last_used < slots_[best].last_used)) {
      best = i;
      best_prefix = p;
    }
  }
  SW_CHECK(best < slots_.size(), "serve: no free slot");
  return best;
}

void Scheduler::start(Job job, size_t slot) {
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
  Slot& s = slots_[slot];
  // The prefix this prompt shares with the slot's cache, less its last token: that one is always
  // computed, for the logits it gives.
  int64_t reuse = 0;
  if (rq.cache_prompt)
    reuse = std::min<int64_t>(static_cast<int64_t>(common_prefix(s.cached, rq.prompt)),
                              static_cast<int64_t>(rq.prompt.size()) - 1);
  if (rq.image) reuse = std::min(reuse, rq.image->first_image_row);
  s.last_used = ++uses_;
  engine_->truncate_slot(static_cast<int>(slot), reuse);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.cached.resize(static_cast<size_t>(reuse));
  }
  Event started;
  started.kind = Event::Kind::Started;
  job.out->push(std::move(started));
  s.run = std::make_unique<Running>(std::move(job), reuse);
  ++metrics_.in_flight;
}

void Scheduler::end_stopped() {
  const auto now = Clock::now();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Running* r = slots_[i].run.get();
    if (!r) continue;
    if (r->job.out->cancelled()) {
      ++metrics_.requests_cancelled;
      finish(i, std::nullopt);
    } else if (stopping_) {
      ++metrics_.requests_failed;
      finish(i, shutting_down());
    } else if (r->job.request.deadline && now >= *r->job.request.deadline) {
      r->timed_out = true;
      finish(i, done_event(*r));
    }
  }
}

void Scheduler::step_all() {
  end_stopped();
  // Decode tokens first (one per generating request), then prompt chunks in turn within the budget.
  const int64_t budget = options_.prefill_chunk > 0 ? options_.prefill_chunk : std::numeric_limits<int64_t>::max();
  const int64_t V = engine_->spec().vocab_size;
  std::vector<SeqStep> seqs;
  int64_t used = 0;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].run && !slots_[i].run->prefilling()) {
      seqs.push_back(rows_step(i, &slots_[i].run->next, engine_->n_past_of(static_cast<int>(i)), 1));
      ++used;
    }
  for (size_t k = 0; k < slots_.size(); ++k) {
    const size_t i = (prefill_turn_ + k) % slots_.size();
    Running* r = slots_[i].run.get();
    if (!r || !r->prefilling()) continue;
    const int64_t rest = static_cast<int64_t>(r->job.request.prompt.size()) - r->next_prompt;
    int64_t take = std::min(rest, budget - used);
    if (take <= 0 && seqs.empty()) take = std::min(rest, budget);
    if (take <= 0) continue;
    seqs.push_back(rows_step(i, r->job.request.prompt.data() + r->next_prompt, r->next_prompt, take));
    used += take;
  }
  prefill_turn_ = (prefill_turn_ + 1) % slots_.size();
  if (seqs.empty()) return;
  for (size_t k = 0; k < seqs.size(); ++k) seqs[k].logits = logits_.data() + k * static_cast<size_t>(V);
  metrics_.batch_size = static_cast<int64_t>(seqs.size());
  try {
    engine_->step_batch(seqs);
  } catch (const std::exception& e) {  // the caches may hold part of the step: its sequences start over
    for (const SeqStep& q : seqs) fail_request(static_cast<size_t>(q.slot), e);
    return;
  }
  for (size_t k = 0; k < seqs.size(); ++k) advance(static_cast<size_t>(seqs[k].slot), seqs[k].n, seqs[k].logits);
}

SeqStep Scheduler::rows_step(size_t slot, const int32_t* tokens, int64_t from, int64_t n) {
  SeqStep q{static_cast<int>(slot), tokens, n, nullptr};
  Running& r = *slots_[slot].run;
  const ImagePrompt* im = r.job.request.image.get();
  if (!im) return q;
  const int64_t prompt = static_cast<int64_t>(r.job.request.prompt.size());
  if (from < prompt) {
    const size_t H = static_cast<size_t>(engine_->spec().hidden_size);
    q.n = std::min(n, prompt - from);
    q.embeddings = im->embeddings.data() + static_cast<size_t>(from) * H;
    q.rope_pos3 = im->pos3.data() + 3 * static_cast<size_t>(from);
    return q;
  }
  r.pos3.resize(static_cast<size_t>(3 * n));
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < 3; ++k) r.pos3[static_cast<size_t>(3 * t + k)] = from + t + im->delta;
  q.rope_pos3 = r.pos3.data();
  return q;
}

void Scheduler::advance(size_t slot, int64_t n, const float* logits) {
  Running& r = *slots_[slot].run;
  if (r.prefilling()) {
    r.next_prompt += n;
    if (r.prefilling()) return;
  }
  try {
    const int64_t V = engine_->spec().vocab_size;
    const int64_t bad = first_non_finite(logits, V);
    if (bad >= 0)
      fail("token id ", bad, " has logit ", logits[bad], " at position ",
           engine_->n_past_of(static_cast<int>(slot)) - 1, ": the model's weights or activations are not finite");
    const int32_t id = r.sampler.sample(logits, V, r.history);
    if (r.generated.empty()) {
      r.first = Clock::now();
      r.ttft_ms = ms_between(r.t0, r.first);
    }
    r.generated.push_back(id);
    r.history.push_back(id);
    r.next = id;
    const GenerationRequest& rq = r.job.request;
    Event e;
    e.tokens.push_back(id);
    if (rq.ignore_eos || !tok_.is_eog(id)) e.text = r.stream.push(tok_.piece(id));  // the end token is not text
    r.job.out->push(std::move(e));
    const bool eog = !rq.ignore_eos && tok_.is_eog(id);
    if (static_cast<int64_t>(r.generated.size()) >= rq.max_tokens || eog || r.stream.stopped())
      finish(slot, done_event(r));
  } catch (const std::exception& e) {
    fail_request(slot, e);
  }
}

Event Scheduler::done_event(Running& r) {
  const GenerationRequest& rq = r.job.request;
  Event tail;
  tail.text = r.stream.finish();
  if (!tail.text.empty()) r.job.out->push(std::move(tail));
  const bool eog = !rq.ignore_eos && !r.generated.empty() && tok_.is_eog(r.generated.back());
  const double decode_ms = r.generated.size() > 1 ? ms_between(r.first, Clock::now()) : 0;
  const double tps = decode_ms > 0 ? 1000.0 * static_cast<double>(r.generated.size() - 1) / decode_ms : 0;
  Event done;
  done.kind = Event::Kind::Done;
  done.finish = r.stream.stopped() || eog ? Finish::Stop : Finish::Length;
  done.timed_out = r.timed_out && done.finish == Finish::Length;
  done.usage = {static_cast<int64_t>(rq.prompt.size()), r.cached, static_cast<int64_t>(r.generated.size()), r.ttft_ms,
                tps};
  metrics_.last_tokens_per_s = tps;
  ++metrics_.requests_done;
  if (done.timed_out) ++metrics_.requests_timed_out;
  return done;
}

void Scheduler::fail_request(size_t slot, const std::exception& e) {
  try {
    engine_->truncate_slot(static_cast<int>(slot), 0);  // the cache may hold part of a step: forget it all
  } catch (const std::exception&) {
  }
  ++metrics_.requests_failed;
  log_warn("serve: a generation failed: ", e.what());
  finish(slot, failed(500, "server_error", "internal_error", e.what()));
}

void Scheduler::finish(size_t slot, std::optional<Event> last) {
  Slot& s = slots_[slot];
  const Running& r = *s.run;
  metrics_.prompt_tokens += r.job.request.prompt.size();
  metrics_.cached_prompt_tokens += static_cast<uint64_t>(r.cached);
  metrics_.generated_tokens += r.generated.size();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The tokens stepped: the history's prefix the cache holds (the last token sampled never was).
    s.cached = r.history;
    s.cached.resize(std::min(s.cached.size(), static_cast<size_t>(engine_->n_past_of(static_cast<int>(slot)))));
    // Rows from the first image on match no later prompt (ids that match nothing): another image has the
    // same placeholder ids, and the rows after an image sit at other positions.
    if (const ImagePrompt* im = r.job.request.image.get())
      std::fill(s.cached.begin() + std::min<int64_t>(im->first_image_row, static_cast<int64_t>(s.cached.size())),
                s.cached.end(), -1);
  }
  const std::shared_ptr<Channel> out = r.job.out;
  s.run.reset();
  // The request stops counting as running before its client can read the end (and then /metrics).
  --metrics_.in_flight;
  if (busy() == 0) metrics_.batch_size = 0;
  if (last) out->push(std::move(*last));
  try {
    if (options_.after_request) options_.after_request();
  } catch (const std::exception& e) {
    log_warn("serve: ", e.what());
  }
}

}  // namespace shardwise::serve

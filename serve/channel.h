// serve/channel.h — what passes between the HTTP side and the scheduler's worker: a generation asked
// for (typed, tokenised, checked), the events it produces (started, new text, done, failed), and the
// thread-safe channel that carries them from the worker to the one consumer that waits for them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "executor/session/sampling.h"

namespace shardwise::serve {

using Clock = std::chrono::steady_clock;

// An error as the API reports it: the HTTP status and OpenAI's {"error": {message, type, code}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
  std::string message;
};

// Stop: an end-of-generation token or a stop string ended it. Length: max_tokens, the context, or
// the request's --timeout ended it (the text is cut short).
enum class Finish { Stop, Length };
const char* finish_name(Finish f);  // "stop", "length"

// A prompt with images, as the language model takes it (vision/vl_prompt.h's VlInput): each prompt row's
// input row (the encoder's at image tokens, the embedding table's elsewhere) and M-RoPE position; the
// generated tokens' positions are row + delta (all three).
struct ImagePrompt {
  std::vector<float> embeddings;  // [prompt, hidden]
  std::vector<int64_t> pos3;      // [prompt, 3]: temporal, height, width
  int64_t delta = 0;
  // The first image token's row. Different images share the placeholder's ids, so a slot's cache is
  // reused only before it (and a later prompt reuses none of this one's rows from it on).
  int64_t first_image_row = 0;
};

// One generation, as the scheduler runs it: every value already checked.
struct GenerationRequest {
  std::vector<int32_t> prompt;               // at least one token, each in the vocabulary; fits the context
  std::shared_ptr<const ImagePrompt> image;  // null: a text prompt
  int64_t max_tokens = 1;                    // at least 1; prompt + max_tokens - 1 fits the context
  SamplingParams sampling;
  std::vector<std::string> stop;              // the text ends before the first of these to appear
  bool ignore_eos = false;                    // generate past end-of-generation tokens
  bool cache_prompt = true;                   // may reuse the KV cache of the prefix shared with the previous request
  std::optional<Clock::time_point> deadline;  // --timeout, counted from the request's arrival
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, those whose KV was reused (not computed again)
  int64_t completion_tokens = 0;
  double ttft_ms = 0;              // from the start of the generation to its first token
  double decode_tokens_per_s = 0;  // after the first token
};

struct Event {
  enum class Kind { Started, Delta, Done, Failed };
  Kind kind = Kind::Delta;
  std::string text;                // Delta: text to add (valid UTF-8; may be empty while tokens are held back)
  std::vector<int32_t> tokens;     // Delta: the ids generated since the last event
  Finish finish = Finish::Length;  // Done
  bool timed_out = false;          // Done: the request's deadline ended it
  Usage usage;                     // Done
  ApiError error;                  // Failed
};

// From the worker (one producer) to one consumer. Consecutive deltas not yet taken merge into one,
// so a slow consumer holds at most a few events, however many tokens come.
class Channel {
 public:
  // `on_ready` runs on the producer's thread after each push (it must not block: it wakes the consumer).
  explicit Channel(std::function<void()> on_ready = {}) : on_ready_(std::move(on_ready)) {}

  void push(Event e);
  // Everything pushed since the last take, in order.
  std::vector<Event> take();
  // As take, waiting up to `timeout` for an event when none is there.
  std::vector<Event> wait_take(Clock::duration timeout);

  // The consumer is gone (the client disconnected): the worker stops the generation at its next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Event> events_;
  std::function<void()> on_ready_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace shardwise::serve

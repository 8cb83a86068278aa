// tests/unit/serve/serve_test_util.h — what the serve tests share: a small synthetic model with a byte
// vocabulary (its greedy tokens depend on the whole context, unlike the tied-embedding tiny specs, which
// repeat the last token), reference generations computed without the server, an engine the tests can hold
// at a gate or slow down, and a client that speaks to an in-process server.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/weight_source.h"
#include "engine/run_setup.h"
#include "executor/model/cpu_model.h"
#include "executor/session/generator.h"
#include "executor/session/step_engine.h"
#include "serve/http_client.h"
#include "serve/server.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"

namespace shardwise::test::serve {

using nlohmann::json;
using namespace shardwise::serve;

// "synthetic:<spec.yaml>?seed=1": a 2-layer llama shape, vocabulary of 384 (bytes and ids that decode to
// nothing), untied output, 4096 positions.
std::string model_name();

// The model loaded once for the whole test binary, with a tokenizer: engines for the server come from
// `served`, reference generations run on `reference` (its own thread pool: never two users of one pool).
struct TestModel {
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<LoadedModel> served, reference;
  ChatFormat chat_format = ChatFormat::Mistral;
};
TestModel& test_model();

// The model as the server describes it, for a KV capacity of `context` tokens.
ServedModel served_model(int64_t context, int64_t n_predict = -1);

// What `run` does for a prompt: tokens from text (BOS per the model, control tokens parsed), and the
// chat template for one user message.
std::vector<int32_t> completion_prompt(const std::string& text);
std::vector<int32_t> chat_prompt(const std::string& user);

// The tokens and text of a generation without the server: a fresh CPU engine, `run`'s prefill chunk.
struct Reference {
  std::vector<int32_t> tokens;
  std::string text;
  bool ended_by_eog = false;
};
Reference reference_generation(const std::vector<int32_t>& prompt, int64_t n, const SamplingParams& sampling,
                               bool ignore_eos = false, int64_t context = 4096);
SamplingParams greedy();
// A generation of n tokens (ignore_eos: all of them) from `text` as a completion prompt.
GenerationRequest generation(const std::string& text, int64_t n, const SamplingParams& sampling);

// The run set-up as a budget control (what `serve` gives its server on a device): the change's budgets
// and device peak as JSON.
class SetupBudget : public BudgetControl {
 public:
  explicit SetupBudget(RunSetup& s) : s_(s) {}
  json change_budget(uint64_t bytes) override;
  StepEngine& engine() override { return s_.engine(); }
  Runtime* runtime() override { return s_.runtime(); }

 private:
  RunSetup& s_;
};

// A StepEngine that forwards to another, and can hold every step at a gate or slow each one down.
class GatedEngine : public StepEngine {
 public:
  explicit GatedEngine(StepEngine& inner) : inner_(inner) {}
  const ModelSpec& spec() const override { return inner_.spec(); }
  int slots() const override { return inner_.slots(); }
  int64_t n_past_of(int slot) const override { return inner_.n_past_of(slot); }
  int64_t capacity() const override { return inner_.capacity(); }
  std::string device() const override { return inner_.device(); }
  void truncate_slot(int slot, int64_t n) override { inner_.truncate_slot(slot, n); }
  void step_batch(const std::vector<SeqStep>& seqs) override;
  std::atomic<int64_t> max_batch{0};  // the most sequences one step has run

  void close_gate();
  void open_gate();
  std::atomic<int64_t> steps{0};
  std::atomic<int> delay_us{0};
  std::atomic<int> waiting{0};  // steps held at the gate now

 private:
  StepEngine& inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = true;
};

// A request sent from a thread of its own (a client that waits while the test goes on); its status once
// joined. Destroying it opens the engine's gate first, so that a failed check never leaves it blocked.
class BackgroundRequest {
 public:
  BackgroundRequest(const std::string& url, const std::string& body, GatedEngine* gate = nullptr);
  ~BackgroundRequest();
  int status();  // joins

 private:
  GatedEngine* gate_;
  std::atomic<int> status_{0};
  std::thread thread_;
};

// A server on 127.0.0.1, a free port, with its own engine; and a client for it.
struct TestServer {
  explicit TestServer(ServerOptions options = {}, int64_t context = 4096, int64_t n_predict = -1);
  TestServer(StepEngine& engine, ServerOptions options, int64_t context, Runtime* runtime = nullptr);
  TestServer(StepEngine& engine, ServedModel model, ServerOptions options);
  ~TestServer();

  struct Reply {
    int status = 0;
    json body;  // null when the body is not JSON
    std::string text;
    std::map<std::string, std::string> headers;
  };
  Reply get(const std::string& path, const HttpClient::Headers& h = {});
  Reply post(const std::string& path, const json& body, const HttpClient::Headers& h = {});
  Reply post_raw(const std::string& path, const std::string& body, const HttpClient::Headers& h = {});
  Reply send(const std::string& method, const std::string& path, const std::string& body,
             const HttpClient::Headers& h = {});

  // A streamed request: every data payload, parsed (the final "[DONE]" as the string "[DONE]").
  struct Streamed {
    int status = 0;
    std::vector<json> events;
    json error_body;  // a response that was not a stream
  };
  Streamed stream(const std::string& path, const json& body, const HttpClient::Headers& h = {});

  double metric(const std::string& name);  // a sample of GET /metrics; -1 when absent

  std::unique_ptr<CpuEngine> own_engine;
  std::unique_ptr<Server> server;
  std::unique_ptr<HttpClient> client;
};

// A server whose CPU engine steps through a GatedEngine the test holds or slows down.
struct GatedServer {
  explicit GatedServer(const ServerOptions& options = {}, int64_t context = 4096);
  CpuEngine cpu;
  GatedEngine gate;
  TestServer s;
};

// A sample of Prometheus text (`name` with its labels, as the line begins: shardwise_slots,
// shardwise_requests_rejected_total{code="400"}); -1 when absent.
double metric_sample(const std::string& prometheus_text, const std::string& name);

// Text of a streamed chat or completion: the deltas' content (or text), concatenated.
std::string streamed_text(const std::vector<json>& events);

// Raw bytes to 127.0.0.1:port, then everything the server sends until it closes the connection.
std::string raw_http(uint16_t port, const std::string& bytes);
// Raw bytes to 127.0.0.1:port; the connection closes, unread, once `until` holds (or after 10 s).
void send_and_hang_up(uint16_t port, const std::string& bytes, const std::function<bool()>& until);

// `shardwise ARGS...` started with its stdout on a pipe and its stderr to a file (err_path); killed at the
// end if still there.
struct Child {
  explicit Child(const std::vector<std::string>& args);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  std::string line();  // the next line of stdout ("" at its end)
  int wait_exit();     // the exit status, or minus the signal that ended it
  pid_t pid = -1;
  int out = -1;
  std::string err_path;
};

// What a channel brought: its tokens, whether it ended (a Done event's text: a budget report) or
// failed (with the status).
struct Collected {
  std::vector<int32_t> tokens;
  bool done = false, failed = false;
  std::string text;
  int status = 0;
};
// Takes what `c` has now (waiting up to `wait`), adding to `into`.
void collect(Channel& c, Collected& into, std::chrono::milliseconds wait);
// Collects until the channel ends (at most two minutes).
Collected finish(Channel& c, Collected got = {});

// Waits up to `seconds` for `cond`; whether it held.
bool eventually(const std::function<bool()>& cond, double seconds = 10);

}  // namespace shardwise::test::serve

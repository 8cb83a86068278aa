// A CI-sized soak of `shardwise serve` on the emulated device with 4 slots: for about 20 s, client
// threads send a mix of completions and chats, whole and streamed, greedy, seeded and sampled, some
// invalid, some closed midway (a stream after its first event, a request before its answer), while
// another thread changes the VRAM budget over POST /admin/budget and watches /metrics. Every greedy and
// seeded answer is compared with a lone reference generation. Then: the metrics account for every request
// exactly once and agree with what the clients saw, no slot stays busy and each slot's cache matches its
// engine, the arena never outgrew the budget, and the process's memory is flat between the end of a
// warm-up third and the end. $SHARDWISE_SOAK_SECONDS sets a longer soak by hand.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "serve_test_util.h"

// The heap's live bytes: the sanitizers' allocators count them (ASan can also drop its quarantine of
// freed blocks first); glibc's mallinfo2 otherwise.
#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__SANITIZE_THREAD__)
#define SOAK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#elif __has_feature(thread_sanitizer)
#define SOAK_TSAN 1
#endif
#endif
#if defined(SOAK_ASAN) || defined(SOAK_TSAN)
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#ifdef SOAK_ASAN
extern "C" void __sanitizer_purge_allocator();
#endif
#elif defined(__GLIBC__)
#include <malloc.h>
#endif

using namespace shardwise;
using namespace shardwise::test::serve;

namespace {

constexpr double kLoadSeconds = 20;  // of mixed load, in all
constexpr int kClients = 6;
constexpr int kSlots = 4;
constexpr int64_t kQueueLimit = 4;  // small: the clients and the requests hung up fill it at times (429)
constexpr int64_t kMaxTokens = 24;
constexpr uint64_t kSmallBudget = 32ull << 20, kLargeBudget = 64ull << 20;
constexpr auto kBudgetEvery = std::chrono::seconds(2);
constexpr auto kWatchEvery = std::chrono::milliseconds(100);
// Growth allowed between the two memory samples (both taken idle, at the large budget).
constexpr int64_t kRssGrowth = 64ll << 20, kHeapGrowth = 16ll << 20;

using Rng = std::mt19937;

double load_seconds() {
  const char* env = std::getenv("SHARDWISE_SOAK_SECONDS");
  return env && std::atof(env) > 0 ? std::atof(env) : kLoadSeconds;
}

// The prompts are pieces of this text: requests share prefixes with what the slots hold, so prefix reuse
// (cutting a slot's cache back) happens all the time.
const std::string kText =
    "The river ran past the old mill, under three bridges and along the ferry line, through a town whose "
    "clocks all told a different time. Nobody minded: the baker opened when the bread was ready, the school "
    "bell rang when the teacher woke, and the ferry left when it was full. Visitors found it maddening for "
    "a day, then restful for a week, and some of them never left at all. The mill wheel turned on, slow and "
    "patient, counting the water as it went by, one bucket at a time, until the evening fog came down.";

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temp = 0.9f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.seed = seed;
  return p;
}

// A prompt whose answers are checked, with its lone reference of kMaxTokens tokens: a request for n
// tokens gets the first n (all of them when an end-of-generation token came first).
struct Checked {
  std::string text;
  bool chat = false;
  uint64_t seed = 0;        // 0: greedy; else sampled with this seed
  bool ignore_eos = false;  // the model ends every chat at once: chats and seeded ones go on past the end
  int64_t prompt_tokens = 0;
  std::vector<int32_t> tokens;
  bool ended_by_eog = false;
  std::vector<std::string> texts;  // texts[k]: the text of the first k tokens
};

// The references, computed before the server starts (one user of the reference pool at a time).
std::vector<Checked> make_checked() {
  std::vector<Checked> out;
  auto add = [&](std::string text, bool chat, uint64_t seed) {
    Checked c;
    c.text = std::move(text);
    c.chat = chat;
    c.seed = seed;
    c.ignore_eos = chat || seed;
    out.push_back(std::move(c));
  };
  for (size_t len : {4, 17, 40, 90, 160, 260, 380})
    for (bool chat : {false, true}) add(kText.substr(0, len), chat, 0);
  for (uint64_t seed : {5, 6, 7, 8}) add(kText.substr(0, 30 + 100 * (seed - 5)), seed == 8, seed);
  const Tokenizer& tok = *test_model().tok;
  for (Checked& c : out) {
    const std::vector<int32_t> prompt = c.chat ? chat_prompt(c.text) : completion_prompt(c.text);
    c.prompt_tokens = static_cast<int64_t>(prompt.size());
    const Reference ref = reference_generation(prompt, kMaxTokens, c.seed ? seeded(c.seed) : greedy(), c.ignore_eos);
    c.tokens = ref.tokens;
    c.ended_by_eog = ref.ended_by_eog;
    for (size_t k = 0; k <= c.tokens.size(); ++k) {  // as the server (and reference_generation) writes text
      tok::TextStream stream;
      std::string text;
      for (size_t i = 0; i < k; ++i)
        if (c.ignore_eos || !tok.is_eog(c.tokens[i])) text += stream.push(tok.piece(c.tokens[i]));
      c.texts.push_back(text + stream.finish());
    }
    REQUIRE(c.texts.back() == ref.text);
  }
  return out;
}

// What one client saw, added up over the threads at the end of each phase.
struct Tally {
  int64_t http = 0;       // HTTP requests sent, any path
  int64_t ok = 0;         // generations answered 200 and read to their end
  int64_t aborted = 0;    // streams answered 200 that the client closed after their first event
  int64_t hung_up = 0;    // generations sent on a connection closed at once, unread
  int64_t full = 0;       // 429
  int64_t bad = 0;        // 400: invalid generations and a refused budget
  int64_t checked = 0;    // of ok, those compared with a reference
  int64_t ok_tokens = 0;  // the completion tokens of ok
  int64_t budget_changes = 0, budget_refused = 0, watches = 0;
  std::vector<std::string> ids;  // of every answer (ok and aborted): never one twice
  std::vector<std::string> problems;
  int64_t problem_count = 0;

  void problem(const std::string& what) {
    if (++problem_count <= 10) problems.push_back(what);
  }
  void add(const Tally& o) {
    http += o.http, ok += o.ok, aborted += o.aborted, hung_up += o.hung_up, full += o.full, bad += o.bad;
    checked += o.checked, ok_tokens += o.ok_tokens, budget_changes += o.budget_changes;
    budget_refused += o.budget_refused, watches += o.watches;
    ids.insert(ids.end(), o.ids.begin(), o.ids.end());
    for (const std::string& p : o.problems) problem(p);
    problem_count += o.problem_count - static_cast<int64_t>(o.problems.size());
  }
};

// An answer, whole or streamed.
struct Answer {
  std::string id, text, finish;
  std::vector<int32_t> tokens;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // its usage
  int finishes = 0;                                    // choices with a finish_reason
  bool done = false;                                   // whole, or a stream's [DONE] came
  bool aborted = false;                                // the client closed the stream after its first event
  int status = 0;
  json error;  // a response that was not an answer
};

Answer whole_answer(const json& body, bool chat) {
  Answer a;
  a.id = body.at("id").get<std::string>();
  const json& c = body.at("choices").at(0);
  a.text = (chat ? c.at("message").at("content") : c.at("text")).get<std::string>();
  if (c.contains("tokens")) a.tokens = c["tokens"].get<std::vector<int32_t>>();
  a.finish = c.at("finish_reason").get<std::string>();
  a.finishes = 1;
  a.prompt_tokens = body.at("usage").at("prompt_tokens").get<int64_t>();
  a.completion_tokens = body.at("usage").at("completion_tokens").get<int64_t>();
  a.done = true;
  return a;
}

// Adds one data event of a stream to `a`; what is wrong with it, if anything.
std::string add_event(const std::string& data, bool chat, Answer& a) {
  if (a.done) return "an event after [DONE]: " + data;
  if (data == "[DONE]") {
    a.done = true;
    return "";
  }
  const json e = json::parse(data);
  if (e.contains("error")) return "an error event: " + data;
  const std::string id = e.at("id").get<std::string>();
  if (a.id.empty()) a.id = id;
  if (id != a.id) return "two ids in one stream: " + a.id + ", " + id;
  if (e.contains("usage") && !e["usage"].is_null()) {
    a.prompt_tokens = e["usage"].at("prompt_tokens").get<int64_t>();
    a.completion_tokens = e["usage"].at("completion_tokens").get<int64_t>();
  }
  for (const json& c : e.at("choices")) {
    if (chat && c.at("delta").contains("content")) a.text += c["delta"]["content"].get<std::string>();
    if (!chat) a.text += c.at("text").get<std::string>();
    if (c.contains("tokens"))
      for (int32_t t : c["tokens"].get<std::vector<int32_t>>()) a.tokens.push_back(t);
    if (!c.at("finish_reason").is_null()) {
      ++a.finishes;
      a.finish = c["finish_reason"].get<std::string>();
    }
  }
  return "";
}

// One generation request; `abort`: streamed, and closed after its first event.
Answer exchange(HttpClient& client, Tally& t, bool chat, json body, bool stream, bool abort = false) {
  const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
  ++t.http;
  if (!stream && !abort) {
    const HttpResponse r = client.request("POST", path, body.dump());
    Answer a;
    if (r.status == 200)
      a = whole_answer(json::parse(r.body), chat);
    else
      a.error = json::parse(r.body, nullptr, false);
    a.status = r.status;
    return a;
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Answer a;
  const HttpResponse r = client.stream(path, body.dump(), {}, [&](const std::string& data) {
    const std::string wrong = add_event(data, chat, a);
    if (!wrong.empty()) t.problem(wrong);
    return !abort;
  });
  a.status = r.status;
  a.aborted = r.aborted;
  if (r.status != 200) a.error = json::parse(r.body, nullptr, false);
  return a;
}

// Counts an answer's outcome; true for a 200 read to its end (whose text the caller may check).
bool count(const Answer& a, Tally& t, bool abort, const std::string& what) {
  if (a.status == 429) {
    if (!a.error.is_object() || a.error["error"]["code"] != "queue_full")
      t.problem(what + ": a 429 without queue_full");
    ++t.full;
    return false;
  }
  if (a.status != 200) {
    t.problem(what + ": status " + std::to_string(a.status) + " " + a.error.dump());
    return false;
  }
  t.ids.push_back(a.id);
  if (abort) {
    ++t.aborted;
    if (!a.aborted) t.problem(what + ": the stream did not close at its first event");
    return false;
  }
  ++t.ok;
  t.ok_tokens += std::max<int64_t>(a.completion_tokens, 0);
  if (!a.done || a.finishes != 1 || (a.finish != "stop" && a.finish != "length") ||
      a.completion_tokens != static_cast<int64_t>(a.tokens.size()))
    t.problem(what + ": an answer without one end, or with usage unlike its tokens (" + a.finish + ", " +
              std::to_string(a.finishes) + " finishes, " + std::to_string(a.tokens.size()) + " tokens)");
  return true;
}

// The shared state of a soak: the server's address, the references, the budget now.
struct Soak {
  std::string url;
  uint16_t port = 0;
  std::vector<Checked> checked;
  uint64_t budget = kLargeBudget;  // the admin thread's while a phase runs, the test's between phases
  size_t budget_turn = 0;
};

// A request for the first n tokens of a checked prompt.
json body_of(const Checked& c, int64_t n) {
  json body = {{"max_tokens", n}, {"return_tokens", true}};
  if (c.chat)
    body["messages"] = {{{"role", "user"}, {"content", c.text}}};
  else
    body["prompt"] = c.text;
  if (c.seed)
    body.update({{"temperature", 0.9}, {"top_k", 50}, {"top_p", 0.9}, {"seed", c.seed}});
  else
    body["temperature"] = 0;
  if (c.ignore_eos) body["ignore_eos"] = true;
  return body;
}

// A checked request, greedy or seeded, whole or streamed: the reference's first n tokens, text and end.
void checked_request(const Soak& soak, HttpClient& client, Rng& rng, Tally& t, bool stream) {
  const Checked& c = soak.checked[rng() % soak.checked.size()];
  const int64_t n = 1 + static_cast<int64_t>(rng() % kMaxTokens);
  json body = body_of(c, n);
  if (rng() % 8 == 0) body["cache_prompt"] = false;
  const std::string what = body.dump();
  const Answer a = exchange(client, t, c.chat, body, stream);
  if (!count(a, t, false, what)) return;
  ++t.checked;
  const size_t k = std::min(static_cast<size_t>(n), c.tokens.size());
  const std::vector<int32_t> want(c.tokens.begin(), c.tokens.begin() + static_cast<int64_t>(k));
  const char* finish = c.ended_by_eog && k == c.tokens.size() ? "stop" : "length";
  std::string wrong;
  if (a.tokens != want) wrong += " tokens differ from the reference;";
  if (a.text != c.texts[k]) wrong += " text '" + a.text + "', not '" + c.texts[k] + "';";
  if (a.finish != finish) wrong += " finish_reason " + a.finish + ";";
  if (a.prompt_tokens != c.prompt_tokens) wrong += " prompt_tokens " + std::to_string(a.prompt_tokens) + ";";
  if (!wrong.empty()) t.problem(std::string(stream ? "streamed " : "whole ") + what + ":" + wrong);
}

// A random piece of the text, sampled without a seed, sometimes with a stop string: only its shape is checked.
void unchecked_request(HttpClient& client, Rng& rng, Tally& t) {
  const bool chat = rng() % 2, stream = rng() % 2;
  const size_t from = rng() % 200, len = 1 + rng() % 300;
  const int64_t n = 1 + static_cast<int64_t>(rng() % kMaxTokens);
  json body = {{"max_tokens", n}, {"temperature", 0.6 + 0.1 * (rng() % 8)}, {"return_tokens", true}};
  if (chat)
    body["messages"] = {{{"role", "user"}, {"content", kText.substr(from, len)}}};
  else
    body["prompt"] = kText.substr(from, len);
  if (rng() % 4 == 0) body["stop"] = "e";
  const std::string what = body.dump();
  const Answer a = exchange(client, t, chat, body, stream);
  if (count(a, t, false, what) && a.completion_tokens > n)
    t.problem(what + ": " + std::to_string(a.completion_tokens) + " tokens");
}

// A long generation whose client goes: a stream closed after its first event, or a whole request whose
// connection closes as soon as it is sent. The server cancels it (or finishes it first).
void abandoned_request(const Soak& soak, HttpClient& client, Rng& rng, Tally& t, bool stream) {
  const bool chat = stream && rng() % 2;
  const std::string prompt = kText.substr(0, 1 + rng() % 120);
  json body = {{"max_tokens", 64 + rng() % 192}, {"ignore_eos", true}, {"temperature", rng() % 2 ? 0.0 : 0.8}};
  if (chat)
    body["messages"] = {{{"role", "user"}, {"content", prompt}}};
  else
    body["prompt"] = prompt;
  if (stream) {
    count(exchange(client, t, chat, body, true, true), t, true, "aborted " + body.dump());
    return;
  }
  const std::string text = body.dump();
  ++t.http;
  ++t.hung_up;
  send_and_hang_up(soak.port,
                   "POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(text.size()) + "\r\n\r\n" + text,
                   [] { return true; });
}

// An invalid generation: bad JSON, a field of the wrong type, a prompt longer than a slot (400 each).
void invalid_request(HttpClient& client, Rng& rng, Tally& t) {
  const std::string bodies[] = {R"({"prompt": "cut short)", R"({"prompt": "Hi", "max_tokens": "many"})",
                                json{{"prompt", kText + kText}, {"max_tokens", 4}}.dump()};
  const std::string& body = bodies[rng() % 3];
  ++t.http;
  const HttpResponse r = client.request("POST", rng() % 2 ? "/v1/completions" : "/v1/chat/completions", body);
  const json e = json::parse(r.body, nullptr, false);
  if (r.status == 400 && e.is_object() && e["error"]["code"].is_string())
    ++t.bad;
  else
    t.problem("invalid " + body.substr(0, 40) + ": status " + std::to_string(r.status) + " " + r.body);
}

void info_request(HttpClient& client, Tally& t, const std::string& path) {
  ++t.http;
  const HttpResponse r = client.request("GET", path);
  if (r.status != 200) t.problem("GET " + path + ": status " + std::to_string(r.status));
}

// One client's mix until `until`; never throws (Catch's checks are the test thread's).
Tally run_client(const Soak& soak, uint32_t seed, Clock::time_point until) {
  Tally t;
  Rng rng(seed);
  HttpClient client(parse_url(soak.url), 60);
  while (Clock::now() < until) {
    const unsigned pick = rng() % 100;
    try {
      if (pick < 25)
        checked_request(soak, client, rng, t, false);
      else if (pick < 40)
        checked_request(soak, client, rng, t, true);
      else if (pick < 55)
        unchecked_request(client, rng, t);
      else if (pick < 77)
        abandoned_request(soak, client, rng, t, pick < 67);
      else if (pick < 90)
        invalid_request(client, rng, t);
      else
        info_request(client, t, pick < 95 ? "/health" : "/v1/models");
    } catch (const std::exception& e) {
      t.problem(std::string("a request failed: ") + e.what());
      client.close();
    }
  }
  return t;
}

// Prometheus text: each sample's name (with its labels) and value.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

// GET /metrics while the load runs: what must hold at every moment.
void watch_metrics(HttpClient& client, Tally& t) {
  ++t.http;
  ++t.watches;
  std::map<std::string, double> m = samples(client.request("GET", "/metrics").body);
  const double arena = m["shardwise_vram_arena_bytes"], peak = m["shardwise_vram_arena_peak_bytes"];
  std::ostringstream wrong;
  if (arena != kSmallBudget && arena != kLargeBudget) wrong << " arena " << arena;
  if (peak > arena || m["shardwise_device_peak_bytes"] > arena) wrong << " peak " << peak << " over the arena";
  if (m["shardwise_requests_in_flight"] < 0 || m["shardwise_requests_in_flight"] > kSlots)
    wrong << " in flight " << m["shardwise_requests_in_flight"];
  if (m["shardwise_requests_queued"] < 0 || m["shardwise_requests_queued"] > kQueueLimit)
    wrong << " queued " << m["shardwise_requests_queued"];
  if (m["shardwise_batch_size"] < 0 || m["shardwise_batch_size"] > kSlots)
    wrong << " batch " << m["shardwise_batch_size"];
  if (m["shardwise_requests_failed_total"] != 0) wrong << " failed " << m["shardwise_requests_failed_total"];
  if (!wrong.str().empty()) t.problem("/metrics:" + wrong.str());
}

// POST /admin/budget: `bytes` 0 for a value the server must refuse (400).
void set_budget(Soak& soak, HttpClient& client, Tally& t, const std::string& value, uint64_t bytes) {
  ++t.http;
  const HttpResponse r = client.request("POST", "/admin/budget", json{{"vram_budget", value}}.dump());
  const json body = json::parse(r.body, nullptr, false);
  if (bytes == 0) {
    if (r.status == 400 && body.is_object() && body["error"]["code"] == "invalid_value") {
      ++t.bad;
      ++t.budget_refused;
    } else {
      t.problem("budget " + value + " was not refused: " + r.body);
    }
    return;
  }
  if (r.status != 200 || !body.is_object() || body["vram_budget_bytes"] != bytes ||
      body["previous_vram_budget_bytes"] != soak.budget || !body["device_peak_bytes"].is_number() ||
      body["device_peak_bytes"].get<uint64_t>() > bytes)
    return t.problem("budget " + value + ": " + std::to_string(r.status) + " " + r.body);
  soak.budget = bytes;
  ++t.budget_changes;
}

// The admin: watches /metrics and changes the budget every kBudgetEvery, in turn to 32M, 8M (under the
// API's least, refused) and 64M.
Tally run_admin(Soak& soak, Clock::time_point until) {
  static const std::pair<const char*, uint64_t> turns[] = {{"32M", kSmallBudget}, {"8M", 0}, {"64M", kLargeBudget}};
  Tally t;
  HttpClient client(parse_url(soak.url), 60);
  auto next = Clock::now() + kBudgetEvery / 2;  // turns at 1, 3, 5, ... s of each phase
  while (Clock::now() < until) {
    try {
      watch_metrics(client, t);
      if (Clock::now() >= next) {
        const auto& turn = turns[soak.budget_turn++ % 3];
        set_budget(soak, client, t, turn.first, turn.second);
        next = Clock::now() + kBudgetEvery;
      }
    } catch (const std::exception& e) {
      t.problem(std::string("the admin's request failed: ") + e.what());
      client.close();
    }
    std::this_thread::sleep_for(kWatchEvery);
  }
  return t;
}

// kClients clients and the admin for `seconds`; their tallies added to `total`.
void run_phase(Soak& soak, double seconds, uint32_t seed, Tally& total) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<Tally> tallies(kClients + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] { tallies[i] = run_client(soak, seed + static_cast<uint32_t>(i), until); });
  threads.emplace_back([&] { tallies[kClients] = run_admin(soak, until); });
  for (std::thread& th : threads) th.join();
  for (const Tally& t : tallies) total.add(t);
}

// After a phase: the budget back to the large one (the memory samples compare like with like), then
// until the server has read every request sent (a hung-up one may still wait to be read) and nothing
// runs or waits.
void settle(TestServer& s, Soak& soak, Tally& total) {
  if (soak.budget != kLargeBudget) set_budget(soak, *s.client, total, "64M", kLargeBudget);
  const Metrics& m = s.server->metrics();
  const auto idle = [&] {
    return static_cast<int64_t>(m.http_requests.load()) == total.http && m.in_flight == 0 && m.queued == 0 &&
           m.requests == m.requests_done + m.requests_cancelled + m.requests_timed_out + m.requests_failed;
  };
  // Twice: a request counted as read may not have reached the scheduler yet when idle() first holds.
  eventually(idle, 30);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  eventually(idle, 30);
}

struct MemorySample {
  int64_t rss = 0, heap = 0;
};

// The process's resident memory and the heap's live bytes, after the allocator gave back what it can
// (glibc's free lists, AddressSanitizer's quarantine): the growth the samples show is live memory.
MemorySample memory_now() {
  MemorySample m;
#if defined(SOAK_ASAN) || defined(SOAK_TSAN)
#ifdef SOAK_ASAN
  __sanitizer_purge_allocator();
#endif
  m.heap = static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__)
  malloc_trim(0);
  const struct mallinfo2 info = mallinfo2();
  m.heap = static_cast<int64_t>(info.uordblks + info.hblkhd);
#endif
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  m.rss = resident * sysconf(_SC_PAGESIZE);
  return m;
}

// The rejections /metrics counts, by status.
std::map<int, int64_t> rejected(const Metrics& m) {
  std::map<int, int64_t> out;
  const std::string key = "shardwise_requests_rejected_total{code=\"";
  for (const auto& [name, value] : samples(m.prometheus()))
    if (name.compare(0, key.size(), key) == 0) out[std::stoi(name.substr(key.size()))] = static_cast<int64_t>(value);
  return out;
}

// Every request the clients sent is accounted for once, as the clients saw it.
void check_accounting(TestServer& s, const Tally& t) {
  const Metrics& m = s.server->metrics();
  std::map<int, int64_t> rej = rejected(m);
  const int64_t requests = static_cast<int64_t>(m.requests.load()), done = static_cast<int64_t>(m.requests_done),
                cancelled = static_cast<int64_t>(m.requests_cancelled);
  INFO("client: http " << t.http << ", ok " << t.ok << " (checked " << t.checked << "), aborted " << t.aborted
                       << ", hung up " << t.hung_up << ", 429 " << t.full << ", 400 " << t.bad << ", budget changes "
                       << t.budget_changes << "; server: http " << m.http_requests << ", admitted " << requests
                       << ", done " << done << ", cancelled " << cancelled << ", 429 " << rej[429] << ", 400 "
                       << rej[400]);
  std::string problems;
  for (const std::string& p : t.problems) problems += p + "\n";
  INFO(t.problem_count << " problems:\n" << problems);
  CHECK(t.problem_count == 0);
  CHECK(static_cast<int64_t>(m.http_requests.load()) == t.http);  // every request was read, none twice
  CHECK(m.in_flight == 0);
  CHECK(m.queued == 0);
  CHECK(m.batch_size == 0);
  CHECK(m.requests_failed == 0);
  CHECK(m.requests_timed_out == 0);  // no --timeout
  // Each admitted request ends once: answered, or cancelled because its client went.
  CHECK(requests == done + cancelled + static_cast<int64_t>(m.requests_timed_out + m.requests_failed));
  // Every generation sent was refused (400, 429) or admitted; each admitted one answered the client whole,
  // or was left by it. A hung-up one's 429 reached nobody: the two sides agree on the sum.
  CHECK(requests + rej[429] == t.ok + t.aborted + t.hung_up + t.full);
  CHECK(rej[429] >= t.full);
  CHECK(rej[429] <= t.full + t.hung_up);
  CHECK(rej[400] == t.bad);
  CHECK(rej.size() <= 2);  // nothing refused but 400 and 429
  CHECK(done >= t.ok);
  CHECK(cancelled <= t.aborted + t.hung_up);
  CHECK(static_cast<int64_t>(m.generated_tokens.load()) >= t.ok_tokens);
  CHECK(std::set<std::string>(t.ids.begin(), t.ids.end()).size() == t.ids.size());  // no answer twice
}

// After the soak, idle: no slot busy (in_flight 0, checked before), each slot's tokens those its engine
// holds, within a slot; the last budget's arena, never outgrown; no pinned range left behind by a change.
void check_slots_and_device(TestServer& s, RunSetup& setup, uint64_t pinned) {
  for (int slot = 0; slot < kSlots; ++slot) {
    const std::vector<int32_t> cached = s.server->scheduler().cached_tokens(slot);
    INFO("slot " << slot);
    CHECK(static_cast<int64_t>(cached.size()) <= setup.engine().capacity());
    CHECK(static_cast<int64_t>(cached.size()) == setup.engine().n_past_of(slot));
  }
  const RuntimeMemory mem = setup.runtime()->memory();
  CHECK(mem.budget_bytes == kLargeBudget);
  CHECK(mem.arena_peak_bytes <= mem.budget_bytes);
  CHECK(mem.device_peak_bytes <= mem.budget_bytes);
  CHECK(setup.device()->pinned_host_bytes() == pinned);
}

}  // namespace

TEST_CASE("serve: a soak of mixed load and budget changes on 4 slots loses no request, slot or byte", "[serve][soak]") {
  TestModel& m = test_model();
  Soak soak;
  soak.checked = make_checked();
  RunSetupOptions o;
  o.device = "emu";
  o.ctx = kSlots * 512;
  o.machine.hw = "h200-host";
  o.planner.budget_bytes = kLargeBudget;
  o.runtime.slots = kSlots;
  RunSetup setup(*m.served, o, completion_prompt("probe"));
  SetupBudget control(setup);
  const uint64_t pinned = setup.device()->pinned_host_bytes();
  ServerOptions so;
  so.parallel = kSlots;
  so.queue_limit = kQueueLimit;
  so.timeout_s = 0;
  so.prefill_chunk = 0;  // as `serve` on a device without --batch: the plan table's tiers cut the prompts
  so.budget = &control;
  TestServer s(setup.engine(), so, setup.engine().capacity(), setup.runtime());
  REQUIRE(setup.engine().capacity() == 512);
  soak.url = s.server->url();
  soak.port = s.server->port();

  // A warm-up third, then the rest; memory sampled idle after each.
  const double seconds = load_seconds();
  Tally total;
  run_phase(soak, seconds / 3, 1000, total);
  settle(s, soak, total);
  const MemorySample warm = memory_now();
  check_accounting(s, total);
  run_phase(soak, seconds * 2 / 3, 2000, total);
  settle(s, soak, total);
  const MemorySample end = memory_now();
  check_accounting(s, total);
  CHECK(total.checked > 0);
  CHECK(total.aborted + total.hung_up > 0);
  if (seconds >= kLoadSeconds) {  // at least a turn of 32M, 8M and 64M in each phase
    CHECK(total.budget_changes >= 4);
    CHECK(total.budget_refused >= 2);
  }
  WARN("soak: " << total.ok << " answered (" << total.checked << " checked), " << total.aborted << " aborted, "
                << total.hung_up << " hung up, " << total.full << " 429, " << total.bad << " 400, "
                << total.budget_changes << " budget changes; rss " << (warm.rss >> 20) << " -> " << (end.rss >> 20)
                << " MiB, heap " << (warm.heap >> 20) << " -> " << (end.heap >> 20) << " MiB");
#ifndef SOAK_TSAN  // (ThreadSanitizer's shadow grows with every address ever touched)
  CHECK(end.rss - warm.rss < kRssGrowth);
#endif
  CHECK(end.heap - warm.heap < kHeapGrowth);

  check_slots_and_device(s, setup, pinned);
  // And the server still answers as a lone run does.
  const Checked& c = soak.checked.back();  // a seeded chat
  const auto r = s.post("/v1/chat/completions", body_of(c, kMaxTokens));
  REQUIRE(r.status == 200);
  CHECK(r.body["choices"][0]["tokens"].get<std::vector<int32_t>>() == c.tokens);
}

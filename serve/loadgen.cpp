// serve/loadgen.cpp — see loadgen.h.
#include "serve/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "serve/http_client.h"

namespace shardwise::serve {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxCount = int64_t(1) << 20;
constexpr size_t kErrorSamples = 5;

// Common English words: most are one token in the vocabularies of Llama, Mistral and Qwen models.
const char* const kWords[] = {"the",   "of",    "and",   "to",    "in",    "is",   "was",   "that",  "for",   "on",
                              "as",    "with",  "by",    "he",    "it",    "at",   "from",  "his",   "an",    "were",
                              "are",   "which", "this",  "be",    "or",    "has",  "had",   "first", "one",   "their",
                              "its",   "new",   "after", "who",   "they",  "have", "her",   "she",   "two",   "been",
                              "other", "when",  "there", "all",   "also",  "into", "time",  "would", "more",  "up",
                              "some",  "city",  "year",  "world", "water", "day",  "light", "house", "river", "music"};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t draw(const CountDist& d, std::mt19937_64& rng) {
  return d.lo == d.hi ? d.lo : std::uniform_int_distribution<int64_t>(d.lo, d.hi)(rng);
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank > 0 ? rank - 1 : 0)];
}

void fill_percentiles(std::vector<double> v, double out[3]) {
  std::sort(v.begin(), v.end());
  out[0] = percentile(v, 50);
  out[1] = percentile(v, 90);
  out[2] = percentile(v, 99);
}

// What one user measured.
struct Samples {
  std::vector<double> ttft, itl, latency;
  int64_t ok = 0, errors = 0, prompt_tokens = 0, generated = 0;
  std::vector<std::string> error_messages;
};

struct RequestPlan {
  std::string body;
  int64_t words = 0;
};

RequestPlan plan_request(const LoadgenOptions& o, int64_t index) {
  std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(index));
  RequestPlan p;
  p.words = draw(o.prompt_tokens, rng);
  json body = {{"prompt", loadgen_prompt(p.words, rng())},
               {"max_tokens", draw(o.max_tokens, rng)},
               {"stream", o.stream},
               {"ignore_eos", true}};  // llama-server's: every request generates max_tokens
  if (o.stream) body["stream_options"] = {{"include_usage", true}};
  if (!o.model.empty()) body["model"] = o.model;
  p.body = body.dump();
  return p;
}

void add_error(Samples& s, const std::string& message) {
  ++s.errors;
  if (s.error_messages.size() < kErrorSamples) s.error_messages.push_back(message);
}

// An error status's message: the API's error.message where the body has one.
std::string status_error(const HttpResponse& r) {
  const json j = json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return str_cat("HTTP ", r.status, ": ", j["error"]["message"].get<std::string>());
  return str_cat("HTTP ", r.status);
}

// Reads usage.{prompt,completion}_tokens of a response or chunk where it has them.
void read_usage(const json& j, int64_t* prompt, int64_t* completion) {
  if (!j.is_object() || !j.contains("usage") || !j["usage"].is_object()) return;
  const json& u = j["usage"];
  if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) *prompt = u["prompt_tokens"];
  if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
    *completion = u["completion_tokens"];
}

void one_streamed(HttpClient& client, const HttpClient::Headers& h, const RequestPlan& plan, Samples& s) {
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last = t0;
  int64_t chunks = 0, prompt = plan.words, completion = -1;
  std::string error;
  const HttpResponse r = client.stream("/v1/completions", plan.body, h, [&](const std::string& data) {
    if (data == "[DONE]") return true;
    const json j = json::parse(data, nullptr, false);
    if (j.is_object() && j.contains("error")) error = "error event: " + data.substr(0, 200);
    read_usage(j, &prompt, &completion);
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return true;
    const json& c = j["choices"][0];
    if (!c.contains("text") || !c["text"].is_string() || c["text"].get<std::string>().empty()) return true;
    const Clock::time_point now = Clock::now();
    (chunks == 0 ? s.ttft : s.itl).push_back(ms_between(chunks == 0 ? t0 : last, now));
    last = now;
    ++chunks;
    return true;
  });
  if (r.status != 200) return add_error(s, status_error(r));
  if (!error.empty()) return add_error(s, error);
  s.latency.push_back(ms_between(t0, Clock::now()));
  ++s.ok;
  s.prompt_tokens += prompt;
  s.generated += completion >= 0 ? completion : chunks;
}

void one_whole(HttpClient& client, const HttpClient::Headers& h, const RequestPlan& plan, Samples& s) {
  const Clock::time_point t0 = Clock::now();
  const HttpResponse r = client.request("POST", "/v1/completions", plan.body, h);
  if (r.status != 200) return add_error(s, status_error(r));
  const double ms = ms_between(t0, Clock::now());
  s.latency.push_back(ms);
  s.ttft.push_back(ms);  // nothing comes before the whole response
  int64_t prompt = plan.words, completion = 0;
  read_usage(json::parse(r.body, nullptr, false), &prompt, &completion);
  ++s.ok;
  s.prompt_tokens += prompt;
  s.generated += completion;
}

void user(const LoadgenOptions& o, std::atomic<int64_t>& next, Samples& s) {
  HttpClient client(parse_url(o.url), o.timeout_s);
  HttpClient::Headers h;
  if (!o.api_key.empty()) h.push_back({"Authorization", "Bearer " + o.api_key});
  for (int64_t i; (i = next++) < o.requests;) {
    const RequestPlan plan = plan_request(o, i);
    try {
      if (o.stream)
        one_streamed(client, h, plan, s);
      else
        one_whole(client, h, plan, s);
    } catch (const std::exception& e) {
      add_error(s, e.what());
    }
    // A fresh connection per request: some servers (llama-server after a stream) close a kept-alive
    // connection without saying so, and a POST sent on it fails; a POST is never sent twice.
    client.close();
  }
}

}  // namespace

CountDist parse_count_dist(const std::string& text, const char* flag) {
  CountDist d;
  const size_t colon = text.find(':');
  auto number = [&](const std::string& t, int64_t* v) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    *v = std::stoll(t);
    return *v >= 1 && *v <= kMaxCount;
  };
  const bool ok = colon == std::string::npos
                      ? number(text, &d.lo) && number(text, &d.hi)
                      : number(text.substr(0, colon), &d.lo) && number(text.substr(colon + 1), &d.hi) && d.lo <= d.hi;
  if (!ok) fail(flag, " '", text, "': give N or A:B (uniform in [A, B]), counts from 1 to ", kMaxCount);
  return d;
}

std::string loadgen_prompt(int64_t words, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, sizeof kWords / sizeof kWords[0] - 1);
  std::string out;
  for (int64_t i = 0; i < words; ++i) out += (i > 0 ? " " : "") + std::string(kWords[pick(rng)]);
  return out;
}

LoadgenReport run_loadgen(const LoadgenOptions& o) {
  SW_CHECK(o.users >= 1 && o.users <= 4096, "--users ", o.users, " is out of range: 1 to 4096");
  SW_CHECK(o.requests >= 1 && o.requests <= 100000000, "--requests ", o.requests, " is out of range: 1 to 100000000");
  parse_url(o.url);  // a bad URL is one error, before any user starts
  std::vector<Samples> samples(static_cast<size_t>(o.users));
  std::atomic<int64_t> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> users;
  for (int u = 0; u < o.users; ++u) users.emplace_back([&, u] { user(o, next, samples[static_cast<size_t>(u)]); });
  for (auto& t : users) t.join();
  LoadgenReport r;
  r.wall_s = ms_between(t0, Clock::now()) / 1000.0;
  Samples all;
  for (const Samples& s : samples) {
    all.ttft.insert(all.ttft.end(), s.ttft.begin(), s.ttft.end());
    all.itl.insert(all.itl.end(), s.itl.begin(), s.itl.end());
    all.latency.insert(all.latency.end(), s.latency.begin(), s.latency.end());
    r.ok += s.ok;
    r.errors += s.errors;
    r.prompt_tokens += s.prompt_tokens;
    r.generated_tokens += s.generated;
    for (const auto& m : s.error_messages)
      if (r.error_samples.size() < kErrorSamples &&
          std::find(r.error_samples.begin(), r.error_samples.end(), m) == r.error_samples.end())
        r.error_samples.push_back(m);
  }
  r.requests = r.ok + r.errors;
  r.tokens_per_s = r.wall_s > 0 ? static_cast<double>(r.generated_tokens) / r.wall_s : 0;
  fill_percentiles(all.ttft, r.ttft_ms);
  fill_percentiles(all.itl, r.itl_ms);
  fill_percentiles(all.latency, r.latency_ms);
  return r;
}

std::string format_report(const LoadgenOptions& o, const LoadgenReport& r) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "%lld requests (%lld ok, %lld errors) by %d users in %.2f s against %s\n",
                static_cast<long long>(r.requests), static_cast<long long>(r.ok), static_cast<long long>(r.errors),
                o.users, r.wall_s, o.url.c_str());
  out += buf;
  std::snprintf(buf, sizeof buf, "  generated  %lld tokens, %.1f tokens/s; prompts %lld tokens\n",
                static_cast<long long>(r.generated_tokens), r.tokens_per_s, static_cast<long long>(r.prompt_tokens));
  out += buf;
  const char* ttft = o.stream ? "TTFT ms   " : "TTFT ms (whole responses: no --stream)";
  std::snprintf(buf, sizeof buf, "  %s  p50 %.2f  p90 %.2f  p99 %.2f\n", ttft, r.ttft_ms[0], r.ttft_ms[1],
                r.ttft_ms[2]);
  out += buf;
  if (o.stream) {
    std::snprintf(buf, sizeof buf, "  ITL ms     p50 %.2f  p99 %.2f (between text chunks)\n", r.itl_ms[0], r.itl_ms[2]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "  request ms p50 %.2f  p90 %.2f  p99 %.2f\n", r.latency_ms[0], r.latency_ms[1],
                r.latency_ms[2]);
  out += buf;
  for (const auto& e : r.error_samples) out += "  error: " + e + "\n";
  return out;
}

json report_json(const LoadgenOptions& o, const LoadgenReport& r) {
  auto pct = [](const double v[3]) { return json{{"p50", v[0]}, {"p90", v[1]}, {"p99", v[2]}}; };
  return {{"url", o.url},
          {"users", o.users},
          {"stream", o.stream},
          {"requests", r.requests},
          {"ok", r.ok},
          {"errors", r.errors},
          {"error_samples", r.error_samples},
          {"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated_tokens},
          {"wall_s", r.wall_s},
          {"tokens_per_s", r.tokens_per_s},
          {"ttft_ms", pct(r.ttft_ms)},
          {"itl_ms", pct(r.itl_ms)},
          {"latency_ms", pct(r.latency_ms)}};
}

}  // namespace shardwise::serve

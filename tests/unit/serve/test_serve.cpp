// Tests for `shardwise serve` (serve/): an in-process server on a free port, spoken to over HTTP by the
// Beast client. The tokens it generates are compared with generations run without it (a fresh CPU
// engine, as `run` does it), never with copies of its own output.
#include <catch2/catch.hpp>

#include "serve_test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;

namespace {

std::vector<int32_t> ids(const json& choice) {
  return choice.at("tokens").get<std::vector<int32_t>>();
}

// The checks every whole response keeps: its shape, and usage agreeing with the tokens.
void check_whole(const TestServer::Reply& r, bool chat, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  INFO(r.text);
  REQUIRE(r.status == 200);
  const json& c = r.body.at("choices").at(0);
  CHECK(r.body.at("object") == (chat ? "chat.completion" : "text_completion"));
  const std::vector<int32_t> got = ids(c);
  const json& u = r.body.at("usage");
  CHECK(u.at("prompt_tokens") == prompt.size());
  CHECK(u.at("completion_tokens") == got.size());
  CHECK(u.at("total_tokens") == prompt.size() + got.size());
  const bool eog = !got.empty() && test_model().tok->is_eog(got.back());
  CHECK(c.at("finish_reason") == (eog ? "stop" : "length"));
  if (!eog) CHECK(static_cast<int64_t>(got.size()) == max_tokens);
}

}  // namespace

TEST_CASE("serve: completions and chat, whole and streamed, generate run's tokens and text", "[serve]") {
  TestServer s;
  const std::string text = "Hello there, how are you";
  const Reference ref = reference_generation(completion_prompt(text), 24, greedy());
  REQUIRE(ref.tokens.size() > 4);  // the model talks: the comparison means something

  const json completion = {{"prompt", text}, {"max_tokens", 24}, {"temperature", 0}, {"return_tokens", true}};
  const TestServer::Reply whole = s.post("/v1/completions", completion);
  check_whole(whole, false, completion_prompt(text), 24);
  CHECK(ids(whole.body["choices"][0]) == ref.tokens);
  CHECK(whole.body["choices"][0]["text"] == ref.text);
  CHECK(whole.body["model"] == "serve-test");

  json streamed = completion;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  streamed["model"] = "any-name";
  const TestServer::Streamed st = s.stream("/v1/completions", streamed);
  REQUIRE(st.status == 200);
  REQUIRE(st.events.size() >= 4);  // deltas, the finish chunk, the usage chunk, [DONE]
  CHECK(st.events.back() == "[DONE]");
  CHECK(streamed_text(st.events) == ref.text);
  std::vector<int32_t> streamed_ids;
  int finishes = 0;
  for (const json& e : st.events) {
    if (!e.is_object()) continue;
    CHECK(e["model"] == "any-name");
    CHECK(e["object"] == "text_completion");
    for (const json& c : e["choices"]) {
      if (c.contains("tokens"))
        for (int32_t id : ids(c)) streamed_ids.push_back(id);
      finishes += !c["finish_reason"].is_null();
    }
  }
  CHECK(streamed_ids == ref.tokens);
  CHECK(finishes == 1);
  const json& usage_chunk = st.events[st.events.size() - 2];
  CHECK(usage_chunk["choices"].empty());
  CHECK(usage_chunk["usage"]["completion_tokens"] == ref.tokens.size());

  // Chat: the messages through the model's chat template, as `run --chat` does.
  const json chat = {{"messages", {{{"role", "user"}, {"content", text}}}},
                     {"max_completion_tokens", 20},
                     {"temperature", 0},
                     {"return_tokens", true}};
  const Reference chat_ref = reference_generation(chat_prompt(text), 20, greedy());
  const TestServer::Reply chat_whole = s.post("/v1/chat/completions", chat);
  check_whole(chat_whole, true, chat_prompt(text), 20);
  CHECK(ids(chat_whole.body["choices"][0]) == chat_ref.tokens);
  CHECK(chat_whole.body["choices"][0]["message"]["role"] == "assistant");
  CHECK(chat_whole.body["choices"][0]["message"]["content"] == chat_ref.text);
  json chat_stream = chat;
  chat_stream["stream"] = true;
  const TestServer::Streamed cs = s.stream("/v1/chat/completions", chat_stream);
  REQUIRE(cs.status == 200);
  CHECK(cs.events.front()["choices"][0]["delta"]["role"] == "assistant");
  CHECK(cs.events.front()["object"] == "chat.completion.chunk");
  CHECK(streamed_text(cs.events) == chat_whole.body["choices"][0]["message"]["content"].get<std::string>());
  CHECK(cs.events.back() == "[DONE]");
}

TEST_CASE("serve: seeded sampling is repeatable and equals a direct generation with that seed", "[serve]") {
  TestServer s;
  const std::string text = "Tell me a story about a river";
  SamplingParams sp;
  sp.temp = 0.9f;
  sp.top_k = 50;
  sp.top_p = 0.9f;
  sp.seed = 1234;
  const Reference ref = reference_generation(completion_prompt(text), 16, sp, true);
  const json body = {{"prompt", text},     {"max_tokens", 16},      {"temperature", 0.9},
                     {"top_k", 50},        {"top_p", 0.9},          {"seed", 1234},
                     {"ignore_eos", true}, {"return_tokens", true}, {"cache_prompt", false}};
  const auto a = s.post("/v1/completions", body);
  REQUIRE(a.status == 200);
  CHECK(ids(a.body["choices"][0]) == ref.tokens);
  json other = body;
  other["seed"] = 99;
  const auto b = s.post("/v1/completions", other);
  CHECK(ids(b.body["choices"][0]) != ref.tokens);  // the seed matters
}

TEST_CASE("serve: prefix reuse computes only the new part of a prompt and keeps the tokens exact", "[serve]") {
  TestServer s;
  const std::string base = "The quick brown fox jumps over the lazy dog. ";
  // Each answer's cached_tokens is the prefix its prompt shares with what the slot held before it (all
  // but the prompt's last token at most).
  auto ask = [&](const json& prompt, int64_t n) {
    const std::vector<int32_t> held = s.server->scheduler().cached_tokens();
    const auto r =
        s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"return_tokens", true}});
    REQUIRE(r.status == 200);
    const std::vector<int32_t> p =
        prompt.is_string() ? completion_prompt(prompt.get<std::string>()) : prompt.get<std::vector<int32_t>>();
    size_t common = 0;
    while (common < std::min(p.size(), held.size()) && p[common] == held[common]) ++common;
    CHECK(r.body["usage"]["prompt_tokens_details"]["cached_tokens"] == std::min(common, p.size() - 1));
    return r.body;
  };
  const json a = ask(base, 12);
  const std::vector<int32_t> pa = completion_prompt(base), ga = ids(a["choices"][0]);
  CHECK(a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  CHECK(ga == reference_generation(pa, 12, greedy()).tokens);
  // The slot holds the prompt and every generated token but the last (never stepped).
  std::vector<int32_t> held = pa;
  held.insert(held.end(), ga.begin(), ga.end() - 1);
  CHECK(s.server->scheduler().cached_tokens() == held);

  // A longer prompt over the same text: everything of `base` but what its last token changes is reused.
  const std::string longer = base + "Then it ran into the forest";
  const std::vector<int32_t> pb = completion_prompt(longer);
  size_t common = 0;
  while (common < std::min(pb.size(), held.size()) && pb[common] == held[common]) ++common;
  REQUIRE(common > 10);
  const json b = ask(longer, 16);
  CHECK(b["usage"]["prompt_tokens_details"]["cached_tokens"] == common);
  CHECK(ids(b["choices"][0]) == reference_generation(pb, 16, greedy()).tokens);

  // The same prompt again: all of it but the last token is reused.
  const json again = ask(longer, 16);
  CHECK(again["usage"]["prompt_tokens_details"]["cached_tokens"] == pb.size() - 1);
  CHECK(ids(again["choices"][0]) == ids(b["choices"][0]));

  // Continuing from the generated tokens themselves (as ids): the reuse reaches into what was generated.
  std::vector<int32_t> pc = pb;
  const std::vector<int32_t> gb = ids(b["choices"][0]);
  pc.insert(pc.end(), gb.begin(), gb.end());
  pc.push_back(42);
  const json c = ask(pc, 10);
  CHECK(c["usage"]["prompt_tokens_details"]["cached_tokens"] == pb.size() + gb.size() - 1);
  CHECK(ids(c["choices"][0]) == reference_generation(pc, 10, greedy()).tokens);

  // A different prompt shares only its first tokens; cache_prompt false reuses nothing.
  const json d = ask("Zebras", 8);
  CHECK(d["usage"]["prompt_tokens_details"]["cached_tokens"] <= 2);
  CHECK(ids(d["choices"][0]) == reference_generation(completion_prompt("Zebras"), 8, greedy()).tokens);
  const auto e = s.post(
      "/v1/completions",
      {{"prompt", "Zebras"}, {"max_tokens", 8}, {"temperature", 0}, {"cache_prompt", false}, {"return_tokens", true}});
  CHECK(e.body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  CHECK(ids(e.body["choices"][0]) == ids(d["choices"][0]));
}

TEST_CASE("serve: bad requests get a 4xx JSON error and the server keeps serving", "[serve]") {
  ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o, 64);
  struct Case {
    const char* method;
    const char* path;
    std::string body;
    int status;
    const char* code;
  };
  const std::string deep = std::string(300, '[') + std::string(300, ']');
  const std::string long_prompt = json{{"prompt", std::vector<int>(65, 7)}}.dump();
  const std::vector<Case> cases = {
      {"POST", "/v1/chat/completions", "{not json", 400, "invalid_json"},
      {"POST", "/v1/chat/completions", "[1, 2]", 400, "invalid_json"},
      {"POST", "/v1/chat/completions", "{\"messages\": " + deep + "}", 400, "invalid_json"},
      {"POST", "/v1/chat/completions", "{}", 400, "missing_field"},
      {"POST", "/v1/chat/completions", R"({"messages": "hi"})", 400, "invalid_type"},
      {"POST", "/v1/chat/completions", R"({"messages": []})", 400, "invalid_value"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "tool", "content": "x"}]})", 400, "invalid_value"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "invalid_type"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "missing_field"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", 400,
       "invalid_type"},
      {"POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "model": 3})", 400,
       "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "invalid_value"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": "5"})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2.5})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "top_p": 2})", 400, "invalid_value"},
      {"POST", "/v1/completions", R"({"prompt": "x", "top_k": -1})", 400, "invalid_value"},
      {"POST", "/v1/completions", R"({"prompt": "x", "temperature": -1})", 400, "invalid_value"},
      {"POST", "/v1/completions", R"({"prompt": "x", "seed": -5})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stop": 5})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stop": ["a", 1]})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "stream_options": 1})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": "x", "n": 2})", 400, "invalid_value"},
      {"POST", "/v1/completions", R"({"max_tokens": 5})", 400, "missing_field"},
      {"POST", "/v1/completions", R"({"prompt": {"a": 1}})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": [1, "a"]})", 400, "invalid_type"},
      {"POST", "/v1/completions", R"({"prompt": [1, 100000]})", 400, "invalid_value"},
      {"POST", "/v1/completions", long_prompt, 400, "context_length_exceeded"},
      {"POST", "/v1/completions", "{\"prompt\": \"" + std::string(5000, 'a') + "\"}", 413, "body_too_large"},
      {"GET", "/v1/nothing", "", 404, "not_found"},
      {"GET", "/", "", 404, "not_found"},
      {"GET", "/v1/chat/completions", "", 405, "method_not_allowed"},
      {"POST", "/health", "{}", 405, "method_not_allowed"},
      {"DELETE", "/v1/models", "", 405, "method_not_allowed"},
  };
  for (const Case& c : cases) {
    INFO(c.method << " " << c.path << " " << c.body.substr(0, 120));
    const auto r = s.send(c.method, c.path, c.body);
    CHECK(r.status == c.status);
    REQUIRE(r.body.is_object());
    const json& e = r.body["error"];
    CHECK(e["code"] == c.code);
    CHECK(e["type"].is_string());
    CHECK(!e["message"].get<std::string>().empty());
    if (c.status == 405) CHECK(r.headers.count("allow") == 1);
  }
  // Unknown fields are ignored, as OpenAI's servers do; the server still generates.
  const auto ok = s.post(
      "/v1/completions",
      {{"prompt", "x"}, {"max_tokens", 3}, {"frequency_penalty", 0.5}, {"user", "u"}, {"logit_bias", json::object()}});
  CHECK(ok.status == 200);
  CHECK(s.metric("shardwise_requests_rejected_total{code=\"400\"}") == 28);
  CHECK(s.metric("shardwise_requests_failed_total") == 0);
}

TEST_CASE("serve: malformed HTTP and oversized headers are refused without disturbing the server", "[serve]") {
  TestServer s;
  auto raw = [&](const std::string& bytes) { return raw_http(s.server->port(), bytes); };
  CHECK_THAT(raw("GARBAGE\r\n\r\n"), Catch::Matchers::StartsWith("HTTP/1.1 400"));
  CHECK_THAT(raw("GET /health HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"),
             Catch::Matchers::StartsWith("HTTP/1.1 431"));
  // A body announced larger than the limit is refused before it is sent (Expect: 100-continue).
  CHECK_THAT(raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999\r\nExpect: 100-continue\r\n\r\n"),
             Catch::Matchers::StartsWith("HTTP/1.1 413"));
  // Expect: 100-continue with a body in the limit: the server says continue, then answers.
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const std::string reply =
      raw("POST /v1/completions HTTP/1.1\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nExpect: 100-continue\r\n\r\n" + body);
  CHECK_THAT(reply, Catch::Matchers::StartsWith("HTTP/1.1 100 Continue") && Catch::Matchers::Contains("200 OK"));
  CHECK(s.get("/health").body == json{{"status", "ok"}});
}

TEST_CASE("serve: a full queue answers 429 and the queued requests are served after", "[serve]") {
  ServerOptions o;
  o.queue_limit = 1;
  GatedServer g(o);
  GatedEngine& gated = g.gate;
  TestServer& s = g.s;
  gated.close_gate();
  const json body = {{"prompt", "Hello"}, {"max_tokens", 4}, {"temperature", 0}};
  BackgroundRequest first(s.server->url(), body.dump(), &gated);
  REQUIRE(eventually([&] { return gated.waiting.load() == 1; }));  // running, held at its first step
  BackgroundRequest second(s.server->url(), body.dump(), &gated);
  REQUIRE(eventually([&] { return s.server->metrics().queued.load() == 1; }));
  const auto third = s.post("/v1/completions", body);
  CHECK(third.status == 429);
  CHECK(third.body["error"]["code"] == "queue_full");
  CHECK(third.body["error"]["type"] == "rate_limit_error");
  CHECK(s.metric("shardwise_requests_queued") == 1);
  CHECK(s.metric("shardwise_requests_in_flight") == 1);
  CHECK(s.metric("shardwise_batch_size") == 1);
  gated.open_gate();
  CHECK(first.status() == 200);
  CHECK(second.status() == 200);
  CHECK(s.metric("shardwise_requests_rejected_total{code=\"429\"}") == 1);
  CHECK(s.metric("shardwise_requests_total") == 2);
}

TEST_CASE("serve: a client that disconnects cancels its generation and the next request is served at once", "[serve]") {
  GatedServer g;
  GatedEngine& slow = g.gate;
  TestServer& s = g.s;
  slow.delay_us = 2000;  // 2 ms a step: the whole generation would take 8 s
  const json long_one = {{"prompt", "Hello"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}};
  int deltas = 0;
  const HttpResponse r = s.client->stream("/v1/completions", long_one.dump(), {}, [&](const std::string& data) {
    return !(data.find("\"text\":\"") != std::string::npos && ++deltas >= 3);  // three deltas, then hang up
  });
  CHECK(r.aborted);
  REQUIRE(eventually([&] { return s.server->metrics().requests_cancelled.load() == 1; }, 5));
  CHECK(slow.steps.load() < 1000);
  const auto t0 = std::chrono::steady_clock::now();
  const auto next = s.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}, {"ignore_eos", true}});
  CHECK(next.status == 200);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));

  // Not streamed: the client sends the request and closes the connection without waiting.
  const double before = s.server->metrics().requests_cancelled.load();
  const std::string body = json{{"prompt", "Hello"}, {"max_tokens", 4000}, {"ignore_eos", true}}.dump();
  send_and_hang_up(
      s.server->port(),
      "POST /v1/completions HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
      [&] { return s.server->metrics().in_flight.load() == 1; });
  REQUIRE(eventually([&] { return s.server->metrics().requests_cancelled.load() == before + 1; }, 5));
  CHECK(s.metric("shardwise_requests_in_flight") == 0);
}

TEST_CASE("serve: --api-key guards every /v1 path", "[serve]") {
  ServerOptions o;
  o.api_key = "s3cret";
  TestServer s(o);
  const json body = {{"prompt", "Hi"}, {"max_tokens", 2}};
  for (const HttpClient::Headers& h : std::vector<HttpClient::Headers>{{},
                                                                       {{"Authorization", "Bearer wrong"}},
                                                                       {{"Authorization", "s3cret"}},
                                                                       {{"Authorization", "Bearer s3cre"}}}) {
    const auto r = s.post("/v1/completions", body, h);
    CHECK(r.status == 401);
    CHECK(r.body["error"]["code"] == "invalid_api_key");
    CHECK(r.body["error"]["type"] == "authentication_error");
    CHECK(r.headers.count("www-authenticate") == 1);
    CHECK(s.get("/v1/models", h).status == 401);
  }
  const HttpClient::Headers key = {{"Authorization", "Bearer s3cret"}};
  CHECK(s.post("/v1/completions", body, key).status == 200);
  CHECK(s.post("/v1/completions", body, {{"Authorization", "bearer s3cret"}}).status == 200);  // the scheme's case

  const auto models = s.get("/v1/models", key);
  CHECK(models.status == 200);
  CHECK(models.body["data"][0]["id"] == "serve-test");
  CHECK(s.get("/health").status == 200);  // health and metrics need no key
  CHECK(s.get("/metrics").status == 200);
}

TEST_CASE("serve: /metrics counts requests and tokens", "[serve]") {
  TestServer s;
  CHECK(s.metric("shardwise_requests_total") == 0);
  CHECK(s.metric("shardwise_generated_tokens_total") == 0);
  CHECK(s.metric("shardwise_vram_arena_bytes") == -1);  // a CPU run has no device: omitted, not zero
  const auto r = s.post("/v1/completions", {{"prompt", "Counting sheep"}, {"max_tokens", 9}, {"ignore_eos", true}});
  REQUIRE(r.status == 200);
  CHECK(s.metric("shardwise_requests_total") == 1);
  CHECK(s.metric("shardwise_requests_done_total") == 1);
  CHECK(s.metric("shardwise_generated_tokens_total") == 9);
  CHECK(s.metric("shardwise_prompt_tokens_total") == r.body["usage"]["prompt_tokens"].get<double>());
  CHECK(s.metric("shardwise_last_request_tokens_per_second") > 0);
  CHECK(s.metric("shardwise_requests_in_flight") == 0);
  CHECK(s.metric("shardwise_batch_size") == 0);
  CHECK(s.metric("shardwise_slots") == 1);
  CHECK(s.metric("shardwise_heap_free_bytes") >= 0);
#ifndef __SANITIZE_ADDRESS__                             // the sanitizer's allocator replaces the one the gauges read
  CHECK(s.metric("shardwise_heap_in_use_bytes") > 1e5);  // the server's own tables at least
#endif
  const double http = s.metric("shardwise_http_requests_total");
  CHECK(s.get("/nowhere").status == 404);
  CHECK(s.metric("shardwise_http_requests_total") == http + 2);  // the 404 and the previous /metrics
  CHECK(s.metric("shardwise_requests_rejected_total{code=\"404\"}") == 1);
}

TEST_CASE("serve: --timeout ends a long generation with finish_reason length, and one still queued gets 503",
          "[serve]") {
  ServerOptions o;
  o.timeout_s = 0.3;
  GatedServer g(o);
  GatedEngine& slow = g.gate;
  TestServer& s = g.s;
  slow.delay_us = 5000;
  const auto r = s.post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 1000}, {"ignore_eos", true}});
  REQUIRE(r.status == 200);
  CHECK(r.body["choices"][0]["finish_reason"] == "length");
  const int64_t n = r.body["usage"]["completion_tokens"];
  CHECK(n > 0);
  CHECK(n < 200);
  CHECK(s.metric("shardwise_requests_timed_out_total") == 1);

  slow.delay_us = 0;
  slow.close_gate();
  BackgroundRequest first(s.server->url(), json{{"prompt", "A"}, {"max_tokens", 2}}.dump(), &slow);
  REQUIRE(eventually([&] { return slow.waiting.load() == 1; }));
  BackgroundRequest second(s.server->url(), json{{"prompt", "B"}, {"max_tokens", 2}}.dump(), &slow);
  REQUIRE(eventually([&] { return s.server->metrics().queued.load() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past B's deadline while it waits
  slow.open_gate();
  CHECK(first.status() == 200);  // its deadline passed too, but it had started: it ends as soon as it can
  CHECK(second.status() == 503);
  CHECK(s.metric("shardwise_requests_rejected_total{code=\"503\"}") == 1);
}

TEST_CASE("serve: stop strings end the text before them, and -n caps max_tokens", "[serve]") {
  TestServer s({}, 4096, 6);
  const std::string text = "Hello there, how are you";
  const Reference ref = reference_generation(completion_prompt(text), 6, greedy(), true);
  // A stop string from the middle of the greedy text: the reply ends where it first appears.
  size_t at = 2;
  while (at < ref.text.size() && static_cast<unsigned char>(ref.text[at]) >= 0x80) ++at;
  REQUIRE(at < ref.text.size());
  const std::string stop = ref.text.substr(at, 1);
  const std::string expected = ref.text.substr(0, ref.text.find(stop));
  const json body = {
      {"prompt", text}, {"max_tokens", 100}, {"temperature", 0}, {"ignore_eos", true}, {"stop", {"never there", stop}}};
  const auto whole = s.post("/v1/completions", body);
  REQUIRE(whole.status == 200);
  CHECK(whole.body["choices"][0]["text"] == expected);
  CHECK(whole.body["choices"][0]["finish_reason"] == "stop");
  json streamed = body;
  streamed["stream"] = true;
  const auto st = s.stream("/v1/completions", streamed);
  CHECK(streamed_text(st.events) == expected);
  // -n 6: max_tokens 100 gives 6 tokens, as does a request without max_tokens.
  const auto capped = s.post(
      "/v1/completions",
      {{"prompt", text}, {"max_tokens", 100}, {"temperature", 0}, {"ignore_eos", true}, {"return_tokens", true}});
  CHECK(capped.body["choices"][0]["tokens"].get<std::vector<int32_t>>() == ref.tokens);
  CHECK(capped.body["choices"][0]["finish_reason"] == "length");
  const auto unasked = s.post("/v1/completions", {{"prompt", text}, {"ignore_eos", true}});
  CHECK(unasked.body["usage"]["completion_tokens"] == 6);
}

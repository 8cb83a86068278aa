// Tests for `shardwise loadgen` against an in-process server, and for the binary's `serve` verb: it
// prints the address it listens on, answers as `run` generates, and exits 0 on SIGTERM.
#include <signal.h>

#include <catch2/catch.hpp>

#include "core/error.h"
#include "serve/loadgen.h"
#include "serve_test_util.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;

TEST_CASE("loadgen: users against the in-process server, streamed and whole", "[serve][loadgen]") {
  TestServer s;
  LoadgenOptions o;
  o.url = s.server->url();
  o.users = 2;
  o.requests = 6;
  o.prompt_tokens = {8, 16};
  o.max_tokens = {5, 5};
  o.stream = true;
  o.timeout_s = 20;
  const LoadgenReport r = run_loadgen(o);
  INFO(format_report(o, r));
  CHECK(r.requests == 6);
  CHECK(r.ok == 6);
  CHECK(r.errors == 0);
  CHECK(r.generated_tokens == 30);  // ignore_eos: every request its max_tokens
  CHECK(r.prompt_tokens >= 6 * 8);  // the server's count (bytes here): more tokens than words
  CHECK(s.metric("shardwise_generated_tokens_total") == 30);
  CHECK(s.metric("shardwise_requests_total") == 6);  // each request sent once, none cancelled
  CHECK(s.metric("shardwise_requests_cancelled_total") == 0);
  CHECK(r.ttft_ms[0] > 0);
  CHECK(r.ttft_ms[0] <= r.ttft_ms[2]);
  CHECK(r.latency_ms[0] >= r.ttft_ms[0]);
  CHECK(r.tokens_per_s > 0);
  const nlohmann::json j = report_json(o, r);
  CHECK(j["ok"] == 6);
  CHECK(j["ttft_ms"]["p99"].get<double>() == r.ttft_ms[2]);

  o.stream = false;
  o.requests = 3;
  const LoadgenReport whole = run_loadgen(o);
  CHECK(whole.ok == 3);
  CHECK(whole.generated_tokens == 15);

  // Same seed, same prompts.
  CHECK(loadgen_prompt(12, 5) == loadgen_prompt(12, 5));
  CHECK(loadgen_prompt(12, 5) != loadgen_prompt(12, 6));
  CHECK_THROWS_AS(parse_count_dist("5:2", "--max-tokens"), Error);
  CHECK_THROWS_AS(parse_count_dist("0", "--max-tokens"), Error);
  CHECK(parse_count_dist("3:9", "--max-tokens").hi == 9);

  // Errors are counted, not thrown: a wrong key, and a server that is not there.
  ServerOptions keyed;
  keyed.api_key = "k";
  TestServer guarded(keyed);
  o.url = guarded.server->url();
  const LoadgenReport refused = run_loadgen(o);
  CHECK(refused.errors == 3);
  REQUIRE(!refused.error_samples.empty());
  CHECK_THAT(refused.error_samples[0], Catch::Matchers::Contains("HTTP 401"));
  const std::string gone = guarded.server->url();
  guarded.server->stop();
  o.url = gone;
  CHECK(run_loadgen(o).errors == 3);
}

TEST_CASE("serve: the binary listens on a free port, generates run's tokens and exits 0 on SIGTERM", "[serve][cli]") {
  const std::string model = model_name();
  Child c({"serve", "-m", model, "--port", "0", "-c", "512"});
  const std::string first = c.line();
  INFO("stdout: " << first << "\nstderr: " << test::read_file(c.err_path));
  REQUIRE(first.rfind("listening on http://127.0.0.1:", 0) == 0);
  HttpClient client(parse_url(first.substr(first.find("http://"))), 30);
  const std::string text = "Hello there, how are you";
  const HttpResponse r =
      client.request("POST", "/v1/completions",
                     json{{"prompt", text}, {"max_tokens", 16}, {"temperature", 0}, {"return_tokens", true}}.dump());
  REQUIRE(r.status == 200);
  const std::vector<int32_t> served = json::parse(r.body)["choices"][0]["tokens"].get<std::vector<int32_t>>();

  std::string out;
  REQUIRE(test::run_command("'" + test::shardwise_bin() + "' run -m '" + model + "' --prompt '" + text +
                                "' -n 16 --greedy --json 2>/dev/null",
                            &out) == 0);
  CHECK(served == json::parse(out)["generated_ids"].get<std::vector<int32_t>>());

  REQUIRE(kill(c.pid, SIGTERM) == 0);
  CHECK(c.wait_exit() == 0);
}

TEST_CASE("serve: a port in use is one error line before the model is read", "[serve][cli]") {
  // The port is taken by a server of this test; the model file does not exist: the error must name the
  // address, which only a check before the load reports.
  TestServer busy;
  std::string out;
  const std::string missing = test::temp_path("no_such_model.gguf");
  const int rc = test::run_command(
      "'" + test::shardwise_bin() + "' serve -m '" + missing + "' --port " + std::to_string(busy.server->port()), &out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.rfind("error: cannot listen on 127.0.0.1 port " + std::to_string(busy.server->port()), 0) == 0);
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
}

TEST_CASE("serve: the binary refuses a bad --parallel, port or limit with one error line", "[serve][cli]") {
  for (const std::string& args : {std::string("--parallel 0"), std::string("-np 300"), std::string("-np 4 -c 3"),
                                  std::string("--port 70000"), std::string("--queue-limit -1"), std::string("-n 0")}) {
    std::string out;
    const int rc = test::run_command("'" + test::shardwise_bin() + "' serve -m '" + model_name() + "' " + args, &out);
    INFO(args << ": " << out);
    CHECK(rc == 1);
    CHECK(out.rfind("error: ", 0) == 0);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    if (args.find("-np") != std::string::npos || args.find("parallel") != std::string::npos)
      CHECK_THAT(out, Catch::Matchers::Contains("--parallel") || Catch::Matchers::Contains("--ctx-size"));
  }
}

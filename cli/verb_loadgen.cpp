// cli/verb_loadgen.cpp — `shardwise loadgen`: concurrent users against an OpenAI-compatible server
// (serve/loadgen.h), printing tokens/s and latency percentiles.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "serve/loadgen.h"

namespace shardwise::cli {
namespace {

struct LoadgenArgs {
  serve::LoadgenOptions options;
  std::string prompt_tokens = "128", max_tokens = "128";
  bool json = false;
};

void run_loadgen(LoadgenArgs a) {
  a.options.prompt_tokens = serve::parse_count_dist(a.prompt_tokens, "--prompt-tokens");
  a.options.max_tokens = serve::parse_count_dist(a.max_tokens, "--max-tokens");
  if (!(a.options.timeout_s > 0 && a.options.timeout_s <= 1e6))
    fail("--timeout ", a.options.timeout_s, " is out of range: more than 0, at most 1000000 seconds");
  const serve::LoadgenReport r = serve::run_loadgen(a.options);
  if (a.json)
    print_json(serve::report_json(a.options, r));
  else
    std::fputs(serve::format_report(a.options, r).c_str(), stdout);
}

}  // namespace

void register_loadgen(CLI::App& app) {
  auto a = std::make_shared<LoadgenArgs>();
  serve::LoadgenOptions& o = a->options;
  CLI::App* sub = app.add_subcommand("loadgen",
                                     "Load an OpenAI-compatible server with concurrent completions; report tokens/s, "
                                     "TTFT and inter-token latency");
  sub->add_option("--url", o.url, "The server, http://HOST:PORT (requests go to /v1/completions)")->required();
  sub->add_option("--api-key", o.api_key, "Sent as 'Authorization: Bearer KEY'");
  sub->add_option("--model", o.model, "The \"model\" field of each request (default: none sent)");
  sub->add_option("--users", o.users, "Concurrent clients, each one request at a time (1 to 4096)")
      ->capture_default_str();
  sub->add_option("--requests", o.requests, "Requests in all, shared among the users")->capture_default_str();
  sub->add_option("--prompt-tokens", a->prompt_tokens,
                  "Prompt length per request: N or A:B (uniform), in words of a fixed list (about one token each)")
      ->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "max_tokens per request: N or A:B (ignore_eos is sent too)")
      ->capture_default_str();
  sub->add_flag("--stream", o.stream, "Stream the responses (SSE): measures TTFT and inter-token latency");
  sub->add_option("--seed", o.seed, "Seed of the prompts and lengths (same seed, same requests)")
      ->check(kUnsignedInteger)
      ->capture_default_str();
  sub->add_option("--timeout", o.timeout_s, "Seconds one read or write may wait")->capture_default_str();
  sub->add_flag("--json", a->json, "Print one JSON object instead of the table");
  sub->callback([a] { run_loadgen(*a); });
}

}  // namespace shardwise::cli

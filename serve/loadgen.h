// serve/loadgen.h — `shardwise loadgen`: N concurrent users send R completions in all to any
// OpenAI-compatible server (ours, llama-server, ...) via POST /v1/completions, and the run reports
// the generated tokens/s, time to first token and inter-token latency percentiles, and the errors.
// Prompts are words drawn from a fixed list with a fixed seed: the same run sends the same requests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardwise::serve {

// A count drawn per request: "N" (always N) or "A:B" (uniform in [A, B]).
struct CountDist {
  int64_t lo = 1, hi = 1;
};
// Throws Error naming `flag` for anything else, or counts outside 1 .. 1048576.
CountDist parse_count_dist(const std::string& text, const char* flag);

struct LoadgenOptions {
  std::string url;  // http://HOST:PORT (requests go to URL/v1/completions)
  std::string api_key;
  std::string model;  // the "model" field sent ("" sends none)
  int users = 1;
  int64_t requests = 1;
  CountDist prompt_tokens{128, 128};  // in words of the prompt list (about one token each)
  CountDist max_tokens{128, 128};
  bool stream = false;  // without it, TTFT and inter-token latency are not measured
  uint64_t seed = 1;
  double timeout_s = 600;  // per read or write
};

struct LoadgenReport {
  int64_t requests = 0, ok = 0, errors = 0;
  std::vector<std::string> error_samples;  // the first few distinct messages
  int64_t prompt_tokens = 0;               // as the server reported them (usage), else the words sent
  int64_t generated_tokens = 0;            // as the server reported them, else the text chunks received
  double wall_s = 0;
  double tokens_per_s = 0;  // generated tokens / wall time
  // Milliseconds: p50, p90, p99 (0 where nothing was measured).
  double ttft_ms[3] = {0, 0, 0};
  double itl_ms[3] = {0, 0, 0};      // inter-token latency (between text chunks)
  double latency_ms[3] = {0, 0, 0};  // whole requests
};

// A prompt of `words` words from the fixed list, drawn with `seed`.
std::string loadgen_prompt(int64_t words, uint64_t seed);

// Runs the load; connection failures and error statuses are counted as errors, never thrown.
LoadgenReport run_loadgen(const LoadgenOptions& options);

std::string format_report(const LoadgenOptions& options, const LoadgenReport& report);
nlohmann::json report_json(const LoadgenOptions& options, const LoadgenReport& report);

}  // namespace shardwise::serve

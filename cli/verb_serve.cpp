// cli/verb_serve.cpp — `shardwise serve`: the model behind an OpenAI-compatible HTTP server (serve/),
// loaded and set up exactly as `run` does it (cli/model_setup.h), until SIGINT or SIGTERM.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "engine/planning.h"
#include "serve/images.h"
#include "serve/server.h"
#include "text/chat_template.h"
#include "vision/vl_prompt.h"

namespace shardwise::cli {
namespace {

struct ServeArgs : ModelFlags {
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 1;
  std::string api_key;
  int64_t queue_limit = 64;
  double timeout_s = 600;
  int64_t n_predict = -1;
  std::string max_body = "1M";
};

constexpr int64_t kMaxQueueLimit = 1000000;
constexpr int kMaxParallel = 256;

void check_serve_args(const ServeArgs& a) {
  if (a.parallel < 1 || a.parallel > kMaxParallel)
    fail("--parallel ", a.parallel, " is out of range: 1 to ", kMaxParallel);
  if (a.port < 0 || a.port > 65535) fail("--port ", a.port, " is out of range: 0 (a free port) to 65535");
  if (a.queue_limit < 0 || a.queue_limit > kMaxQueueLimit)
    fail("--queue-limit ", a.queue_limit, " is out of range: 0 to ", kMaxQueueLimit);
  if (!(a.timeout_s >= 0) || !std::isfinite(a.timeout_s) || a.timeout_s > 1e7)
    fail("--timeout ", a.timeout_s, " is out of range: 0 (none) to 10000000 seconds");
  if (a.n_predict != -1 && (a.n_predict < 1 || a.n_predict > (1 << 24)))
    fail("-n ", a.n_predict, " is out of range: -1 (up to the context) or 1 to 16777216 tokens");
  const uint64_t body = parse_size(a.max_body, "--max-body");
  if (body < 1024 || body > (uint64_t(1) << 30)) fail("--max-body ", a.max_body, " is out of range: 1K to 1G");
}

// The id GET /v1/models gives: the file (or directory) name; a synthetic: spec as given.
std::string model_id(std::string model) {
  if (model.rfind("synthetic:", 0) == 0) return model;
  while (model.size() > 1 && model.back() == '/') model.pop_back();
  const size_t slash = model.find_last_of('/');
  return slash == std::string::npos ? model : model.substr(slash + 1);
}

// --ctx-size (shared by the slots, as llama-server's -c), or 4096 positions per slot within the model's.
int64_t serve_ctx(const ServeArgs& a, const ModelSpec& spec) {
  if (a.planner->ctx > 0) {
    if (a.planner->ctx < a.parallel)
      fail("--ctx-size ", a.planner->ctx, " is shared by --parallel ", a.parallel, " slots: give at least ", a.parallel,
           " positions");
    return a.planner->ctx;
  }
  return a.parallel * std::min<int64_t>(4096, spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096);
}

// The run set-up as the server's budget control (POST /admin/budget), on a device.
class SetupBudget : public serve::BudgetControl {
 public:
  explicit SetupBudget(RunSetup& s) : s_(s) {}
  nlohmann::json change_budget(uint64_t bytes) override {
    const BudgetChange c = s_.change_budget(bytes);
    log_info("serve: VRAM budget ", format_bytes(c.previous_bytes), " -> ", format_bytes(c.budget_bytes),
             " (planned in ", c.plan_ms, " ms, set up in ", c.setup_ms, " ms)");
    return {{"vram_budget_bytes", c.budget_bytes},
            {"previous_vram_budget_bytes", c.previous_bytes},
            {"plan_ms", c.plan_ms},
            {"setup_ms", c.setup_ms},
            {"device_peak_bytes", c.device_peak_bytes}};
  }
  StepEngine& engine() override { return s_.engine(); }
  Runtime* runtime() override { return s_.runtime(); }

 private:
  RunSetup& s_;
};

serve::ServedModel served_model(const ServeArgs& a, const ModelRun& s) {
  serve::ServedModel m;
  m.id = model_id(a.model);
  m.tokenizer = s.tok.get();
  const ChatChoice choice = choose_chat_format(s.tok->chat_template(), s.src->spec().family, *s.tok);
  log_info(choice.note);
  m.chat_format = choice.format;
  m.context = s.setup->engine().capacity();
  m.vocab_size = s.src->spec().vocab_size;
  m.n_predict = a.n_predict;
  m.created = static_cast<int64_t>(std::time(nullptr));
  const ModelSpec& spec = s.src->spec();
  if (spec.vision_tower) {  // a vision-language directory: requests may bring images
    m.images = std::make_shared<serve::ImageEncoder>(load_vl_model(a.model, spec), s.src->tensor("token_embd.weight"),
                                                     s.threads);
    log_info("serve: ", a.model, " takes images (data: URLs in chat messages), encoded on the CPU");
  }
  return m;
}

void run_serve(ServeArgs a) {
  ModelRun s;
  s.device = resolve_device(a.device);
  check_model_flags(a, s.device);
  check_serve_args(a);
  serve::check_listen_address(a.host, static_cast<uint16_t>(a.port));
  s.threads = check_model_sizes(a);
  set_wait_limit_s(a.wait_timeout_s);
  a.sequences = a.parallel;
  open_model(a, s, false);
  s.ctx = serve_ctx(a, s.src->spec());
  // No prompt yet: an MoE model's routing guess is measured on seeded tokens.
  set_up_model(a, s, s.ctx, "--ctx-size", step_tokens(16, s.src->spec().vocab_size, 1));
  serve::ServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.api_key = a.api_key;
  so.parallel = a.parallel;
  so.queue_limit = a.queue_limit;
  so.timeout_s = a.timeout_s;
  so.max_body_bytes = parse_size(a.max_body, "--max-body");
  so.prefill_chunk = prefill_chunk(a, s);
  // On a device without --batch, a step carries at most the plan table's largest tier (what the runtime
  // would cut a longer prompt into anyway), so that a long prompt holds the others' tokens one chunk.
  if (so.prefill_chunk == 0 && s.setup->runtime())
    for (const auto& t : s.setup->runtime()->table().tiers) so.prefill_chunk = std::max(so.prefill_chunk, t.tokens);
  SetupBudget budget(*s.setup);
  if (s.setup->runtime() && a.plan.empty()) so.budget = &budget;
  serve::Server server(s.setup->engine(), served_model(a, s), so, s.setup->runtime());
  server.stop_on_signals();
  server.start();
  std::printf("listening on %s\n", server.url().c_str());
  std::fflush(stdout);
  log_info("serving ", a.model, " (", s.device, ", ", a.parallel, a.parallel == 1 ? " slot" : " slots", " of ",
           server.model().context, " tokens); Ctrl-C stops");
  server.wait();
  log_info("stopping");
  server.stop();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  sub->add_option("-m,--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("--host", a->host, "Address to listen on (0.0.0.0: every interface)")->capture_default_str();
  sub->add_option("--port", a->port, "Port to listen on (0: a free one; the line printed at start names it)")
      ->capture_default_str();
  sub->add_option("--parallel", a->parallel,
                  "Requests generated at once (-np), stepped together (continuous batching); each gets a slot of "
                  "--ctx-size / N positions. More requests wait in the queue")
      ->capture_default_str();
  sub->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on every /v1 request (else 401)");
  sub->add_option("--queue-limit", a->queue_limit,
                  "Requests that may wait for the model beyond the running one; more get 429")
      ->capture_default_str();
  sub->add_option("--timeout", a->timeout_s,
                  "Seconds a request may take from its arrival (0: no limit): a generation still running then ends "
                  "with the text so far and finish_reason \"length\"; one still queued gets 503")
      ->capture_default_str();
  sub->add_option("-n,--n-predict", a->n_predict,
                  "The most tokens one request may generate (-1: up to the context); a larger max_tokens is capped "
                  "to it, not refused, and a request without max_tokens gets it")
      ->capture_default_str();
  sub->add_option("--max-body", a->max_body, "Largest request body, e.g. 1M; larger ones get 413")
      ->capture_default_str();
  add_model_flags(sub, *a, PlannerVerb::Serve);
  add_device_run_flags(sub, *a);
  sub->callback([a] { run_serve(*a); });
}

}  // namespace shardwise::cli

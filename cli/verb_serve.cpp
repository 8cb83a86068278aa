// cli/verb_serve.cpp — `shardwise serve`: the model behind an OpenAI-compatible HTTP server (serve/),
// loaded and set up exactly as `run` does it (cli/model_setup.h), until SIGINT or SIGTERM.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>

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
  std::string mmproj;         // --mmproj: llama.cpp's vision projector beside a language model GGUF
  std::string vision_budget;  // --vision-budget: the image encoder's part of the VRAM budget
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

// The run set-up as the server's budget control (POST /admin/budget), on a device: the budget it
// changes is the language model's; an image encoder's part (--vision-budget) stays set apart beside it.
class SetupBudget : public serve::BudgetControl {
 public:
  SetupBudget(RunSetup& s, uint64_t vision_bytes) : s_(s), vision_bytes_(vision_bytes) {}
  nlohmann::json change_budget(uint64_t bytes) override {
    const BudgetChange c = s_.change_budget(bytes);
    log_info("serve: ", vision_bytes_ ? "the language model's " : "", "VRAM budget ", format_bytes(c.previous_bytes),
             " -> ", format_bytes(c.budget_bytes), " (planned in ", c.plan_ms, " ms, set up in ", c.setup_ms, " ms)",
             vision_bytes_ ? "; the image encoder keeps its " + format_bytes(vision_bytes_) : "");
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
  uint64_t vision_bytes_;
};

// --vision-budget, checked before the model is read: on a device, less than the whole VRAM budget
// (computed once here: on CUDA without --vram-budget, the GPU's free memory less a reserve), whose rest
// becomes the language model's (a.lm_budget_bytes). Returns the encoder's bytes (0: not given).
uint64_t split_vision_budget(ServeArgs& a, const std::string& device) {
  if (a.vision_budget.empty()) return 0;
  const uint64_t vision = parse_vram_budget(a.vision_budget, "--vision-budget");
  if (device == "cpu") fail("--vision-budget needs a device: add --device cuda (or emu)");
  if (!a.plan.empty())
    fail("--vision-budget with --plan: the saved table fixes the language model's budget; give one of them");
  const uint64_t total = run_budget(a, device);
  if (vision >= total)
    fail("--vision-budget ", a.vision_budget, " (", format_bytes(vision), ") leaves nothing of the VRAM budget (",
         format_bytes(total), a.planner->budget.empty() ? ", the GPU's free memory less a reserve" : "",
         ") for the language model: give a smaller one");
  a.lm_budget_bytes = total - vision;
  return vision;
}

// The model's vision side where it takes images: --mmproj's projector beside a GGUF, or an HF
// directory's own tower; none for a text model (its image requests get 400).
std::optional<VlModel> serve_vision_side(const ServeArgs& a, const ModelRun& s) {
  if (a.mmproj.empty() && !s.src->spec().vision_tower) {
    if (!a.vision_budget.empty())
      fail("--vision-budget needs a vision-language model (a Qwen2.5-VL HF directory, or a GGUF with --mmproj): ",
           a.model, " takes no images");
    return std::nullopt;
  }
  if (!a.vision_budget.empty() && s.device == "cpu")  // --device auto gave a model the GPU cannot run to the CPU
    fail("--vision-budget needs a device, and ", a.model, " runs on the CPU: drop --vision-budget");
  return load_vision_side(a, s, a.mmproj);
}

// The image encoder: on a device of its own (made now, after the language model's set-up) within
// vision_bytes, else on the CPU.
std::shared_ptr<serve::ImageEncoder> image_encoder(const ServeArgs& a, const ModelRun& s, VlModel vl,
                                                   uint64_t vision_bytes) {
  const TensorView& embd = s.src->tensor("token_embd.weight");
  if (vision_bytes == 0) {
    log_info("serve: ", a.model, " takes images (data: URLs in chat messages), encoded on the CPU",
             s.device == "cpu" ? "" : " (--vision-budget SIZE encodes them on the device)");
    return std::make_shared<serve::ImageEncoder>(std::move(vl), embd, s.threads);
  }
  log_info("serve: ", a.model, " takes images (data: URLs in chat messages), encoded on the ", s.device,
           " device within --vision-budget ", format_bytes(vision_bytes),
           " (on the CPU where a request's images do not fit it); the language model has the rest of the VRAM "
           "budget, ",
           format_bytes(a.lm_budget_bytes));
  return std::make_shared<serve::ImageEncoder>(std::move(vl), embd, s.threads, make_run_device(s.device), vision_bytes);
}

serve::ServedModel served_model(const ServeArgs& a, const ModelRun& s, std::optional<VlModel> vl,
                                uint64_t vision_bytes) {
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
  if (vl) m.images = image_encoder(a, s, std::move(*vl), vision_bytes);
  return m;
}

void run_serve(ServeArgs a) {
  ModelRun s;
  s.device = resolve_device(a.device);
  check_model_flags(a, s.device);
  check_serve_args(a);
  const uint64_t vision_bytes = split_vision_budget(a, s.device);
  serve::check_listen_address(a.host, static_cast<uint16_t>(a.port));
  s.threads = check_model_sizes(a);
  set_wait_limit_s(a.wait_timeout_s);
  a.sequences = a.parallel;
  open_model(a, s, false);
  std::optional<VlModel> vl = serve_vision_side(a, s);
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
  SetupBudget budget(*s.setup, vision_bytes);
  if (s.setup->runtime() && a.plan.empty()) so.budget = &budget;
  serve::Server server(s.setup->engine(), served_model(a, s, std::move(vl), vision_bytes), so, s.setup->runtime());
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
  sub->add_option("--mmproj", a->mmproj,
                  "llama.cpp's vision projector GGUF (convert_hf_to_gguf.py --mmproj) for a Qwen2.5-VL language "
                  "model GGUF given as -m: requests may then bring images");
  sub->add_option("--vision-budget", a->vision_budget,
                  "On a device: this much of the VRAM budget (--vram-budget, or on CUDA the GPU's free memory), e.g. "
                  "1G, set apart for the image encoder, which encodes each request's images there (on the CPU where "
                  "they do not fit); the language model is planned in the rest, and POST /admin/budget changes that "
                  "part alone. Without it images are encoded on the CPU");
  add_model_flags(sub, *a, PlannerVerb::Serve);
  add_device_run_flags(sub, *a);
  sub->callback([a] { run_serve(*a); });
}

}  // namespace shardwise::cli

// cli/verb_run.cpp — `shardwise run`: generate text or tokens, on the CPU alone or through the plan
// runtime on a device (CUDA, or the emulated device) under a VRAM budget.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "cli/common.h"
#include "cli/planner_flags.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "engine/run_setup.h"
#include "executor/cuda/cuda_device.h"
#include "executor/runtime/timeline_trace.h"
#include "executor/session/generator.h"
#include "planner/planner.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"

namespace shardwise::cli {
namespace {

struct RunArgs {
  std::string model, prompt, tokens, device = "auto";
  int64_t n_predict = 32;
  int64_t batch = 0;
  bool json = false;
  SamplingParams sampling;
  std::vector<std::string> stop;  // --stop: generation ends where one appears; it is not printed
  bool chat = false, ignore_eos = false, no_display_prompt = false;
  std::string system;
  std::string plan;
  std::string timeline;             // --timeline FILE: Chrome trace of the first plan runs, measured and predicted
  std::string timeline_runs = "4";  // --timeline-runs N (the first N) or A:B (runs [A, B))
  std::string profiler_runs;        // --profiler-runs A:B: plan runs [A, B) inside the device's profiler range
  // Decode steps of device-resident plans as CUDA graphs: on by default on a device (measured on the
  // GPU machine: whole-model decode +4.5% nemo8b, +8.5% qwen30b); --no-cuda-graphs turns them off.
  bool cuda_graphs = false;               // --cuda-graphs given
  bool no_cuda_graphs = false;            // --no-cuda-graphs given
  bool no_pin_weights = false;            // --no-pin-weights
  double wait_timeout_s = 600;            // --wait-timeout
  std::shared_ptr<PlannerFlags> planner;  // --threads, --ctx, --vram-budget, --schedule, --hw, ...
};

// "\n", "\t", "\\" in --stop become newline, tab, backslash (llama.cpp's --escape).
std::string process_escapes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[i + 1];
      if (c == 'n' || c == 't' || c == 'r' || c == '\\') {
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : '\\';
        ++i;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// The flags that need a device, or each other.
void check_device_flags(const RunArgs& a, const std::string& device) {
  const PlannerFlags& f = *a.planner;
  if (!a.timeline.empty()) {  // before any work: a run that cannot write its timeline is refused
    if (device == "cpu") fail("--timeline needs a device run (--device cuda or emu): the CPU path has no plan");
    std::ofstream probe(a.timeline);
    if (!probe) fail("--timeline ", a.timeline, ": cannot write the file (check the directory and permissions)");
  }
  if (device == "cpu")
    for (const auto& gpu_flag : {std::make_pair("--vram-budget", &f.budget), std::make_pair("--plan", &a.plan)})
      if (!gpu_flag.second->empty()) fail(gpu_flag.first, " needs a device: add --device cuda (or emu)");
  if (device == "cpu" && f.schedule != "auto") fail("--schedule needs a device: add --device cuda (or emu)");
  if (device == "cpu" && a.cuda_graphs) fail("--cuda-graphs needs a device: add --device cuda (or emu)");
  if (a.cuda_graphs && a.no_cuda_graphs) fail("give one of --cuda-graphs and --no-cuda-graphs");
  if (device == "emu" && f.budget.empty() && a.plan.empty()) fail("--device emu needs --vram-budget (e.g. 1G)");
}

// Checks the flags before any work; returns the CPU threads.
int check_run_args(RunArgs& a, const std::string& device) {
  check_device_flags(a, device);
  // One line for a bad planner choice, whatever plans the run.
  parse_host_kv_attention(a.planner->host_kv_attention);
  a.planner->hits();
  if (a.prompt.empty() == a.tokens.empty()) fail("give exactly one of --prompt TEXT or --tokens IDS");
  if (a.n_predict < 0 || a.n_predict > (1 << 24)) fail("-n ", a.n_predict, " is out of range");
  check_token_flag("--ctx", a.planner->ctx);
  check_token_flag("--batch", a.batch);
  const int threads = resolve_threads(a.planner->threads);
  a.sampling.validate();
  for (auto& s : a.stop) s = process_escapes(s);
  if (a.chat && !a.tokens.empty()) fail("--chat needs the user message as --prompt TEXT, not --tokens");
  if (!a.system.empty() && !a.chat) fail("--system needs --chat");
  return threads;
}

bool parse_int(const std::string& t, int64_t* v) {
  char* e = nullptr;
  errno = 0;
  const long long x = std::strtoll(t.c_str(), &e, 10);
  if (t.empty() || errno != 0 || *e != '\0') return false;
  *v = x;
  return true;
}

// --timeline-runs: N (the first N) or A:B (runs [A, B)).
void parse_timeline_runs(const std::string& text, RuntimeOptions& ro) {
  const auto colon = text.find(':');
  int64_t first = 0, end = -1;
  const bool ok = colon == std::string::npos
                      ? parse_int(text, &end)
                      : parse_int(text.substr(0, colon), &first) && parse_int(text.substr(colon + 1), &end);
  SW_CHECK(ok && first >= 0 && end > first && end - first <= 1000 && end <= 1000000, "--timeline-runs '", text,
           "': expected N (the first N plan runs) or A:B (runs [A, B)), at most 1000 runs");
  ro.timeline_first = static_cast<int>(first);
  ro.timeline_runs = static_cast<int>(end - first);
}

// --profiler-runs A:B.
void parse_profiler_runs(const std::string& text, RuntimeOptions& ro) {
  const auto colon = text.find(':');
  int64_t first = -1, end = -1;
  const bool ok = colon != std::string::npos && parse_int(text.substr(0, colon), &first) &&
                  parse_int(text.substr(colon + 1), &end) && first >= 0 && end > first && end <= 1000000;
  SW_CHECK(ok, "--profiler-runs '", text, "': expected A:B with 0 <= A < B (plan runs [A, B), e.g. 3:5)");
  ro.profiler_runs_begin = static_cast<int>(first);
  ro.profiler_runs_end = static_cast<int>(end);
}

RuntimeOptions runtime_options(const RunArgs& a) {
  RuntimeOptions ro;
  if (const auto s = a.planner->only_schedule()) ro.schedule = *s;
  ro.pcie_cap_bytes_per_s = a.planner->pcie_cap_bytes_per_s();
  if (!a.timeline.empty()) parse_timeline_runs(a.timeline_runs, ro);
  ro.cuda_graphs = !a.no_cuda_graphs;
  ro.pin_host_weights = !a.no_pin_weights;
  if (!a.profiler_runs.empty()) parse_profiler_runs(a.profiler_runs, ro);
  return ro;
}

// --vram-budget, or on CUDA the GPU's free memory less a reserve.
uint64_t run_budget(const RunArgs& a, const std::string& device) {
  const std::string& text = a.planner->budget;
  if (!text.empty()) {
    const uint64_t budget = a.planner->budget_bytes();
    if (device == "cuda" && budget > cuda_device_info(0).total_bytes)
      log_warn("--vram-budget ", text, " is more than the GPU's ", format_bytes(cuda_device_info(0).total_bytes));
    return budget;
  }
  const CudaDeviceInfo info = cuda_device_info(0);
  const uint64_t reserve = 1ull << 30;  // context, modules and headroom
  if (info.free_bytes <= reserve) fail("the GPU has too little free memory; give --vram-budget");
  return info.free_bytes - reserve;
}

// The model's tokenizer. With --tokens a model whose vocabulary we cannot read still runs; its output
// is printed as ids (null).
std::unique_ptr<Tokenizer> run_tokenizer(const RunArgs& a, const WeightSource& src) {
  try {
    return std::make_unique<Tokenizer>(src);
  } catch (const Error& e) {
    if (a.tokens.empty()) throw;
    std::fprintf(stderr, "note: %s; printing token ids instead of text\n", e.what());
  }
  return nullptr;
}

// The prompt's tokens: --tokens as given, or --prompt (in the chat template with --chat) encoded.
std::vector<int32_t> prompt_tokens(const RunArgs& a, const ModelSpec& spec, const Tokenizer* tok) {
  std::string prompt_text = a.prompt;
  if (a.chat) {
    const ChatChoice choice = choose_chat_format(tok->chat_template(), spec.family, *tok);
    std::fprintf(stderr, "%s\n", choice.note.c_str());
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.prompt});
    prompt_text = apply_chat_template(choice.format, messages);
  }
  // Prompt text follows the model's add-BOS setting; control tokens written in it are parsed.
  std::vector<int32_t> prompt = a.tokens.empty() ? tok->encode(prompt_text, true, true) : parse_token_list(a.tokens);
  if (prompt.empty()) fail("the prompt gives no tokens (and this model adds no BOS): give a non-empty --prompt");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] >= spec.vocab_size)
      fail("--tokens: id ", prompt[i], " at position ", i, " is out of range for this model (vocabulary of ",
           spec.vocab_size, ")");
  return prompt;
}

// --ctx, or max(4096 within the model's positions, prompt + n); at least prompt + n.
int64_t run_ctx(const RunArgs& a, const ModelSpec& spec, size_t prompt_tokens) {
  const int64_t needed = static_cast<int64_t>(prompt_tokens) + a.n_predict;
  int64_t ctx = a.planner->ctx;
  if (ctx <= 0)
    ctx = std::max<int64_t>(
        needed, std::min<int64_t>(4096, spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096));
  if (ctx < needed)
    fail("--ctx ", ctx, " is too small: the prompt has ", prompt_tokens, " tokens and -n asks for ", a.n_predict,
         " more (need ", needed, ")");
  return ctx;
}

// What the engine sets up: on a device, the saved --plan table or the planner's choices.
RunSetupOptions setup_options(const RunArgs& a, const std::string& device, int64_t ctx, int64_t needed) {
  RunSetupOptions so;
  so.device = device;
  so.ctx = ctx;
  if (device == "cpu") return so;
  so.runtime = runtime_options(a);
  if (!a.plan.empty()) {
    so.table = plan_table_from_json(read_text_file(a.plan), a.plan);
    if (so.table->ctx < needed)
      fail(a.plan, ": the plan table's context (", so.table->ctx, ") is smaller than prompt + -n (", needed, ")");
    return so;
  }
  so.machine = a.planner->machine();
  so.pcie_cap_bytes_per_s = a.planner->pcie_cap_bytes_per_s();
  so.planner = a.planner->choices(0);  // the run's threads and ctx: the engine's
  so.planner.budget_bytes = run_budget(a, device);
  return so;
}

// A run: the model, its prompt, and what generated from it.
struct RunState {
  std::string device;
  int threads = 0;
  int64_t ctx = 0;
  double load_ms = 0;
  std::unique_ptr<WeightSource> src;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> prompt;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<RunSetup> setup;
};

// Opens the model, reads the prompt and sets the run up (planned on a device).
void load_run(const RunArgs& a, RunState& s) {
  const auto t_load = std::chrono::steady_clock::now();
  OpenOptions oo;
  oo.threads = s.threads;
  std::optional<Phase> loading(std::in_place, "loading " + a.model);
  s.src = open_weights(a.model, oo);
  s.tok = run_tokenizer(a, *s.src);
  s.prompt = prompt_tokens(a, s.src->spec(), s.tok.get());
  s.ctx = run_ctx(a, s.src->spec(), s.prompt.size());
  const RunSetupOptions so = setup_options(a, s.device, s.ctx, static_cast<int64_t>(s.prompt.size()) + a.n_predict);
  s.model = std::make_unique<LoadedModel>(*s.src, s.threads);
  loading.reset();
  s.setup = std::make_unique<RunSetup>(*s.model, so, s.prompt);
  s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
}

// Generates, streaming text as it comes (holding back an incomplete UTF-8 sequence and anything that
// may be the start of a stop string); --json collects the same text.
GenerateResult generate_run(const RunArgs& a, RunState& s, tok::TextStream& stream) {
  GenerateOptions go;
  go.n_predict = a.n_predict;
  // On a device the plan table decides how a long prompt is cut (its tiers); --batch caps a step.
  go.prefill_chunk = a.batch > 0 ? a.batch : (s.setup->runtime() ? 0 : 512);
  go.sampling = a.sampling;
  if (s.tok && !a.ignore_eos) go.stop_ids = s.tok->eog_ids();
  auto print = [&](const std::string& text) {
    if (a.json || text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  if (a.tokens.empty() && !a.chat && !a.no_display_prompt) print(a.prompt);  // as llama.cpp shows it
  const Tokenizer* tok = s.tok.get();
  const std::function<void(int32_t)> on_token = [&](int32_t id) {
    if (!tok) {
      print(std::to_string(id) + " ");
      return;
    }
    if (!a.ignore_eos && tok->is_eog(id)) return;  // the end token itself is not text
    print(stream.push(tok->piece(id)));
  };
  go.stop_requested = [&] { return stream.stopped(); };
  GenerateResult r = generate(s.setup->engine(), s.prompt, go, on_token);
  print(stream.finish());
  return r;
}

// Per tier: the schedule that runs it and the plan's predicted step time, from the table this run
// executed (a forced schedule's own table, whose layout may differ from the planner's mix).
void add_tier_predictions(Runtime& runtime, nlohmann::json& j) {
  nlohmann::json schedules = nlohmann::json::object(), predicted = nlohmann::json::object();
  for (const auto& t : runtime.table().tiers) {
    int64_t chunk = 0;
    try {
      const Plan& p = runtime.plan_for(t.tokens, &chunk);
      schedules[std::to_string(t.tokens)] = schedule_name(p.schedule);
      predicted[std::to_string(t.tokens)] = p.predicted_ms;
    } catch (const Error&) {
    }
  }
  j["schedules"] = schedules;
  j["predicted_step_ms"] = predicted;
}

// The device run's keys: its steps, memory, guesses and plans.
void add_runtime_json(const RunSetup& setup, nlohmann::json& j) {
  Runtime& runtime = *setup.runtime();
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : runtime.steps())
    steps.push_back({{"tokens", s.tokens},
                     {"ms", s.ms},
                     {"tier", s.tier},
                     {"chunks", s.chunks},
                     {"schedule", schedule_name(s.schedule)}});
  const RuntimeMemory m = runtime.memory();
  j["budget_bytes"] = m.budget_bytes;
  j["arena_peak_bytes"] = m.arena_peak_bytes;
  j["device_peak_bytes"] = m.device_peak_bytes;
  j["context_bytes"] = m.context_bytes;
  j["uploaded_bytes"] = m.uploaded_bytes;
  j["graph_launches"] = runtime.graph_launches();
  const RuntimeGuesses g = runtime.guesses();
  j["next_layer_hits"] = setup.next_layer_hits();
  j["guessed_experts"] = g.guessed;
  j["guess_hits"] = g.hits;
  j["guessed_layers_routed_experts"] = g.routed;
  add_tier_predictions(runtime, j);
  j["gpu"] = setup.device()->name();
  j["steps"] = steps;
}

void print_run_json(const RunState& s, const GenerateResult& r, const tok::TextStream& stream,
                    const char* stop_reason) {
  nlohmann::json j;
  j["model"] = s.src->origin();
  j["device"] = s.device;
  j["threads"] = s.threads;
  j["ctx"] = s.ctx;
  j["n_prompt_tokens"] = r.n_prompt;
  j["generated_ids"] = r.generated;
  if (s.tok) j["text"] = stream.text();
  j["stop_reason"] = stop_reason;
  if (stream.stopped()) j["stop_string"] = stream.stop_string();
  j["ttft_ms"] = r.ttft_ms;
  j["prefill_ms"] = r.prefill_ms;
  j["prompt_tokens_per_s"] = r.prompt_tokens_per_s;
  j["decode_ms"] = r.decode_ms;
  j["decode_tokens_per_s"] = r.decode_tokens_per_s;
  j["load_ms"] = s.load_ms;
  j["kv_cache_bytes"] = s.src->spec().kv_bytes_per_token(DType::F32) * static_cast<uint64_t>(s.ctx);
  if (s.setup->runtime()) {
    add_runtime_json(*s.setup, j);
  } else {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& step : r.steps) steps.push_back({{"tokens", step.n_tokens}, {"ms", step.ms}});
    j["steps"] = steps;
  }
  print_json(j);
}

// The device run's lines: memory, the schedules used, the guesses' hits.
void print_runtime_stats(const RunSetup& setup) {
  Runtime& runtime = *setup.runtime();
  const RuntimeMemory m = runtime.memory();
  std::fprintf(stderr, "     memory = arena peak %s of a %s budget; device peak %s; context %s (outside the budget)\n",
               format_bytes(m.arena_peak_bytes).c_str(), format_bytes(m.budget_bytes).c_str(),
               format_bytes(m.device_peak_bytes).c_str(), format_bytes(m.context_bytes).c_str());
  std::string used;
  int64_t last_tier = -1;
  for (const auto& s : runtime.steps())
    if (s.tier != last_tier) {
      used += (used.empty() ? "" : ", ") + std::to_string(s.tier) + ": " + schedule_name(s.schedule);
      last_tier = s.tier;
    }
  std::fprintf(stderr, "  schedules = %s\n", used.c_str());
  const RuntimeGuesses g = runtime.guesses();
  if (g.guessed > 0)
    std::fprintf(stderr,
                 "   prefetch = %llu of %llu experts copied on a guess were routed (%.1f%% of the %llu routed; planned "
                 "with %.1f%%)\n",
                 static_cast<unsigned long long>(g.hits), static_cast<unsigned long long>(g.guessed),
                 g.routed ? 100.0 * static_cast<double>(g.hits) / static_cast<double>(g.routed) : 0.0,
                 static_cast<unsigned long long>(g.routed), 100.0 * setup.next_layer_hits());
}

void print_run_stats(const RunState& s, const GenerateResult& r) {
  std::fputc('\n', stdout);
  const double n_dec = static_cast<double>(r.generated.size()) - 1;
  std::fprintf(stderr, "\nload time   = %10.2f ms\n", s.load_ms);
  std::fprintf(stderr, "prompt eval = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per second)\n",
               r.prefill_ms, (long long)r.n_prompt, r.n_prompt ? r.prefill_ms / static_cast<double>(r.n_prompt) : 0.0,
               r.prompt_tokens_per_s);
  std::fprintf(stderr, "       eval = %10.2f ms / %5.0f runs   (%8.2f ms per token, %8.2f tokens per second)\n",
               r.decode_ms, n_dec, n_dec > 0 ? r.decode_ms / n_dec : 0.0, r.decode_tokens_per_s);
  std::fprintf(stderr, "       TTFT = %10.2f ms (%s, %d threads)\n", r.ttft_ms, s.device.c_str(), s.threads);
  if (s.setup->runtime()) print_runtime_stats(*s.setup);
}

void run_run(RunArgs a) {
  RunState s;
  s.device = resolve_device(a.device);
  s.threads = check_run_args(a, s.device);
  set_wait_limit_s(a.wait_timeout_s);
  load_run(a, s);
  tok::TextStream stream(a.stop);
  const GenerateResult r = generate_run(a, s, stream);
  const bool ended_by_eog = s.tok && !a.ignore_eos && !r.generated.empty() && s.tok->is_eog(r.generated.back());
  const char* stop_reason = stream.stopped() ? "stop_string" : ended_by_eog ? "eos" : "length";
  if (!a.timeline.empty() && s.setup->runtime())
    std::fprintf(stderr, "%s\n", write_timeline_trace(*s.setup->runtime(), a.timeline, "--timeline").c_str());
  if (a.json)
    print_run_json(s, r, stream, stop_reason);
  else
    print_run_stats(s, r);
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate from a prompt (text or token ids)");
  sub->add_option("--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text (tokenised with the model's vocabulary; BOS per the model)");
  sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids, used as given (no BOS added)");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate");
  a->planner = add_planner_flags(sub, PlannerVerb::Run);
  sub->add_option(
      "--batch", a->batch,
      "Prompt tokens per prefill step, at most 4194304 (0: 512 on the CPU; on a device, the plan table's tiers)");
  sub->add_option("--device", a->device, "auto|cuda|emu|cpu (auto: the GPU when there is one, else the CPU)");
  sub->add_flag("--greedy", a->sampling.greedy, "Greedy decoding (argmax)");
  sub->add_option("--temp", a->sampling.temp, "Sampling temperature (<= 0: greedy)")->capture_default_str();
  sub->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  sub->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repeat penalty (1: off)")->capture_default_str();
  sub->add_option("--seed", a->sampling.seed, "Sampling seed (same seed, same tokens), 0 to 2^64-1")
      ->check(kUnsignedInteger);
  sub->add_option("--repeat-last-n", a->sampling.repeat_last_n,
                  "Tokens the repeat penalty looks back over (0: off, -1: all)")
      ->capture_default_str();
  sub->add_option(
         "--stop", a->stop,
         "Stop when this text appears (it is not printed); may be given several times; \\n, \\t and \\\\ are escapes")
      ->allow_extra_args(false);
  sub->add_flag(
      "--chat", a->chat,
      "Wrap --prompt in the model's chat template (its own if we recognise it, else a built-in one for the family)");
  sub->add_option("--system", a->system, "System message for --chat");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  sub->add_flag("--no-display-prompt", a->no_display_prompt,
                "Text mode: do not print the prompt before the generated text");
  sub->add_flag("--json", a->json, "Print one JSON object at the end instead of streaming text");
  sub->add_option("--plan", a->plan, "Execute this plan table (from `shardwise plan --save`) instead of planning");
  sub->add_option("--timeline", a->timeline,
                  "Write a Chrome trace of the first plan runs: each action measured (queue timestamps, host clock) "
                  "next to the planner's simulated timeline of the same plan");
  sub->add_option("--timeline-runs", a->timeline_runs,
                  "Plan runs --timeline records: N (the first N) or A:B (runs [A, B), counted from 0: the prefill's, "
                  "then one per decode step; a chunked prefill counts each chunk)")
      ->capture_default_str();
  sub->add_option("--profiler-runs", a->profiler_runs,
                  "A:B: plan runs [A, B) (a chunked prefill counts each chunk) run between cudaProfilerStart and "
                  "cudaProfilerStop, for a profiler started with its recording off (ncu --profile-from-start off)");
  sub->add_flag(
      "--cuda-graphs", a->cuda_graphs,
      "Run each decode step (<= 8 tokens) of a device-resident plan (whole model and KV in VRAM) as CUDA graphs "
      "of up to 8 blocks: one launch instead of one per kernel (not the --timeline runs); the default on a device");
  sub->add_flag("--no-cuda-graphs", a->no_cuda_graphs,
                "Launch every kernel of a decode step on its own (no CUDA graphs)");
  sub->add_flag("--no-pin-weights", a->no_pin_weights,
                "Leave the host weights pageable instead of pinning them: streamed copies run several times slower "
                "(for systems where pinning fails or hangs)");
  sub->add_option("--wait-timeout", a->wait_timeout_s,
                  "Seconds any one wait (on the GPU, on worker threads) may last before the run stops with an error "
                  "naming it; 0 = no limit")
      ->capture_default_str();
  sub->callback([a] { run_run(*a); });
}

}  // namespace shardwise::cli

// cli/verb_run.cpp — `shardwise run`: generate text or tokens, on the CPU alone or through the plan
// runtime on a device (CUDA, or the emulated device) under a VRAM budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>

#include "cli/common.h"
#include "cli/model_setup.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "executor/runtime/timeline_trace.h"
#include "executor/session/generator.h"
#include "oracle/sweep.h"
#include "planner/planner.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/vl_engine.h"
#include "vision/vl_prompt.h"

namespace shardwise::cli {
namespace {

// `run`'s flags beside the model's (model_setup.h).
struct RunArgs : ModelFlags {
  std::string prompt, tokens;
  std::string file;  // -f/--file: the prompt read from a file
  CLI::Option* file_option = nullptr;
  CLI::Option* seed_option = nullptr;  // without --seed a seed is drawn (and printed)
  bool no_cnv = false;                 // llama.cpp's -no-cnv: accepted, never conversational anyway
  int64_t n_predict = 32;
  bool json = false;
  SamplingParams sampling;
  std::vector<std::string> stop;  // --stop: generation ends where one appears; it is not printed
  bool chat = false, ignore_eos = false, no_display_prompt = false;
  std::string system;
  std::vector<std::string> images;  // --image: a vision-language model's images
  std::string mmproj;               // --mmproj: llama.cpp's vision projector for a language model GGUF
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

// -f FILE's text as the prompt, without one final newline (as llama.cpp reads it).
void read_prompt_file(RunArgs& a) {
  try {
    a.prompt = read_text_file(a.file);
  } catch (const Error& e) {
    fail("-f/--file ", e.what());
  }
  if (!a.prompt.empty() && a.prompt.back() == '\n') a.prompt.pop_back();
  if (a.prompt.empty()) fail("-f/--file ", a.file, ": the file is empty (give the prompt text in it)");
}

// A seed from the system's entropy for a run given no --seed, printed so that the run can be repeated;
// 32 bits as llama.cpp's, exact in every JSON reader (a double holds integers up to 2^53 only).
uint64_t draw_seed() {
  std::random_device rd;
  return static_cast<uint32_t>(rd());
}

// Checks the flags before any work; returns the CPU threads.
int check_run_args(RunArgs& a, const std::string& device) {
  check_model_flags(a, device);
  const bool has_file = a.file_option->count() > 0;
  if (!a.prompt.empty() + has_file + !a.tokens.empty() != 1)
    fail("give exactly one of --prompt TEXT, -f/--file FILE or --tokens IDS");
  if (has_file) read_prompt_file(a);
  if (a.n_predict < 1 || a.n_predict > (1 << 24))
    fail("-n ", a.n_predict, " is out of range: --n-predict must be at least 1 and at most 16777216 tokens");
  const int threads = check_model_sizes(a);
  a.sampling.validate();
  if (a.seed_option->count() == 0) a.sampling.seed = draw_seed();
  for (auto& s : a.stop) s = process_escapes(s);
  if (!a.mmproj.empty() && a.images.empty()) fail("--mmproj needs --image");
  if (!a.images.empty() && a.tokens.empty()) a.chat = true;  // the images go into the chat template's user message
  if (a.chat && !a.tokens.empty()) fail("--chat needs the user message as --prompt TEXT, not --tokens");
  if (!a.system.empty() && !a.chat) fail("--system needs --chat");
  return threads;
}

// The user message's image placeholders (one per --image, as the Qwen2-VL chat template writes them);
// empty without images.
std::string image_placeholders(const RunArgs& a, const Tokenizer& tok) {
  if (a.images.empty()) return "";
  MropeTokens t;
  if (!a.mmproj.empty()) {
    t.image_token_id = tok.find_token(kImagePadToken);
    t.vision_start_token_id = tok.find_token(kVisionStartToken);
  } else {
    const std::string config = a.model + "/config.json";
    t = vl_tokens_from_hf_config(read_text_file(config), config);
  }
  const std::string one = vl_image_placeholder(tok, t.vision_start_token_id, t.image_token_id);
  std::string all;
  for (size_t i = 0; i < a.images.size(); ++i) all += one;
  return all;
}

// The prompt's tokens: --tokens as given, or --prompt (in the chat template with --chat) encoded.
std::vector<int32_t> prompt_tokens(const RunArgs& a, const ModelSpec& spec, const Tokenizer* tok) {
  std::string prompt_text = a.prompt;
  if (a.chat) {
    const ChatChoice choice = choose_chat_format(tok->chat_template(), spec.family, *tok);
    log_info(choice.note);
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", image_placeholders(a, *tok) + a.prompt});
    if (!a.images.empty()) add_vl_default_system(messages);
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

// A vision-language run: the language model's embedding table and the engine over the image prompt (on
// the set-up's engine: the CPU model, or the plan runtime on a device).
struct VlRun {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<VlEngine> engine;
  nlohmann::json encoder;  // where and how the images were encoded (--json's "vision")
};

// The encoder's report: its device and time, and on a device its plan and measured peak.
nlohmann::json encoder_json(const EncodedImages& e) {
  nlohmann::json j = {{"device", e.device}, {"encode_ms", e.encode_ms}};
  if (e.device == "cpu") return j;
  const VisionPlan& p = e.run.plan;
  j["schedule"] = p.schedule();
  j["patches"] = p.n_patches;
  j["resident_blocks"] = p.resident_blocks;
  j["blocks"] = p.depth;
  j["mlp_chunk"] = p.mlp_chunk;
  j["budget_bytes"] = p.budget_bytes;
  j["arena_bytes"] = p.arena_bytes;
  j["workspace_bytes"] = p.workspace_bytes;
  j["device_peak_bytes"] = e.run.device_peak_bytes;
  return j;
}

// A run: the model, its prompt, and what generated from it.
struct RunState : ModelRun {
  std::unique_ptr<VlRun> vl;  // with --image, instead of the set-up's engine
  std::vector<int32_t> prompt;
  // Output as token ids: the model carries no vocabulary (its pieces would be raw bytes, NULs among them).
  bool print_ids = false;
};

// The images encoded (on the run's device within its budget, whose encoder arena is gone before the
// language model's is laid out; or on the CPU) and the prompt's placeholders expanded into them, then the
// language model set up for the expanded prompt (on the CPU or planned on a device) under the image engine.
void load_vl_run(const RunArgs& a, RunState& s) {
  const ModelSpec& spec = s.src->spec();
  const VlModel vm = load_vision_side(a, s, a.mmproj);
  s.vl = std::make_unique<VlRun>();
  EncodedImages e;
  {
    ThreadPool pool(s.threads);
    std::unique_ptr<Device> dev;
    if (s.device != "cpu") dev = make_run_device(s.device);
    e = encode_image_files(vm.vision, vm.processor, a.images, pool, dev.get(), dev ? run_budget(a, s.device) : 0);
  }
  if (e.device != "cpu")
    log_info(e.run.plan.describe(), "; measured device peak ", format_bytes(e.run.device_peak_bytes));
  s.vl->encoder = encoder_json(e);
  s.vl->weights = std::make_unique<ModelWeights>(ModelWeights::from_source(*s.src));
  VlInput in =
      build_vl_input(s.prompt, e.grids, e.tokens.data(), static_cast<int64_t>(e.tokens.size()) / spec.hidden_size,
                     s.vl->weights->token_embd, vm.tokens);
  log_info("encoded ", a.images.size(), " image(s) into ", e.tokens.size() / static_cast<size_t>(spec.hidden_size),
           " tokens in ", e.encode_ms, " ms on ", e.device);
  s.prompt = in.ids;
  s.ctx = run_ctx(a, spec, s.prompt.size());
  set_up_model(a, s, static_cast<int64_t>(s.prompt.size()) + a.n_predict, "the image prompt + -n", s.prompt);
  s.vl->engine = std::make_unique<VlEngine>(s.setup->engine(), s.vl->weights->token_embd, std::move(in));
}

// Opens the model, reads the prompt and sets the run up (planned on a device).
void load_run(const RunArgs& a, RunState& s) {
  open_model(a, s, !a.tokens.empty());  // with --tokens, a model without a vocabulary runs on ids
  s.print_ids = !s.tok || s.tok->kind() == "bytes";
  s.prompt = prompt_tokens(a, s.src->spec(), s.tok.get());
  if (!a.images.empty()) return load_vl_run(a, s);
  s.ctx = run_ctx(a, s.src->spec(), s.prompt.size());
  set_up_model(a, s, static_cast<int64_t>(s.prompt.size()) + a.n_predict, "prompt + -n", s.prompt);
}

// Generates, streaming text as it comes (holding back an incomplete UTF-8 sequence and anything that
// may be the start of a stop string); --json collects the same text.
GenerateResult generate_run(const RunArgs& a, RunState& s, tok::TextStream& stream) {
  GenerateOptions go;
  go.n_predict = a.n_predict;
  go.prefill_chunk = prefill_chunk(a, s);
  go.sampling = a.sampling;
  if (s.tok && !a.ignore_eos) go.stop_ids = s.tok->eog_ids();
  auto print = [&](std::string text) {
    if (a.json || text.empty()) return;
    // A NUL byte (a vocabulary's <0x00> token) is printed escaped: raw, it turns the output binary.
    for (size_t at; (at = text.find('\0')) != std::string::npos;) text.replace(at, 1, "\\x00");
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  if (a.tokens.empty() && !a.chat && !a.no_display_prompt && !s.print_ids) print(a.prompt);  // as llama.cpp shows it
  const Tokenizer* tok = s.tok.get();
  bool first = true;
  const std::function<void(int32_t)> on_token = [&](int32_t id) {
    if (first && s.print_ids && tok && !a.json)  // said as output begins: an error before it stays one line
      log_info("note: ", a.model, " carries no vocabulary (its tokens are raw bytes): printing token ids, not text");
    first = false;
    if (tok && !a.ignore_eos && tok->is_eog(id)) return;  // the end token itself is not text
    if (s.print_ids) return print(std::to_string(id) + " ");
    print(stream.push(tok->piece(id)));
  };
  go.stop_requested = [&] { return stream.stopped(); };
  GenerateResult r = generate(s.vl ? *s.vl->engine : s.setup->engine(), s.prompt, go, on_token);
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

// A float flag's value as it was given (0.8, not 0.800000011920929).
double as_given(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", static_cast<double>(v));
  return std::strtod(text, nullptr);
}

bool greedy(const SamplingParams& p) {
  return p.greedy || p.temp <= 0;
}

// What repeats the run beside the model and prompt: the sampling settings and seed, what the plans
// came from (cost model and its hash, or the saved table), the schedule asked for, the revision.
void add_reproduction_json(const RunArgs& a, const RunState& s, nlohmann::json& j) {
  const SamplingParams& p = a.sampling;
  j["seed"] = p.seed;
  j["sampling"] = {{"greedy", greedy(p)},
                   {"temperature", as_given(p.temp)},
                   {"top_k", p.top_k},
                   {"top_p", as_given(p.top_p)},
                   {"min_p", as_given(p.min_p)},
                   {"repeat_penalty", as_given(p.repeat_penalty)},
                   {"repeat_last_n", p.repeat_last_n},
                   {"seed", p.seed},
                   {"seed_given", a.seed_option->count() > 0}};
  j["prompt_ids"] = s.prompt;
  j["n_predict"] = a.n_predict;
  j["ignore_eos"] = a.ignore_eos;
  j["stop"] = a.stop;
  if (!s.plan_inputs.is_null()) {
    j.update(s.plan_inputs);  // "cost_model", or "plan" and "plan_hash"
    j["schedule_requested"] = a.planner->schedule;
    j["pcie_cap"] = a.planner->pcie_cap;
  }
  j["revision"] = build_git_rev();
}

void print_run_json(const RunArgs& a, const RunState& s, const GenerateResult& r, const tok::TextStream& stream,
                    const char* stop_reason) {
  nlohmann::json j;
  j["model"] = s.src->origin();
  j["device"] = s.device;
  j["threads"] = s.threads;
  j["ctx"] = s.ctx;
  j["n_prompt_tokens"] = r.n_prompt;
  j["generated_ids"] = r.generated;
  if (!s.print_ids) j["text"] = stream.text();
  j["stop_reason"] = stop_reason;
  if (stream.stopped()) j["stop_string"] = stream.stop_string();
  j["ttft_ms"] = r.ttft_ms;
  j["prefill_ms"] = r.prefill_ms;
  j["prompt_tokens_per_s"] = r.prompt_tokens_per_s;
  j["decode_ms"] = r.decode_ms;
  j["decode_tokens_per_s"] = r.decode_tokens_per_s;
  j["load_ms"] = s.load_ms;
  const DType kv = s.setup->kv_dtype();
  j["kv_dtype"] = dtype_name(kv);
  if (s.vl) j["vision"] = s.vl->encoder;
  j["kv_cache_bytes"] = s.src->spec().kv_bytes_per_token(kv) * static_cast<uint64_t>(s.ctx);
  if (s.setup && s.setup->runtime()) {
    add_runtime_json(*s.setup, j);
  } else {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& step : r.steps) steps.push_back({{"tokens", step.n_tokens}, {"ms", step.ms}});
    j["steps"] = steps;
  }
  add_reproduction_json(a, s, j);
  print_json(j);
}

// Per plan tier that ran: its schedule, how many steps and plan runs it took, and the median measured time
// of one plan run beside the plan's prediction (a step of more tokens than its tier runs the tier's plan
// once per chunk).
void print_step_table(Runtime& runtime) {
  struct TierRuns {
    Schedule schedule = Schedule::Static;
    int64_t steps = 0, runs = 0;
    std::vector<double> ms;  // per plan run
  };
  std::map<int64_t, TierRuns> by_tier;
  for (const auto& s : runtime.steps()) {
    TierRuns& t = by_tier[s.tier];
    t.schedule = s.schedule;
    ++t.steps;
    t.runs += s.chunks;
    t.ms.push_back(s.ms / static_cast<double>(std::max<int64_t>(s.chunks, 1)));
  }
  if (by_tier.empty()) return;
  std::fprintf(stderr, "      steps = %6s  %-11s %6s %6s  %12s  %12s\n", "tier", "schedule", "steps", "runs",
               "measured ms", "predicted ms");
  for (auto it = by_tier.rbegin(); it != by_tier.rend(); ++it) {
    TierRuns& t = it->second;
    std::sort(t.ms.begin(), t.ms.end());
    const TierEntry* tier = nullptr;
    for (const auto& e : runtime.table().tiers)
      if (e.tokens == it->first) tier = &e;
    const Plan* plan = tier ? tier->find(t.schedule) : nullptr;
    char predicted[32] = "-";
    if (plan) std::snprintf(predicted, sizeof predicted, "%.2f", plan->predicted_ms);
    std::fprintf(stderr, "              %6lld  %-11s %6lld %6lld  %12.2f  %12s\n", static_cast<long long>(it->first),
                 schedule_name(t.schedule), static_cast<long long>(t.steps), static_cast<long long>(t.runs),
                 t.ms[t.ms.size() / 2], predicted);
  }
  std::fprintf(stderr,
               "              (tier: the plan table's step size that ran a step; measured: median time of one plan "
               "run; predicted: the planner's)\n");
}

// The device run's lines: memory, the schedules used, the guesses' hits.
void print_runtime_stats(const RunSetup& setup) {
  Runtime& runtime = *setup.runtime();
  const RuntimeMemory m = runtime.memory();
  std::fprintf(stderr, "     memory = arena peak %s of a %s budget; device peak %s; context %s (outside the budget)\n",
               format_bytes(m.arena_peak_bytes).c_str(), format_bytes(m.budget_bytes).c_str(),
               format_bytes(m.device_peak_bytes).c_str(), format_bytes(m.context_bytes).c_str());
  print_step_table(runtime);
  const RuntimeGuesses g = runtime.guesses();
  if (g.guessed > 0)
    std::fprintf(stderr,
                 "   prefetch = %llu of %llu experts copied on a guess were routed (%.1f%% of the %llu routed; planned "
                 "with %.1f%%)\n",
                 static_cast<unsigned long long>(g.hits), static_cast<unsigned long long>(g.guessed),
                 g.routed ? 100.0 * static_cast<double>(g.hits) / static_cast<double>(g.routed) : 0.0,
                 static_cast<unsigned long long>(g.routed), 100.0 * setup.next_layer_hits());
}

void print_run_stats(const RunArgs& a, const RunState& s, const GenerateResult& r) {
  std::fputc('\n', stdout);
  if (log_level() > LogLevel::Info) return;  // --quiet, --log-level warn: the text alone
  const double n_dec = static_cast<double>(r.generated.size()) - 1;
  std::fprintf(stderr, "\nload time   = %10.2f ms\n", s.load_ms);
  std::fprintf(stderr, "prompt eval = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per second)\n",
               r.prefill_ms, (long long)r.n_prompt, r.n_prompt ? r.prefill_ms / static_cast<double>(r.n_prompt) : 0.0,
               r.prompt_tokens_per_s);
  std::fprintf(stderr, "       eval = %10.2f ms / %5.0f runs   (%8.2f ms per token, %8.2f tokens per second)\n",
               r.decode_ms, n_dec, n_dec > 0 ? r.decode_ms / n_dec : 0.0, r.decode_tokens_per_s);
  std::fprintf(stderr, "       TTFT = %10.2f ms (%s, %d threads)\n", r.ttft_ms, s.device.c_str(), s.threads);
  if (!greedy(a.sampling))
    std::fprintf(stderr, "       seed = %llu%s\n", static_cast<unsigned long long>(a.sampling.seed),
                 a.seed_option->count() > 0 ? "" : " (drawn; --seed repeats the run)");
  if (s.setup && s.setup->runtime()) print_runtime_stats(*s.setup);
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
  if (!a.timeline.empty() && s.setup && s.setup->runtime())
    log_info(write_timeline_trace(*s.setup->runtime(), a.timeline, "--timeline"));
  if (a.json)
    print_run_json(a, s, r, stream, stop_reason);
  else
    print_run_stats(a, s, r);
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate from a prompt (text or token ids)");
  sub->add_option("-m,--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text (tokenised with the model's vocabulary; BOS per the model)");
  a->file_option =
      sub->add_option("-f,--file", a->file, "Read the prompt text from a file (one final newline dropped)");
  sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids, used as given (no BOS added)");
  sub->add_option(
      "--image", a->images,
      "A JPEG or PNG file for a vision-language model (a Qwen2.5-VL HF directory, or a GGUF with --mmproj); "
      "repeat for several. With --prompt the chat template holds the images before the text; with "
      "--tokens, one image_token_id per image after a vision_start token. On a device the encoder runs "
      "there first, within --vram-budget");
  sub->add_option("--mmproj", a->mmproj,
                  "llama.cpp's vision projector GGUF (convert_hf_to_gguf.py --mmproj) for a Qwen2.5-VL language "
                  "model GGUF given as -m; needs --image");
  sub->add_option("-n,--n-predict,--predict", a->n_predict, "Tokens to generate, at least 1")->capture_default_str();
  add_model_flags(sub, *a, PlannerVerb::Run);
  sub->add_flag("--greedy", a->sampling.greedy, "Greedy decoding (argmax)");
  sub->add_option("--temp", a->sampling.temp, "Sampling temperature (<= 0: greedy)")->capture_default_str();
  sub->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  sub->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repeat penalty (1: off)")->capture_default_str();
  a->seed_option = sub->add_option("-s,--seed", a->sampling.seed,
                                   "Sampling seed (same seed, same tokens), 0 to 2^64-1; default: drawn at random "
                                   "(printed, and in --json)")
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
  sub->add_flag("--json", a->json,
                "Print one JSON object at the end instead of streaming text (with what repeats the run: sampling "
                "settings and seed, cost model or plan table and their hashes, schedules, revision)");
  sub->add_flag("--no-cnv,--no-conversation", a->no_cnv)->group("");  // llama.cpp's; runs are never conversational
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
  add_device_run_flags(sub, *a);
  sub->callback([a] { run_run(*a); });
}

}  // namespace shardwise::cli

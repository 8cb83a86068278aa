// cli/verb_run.cpp — `shardwise run`: generate text or tokens, on the CPU alone or through the plan
// runtime on a device (CUDA, or the emulated device) under a VRAM budget.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <optional>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/watchdog.h"
#include <fstream>
#include <sstream>

#include "core/hardware_spec.h"
#include "core/log.h"
#include "core/size.h"
#include "costmodel/cost_model.h"
#include "costmodel/profile_db.h"
#include "executor/cuda/cuda_device.h"
#include "executor/device/device.h"
#include "executor/model/cpu_model.h"
#include "executor/runtime/runtime.h"
#include "executor/runtime/timeline_trace.h"
#include "planner/planner.h"
#include "planner/shard_layout.h"
#include "text/chat_template.h"
#include "executor/session/generator.h"
#include "executor/session/kv_cache.h"
#include "text/tokenizer.h"
#include "text/text_stream.h"

namespace shardwise::cli {
namespace {

struct RunArgs {
  std::string model, prompt, tokens, device = "auto";
  int64_t n_predict = 32;
  int threads = 0;
  int64_t ctx = 0;
  int64_t batch = 0;
  bool json = false;
  SamplingParams sampling;
  std::vector<std::string> stop;  // --stop: generation ends where one appears; it is not printed
  bool chat = false, ignore_eos = false, no_display_prompt = false;
  std::string system;
  std::string vram_budget, schedule = "auto", pcie_cap = "none", plan, hw = "h200-host", profile;
  std::string host_kv_attention = "choose";
  int moe_split = -1;
  std::string next_layer_hits = "auto";  // --next-layer-hits
  std::string timeline;  // --timeline FILE: Chrome trace of the first plan runs, measured and predicted
  std::string timeline_runs = "4";  // --timeline-runs N (the first N) or A:B (runs [A, B))
  std::string profiler_runs;  // --profiler-runs A:B: plan runs [A, B) inside the device's profiler range
  // Decode steps of device-resident plans as CUDA graphs: on by default on a device (measured on the
  // GPU machine: whole-model decode +4.5% nemo8b, +8.5% qwen30b); --no-cuda-graphs turns them off.
  bool cuda_graphs = false;     // --cuda-graphs given
  bool no_cuda_graphs = false;  // --no-cuda-graphs given
  bool hw_given = false;  // --hw on the command line (not the default): may stand in for a CPU-only profile's GPU
  bool no_pin_weights = false;  // --no-pin-weights
  double wait_timeout_s = 600;  // --wait-timeout
};

// --next-layer-hits: the fraction of each token's experts a layer's router picks from the layer before's
// MoE input (measure_next_layer_routing) — what speculative expert prefetch gets right. "auto" measures
// it on the prompt's first tokens (the caller does so only where a plan streams experts); "off" (or a
// dense model) gives 0: no guesses.
double next_layer_guess(const std::string& mode, const ModelWeights& w, ThreadPool& pool, const std::vector<int32_t>& prompt) {
  if (mode == "off" || !w.spec.is_moe()) return 0;
  if (mode != "auto") {
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(mode.c_str(), &end);
    SW_CHECK(!mode.empty() && errno == 0 && *end == '\0' && std::isfinite(f) && f > 0 && f <= 1, "--next-layer-hits '", mode,
             "': expected auto, off or a fraction in (0, 1]");
    return f;
  }
  if (prompt.empty()) return 0;
  const Phase phase("measuring how well routers guess the next layer's experts");
  constexpr size_t kProbeTokens = 4;  // ~k·4 experts per layer read once on the CPU: ~0.1 s for qwen30b
  const std::vector<int32_t> probe(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), kProbeTokens)));
  const double f = measure_next_layer_routing(w, pool, probe);
  return std::isfinite(f) ? f : 0;
}

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


void run_run(RunArgs a) {
  const std::string device = resolve_device(a.device);
  if (!a.timeline.empty()) {  // before any work: a run that cannot write its timeline is refused
    if (device == "cpu") fail("--timeline needs a device run (--device cuda or emu): the CPU path has no plan");
    std::ofstream probe(a.timeline);
    if (!probe) fail("--timeline ", a.timeline, ": cannot write the file (check the directory and permissions)");
  }
  if (device == "cpu")
    for (const auto& gpu_flag : {std::make_pair("--vram-budget", &a.vram_budget), std::make_pair("--plan", &a.plan)})
      if (!gpu_flag.second->empty()) fail(gpu_flag.first, " needs a device: add --device cuda (or emu)");
  if (device == "cpu" && a.schedule != "auto") fail("--schedule needs a device: add --device cuda (or emu)");
  if (device == "cpu" && a.cuda_graphs) fail("--cuda-graphs needs a device: add --device cuda (or emu)");
  if (a.cuda_graphs && a.no_cuda_graphs) fail("give one of --cuda-graphs and --no-cuda-graphs");
  if (device == "emu" && a.vram_budget.empty() && a.plan.empty()) fail("--device emu needs --vram-budget (e.g. 1G)");
  parse_host_kv_attention(a.host_kv_attention);  // one line for a bad value, whatever plans the run
  if (a.prompt.empty() == a.tokens.empty()) fail("give exactly one of --prompt TEXT or --tokens IDS");
  if (a.n_predict < 0 || a.n_predict > (1 << 24)) fail("-n ", a.n_predict, " is out of range");
  check_token_flag("--ctx", a.ctx);
  check_token_flag("--batch", a.batch);
  const int threads = resolve_threads(a.threads);
  a.sampling.validate();
  for (auto& s : a.stop) s = process_escapes(s);
  if (a.chat && !a.tokens.empty()) fail("--chat needs the user message as --prompt TEXT, not --tokens");
  if (!a.system.empty() && !a.chat) fail("--system needs --chat");

  set_wait_limit_s(a.wait_timeout_s);
  const auto t_load = std::chrono::steady_clock::now();
  OpenOptions oo;
  oo.threads = threads;
  std::optional<Phase> loading(std::in_place, "loading " + a.model);
  auto src = open_weights(a.model, oo);
  const ModelSpec& spec = src->spec();
  // With --tokens a model whose vocabulary we cannot read still runs; its output is printed as ids.
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = std::make_unique<Tokenizer>(*src);
  } catch (const Error& e) {
    if (a.tokens.empty()) throw;
    std::fprintf(stderr, "note: %s; printing token ids instead of text\n", e.what());
  }
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
  const int64_t needed = static_cast<int64_t>(prompt.size()) + a.n_predict;
  int64_t ctx = a.ctx;
  if (ctx <= 0) ctx = std::max<int64_t>(needed, std::min<int64_t>(4096, spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096));
  if (ctx < needed)
    fail("--ctx ", ctx, " is too small: the prompt has ", prompt.size(), " tokens and -n asks for ", a.n_predict,
         " more (need ", needed, ")");
  ThreadPool pool(threads);
  ModelWeights weights = ModelWeights::from_source(*src);
  loading.reset();
  double next_layer_hits = 0;  // what the planner was told of guessing each layer's experts a layer early
  std::unique_ptr<Device> dev;  // declared first: the runtime (in engine) synchronises it when destroyed
  std::unique_ptr<StepEngine> engine;
  Runtime* runtime = nullptr;
  if (device == "cpu") {
    engine = std::make_unique<CpuEngine>(weights, pool, ctx);
  } else {
    // Plan (or load a plan table), then run it on the device.
    PlanTable table;
    if (!a.plan.empty()) {
      table = plan_table_from_json(read_text_file(a.plan), a.plan);
      if (table.ctx < needed) fail(a.plan, ": the plan table's context (", table.ctx, ") is smaller than prompt + -n (", needed, ")");
    } else {
      uint64_t budget = 0;
      if (!a.vram_budget.empty()) {
        budget = parse_vram_budget(a.vram_budget, "--vram-budget");
        if (device == "cuda" && budget > cuda_device_info(0).total_bytes)
          log_warn("--vram-budget ", a.vram_budget, " is more than the GPU's ", format_bytes(cuda_device_info(0).total_bytes));
      } else {
        const CudaDeviceInfo info = cuda_device_info(0);
        const uint64_t reserve = 1ull << 30;  // context, modules and headroom
        if (info.free_bytes <= reserve) fail("the GPU has too little free memory; give --vram-budget");
        budget = info.free_bytes - reserve;
      }
      const double cap = parse_pcie_cap(a.pcie_cap, "--pcie-cap");
      std::unique_ptr<CostModel> cost;
      if (a.profile.empty()) {
        cost = make_analytic_cost_model(resolve_hardware(a.hw), cap);
      } else {  // a measured profile takes precedence over --hw
        const ProfileDB db = load_profile(a.profile);
        MeasuredOptions mo;
        mo.pcie_cap_bytes_per_s = cap;
        HardwareSpec fallback;
        if (!db.has_gpu() && a.hw_given) {
          fallback = resolve_hardware(a.hw);
          mo.gpu_fallback = &fallback;
        }
        cost = make_measured_cost_model(db, mo);
      }
      PlannerConfig cfg;
      cfg.budget_bytes = budget;
      cfg.ctx = ctx;
      cfg.threads = threads;
      cfg.model_name = src->origin();
      cfg.tensor_dtypes = tensor_dtypes_of(*src);
      cfg.executor = executor_traits(spec, expert_copies_of(*src));
      // A forced schedule gets a table of its own: the layout (KV in VRAM, the LM head's place) best
      // for it, not the one best for the planner's mix of schedules, in which it may not fit at all.
      if (a.schedule != "auto") cfg.schedules = {parse_schedule(a.schedule)};
      cfg.host_kv_attention = parse_host_kv_attention(a.host_kv_attention);
      cfg.moe_cpu_experts = a.moe_split;
      if (a.next_layer_hits != "auto") next_layer_hits = next_layer_guess(a.next_layer_hits, weights, pool, prompt);
      cfg.next_layer_hits = next_layer_hits;
      {
        const Phase phase("planning");
        table = build_plan_table(spec, *cost, cfg);
      }
      // auto: where some plan streams an MoE layer's experts, measure the guess and plan again with it.
      bool streams_experts = false;
      const ShardSet shards = make_shards(spec, ctx, DType::F32);
      for (const auto& t : table.tiers)
        for (const Plan& p : t.candidates)
          for (const ShardPlacement& pl : p.placements)
            streams_experts = streams_experts || (p.feasible && spec.is_moe() && pl.streamed && shards.at(pl.shard).kind == ShardKind::Ffn);
      if (a.next_layer_hits == "auto" && streams_experts) {
        next_layer_hits = next_layer_guess("auto", weights, pool, prompt);
        cfg.next_layer_hits = next_layer_hits;
        if (next_layer_hits > 0) {
          const Phase phase("planning again with the measured guesses");
          table = build_plan_table(spec, *cost, cfg);
        }
      }
    }
    RuntimeOptions ro;
    if (a.schedule != "auto") ro.schedule = parse_schedule(a.schedule);
    ro.pcie_cap_bytes_per_s = parse_pcie_cap(a.pcie_cap, "--pcie-cap");
    auto parse_int = [](const std::string& t, int64_t* v) {
      char* e = nullptr;
      errno = 0;
      const long long x = std::strtoll(t.c_str(), &e, 10);
      if (t.empty() || errno != 0 || *e != '\0') return false;
      *v = x;
      return true;
    };
    if (!a.timeline.empty()) {
      const auto colon = a.timeline_runs.find(':');
      int64_t first = 0, end = -1;
      const bool ok = colon == std::string::npos
                          ? parse_int(a.timeline_runs, &end)
                          : parse_int(a.timeline_runs.substr(0, colon), &first) && parse_int(a.timeline_runs.substr(colon + 1), &end);
      SW_CHECK(ok && first >= 0 && end > first && end - first <= 1000 && end <= 1000000, "--timeline-runs '", a.timeline_runs,
               "': expected N (the first N plan runs) or A:B (runs [A, B)), at most 1000 runs");
      ro.timeline_first = static_cast<int>(first);
      ro.timeline_runs = static_cast<int>(end - first);
    }
    ro.cuda_graphs = !a.no_cuda_graphs;
    ro.pin_host_weights = !a.no_pin_weights;
    if (!a.profiler_runs.empty()) {
      const auto colon = a.profiler_runs.find(':');
      int64_t first = -1, end = -1;
      const bool ok = colon != std::string::npos && parse_int(a.profiler_runs.substr(0, colon), &first) &&
                      parse_int(a.profiler_runs.substr(colon + 1), &end) && first >= 0 && end > first && end <= 1000000;
      SW_CHECK(ok, "--profiler-runs '", a.profiler_runs, "': expected A:B with 0 <= A < B (plan runs [A, B), e.g. 3:5)");
      ro.profiler_runs_begin = static_cast<int>(first);
      ro.profiler_runs_end = static_cast<int>(end);
    }
    if (device == "emu") {
      EmuOptions eo;
      eo.max_delay_us = 0;  // no artificial delays for real runs
      dev = make_emu_device(eo);
    } else {
      dev = make_cuda_device(0);
    }
    auto rt = std::make_unique<Runtime>(*src, weights, *dev, pool, std::move(table), ro);
    runtime = rt.get();
    engine = std::move(rt);
  }
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();

  GenerateOptions go;
  go.n_predict = a.n_predict;
  // On a device the plan table decides how a long prompt is cut (its tiers); --batch caps a step.
  go.prefill_chunk = a.batch > 0 ? a.batch : (runtime ? 0 : 512);
  go.sampling = a.sampling;
  if (tok && !a.ignore_eos) go.stop_ids = tok->eog_ids();
  // Text is streamed as it comes, holding back an incomplete UTF-8 sequence and anything that may
  // be the start of a stop string; --json collects the same text.
  tok::TextStream stream(a.stop);
  auto print = [&](const std::string& s) {
    if (a.json || s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  if (a.tokens.empty() && !a.chat && !a.no_display_prompt) print(a.prompt);  // as llama.cpp shows it
  const std::function<void(int32_t)> on_token = [&](int32_t id) {
    if (!tok) {
      print(std::to_string(id) + " ");
      return;
    }
    if (!a.ignore_eos && tok->is_eog(id)) return;  // the end token itself is not text
    print(stream.push(tok->piece(id)));
  };
  go.stop_requested = [&] { return stream.stopped(); };
  GenerateResult r = generate(*engine, prompt, go, on_token);
  print(stream.finish());
  const bool ended_by_eog = tok && !a.ignore_eos && !r.generated.empty() && tok->is_eog(r.generated.back());
  const char* stop_reason = stream.stopped() ? "stop_string" : ended_by_eog ? "eos" : "length";
  if (!a.timeline.empty() && runtime) std::fprintf(stderr, "%s\n", write_timeline_trace(*runtime, a.timeline, "--timeline").c_str());

  if (a.json) {
    nlohmann::json j;
    j["model"] = src->origin();
    j["device"] = device;
    j["threads"] = threads;
    j["ctx"] = ctx;
    j["n_prompt_tokens"] = r.n_prompt;
    j["generated_ids"] = r.generated;
    if (tok) j["text"] = stream.text();
    j["stop_reason"] = stop_reason;
    if (stream.stopped()) j["stop_string"] = stream.stop_string();
    j["ttft_ms"] = r.ttft_ms;
    j["prefill_ms"] = r.prefill_ms;
    j["prompt_tokens_per_s"] = r.prompt_tokens_per_s;
    j["decode_ms"] = r.decode_ms;
    j["decode_tokens_per_s"] = r.decode_tokens_per_s;
    j["load_ms"] = load_ms;
    j["kv_cache_bytes"] = spec.kv_bytes_per_token(DType::F32) * static_cast<uint64_t>(ctx);
    nlohmann::json steps = nlohmann::json::array();
    if (runtime) {
      for (const auto& s : runtime->steps())
        steps.push_back({{"tokens", s.tokens}, {"ms", s.ms}, {"tier", s.tier}, {"chunks", s.chunks},
                         {"schedule", schedule_name(s.schedule)}});
      const RuntimeMemory m = runtime->memory();
      j["budget_bytes"] = m.budget_bytes;
      j["arena_peak_bytes"] = m.arena_peak_bytes;
      j["device_peak_bytes"] = m.device_peak_bytes;
      j["context_bytes"] = m.context_bytes;
      j["uploaded_bytes"] = m.uploaded_bytes;
      j["graph_launches"] = runtime->graph_launches();
      const RuntimeGuesses g = runtime->guesses();
      j["next_layer_hits"] = next_layer_hits;
      j["guessed_experts"] = g.guessed;
      j["guess_hits"] = g.hits;
      j["guessed_layers_routed_experts"] = g.routed;
      // Per tier: the schedule that runs it and the plan's predicted step time, from the table this run
      // executed (a forced schedule's own table, whose layout may differ from the planner's mix).
      nlohmann::json schedules = nlohmann::json::object(), predicted = nlohmann::json::object();
      for (const auto& t : runtime->table().tiers) {
        int64_t chunk = 0;
        try {
          const Plan& p = runtime->plan_for(t.tokens, &chunk);
          schedules[std::to_string(t.tokens)] = schedule_name(p.schedule);
          predicted[std::to_string(t.tokens)] = p.predicted_ms;
        } catch (const Error&) {
        }
      }
      j["schedules"] = schedules;
      j["predicted_step_ms"] = predicted;
      j["gpu"] = dev->name();
    } else {
      for (const auto& s : r.steps) steps.push_back({{"tokens", s.n_tokens}, {"ms", s.ms}});
    }
    j["steps"] = steps;
    print_json(j);
    return;
  }
  std::fputc('\n', stdout);
  const double n_dec = static_cast<double>(r.generated.size()) - 1;
  std::fprintf(stderr, "\nload time   = %10.2f ms\n", load_ms);
  std::fprintf(stderr, "prompt eval = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per second)\n",
               r.prefill_ms, (long long)r.n_prompt, r.n_prompt ? r.prefill_ms / static_cast<double>(r.n_prompt) : 0.0,
               r.prompt_tokens_per_s);
  std::fprintf(stderr, "       eval = %10.2f ms / %5.0f runs   (%8.2f ms per token, %8.2f tokens per second)\n",
               r.decode_ms, n_dec, n_dec > 0 ? r.decode_ms / n_dec : 0.0, r.decode_tokens_per_s);
  std::fprintf(stderr, "       TTFT = %10.2f ms (%s, %d threads)\n", r.ttft_ms, device.c_str(), threads);
  if (runtime) {
    const RuntimeMemory m = runtime->memory();
    std::fprintf(stderr, "     memory = arena peak %s of a %s budget; device peak %s; context %s (outside the budget)\n",
                 format_bytes(m.arena_peak_bytes).c_str(), format_bytes(m.budget_bytes).c_str(),
                 format_bytes(m.device_peak_bytes).c_str(), format_bytes(m.context_bytes).c_str());
    std::string used;
    int64_t last_tier = -1;
    for (const auto& s : runtime->steps())
      if (s.tier != last_tier) {
        used += (used.empty() ? "" : ", ") + std::to_string(s.tier) + ": " + schedule_name(s.schedule);
        last_tier = s.tier;
      }
    std::fprintf(stderr, "  schedules = %s\n", used.c_str());
    const RuntimeGuesses g = runtime->guesses();
    if (g.guessed > 0)
      std::fprintf(stderr, "   prefetch = %llu of %llu experts copied on a guess were routed (%.1f%% of the %llu routed; planned with %.1f%%)\n",
                   static_cast<unsigned long long>(g.hits), static_cast<unsigned long long>(g.guessed),
                   g.routed ? 100.0 * static_cast<double>(g.hits) / static_cast<double>(g.routed) : 0.0,
                   static_cast<unsigned long long>(g.routed), 100.0 * next_layer_hits);
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate from a prompt (text or token ids)");
  sub->add_option("--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text (tokenised with the model's vocabulary; BOS per the model)");
  sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids, used as given (no BOS added)");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate");
  sub->add_option("--threads", a->threads, kThreadsHelp);
  sub->add_option("--ctx", a->ctx, "KV capacity in tokens, at most 4194304 (default: max(4096, prompt + n))");
  sub->add_option("--batch", a->batch,
                  "Prompt tokens per prefill step, at most 4194304 (0: 512 on the CPU; on a device, the plan table's tiers)");
  sub->add_option("--device", a->device, "auto|cuda|emu|cpu (auto: the GPU when there is one, else the CPU)");
  sub->add_flag("--greedy", a->sampling.greedy, "Greedy decoding (argmax)");
  sub->add_option("--temp", a->sampling.temp, "Sampling temperature (<= 0: greedy)")->capture_default_str();
  sub->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  sub->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repeat penalty (1: off)")->capture_default_str();
  sub->add_option("--seed", a->sampling.seed, "Sampling seed (same seed, same tokens), 0 to 2^64-1")->check(kUnsignedInteger);
  sub->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Tokens the repeat penalty looks back over (0: off, -1: all)")->capture_default_str();
  sub->add_option("--stop", a->stop,
                  "Stop when this text appears (it is not printed); may be given several times; \\n, \\t and \\\\ are escapes")
      ->allow_extra_args(false);
  sub->add_flag("--chat", a->chat,
                "Wrap --prompt in the model's chat template (its own if we recognise it, else a built-in one for the family)");
  sub->add_option("--system", a->system, "System message for --chat");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
  sub->add_flag("--no-display-prompt", a->no_display_prompt, "Text mode: do not print the prompt before the generated text");
  sub->add_flag("--json", a->json, "Print one JSON object at the end instead of streaming text");
  sub->add_option("--vram-budget", a->vram_budget,
                  "Everything the model allocates on the device (weights, KV, scratch, slots, workspaces), e.g. 4G, at most "
                  "1024T (1 PiB); default on CUDA: free memory minus 1 GiB");
  sub->add_option("--schedule", a->schedule, "auto (the planner's pick per tier) or gpu-only|static|dynamic|layer-split|cpu-moe")
      ->capture_default_str();
  sub->add_option("--pcie-cap", a->pcie_cap, "Throttle host-device copies to this rate, 100MB/s to 1TB/s, e.g. 16GB/s, or none")
      ->capture_default_str();
  sub->add_option("--host-kv-attention", a->host_kv_attention,
                  "GPU attention of layers whose KV is on the host: choose (the faster), split (core on the CPU) or "
                  "staged (the cache copied to the GPU)")
      ->capture_default_str();
  sub->add_option("--moe-split", a->moe_split,
                  "MoE, Dynamic: experts per token that the CPU computes while the GPU runs the others (copied), "
                  "in each CPU FFN layer: -1 chooses (default), 0 never splits, N splits with N");
  sub->add_option("--next-layer-hits", a->next_layer_hits,
                  "MoE: how well a layer's router, applied a layer early, guesses its experts — plans may then copy "
                  "streamed experts on that guess while the layer before runs: auto measures it on the prompt's first "
                  "tokens (a CPU pass, where a plan streams experts), off never guesses, or a fraction in (0, 1]");
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
  sub->add_flag("--cuda-graphs", a->cuda_graphs,
                "Run each decode step (<= 8 tokens) of a device-resident plan (whole model and KV in VRAM) as CUDA graphs "
                "of up to 8 blocks: one launch instead of one per kernel (not the --timeline runs); the default on a device");
  sub->add_flag("--no-cuda-graphs", a->no_cuda_graphs, "Launch every kernel of a decode step on its own (no CUDA graphs)");
  sub->add_flag("--no-pin-weights", a->no_pin_weights,
                "Leave the host weights pageable instead of pinning them: streamed copies run several times slower "
                "(for systems where pinning fails or hangs)");
  sub->add_option("--wait-timeout", a->wait_timeout_s,
                  "Seconds any one wait (on the GPU, on worker threads) may last before the run stops with an error "
                  "naming it; 0 = no limit")
      ->capture_default_str();
  CLI::Option* hw = sub->add_option("--hw", a->hw, "Machine the planner's cost model describes (builtin or .yaml)")->capture_default_str();
  sub->add_option("--profile", a->profile,
                  "Measured ProfileDB (`shardwise profile`) the planner's cost model answers from; takes precedence over --hw");
  sub->callback([a, hw] {
    a->hw_given = hw->count() > 0;
    run_run(*a);
  });
}

}  // namespace shardwise::cli

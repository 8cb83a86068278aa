// cli/verb_run.cpp — `shardwise run`: generate text or tokens. CPU only until the executor lands;
// the GPU/plan flags are accepted by name and refused with a clear message.
#include <chrono>
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "executor/session/chat_template.h"
#include "executor/session/generator.h"
#include "executor/session/kv_cache.h"
#include "executor/session/tokenizer.h"
#include "executor/tokenizer/text_stream.h"

namespace shardwise::cli {
namespace {

struct RunArgs {
  std::string model, prompt, tokens, device = "auto";
  int64_t n_predict = 32;
  int threads = 0;
  int64_t ctx = 0;
  int64_t batch = 512;
  bool json = false;
  SamplingParams sampling;
  std::vector<std::string> stop;  // --stop: generation ends where one appears; it is not printed
  bool chat = false, ignore_eos = false, no_display_prompt = false;
  std::string system;
  std::string vram_budget, schedule, pcie_cap, plan;
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

void run_run(RunArgs a) {
  const std::string device = resolve_cpu_device(a.device);
  for (const auto& gpu_flag : {std::make_pair("--vram-budget", &a.vram_budget), std::make_pair("--schedule", &a.schedule),
                               std::make_pair("--pcie-cap", &a.pcie_cap), std::make_pair("--plan", &a.plan)})
    if (!gpu_flag.second->empty())
      fail(gpu_flag.first, " needs the GPU executor, which has not landed yet (this build runs on the CPU only)");
  if (a.prompt.empty() == a.tokens.empty()) fail("give exactly one of --prompt TEXT or --tokens IDS");
  if (a.n_predict < 0 || a.n_predict > (1 << 24)) fail("-n ", a.n_predict, " is out of range");
  const int threads = resolve_threads(a.threads);
  a.sampling.validate();
  for (auto& s : a.stop) s = process_escapes(s);
  if (a.chat && !a.tokens.empty()) fail("--chat needs the user message as --prompt TEXT, not --tokens");
  if (!a.system.empty() && !a.chat) fail("--system needs --chat");

  const auto t_load = std::chrono::steady_clock::now();
  OpenOptions oo;
  oo.threads = threads;
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
  CpuEngine engine(weights, pool, ctx);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();

  GenerateOptions go;
  go.n_predict = a.n_predict;
  go.prefill_chunk = a.batch;
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
  GenerateResult r = generate(engine, prompt, go, on_token);
  print(stream.finish());
  const bool ended_by_eog = tok && !a.ignore_eos && !r.generated.empty() && tok->is_eog(r.generated.back());
  const char* stop_reason = stream.stopped() ? "stop_string" : ended_by_eog ? "eos" : "length";

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
    for (const auto& s : r.steps) steps.push_back({{"tokens", s.n_tokens}, {"ms", s.ms}});
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
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate from a prompt (text or token ids)");
  sub->add_option("--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("-p,--prompt", a->prompt, "Prompt text (tokenised with the model's vocabulary; BOS per the model)");
  sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids, used as given (no BOS added)");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all cores)");
  sub->add_option("--ctx", a->ctx, "KV capacity in tokens (default: max(4096, prompt + n))");
  sub->add_option("--batch", a->batch, "Prompt tokens per prefill step");
  sub->add_option("--device", a->device, "auto|cuda|emu|cpu (only cpu so far)");
  sub->add_flag("--greedy", a->sampling.greedy, "Greedy decoding (argmax)");
  sub->add_option("--temp", a->sampling.temp, "Sampling temperature (<= 0: greedy)")->capture_default_str();
  sub->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  sub->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  sub->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repeat penalty (1: off)")->capture_default_str();
  sub->add_option("--seed", a->sampling.seed, "Sampling seed (same seed, same tokens)");
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
  sub->add_option("--vram-budget", a->vram_budget, "VRAM budget (GPU executor; not available yet)");
  sub->add_option("--schedule", a->schedule, "auto|gpu-only|static|dynamic|layer-split|cpu-moe (not available yet)");
  sub->add_option("--pcie-cap", a->pcie_cap, "PCIe bandwidth cap, e.g. 16GB/s (not available yet)");
  sub->add_option("--plan", a->plan, "Execute a given plan file (not available yet)");
  sub->callback([a] { run_run(*a); });
}

}  // namespace shardwise::cli

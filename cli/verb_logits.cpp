// cli/verb_logits.cpp — `shardwise logits`: logits of every position of a token sequence as .npy.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/npy.h"
#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "executor/reference/reference_model.h"
#include "executor/session/kv_cache.h"
#include "executor/session/sampling.h"

namespace shardwise::cli {
namespace {

struct LogitsArgs {
  std::string model, tokens, out, device = "auto", path = "fast";
  int threads = 0;
};

void run_logits(const LogitsArgs& a) {
  resolve_cpu_device(a.device);
  check_output_path(a.out, "--out");
  std::vector<int32_t> ids = parse_token_list(a.tokens);
  OpenOptions oo;
  oo.threads = resolve_threads(a.threads);
  auto src = open_weights(a.model, oo);
  const ModelSpec& spec = src->spec();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= spec.vocab_size)
      fail("--tokens: id ", ids[i], " at position ", i, " is out of range for this model (vocabulary of ",
           spec.vocab_size, ")");
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  if (a.path == "reference") {
    logits = reference_logits(*src, ids);
  } else if (a.path == "fast") {
    ThreadPool pool(oo.threads);
    ModelWeights w = ModelWeights::from_source(*src);
    CpuModel model(w, pool);
    KvCache kv(spec, n);
    logits.resize(static_cast<size_t>(n * spec.vocab_size));
    model.forward(ids.data(), n, kv, logits.data(), true);
  } else {
    fail("--path '", a.path, "' is unknown (fast, reference)");
  }
  write_npy_f32(a.out, logits.data(), {n, spec.vocab_size});
  for (int64_t i = 0; i < n; ++i) {  // written as computed, then reported: a NaN row is no result
    const int64_t bad = first_non_finite(logits.data() + i * spec.vocab_size, spec.vocab_size);
    if (bad >= 0)
      fail(a.out, ": the logits of position ", i, " hold ", logits[static_cast<size_t>(i * spec.vocab_size + bad)],
           " at token id ", bad, " (written as computed): the model's weights or activations are not finite");
  }
  log_info("wrote ", a.out, ": float32 [", n, ", ", spec.vocab_size, "]");
}

}  // namespace

void register_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* sub = app.add_subcommand("logits", "Write the logits of every position of a token sequence as .npy");
  sub->add_option("-m,--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  sub->add_option("--tokens", a->tokens, "Comma-separated token ids, used as given (no BOS added)")->required();
  sub->add_option("--out", a->out, "Output .npy path (float32 [n_tokens, vocab])")->required();
  sub->add_option("--device", a->device, "auto|cuda|emu|cpu (only cpu so far)");
  sub->add_option("-t,--threads", a->threads, kThreadsHelp);
  sub->add_option("--path", a->path, "fast (the CPU fast path) or reference (the readable f64 reference)");
  sub->callback([a] { run_logits(*a); });
}

}  // namespace shardwise::cli

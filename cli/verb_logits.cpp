// cli/verb_logits.cpp — `shardwise logits`: logits of every position of a token sequence as .npy.
#include <cstdio>

#include "cli/common.h"
#include "cli/planner_flags.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/npy.h"
#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "executor/reference/reference_model.h"
#include "executor/session/kv_cache.h"
#include "executor/session/sampling.h"
#include "vision/encoder.h"
#include "vision/vl_prompt.h"

namespace shardwise::cli {
namespace {

struct LogitsArgs {
  std::string model, tokens, out, device = "auto", path = "fast";
  std::string kv_dtype = "f32", cache_type_k, cache_type_v;
  CLI::Option* kv_dtype_option = nullptr;
  std::vector<std::string> images;
  int threads = 0;

  DType kv() const { return resolve_kv_dtype(kv_dtype, kv_dtype_option->count() > 0, cache_type_k, cache_type_v); }
};

// A vision-language model's logits: the images encoded, each placeholder of the ids expanded to its image
// tokens, the language model run from the embeddings at M-RoPE positions. Returns [n expanded, vocab].
std::vector<float> vl_logits(const LogitsArgs& a, const WeightSource& src, const std::vector<int32_t>& ids, int threads,
                             int64_t* n_out) {
  const ModelSpec& spec = src.spec();
  const VlModel vm = load_vl_model(a.model, spec);
  ThreadPool pool(threads);
  const EncodedImages e = encode_image_files(vm.vision, vm.processor, a.images, pool);
  const ModelWeights w = ModelWeights::from_source(src);
  const VlInput in = build_vl_input(ids, e.grids, e.tokens.data(),
                                    static_cast<int64_t>(e.tokens.size()) / spec.hidden_size, w.token_embd, vm.tokens);
  const int64_t n = static_cast<int64_t>(in.ids.size());
  std::vector<int64_t> pos3;
  for (const auto& p : in.positions.pos) pos3.insert(pos3.end(), p.begin(), p.end());
  *n_out = n;
  if (a.path == "reference") return reference_logits_embedded(src, in.embeddings, pos3, a.kv());
  CpuModel model(w, pool);
  KvCache kv(spec, n, a.kv());
  std::vector<float> logits(static_cast<size_t>(n * spec.vocab_size));
  model.forward_embedded(in.embeddings.data(), pos3.data(), n, kv, logits.data(), true);
  return logits;
}

void run_logits(const LogitsArgs& a) {
  resolve_cpu_device(a.device);
  a.kv();
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
  int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  if (a.path != "reference" && a.path != "fast") fail("--path '", a.path, "' is unknown (fast, reference)");
  if (!a.images.empty()) {
    logits = vl_logits(a, *src, ids, oo.threads, &n);
  } else if (a.path == "reference") {
    logits = reference_logits(*src, ids, a.kv());
  } else {
    ThreadPool pool(oo.threads);
    ModelWeights w = ModelWeights::from_source(*src);
    CpuModel model(w, pool);
    KvCache kv(spec, n, a.kv());
    logits.resize(static_cast<size_t>(n * spec.vocab_size));
    model.forward(ids.data(), n, kv, logits.data(), true);
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
  add_kv_dtype_flags(sub, a->kv_dtype, a->cache_type_k, a->cache_type_v, &a->kv_dtype_option);
  sub->add_option("--image", a->images,
                  "A JPEG or PNG file for a vision-language model (Qwen2.5-VL HF directory); repeat for several. "
                  "--tokens then holds one image_token_id per image, after a vision_start token; each is expanded "
                  "to the image's tokens, and the output has a row per expanded position");
  sub->callback([a] { run_logits(*a); });
}

}  // namespace shardwise::cli

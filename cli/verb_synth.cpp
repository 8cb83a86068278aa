// cli/verb_synth.cpp — `shardwise synth`: write a seeded random model of any spec as a GGUF file, and with
// --mmproj the spec's vision tower as llama.cpp's projector GGUF beside it (the pair llama-mtmd-cli and
// `run --mmproj` read).
#include <cstdio>
#include <filesystem>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/quant_mix.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"

namespace shardwise::cli {
namespace {

struct SynthArgs {
  std::string spec;
  std::string dtype;
  uint64_t seed = 1;
  std::string out;
  int threads = 0;
  int64_t layers = 0;
  std::string routing = "balanced";
  bool pure = false;
  std::string mmproj;
};

// --dtype: a llama-quantize mix (every quantised name: q4_K_M, q2_K, q4_0, ...; --pure gives every matrix the
// mix's base type) or a float type.
void apply_dtype(const SynthArgs& a, ModelSpec& spec) {
  if (a.dtype.empty()) return;
  QuantMix mix;
  DType base;
  if (parse_quant_mix(a.dtype, &mix, &base)) {
    spec.dtype = base;
    spec.mix = a.pure ? QuantMix::Pure : mix;
    return;
  }
  spec.dtype = parse_dtype(a.dtype);
  if (dtype_is_quantized(spec.dtype) && !a.pure)
    fail("--dtype ", a.dtype, " is a block type, not one of llama-quantize's mixes: add --pure for every matrix in ",
         dtype_name(spec.dtype), ", or name a mix (", quant_mix_names(), ")");
}

// The vision tower of the spec (vision/'s builtin for its name), checked against the language model it
// feeds: its width, M-RoPE and a vocabulary that holds the vision tokens.
VisionSpec synth_tower(const ModelSpec& spec) {
  VisionSpec tower;
  if (!builtin_vision_spec(spec.name, &tower)) {
    std::string known;
    for (const auto& n : builtin_vision_spec_names()) known += (known.empty() ? "" : ", ") + n;
    fail("--mmproj: the spec '", spec.name, "' has no vision tower (specs with one: ", known, ")");
  }
  if (tower.out_hidden_size != spec.hidden_size || spec.mrope_section.empty())
    fail("--mmproj: the vision tower of '", spec.name, "' emits tokens of width ", tower.out_hidden_size,
         " for a qwen2 model with M-RoPE, but this spec has hidden_size ", spec.hidden_size,
         spec.mrope_section.empty() ? " and no mrope_section" : "");
  if (synthetic_special_tokens(spec).empty())
    fail("--mmproj: a vocabulary of ", spec.vocab_size, " tokens cannot hold Qwen2.5-VL's vision tokens (ids up to ",
         qwen2vl_special_tokens().back().id, ")");
  return tower;
}

void write_synth_mmproj(const SynthArgs& a, const VisionSpec& tower, DType lm_dtype) {
  VisionModel m;
  m.spec = tower;
  m.weights = random_vision_weights(tower, a.seed, 0.02f);
  const DType dtype = load_vision_tower_dtype(lm_dtype);  // as llama.cpp's converter writes it
  write_mmproj(m, ImageProcessorConfig{}, a.mmproj, dtype);
  log_info("wrote ", a.mmproj, ": its vision tower (", tower.depth, " blocks, width ", tower.hidden_size, ") ",
           dtype_name(dtype), ", ", format_bytes(std::filesystem::file_size(a.mmproj)));
}

void run_synth(const SynthArgs& a) {
  check_output_path(a.out, "-o");  // before the minutes a large model takes to synthesise
  if (!a.mmproj.empty()) {
    check_output_path(a.mmproj, "--mmproj");
    namespace fs = std::filesystem;
    if (fs::weakly_canonical(a.mmproj) == fs::weakly_canonical(a.out))
      fail("--mmproj ", a.mmproj, ": the projector needs a file of its own, not -o's");
  }
  if (a.layers < 0) fail("--layers ", a.layers, ": give a positive layer count (or 0 for the spec's)");
  ModelSpec spec = resolve_spec(a.spec);
  apply_dtype(a, spec);
  if (a.layers > 0) spec.num_hidden_layers = a.layers;
  spec.validate("--spec " + a.spec);
  const VisionSpec tower = a.mmproj.empty() ? VisionSpec{} : synth_tower(spec);
  const SyntheticRouting routing = parse_synthetic_routing(a.routing);
  ThreadPool pool(resolve_threads(a.threads));
  {
    auto src = make_synthetic_weights(spec, a.seed, &pool, true, routing);  // freed before the tower is drawn
    write_gguf(*src, a.out, spec.dtype, &pool, true, spec.mix);
  }
  log_info("wrote ", a.out, ": ", spec.name, " ",
           spec.mix == QuantMix::Pure ? dtype_name(spec.dtype) : quant_mix_name(spec.mix), ", ",
           format_bytes(spec.total_bytes()));
  if (!a.mmproj.empty()) write_synth_mmproj(a, tower, spec.dtype);
}

}  // namespace

void register_synth(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sub = app.add_subcommand("synth", "Write a seeded random model (any builtin or YAML spec) as GGUF");
  sub->add_option("--spec", a->spec, "Builtin spec name (e.g. nemo8b, qwen30b) or a model .yaml / config.json")
      ->required();
  sub->add_option("--dtype", a->dtype,
                  "Weight types: f32, f16, bf16, or one of llama-quantize's mixes (q2_K, q3_K_S/M/L, q4_K_S/M, "
                  "q5_K_S/M, q6_K, q4_0, q4_1, q5_0, q5_1, q8_0: output q6_K, some attn_v/ffn_down with more "
                  "bits, as llama-quantize writes them); default: the spec's");
  sub->add_flag("--pure", a->pure,
                "Every matrix in the --dtype's one type, the output and token embedding too (llama-quantize --pure)");
  sub->add_option("-s,--seed", a->seed, "Random seed (same seed, same weights), 0 to 2^64-1")->check(kUnsignedInteger);
  sub->add_option("-o,--out", a->out, "Output .gguf path")->required();
  sub->add_option("--mmproj", a->mmproj,
                  "Also write the spec's vision tower (qwen2vl7b, tiny_qwen2vl) with seeded random weights to this "
                  "path as llama.cpp's mmproj GGUF (f16 matrices; f32 or bf16 with that --dtype)");
  sub->add_option("-t,--threads", a->threads, kThreadsHelp);
  sub->add_option("--layers", a->layers, "Override the number of layers (0 = the spec's)");
  sub->add_option("--routing", a->routing,
                  "MoE routing of the weights: balanced (tokens spread over the experts as under a trained router) "
                  "or concentrated (a prompt reaches few experts per layer; for studies)")
      ->capture_default_str();
  sub->callback([a] { run_synth(*a); });
}

}  // namespace shardwise::cli

// cli/verb_synth.cpp — `shardwise synth`: write a seeded random model of any spec as a GGUF file.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/quant_mix.h"
#include "core/size.h"
#include "core/thread_pool.h"

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

void run_synth(const SynthArgs& a) {
  check_output_path(a.out, "-o");  // before the minutes a large model takes to synthesise
  if (a.layers < 0) fail("--layers ", a.layers, ": give a positive layer count (or 0 for the spec's)");
  ModelSpec spec = resolve_spec(a.spec);
  apply_dtype(a, spec);
  if (a.layers > 0) spec.num_hidden_layers = a.layers;
  spec.validate("--spec " + a.spec);
  const SyntheticRouting routing = parse_synthetic_routing(a.routing);
  ThreadPool pool(resolve_threads(a.threads));
  auto src = make_synthetic_weights(spec, a.seed, &pool, true, routing);
  write_gguf(*src, a.out, spec.dtype, &pool, true, spec.mix);
  log_info("wrote ", a.out, ": ", spec.name, " ",
           spec.mix == QuantMix::Pure ? dtype_name(spec.dtype) : quant_mix_name(spec.mix), ", ",
           format_bytes(spec.total_bytes()));
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
  sub->add_option("-t,--threads", a->threads, kThreadsHelp);
  sub->add_option("--layers", a->layers, "Override the number of layers (0 = the spec's)");
  sub->add_option("--routing", a->routing,
                  "MoE routing of the weights: balanced (tokens spread over the experts as under a trained router) "
                  "or concentrated (a prompt reaches few experts per layer; for studies)")
      ->capture_default_str();
  sub->callback([a] { run_synth(*a); });
}

}  // namespace shardwise::cli

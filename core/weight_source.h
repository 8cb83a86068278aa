// core/weight_source.h — where a model's weights come from: a GGUF file, an HF directory
// (config.json + safetensors), or a seeded synthetic source that needs no file.
// Every source exposes the same thing: a validated ModelSpec, the RoPE pairing its Q/K rows
// assume, tokenizer metadata when the file has it, and one TensorView per canonical tensor
// (llama.cpp names, row-major shapes, see model_spec.h). Opening checks that every tensor the spec
// needs is present with the right shape and a supported dtype, so later code can trust the views.
// Sources never compute with the weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"

namespace shardwise {

class ThreadPool;

// Tokenizer metadata carried by the model file (GGUF tokenizer.ggml.*; for HF directories the
// tokenizer_config.json / generation_config.json / config.json fields); empty when absent.
struct TokenizerInfo {
  std::string model;  // "llama", "gpt2", ... ("" = none in the file)
  std::string pre;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  int64_t unk_id = -1;           // tokenizer.ggml.unknown_token_id
  int64_t pad_id = -1;           // tokenizer.ggml.padding_token_id
  int64_t eot_id = -1;           // tokenizer.ggml.eot_token_id (end of turn)
  int64_t eom_id = -1;           // tokenizer.ggml.eom_token_id (end of message)
  std::vector<int64_t> eog_ids;  // more end-of-generation ids (HF generation_config.json eos_token_id)
  bool add_bos = false;
  bool add_bos_explicit = false;  // the file states add_bos (else add_bos is a default)
  bool add_eos = false;
  int add_space_prefix = -1;         // tokenizer.ggml.add_space_prefix: -1 = not stated
  std::string chat_template;         // tokenizer.chat_template / tokenizer_config.json chat_template ("" = none)
  std::string bos_token, eos_token;  // HF tokenizer_config.json token texts ("" = not stated)
  std::string hf_tokenizer_json;     // path of tokenizer.json for HF directories ("" = none)
  std::string hf_tokenizer_model;    // path of a SentencePiece tokenizer.model when there is no tokenizer.json
};

// A control token at the id a model family's tokenizer gives it.
struct SpecialToken {
  int64_t id;
  const char* text;
};
// Qwen2.5-VL's (and Qwen2-VL's) end of text, ChatML and vision tokens at their ids, 151643 to 151656:
// <|endoftext|>, <|im_start|>, <|im_end|>, the object, box and quad markers, <|vision_start|>,
// <|vision_end|>, <|vision_pad|>, <|image_pad|>, <|video_pad|>. llama.cpp's mtmd writes
// "<|vision_start|>" and "<|vision_end|>" around an image and tokenises with specials parsed; shardwise
// finds <|image_pad|> and <|vision_start|> in the vocabulary by name.
const std::vector<SpecialToken>& qwen2vl_special_tokens();
// A Jinja chat template that renders text messages as Qwen2.5-VL's own does: ChatML, with its default
// system turn ("You are a helpful assistant.") when the first message is not a system one. llama.cpp's
// llama-mtmd-cli refuses a model without a template; it (b6097) recognises this one as ChatML and applies
// its built-in ChatML, without the default system turn; a Jinja renderer (llama-server --jinja) adds it.
extern const char* const kQwen2VlChatTemplate;

// Vocabulary for models without one (synthetic weights and the GGUF files `synth` writes): a SentencePiece
// ("llama") layout in which any text tokenises one character per token, the same in llama.cpp and here —
// <unk> <s> </s>, the 256 byte tokens (fallback for anything else), "\u2581" (the space), the 94 printable
// ASCII characters, then fillers <F0>, <F1>..., with `specials` as control tokens at their ids (past the
// printable characters and inside the vocabulary; Error otherwise). A vocabulary smaller than that keeps
// its first entries.
TokenizerInfo character_vocabulary(int64_t vocab, const std::vector<SpecialToken>& specials = {});
// The size below which character_vocabulary lacks some printable character.
constexpr int64_t kCharacterVocabularySize = 3 + 256 + 1 + 94;
// The control tokens a synthetic vocabulary of `spec` holds: Qwen2-VL's (above) for a spec with M-RoPE
// whose vocabulary reaches their ids, so that both llama.cpp's mtmd and shardwise find the image
// placeholders; none otherwise.
std::vector<SpecialToken> synthetic_special_tokens(const ModelSpec& spec);
// The vocabulary of a synthetic model of `spec`: character_vocabulary with synthetic_special_tokens
// (and, where those are Qwen2-VL's, kQwen2VlChatTemplate) where it holds every printable character, else
// none (the tokenizer then uses byte tokens).
TokenizerInfo synthetic_vocabulary(const ModelSpec& spec);

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  const ModelSpec& spec() const { return spec_; }
  RopeStyle rope_style() const { return rope_style_; }
  const std::string& origin() const { return origin_; }  // path or synthetic:... text
  const TokenizerInfo& tokenizer() const { return tokenizer_; }

  // The canonical tensor; throws Error if the name is not part of the spec.
  const TensorView& tensor(const std::string& name) const;
  bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  uint64_t weight_bytes() const;

 protected:
  // Checks that tensors_ holds exactly what spec_.tensors() lists, with matching shapes.
  void check_complete(const std::string& context) const;

  ModelSpec spec_;
  RopeStyle rope_style_ = RopeStyle::Neox;
  std::string origin_;
  TokenizerInfo tokenizer_;
  std::map<std::string, TensorView> tensors_;
};

struct OpenOptions {
  int threads = 0;  // for synthetic generation and conversions; 0 = all hardware threads
};

// Opens "path/to/model.gguf", an HF directory, or "synthetic:SPEC[?dtype=D&seed=S&layers=L]"
// (SPEC = builtin name or .yaml path). Throws Error with one clear line on any problem.
std::unique_ptr<WeightSource> open_weights(const std::string& model, const OpenOptions& options = {});

std::unique_ptr<WeightSource> open_gguf_weights(const std::string& path);
std::unique_ptr<WeightSource> open_hf_weights(const std::string& dir);
// How synthetic MoE weights route. Balanced (the default): quantised values have mean 0, like a
// trained layer's, and tokens spread over the experts as under a trained, load-balanced router.
// Concentrated: quantised codes drawn uniformly (mean -0.5 of a code), which turns every token's hidden
// state towards one direction so that a prompt reaches only a few experts per layer; for studies of
// that case (and to reproduce weights made before balanced routing), never a default.
enum class SyntheticRouting { Balanced, Concentrated };
const char* synthetic_routing_name(SyntheticRouting r);
SyntheticRouting parse_synthetic_routing(const std::string& name);  // Error on anything else

// Synthetic weights: deterministic in (spec, dtype, seed, routing) and independent of the thread count.
std::unique_ptr<WeightSource> make_synthetic_weights(const ModelSpec& spec, uint64_t seed, ThreadPool* pool,
                                                     bool show_progress = false,
                                                     SyntheticRouting routing = SyntheticRouting::Balanced);
// Where make_synthetic_weights puts each tensor of `spec`: byte offsets into its one storage block, in
// the spec's tensor order (no weights are made).
std::map<std::string, uint64_t> synthetic_tensor_offsets(const ModelSpec& spec);
// "SPEC[?dtype=D&seed=S&layers=L&routing=R]", the text after "synthetic:": the spec with its options applied and
// the seed. Every reader of such text (open_weights, the CLI's model specs, experiments) parses it here.
// Throws Error naming the text and the option (seed: decimal 0 to 2^64-1; layers: 1 to the spec limit).
struct SyntheticModel {
  ModelSpec spec;
  uint64_t seed = 1;
  SyntheticRouting routing = SyntheticRouting::Balanced;
};
SyntheticModel parse_synthetic(const std::string& text);
// Parses the text after "synthetic:" and materialises the weights.
std::unique_ptr<WeightSource> open_synthetic_weights(const std::string& text, const OpenOptions& options);

// Writes a model as a GGUF file that llama.cpp can load, following its converter's conventions:
// llama-family Q/K rows reordered for its RoPE pairing, 1-D tensors and the MoE router in f32,
// experts merged. Matrices are converted to `dtype`, or to the types of llama-quantize's `mix` around it
// (core/quant_mix.h), exactly or by ggml's reference quantisers.
void write_gguf(const WeightSource& source, const std::string& path, DType dtype, ThreadPool* pool = nullptr,
                bool show_progress = false, QuantMix mix = QuantMix::Pure);

// ModelSpec from GGUF metadata (exposed for tests and `info`).
class GgufFile;
ModelSpec spec_from_gguf(const GgufFile& file);

}  // namespace shardwise

// core/weight_source.cpp — common checks, model-string dispatch and the GGUF export.
#include "core/weight_source.h"

#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/gguf.h"
#include "core/host_buffer.h"
#include "core/progress.h"
#include "core/thread_pool.h"

namespace shardwise {

const TensorView& WeightSource::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(origin_, ": no tensor '", name, "' in this model");
  return it->second;
}

uint64_t WeightSource::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& kv : tensors_) b += kv.second.nbytes;
  return b;
}

void WeightSource::check_complete(const std::string& ctx) const {
  const std::vector<TensorDesc> descs = spec_.tensors();
  for (const auto& d : descs) {
    auto it = tensors_.find(d.name);
    if (it == tensors_.end()) fail(ctx, ": missing tensor '", d.name, "' (", family_name(spec_.family), " needs it)");
    if (it->second.shape != d.shape)
      fail(ctx, ": tensor '", d.name, "' has shape ", shape_str(it->second.shape), " but the model config needs ",
           shape_str(d.shape));
    if (it->second.nbytes != tensor_bytes(it->second.dtype, it->second.shape))
      fail(ctx, ": tensor '", d.name, "' has ", it->second.nbytes, " bytes, inconsistent with its shape and dtype");
  }
  if (tensors_.size() != descs.size()) {
    for (const auto& kv : tensors_) {
      bool known = false;
      for (const auto& d : descs) known = known || d.name == kv.first;
      if (!known) fail(ctx, ": unexpected tensor '", kv.first, "' for a ", family_name(spec_.family), " model");
    }
  }
}

std::unique_ptr<WeightSource> open_weights(const std::string& model, const OpenOptions& options) {
  const std::string synth = "synthetic:";
  if (model.compare(0, synth.size(), synth) == 0) return open_synthetic_weights(model.substr(synth.size()), options);
  struct stat st;
  if (::stat(model.c_str(), &st) != 0)
    fail(model, ": no such file or directory (MODEL is a .gguf file, an HF directory or synthetic:SPEC)");
  if (S_ISDIR(st.st_mode)) return open_hf_weights(model);
  return open_gguf_weights(model);
}

// ---------------------------------------------------------------------------------------------
// GGUF export

const std::vector<SpecialToken>& qwen2vl_special_tokens() {
  static const std::vector<SpecialToken> tokens = {
      {151643, "<|endoftext|>"},        {151644, "<|im_start|>"},       {151645, "<|im_end|>"},
      {151646, "<|object_ref_start|>"}, {151647, "<|object_ref_end|>"}, {151648, "<|box_start|>"},
      {151649, "<|box_end|>"},          {151650, "<|quad_start|>"},     {151651, "<|quad_end|>"},
      {151652, "<|vision_start|>"},     {151653, "<|vision_end|>"},     {151654, "<|vision_pad|>"},
      {151655, "<|image_pad|>"},        {151656, "<|video_pad|>"}};
  return tokens;
}

const char* const kQwen2VlChatTemplate =
    R"({%- for message in messages -%})"
    R"({%- if loop.first and message['role'] != 'system' -%})"
    R"({{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}})"
    R"({%- endif -%})"
    R"({{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}})"
    R"({%- endfor -%})"
    R"({%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%})";

TokenizerInfo character_vocabulary(int64_t vocab, const std::vector<SpecialToken>& specials) {
  TokenizerInfo t;
  t.model = "llama";
  t.pre = "default";
  auto add = [&](std::string s, int32_t type) {
    if (static_cast<int64_t>(t.tokens.size()) >= vocab) return;
    t.tokens.push_back(std::move(s));
    t.scores.push_back(0.0f);
    t.token_types.push_back(type);
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (unsigned b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 6);
  }
  add("\xe2\x96\x81", 1);
  for (char c = 33; c < 127; ++c) add(std::string(1, c), 1);
  for (int64_t i = 0; static_cast<int64_t>(t.tokens.size()) < vocab; ++i) add("<F" + std::to_string(i) + ">", 1);
  for (const SpecialToken& s : specials) {
    if (s.id < kCharacterVocabularySize || s.id >= vocab)
      fail("special token ", s.text, " at id ", s.id, " is outside the fillers of a vocabulary of ", vocab);
    t.tokens[static_cast<size_t>(s.id)] = s.text;  // in place of a filler: every text stays unique
    t.token_types[static_cast<size_t>(s.id)] = 3;  // control
  }
  t.bos_id = vocab > 1 ? 1 : -1;
  t.eos_id = vocab > 2 ? 2 : -1;
  t.unk_id = vocab > 0 ? 0 : -1;
  t.add_bos = true;
  return t;
}

std::vector<SpecialToken> synthetic_special_tokens(const ModelSpec& spec) {
  const std::vector<SpecialToken>& qwen = qwen2vl_special_tokens();
  if (spec.mrope_section.empty() || spec.vocab_size <= qwen.back().id) return {};
  return qwen;
}

TokenizerInfo synthetic_vocabulary(const ModelSpec& spec) {
  if (spec.vocab_size < kCharacterVocabularySize) return TokenizerInfo{};
  const std::vector<SpecialToken> specials = synthetic_special_tokens(spec);
  TokenizerInfo t = character_vocabulary(spec.vocab_size, specials);
  if (!specials.empty()) t.chat_template = kQwen2VlChatTemplate;
  return t;
}

namespace {

const char* gguf_arch(Family f) {
  switch (f) {
    case Family::Llama:
      return "llama";
    case Family::Qwen3:
      return "qwen3";
    case Family::Qwen3Moe:
      return "qwen3moe";
    case Family::Qwen2:
      return "qwen2";
  }
  return "?";
}

// The model's hyperparameters under the architecture's GGUF keys.
void set_model_metadata(GgufWriter& w, const ModelSpec& spec, DType dtype) {
  // A language model with M-RoPE is llama.cpp's qwen2vl (its sections written with a fourth, 0).
  const std::string a = spec.mrope_section.empty() ? gguf_arch(spec.family) : "qwen2vl";
  w.set("general.architecture", GgufValue::of_string(a));
  w.set("general.name", GgufValue::of_string(spec.name));
  w.set("general.file_type", GgufValue::of_u32(quant_mix_file_type(spec.mix, dtype)));
  w.set("general.quantization_version", GgufValue::of_u32(2));
  w.set(a + ".block_count", GgufValue::of_u32(static_cast<uint32_t>(spec.num_hidden_layers)));
  w.set(
      a + ".context_length",
      GgufValue::of_u32(static_cast<uint32_t>(spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096)));
  w.set(a + ".embedding_length", GgufValue::of_u32(static_cast<uint32_t>(spec.hidden_size)));
  w.set(a + ".feed_forward_length", GgufValue::of_u32(static_cast<uint32_t>(spec.intermediate_size)));
  w.set(a + ".attention.head_count", GgufValue::of_u32(static_cast<uint32_t>(spec.num_attention_heads)));
  w.set(a + ".attention.head_count_kv", GgufValue::of_u32(static_cast<uint32_t>(spec.num_key_value_heads)));
  w.set(a + ".attention.key_length", GgufValue::of_u32(static_cast<uint32_t>(spec.head_dim)));
  w.set(a + ".attention.value_length", GgufValue::of_u32(static_cast<uint32_t>(spec.head_dim)));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(static_cast<float>(spec.rms_norm_eps)));
  w.set(a + ".rope.freq_base", GgufValue::of_f32(static_cast<float>(spec.rope_theta)));
  w.set(a + ".rope.dimension_count", GgufValue::of_u32(static_cast<uint32_t>(spec.head_dim)));
  w.set(a + ".vocab_size", GgufValue::of_u32(static_cast<uint32_t>(spec.vocab_size)));
  if (!spec.mrope_section.empty()) {
    std::vector<int32_t> sections;
    for (int64_t x : spec.mrope_section) sections.push_back(static_cast<int32_t>(x));
    sections.push_back(0);
    w.set(a + ".rope.dimension_sections", GgufValue::of_i32s(sections));
  }
  if (spec.is_moe()) {
    w.set(a + ".expert_count", GgufValue::of_u32(static_cast<uint32_t>(spec.num_experts)));
    w.set(a + ".expert_used_count", GgufValue::of_u32(static_cast<uint32_t>(spec.num_experts_per_tok)));
    w.set(a + ".expert_feed_forward_length", GgufValue::of_u32(static_cast<uint32_t>(spec.moe_intermediate_size)));
    w.set(a + ".expert_weights_norm", GgufValue::of_bool(spec.norm_topk_prob));
  }
}

// The source's vocabulary, or the character vocabulary where it has none that matches the model.
void set_tokenizer_metadata(GgufWriter& w, const WeightSource& src, const ModelSpec& spec) {
  TokenizerInfo tok = src.tokenizer();
  if (tok.tokens.empty() || static_cast<int64_t>(tok.tokens.size()) != spec.vocab_size)
    tok = spec.vocab_size >= kCharacterVocabularySize ? synthetic_vocabulary(spec)
                                                      : character_vocabulary(spec.vocab_size);
  w.set("tokenizer.ggml.model", GgufValue::of_string(tok.model));
  w.set("tokenizer.ggml.pre", GgufValue::of_string(tok.pre.empty() ? "default" : tok.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::of_strings(tok.tokens));
  if (tok.scores.size() == tok.tokens.size()) w.set("tokenizer.ggml.scores", GgufValue::of_f32s(tok.scores));
  if (tok.token_types.size() == tok.tokens.size())
    w.set("tokenizer.ggml.token_type", GgufValue::of_i32s(tok.token_types));
  if (!tok.merges.empty()) w.set("tokenizer.ggml.merges", GgufValue::of_strings(tok.merges));
  if (tok.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(static_cast<uint32_t>(tok.bos_id)));
  if (tok.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(static_cast<uint32_t>(tok.eos_id)));
  if (tok.unk_id >= 0) w.set("tokenizer.ggml.unknown_token_id", GgufValue::of_u32(static_cast<uint32_t>(tok.unk_id)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(tok.add_bos));
  if (!tok.chat_template.empty()) w.set("tokenizer.chat_template", GgufValue::of_string(tok.chat_template));
}

// Tensor `in` converted row by row into `out` (d's dtype), its rows reordered for llama.cpp's RoPE
// pairing when `permute`.
void convert_rows(const TensorView& in, const TensorDesc& d, bool permute, int64_t head_dim, uint8_t* out,
                  ThreadPool& tp) {
  const int64_t rows = in.rows(), cols = in.cols();
  const uint64_t out_row_bytes = dtype_row_bytes(d.dtype, cols);
  tp.parallel_for(rows, 16, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t src_row = r;
      if (permute) {
        // llama.cpp's converter reorders each head's rows from (first half, second half) pairs
        // to adjacent pairs: new row 2i+j of a head takes old row j*D/2+i.
        const int64_t hd = head_dim, half = hd / 2;
        const int64_t head = r / hd, in_head = r % hd;
        src_row = head * hd + (in_head % 2) * half + in_head / 2;
      }
      uint8_t* dst = out + static_cast<uint64_t>(r) * out_row_bytes;
      if (in.dtype == d.dtype) {  // a pure row permutation: copy bytes, never requantise
        std::memcpy(dst, in.row(src_row), out_row_bytes);
        continue;
      }
      dequantize_row(in.dtype, in.row(src_row), row.data(), cols);
      quantize_row(d.dtype, row.data(), dst, cols);
    }
  });
}

}  // namespace

void write_gguf(const WeightSource& src, const std::string& path, DType dtype, ThreadPool* pool, bool show_progress,
                QuantMix mix) {
  ModelSpec spec = src.spec();
  spec.dtype = dtype;
  spec.mix = mix;
  GgufWriter w;
  set_model_metadata(w, spec, dtype);
  set_tokenizer_metadata(w, src, spec);

  const bool permute_qk = spec.family == Family::Llama && src.rope_style() == RopeStyle::Neox;
  std::vector<TensorDesc> descs = spec.tensors();
  std::vector<HostBuffer> converted(descs.size());
  uint64_t total = 0;
  for (const auto& d : descs) total += d.bytes;
  Progress progress("convert", total, show_progress);
  ThreadPool local(1);
  ThreadPool& tp = pool ? *pool : local;
  for (size_t ti = 0; ti < descs.size(); ++ti) {
    const TensorDesc& d = descs[ti];
    const TensorView& in = src.tensor(d.name);
    const bool permute = permute_qk && (d.kind == TensorKind::AttnQ || d.kind == TensorKind::AttnK);
    if (in.dtype == d.dtype && !permute) {
      w.add_tensor(d.name, in);
      progress.add(d.bytes);
      continue;
    }
    converted[ti] = HostBuffer(d.bytes);
    uint8_t* out = converted[ti].data();
    convert_rows(in, d, permute, spec.head_dim, out, tp);
    TensorView v;
    v.dtype = d.dtype;
    v.shape = d.shape;
    v.data = out;
    v.nbytes = d.bytes;
    w.add_tensor(d.name, v);
    progress.add(d.bytes);
  }
  progress.finish();
  w.write(path);
}

}  // namespace shardwise

// core/gguf_source.cpp — weights from a GGUF file written by llama.cpp's converter (or ours).
#include <memory>

#include "core/error.h"
#include "core/gguf.h"
#include "core/weight_source.h"

namespace shardwise {
namespace {

class GgufWeights : public WeightSource {
 public:
  explicit GgufWeights(const std::string& path) : file_(path) {
    origin_ = path;
    spec_ = spec_from_gguf(file_);
    // llama.cpp's converter reorders llama Q/K rows for adjacent-pair RoPE; qwen3 keeps NeoX halves.
    rope_style_ = spec_.family == Family::Llama ? RopeStyle::Normal : RopeStyle::Neox;
    for (const auto& t : file_.tensors()) {
      if (t.name == "rope_freqs.weight")
        fail(path, ": tensor 'rope_freqs.weight' means scaled RoPE (e.g. Llama 3.1), which is not supported");
      tensors_.emplace(t.name, file_.view(t));  // throws naming the tensor for unsupported types
    }
    check_complete(path);
    read_tokenizer();
  }

 private:
  void read_tokenizer() {
    const std::string ctx = file_.path() + ": metadata";
    auto str = [&](const char* key) -> std::string {
      const GgufValue* v = file_.find(key);
      return v ? v->as_string(ctx + " " + key) : std::string();
    };
    tokenizer_.model = str("tokenizer.ggml.model");
    tokenizer_.pre = str("tokenizer.ggml.pre");
    if (const GgufValue* v = file_.find("tokenizer.ggml.tokens")) {
      if (v->type != GgufType::ARRAY || v->array_type != GgufType::STRING)
        fail(ctx, " tokenizer.ggml.tokens must be an array of strings");
      for (const auto& e : v->array) tokenizer_.tokens.push_back(e.s);
    }
    if (const GgufValue* v = file_.find("tokenizer.ggml.scores")) {
      if (v->type == GgufType::ARRAY)
        for (const auto& e : v->array)
          tokenizer_.scores.push_back(static_cast<float>(e.as_double(ctx + " tokenizer.ggml.scores")));
    }
    if (const GgufValue* v = file_.find("tokenizer.ggml.token_type")) {
      if (v->type == GgufType::ARRAY)
        for (const auto& e : v->array)
          tokenizer_.token_types.push_back(static_cast<int32_t>(e.as_int(ctx + " tokenizer.ggml.token_type")));
    }
    if (const GgufValue* v = file_.find("tokenizer.ggml.merges")) {
      if (v->type == GgufType::ARRAY)
        for (const auto& e : v->array) tokenizer_.merges.push_back(e.as_string(ctx + " tokenizer.ggml.merges"));
    }
    const int64_t n = static_cast<int64_t>(tokenizer_.tokens.size());
    // Which tokenizer reads the vocabulary is not guessed: without one, text would be encoded as the raw
    // bytes of a model without a vocabulary, ids that name other tokens in this one.
    if (n > 0 && tokenizer_.model.empty())
      fail(ctx, " tokenizer.ggml.tokens holds ", n,
           " tokens but tokenizer.ggml.model is missing or empty (llama or gpt2 says how to use them)");
    // Per-token arrays are indexed by token id: a shorter one would be read out of bounds.
    if (!tokenizer_.scores.empty() && static_cast<int64_t>(tokenizer_.scores.size()) != n)
      fail(ctx, " tokenizer.ggml.scores has ", tokenizer_.scores.size(), " entries but tokenizer.ggml.tokens has ", n);
    if (!tokenizer_.token_types.empty() && static_cast<int64_t>(tokenizer_.token_types.size()) != n)
      fail(ctx, " tokenizer.ggml.token_type has ", tokenizer_.token_types.size(),
           " entries but tokenizer.ggml.tokens has ", n);
    auto id = [&](const char* key) -> int64_t {
      const GgufValue* v = file_.find(key);
      if (!v) return -1;
      int64_t x = v->as_int(ctx + " " + key);
      if (x < 0 || (n > 0 && x >= n) || x >= spec_.vocab_size)
        fail(ctx, " ", key, " = ", x, " is not a token id of the vocabulary (", n > 0 ? n : spec_.vocab_size,
             " tokens)");
      return x;
    };
    tokenizer_.bos_id = id("tokenizer.ggml.bos_token_id");
    tokenizer_.eos_id = id("tokenizer.ggml.eos_token_id");
    // Optional ids are ignored when out of range (some converters write a padding id past the
    // vocabulary); only BOS/EOS are required to be valid.
    auto opt_id = [&](const char* key) -> int64_t {
      const GgufValue* v = file_.find(key);
      if (!v || !v->is_integer()) return -1;
      const int64_t x = v->as_int(ctx + " " + key);
      return (x >= 0 && x < (n > 0 ? n : spec_.vocab_size)) ? x : -1;
    };
    tokenizer_.unk_id = opt_id("tokenizer.ggml.unknown_token_id");
    tokenizer_.pad_id = opt_id("tokenizer.ggml.padding_token_id");
    tokenizer_.eot_id = opt_id("tokenizer.ggml.eot_token_id");
    tokenizer_.eom_id = opt_id("tokenizer.ggml.eom_token_id");
    if (const GgufValue* v = file_.find("tokenizer.ggml.add_bos_token")) {
      tokenizer_.add_bos = v->as_bool(ctx + " tokenizer.ggml.add_bos_token");
      tokenizer_.add_bos_explicit = true;
    } else {
      tokenizer_.add_bos = tokenizer_.model == "llama" && tokenizer_.bos_id >= 0;  // llama.cpp's SPM default
    }
    if (const GgufValue* v = file_.find("tokenizer.ggml.add_eos_token"))
      tokenizer_.add_eos = v->as_bool(ctx + " tokenizer.ggml.add_eos_token");
    if (const GgufValue* v = file_.find("tokenizer.ggml.add_space_prefix"))
      tokenizer_.add_space_prefix = v->as_bool(ctx + " tokenizer.ggml.add_space_prefix") ? 1 : 0;
    tokenizer_.chat_template = str("tokenizer.chat_template");
    if (tokenizer_.add_eos && tokenizer_.eos_id < 0)
      fail(ctx, " tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing");
    if (n > 0 && n != spec_.vocab_size)
      fail(ctx, " tokenizer.ggml.tokens has ", n, " entries but the model's vocabulary has ", spec_.vocab_size);
  }

  GgufFile file_;
};

// validate() speaks in config.json field names: the GGUF keys that set the fields `msg` names, listed
// as "<arch>.<key>, ..." (empty: none).
std::string gguf_keys_named(const std::string& msg, const std::string& arch) {
  static const std::pair<const char*, const char*> kKeys[] = {
      {"hidden_size", "embedding_length"},
      {"num_hidden_layers", "block_count"},
      {"num_attention_heads", "attention.head_count"},
      {"num_key_value_heads", "attention.head_count_kv"},
      {"head_dim", "attention.key_length"},
      {"intermediate_size", "feed_forward_length"},
      {"vocab_size", "vocab_size"},
      {"num_experts", "expert_count"},
      {"num_experts_per_tok", "expert_used_count"},
      {"moe_intermediate_size", "expert_feed_forward_length"},
      {"rope_theta", "rope.freq_base"},
      {"rms_norm_eps", "attention.layer_norm_rms_epsilon"},
  };
  auto is_word = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  std::string keys;
  for (const auto& k : kKeys) {
    const std::string field = k.first;
    for (size_t p = msg.find(field); p != std::string::npos; p = msg.find(field, p + 1)) {
      const size_t end = p + field.size();
      if ((p == 0 || !is_word(msg[p - 1])) && (end == msg.size() || !is_word(msg[end]))) {
        keys += (keys.empty() ? "" : ", ") + arch + "." + k.second;
        break;
      }
    }
  }
  return keys;
}

// ARCH.rope.dimension_sections: the M-RoPE sections (llama.cpp writes four, the last 0 for text models).
std::vector<int64_t> gguf_mrope_sections(const GgufFile& f, const std::string& arch, const std::string& ctx) {
  const std::string key = arch + ".rope.dimension_sections";
  const GgufValue* v = f.find(key);
  if (!v || v->type != GgufType::ARRAY || v->array.size() < 3 || v->array.size() > 4)
    fail(ctx, " ", key, " must be an array of 3 or 4 integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->array.size(); ++i) {
    const int64_t x = v->array[i].as_int(ctx + " " + key);
    if (i < 3)
      out.push_back(x);
    else if (x != 0)
      fail(ctx, " ", key, "[3] = ", x, ": a fourth M-RoPE section is not supported");
  }
  return out;
}

}  // namespace

ModelSpec spec_from_gguf(const GgufFile& f) {
  const std::string ctx = f.path() + ": metadata";
  const GgufValue* arch_v = f.find("general.architecture");
  if (!arch_v) fail(ctx, " general.architecture is missing");
  const std::string arch = arch_v->as_string(ctx + " general.architecture");
  ModelSpec s;
  // llama.cpp's Qwen2-VL / Qwen2.5-VL language model: qwen2 with M-RoPE (the vision tower is another file).
  const bool vl = arch == "qwen2vl";
  s.family = parse_family(vl ? "qwen2" : arch, ctx + " general.architecture");
  s.name = arch;
  if (vl) s.mrope_section = gguf_mrope_sections(f, arch, ctx);
  if (const GgufValue* n = f.find("general.name"); n && n->type == GgufType::STRING) s.name = n->s;
  auto get = [&](const std::string& key) -> const GgufValue* {
    const GgufValue* v = f.find(arch + "." + key);
    if (v && v->type == GgufType::ARRAY)
      fail(ctx, " ", arch, ".", key, " is a per-layer array, which is not supported");
    return v;
  };
  auto req_int = [&](const std::string& key) -> int64_t {
    const GgufValue* v = get(key);
    if (!v) fail(ctx, " ", arch, ".", key, " is missing");
    return v->as_int(ctx + " " + arch + "." + key);
  };
  auto opt_int = [&](const std::string& key, int64_t fallback) -> int64_t {
    const GgufValue* v = get(key);
    return v ? v->as_int(ctx + " " + arch + "." + key) : fallback;
  };
  auto opt_num = [&](const std::string& key, double fallback) -> double {
    const GgufValue* v = get(key);
    return v ? v->as_double(ctx + " " + arch + "." + key) : fallback;
  };
  s.num_hidden_layers = req_int("block_count");
  s.hidden_size = req_int("embedding_length");
  s.num_attention_heads = req_int("attention.head_count");
  s.num_key_value_heads = opt_int("attention.head_count_kv", s.num_attention_heads);
  s.head_dim = opt_int("attention.key_length", s.num_attention_heads > 0 ? s.hidden_size / s.num_attention_heads : 0);
  if (opt_int("attention.value_length", s.head_dim) != s.head_dim)
    fail(ctx, " ", arch, ".attention.value_length differs from key_length, which is not supported");
  if (opt_int("rope.dimension_count", s.head_dim) != s.head_dim)
    fail(ctx, " ", arch, ".rope.dimension_count differs from the head size (partial RoPE is not supported)");
  if (const GgufValue* st = get("rope.scaling.type"); st && st->type == GgufType::STRING && st->s != "none")
    fail(ctx, " ", arch, ".rope.scaling.type '", st->s, "' is not supported");
  s.intermediate_size = opt_int("feed_forward_length", 0);
  s.rms_norm_eps = opt_num("attention.layer_norm_rms_epsilon", 1e-5);
  s.rope_theta = opt_num("rope.freq_base", 10000.0);
  s.max_position_embeddings = opt_int("context_length", 0);
  if (s.is_moe()) {
    s.num_experts = req_int("expert_count");
    s.num_experts_per_tok = req_int("expert_used_count");
    s.moe_intermediate_size = req_int("expert_feed_forward_length");
    if (const GgufValue* v = get("expert_weights_norm"))
      s.norm_topk_prob = v->as_bool(ctx + " expert_weights_norm");
    else
      s.norm_topk_prob = true;  // llama.cpp's qwen3moe always renormalises
  }
  // Vocabulary: explicit key, else the embedding table's rows.
  s.vocab_size = opt_int("vocab_size", 0);
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) fail(f.path(), ": missing tensor 'token_embd.weight'");
  if (s.vocab_size == 0) s.vocab_size = static_cast<int64_t>(emb->shape.front());
  s.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
  if (q && is_supported_dtype(q->type_id)) s.dtype = static_cast<DType>(q->type_id);
  try {
    s.validate(ctx);
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string keys = gguf_keys_named(msg, arch);
    if (keys.empty()) throw;
    fail(msg, " (GGUF metadata ", keys, ")");
  }
  return s;
}

std::unique_ptr<WeightSource> open_gguf_weights(const std::string& path) {
  return std::make_unique<GgufWeights>(path);
}

}  // namespace shardwise

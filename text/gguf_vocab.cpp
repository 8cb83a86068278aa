// text/gguf_vocab.cpp — a GGUF vocabulary as a Pipeline, with llama.cpp's
// conventions: control/user-defined tokens matched whole, the `pre` regexes, ignore_merges and BOS
// for Llama-3 vocabularies, the SentencePiece dummy prefix, <0xXX> byte tokens.
#include <algorithm>

#include "core/error.h"
#include "text/sources.h"

namespace shardwise::tok {
namespace {

const char* const kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken (e.g. Mistral-NeMo) and GPT-4o style: upper/lower-case runs kept apart.
const char* const kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

bool is_llama3_pre(const std::string& pre) {
  return one_of(pre, {"llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe", "falcon3"});
}

}  // namespace

std::vector<std::string> gguf_pre_regexes(const std::string& pre, const std::string& origin) {
  if (pre.empty() || pre == "default") return {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  if (one_of(pre, {"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2", "trillion", "granite-docling"})) return {kGpt2};
  if (is_llama3_pre(pre)) return {kLlama3};
  if (one_of(pre, {"qwen2", "stablelm2", "hunyuan", "deepseek-r1-qwen", "megrez", "grok-2"})) return {kQwen2};
  if (one_of(pre, {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}))
    return {R"(\p{N})", kGpt2};
  if (pre == "falcon") return {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"};
  if (pre == "tekken") return {kTekken};
  if (one_of(pre, {"gpt-4o", "minimax-m2"})) return {kGpt4o};
  if (pre == "deepseek-coder")
    return {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+", R"(\p{N})"};
  fail(origin, ": tokenizer.ggml.pre '", pre,
       "' is a pre-tokeniser we do not know (supported: default, gpt-2, llama-bpe/llama3, qwen2, tekken, gpt-4o, "
       "starcoder, falcon, deepseek-coder and their aliases)");
}

Pipeline pipeline_from_gguf(const TokenizerInfo& info, const std::string& origin) {
  Pipeline p;
  p.origin = origin;
  p.tokens = info.tokens;
  p.render_control_tokens = false;  // llama.cpp's token_to_piece(special = false)
  const size_t n = info.tokens.size();
  p.attrs.assign(n, TokenAttr::Normal);
  for (size_t i = 0; i < n && i < info.token_types.size(); ++i) {
    const int32_t t = info.token_types[i];
    p.attrs[i] = (t >= 1 && t <= 6) ? static_cast<TokenAttr>(t) : TokenAttr::Normal;
  }
  // Control, user-defined and unknown tokens are matched whole in the text (llama.cpp's
  // tokenizer_st_partition): user-defined always, the others when parsing specials.
  for (size_t i = 0; i < n; ++i) {
    const TokenAttr a = p.attrs[i];
    if ((a == TokenAttr::Control || a == TokenAttr::UserDefined || a == TokenAttr::Unknown) && !p.tokens[i].empty()) {
      AddedToken t;
      t.id = static_cast<int32_t>(i);
      t.content = p.tokens[i];
      t.special = a != TokenAttr::UserDefined;
      p.added.push_back(std::move(t));
    }
  }
  if (info.model == "gpt2") {
    p.model = Pipeline::Model::Bpe;
    if (info.merges.empty())
      fail(origin, ": tokenizer.ggml.model is 'gpt2' (byte-level BPE) but tokenizer.ggml.merges is missing or empty");
    p.merges.reserve(info.merges.size());
    for (size_t r = 0; r < info.merges.size(); ++r) {
      const std::string& m = info.merges[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size())
        fail(origin, ": tokenizer.ggml.merges[", r, "] = '", m, "' is not two tokens separated by a space");
      p.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    for (const auto& re : gguf_pre_regexes(info.pre, origin)) {
      PreStep s(PreStep::Split);
      s.regex = std::make_shared<Regex>(re, origin + ": pre-tokeniser '" + info.pre + "'");
      s.behavior = PreStep::Isolated;
      p.pre_tokenizers.push_back(s);
    }
    PreStep bl(PreStep::ByteLevel);
    bl.use_regex = false;
    p.pre_tokenizers.push_back(bl);
    p.decoders.push_back(DecStep(DecStep::ByteLevel));
    p.ignore_merges = is_llama3_pre(info.pre);
    const bool add_bos = info.add_bos_explicit ? info.add_bos : is_llama3_pre(info.pre);
    if (add_bos && info.bos_id >= 0) p.prefix_ids.push_back(static_cast<int32_t>(info.bos_id));
  } else if (info.model == "llama") {
    p.model = Pipeline::Model::Spm;
    p.scores = info.scores;
    p.unk_id = info.unk_id >= 0 ? static_cast<int32_t>(info.unk_id) : (n > 0 ? 0 : -1);  // llama.cpp's default
    const bool space_prefix = info.add_space_prefix != 0;
    NormStep esc(NormStep::Replace);
    esc.text = " ";
    esc.content = "\xE2\x96\x81";
    p.normalizers.push_back(esc);
    if (space_prefix) {
      NormStep pre(NormStep::Prepend);
      pre.text = "\xE2\x96\x81";
      p.normalizers.push_back(pre);
    }
    DecStep un(DecStep::Replace);
    un.text = "\xE2\x96\x81";
    un.content = " ";
    p.decoders.push_back(un);
    p.decoders.push_back(DecStep(DecStep::ByteFallback));
    p.decoders.push_back(DecStep(DecStep::Fuse));
    if (space_prefix) {
      DecStep st(DecStep::Strip);
      st.content = " ";
      st.strip_start = 1;
      p.decoders.push_back(st);
    }
    if (info.add_bos && info.bos_id >= 0) p.prefix_ids.push_back(static_cast<int32_t>(info.bos_id));
  } else {
    fail(origin, ": tokenizer.ggml.model '", info.model,
         "' is not supported (supported: 'llama' = SentencePiece-style BPE, 'gpt2' = byte-level BPE)");
  }
  if (info.add_eos && info.eos_id >= 0) p.suffix_ids.push_back(static_cast<int32_t>(info.eos_id));
  return p;
}

}  // namespace shardwise::tok

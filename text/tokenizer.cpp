// text/tokenizer.cpp — picks the vocabulary a model file carries (see tokenizer.h).
#include "text/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "text/pipeline.h"
#include "text/sources.h"

namespace shardwise {
namespace {

// Token texts that end a turn or a document in the families people run (llama.cpp's list).
const char* const kEndTokens[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",  "<|endoftext|>",
                                  "<|eom_id|>", "<EOT>",      "_<EOT>",  "<|end_of_text|>"};
const char* const kEotTokens[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>"};

constexpr int32_t kByteBase = 3;  // bytes vocabulary: <unk> <s> </s>, then byte b is id 3 + b

}  // namespace

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer::Tokenizer(const WeightSource& src) {
  const TokenizerInfo& info = src.tokenizer();
  vocab_size_ = src.spec().vocab_size;
  chat_template_ = info.chat_template;
  tok::Pipeline p;
  bool have = false;
  if (info.hf_tokenizer_json.empty() && !info.hf_tokenizer_model.empty())
    fail(info.hf_tokenizer_model,
         ": SentencePiece model files are not supported, only tokenizer.json (transformers writes one with "
         "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)); or give token ids with --tokens");
  if (!info.hf_tokenizer_json.empty()) {
    p = tok::pipeline_from_tokenizer_json(info.hf_tokenizer_json, info);
    kind_ = "hf-bpe";
    have = true;
  } else if (!info.tokens.empty() && !info.model.empty() && info.model != "none") {
    p = tok::pipeline_from_gguf(info, src.origin());
    kind_ = info.model == "llama" ? "spm" : info.model;
    have = true;
  }
  if (!have) {
    // No vocabulary: <unk> <s> </s>, then the 256 bytes. encode() reports when the model's
    // vocabulary is too small for that.
    kind_ = "bytes";
    if (vocab_size_ >= kByteBase + 256) {
      bos_ = 1;
      eos_ = 2;
      add_bos_ = true;
      eog_ = {eos_};
    }
    return;
  }
  if (static_cast<int64_t>(p.tokens.size()) > vocab_size_)
    fail(p.origin, ": the tokenizer has ", p.tokens.size(), " tokens but the model's vocabulary is ", vocab_size_);
  // HF files name BOS/EOS by text in tokenizer_config.json; config.json gives ids.
  auto by_text = [&](const std::string& t) -> int32_t {
    if (t.empty()) return -1;
    for (size_t i = 0; i < p.tokens.size(); ++i)
      if (p.tokens[i] == t) return static_cast<int32_t>(i);
    return -1;
  };
  bos_ = by_text(info.bos_token);
  if (bos_ < 0) bos_ = static_cast<int32_t>(info.bos_id);
  eos_ = by_text(info.eos_token);
  if (eos_ < 0) eos_ = static_cast<int32_t>(info.eos_id);
  eot_ = static_cast<int32_t>(info.eot_id);
  auto add_eog = [&](int64_t id) {
    if (id >= 0 && id < vocab_size_ && std::find(eog_.begin(), eog_.end(), id) == eog_.end())
      eog_.push_back(static_cast<int32_t>(id));
  };
  // Named end tokens count only as control tokens (GGUF type 3, HF special added tokens).
  auto is_ctrl = [&](size_t i) { return i < p.attrs.size() && p.attrs[i] == tok::TokenAttr::Control; };
  for (size_t i = 0; i < p.tokens.size(); ++i) {
    for (const char* t : kEotTokens)
      if (eot_ < 0 && p.tokens[i] == t && is_ctrl(i)) eot_ = static_cast<int32_t>(i);
  }
  add_eog(eos_);
  add_eog(eot_);
  add_eog(info.eom_id);
  for (int64_t id : info.eog_ids) add_eog(id);
  for (size_t i = 0; i < p.tokens.size(); ++i)
    for (const char* t : kEndTokens)
      if (p.tokens[i] == t && is_ctrl(i)) add_eog(static_cast<int64_t>(i));
  // The post-processor's first token is BOS even where no side file names it.
  add_bos_ = !p.prefix_ids.empty();
  if (add_bos_ && bos_ < 0) bos_ = p.prefix_ids.front();
  engine_ = std::make_unique<tok::Engine>(std::move(p));
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special, bool parse_special) const {
  const size_t bad = tok::utf8_invalid_offset(text);
  if (bad != std::string::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
    fail("the text is not valid UTF-8 (byte ", hex, " at offset ", bad, ")");
  }
  if (engine_) return engine_->encode(text, add_special, parse_special);
  if (vocab_size_ < kByteBase + 256)
    fail("this model has no tokenizer and its vocabulary (", vocab_size_,
         " tokens) is too small for byte tokens; pass token ids with --tokens instead");
  std::vector<int32_t> ids;
  if (add_special && add_bos_) ids.push_back(bos_);
  for (unsigned char c : text) ids.push_back(kByteBase + c);
  return ids;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return std::string();
  if (engine_) return static_cast<size_t>(id) < engine_->pipeline().tokens.size() ? engine_->piece(id) : std::string();
  if (id >= kByteBase && id < kByteBase + 256) return std::string(1, static_cast<char>(id - kByteBase));
  return std::string();
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return std::string();
  if (engine_) {
    const auto& t = engine_->pipeline().tokens;
    return static_cast<size_t>(id) < t.size() ? t[id] : std::string();
  }
  if (id == 0) return "<unk>";
  if (id == 1) return "<s>";
  if (id == 2) return "</s>";
  if (id < kByteBase + 256) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<unsigned>(id - kByteBase));
    return buf;
  }
  return std::string();
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  if (engine_) return tok::utf8_sanitize(engine_->decode(ids, skip_special));
  std::string out;
  for (int32_t id : ids) out += piece(id);
  return tok::utf8_sanitize(out);
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

bool Tokenizer::is_control(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return false;
  if (!engine_) return id < kByteBase || id >= kByteBase + 256;
  const auto& a = engine_->pipeline().attrs;
  return static_cast<size_t>(id) < a.size() && (a[id] == tok::TokenAttr::Control || a[id] == tok::TokenAttr::Unknown);
}

int32_t Tokenizer::find_token(const std::string& text) const {
  if (engine_) return engine_->find(text);
  return -1;
}

}  // namespace shardwise

// executor/session/tokenizer.h — text <-> token ids.
// INTERIM (the tokenizer issue makes this complete): vocabularies from GGUF files are matched
// greedily, longest piece first (SentencePiece-style "▁" spaces; GPT-2 byte-to-unicode mapping for
// "gpt2" models), with <0xXX> byte tokens as the fallback. That is not BPE merge order, so ids can
// differ from llama.cpp's for some text. Models without a vocabulary (synthetic, HF directories
// for now) get a byte-level vocabulary: <unk> <s> </s>, then one token per byte.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/weight_source.h"

namespace shardwise {

class Tokenizer {
 public:
  explicit Tokenizer(const WeightSource& source);

  // Ids for text; with add_special, BOS is prepended when the model asks for it.
  std::vector<int32_t> encode(const std::string& text, bool add_special) const;
  // The bytes a token stands for (control tokens give "").
  std::string piece(int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  int64_t vocab_size() const { return static_cast<int64_t>(pieces_.size()); }
  const std::string& kind() const { return kind_; }  // "spm", "gpt2", "bytes"

 private:
  std::string kind_;
  std::vector<std::string> pieces_;   // decoded bytes of each token
  std::vector<bool> is_control_;
  std::unordered_map<std::string, int32_t> lookup_;  // decoded bytes -> id
  int32_t byte_token_[256];
  size_t max_piece_ = 1;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false;
  bool dummy_prefix_ = false;
};

}  // namespace shardwise

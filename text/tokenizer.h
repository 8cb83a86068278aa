// text/tokenizer.h — text <-> token ids for a model, from whatever vocabulary its file
// carries:
//   - GGUF tokenizer.ggml.model "gpt2": byte-level BPE, merges by rank, the pre-tokeniser regexes
//     that tokenizer.ggml.pre names (llama.cpp's list); "llama": SentencePiece-style BPE by score
//     with <0xXX> byte fallback and the dummy-prefix space. Control and user-defined tokens are
//     matched whole in the text first (llama.cpp's parse_special).
//   - HF directories with tokenizer.json: model BPE with the normalisers, pre-tokenisers, decoders,
//     added tokens and post-processor it declares (HF `tokenizers` semantics).
//   - No vocabulary (synthetic models, HF directories without tokenizer.json): a byte-level
//     vocabulary, <unk> <s> </s> then one token per byte; the ids past 258 decode to nothing.
// The pipelines live in text/; this class picks one and adds the model's special ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/weight_source.h"

namespace shardwise {

namespace tok {
class Engine;
}

class Tokenizer {
 public:
  // Throws Error (naming the file) for a vocabulary we cannot read: unknown model or pre-tokeniser
  // type, missing merges, malformed tokenizer.json.
  explicit Tokenizer(const WeightSource& source);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;

  // Ids for text, which must be valid UTF-8 (else Error with the byte offset). With add_special,
  // BOS (and EOS) are added as the model asks. With parse_special, control tokens written in the
  // text ("<|im_start|>", "<s>") are those tokens; user-defined added tokens always are.
  std::vector<int32_t> encode(const std::string& text, bool add_special, bool parse_special = true) const;
  // The bytes a token adds to running text: what streaming prints. Control tokens give "".
  // A byte token gives one byte, which may be part of a UTF-8 sequence (see tok::TextStream).
  std::string piece(int32_t id) const;
  // The token's string in the vocabulary ("Ġworld", "▁the", "<0x0A>", "<|im_end|>").
  std::string token_text(int32_t id) const;
  // Text of ids through the model's decoder (leading-space rules included); always valid UTF-8
  // (broken sequences become U+FFFD). Control tokens are written unless skip_special (GGUF
  // vocabularies never write them, as llama.cpp's detokenizer does not).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }  // end of turn (<|eot_id|>, <|im_end|>), -1 if none
  bool add_bos() const { return add_bos_; }
  // Ids that end a generation: EOS, EOT, EOM and the model's other end tokens.
  const std::vector<int32_t>& eog_ids() const { return eog_; }
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const;
  int64_t vocab_size() const { return vocab_size_; }
  // "gpt2" / "spm" (GGUF vocabularies), "hf-bpe" (tokenizer.json), "bytes" (none in the file).
  const std::string& kind() const { return kind_; }
  // Id of a token by its vocabulary string, -1 if none.
  int32_t find_token(const std::string& text) const;
  // The chat template the file carries ("" if none).
  const std::string& chat_template() const { return chat_template_; }

 private:
  std::string kind_;
  std::unique_ptr<tok::Engine> engine_;  // null for "bytes"
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1;
  bool add_bos_ = false;
  std::vector<int32_t> eog_;
  std::string chat_template_;
};

}  // namespace shardwise

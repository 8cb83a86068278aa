// text/pipeline.h — a tokenizer as plain data plus the engine that runs it.
// Both vocabulary sources are turned into one Pipeline (HF `tokenizers`' stages):
//   added tokens (matched whole) -> normalisers -> pre-tokenisers -> model (BPE by merge rank, or
//   SentencePiece-style BPE by score) -> ids;   ids -> decoders -> bytes.
// gguf_vocab.cpp builds it the way llama.cpp reads a GGUF vocabulary; hf_tokenizer_json.cpp the way
// HF `tokenizers` reads tokenizer.json. The engine never looks at files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/unicode.h"

namespace shardwise::tok {

// llama.cpp's token types (GGUF tokenizer.ggml.token_type).
enum class TokenAttr : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6
};

// A token matched as a whole string before anything else runs (HF added_tokens; GGUF control and
// user-defined tokens, as llama.cpp's parse_special does).
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = true;                  // control token: matched only when parsing specials; skipped by skip_special
  bool normalized = false;              // matched in normalised text instead of raw text
  bool lstrip = false, rstrip = false;  // swallows whitespace on that side
  std::string match;  // filled by the Engine: content, passed through the normalisers when `normalized`
};

struct NormStep {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace } kind;
  explicit NormStep(Kind k) : kind(k) {}
  std::string text, content;  // Prepend: text; Replace: text (literal) or regex -> content
  std::shared_ptr<Regex> regex;
  bool left = true, right = true;  // Strip
};

struct PreStep {
  enum Kind { Split, ByteLevel, Metaspace, Digits, WhitespaceSplit } kind;
  explicit PreStep(Kind k) : kind(k) {}
  // Split: a literal or a regex; behaviour as HF's SplitDelimiterBehavior.
  enum Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous } behavior = Isolated;
  std::string literal;
  std::shared_ptr<Regex> regex;
  bool invert = false;
  bool add_prefix_space = false;             // ByteLevel
  bool use_regex = true;                     // ByteLevel: split with the GPT-2 regex first
  std::string replacement = "\xE2\x96\x81";  // Metaspace ("▁")
  enum Prepend { Always, Never, First } prepend = Always;
  bool split = true;               // Metaspace
  bool individual_digits = false;  // Digits
};

struct DecStep {
  enum Kind { ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip } kind;
  explicit DecStep(Kind k) : kind(k) {}
  std::string text, content;  // Replace: text -> content; Strip: content (one character)
  std::string replacement = "\xE2\x96\x81";
  bool prepend_never = false;  // Metaspace
  int strip_start = 0, strip_stop = 0;
};

struct Pipeline {
  std::string origin;  // file name for messages
  enum class Model { Bpe, Spm } model = Model::Bpe;
  std::vector<std::string> tokens;  // id -> vocabulary string
  std::vector<TokenAttr> attrs;
  std::vector<float> scores;                                // Spm
  std::vector<std::pair<std::string, std::string>> merges;  // Bpe, by rank
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t unk_id = -1;
  std::vector<AddedToken> added;
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_tokenizers;
  std::vector<DecStep> decoders;
  bool decoder_joins_with_space = false;        // tokenizer.json without a decoder: HF joins tokens with " "
  bool render_control_tokens = true;            // decode() writes control tokens' text (HF); llama.cpp does not
  std::vector<int32_t> prefix_ids, suffix_ids;  // added by encode(add_special)
};

// The engine: built once from a Pipeline, then const and thread-safe.
class Engine {
 public:
  explicit Engine(Pipeline p);

  // Ids for valid UTF-8 text; with parse_special, control tokens written in the text are matched.
  std::vector<int32_t> encode(const std::string& text, bool add_special, bool parse_special) const;
  // Text of ids through the declared decoders (ill-formed UTF-8 is kept as bytes).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;
  // Bytes one token adds inside running text (for streaming): the decoders applied to this token
  // alone, as a continuation (no start-of-text stripping). Control tokens give "".
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }

  const Pipeline& pipeline() const { return p_; }
  int32_t find(const std::string& token) const;  // id of a vocabulary string, -1 if none

 private:
  struct Segment {
    std::string text;
    int32_t token = -1;     // >= 0: an added token
    bool at_start = false;  // begins at offset 0 of the original text (Metaspace "first")
  };
  void split_added(std::vector<Segment>& segs, bool normalized_pass, bool parse_special) const;
  std::string run_normalizers(const std::string& s) const;
  std::vector<std::string> run_pre_tokenizers(const std::string& s, bool at_start) const;
  void model_encode(const std::string& word, std::vector<int32_t>& out) const;
  void bpe_encode(const std::string& word, std::vector<int32_t>& out) const;
  void spm_encode(const std::string& text, std::vector<int32_t>& out) const;
  void push_char_fallback(const std::string& ch, std::vector<int32_t>& out) const;
  // HF's decode_chain over token strings; `continuation` = a piece inside running text (no
  // start-of-text stripping).
  std::vector<std::string> run_decoders(std::vector<std::string> toks, bool continuation) const;

  Pipeline p_;
  std::unordered_map<std::string, int32_t> lookup_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_;  // (left id, right id) -> (rank, merged id)
  int32_t byte_tokens_[256];
  std::vector<bool> is_added_;
  std::vector<bool> is_special_;
  std::vector<std::string> pieces_;
  std::unique_ptr<Regex> gpt2_regex_;  // for ByteLevel(use_regex)
};

// GPT-2's pre-tokeniser regex (HF ByteLevel with use_regex).
extern const char* const kGpt2Regex;

}  // namespace shardwise::tok

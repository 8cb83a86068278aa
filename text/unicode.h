// text/unicode.h — the Unicode pieces tokenizers need: UTF-8 checks and code points,
// GPT-2's byte <-> printable-character map, normalisation forms (utf8proc) and PCRE2 regexes with
// Unicode properties. Pure functions on strings; no tokenizer state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::tok {

// Length of the UTF-8 sequence a lead byte starts (1 for continuation/invalid bytes, so callers
// always advance).
size_t utf8_len(unsigned char lead);

// Offset of the first byte that does not belong to a well-formed UTF-8 sequence, or npos.
// Rejects overlong forms, surrogates and code points above U+10FFFF, as Python and Rust do.
size_t utf8_invalid_offset(const std::string& s);

// Code points of valid UTF-8 (check first with utf8_invalid_offset).
std::vector<uint32_t> utf8_codepoints(const std::string& s);
void utf8_append(std::string& out, uint32_t cp);

// Bytes at the end of `s` that start a UTF-8 sequence the rest of which has not arrived yet
// (0 when `s` ends on a character boundary or with bytes that can never become valid).
size_t utf8_incomplete_tail(const std::string& s);

// `s` with each maximal ill-formed subpart replaced by U+FFFD (as Python's errors="replace").
std::string utf8_sanitize(const std::string& s);

// GPT-2's byte-level alphabet: every byte maps to one printable code point ("Ġ" for the space).
uint32_t byte_to_unicode(unsigned char b);
int unicode_to_byte(uint32_t cp);  // -1 when cp is not in the alphabet
std::string byte_level_encode(const std::string& bytes);
// Inverse of byte_level_encode; false when a character is not in the alphabet.
bool byte_level_decode(const std::string& text, std::string* bytes);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(const std::string& s, NormalForm form);
std::string lowercase(const std::string& s);
std::string strip_accents(const std::string& s);  // drops combining marks (Mn)
bool is_whitespace(uint32_t cp);                  // Unicode White_Space, as Rust's char::is_whitespace
// Removes leading and/or trailing whitespace.
std::string strip_whitespace(const std::string& s, bool left, bool right);

// A compiled PCRE2 pattern (UTF + UCP: \p{L}, \s, \w follow Unicode). Thread-safe to use.
class Regex {
 public:
  // Throws Error naming `context` when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& context);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty, non-overlapping matches of valid UTF-8 text as (offset, length), left to right.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

}  // namespace shardwise::tok

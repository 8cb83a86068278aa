// executor/session/tokenizer.cpp — interim greedy tokenizer (see tokenizer.h for its limits).
#include "executor/session/tokenizer.h"

#include <cstring>

#include "core/error.h"

namespace shardwise {
namespace {

// GPT-2's byte <-> printable code point table.
std::vector<int32_t> gpt2_byte_to_codepoint() {
  std::vector<int32_t> table(256, -1);
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = printable ? b : next++;
  }
  return table;
}

// Decodes UTF-8 into code points; returns false on invalid input.
bool utf8_codepoints(const std::string& s, std::vector<int32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    int32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    out->push_back(cp);
    i += static_cast<size_t>(len);
  }
  return true;
}

bool parse_byte_token(const std::string& s, int* byte) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return false;
  char* end = nullptr;
  long v = std::strtol(s.substr(3, 2).c_str(), &end, 16);
  if (*end != '\0') return false;
  *byte = static_cast<int>(v);
  return true;
}

}  // namespace

Tokenizer::Tokenizer(const WeightSource& src) {
  std::memset(byte_token_, -1, sizeof byte_token_);
  const TokenizerInfo& info = src.tokenizer();
  const int64_t vocab = src.spec().vocab_size;
  if (!info.tokens.empty() && (info.model == "llama" || info.model == "gpt2")) {
    kind_ = info.model == "llama" ? "spm" : "gpt2";
    dummy_prefix_ = kind_ == "spm";
    const auto b2c = gpt2_byte_to_codepoint();
    std::vector<int> c2b(512, -1);
    for (int b = 0; b < 256; ++b) c2b[b2c[b]] = b;
    for (size_t id = 0; id < info.tokens.size(); ++id) {
      const std::string& t = info.tokens[id];
      const int32_t type = id < info.token_types.size() ? info.token_types[id] : 1;
      std::string bytes;
      bool control = type == 2 || type == 3 || type == 5;  // unknown, control, unused
      if (type == 2 && unk_ < 0) unk_ = static_cast<int32_t>(id);
      int byte = 0;
      if (kind_ == "spm" && type == 6 && parse_byte_token(t, &byte)) {
        bytes.assign(1, static_cast<char>(byte));
        byte_token_[byte] = static_cast<int32_t>(id);
      } else if (kind_ == "spm") {
        for (size_t i = 0; i < t.size(); ++i) {
          if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
            bytes.push_back(' ');
            i += 2;
          } else {
            bytes.push_back(t[i]);
          }
        }
      } else {
        std::vector<int32_t> cps;
        if (utf8_codepoints(t, &cps)) {
          for (int32_t cp : cps) {
            if (cp >= 0 && cp < 512 && c2b[cp] >= 0) bytes.push_back(static_cast<char>(c2b[cp]));
            else bytes.clear(), control = true;
            if (control) break;
          }
        }
        if (!control && bytes.size() == 1) byte_token_[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
      }
      pieces_.push_back(control ? std::string() : bytes);
      is_control_.push_back(control);
      if (!control && !bytes.empty() && !lookup_.count(bytes)) {
        lookup_[bytes] = static_cast<int32_t>(id);
        max_piece_ = std::max(max_piece_, bytes.size());
      }
    }
    if (kind_ == "spm" && unk_ < 0) unk_ = 0;  // llama.cpp's SentencePiece default
    bos_ = static_cast<int32_t>(info.bos_id);
    eos_ = static_cast<int32_t>(info.eos_id);
    add_bos_ = info.add_bos && bos_ >= 0;
    return;
  }
  // No usable vocabulary: <unk> <s> </s>, then the 256 bytes; the rest decode to nothing.
  kind_ = "bytes";
  if (vocab < 3 + 256) return;  // encode() reports that text cannot be tokenised
  for (int64_t id = 0; id < vocab; ++id) {
    const bool is_byte = id >= 3 && id < 3 + 256;
    pieces_.push_back(is_byte ? std::string(1, static_cast<char>(id - 3)) : std::string());
    is_control_.push_back(!is_byte);
    if (is_byte) byte_token_[id - 3] = static_cast<int32_t>(id);
  }
  bos_ = 1;
  eos_ = 2;
  add_bos_ = true;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int32_t> cps;
  if (!utf8_codepoints(text, &cps)) fail("the prompt is not valid UTF-8");
  if (pieces_.empty())
    fail("this model has no tokenizer and its vocabulary is too small for byte tokens; pass --tokens instead");
  std::vector<int32_t> ids;
  if (add_special && add_bos_) ids.push_back(bos_);
  std::string s = (dummy_prefix_ && !text.empty()) ? " " + text : text;
  size_t i = 0;
  while (i < s.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t len = std::min(max_piece_, s.size() - i); len >= 1 && best < 0; --len) {
      auto it = lookup_.find(s.substr(i, len));
      if (it != lookup_.end()) {
        best = it->second;
        best_len = len;
      }
    }
    if (best < 0) {
      best = byte_token_[static_cast<unsigned char>(s[i])];
      best_len = 1;
      if (best < 0) best = unk_;  // SentencePiece without byte fallback: <unk>, as llama.cpp does
      if (best < 0) fail("byte 0x", std::hex, int(static_cast<unsigned char>(s[i])), " has no token in this vocabulary");
    }
    ids.push_back(best);
    i += best_len;
  }
  return ids;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) return std::string();
  return pieces_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += piece(id);
  if (dummy_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace shardwise

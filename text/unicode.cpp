// text/unicode.cpp — UTF-8, byte-level alphabet, utf8proc normalisation, PCRE2.
#include "text/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace shardwise::tok {

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

namespace {

// Length of the well-formed sequence at s[i] (0 if ill-formed or cut short); cp receives its value.
size_t decode_at(const std::string& s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  uint32_t v, min;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2, v = c & 0x1F, min = 0x80;
  else if ((c >> 4) == 0xE)
    len = 3, v = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(k) >> 6) != 2) return 0;
    v = (v << 6) | (b(k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

}  // namespace

size_t utf8_invalid_offset(const std::string& s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = decode_at(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

std::vector<uint32_t> utf8_codepoints(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = decode_at(s, i, &cp);
    out.push_back(n ? cp : 0xFFFD);
    i += n ? n : 1;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_incomplete_tail(const std::string& s) {
  // A lead byte within the last 3 bytes whose sequence runs past the end, with only continuation
  // bytes after it, is waiting for more bytes.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c >> 6) == 2) continue;  // continuation byte: keep looking for the lead
    const size_t need = (c >= 0xC2 && c <= 0xDF) ? 2 : ((c >> 4) == 0xE) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    return (need > back) ? back : 0;
  }
  return 0;
}

std::string utf8_sanitize(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = decode_at(s, i, &cp);
    if (n) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    // One U+FFFD per maximal ill-formed subpart (Unicode's recommended practice, as Python and
    // Rust's from_utf8_lossy): a lead byte plus the continuation bytes that still fit it.
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t need = (c >= 0xC2 && c <= 0xDF) ? 2 : ((c >> 4) == 0xE) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 1;
    size_t k = 1;
    for (; k < need && i + k < s.size(); ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (d < lo || d > hi) break;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points used are < 324
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

uint32_t byte_to_unicode(unsigned char b) {
  return byte_map().to_cp[b];
}

int unicode_to_byte(uint32_t cp) {
  return cp < 324 ? byte_map().to_byte[cp] : -1;
}

std::string byte_level_encode(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) utf8_append(out, byte_to_unicode(c));
  return out;
}

bool byte_level_decode(const std::string& text, std::string* bytes) {
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = decode_at(text, i, &cp);
    if (n == 0) return false;
    const int b = unicode_to_byte(cp);
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    i += n;
  }
  return true;
}

std::string normalize(const std::string& s, NormalForm form) {
  if (s.empty()) return s;
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::NFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::NFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::NFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0) fail("text normalisation failed: ", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

std::string lowercase(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t cp : utf8_codepoints(s))
    utf8_append(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  return out;
}

std::string strip_accents(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t cp : utf8_codepoints(s))
    if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_MN) utf8_append(out, cp);
  return out;
}

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string strip_whitespace(const std::string& s, bool left, bool right) {
  const std::vector<uint32_t> cps = utf8_codepoints(s);
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && is_whitespace(cps[a])) ++a;
  if (right)
    while (b > a && is_whitespace(cps[b - 1])) --b;
  std::string out;
  for (size_t i = a; i < b; ++i) utf8_append(out, cps[i]);
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& context) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(context, ": regex /", pattern, "/ does not compile at offset ", err_off, ": ", reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is used if it fails
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) fail("out of memory for a regex match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("regex /", pattern_, "/ failed: ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t a = ov[0], b = ov[1];
    if (b > a) {
      out.emplace_back(a, b - a);
      start = b;
    } else {
      // Empty match: step over one character so the scan makes progress.
      if (a >= text.size()) break;
      start = a + utf8_len(static_cast<unsigned char>(text[a]));
    }
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace shardwise::tok

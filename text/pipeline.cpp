// text/pipeline.cpp — the tokenizer engine (see pipeline.h). The stages follow HF
// `tokenizers` (normalizers, pre_tokenizers, models/bpe, decoders); the SentencePiece-style model
// follows llama.cpp's llm_tokenizer_spm (merge the best-scoring adjacent pair, then byte fallback).
#include "text/pipeline.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace shardwise::tok {

const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

bool parse_byte_token(const std::string& s, int* byte) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return false;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = s[static_cast<size_t>(i)];
    const int d = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                           : -1;
    if (d < 0) return false;
    v = v * 16 + d;
  }
  *byte = v;
  return true;
}

struct Piece {
  size_t off, len;
  bool match;
};

// Cuts `s` into pieces at the matches (matches and the gaps between them), then combines them as
// HF's SplitDelimiterBehavior says. Returns (offset, length) of the kept pieces, empty ones dropped.
std::vector<std::pair<size_t, size_t>> split_pieces(const std::string& s,
                                                    const std::vector<std::pair<size_t, size_t>>& matches,
                                                    PreStep::Behavior behavior, bool invert) {
  std::vector<Piece> all;
  size_t pos = 0;
  for (const auto& m : matches) {
    if (m.first > pos) all.push_back({pos, m.first - pos, invert});
    all.push_back({m.first, m.second, !invert});
    pos = m.first + m.second;
  }
  if (pos < s.size()) all.push_back({pos, s.size() - pos, invert});
  std::vector<Piece> out;
  switch (behavior) {
    case PreStep::Removed:
      for (const auto& p : all)
        if (!p.match) out.push_back(p);
      break;
    case PreStep::Isolated:
      out = all;
      break;
    case PreStep::MergedWithPrevious: {
      bool prev_match = false;
      for (const auto& p : all) {
        if (p.match && !prev_match && !out.empty())
          out.back().len = p.off + p.len - out.back().off;
        else
          out.push_back(p);
        prev_match = p.match;
      }
      break;
    }
    case PreStep::MergedWithNext: {
      bool prev_match = false;
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) {
          out.back().len += out.back().off - it->off;
          out.back().off = it->off;
        } else {
          out.push_back(*it);
        }
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case PreStep::Contiguous: {
      bool prev_match = false;
      for (const auto& p : all) {
        if (p.match == prev_match && !out.empty())
          out.back().len = p.off + p.len - out.back().off;
        else
          out.push_back(p);
        prev_match = p.match;
      }
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> r;
  for (const auto& p : out)
    if (p.len > 0) r.emplace_back(p.off, p.len);
  return r;
}

std::vector<std::pair<size_t, size_t>> literal_matches(const std::string& s, const std::string& lit) {
  std::vector<std::pair<size_t, size_t>> m;
  if (lit.empty()) return m;
  for (size_t pos = s.find(lit); pos != std::string::npos; pos = s.find(lit, pos + lit.size()))
    m.emplace_back(pos, lit.size());
  return m;
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

Engine::Engine(Pipeline p) : p_(std::move(p)) {
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  const size_t n = p_.tokens.size();
  if (p_.attrs.size() < n) p_.attrs.resize(n, TokenAttr::Normal);
  lookup_.reserve(n * 2);
  for (size_t id = 0; id < n; ++id) {
    if (!p_.tokens[id].empty()) lookup_.emplace(p_.tokens[id], static_cast<int32_t>(id));
    int b = 0;
    if (parse_byte_token(p_.tokens[id], &b) && byte_tokens_[b] < 0) byte_tokens_[b] = static_cast<int32_t>(id);
  }
  for (const auto* ids : {&p_.prefix_ids, &p_.suffix_ids})
    for (int32_t id : *ids)
      SW_CHECK(id >= 0 && static_cast<size_t>(id) < n, p_.origin, ": special token id ", id,
               " that every encoding with specials adds is outside the vocabulary of ", n, " tokens");
  // Byte-level BPE spells every byte as one symbol of GPT-2's alphabet; a vocabulary lacking one,
  // with no <unk>, would drop that byte's text without a word.
  const bool byte_level = std::any_of(p_.pre_tokenizers.begin(), p_.pre_tokenizers.end(),
                                      [](const PreStep& s) { return s.kind == PreStep::ByteLevel; });
  for (int b = 0; byte_level && p_.unk_id < 0 && b < 256; ++b)
    SW_CHECK(lookup_.count(byte_level_encode(std::string(1, static_cast<char>(b)))), p_.origin,
             ": the byte-level vocabulary has no token for byte 0x", std::hex, b,
             " (and no unk_token): text with that byte would be dropped");
  is_added_.assign(n, false);
  is_special_.assign(n, false);
  for (const auto& a : p_.added) {
    SW_CHECK(a.id >= 0 && static_cast<size_t>(a.id) < n, p_.origin, ": added token '", a.content, "' has id ", a.id,
             " outside the vocabulary of ", n);
    SW_CHECK(!a.content.empty(), p_.origin, ": added token ", a.id, " is empty");
    is_added_[a.id] = true;
    is_special_[a.id] = a.special;
  }
  // HF matches normalised added tokens in normalised text, so their content is normalised too.
  for (auto& a : p_.added) a.match = a.normalized ? run_normalizers(a.content) : a.content;
  p_.added.erase(std::remove_if(p_.added.begin(), p_.added.end(), [](const AddedToken& a) { return a.match.empty(); }),
                 p_.added.end());
  // Longest first, so that matching at one position takes the longest added token.
  std::stable_sort(p_.added.begin(), p_.added.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.match.size() > y.match.size(); });
  if (p_.model == Pipeline::Model::Bpe) {
    merge_.reserve(p_.merges.size() * 2);
    for (size_t r = 0; r < p_.merges.size(); ++r) {
      const auto& m = p_.merges[r];
      const int32_t a = find(m.first), b = find(m.second), c = find(m.first + m.second);
      if (a < 0 || b < 0 || c < 0) continue;  // llama.cpp and HF cannot apply such a merge either
      merge_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(r), c));
    }
  }
  for (const auto& s : p_.pre_tokenizers)
    if (s.kind == PreStep::ByteLevel && s.use_regex && !gpt2_regex_)
      gpt2_regex_ = std::make_unique<Regex>(kGpt2Regex, "GPT-2 regex");
  pieces_.resize(n);
  for (size_t id = 0; id < n; ++id) {
    const TokenAttr a = p_.attrs[id];
    if (a == TokenAttr::Control || a == TokenAttr::Unknown || a == TokenAttr::Unused || is_special_[id]) continue;
    std::vector<std::string> t = run_decoders({p_.tokens[id]}, true);
    for (auto& s : t) pieces_[id] += s;
  }
}

int32_t Engine::find(const std::string& token) const {
  auto it = lookup_.find(token);
  return it == lookup_.end() ? -1 : it->second;
}

void Engine::split_added(std::vector<Segment>& segs, bool normalized_pass, bool parse_special) const {
  bool any = false;
  for (const auto& a : p_.added)
    if (a.normalized == normalized_pass && (parse_special || !a.special)) any = true;
  if (!any) return;
  std::vector<Segment> out;
  for (auto& seg : segs) {
    if (seg.token >= 0) {
      out.push_back(std::move(seg));
      continue;
    }
    const std::string& s = seg.text;
    size_t start = 0;  // start of the pending text
    size_t i = 0;
    bool first = true;
    while (i < s.size()) {
      const AddedToken* hit = nullptr;
      for (const auto& a : p_.added) {  // longest first
        if (a.normalized != normalized_pass || (!parse_special && a.special)) continue;
        if (s.compare(i, a.match.size(), a.match) == 0) {
          hit = &a;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t left_end = i, right = i + hit->match.size();
      if (hit->lstrip)
        while (left_end > start && is_ascii_space(s[left_end - 1])) --left_end;
      if (hit->rstrip)
        while (right < s.size() && is_ascii_space(s[right])) ++right;
      if (left_end > start) out.push_back({s.substr(start, left_end - start), -1, seg.at_start && first && start == 0});
      out.push_back({std::string(), hit->id, false});
      first = false;
      start = i = right;
    }
    if (start < s.size()) out.push_back({s.substr(start), -1, seg.at_start && start == 0});
  }
  segs = std::move(out);
}

std::string Engine::run_normalizers(const std::string& in) const {
  std::string s = in;
  for (const auto& st : p_.normalizers) {
    switch (st.kind) {
      case NormStep::NFC:
        s = normalize(s, NormalForm::NFC);
        break;
      case NormStep::NFD:
        s = normalize(s, NormalForm::NFD);
        break;
      case NormStep::NFKC:
        s = normalize(s, NormalForm::NFKC);
        break;
      case NormStep::NFKD:
        s = normalize(s, NormalForm::NFKD);
        break;
      case NormStep::Lowercase:
        s = lowercase(s);
        break;
      case NormStep::StripAccents:
        s = strip_accents(s);
        break;
      case NormStep::Strip:
        s = strip_whitespace(s, st.left, st.right);
        break;
      case NormStep::Prepend:
        if (!s.empty()) s = st.text + s;
        break;
      case NormStep::Replace:
        if (st.regex) {
          std::string r;
          size_t pos = 0;
          for (const auto& m : st.regex->find_all(s)) {
            r.append(s, pos, m.first - pos);
            r += st.content;
            pos = m.first + m.second;
          }
          r.append(s, pos, std::string::npos);
          s = std::move(r);
        } else {
          s = replace_all(s, st.text, st.content);
        }
        break;
    }
  }
  return s;
}

std::vector<std::string> Engine::run_pre_tokenizers(const std::string& text, bool at_start) const {
  struct Split {
    std::string s;
    bool at_start;
  };
  std::vector<Split> splits{{text, at_start}};
  auto resplit = [&](const std::vector<std::pair<size_t, size_t>>& matches, const Split& sp, PreStep::Behavior b,
                     bool invert, std::vector<Split>& out) {
    for (const auto& r : split_pieces(sp.s, matches, b, invert))
      out.push_back({sp.s.substr(r.first, r.second), sp.at_start && r.first == 0});
  };
  for (const auto& st : p_.pre_tokenizers) {
    std::vector<Split> next;
    for (auto& sp : splits) {
      switch (st.kind) {
        case PreStep::Split:
          resplit(st.regex ? st.regex->find_all(sp.s) : literal_matches(sp.s, st.literal), sp, st.behavior, st.invert,
                  next);
          break;
        case PreStep::Digits: {
          static const Regex digit("\\p{N}", "Digits");
          resplit(digit.find_all(sp.s), sp, st.individual_digits ? PreStep::Isolated : PreStep::Contiguous, false,
                  next);
          break;
        }
        case PreStep::WhitespaceSplit: {
          static const Regex ws("\\s+", "WhitespaceSplit");
          resplit(ws.find_all(sp.s), sp, PreStep::Removed, false, next);
          break;
        }
        case PreStep::ByteLevel: {
          Split cur = sp;
          if (st.add_prefix_space && !starts_with(cur.s, " ")) cur.s = " " + cur.s;
          std::vector<Split> parts;
          if (st.use_regex)
            resplit(gpt2_regex_->find_all(cur.s), cur, PreStep::Isolated, false, parts);
          else
            parts.push_back(cur);
          for (auto& p : parts) next.push_back({byte_level_encode(p.s), p.at_start});
          break;
        }
        case PreStep::Metaspace: {
          Split cur{replace_all(sp.s, " ", st.replacement), sp.at_start};
          const bool prepend = st.prepend == PreStep::Always || (st.prepend == PreStep::First && sp.at_start);
          if (prepend && !starts_with(cur.s, st.replacement)) cur.s = st.replacement + cur.s;
          if (st.split)
            resplit(literal_matches(cur.s, st.replacement), cur, PreStep::MergedWithNext, false, next);
          else
            next.push_back(std::move(cur));
          break;
        }
      }
    }
    splits = std::move(next);
  }
  std::vector<std::string> words;
  words.reserve(splits.size());
  for (auto& sp : splits)
    if (!sp.s.empty()) words.push_back(std::move(sp.s));
  return words;
}

void Engine::push_char_fallback(const std::string& ch, std::vector<int32_t>& out) const {
  if (p_.byte_fallback) {
    bool all = true;
    for (unsigned char c : ch) all = all && byte_tokens_[c] >= 0;
    if (all) {
      for (unsigned char c : ch) out.push_back(byte_tokens_[c]);
      return;
    }
  }
  if (p_.unk_id >= 0) out.push_back(p_.unk_id);
  // No unk token: the character is dropped, as HF tokenizers and llama.cpp do.
}

void Engine::bpe_encode(const std::string& word, std::vector<int32_t>& out) const {
  if (p_.ignore_merges) {
    const int32_t id = find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string ch = word.substr(i, len);
    i += len;
    ids.clear();
    const int32_t id = find(ch);
    if (id >= 0)
      ids.push_back(id);
    else
      push_char_fallback(ch, ids);
    for (int32_t t : ids) {
      // fuse_unk: a run of unknown characters becomes one <unk>.
      if (t == p_.unk_id && id < 0 && p_.fuse_unk && !sym.empty() && sym.back().id == p_.unk_id) continue;
      sym.push_back({t, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true});
    }
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
  };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank > b.rank || (a.rank == b.rank && a.pos > b.pos); };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> q(worse);
  auto consider = [&](int pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merge_.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
    if (it != merge_.end()) q.push({it->second.first, pos, it->second.second});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merge_.find(pair_key(left.id, sym[left.next].id));
    if (it == merge_.end() || it->second.second != c.new_id) continue;  // stale
    Sym& right = sym[left.next];
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Engine::spm_encode(const std::string& text, std::vector<int32_t>& out) const {
  struct Sym {
    size_t off, n;
    int prev, next;
  };
  std::vector<Sym> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(text[i])), text.size() - i);
    sym.push_back({i, len, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> q(worse);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const std::string s = text.substr(sym[l].off, sym[l].n + sym[r].n);
    const int32_t id = find(s);
    if (id < 0) return;
    const float score = static_cast<size_t>(id) < p_.scores.size() ? p_.scores[id] : 0.0f;
    q.push({l, r, score, s.size()});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!q.empty()) {
    const Bigram b = q.top();
    q.pop();
    Sym& l = sym[b.left];
    Sym& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Merged symbols are tokens by construction; a single character that is not one falls back to
  // its bytes (<0xXX>, else the one-byte token, else <unk>), as llama.cpp's resegment does.
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string s = text.substr(sym[i].off, sym[i].n);
    const int32_t id = find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : s) {
      int32_t t = byte_tokens_[c];
      if (t < 0) t = find(std::string(1, static_cast<char>(c)));
      if (t < 0) t = p_.unk_id;
      if (t < 0)
        fail(p_.origin, ": byte 0x", std::hex, static_cast<int>(c), " has no token and the vocabulary has no <unk>");
      out.push_back(t);
    }
  }
}

void Engine::model_encode(const std::string& word, std::vector<int32_t>& out) const {
  if (p_.model == Pipeline::Model::Spm)
    spm_encode(word, out);
  else
    bpe_encode(word, out);
}

std::vector<int32_t> Engine::encode(const std::string& text, bool add_special, bool parse_special) const {
  std::vector<int32_t> ids;
  if (add_special) ids.insert(ids.end(), p_.prefix_ids.begin(), p_.prefix_ids.end());
  std::vector<Segment> segs{{text, -1, true}};
  if (text.empty()) segs.clear();
  split_added(segs, false, parse_special);
  for (const auto& seg : segs) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
      continue;
    }
    std::vector<Segment> sub{{run_normalizers(seg.text), -1, seg.at_start}};
    split_added(sub, true, parse_special);
    for (const auto& s : sub) {
      if (s.token >= 0) {
        ids.push_back(s.token);
        continue;
      }
      for (const auto& w : run_pre_tokenizers(s.text, s.at_start)) model_encode(w, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), p_.suffix_ids.begin(), p_.suffix_ids.end());
  return ids;
}

std::vector<std::string> Engine::run_decoders(std::vector<std::string> toks, bool continuation) const {
  bool fused = false;
  for (const auto& st : p_.decoders) {
    switch (st.kind) {
      case DecStep::ByteLevel: {
        std::string all;
        for (const auto& t : toks) {
          std::string bytes;
          if (byte_level_decode(t, &bytes))
            all += bytes;
          else
            all += t;  // not byte-level text (e.g. an added token): its own bytes, as HF does
        }
        toks.assign(1, std::move(all));
        fused = true;
        break;
      }
      case DecStep::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          const bool first = i == 0 && !continuation && !st.prepend_never;
          toks[i] = replace_all(toks[i], st.replacement, first ? "" : " ");
        }
        break;
      case DecStep::Replace:
        for (auto& t : toks) t = replace_all(t, st.text, st.content);
        break;
      case DecStep::ByteFallback:
        for (auto& t : toks) {
          int b = 0;
          if (parse_byte_token(t, &b)) t.assign(1, static_cast<char>(b));
        }
        break;
      case DecStep::Fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        fused = true;
        break;
      }
      case DecStep::Strip:
        if (continuation && fused) break;  // strips the start of the whole text, which a piece is not
        for (auto& t : toks) {
          size_t a = 0, b = t.size();
          const std::string& c = st.content;
          for (int k = 0; k < st.strip_start && !c.empty() && t.compare(a, c.size(), c) == 0 && a + c.size() <= b; ++k)
            a += c.size();
          for (int k = 0;
               k < st.strip_stop && !c.empty() && b >= a + c.size() && t.compare(b - c.size(), c.size(), c) == 0; ++k)
            b -= c.size();
          t = t.substr(a, b - a);
        }
        break;
    }
  }
  return toks;
}

std::string Engine::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= p_.tokens.size()) continue;
    const TokenAttr a = p_.attrs[id];
    const bool control =
        is_special_[id] || a == TokenAttr::Control || a == TokenAttr::Unknown || a == TokenAttr::Unused;
    if (control && (skip_special || !p_.render_control_tokens)) continue;
    toks.push_back(p_.tokens[id]);
  }
  if (p_.decoders.empty() && p_.decoder_joins_with_space) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  std::string out;
  for (const auto& t : run_decoders(std::move(toks), false)) out += t;
  return out;
}

}  // namespace shardwise::tok

// text/hf_tokenizer_json.cpp — an HF tokenizer.json as a Pipeline. Reads the parts
// that causal LMs use (model BPE; the normalisers, pre-tokenisers, decoders and post-processors
// listed in pipeline.h); anything else is an error naming the file and the field (a JSON path such
// as normalizer.normalizers[2].type).
// The document is untrusted: subtrees are read by reference (never copied: a copy recurses through
// the whole subtree), a Sequence nests at most kMaxSequenceDepth deep, and a value shown in a message
// is a scalar or the name of its kind, never a dump of a subtree.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "text/sources.h"

namespace shardwise::tok {
namespace {

using json = nlohmann::json;

// Real files nest a Sequence one or two deep.
constexpr int kMaxSequenceDepth = 64;

const json& null_json() {
  static const json n;
  return n;
}

// j[key] by reference; null when j is no object or has no such key.
const json& member(const json& j, const char* key) {
  if (!j.is_object()) return null_json();
  const auto it = j.find(key);
  return it == j.end() ? null_json() : *it;
}

// A value for a message: a scalar as written (cut at 40 characters), else its kind.
std::string brief(const json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  const std::string s = j.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// field.key (key alone at the top level), and field.key[i].
std::string sub(const std::string& field, const char* key) {
  return field.empty() ? std::string(key) : field + "." + key;
}
std::string index_field(const std::string& field, const char* key, size_t i) {
  return str_cat(sub(field, key), "[", i, "]");
}

struct Ctx {
  std::string path;
  template <typename... Args>
  [[noreturn]] void fail_at(const std::string& field, const Args&... args) const {
    fail(path, ": ", field, ": ", args...);
  }
  [[noreturn]] void unsupported(const std::string& field, const std::string& type) const {
    fail_at(field, "type '", type, "' is not supported");
  }
  // The component's "type": a string.
  std::string type_of(const json& j, const std::string& field) const {
    if (!j.is_object()) fail_at(field, "must be an object with a \"type\", got ", brief(j));
    const json& t = member(j, "type");
    if (t.is_null()) fail_at(field, "has no \"type\"");
    if (!t.is_string()) fail_at(field + ".type", "must be a string, got ", brief(t));
    return t.get<std::string>();
  }
  // Optional fields (absent or null: the fallback); present with another type: an error.
  std::string str_or(const json& j, const char* key, const std::string& field, const std::string& fallback) const {
    const json& v = member(j, key);
    if (v.is_null()) return fallback;
    if (!v.is_string()) fail_at(sub(field, key), "must be a string, got ", brief(v));
    return v.get<std::string>();
  }
  bool bool_or(const json& j, const char* key, const std::string& field, bool fallback) const {
    const json& v = member(j, key);
    if (v.is_null()) return fallback;
    if (!v.is_boolean()) fail_at(sub(field, key), "must be true or false, got ", brief(v));
    return v.get<bool>();
  }
  int64_t int_or(const json& j, const char* key, const std::string& field, int64_t fallback, int64_t lo,
                 int64_t hi) const {
    const json& v = member(j, key);
    if (v.is_null()) return fallback;
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      fail_at(sub(field, key), "must be an integer from ", lo, " to ", hi, ", got ", brief(v));
    return v.get<int64_t>();
  }
  // An optional array (absent or null: empty).
  const json& array_or_empty(const json& j, const char* key, const std::string& field) const {
    static const json empty = json::array();
    const json& v = member(j, key);
    if (v.is_null()) return empty;
    if (!v.is_array()) fail_at(sub(field, key), "must be an array, got ", brief(v));
    return v;
  }
  // A Sequence's entries, refused past kMaxSequenceDepth.
  const json& sequence(const json& j, const char* key, const std::string& field, int depth) const {
    if (depth >= kMaxSequenceDepth)  // named by its top-level field: the full path would be as deep
      fail_at(field.substr(0, field.find('.')), "Sequence nested more than ", kMaxSequenceDepth,
              " deep (real files nest one or two)");
    return array_or_empty(j, key, field);
  }
};

// {"String": "x"} or {"Regex": "..."}: sets literal or regex.
void read_pattern(const Ctx& c, const json& pat, const std::string& field, std::string* literal,
                  std::shared_ptr<Regex>* regex) {
  const json& s = member(pat, "String");
  const json& r = member(pat, "Regex");
  if (s.is_string()) {
    *literal = s.get<std::string>();
  } else if (r.is_string()) {
    *regex = std::make_shared<Regex>(r.get<std::string>(), c.path + ": " + field);
  } else if (pat.is_string()) {
    *literal = pat.get<std::string>();
  } else {
    c.fail_at(field, "has no pattern {\"String\": ...} or {\"Regex\": ...}");
  }
}

void read_normalizer(const Ctx& c, const json& j, const std::string& field, int depth, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, field);
  if (t == "Sequence") {
    const json& list = c.sequence(j, "normalizers", field, depth);
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(c, list[i], index_field(field, "normalizers", i), depth + 1, out);
  } else if (t == "NFC") {
    out.push_back(NormStep(NormStep::NFC));
  } else if (t == "NFD") {
    out.push_back(NormStep(NormStep::NFD));
  } else if (t == "NFKC") {
    out.push_back(NormStep(NormStep::NFKC));
  } else if (t == "NFKD") {
    out.push_back(NormStep(NormStep::NFKD));
  } else if (t == "Lowercase") {
    out.push_back(NormStep(NormStep::Lowercase));
  } else if (t == "StripAccents") {
    out.push_back(NormStep(NormStep::StripAccents));
  } else if (t == "Strip") {
    NormStep s(NormStep::Strip);
    s.left = c.bool_or(j, "strip_left", field, true);
    s.right = c.bool_or(j, "strip_right", field, true);
    out.push_back(s);
  } else if (t == "Prepend") {
    NormStep s(NormStep::Prepend);
    s.text = c.str_or(j, "prepend", field, "");
    out.push_back(s);
  } else if (t == "Replace") {
    NormStep s(NormStep::Replace);
    read_pattern(c, member(j, "pattern"), field + ".pattern", &s.text, &s.regex);
    s.content = c.str_or(j, "content", field, "");
    out.push_back(s);
  } else {
    c.unsupported(field, t);
  }
}

PreStep::Behavior read_behavior(const Ctx& c, const json& j, const std::string& field) {
  const std::string b = c.str_or(j, "behavior", field, "Isolated");
  if (b == "Removed") return PreStep::Removed;
  if (b == "Isolated") return PreStep::Isolated;
  if (b == "MergedWithPrevious") return PreStep::MergedWithPrevious;
  if (b == "MergedWithNext") return PreStep::MergedWithNext;
  if (b == "Contiguous") return PreStep::Contiguous;
  c.fail_at(field + ".behavior", "'", b,
            "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

PreStep::Prepend read_prepend_scheme(const Ctx& c, const json& j, const std::string& field) {
  const std::string s = c.str_or(j, "prepend_scheme", field, "");
  if (!s.empty()) return s == "never" ? PreStep::Never : s == "first" ? PreStep::First : PreStep::Always;
  return c.bool_or(j, "add_prefix_space", field, true) ? PreStep::Always : PreStep::Never;  // tokenizers < 0.14
}

void read_pre_tokenizer(const Ctx& c, const json& j, const std::string& field, int depth, std::vector<PreStep>& out) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, field);
  if (t == "Sequence") {
    const json& list = c.sequence(j, "pretokenizers", field, depth);
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(c, list[i], index_field(field, "pretokenizers", i), depth + 1, out);
  } else if (t == "Split") {
    PreStep s(PreStep::Split);
    read_pattern(c, member(j, "pattern"), field + ".pattern", &s.literal, &s.regex);
    s.behavior = read_behavior(c, j, field);
    s.invert = c.bool_or(j, "invert", field, false);
    out.push_back(s);
  } else if (t == "ByteLevel") {
    PreStep s(PreStep::ByteLevel);
    s.add_prefix_space = c.bool_or(j, "add_prefix_space", field, true);
    s.use_regex = c.bool_or(j, "use_regex", field, true);
    out.push_back(s);
  } else if (t == "Metaspace") {
    PreStep s(PreStep::Metaspace);
    s.replacement = c.str_or(j, "replacement", field, s.replacement);
    s.prepend = read_prepend_scheme(c, j, field);
    s.split = c.bool_or(j, "split", field, true);
    out.push_back(s);
  } else if (t == "Digits") {
    PreStep s(PreStep::Digits);
    s.individual_digits = c.bool_or(j, "individual_digits", field, false);
    out.push_back(s);
  } else if (t == "WhitespaceSplit") {
    out.push_back(PreStep(PreStep::WhitespaceSplit));
  } else if (t == "Whitespace") {
    PreStep s(PreStep::Split);
    s.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", c.path + ": " + field);
    s.behavior = PreStep::Removed;
    s.invert = true;
    out.push_back(s);
  } else if (t == "Punctuation") {
    PreStep s(PreStep::Split);
    s.regex = std::make_shared<Regex>(R"([\p{P}!-/:-@\[-`{-~])", c.path + ": " + field);
    s.behavior = read_behavior(c, j, field);
    out.push_back(s);
  } else {
    c.unsupported(field, t);
  }
}

void read_decoder(const Ctx& c, const json& j, const std::string& field, int depth, std::vector<DecStep>& out) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, field);
  if (t == "Sequence") {
    const json& list = c.sequence(j, "decoders", field, depth);
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(c, list[i], index_field(field, "decoders", i), depth + 1, out);
  } else if (t == "ByteLevel") {
    out.push_back(DecStep(DecStep::ByteLevel));
  } else if (t == "Metaspace") {
    DecStep s(DecStep::Metaspace);
    s.replacement = c.str_or(j, "replacement", field, s.replacement);
    s.prepend_never = read_prepend_scheme(c, j, field) == PreStep::Never;
    out.push_back(s);
  } else if (t == "Replace") {
    DecStep s(DecStep::Replace);
    std::shared_ptr<Regex> re;
    read_pattern(c, member(j, "pattern"), field + ".pattern", &s.text, &re);
    if (re) c.fail_at(field, "a Replace with a regex pattern is not supported");
    s.content = c.str_or(j, "content", field, "");
    out.push_back(s);
  } else if (t == "ByteFallback") {
    out.push_back(DecStep(DecStep::ByteFallback));
  } else if (t == "Fuse") {
    out.push_back(DecStep(DecStep::Fuse));
  } else if (t == "Strip") {
    DecStep s(DecStep::Strip);
    s.content = c.str_or(j, "content", field, " ");
    s.strip_start = static_cast<int>(c.int_or(j, "start", field, 0, 0, 1 << 20));
    s.strip_stop = static_cast<int>(c.int_or(j, "stop", field, 0, 0, 1 << 20));
    out.push_back(s);
  } else {
    c.unsupported(field, t);
  }
}

// A special token id the post-processor adds: an integer inside the vocabulary (else every encode
// with specials would fail later, blamed on the token ids).
int32_t special_id(const Ctx& c, const json& id, const std::string& field, size_t vocab) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || static_cast<uint64_t>(id.get<int64_t>()) >= vocab)
    c.fail_at(field, "token id ", brief(id), " is not in the vocabulary (ids 0 to ", vocab - 1, ")");
  return static_cast<int32_t>(id.get<int64_t>());
}

// Special tokens a post-processor adds before and after the sequence ($A).
struct PostIds {
  std::vector<int32_t>* prefix;
  std::vector<int32_t>* suffix;
  bool seen = false;
  size_t vocab = 0;
};

void read_template(const Ctx& c, const json& j, const std::string& field, PostIds& out) {
  out.seen = true;
  out.prefix->clear();
  out.suffix->clear();
  const json& specials = member(j, "special_tokens");
  if (!specials.is_null() && !specials.is_object())
    c.fail_at(field + ".special_tokens", "must be an object, got ", brief(specials));
  const json& single = c.array_or_empty(j, "single", field);
  bool after = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const std::string pf = index_field(field, "single", i);
    if (!member(piece, "Sequence").is_null()) {
      after = true;
    } else if (!member(piece, "SpecialToken").is_null()) {
      const std::string name = c.str_or(member(piece, "SpecialToken"), "id", pf + ".SpecialToken", "");
      const json& def = member(specials, name.c_str());
      if (def.is_null()) c.fail_at(pf, "names special token '", name, "' that special_tokens does not define");
      const std::string df = str_cat(field, ".special_tokens['", name, "']");
      const json& ids = c.array_or_empty(def, "ids", df);
      for (size_t k = 0; k < ids.size(); ++k)
        (after ? out.suffix : out.prefix)->push_back(special_id(c, ids[k], index_field(df, "ids", k), out.vocab));
    }
  }
}

void read_post_processor(const Ctx& c, const json& j, const std::string& field, int depth, PostIds& out) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, field);
  if (t == "Sequence") {
    const json& list = c.sequence(j, "processors", field, depth);
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(c, list[i], index_field(field, "processors", i), depth + 1, out);
  } else if (t == "ByteLevel") {
    // offsets only
  } else if (t == "TemplateProcessing") {
    read_template(c, j, field, out);
  } else if (t == "RobertaProcessing" || t == "BertProcessing") {
    out.seen = true;
    const json& cls = member(j, "cls");
    const json& sep = member(j, "sep");
    if (cls.is_array() && cls.size() == 2) *out.prefix = {special_id(c, cls[1], field + ".cls[1]", out.vocab)};
    if (sep.is_array() && sep.size() == 2) *out.suffix = {special_id(c, sep[1], field + ".sep[1]", out.vocab)};
  } else {
    c.unsupported(field, t);
  }
}

// model.vocab, model.merges and added_tokens into p.tokens, p.attrs, p.merges and p.added.
void read_vocabulary(const Ctx& c, const json& j, Pipeline& p) {
  const json& m = member(j, "model");
  const json& vocab = member(m, "vocab");
  const json& added = c.array_or_empty(j, "added_tokens", "");
  int64_t max_id = -1;
  for (const auto& kv : vocab.items()) {
    if (!kv.value().is_number_integer() || kv.value().get<int64_t>() < 0 ||
        kv.value().get<int64_t>() > (int64_t(1) << 24))
      c.fail_at("model.vocab['" + kv.key() + "']", "must be a token id from 0 to 16777216, got ", brief(kv.value()));
    max_id = std::max<int64_t>(max_id, kv.value().get<int64_t>());
  }
  for (size_t i = 0; i < added.size(); ++i)
    max_id = std::max(max_id, c.int_or(added[i], "id", index_field("", "added_tokens", i), -1, 0, int64_t(1) << 24));
  if (max_id < 0) fail(c.path, ": the vocabulary is empty");
  p.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
  p.attrs.assign(p.tokens.size(), TokenAttr::Unused);
  for (const auto& kv : vocab.items()) {
    const size_t id = static_cast<size_t>(kv.value().get<int64_t>());
    p.tokens[id] = kv.key();
    p.attrs[id] = TokenAttr::Normal;
  }
  const json& merges = member(m, "merges");
  p.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    if (e.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) fail(c.path, ": merges[", r, "] = '", s, "' is not two tokens separated by a space");
      p.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      p.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      fail(c.path, ": merges[", r, "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string field = index_field("", "added_tokens", i);
    AddedToken t;
    t.id = static_cast<int32_t>(c.int_or(a, "id", field, -1, 0, int64_t(1) << 24));
    t.content = c.str_or(a, "content", field, "");
    t.special = c.bool_or(a, "special", field, false);
    t.normalized = c.bool_or(a, "normalized", field, !t.special);
    t.lstrip = c.bool_or(a, "lstrip", field, false);
    t.rstrip = c.bool_or(a, "rstrip", field, false);
    if (t.id < 0 || t.content.empty()) c.fail_at(field, "has no id or content");
    p.tokens[static_cast<size_t>(t.id)] = t.content;
    p.attrs[static_cast<size_t>(t.id)] = t.special ? TokenAttr::Control : TokenAttr::UserDefined;
    p.added.push_back(t);
  }
}

// The model section: a BPE model whose options we support, then its vocabulary.
void read_model(const Ctx& c, const json& j, Pipeline& p) {
  const json& m = member(j, "model");
  std::string type = c.str_or(m, "type", "model", "");
  if (type.empty()) {  // old files leave the type out: tell the models apart by their fields
    type = m.contains("merges")                      ? "BPE"
           : member(m, "vocab").is_array()           ? "Unigram"
           : m.contains("continuing_subword_prefix") ? "WordPiece"
                                                     : "WordLevel";
  }
  if (type != "BPE")
    fail(c.path, ": tokenizer model type '", type,
         "' is not supported (supported: BPE, byte-level or SentencePiece-style)");
  if (!member(m, "vocab").is_object()) fail(c.path, ": model.vocab is missing or not an object");
  if (!member(m, "merges").is_array()) fail(c.path, ": model.merges is missing (a BPE model needs its merges)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!c.str_or(m, key, "model", "").empty()) fail(c.path, ": BPE option ", key, " is not supported");
  read_vocabulary(c, j, p);
  p.byte_fallback = c.bool_or(m, "byte_fallback", "model", false);
  p.fuse_unk = c.bool_or(m, "fuse_unk", "model", false);
  p.ignore_merges = c.bool_or(m, "ignore_merges", "model", false);
  const std::string unk = c.str_or(m, "unk_token", "model", "");
  if (!unk.empty()) {
    for (size_t i = 0; i < p.tokens.size(); ++i)
      if (p.tokens[i] == unk) p.unk_id = static_cast<int32_t>(i);
    if (p.unk_id < 0) fail(c.path, ": model.unk_token '", unk, "' is not in the vocabulary");
  }
}

}  // namespace

Pipeline pipeline_from_tokenizer_json(const std::string& path, const TokenizerInfo& side) {
  const Ctx c{path};
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !member(j, "model").is_object())
    fail(path, ": no \"model\" object (is this a tokenizer.json?)");
  Pipeline p;
  p.origin = path;
  p.render_control_tokens = true;  // HF decode(skip_special_tokens=False)
  try {
    read_model(c, j, p);
    read_normalizer(c, member(j, "normalizer"), "normalizer", 0, p.normalizers);
    read_pre_tokenizer(c, member(j, "pre_tokenizer"), "pre_tokenizer", 0, p.pre_tokenizers);
    read_decoder(c, member(j, "decoder"), "decoder", 0, p.decoders);
    p.decoder_joins_with_space = member(j, "decoder").is_null();
    PostIds post{&p.prefix_ids, &p.suffix_ids, false, p.tokens.size()};
    read_post_processor(c, member(j, "post_processor"), "post_processor", 0, post);
    // transformers rebuilds the template from tokenizer_config.json's add_bos_token / add_eos_token.
    auto id_of = [&](const std::string& text, int64_t fallback) -> int32_t {
      for (size_t i = 0; i < p.tokens.size() && !text.empty(); ++i)
        if (p.tokens[i] == text) return static_cast<int32_t>(i);
      return static_cast<int32_t>(fallback);
    };
    if (side.add_bos_explicit) {
      p.prefix_ids.clear();
      const int32_t bos = id_of(side.bos_token, side.bos_id);
      if (side.add_bos && bos >= 0) p.prefix_ids.push_back(bos);
    }
    if (side.add_eos) {
      const int32_t eos = id_of(side.eos_token, side.eos_id);
      p.suffix_ids.clear();
      if (eos >= 0) p.suffix_ids.push_back(eos);
    }
  } catch (const json::exception& e) {  // every access above is typed; this is a last line of defence
    fail(path, ": unexpected content: ", e.what());
  }
  return p;
}

}  // namespace shardwise::tok

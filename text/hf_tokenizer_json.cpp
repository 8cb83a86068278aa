// text/hf_tokenizer_json.cpp — an HF tokenizer.json as a Pipeline. Reads the parts
// that causal LMs use (model BPE; the normalisers, pre-tokenisers, decoders and post-processors
// listed in pipeline.h); anything else is an error naming the file and the component type.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "text/sources.h"

namespace shardwise::tok {
namespace {

using json = nlohmann::json;


std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

std::string str_or(const json& j, const char* key, const std::string& fallback) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}
bool bool_or(const json& j, const char* key, bool fallback) {
  return j.is_object() && j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

struct Ctx {
  std::string path;
  [[noreturn]] void unsupported(const char* what, const std::string& type) const {
    fail(path, ": ", what, " type '", type, "' is not supported");
  }
};

// {"String": "x"} or {"Regex": "..."}: sets literal or regex.
void read_pattern(const Ctx& c, const json& pat, const char* what, std::string* literal, std::shared_ptr<Regex>* regex) {
  if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
    *literal = pat["String"].get<std::string>();
  } else if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
    *regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), c.path + ": " + what);
  } else if (pat.is_string()) {
    *literal = pat.get<std::string>();
  } else {
    fail(c.path, ": ", what, " has no pattern {\"String\": ...} or {\"Regex\": ...}");
  }
}

void read_normalizer(const Ctx& c, const json& j, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& e : j.value("normalizers", json::array())) read_normalizer(c, e, out);
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
    s.left = bool_or(j, "strip_left", true);
    s.right = bool_or(j, "strip_right", true);
    out.push_back(s);
  } else if (t == "Prepend") {
    NormStep s(NormStep::Prepend);
    s.text = str_or(j, "prepend", "");
    out.push_back(s);
  } else if (t == "Replace") {
    NormStep s(NormStep::Replace);
    read_pattern(c, j.value("pattern", json()), "normalizer Replace", &s.text, &s.regex);
    s.content = str_or(j, "content", "");
    out.push_back(s);
  } else {
    c.unsupported("normalizer", t.empty() ? j.dump().substr(0, 40) : t);
  }
}

PreStep::Behavior read_behavior(const Ctx& c, const json& j) {
  const std::string b = str_or(j, "behavior", "Isolated");
  if (b == "Removed") return PreStep::Removed;
  if (b == "Isolated") return PreStep::Isolated;
  if (b == "MergedWithPrevious") return PreStep::MergedWithPrevious;
  if (b == "MergedWithNext") return PreStep::MergedWithNext;
  if (b == "Contiguous") return PreStep::Contiguous;
  fail(c.path, ": split behavior '", b, "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

PreStep::Prepend read_prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    return s == "never" ? PreStep::Never : s == "first" ? PreStep::First : PreStep::Always;
  }
  return bool_or(j, "add_prefix_space", true) ? PreStep::Always : PreStep::Never;  // tokenizers < 0.14
}

void read_pre_tokenizer(const Ctx& c, const json& j, std::vector<PreStep>& out) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& e : j.value("pretokenizers", json::array())) read_pre_tokenizer(c, e, out);
  } else if (t == "Split") {
    PreStep s(PreStep::Split);
    read_pattern(c, j.value("pattern", json()), "pre-tokenizer Split", &s.literal, &s.regex);
    s.behavior = read_behavior(c, j);
    s.invert = bool_or(j, "invert", false);
    out.push_back(s);
  } else if (t == "ByteLevel") {
    PreStep s(PreStep::ByteLevel);
    s.add_prefix_space = bool_or(j, "add_prefix_space", true);
    s.use_regex = bool_or(j, "use_regex", true);
    out.push_back(s);
  } else if (t == "Metaspace") {
    PreStep s(PreStep::Metaspace);
    s.replacement = str_or(j, "replacement", s.replacement);
    s.prepend = read_prepend_scheme(j);
    s.split = bool_or(j, "split", true);
    out.push_back(s);
  } else if (t == "Digits") {
    PreStep s(PreStep::Digits);
    s.individual_digits = bool_or(j, "individual_digits", false);
    out.push_back(s);
  } else if (t == "WhitespaceSplit") {
    out.push_back(PreStep(PreStep::WhitespaceSplit));
  } else if (t == "Whitespace") {
    PreStep s(PreStep::Split);
    s.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", c.path + ": pre-tokenizer Whitespace");
    s.behavior = PreStep::Removed;
    s.invert = true;
    out.push_back(s);
  } else if (t == "Punctuation") {
    PreStep s(PreStep::Split);
    s.regex = std::make_shared<Regex>(R"([\p{P}!-/:-@\[-`{-~])", c.path + ": pre-tokenizer Punctuation");
    s.behavior = read_behavior(c, j);
    out.push_back(s);
  } else {
    c.unsupported("pre_tokenizer", t.empty() ? j.dump().substr(0, 40) : t);
  }
}

void read_decoder(const Ctx& c, const json& j, std::vector<DecStep>& out) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& e : j.value("decoders", json::array())) read_decoder(c, e, out);
  } else if (t == "ByteLevel") {
    out.push_back(DecStep(DecStep::ByteLevel));
  } else if (t == "Metaspace") {
    DecStep s(DecStep::Metaspace);
    s.replacement = str_or(j, "replacement", s.replacement);
    s.prepend_never = read_prepend_scheme(j) == PreStep::Never;
    out.push_back(s);
  } else if (t == "Replace") {
    DecStep s(DecStep::Replace);
    std::shared_ptr<Regex> re;
    read_pattern(c, j.value("pattern", json()), "decoder Replace", &s.text, &re);
    if (re) fail(c.path, ": decoder Replace with a regex pattern is not supported");
    s.content = str_or(j, "content", "");
    out.push_back(s);
  } else if (t == "ByteFallback") {
    out.push_back(DecStep(DecStep::ByteFallback));
  } else if (t == "Fuse") {
    out.push_back(DecStep(DecStep::Fuse));
  } else if (t == "Strip") {
    DecStep s(DecStep::Strip);
    s.content = str_or(j, "content", " ");
    s.strip_start = j.value("start", 0);
    s.strip_stop = j.value("stop", 0);
    out.push_back(s);
  } else {
    c.unsupported("decoder", t.empty() ? j.dump().substr(0, 40) : t);
  }
}

// Special tokens a post-processor adds before and after the sequence ($A).
void read_post_processor(const Ctx& c, const json& j, std::vector<int32_t>* prefix, std::vector<int32_t>* suffix, bool* seen) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& e : j.value("processors", json::array())) read_post_processor(c, e, prefix, suffix, seen);
  } else if (t == "ByteLevel") {
    // offsets only
  } else if (t == "TemplateProcessing") {
    *seen = true;
    prefix->clear();
    suffix->clear();
    const json specials = j.value("special_tokens", json::object());
    bool after = false;
    for (const auto& piece : j.value("single", json::array())) {
      if (piece.contains("Sequence")) {
        after = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = str_or(piece["SpecialToken"], "id", "");
        if (!specials.contains(name)) fail(c.path, ": post_processor template names special token '", name, "' that it does not define");
        for (const auto& id : specials[name].value("ids", json::array())) (after ? suffix : prefix)->push_back(id.get<int32_t>());
      }
    }
  } else if (t == "RobertaProcessing" || t == "BertProcessing") {
    *seen = true;
    const json cls = j.value("cls", json::array()), sep = j.value("sep", json::array());
    if (cls.is_array() && cls.size() == 2) *prefix = {cls[1].get<int32_t>()};
    if (sep.is_array() && sep.size() == 2) *suffix = {sep[1].get<int32_t>()};
  } else {
    c.unsupported("post_processor", t);
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
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) fail(path, ": no \"model\" object (is this a tokenizer.json?)");
  Pipeline p;
  p.origin = path;
  p.render_control_tokens = true;  // HF decode(skip_special_tokens=False)
  try {
    const json& m = j["model"];
    std::string type = type_of(m);
    if (type.empty()) {  // old files leave the type out: tell the models apart by their fields
      type = m.contains("merges") ? "BPE" : (m.contains("vocab") && m["vocab"].is_array()) ? "Unigram"
             : m.contains("continuing_subword_prefix") ? "WordPiece" : "WordLevel";
    }
    if (type != "BPE")
      fail(path, ": tokenizer model type '", type, "' is not supported (supported: BPE, byte-level or SentencePiece-style)");
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail(path, ": model.vocab is missing or not an object");
    if (!m.contains("merges") || !m["merges"].is_array()) fail(path, ": model.merges is missing (a BPE model needs its merges)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!str_or(m, key, "").empty()) fail(path, ": BPE option ", key, " is not supported");
    int64_t max_id = -1;
    for (const auto& kv : m["vocab"].items()) max_id = std::max<int64_t>(max_id, kv.value().get<int64_t>());
    for (const auto& a : j.value("added_tokens", json::array())) max_id = std::max<int64_t>(max_id, a.value("id", int64_t(-1)));
    if (max_id < 0) fail(path, ": the vocabulary is empty");
    if (max_id > (int64_t(1) << 24)) fail(path, ": token id ", max_id, " is implausibly large");
    p.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    p.attrs.assign(p.tokens.size(), TokenAttr::Unused);
    for (const auto& kv : m["vocab"].items()) {
      const int64_t id = kv.value().get<int64_t>();
      if (id < 0) fail(path, ": token '", kv.key(), "' has negative id ", id);
      p.tokens[static_cast<size_t>(id)] = kv.key();
      p.attrs[static_cast<size_t>(id)] = TokenAttr::Normal;
    }
    const json& merges = m["merges"];
    p.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& e = merges[r];
      if (e.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) fail(path, ": merges[", r, "] = '", s, "' is not two tokens separated by a space");
        p.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        p.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        fail(path, ": merges[", r, "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
    p.byte_fallback = bool_or(m, "byte_fallback", false);
    p.fuse_unk = bool_or(m, "fuse_unk", false);
    p.ignore_merges = bool_or(m, "ignore_merges", false);
    const std::string unk = str_or(m, "unk_token", "");
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = a.value("id", -1);
      t.content = str_or(a, "content", "");
      t.special = bool_or(a, "special", false);
      t.normalized = bool_or(a, "normalized", !t.special);
      t.lstrip = bool_or(a, "lstrip", false);
      t.rstrip = bool_or(a, "rstrip", false);
      if (t.id < 0 || t.content.empty()) fail(path, ": added_tokens entry ", a.dump().substr(0, 80), " has no id or content");
      p.tokens[static_cast<size_t>(t.id)] = t.content;
      p.attrs[static_cast<size_t>(t.id)] = t.special ? TokenAttr::Control : TokenAttr::UserDefined;
      p.added.push_back(t);
    }
    if (!unk.empty()) {
      for (size_t i = 0; i < p.tokens.size(); ++i)
        if (p.tokens[i] == unk) p.unk_id = static_cast<int32_t>(i);
      if (p.unk_id < 0) fail(path, ": model.unk_token '", unk, "' is not in the vocabulary");
    }
    read_normalizer(c, j.value("normalizer", json()), p.normalizers);
    read_pre_tokenizer(c, j.value("pre_tokenizer", json()), p.pre_tokenizers);
    read_decoder(c, j.value("decoder", json()), p.decoders);
    p.decoder_joins_with_space = !j.contains("decoder") || j["decoder"].is_null();
    bool template_seen = false;
    read_post_processor(c, j.value("post_processor", json()), &p.prefix_ids, &p.suffix_ids, &template_seen);
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
  } catch (const json::exception& e) {
    fail(path, ": unexpected content: ", e.what());
  }
  return p;
}

}  // namespace shardwise::tok

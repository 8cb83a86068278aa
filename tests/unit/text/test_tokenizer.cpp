// Tokenizer tests against references nobody here wrote: ids from HF `tokenizers` 0.23 (made on the
// GPU machine by scripts/fixtures/make_tokenizer_fixtures.py, committed under
// tests/fixtures/tokenizers/reference/) and from the npm package gpt-3-encoder's JavaScript. The
// same vocabularies are also written into GGUF files the way llama.cpp's converter does, and must
// give the same ids. Plus streaming decode, stop strings, chat templates, sampling and bad input.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/error.h"
#include "core/gguf.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "executor/session/sampling.h"
#include "test_util.h"
#include "text/chat_template.h"
#include "text/text_stream.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

std::string tok_dir() {
  return fixtures_dir() + "/tokenizers";
}

json load_json(const std::string& path) {
  const std::string text = read_file(path);
  REQUIRE_FALSE(text.empty());
  return json::parse(text);
}

struct RefCase {
  std::string text, decoded;
  std::vector<int32_t> ids, ids_special;
  std::vector<std::string> tokens;
};

struct Reference {
  std::string tokenizer_json;
  std::vector<RefCase> cases;
};

const Reference& reference(const std::string& name) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const json j = load_json(tok_dir() + "/reference/" + name + "/expected.json");
  Reference r;
  r.tokenizer_json = tok_dir() + "/" + j["tokenizer_json"].get<std::string>();
  for (const auto& c : j["cases"])
    r.cases.push_back({c["text"].get<std::string>(), c["decoded"].get<std::string>(),
                       c["ids"].get<std::vector<int32_t>>(), c["ids_special"].get<std::vector<int32_t>>(),
                       c["tokens"].get<std::vector<std::string>>()});
  REQUIRE(r.cases.size() > 50);
  return cache[name] = r;
}

// A source that is only a vocabulary (the tokenizer needs nothing else).
class VocabSource : public WeightSource {
 public:
  VocabSource(const TokenizerInfo& info, int64_t vocab_size, Family family = Family::Llama) {
    tokenizer_ = info;
    spec_.vocab_size = vocab_size;
    spec_.family = family;
    origin_ = info.hf_tokenizer_json.empty() ? "vocab-only" : info.hf_tokenizer_json;
  }
};

// A real model's tensors with another tokenizer (for writing GGUF files).
class WithVocab : public WeightSource {
 public:
  WithVocab(const WeightSource& base, const TokenizerInfo& info) {
    spec_ = base.spec();
    rope_style_ = base.rope_style();
    origin_ = base.origin();
    tensors_ = base.tensors();
    tokenizer_ = info;
  }
};

int64_t json_vocab_size(const std::string& tokenizer_json) {
  const json j = load_json(tokenizer_json);
  int64_t n = 0;
  for (const auto& kv : j["model"]["vocab"].items()) n = std::max<int64_t>(n, kv.value().get<int64_t>() + 1);
  for (const auto& a : j["added_tokens"]) n = std::max<int64_t>(n, a["id"].get<int64_t>() + 1);
  return n;
}

Tokenizer hf_tokenizer(const std::string& name) {
  TokenizerInfo info;
  info.hf_tokenizer_json = reference(name).tokenizer_json;
  VocabSource src(info, json_vocab_size(info.hf_tokenizer_json));
  return Tokenizer(src);
}

// The GGUF metadata llama.cpp's converter writes for a tokenizer.json: tokens by id, special added
// tokens as control (<unk> as unknown), other added tokens as user-defined, <0xXX> as byte tokens;
// "gpt2" models carry the merges, "llama" ones SentencePiece scores (-rank of the piece).
TokenizerInfo gguf_info_from(const std::string& tokenizer_json, const std::string& model, const std::string& pre) {
  const json j = load_json(tokenizer_json);
  const int64_t n = json_vocab_size(tokenizer_json);
  TokenizerInfo t;
  t.model = model;
  t.pre = pre;
  t.tokens.assign(static_cast<size_t>(n), std::string());
  t.token_types.assign(static_cast<size_t>(n), 1);
  t.scores.assign(static_cast<size_t>(n), 0.0f);
  for (const auto& kv : j["model"]["vocab"].items()) {
    const int64_t id = kv.value().get<int64_t>();
    t.tokens[id] = kv.key();
    t.scores[id] = -static_cast<float>(id);
    if (kv.key().size() == 6 && kv.key().compare(0, 3, "<0x") == 0) t.token_types[id] = 6;
  }
  for (const auto& a : j["added_tokens"]) {
    const int64_t id = a["id"].get<int64_t>();
    t.tokens[id] = a["content"].get<std::string>();
    t.token_types[id] = a["special"].get<bool>() ? (t.tokens[id] == "<unk>" ? 2 : 3) : 4;
    t.scores[id] = 0.0f;
  }
  if (model == "gpt2") {
    for (const auto& m : j["model"]["merges"])
      t.merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m[0].get<std::string>() + " " + m[1].get<std::string>());
    t.scores.clear();
  }
  return t;
}

// Writes a tiny synthetic model whose GGUF carries `info` (plus `extra` metadata keys).
std::string gguf_with_vocab(const std::string& name, const TokenizerInfo& info, const std::string& spec_name,
                            const std::vector<std::pair<std::string, GgufValue>>& extra = {}) {
  ModelSpec s = builtin_spec(spec_name);
  s.vocab_size = static_cast<int64_t>(info.tokens.size());
  s.num_hidden_layers = 1;
  s.dtype = DType::F32;
  ThreadPool pool(2);
  auto base = make_synthetic_weights(s, 7, &pool);
  WithVocab src(*base, info);
  const std::string first = temp_path(name + ".base.gguf");
  write_gguf(src, first, DType::F16, &pool);
  if (extra.empty()) return first;
  GgufFile f(first);
  GgufWriter w;
  for (const auto& kv : f.metadata()) w.set(kv.first, kv.second);
  for (const auto& kv : extra) w.set(kv.first, kv.second);
  for (const auto& t : f.tensors()) w.add_tensor(t.name, f.view(t));
  const std::string path = temp_path(name + ".gguf");
  w.write(path);
  return path;
}

std::vector<std::string> token_texts(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(tok.token_text(id));
  return out;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

const char* const kReferenceNames[] = {"gpt2",        "spm_metaspace", "spm_legacy", "spm_nofallback",
                                       "bbpe_llama3", "bbpe_qwen2",    "bbpe_nfkc",  "bbpe_nfd"};

}  // namespace

TEST_CASE("tokenizer: tokenizer.json ids, tokens and decode equal HF tokenizers'", "[tokenizer][reference]") {
  for (const char* name : kReferenceNames) {
    const Reference& ref = reference(name);
    const Tokenizer tok = hf_tokenizer(name);
    CHECK(tok.kind() == "hf-bpe");
    int mismatches = 0;
    for (const auto& c : ref.cases) {
      INFO(name << ": text '" << escaped(c.text) << "'");
      const auto ids = tok.encode(c.text, false);
      CHECK(ids == c.ids);
      CHECK(tok.encode(c.text, true) == c.ids_special);
      CHECK(token_texts(tok, ids) == c.tokens);
      CHECK(tok.decode(c.ids) == c.decoded);
      mismatches += ids != c.ids;
    }
    INFO(name);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("tokenizer: GPT-2 ids equal gpt-3-encoder's JavaScript and well-known ids", "[tokenizer][reference]") {
  const Tokenizer tok = hf_tokenizer("gpt2");
  const json j = load_json(tok_dir() + "/gpt2/gpt3_encoder_ids.json");
  REQUIRE(j["cases"].size() > 50);
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"].get<std::string>();
    INFO("text '" << escaped(text) << "'");
    CHECK(tok.encode(text, false) == c["ids"].get<std::vector<int32_t>>());
  }
  CHECK(tok.encode("Hello world", false) == std::vector<int32_t>{15496, 995});
  CHECK(tok.encode("<|endoftext|>", false) == std::vector<int32_t>{50256});
  CHECK(tok.eos() < 0);      // the vocabulary alone does not say; config.json would
  CHECK(tok.is_eog(50256));  // <|endoftext|> is a special token that ends generation
}

TEST_CASE("tokenizer: byte-level BPE round-trips random Unicode", "[tokenizer]") {
  const std::vector<uint32_t> pool = {
      ' ',    ' ',    ' ',    '\n',   '\t', 'a',    'b',    'e',    'z',     'A',     'Q',     '0',    '7',    '\'',
      '.',    ',',    '-',    '<',    '|',  '>',    0xE9,   0xDF,   0x301,   0x3B1,   0x416,   0x5D0,  0x627,  0x905,
      0x3042, 0x30AB, 0x4E2D, 0xAC00, 0xA0, 0x200B, 0x3000, 0xFF21, 0x1F600, 0x1F44D, 0x1F3FD, 0x200D, 0x10348};
  std::mt19937 rng(1234);
  for (const char* name : {"gpt2", "bbpe_llama3"}) {
    const Tokenizer tok = hf_tokenizer(name);
    for (int i = 0; i < 150; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 24);
      for (int k = 0; k < len; ++k) tok::utf8_append(s, pool[rng() % pool.size()]);
      INFO(name << ": '" << escaped(s) << "'");
      const auto ids = tok.encode(s, false, false);
      CHECK(tok.decode(ids) == s);
      std::string streamed;  // pieces are what streaming prints
      for (int32_t id : ids) streamed += tok.piece(id);
      CHECK(streamed == s);
    }
  }
}

TEST_CASE("tokenizer: GGUF vocabularies give the HF tokenizer's ids", "[tokenizer][reference][gguf]") {
  struct Case {
    const char* ref;
    const char* model;
    const char* pre;
    const char* spec;
  };
  for (const Case& c :
       {Case{"gpt2", "gpt2", "gpt-2", "tiny_qwen3"}, Case{"bbpe_llama3", "gpt2", "llama-bpe", "tiny_llama"},
        Case{"bbpe_qwen2", "gpt2", "qwen2", "tiny_qwen3"}, Case{"spm_legacy", "llama", "default", "tiny_llama"}}) {
    const Reference& ref = reference(c.ref);
    TokenizerInfo info = gguf_info_from(ref.tokenizer_json, c.model, c.pre);
    if (std::string(c.ref) == "bbpe_llama3") {
      info.bos_id = 647;
      info.eos_id = 648;
      info.add_bos = true;  // convert_hf_to_gguf reads it from the post-processor
    } else if (std::string(c.ref) == "spm_legacy") {
      info.bos_id = 1;
      info.eos_id = 2;
      info.add_bos = true;
    } else if (std::string(c.ref) == "bbpe_qwen2") {
      info.eos_id = 625;  // <|endoftext|>
    } else {
      info.eos_id = 50256;
    }
    const std::string path = gguf_with_vocab(c.ref, info, c.spec);
    auto src = open_weights(path);
    const Tokenizer tok(*src);
    CHECK(tok.kind() == std::string(c.model == std::string("llama") ? "spm" : "gpt2"));
    for (const auto& rc : ref.cases) {
      // llama.cpp does not run the file's normaliser (Qwen2's NFC): skip texts NFC would change.
      if (std::string(c.ref) == "bbpe_qwen2" && tok::normalize(rc.text, tok::NormalForm::NFC) != rc.text) continue;
      INFO(c.ref << " as GGUF (pre " << c.pre << "): text '" << escaped(rc.text) << "'");
      const auto ids = tok.encode(rc.text, false);
      CHECK(ids == rc.ids);
      CHECK(tok.encode(rc.text, true) == rc.ids_special);
    }
  }
}

TEST_CASE("tokenizer: GGUF metadata: EOT, chat template, add_bos, add_space_prefix", "[tokenizer][gguf]") {
  const Reference& ref = reference("bbpe_qwen2");
  TokenizerInfo info = gguf_info_from(ref.tokenizer_json, "gpt2", "qwen2");
  info.eos_id = 625;
  const std::string tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  const std::string path = gguf_with_vocab("qwen2_meta", info, "tiny_qwen3",
                                           {{"tokenizer.chat_template", GgufValue::of_string(tmpl)},
                                            {"tokenizer.ggml.eot_token_id", GgufValue::of_u32(627)},
                                            {"tokenizer.ggml.padding_token_id", GgufValue::of_u32(99999)}});
  auto src = open_weights(path);
  CHECK(src->tokenizer().eot_id == 627);
  CHECK(src->tokenizer().pad_id == -1);  // out of range: ignored, as llama.cpp warns and goes on
  const Tokenizer tok(*src);
  CHECK(tok.chat_template() == tmpl);
  CHECK(tok.eot() == 627);
  CHECK(tok.is_eog(625));
  CHECK(tok.is_eog(627));
  CHECK_FALSE(tok.add_bos());
  const ChatChoice choice = choose_chat_format(tok.chat_template(), src->spec().family, tok);
  CHECK(choice.format == ChatFormat::ChatML);
  CHECK(choice.from_file);
  // Control tokens are not written by decode (llama.cpp's detokenizer), user-defined ones are.
  const auto ids = tok.encode("<|im_start|>hi<think>x", false);
  REQUIRE(ids.front() == 626);
  CHECK(tok.decode(ids) == "hi<think>x");
  CHECK(tok.piece(626).empty());
  CHECK(tok.piece(628) == "<think>");

  // add_space_prefix = false: no dummy space before SentencePiece text.
  const Reference& spm = reference("spm_legacy");
  TokenizerInfo sinfo = gguf_info_from(spm.tokenizer_json, "llama", "default");
  sinfo.bos_id = 1;
  sinfo.eos_id = 2;
  sinfo.add_bos = true;
  const std::string spath = gguf_with_vocab("spm_noprefix", sinfo, "tiny_llama",
                                            {{"tokenizer.ggml.add_space_prefix", GgufValue::of_bool(false)}});
  auto ssrc = open_weights(spath);
  const Tokenizer stok(*ssrc);
  const auto a = stok.encode("Hello", false);
  REQUIRE_FALSE(a.empty());
  CHECK(stok.token_text(a.front()).compare(0, 3, "\xE2\x96\x81") != 0);  // first piece has no "▁"
  CHECK(stok.decode(a) == "Hello");
}

TEST_CASE("tokenizer: special tokens are matched only when parsing specials", "[tokenizer]") {
  const Tokenizer qwen = hf_tokenizer("bbpe_qwen2");
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto with = qwen.encode(text, false, true);
  const auto without = qwen.encode(text, false, false);
  CHECK(with.front() == qwen.find_token("<|im_start|>"));
  CHECK(std::find(without.begin(), without.end(), qwen.find_token("<|im_start|>")) == without.end());
  CHECK(qwen.decode(without) == text);
  // Non-special added tokens (<think>) are always matched, as in HF and llama.cpp.
  CHECK(qwen.encode("<think>", false, false) == std::vector<int32_t>{qwen.find_token("<think>")});
  CHECK(qwen.is_eog(qwen.find_token("<|im_end|>")));
  CHECK(qwen.is_eog(qwen.find_token("<|endoftext|>")));
  CHECK_FALSE(qwen.is_eog(qwen.find_token("<think>")));
  CHECK(qwen.decode(with, true) == "user\nhi");

  const Tokenizer llama3 = hf_tokenizer("bbpe_llama3");
  CHECK(llama3.add_bos());
  CHECK(llama3.bos() == 647);  // no tokenizer_config.json here: the post-processor's token
  CHECK(llama3.encode("", true) == std::vector<int32_t>{647});
  CHECK(llama3.is_eog(llama3.find_token("<|eot_id|>")));
  CHECK(llama3.eot() == llama3.find_token("<|eot_id|>"));
}

TEST_CASE("tokenizer: models without a vocabulary use byte tokens", "[tokenizer]") {
  ModelSpec s = builtin_spec("tiny_qwen3");
  VocabSource src(TokenizerInfo{}, s.vocab_size, s.family);
  const Tokenizer tok(src);
  CHECK(tok.kind() == "bytes");
  const std::string text = "h\xC3\xA9llo <s> \xF0\x9F\x99\x82";
  const auto ids = tok.encode(text, true);
  CHECK(ids.front() == 1);
  CHECK(ids.size() == text.size() + 1);
  CHECK(tok.decode(ids) == text);
  CHECK(tok.is_eog(2));
  CHECK(tok.token_text(3 + 'A') == "<0x41>");
}

// Synthetic weights and the GGUF `synth` writes of them share a vocabulary in which text is one token per
// character (a space as U+2581, with SentencePiece's space prefix), as llama.cpp tokenises that file: the
// peers and shardwise then run the very same prompt tokens.
TEST_CASE("tokenizer: synthetic models tokenise one character per token, in memory and in their GGUF", "[tokenizer]") {
  ModelSpec s = builtin_spec("tiny_qwen3");
  s.vocab_size = 512;
  s.num_hidden_layers = 1;
  s.dtype = DType::F32;
  ThreadPool pool(2);
  auto mem = make_synthetic_weights(s, 3, &pool);
  const std::string path = temp_path("char_vocab.gguf");
  write_gguf(*mem, path, DType::F32, &pool);
  auto file = open_weights(path);
  const std::string text = "Hi there, {x}~!";
  std::vector<int32_t> want = {1, 3 + 256};  // <s>, then the space prefix
  for (char c : text) want.push_back(c == ' ' ? 3 + 256 : 3 + 256 + 1 + (c - 33));
  for (const WeightSource* src : {mem.get(), file.get()}) {
    CAPTURE(src->origin());
    const Tokenizer tok(*src);
    CHECK(tok.kind() == "spm");
    const std::vector<int32_t> ids = tok.encode(text, true);
    CHECK(ids == want);
    CHECK(tok.decode(ids) == text);
    CHECK(tok.encode("\xC3\xA9", false) == std::vector<int32_t>{3 + 256, 3 + 0xC3, 3 + 0xA9});  // bytes otherwise
    CHECK(tok.is_eog(2));
    CHECK(tok.token_text(511) == "<F157>");
  }
  // A vocabulary too small for every printable character keeps byte tokens (no space prefix to miss).
  s.vocab_size = kCharacterVocabularySize - 1;
  CHECK(Tokenizer(*make_synthetic_weights(s, 3, &pool)).kind() == "bytes");
}

TEST_CASE("tokenizer: streaming decode holds back partial UTF-8", "[tokenizer][stream]") {
  // Byte-fallback tokens of an emoji arrive one byte at a time (spm_legacy's decoder has
  // ByteFallback; spm_metaspace's has not, so HF shows its byte tokens as "<0xF0>" text).
  const Tokenizer spm = hf_tokenizer("spm_legacy");
  const auto ids = spm.encode("\xF0\x9F\xA4\x96!", false);  // "🤖!"
  REQUIRE(ids.size() >= 5);
  tok::TextStream s;
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(s.push(spm.piece(id)));
  // "▁" first (a space), then nothing until the fourth byte completes the emoji.
  CHECK(out[0] == " ");
  CHECK(out[1].empty());
  CHECK(out[2].empty());
  CHECK(out[3].empty());
  CHECK(out[4] == "\xF0\x9F\xA4\x96");
  CHECK(s.finish().empty());
  CHECK(s.text() == " \xF0\x9F\xA4\x96!");
  for (const auto& o : out) CHECK(tok::utf8_invalid_offset(o) == std::string::npos);

  // Byte-level tokens that split a character: 'ðŁ' '¤' 'ĸ' for 🤖 in GPT-2.
  const Tokenizer gpt2 = hf_tokenizer("gpt2");
  tok::TextStream g;
  std::string printed;
  for (int32_t id : gpt2.encode("a\xF0\x9F\xA4\x96", false)) {
    const std::string o = g.push(gpt2.piece(id));
    CHECK(tok::utf8_invalid_offset(o) == std::string::npos);
    printed += o;
  }
  CHECK(printed == "a\xF0\x9F\xA4\x96");

  // A sequence cut off by the end of generation becomes U+FFFD, never a broken byte.
  tok::TextStream cut;
  CHECK(cut.push("x\xE2\x96").empty() == false);
  CHECK(cut.text() == "x");
  CHECK(cut.finish() == "\xEF\xBF\xBD");
}

TEST_CASE("tokenizer: stop strings end the text and are never printed", "[tokenizer][stream]") {
  tok::TextStream s({"STOP", "\n\n"});
  std::string printed;
  for (const char* p : {"Hello", " wor", "ld. S", "T", "O", "P and more"}) printed += s.push(p);
  CHECK(s.stopped());
  CHECK(s.stop_string() == "STOP");
  CHECK(printed == "Hello world. ");
  CHECK(s.text() == printed);
  CHECK(s.push("later").empty());
  CHECK(s.finish().empty());

  tok::TextStream t({"STOP"});
  printed.clear();
  for (const char* p : {"ST", "OR", "Y"}) printed += t.push(p);
  printed += t.finish();
  CHECK_FALSE(t.stopped());
  CHECK(printed == "STORY");  // a held-back prefix is released when it stops matching

  tok::TextStream u({"\n\n"});
  CHECK(u.push("a\n").empty() == false);
  CHECK(u.text() == "a");
  CHECK(u.push("\nb").empty());
  CHECK(u.stopped());
}

TEST_CASE("tokenizer: chat templates", "[tokenizer][chat]") {
  const Tokenizer qwen = hf_tokenizer("bbpe_qwen2");
  const Tokenizer llama3 = hf_tokenizer("bbpe_llama3");
  const Tokenizer spm = hf_tokenizer("spm_legacy");
  ChatChoice c = choose_chat_format("", Family::Qwen3Moe, qwen);
  CHECK(c.format == ChatFormat::ChatML);
  CHECK_FALSE(c.from_file);
  CHECK_THAT(c.note, Contains("no chat template"));
  CHECK(choose_chat_format("", Family::Llama, llama3).format == ChatFormat::Llama3);
  CHECK(choose_chat_format("", Family::Llama, spm).format == ChatFormat::Mistral);
  c = choose_chat_format("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}",
                         Family::Qwen3, qwen);
  CHECK(c.format == ChatFormat::Mistral);
  CHECK(c.from_file);
  c = choose_chat_format("{{ something else }}", Family::Llama, llama3);
  CHECK(c.format == ChatFormat::Llama3);
  CHECK_THAT(c.note, Contains("not one we recognise"));
  CHECK_THAT(c.note, Contains("Llama-3"));

  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  CHECK(apply_chat_template(ChatFormat::ChatML, msgs) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(
      apply_chat_template(ChatFormat::Llama3, msgs) ==
      "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(apply_chat_template(ChatFormat::Mistral, msgs) == "[INST] Be brief.\n\nHi [/INST]");
  CHECK_THROWS_WITH(apply_chat_template(ChatFormat::ChatML, {{"tool", "x"}}), Contains("role 'tool'"));
  // The ChatML prompt tokenises with the control tokens as single ids.
  const auto ids = qwen.encode(apply_chat_template(ChatFormat::ChatML, {{"user", "Hi"}}), true);
  CHECK(ids.front() == qwen.find_token("<|im_start|>"));
  CHECK(std::count(ids.begin(), ids.end(), qwen.find_token("<|im_end|>")) == 1);
}

TEST_CASE("tokenizer: HF directory side files (tokenizer_config, generation_config, chat template)",
          "[tokenizer][hf]") {
  // The llama fixture (vocabulary 211) with a small SentencePiece-style tokenizer.json beside it.
  const std::string dir = temp_path("hf_tok_dir");
  REQUIRE(std::system(("mkdir -p '" + dir + "'").c_str()) == 0);
  for (const char* f : {"config.json", "model.safetensors"})
    write_file(dir + "/" + f, read_file(fixtures_dir() + "/hf/llama/" + f));
  json vocab = json::object();
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<|im_end|>",    "\xE2\x96\x81",   "a",  "b",
                                           "c",     "h",   "i",    "\xE2\x96\x81h", "\xE2\x96\x81hi", "ab", "abc"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = i;
  for (int b = 0x80; b < 0x100; ++b) {  // the bytes non-ASCII text falls back to
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = pieces.size() + static_cast<size_t>(b - 0x80);
  }
  json tj = {{"version", "1.0"},
             {"added_tokens",
              {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
               {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
               {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
               {{"id", 3}, {"content", "<|im_end|>"}, {"special", true}, {"normalized", false}}}},
             {"normalizer",
              {{"type", "Sequence"},
               {"normalizers",
                {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                 {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
             {"pre_tokenizer", nullptr},
             {"post_processor", nullptr},
             {"decoder",
              {{"type", "Sequence"},
               {"decoders",
                {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                 {{"type", "ByteFallback"}},
                 {{"type", "Fuse"}},
                 {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
             {"model",
              {{"type", "BPE"},
               {"unk_token", "<unk>"},
               {"byte_fallback", true},
               {"fuse_unk", true},
               {"vocab", vocab},
               {"merges", {"\xE2\x96\x81 h", "\xE2\x96\x81h i", "a b", "ab c"}}}}};
  write_file(dir + "/tokenizer.json", tj.dump());
  write_file(dir + "/tokenizer_config.json",
             json{{"add_bos_token", true},
                  {"add_eos_token", false},
                  {"bos_token", "<s>"},
                  {"eos_token", {{"content", "</s>"}}},
                  {"chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"}}
                 .dump());
  write_file(dir + "/generation_config.json", json{{"eos_token_id", {2, 3}}}.dump());
  auto src = open_weights(dir);
  const TokenizerInfo& info = src->tokenizer();
  CHECK(info.add_bos);
  CHECK(info.add_bos_explicit);
  CHECK(info.bos_token == "<s>");
  CHECK(info.eos_token == "</s>");
  CHECK_THAT(info.chat_template, Contains("<|im_start|>"));
  const Tokenizer tok(*src);
  CHECK(tok.kind() == "hf-bpe");
  CHECK(tok.add_bos());
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK(tok.is_eog(2));
  CHECK(tok.is_eog(3));
  const auto ids = tok.encode("hi abc\xC3\xA9", true);
  const int32_t byte0 = static_cast<int32_t>(pieces.size()) - 0x80;
  const std::vector<int32_t> want = {1, 11, 4, 13, byte0 + 0xC3, byte0 + 0xA9};
  CHECK(ids == want);
  CHECK(tok.decode(ids, true) == "hi abc\xC3\xA9");
  CHECK(tok.decode(ids) == "<s> hi abc\xC3\xA9");  // HF renders <s> and keeps the space after it

  // Without byte fallback, unknown characters become one fused <unk>.
  tj["model"]["byte_fallback"] = false;
  write_file(dir + "/tokenizer.json", tj.dump());
  auto src2 = open_weights(dir);
  const Tokenizer tok2(*src2);
  CHECK(tok2.encode("a\xC3\xA9\xC3\xA9"
                    "b",
                    false) == std::vector<int32_t>{4, 5, 0, 6});

  // Only a SentencePiece tokenizer.model: a clear error, not a silent byte vocabulary.
  REQUIRE(std::remove((dir + "/tokenizer.json").c_str()) == 0);
  write_file(dir + "/tokenizer.model", "not parsed");
  auto src3 = open_weights(dir);
  CHECK_THROWS_WITH(Tokenizer(*src3), Contains("tokenizer.model") && Contains("tokenizer.json"));
}

TEST_CASE("tokenizer: bad input gives one clear line", "[tokenizer][bad]") {
  auto one_line = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    try {
      f();
      FAIL("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find('\n') == std::string::npos);
      for (const auto& p : parts) CHECK_THAT(msg, Contains(p));
    }
  };
  const Tokenizer gpt2 = hf_tokenizer("gpt2");
  one_line([&] { gpt2.encode("ok \xFF bad", false); }, {"not valid UTF-8", "0xFF", "offset 3"});
  one_line([&] { gpt2.encode("\xC0\xAF", false); }, {"UTF-8", "offset 0"});      // overlong
  one_line([&] { gpt2.encode("\xED\xA0\x80", false); }, {"UTF-8", "offset 0"});  // surrogate
  one_line([&] { gpt2.encode("abc\xE2\x96", false); }, {"UTF-8", "offset 3"});   // cut short

  TokenizerInfo info;
  info.model = "bert";
  info.tokens = {"a", "b"};
  one_line([&] { Tokenizer t(VocabSource(info, 2)); },
           {"tokenizer.ggml.model 'bert'", "not supported", "llama", "gpt2"});
  info.model = "gpt2";
  info.pre = "gpt-2";
  one_line([&] { Tokenizer t(VocabSource(info, 2)); }, {"tokenizer.ggml.merges", "missing"});
  info.merges = {"a b"};
  info.pre = "klingon";
  one_line([&] { Tokenizer t(VocabSource(info, 2)); }, {"tokenizer.ggml.pre 'klingon'", "llama-bpe"});
  info.pre = "gpt-2";
  info.merges = {"ab"};
  one_line([&] { Tokenizer t(VocabSource(info, 2)); }, {"tokenizer.ggml.merges[0]", "'ab'"});

  auto json_file = [](const std::string& name, const json& j) {
    const std::string p = temp_path(name);
    write_file(p, j.dump());
    return p;
  };
  auto hf = [&](const std::string& path) {
    TokenizerInfo t;
    t.hf_tokenizer_json = path;
    Tokenizer tok(VocabSource(t, 100));
  };
  std::string p = json_file("unigram.json", {{"model", {{"type", "Unigram"}, {"vocab", {{"a", 0.0}}}}}});
  one_line([&] { hf(p); }, {p, "model type 'Unigram'", "not supported"});
  p = json_file("wordpiece.json", {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}});
  one_line([&] { hf(p); }, {p, "'WordPiece'"});
  p = json_file("nomerges.json", {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}}}});
  one_line([&] { hf(p); }, {p, "merges", "missing"});
  p = json_file("precompiled.json", {{"normalizer", {{"type", "Precompiled"}}},
                                     {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}});
  one_line([&] { hf(p); }, {p, "normalizer: type 'Precompiled'"});
  p = json_file("badregex.json", {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}}},
                                  {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}});
  one_line([&] { hf(p); }, {p, "does not compile"});
  p = temp_path("notjson.json");
  write_file(p, "{ not json");
  one_line([&] { hf(p); }, {p, "not valid JSON"});
  one_line([&] { hf(temp_path("missing.json")); }, {"missing.json", "cannot open"});
  // More tokens than the model has rows in its embedding.
  one_line(
      [&] {
        TokenizerInfo t;
        t.hf_tokenizer_json = reference("bbpe_qwen2").tokenizer_json;
        Tokenizer tok(VocabSource(t, 100));
      },
      {"630 tokens", "vocabulary is 100"});

  ModelSpec small = builtin_spec("tiny_llama");  // vocab 256 < 259: no room for byte tokens
  one_line([&] { Tokenizer(VocabSource(TokenizerInfo{}, small.vocab_size)).encode("x", false); }, {"--tokens"});
}

namespace {
// A tokenizer.json of a three-token BPE model plus `extra` top-level members (JSON text).
std::string small_tokenizer_json(const std::string& extra) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"], "unk_token": "a"})" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

// `depth` Sequences of `kind` ("normalizers", ...) nested in one another around `leaf`, as JSON text
// (built as text: nesting a json value level by level copies it at each level).
std::string nested_sequence(const std::string& kind, int depth, const std::string& leaf) {
  std::string s;
  s.reserve(static_cast<size_t>(depth) * (kind.size() + 30) + leaf.size());
  for (int i = 0; i < depth; ++i) s += R"({"type": "Sequence", ")" + kind + R"(": [)";
  s += leaf;
  for (int i = 0; i < depth; ++i) s += "]}";
  return s;
}

// Loads a tokenizer.json (model vocabulary 100); "" when it loads, else the one-line error.
std::string load_error(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  write_file(path, text);
  TokenizerInfo t;
  t.hf_tokenizer_json = path;
  try {
    Tokenizer tok((VocabSource(t, 100)));
    return "";
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    CHECK_THAT(msg, Contains(path));
    return msg;
  }
}
}  // namespace

TEST_CASE("tokenizer: nested Sequences load up to 64 deep and are refused beyond, quickly, in every component",
          "[tokenizer][bad]") {
  struct Component {
    const char* field;
    const char* list;
    const char* leaf;
  };
  const Component components[] = {{"normalizer", "normalizers", R"({"type": "NFC"})"},
                                  {"pre_tokenizer", "pretokenizers", R"({"type": "WhitespaceSplit"})"},
                                  {"decoder", "decoders", R"({"type": "Fuse"})"},
                                  {"post_processor", "processors", R"({"type": "ByteLevel"})"}};
  for (const Component& c : components) {
    INFO(c.field);
    auto with = [&](int depth) {
      return small_tokenizer_json("\"" + std::string(c.field) + "\": " + nested_sequence(c.list, depth, c.leaf));
    };
    CHECK(load_error("seq_ok.json", with(1)).empty());
    CHECK(load_error("seq_ok.json", with(64)).empty());
    CHECK_THAT(load_error("seq_65.json", with(65)),
               Contains(std::string(c.field) + ": Sequence nested more than 64 deep"));
    // Deep enough to overflow the stack of a reader that recurses per level (and, copying each
    // level's subtree, to take quadratic time): refused in well under a second.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THAT(load_error("seq_deep.json", with(40000)), Contains("nested more than 64 deep"));
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  }
}

TEST_CASE("tokenizer: tokenizer.json fields of the wrong type or out of range name the field", "[tokenizer][bad]") {
  CHECK_THAT(load_error("t5.json", small_tokenizer_json(R"("normalizer": {"type": 5})")),
             Contains("normalizer.type: must be a string, got 5"));
  CHECK_THAT(
      load_error("t5b.json",
                 small_tokenizer_json(
                     R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": [1]}]})")),
      Contains("pre_tokenizer.pretokenizers[1].type: must be a string, got an array"));
  CHECK_THAT(load_error("notype.json", small_tokenizer_json(R"("decoder": {"replacement": "x"})")),
             Contains("decoder: has no \"type\""));
  CHECK_THAT(load_error("strip.json", small_tokenizer_json(R"("decoder": {"type": "Strip", "start": "x"})")),
             Contains("decoder.start: must be an integer"));
  CHECK_THAT(
      load_error("bool.json", small_tokenizer_json(
                                  R"("pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "invert": 3})")),
      Contains("pre_tokenizer.invert: must be true or false, got 3"));
  CHECK_THAT(load_error("vocabid.json", R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})"),
             Contains("model.vocab['a']: must be a token id"));
  CHECK_THAT(
      load_error("addedid.json",
                 small_tokenizer_json(R"("added_tokens": [{"id": 3, "content": "<s>"}, {"id": "4", "content": "x"}])")),
      Contains("added_tokens[1].id: must be an integer"));
  // Special ids a post-processor adds must be tokens of the vocabulary (3 here).
  CHECK_THAT(
      load_error(
          "special.json",
          small_tokenizer_json(
              R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [99]}}})")),
      Contains("post_processor.special_tokens['<s>'].ids[0]: token id 99 is not in the vocabulary (ids 0 to 2)"));
  CHECK_THAT(
      load_error("roberta.json",
                 small_tokenizer_json(
                     R"("post_processor": {"type": "RobertaProcessing", "cls": ["<s>", -1], "sep": ["</s>", 2]})")),
      Contains("post_processor.cls[1]: token id -1 is not in the vocabulary"));
  CHECK(
      load_error(
          "special_ok.json",
          small_tokenizer_json(
              R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [2]}}})"))
          .empty());
}

TEST_CASE("tokenizer: a byte-level vocabulary lacking a byte's symbol is refused, not a silent drop",
          "[tokenizer][bad]") {
  // Every byte's symbol but the one of `missing` (and no unk_token): text with that byte has no token.
  auto vocab_without = [](int missing) {
    json vocab = json::object();
    int id = 0;
    for (int b = 0; b < 256; ++b)
      if (b != missing) vocab[tok::byte_level_encode(std::string(1, static_cast<char>(b)))] = id++;
    return json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                {"decoder", {{"type", "ByteLevel"}}}};
  };
  for (int missing : {0x41, 0xE6, 0x00}) {
    const std::string path = temp_path("bytelevel.json");
    write_file(path, vocab_without(missing).dump());
    TokenizerInfo t;
    t.hf_tokenizer_json = path;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%x", missing);
    try {
      Tokenizer tok((VocabSource(t, 300)));
      FAIL("loaded a byte-level vocabulary without byte " << hex);
    } catch (const Error& e) {
      CHECK_THAT(std::string(e.what()), Contains(path) && Contains(std::string("no token for byte ") + hex));
    }
  }
  // All 256 present: loads, and every byte of a text comes back.
  const std::string path = temp_path("bytelevel_full.json");
  write_file(path, vocab_without(-1).dump());
  TokenizerInfo t;
  t.hf_tokenizer_json = path;
  const Tokenizer tok((VocabSource(t, 300)));
  const std::string text = "A\xC3\xA6 z";
  CHECK(tok.decode(tok.encode(text, false)) == text);
}

TEST_CASE("sampling: llama.cpp semantics", "[sampling]") {
  auto params = [] {
    SamplingParams p;
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    return p;
  };
  // Repeat penalty divides positive and multiplies negative logits of seen tokens.
  {
    SamplingParams p = params();
    p.greedy = true;
    p.repeat_penalty = 4.0f;
    const std::vector<float> l = {-1.0f, -1.1f, 0.5f, 0.4f};
    CHECK(Sampler(p).sample(l.data(), 4, {}) == 2);
    CHECK(Sampler(p).sample(l.data(), 4, {2}) == 3);     // 0.5 / 4 < 0.4
    CHECK(Sampler(p).sample(l.data(), 4, {2, 3}) == 2);  // 0.125 > 0.1
    const std::vector<float> neg = {-1.0f, -1.5f};
    CHECK(Sampler(p).sample(neg.data(), 2, {0}) == 1);  // -1 * 4 < -1.5
    p.repeat_last_n = 1;
    CHECK(Sampler(p).sample(l.data(), 4, {2, 3}) == 2);  // only the last token counts
  }
  // top-p keeps the smallest prefix reaching p: probabilities 0.5, 0.3, 0.2.
  {
    const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    SamplingParams p = params();
    p.top_p = 0.75f;  // 0.5 + 0.3 reaches 0.75: id 2 is never drawn
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 400; ++i) seen.insert(s.sample(l.data(), 3, {}));
    CHECK(seen == std::set<int32_t>{0, 1});
    p.top_p = 0.5f;
    Sampler s1(p);
    for (int i = 0; i < 50; ++i) CHECK(s1.sample(l.data(), 3, {}) == 0);
    // min-p 0.5: keeps p >= 0.25 (ids 0 and 1).
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    Sampler s2(p);
    seen.clear();
    for (int i = 0; i < 400; ++i) seen.insert(s2.sample(l.data(), 3, {}));
    CHECK(seen == std::set<int32_t>{0, 1});
    // Low temperature sharpens towards the best token; temp <= 0 is argmax.
    p.min_p = 0.0f;
    p.temp = 0.05f;
    Sampler s3(p);
    int best = 0;
    for (int i = 0; i < 200; ++i) best += s3.sample(l.data(), 3, {}) == 0;
    CHECK(best >= 195);
    p.temp = 0.0f;
    CHECK(Sampler(p).sample(l.data(), 3, {}) == 0);
  }
  // The same seed gives the same draws; another seed differs somewhere.
  {
    std::vector<float> l(50);
    for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i));
    SamplingParams p = params();
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.temp = 0.8f;
    std::vector<int32_t> a, b, c;
    Sampler sa(p), sb(p);
    p.seed = 8;
    Sampler sc(p);
    for (int i = 0; i < 64; ++i) {
      a.push_back(sa.sample(l.data(), 50, a));
      b.push_back(sb.sample(l.data(), 50, b));
      c.push_back(sc.sample(l.data(), 50, c));
    }
    CHECK(a == b);
    CHECK(a != c);
  }
  // Out-of-range flags are clear errors.
  auto bad = [](const std::function<void(SamplingParams&)>& edit, const char* flag) {
    SamplingParams p;
    edit(p);
    CHECK_THROWS_WITH(p.validate(), Contains(flag));
  };
  bad([](SamplingParams& p) { p.top_p = 0.0f; }, "--top-p");
  bad([](SamplingParams& p) { p.top_p = 1.5f; }, "--top-p");
  bad([](SamplingParams& p) { p.min_p = -0.1f; }, "--min-p");
  bad([](SamplingParams& p) { p.top_k = -3; }, "--top-k");
  bad([](SamplingParams& p) { p.temp = std::nanf(""); }, "--temp");
  bad([](SamplingParams& p) { p.repeat_penalty = 0.0f; }, "--repeat-penalty");
  bad([](SamplingParams& p) { p.repeat_last_n = -2; }, "--repeat-last-n");
  CHECK_NOTHROW(SamplingParams().validate());
}

TEST_CASE("cli: tokenize and run with text", "[tokenizer][cli]") {
  std::string bin;
  try {
    bin = shardwise_bin();
  } catch (const std::exception&) {
    WARN("skipped: no shardwise binary in this build");
    return;
  }
  const Reference& ref = reference("bbpe_qwen2");
  TokenizerInfo info = gguf_info_from(ref.tokenizer_json, "gpt2", "qwen2");
  info.eos_id = 625;
  const std::string model = gguf_with_vocab("cli_qwen2", info, "tiny_qwen3");
  const std::string err = temp_path("cli_stderr.txt");
  auto run = [&](const std::string& args, std::string* out) {
    const int rc = run_command("{ '" + bin + "' " + args + " 2>'" + err + "'; }", out);
    return rc;
  };
  std::string out;
  // tokenize --json: ids as the model sees them, pieces = vocabulary strings.
  REQUIRE(run("tokenize --model '" + model + "' --text 'Hello world' --json", &out) == 0);
  json j = json::parse(out);
  const RefCase* hello = nullptr;
  for (const auto& c : ref.cases)
    if (c.text == "Hello world") hello = &c;
  REQUIRE(hello);
  CHECK(j["ids"].get<std::vector<int32_t>>() == hello->ids);
  CHECK(j["pieces"].get<std::vector<std::string>>() == hello->tokens);
  REQUIRE(run("tokenize --model '" + model + "' --text '<|im_start|>hi' --json", &out) == 0);
  CHECK(json::parse(out)["ids"][0] == 626);
  REQUIRE(run("tokenize --model '" + model + "' --text '<|im_start|>hi' --no-parse-special --ids", &out) == 0);
  CHECK(out.find("626") == std::string::npos);
  REQUIRE(run("tokenize --model 'synthetic:tiny_qwen3' --text 'ab' --add-special --json", &out) == 0);
  CHECK(json::parse(out)["ids"] == json::array({1, 3 + 'a', 3 + 'b'}));
  CHECK(run("tokenize --model '" + model + "' --text \"$(printf 'bad \\377')\" --json", &out) == 1);
  CHECK_THAT(read_file(err), Contains("not valid UTF-8"));
  // From a file: the one error line names the file, the byte and its offset.
  const std::string bad_file = temp_path("cli_bad_utf8.txt");
  {
    std::FILE* f = std::fopen(bad_file.c_str(), "wb");
    REQUIRE(f);
    std::fputs("fine text, then \xC3(", f);
    std::fclose(f);
  }
  CHECK(run("tokenize --model '" + model + "' --file '" + bad_file + "'", &out) == 1);
  CHECK_THAT(read_file(err), Contains(bad_file) && Contains("0xC3") && Contains("offset 16"));

  // run: text in, text out, with the documented JSON keys.
  REQUIRE(run("run --model '" + model + "' --prompt 'Hello world' -n 6 --greedy --ignore-eos --json --threads 2",
              &out) == 0);
  j = json::parse(out);
  for (const char* key : {"generated_ids", "n_prompt_tokens", "ttft_ms", "decode_tokens_per_s", "text", "stop_reason"})
    CHECK(j.contains(key));
  CHECK(j["n_prompt_tokens"] == hello->ids.size());
  CHECK(j["generated_ids"].size() == 6);
  CHECK(j["stop_reason"] == "length");
  const std::string text = j["text"].get<std::string>();
  CHECK(tok::utf8_invalid_offset(text) == std::string::npos);
  // Text mode streams the same text after the prompt; timings go to stderr.
  REQUIRE(run("run --model '" + model + "' --prompt 'Hello world' -n 6 --greedy --ignore-eos --threads 2", &out) == 0);
  CHECK(out == "Hello world" + text + "\n");
  CHECK_THAT(read_file(err), Contains("prompt eval"));
  CHECK_THAT(read_file(err), Contains("TTFT"));
  // A stop string taken from the generated text ends it there and is not printed.
  if (text.size() >= 2) {
    const std::string stop = text.substr(text.size() / 2, 1);
    if (stop != "'" && stop != "\\" && tok::utf8_invalid_offset(stop) == std::string::npos) {
      REQUIRE(run("run --model '" + model +
                      "' --prompt 'Hello world' -n 6 --greedy --ignore-eos --json --threads 2 --stop '" + stop + "'",
                  &out) == 0);
      j = json::parse(out);
      CHECK(j["stop_reason"] == "stop_string");
      CHECK(j["text"] == text.substr(0, text.find(stop)));
    }
  }
  // Same seed, same tokens.
  std::string a, b;
  REQUIRE(run("run --model '" + model + "' --prompt 'Hi' -n 8 --temp 1.5 --seed 3 --ignore-eos --json --threads 2",
              &a) == 0);
  REQUIRE(run("run --model '" + model + "' --prompt 'Hi' -n 8 --temp 1.5 --seed 3 --ignore-eos --json --threads 2",
              &b) == 0);
  CHECK(json::parse(a)["generated_ids"] == json::parse(b)["generated_ids"]);
  // --chat: the built-in ChatML for a qwen3 model without a template, said on stderr.
  REQUIRE(run("run --model '" + model + "' --chat --prompt 'Hi' -n 2 --greedy --json --threads 2", &out) == 0);
  CHECK_THAT(read_file(err), Contains("built-in ChatML"));
  CHECK(json::parse(out)["n_prompt_tokens"].get<int>() > 5);
  // Bad input: invalid UTF-8, prompt longer than the context, bad sampling flags.
  CHECK(run("run --model '" + model + "' --prompt \"$(printf 'a\\303')\" -n 2", &out) == 1);
  CHECK_THAT(read_file(err), Contains("not valid UTF-8"));
  CHECK(run("run --model '" + model + "' --prompt 'The quick brown fox jumps' -n 4 --ctx 8", &out) == 1);
  CHECK_THAT(read_file(err), Contains("--ctx 8 is too small"));
  CHECK(run("run --model '" + model + "' --prompt 'x' -n 1 --top-p 2", &out) == 1);
  CHECK_THAT(read_file(err), Contains("--top-p"));
}

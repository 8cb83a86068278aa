// Model-level bad input through open_weights: GGUF files whose metadata disagrees with their
// tensors, synthetic: strings and model YAML files. Each must fail with one Error line that names
// the file (or string), the field or tensor, and what is wrong — before any allocation that the
// bad values would size (the sanitizer build would abort on an absurd one).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/gguf.h"
#include "core/json_util.h"
#include "core/model_spec.h"
#include "core/npy.h"
#include "core/weight_source.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;

namespace {

const char* kSmallLlamaYaml =
    "family: llama\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
    "head_dim: 16\nintermediate_size: 96\nvocab_size: 80\n";

// A valid small llama GGUF written by our exporter (f16), made once per test process.
const std::string& base_gguf() {
  static const std::string path = [] {
    ModelSpec s = parse_spec_yaml_text(kSmallLlamaYaml, "small_llama");
    s.dtype = DType::F32;
    auto src = make_synthetic_weights(s, 3, nullptr);
    const std::string p = temp_path("bad_input_base.gguf");
    write_gguf(*src, p, DType::F16);
    return p;
  }();
  return path;
}

struct GgufEdit {
  std::vector<std::pair<std::string, GgufValue>> kv;
  std::vector<std::pair<std::string, TensorView>> tensors;

  void set(const std::string& key, GgufValue v) {
    for (auto& e : kv)
      if (e.first == key) {
        e.second = std::move(v);
        return;
      }
    kv.emplace_back(key, std::move(v));
  }
  void erase_key(const std::string& key) {
    for (size_t i = 0; i < kv.size(); ++i)
      if (kv[i].first == key) kv.erase(kv.begin() + static_cast<long>(i--));
  }
  void drop(const std::string& prefix) {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].first.compare(0, prefix.size(), prefix) == 0)
        tensors.erase(tensors.begin() + static_cast<long>(i--));
  }
};

// Copies the base file through the writer with `edit` applied; returns the new path.
std::string edited_gguf(const std::string& name, const std::function<void(GgufEdit&)>& edit) {
  GgufFile f(base_gguf());
  GgufEdit e;
  for (const auto& kv : f.metadata()) e.kv.emplace_back(kv.first, kv.second);
  for (const auto& t : f.tensors()) e.tensors.emplace_back(t.name, f.view(t));
  std::vector<float> extra(64, 0.5f);  // data for tensors an edit adds
  TensorView extra_view;
  extra_view.shape = {64};
  extra_view.data = extra.data();
  extra_view.nbytes = 256;
  edit(e);
  GgufWriter w;
  for (auto& kv : e.kv) w.set(kv.first, kv.second);
  for (auto& t : e.tensors) w.add_tensor(t.first, t.second.data ? t.second : extra_view);
  const std::string path = temp_path("bad_" + name + ".gguf");
  w.write(path);
  return path;
}

GgufValue u64(uint64_t v) {
  return GgufValue::of_u64(v);
}
GgufValue u32(uint32_t v) {
  return GgufValue::of_u32(v);
}

// open_weights must fail with one line containing the path and every part.
void require_open_error(const std::string& model, const std::vector<std::string>& parts) {
  try {
    open_weights(model);
    FAIL("open_weights(" << model << ") succeeded");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK_THAT(msg, Contains(model));
    CHECK(msg.find('\n') == std::string::npos);
    for (const auto& p : parts) CHECK_THAT(msg, Contains(p));
  }
}

std::string yaml_file(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name + ".yaml");
  write_file(path, text);
  return path;
}

std::string spec_error(const std::string& yaml_path) {
  try {
    load_spec_yaml(yaml_path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bad input: the unedited base GGUF opens", "[bad_input]") {
  auto src = open_weights(edited_gguf("unchanged", [](GgufEdit&) {}));
  CHECK(src->spec().num_hidden_layers == 2);
  CHECK(src->spec().hidden_size == 64);
  CHECK(src->spec().vocab_size == 80);
}

TEST_CASE("bad input: GGUF metadata that disagrees with the tensors", "[bad_input][gguf]") {
  SECTION("block_count larger than the layers present") {
    const std::string p = edited_gguf("blocks3", [](GgufEdit& e) { e.set("llama.block_count", u32(3)); });
    require_open_error(p, {"missing tensor 'blk.2.", "llama"});
  }
  SECTION("block_count smaller than the layers present") {
    const std::string p = edited_gguf("blocks1", [](GgufEdit& e) { e.set("llama.block_count", u32(1)); });
    require_open_error(p, {"unexpected tensor 'blk.1."});
  }
  SECTION("embedding_length wrong: a shape mismatch naming the tensor and both shapes") {
    const std::string p = edited_gguf("emb32", [](GgufEdit& e) { e.set("llama.embedding_length", u32(32)); });
    require_open_error(p, {"'token_embd.weight'", "[80, 64]", "[80, 32]"});
  }
  SECTION("feed_forward_length wrong") {
    const std::string p = edited_gguf("ffn", [](GgufEdit& e) { e.set("llama.feed_forward_length", u32(128)); });
    require_open_error(p, {"'blk.0.ffn_gate.weight'", "[96, 64]", "[128, 64]"});
  }
  SECTION("vocab_size wrong") {
    const std::string p = edited_gguf("vocab", [](GgufEdit& e) { e.set("llama.vocab_size", u32(81)); });
    require_open_error(p, {"'token_embd.weight'", "[80, 64]", "[81, 64]"});
  }
  SECTION("a missing tensor") {
    const std::string p = edited_gguf("missing", [](GgufEdit& e) { e.drop("blk.1.ffn_up.weight"); });
    require_open_error(p, {"missing tensor 'blk.1.ffn_up.weight'"});
    const std::string p2 = edited_gguf("noemb", [](GgufEdit& e) { e.drop("token_embd.weight"); });
    require_open_error(p2, {"missing tensor 'token_embd.weight'"});
  }
  SECTION("an unexpected extra tensor") {
    const std::string p =
        edited_gguf("extra", [](GgufEdit& e) { e.tensors.emplace_back("blk.0.attn_q.bias", TensorView{}); });
    require_open_error(p, {"unexpected tensor 'blk.0.attn_q.bias'"});
    const std::string p2 =
        edited_gguf("ropefreqs", [](GgufEdit& e) { e.tensors.emplace_back("rope_freqs.weight", TensorView{}); });
    require_open_error(p2, {"'rope_freqs.weight'", "not supported"});
  }
  SECTION("head_count_kv not dividing head_count") {
    const std::string p = edited_gguf("kv3", [](GgufEdit& e) { e.set("llama.attention.head_count_kv", u32(3)); });
    require_open_error(p, {"num_key_value_heads (3)", "llama.attention.head_count_kv"});
  }
  SECTION("head counts of zero, odd head size, value_length != key_length") {
    require_open_error(edited_gguf("heads0", [](GgufEdit& e) { e.set("llama.attention.head_count", u32(0)); }),
                       {"num_attention_heads = 0", "llama.attention.head_count"});
    require_open_error(edited_gguf("hd15",
                                   [](GgufEdit& e) {
                                     e.set("llama.attention.key_length", u32(15));
                                     e.set("llama.attention.value_length", u32(15));
                                     e.set("llama.rope.dimension_count", u32(15));
                                   }),
                       {"head_dim = 15", "even", "llama.attention.key_length"});
    require_open_error(edited_gguf("vlen", [](GgufEdit& e) { e.set("llama.attention.value_length", u32(32)); }),
                       {"llama.attention.value_length"});
  }
  SECTION("absurd dimensions fail in validation, before anything is sized by them") {
    require_open_error(
        edited_gguf("emb2e40", [](GgufEdit& e) { e.set("llama.embedding_length", u64(uint64_t(1) << 40)); }),
        {"hidden_size = 1099511627776", "out of range", "llama.embedding_length"});
    require_open_error(
        edited_gguf("blocks2e40", [](GgufEdit& e) { e.set("llama.block_count", u64(uint64_t(1) << 40)); }),
        {"num_hidden_layers = 1099511627776", "llama.block_count"});
    require_open_error(
        edited_gguf("ffn2e40", [](GgufEdit& e) { e.set("llama.feed_forward_length", u64(uint64_t(1) << 40)); }),
        {"intermediate_size", "llama.feed_forward_length"});
    require_open_error(edited_gguf("vocab2e40", [](GgufEdit& e) { e.set("llama.vocab_size", u64(uint64_t(1) << 40)); }),
                       {"vocab_size", "llama.vocab_size"});
    require_open_error(edited_gguf("u64max", [](GgufEdit& e) { e.set("llama.block_count", u64(~uint64_t(0))); }),
                       {"llama.block_count", "too large"});
    // Each dimension plausible, their product (~10^15 parameters) not.
    require_open_error(edited_gguf("product",
                                   [](GgufEdit& e) {
                                     e.set("llama.embedding_length", u32(1 << 20));
                                     e.set("llama.feed_forward_length", u32(1 << 22));
                                     e.set("llama.block_count", u32(4000));
                                   }),
                       {"absurd"});
  }
  SECTION("metadata of the wrong type") {
    require_open_error(
        edited_gguf("blockstr", [](GgufEdit& e) { e.set("llama.block_count", GgufValue::of_string("2")); }),
        {"llama.block_count", "expected an integer"});
    require_open_error(edited_gguf("perlayer",
                                   [](GgufEdit& e) {
                                     e.set("llama.attention.head_count_kv", GgufValue::of_i32s({2, 2}));
                                   }),
                       {"llama.attention.head_count_kv", "per-layer array"});
    require_open_error(edited_gguf("noblocks", [](GgufEdit& e) { e.erase_key("llama.block_count"); }),
                       {"llama.block_count is missing"});
    require_open_error(
        edited_gguf("eps", [](GgufEdit& e) { e.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_f32(-1)); }),
        {"rms_norm_eps", "llama.attention.layer_norm_rms_epsilon"});
    require_open_error(
        edited_gguf("scaling", [](GgufEdit& e) { e.set("llama.rope.scaling.type", GgufValue::of_string("yarn")); }),
        {"rope.scaling.type", "yarn"});
  }
  SECTION("tokenizer metadata inconsistent with the vocabulary") {
    require_open_error(edited_gguf("bos", [](GgufEdit& e) { e.set("tokenizer.ggml.bos_token_id", u32(1000)); }),
                       {"tokenizer.ggml.bos_token_id = 1000"});
    require_open_error(edited_gguf("scores",
                                   [](GgufEdit& e) {
                                     e.set("tokenizer.ggml.scores", GgufValue::of_f32s({0, 0, 0}));
                                   }),
                       {"tokenizer.ggml.scores has 3 entries"});
    require_open_error(
        edited_gguf("types", [](GgufEdit& e) { e.set("tokenizer.ggml.token_type", GgufValue::of_i32s({1})); }),
        {"tokenizer.ggml.token_type has 1 entries"});
    require_open_error(edited_gguf("tokens",
                                   [](GgufEdit& e) {
                                     std::vector<std::string> t(79, "x");
                                     e.set("tokenizer.ggml.tokens", GgufValue::of_strings(t));
                                     e.erase_key("tokenizer.ggml.scores");
                                     e.erase_key("tokenizer.ggml.token_type");
                                   }),
                       {"tokenizer.ggml.tokens has 79 entries", "80"});
    require_open_error(
        edited_gguf("tokint", [](GgufEdit& e) { e.set("tokenizer.ggml.tokens", GgufValue::of_i32s({1})); }),
        {"tokenizer.ggml.tokens", "array of strings"});
    // A vocabulary without the tokenizer that reads it (text would be encoded as raw byte ids instead).
    require_open_error(edited_gguf("nomodel", [](GgufEdit& e) { e.erase_key("tokenizer.ggml.model"); }),
                       {"tokenizer.ggml.tokens holds 80 tokens", "tokenizer.ggml.model is missing or empty"});
    require_open_error(
        edited_gguf("emptymodel", [](GgufEdit& e) { e.set("tokenizer.ggml.model", GgufValue::of_string("")); }),
        {"tokenizer.ggml.model is missing or empty"});
  }
}

TEST_CASE("bad input: model strings that are not a file, directory or synthetic spec", "[bad_input]") {
  const std::string missing = temp_path("no_such_model.gguf");
  require_open_error(missing, {"no such file"});
  const std::string empty = temp_path("empty.gguf");
  write_file(empty, "");
  require_open_error(empty, {"offset 0"});
  const std::string text = temp_path("text.gguf");
  write_file(text, "this is not a model\n");
  require_open_error(text, {"offset 0", "magic"});
}

TEST_CASE("bad input: synthetic: strings", "[bad_input][synthetic]") {
  CHECK_THROWS_WITH(open_weights("synthetic:"), Contains("synthetic:") && Contains("missing spec name"));
  CHECK_THROWS_WITH(open_weights("synthetic:?dtype=f16"), Contains("missing spec name"));
  CHECK_THROWS_WITH(open_weights("synthetic:nosuchspec"), Contains("'nosuchspec'") && Contains("tiny_llama"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?dtype=iq2_xs"), Contains("'iq2_xs'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?mix=q9_K_M"), Contains("'q9_K_M'") && Contains("q4_K_M"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?seed=abc"),
                    Contains("synthetic:tiny_llama?seed=abc") && Contains("seed 'abc'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?seed="), Contains("seed ''"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?layers=0"),
                    Contains("synthetic:tiny_llama?layers=0") && Contains("layers '0'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?layers=-3"), Contains("layers '-3'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?layers=2x"), Contains("layers '2x'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?layers=100000"),
                    Contains("layers '100000'") && Contains("1 to 4096"));
  // Numbers past 2^64 saturated (a silent seed of 2^64 - 1); every reader of the text parses it alike.
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?seed=99999999999999999999999"),
                    Contains("seed '99999999999999999999999' must be a whole number from 0 to 18446744073709551615"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?seed=-1"), Contains("seed '-1'"));
  CHECK(parse_synthetic("tiny_llama?seed=18446744073709551615&layers=2").seed == UINT64_MAX);
  CHECK(parse_synthetic("tiny_llama?seed=18446744073709551615&layers=2").spec.num_hidden_layers == 2);
  CHECK_THROWS_WITH(parse_synthetic("tiny_llama?layers=abc"),
                    Contains("synthetic:tiny_llama?layers=abc: layers 'abc'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?foo=1"),
                    Contains("synthetic:tiny_llama?foo=1") && Contains("unknown option 'foo'"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?dtype"), Contains("'dtype'") && Contains("key=value"));
  const std::string missing_yaml = temp_path("no_such_spec.yaml");
  CHECK_THROWS_WITH(open_weights("synthetic:" + missing_yaml), Contains(missing_yaml));

  // And the well-formed options work.
  auto src = open_weights("synthetic:tiny_llama?dtype=q8_0&seed=3&layers=1");
  CHECK(src->spec().num_hidden_layers == 1);
  CHECK(src->spec().dtype == DType::Q8_0);
  CHECK(src->tensor("blk.0.attn_q.weight").dtype == DType::Q8_0);
}

TEST_CASE("bad input: model YAML files", "[bad_input][yaml]") {
  REQUIRE(spec_error(yaml_file("ok", kSmallLlamaYaml)).empty());

  SECTION("malformed YAML names the line") {
    const std::string p =
        yaml_file("malformed", "family: llama\nhidden_size: 64\nnum_hidden_layers: [2, 3\nvocab_size: 10\n");
    const std::string msg = spec_error(p);
    CHECK_THAT(msg, Contains(p) && Contains("malformed YAML") && Contains("line "));
    const std::string p2 = yaml_file("badindent", "family: llama\nhidden_size: 64\n  vocab_size: 10\n");
    CHECK_THAT(spec_error(p2), Contains(p2) && Contains("line 3"));
    const std::string p3 = yaml_file("tab", "family: llama\n\thidden_size: 64\n");
    CHECK_THAT(spec_error(p3), Contains(p3) && Contains("line"));
  }
  SECTION("not a mapping, empty") {
    const std::string p = yaml_file("list", "- 1\n- 2\n");
    CHECK_THAT(spec_error(p), Contains(p) && Contains("mapping"));
    const std::string p2 = yaml_file("empty", "");
    CHECK_THAT(spec_error(p2), Contains(p2) && Contains("mapping"));
  }
  SECTION("unknown and missing fields") {
    const std::string p = yaml_file("unknown", std::string(kSmallLlamaYaml) + "hiden_size: 64\n");
    CHECK_THAT(spec_error(p), Contains(p) && Contains("unknown field 'hiden_size'"));
    const std::string p2 = yaml_file("missing",
                                     "family: llama\nhidden_size: 64\nnum_hidden_layers: 2\n"
                                     "num_attention_heads: 4\nintermediate_size: 96\n");
    CHECK_THAT(spec_error(p2), Contains(p2) && Contains("missing required field 'vocab_size'"));
    const std::string p3 = yaml_file("nofamily", "hidden_size: 64\n");
    CHECK_THAT(spec_error(p3), Contains("missing required field 'family'"));
    const std::string p5 = yaml_file("gpt2", "family: gpt2\nhidden_size: 64\n");
    CHECK_THAT(spec_error(p5), Contains(p5) && Contains("'gpt2'"));
    const std::string p6 = yaml_file("dtype", std::string(kSmallLlamaYaml) + "dtype: iq2_xs\n");
    CHECK_THAT(spec_error(p6), Contains(p6) && Contains("dtype") && Contains("iq2_xs"));
  }
  SECTION("values of the wrong type") {
    const std::string p = yaml_file("strdim",
                                    "family: llama\nhidden_size: abc\nnum_hidden_layers: 2\n"
                                    "num_attention_heads: 4\nintermediate_size: 96\nvocab_size: 80\n");
    CHECK_THAT(spec_error(p), Contains(p) && Contains("'hidden_size'") && Contains("abc"));
    const std::string p2 = yaml_file("overflow",
                                     "family: llama\nhidden_size: 99999999999999999999999\n"
                                     "num_hidden_layers: 2\nnum_attention_heads: 4\n"
                                     "intermediate_size: 96\nvocab_size: 80\n");
    CHECK_THAT(spec_error(p2), Contains("'hidden_size'"));
    const std::string p3 = yaml_file("flowlist",
                                     "family: llama\nhidden_size: [1, 2]\n"
                                     "num_hidden_layers: 2\nnum_attention_heads: 4\n"
                                     "intermediate_size: 96\nvocab_size: 80\n");
    CHECK_THAT(spec_error(p3), Contains("'hidden_size'"));
  }
  SECTION("negative, zero and absurd dimensions") {
    auto with = [](const std::string& field, const std::string& v) {
      std::string text = kSmallLlamaYaml;
      const auto at = text.find(field + ":");
      const auto eol = text.find('\n', at);
      return text.substr(0, at) + field + ": " + v + text.substr(eol);
    };
    struct Case {
      const char* field;
      const char* value;
    };
    for (const Case& c :
         {Case{"hidden_size", "-64"}, Case{"hidden_size", "0"}, Case{"hidden_size", "1099511627776"},
          Case{"num_hidden_layers", "0"}, Case{"num_hidden_layers", "100000"}, Case{"num_attention_heads", "-4"},
          Case{"num_key_value_heads", "0"}, Case{"num_key_value_heads", "8"}, Case{"head_dim", "0"},
          Case{"head_dim", "1"}, Case{"intermediate_size", "0"}, Case{"vocab_size", "-1"},
          Case{"vocab_size", "1000000000000"}}) {
      INFO(c.field << ": " << c.value);
      const std::string p = yaml_file(std::string("dim_") + c.field, with(c.field, c.value));
      const std::string msg = spec_error(p);
      CHECK_THAT(msg, Contains(p) && Contains(c.field));
      CHECK(msg.find('\n') == std::string::npos);
    }
    const std::string p = yaml_file("kv3", with("num_key_value_heads", "3"));
    CHECK_THAT(spec_error(p), Contains("multiple of num_key_value_heads"));
    const std::string p2 = yaml_file("theta", std::string(kSmallLlamaYaml) + "rope_theta: -1\n");
    CHECK_THAT(spec_error(p2), Contains("rope_theta"));
    const std::string p3 = yaml_file("eps", std::string(kSmallLlamaYaml) + "rms_norm_eps: 0\n");
    CHECK_THAT(spec_error(p3), Contains("rms_norm_eps"));
  }
  SECTION("MoE: num_experts_per_tok > num_experts and missing MoE fields") {
    const std::string moe =
        "family: qwen3_moe\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
        "head_dim: 16\nvocab_size: 80\nmoe_intermediate_size: 32\n";
    REQUIRE(spec_error(yaml_file("moe_ok", moe + "num_experts: 8\nnum_experts_per_tok: 2\n")).empty());
    const std::string p = yaml_file("moe_topk", moe + "num_experts: 8\nnum_experts_per_tok: 9\n");
    CHECK_THAT(spec_error(p), Contains(p) && Contains("num_experts_per_tok = 9"));
    const std::string p2 = yaml_file("moe_zero", moe + "num_experts: 0\nnum_experts_per_tok: 2\n");
    CHECK_THAT(spec_error(p2), Contains(p2) && Contains("num_"));
    const std::string p3 = yaml_file("moe_nok", moe + "num_experts: 8\n");
    CHECK_THAT(spec_error(p3), Contains("missing required field 'num_experts_per_tok'"));
    const std::string p4 = yaml_file("moe_huge", moe + "num_experts: 100000000\nnum_experts_per_tok: 2\n");
    CHECK_THAT(spec_error(p4), Contains("num_experts"));
  }
  SECTION("a bad YAML spec through synthetic: fails the same way") {
    const std::string p = yaml_file("synth_bad", std::string(kSmallLlamaYaml) + "hiden_size: 64\n");
    CHECK_THROWS_WITH(open_weights("synthetic:" + p), Contains(p) && Contains("hiden_size"));
  }
}

TEST_CASE("bad input: .npy files", "[bad_input][npy]") {
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  const std::string ok = temp_path("ok.npy");
  write_npy_f32(ok, x.data(), {2, 3});
  const NpyArray a = read_npy(ok);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  REQUIRE(a.values.size() == 6);
  CHECK(a.values[2] == 3.25);
  const std::string v1 = temp_path("vec.npy");
  write_npy_f32(v1, x.data(), {6});
  CHECK(read_npy(v1).shape == std::vector<int64_t>{6});

  // Hand-made version-1.0 files: magic, version, u16 header length, header, data.
  auto npy = [](const std::string& header, const std::string& data) {
    std::string h = header;
    const uint16_t n = static_cast<uint16_t>(h.size());
    return std::string("\x93NUMPY\x01\x00", 8) + std::string(reinterpret_cast<const char*>(&n), 2) + h + data;
  };
  auto npy_error = [](const std::string& name, const std::string& bytes) {
    const std::string path = temp_path(name + ".npy");
    write_file(path, bytes);
    try {
      read_npy(path);
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Contains(path));
      return msg;
    }
    return std::string();
  };
  const std::string f8(8, '\0');
  CHECK(npy_error("good", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f8)).empty());
  CHECK_THAT(npy_error("short", "\x93NUM"), Contains("not a .npy file"));
  CHECK_THAT(npy_error("magic", std::string(64, 'x')), Contains("not a .npy file"));
  CHECK_THAT(npy_error("version", std::string("\x93NUMPY\x09\x00\x00\x00", 10)), Contains("version 9"));
  CHECK_THAT(npy_error("hdrlen", std::string("\x93NUMPY\x01\x00\xff\x7f", 10) + "{}"), Contains("header runs past"));
  CHECK_THAT(npy_error("nodescr", npy("{'shape': (2,), }", f8)), Contains("'descr'"));
  CHECK_THAT(npy_error("noquote", npy("{'descr': <f4, 'fortran_order': False, 'shape': (2,), }", f8)),
             Contains("descr"));
  CHECK_THAT(npy_error("dtype", npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f8)),
             Contains("'>f4'"));
  CHECK_THAT(npy_error("fortran", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", f8)),
             Contains("Fortran"));
  CHECK_THAT(npy_error("shapeabc", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (abc,), }", f8)),
             Contains("'abc'"));
  CHECK_THAT(npy_error("shapeneg", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f8)),
             Contains("'-2'"));
  CHECK_THAT(
      npy_error("shapebig", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", f8)),
      Contains("shape entry"));
  CHECK_THAT(
      npy_error("shapeprod",
                npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776, 16), }", f8)),
      Contains("truncated"));
  CHECK_THAT(npy_error("noparen", npy("{'descr': '<f4', 'fortran_order': False, 'shape': 2, }", f8)),
             Contains("tuple"));
  CHECK_THAT(npy_error("truncated", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f8)),
             Contains("truncated"));
}

TEST_CASE("bad input: JSON nested past 256 levels is refused before anything recurses through it",
          "[bad_input][json]") {
  // A value nested 200000 deep (a 400 KB config.json) overflowed the stack when its error message
  // dumped it; 100 deep is read, and refused for its type, naming the field.
  const std::string src = fixtures_dir() + "/hf/llama";
  const std::string cfg = read_file(src + "/config.json");
  const auto at = cfg.find("\"hidden_size\":");
  REQUIRE(at != std::string::npos);
  const auto value_end = cfg.find_first_of(",}", at);
  for (int depth : {100, 257, 200000}) {
    INFO("depth " << depth);
    const std::string dir = temp_path("deep_cfg_" + std::to_string(depth));
    std::string out;
    REQUIRE(run_command("mkdir -p '" + dir + "' && cp '" + src + "/model.safetensors' '" + dir + "/'", &out) == 0);
    write_file(dir + "/config.json", cfg.substr(0, at) + "\"hidden_size\": " + std::string(depth, '[') + "1" +
                                         std::string(depth, ']') + cfg.substr(value_end));
    if (depth <= 256)
      require_open_error(dir, {"config.json", "field 'hidden_size' must be an integer, got an array"});
    else
      require_open_error(dir,
                         {"config.json: JSON nested " + std::to_string(depth + 1) + " deep, more than 256 levels"});
  }
  // A safetensors header alike.
  const std::string st = read_file(src + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  std::string header = st.substr(8, n);
  header.insert(header.rfind('}'),
                ", \"__metadata__\": {\"x\": " + std::string(5000, '[') + std::string(5000, ']') + "}");
  const std::string dir = temp_path("deep_st");
  std::string out;
  REQUIRE(run_command("mkdir -p '" + dir + "' && cp '" + src + "/config.json' '" + dir + "/'", &out) == 0);
  const uint64_t m = header.size();
  write_file(dir + "/model.safetensors", std::string(reinterpret_cast<const char*>(&m), 8) + header + st.substr(8 + n));
  require_open_error(dir, {"model.safetensors: header: JSON nested 5002 deep"});
  const std::string tricky = "{\"a\": \"[[[[\\\"[\", \"b\": [1, {\"c\": []}]}";
  CHECK(json_nesting_depth(tricky.data(), tricky.data() + tricky.size()) == 4);  // strings and escapes skipped
}

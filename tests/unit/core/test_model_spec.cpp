// Tests for core/model_spec: builtin shapes, byte/FLOP accounting, YAML and HF config.json loading.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/model_spec.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

TEST_CASE("builtin specs have the DESIGN.md §5 shapes and sizes", "[spec]") {
  const ModelSpec n8 = builtin_spec("nemo8b");
  CHECK(n8.family == Family::Llama);
  CHECK(n8.q_dim() == 4096);
  CHECK(n8.kv_dim() == 1024);
  // 15.7 GB in f16 (the paper's figure, decimal).
  CHECK(n8.total_bytes() / 1e9 == Approx(16.85).epsilon(0.01));
  CHECK(n8.total_bytes() / double(1ull << 30) == Approx(15.7).epsilon(0.01));
  const ModelSpec q30 = builtin_spec("qwen30b");
  CHECK(q30.is_moe());
  CHECK(q30.has_qk_norm());
  CHECK(q30.total_bytes() / double(1ull << 30) == Approx(16.04).epsilon(0.01));
  const ModelSpec q235 = builtin_spec("qwen235b");
  CHECK(q235.n_params() / 1e9 == Approx(235).epsilon(0.01));
  const ModelSpec n4 = builtin_spec("nemo4b");
  // nemo4b's shape is approximate (DESIGN.md §5): check the table's dimensions, not the size.
  CHECK(n4.hidden_size == 3072);
  CHECK(n4.num_hidden_layers == 32);
  CHECK(n4.intermediate_size == 9216);
  for (const auto& name : builtin_spec_names()) CHECK_NOTHROW(builtin_spec(name).validate(name));
  CHECK_THROWS_WITH(builtin_spec("gpt5"), Contains("nemo8b"));
}

TEST_CASE("tensor list: canonical names, shapes, dtypes, bytes and FLOPs", "[spec]") {
  ModelSpec s = builtin_spec("tiny_moe");
  s.dtype = DType::Q8_0;
  const auto ts = s.tensors();
  auto find = [&](const std::string& n) -> const TensorDesc& {
    for (const auto& t : ts)
      if (t.name == n) return t;
    FAIL("missing " << n);
    return ts.front();
  };
  const TensorDesc& q = find("blk.1.attn_q.weight");
  CHECK(q.shape == Shape{s.q_dim(), s.hidden_size});
  CHECK(q.dtype == DType::Q8_0);
  CHECK(q.bytes == uint64_t(s.q_dim()) * (s.hidden_size / 32) * 34);
  CHECK(q.flops_per_token == 2.0 * s.q_dim() * s.hidden_size);
  const TensorDesc& up = find("blk.0.ffn_up_exps.weight");
  CHECK(up.shape == Shape{s.num_experts, s.moe_intermediate_size, s.hidden_size});
  CHECK(up.flops_per_token == 2.0 * s.num_experts_per_tok * s.moe_intermediate_size * s.hidden_size);
  CHECK(find("blk.0.ffn_gate_inp.weight").dtype == DType::F32);  // router stays f32
  CHECK(find("blk.0.attn_q_norm.weight").dtype == DType::F32);
  CHECK(find("output.weight").shape == Shape{s.vocab_size, s.hidden_size});
  // Quantised rows that are not whole blocks fall back to f16 (llama.cpp's rule).
  ModelSpec odd = builtin_spec("tiny_llama");
  odd.dtype = DType::Q4_0;
  odd.intermediate_size = 200;  // ffn_down rows of 200: not a multiple of 32
  for (const auto& t : odd.tensors()) {
    if (t.name == "blk.0.ffn_down.weight") CHECK(t.dtype == DType::F16);
    if (t.name == "blk.0.ffn_up.weight") CHECK(t.dtype == DType::Q4_0);
  }
  ModelSpec tied = builtin_spec("tiny_qwen3");
  for (const auto& t : tied.tensors()) CHECK(t.name != "output.weight");
  CHECK(tied.kv_bytes_per_token(DType::F32) == uint64_t(tied.num_hidden_layers) * 2 * tied.kv_dim() * 4);
  CHECK(tied.kv_bytes_per_token(DType::F16) == uint64_t(tied.num_hidden_layers) * 2 * tied.kv_dim() * 2);
  // qwen2: f32 biases of the q, k and v projections under llama.cpp's names, beside quantised matrices.
  ModelSpec q2 = builtin_spec("tiny_qwen2");
  q2.dtype = DType::Q4_0;
  int biases = 0;
  for (const auto& t : q2.tensors()) {
    if (t.kind != TensorKind::AttnQBias && t.kind != TensorKind::AttnKBias && t.kind != TensorKind::AttnVBias) continue;
    ++biases;
    CHECK(t.dtype == DType::F32);
    CHECK(t.name.size() > 5);
    CHECK(t.name.substr(t.name.size() - 5) == ".bias");
    CHECK(t.shape == Shape{t.kind == TensorKind::AttnQBias ? q2.q_dim() : q2.kv_dim()});
  }
  CHECK(biases == 3 * q2.num_hidden_layers);
  CHECK(tensor_name(TensorKind::AttnKBias, 7) == "blk.7.attn_k.bias");
  CHECK(tensor_name(TensorKind::OutputNorm, -1) == "output_norm.weight");
}

TEST_CASE("HF config.json: transformers 4.x and 5.x spellings", "[spec]") {
  const std::string v4 = R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 100,
    "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "norm_topk_prob": true, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"})";
  const std::string v5 = R"({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 100,
    "intermediate_size": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "rms_norm_eps": 1e-6, "dtype": "float32"})";
  ModelSpec a = spec_from_hf_config_json(v4, "v4");
  ModelSpec b = spec_from_hf_config_json(v5, "v5");
  CHECK(a.num_experts == 8);
  CHECK(b.num_experts == 8);
  CHECK(a.rope_theta == 1e6);
  CHECK(b.rope_theta == 1e6);
  CHECK(a.norm_topk_prob);
  CHECK_FALSE(b.norm_topk_prob);  // HF's Qwen3MoeConfig default
  CHECK(a.dtype == DType::BF16);
  const std::string mistral = R"({"model_type": "mistral", "hidden_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 100, "intermediate_size": 64})";
  ModelSpec m = spec_from_hf_config_json(mistral, "m");
  CHECK(m.family == Family::Llama);
  CHECK(m.q_dim() == 128);
  CHECK_THROWS_WITH(spec_from_hf_config_json(R"({"model_type": "gpt2"})", "cfg.json"),
                    Contains("cfg.json") && Contains("gpt2"));
  CHECK_THROWS_WITH(spec_from_hf_config_json("{not json", "cfg.json"), Contains("malformed JSON"));
  CHECK_THROWS_WITH(spec_from_hf_config_json(R"({"model_type": "llama", "hidden_size": 64})", "cfg.json"),
                    Contains("num_hidden_layers"));
  const std::string scaled = R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 64,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})";
  CHECK_THROWS_WITH(spec_from_hf_config_json(scaled, "cfg.json"), Contains("llama3"));
}

TEST_CASE("model YAML: round trip and clear errors", "[spec]") {
  for (const auto& name : builtin_spec_names()) {
    ModelSpec s = builtin_spec(name);
    ModelSpec r = parse_spec_yaml_text(spec_to_yaml(s), "roundtrip");
    CHECK(r.tensors().size() == s.tensors().size());
    CHECK(r.total_bytes() == s.total_bytes());
    CHECK(r.rope_theta == s.rope_theta);
    CHECK(r.norm_topk_prob == s.norm_topk_prob);
  }
  CHECK_THROWS_WITH(parse_spec_yaml_text("family: llama\nhidden_size: [1, 2\n", "m.yaml"),
                    Contains("m.yaml") && Contains("line"));
  CHECK_THROWS_WITH(parse_spec_yaml_text("family: llama\nhiden_size: 4\n", "m.yaml"), Contains("hiden_size"));
  const std::string base =
      "family: llama\nhidden_size: 64\nnum_hidden_layers: 2\nnum_attention_heads: 4\nvocab_size: 10\n";
  CHECK_NOTHROW(parse_spec_yaml_text(base + "intermediate_size: 32\n", "ok.yaml"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base, "m.yaml"), Contains("intermediate_size"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "intermediate_size: -5\n", "m.yaml"), Contains("intermediate_size"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "intermediate_size: 32\nnum_key_value_heads: 3\n", "m.yaml"),
                    Contains("multiple"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "intermediate_size: 1099511627776\n", "m.yaml"),
                    Contains("out of range"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "intermediate_size: abc\n", "m.yaml"), Contains("intermediate_size"));
}

TEST_CASE("model YAML: mrope_section (Qwen2-VL's language model) read, written and checked", "[spec]") {
  const ModelSpec vl = builtin_spec("qwen2vl7b");
  CHECK(vl.family == Family::Qwen2);
  CHECK(vl.mrope_section == std::vector<int64_t>{16, 24, 24});
  CHECK(vl.hidden_size == 3584);
  CHECK(vl.kv_dim() == 512);
  CHECK(vl.vocab_size == 152064);
  CHECK(vl.n_params() / 1e9 == Approx(7.62).epsilon(0.01));  // Qwen2.5-VL-7B: 8.29B with its 0.67B tower
  CHECK(parse_spec_yaml_text(spec_to_yaml(vl), "roundtrip").mrope_section == vl.mrope_section);
  CHECK(builtin_spec("tiny_qwen2vl").mrope_section == std::vector<int64_t>{2, 3, 3});
  const std::string base = spec_to_yaml(builtin_spec("tiny_qwen2"));  // head_dim 16
  CHECK(parse_spec_yaml_text(base + "mrope_section: [4, 2, 2]\n", "m.yaml").mrope_section.size() == 3);
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "mrope_section: [2, 3, 4]\n", "m.yaml"),
                    Contains("m.yaml") && Contains("head_dim / 2 = 8"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "mrope_section: [4, 4]\n", "m.yaml"), Contains("list of 3 integers"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "mrope_section: 8\n", "m.yaml"), Contains("list of 3 integers"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(base + "mrope_section: [2, x, 3]\n", "m.yaml"), Contains("'x'"));
  const std::string llama = spec_to_yaml(builtin_spec("tiny_llama"));
  CHECK_THROWS_WITH(parse_spec_yaml_text(llama + "mrope_section: [12, 6, 6]\n", "m.yaml"), Contains("qwen2 family"));
}

TEST_CASE("YAML files: duplicate keys, keys that are lists and aliases are refused with the file and line", "[spec]") {
  const std::string base = spec_to_yaml(builtin_spec("tiny_llama"));
  auto spec_error = [](const std::string& text) {
    try {
      parse_spec_yaml_text(text, "m.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(spec_error(base) == "");
  // A second value of a key: yaml-cpp kept the first one without a word.
  CHECK_THAT(spec_error(base + "hidden_size: 64\n"),
             Contains("m.yaml: line ") && Contains("duplicate key 'hidden_size'"));
  CHECK_THAT(spec_error("vocab_size: 1\n" + base), Contains("duplicate key 'vocab_size'"));
  // A key that is a list: yaml-cpp threw "bad conversion" naming no file.
  CHECK_THAT(spec_error("[a, b]: 1\n" + base), Contains("m.yaml: line 1: a key of the top level is a list or mapping"));
  CHECK_THAT(spec_error(base + "description: &d x\nother: *d\n"), Contains("aliases (*name) are not supported"));
  // Machines read the same way.
  try {
    parse_hardware_yaml_text("name: m\nname: n\n", "hw.yaml");
    FAIL("a duplicate key was accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Contains("hw.yaml: line 2: duplicate key 'name'"));
  }
}

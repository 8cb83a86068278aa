// Tests for core/weight_source: synthetic weights, HF directories, and the GGUF export following
// llama.cpp's conventions (checked by the logits of the written file against HF transformers).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/gguf.h"
#include "core/model_spec.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {
std::string hf(const std::string& name) {
  return test::fixtures_dir() + "/hf/" + name;
}
}  // namespace

TEST_CASE("synthetic weights are deterministic and independent of the thread count", "[weights]") {
  for (const char* dt : {"f32", "f16", "bf16", "q8_0", "q4_0"}) {
    ModelSpec s = builtin_spec("tiny_moe");
    s.dtype = parse_dtype(dt);
    ThreadPool one(1), two(2);
    auto a = make_synthetic_weights(s, 7, &one);
    auto b = make_synthetic_weights(s, 7, &two);
    auto c = make_synthetic_weights(s, 8, &two);
    bool any_diff_seed = false;
    for (const auto& kv : a->tensors()) {
      const TensorView& tb = b->tensor(kv.first);
      REQUIRE(kv.second.nbytes == tb.nbytes);
      REQUIRE(std::memcmp(kv.second.data, tb.data, tb.nbytes) == 0);
      any_diff_seed |= std::memcmp(kv.second.data, c->tensor(kv.first).data, tb.nbytes) != 0;
      // Never all zeros.
      const auto* p = static_cast<const uint8_t*>(kv.second.data);
      bool nonzero = false;
      for (uint64_t i = 0; i < kv.second.nbytes && !nonzero; ++i) nonzero = p[i] != 0;
      REQUIRE(nonzero);
    }
    CHECK(any_diff_seed);
    CHECK(a->tensor("blk.0.attn_q.weight").dtype == s.dtype);
    CHECK(a->tensor("blk.0.ffn_gate_inp.weight").dtype == DType::F32);
  }
}

TEST_CASE("synthetic: model strings", "[weights]") {
  auto w = open_weights("synthetic:tiny_llama?dtype=q4_0&seed=3&layers=1");
  CHECK(w->spec().num_hidden_layers == 1);
  CHECK(w->spec().dtype == DType::Q4_0);
  CHECK(w->origin() == "synthetic:tiny_llama?dtype=q4_0&seed=3");
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?dtype=iq2_xs"), Contains("iq2_xs"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_llama?colour=red"), Contains("colour"));
  CHECK_THROWS_WITH(open_weights("synthetic:nosuch"), Contains("nosuch"));
  CHECK_THROWS_WITH(open_weights("synthetic:tiny_moe?routing=even"), Contains("routing 'even'"));
  auto conc = open_weights("synthetic:tiny_moe?dtype=q4_0&seed=3&routing=concentrated");
  CHECK(conc->origin() == "synthetic:tiny_moe?dtype=q4_0&seed=3&routing=concentrated");
  CHECK(open_weights("synthetic:tiny_moe?dtype=q4_0&seed=3&routing=balanced")->origin() ==
        "synthetic:tiny_moe?dtype=q4_0&seed=3");
}

// Balanced weights (the default) have quantised values of mean 0: q4_0 nibbles 1..15 (value -7..7),
// q8_0 codes -127..127. Concentrated ones keep the uniform draw (nibble 0, code -127 twice as often)
// and differ only in the quantised tensors.
TEST_CASE("synthetic: balanced quantised values have mean 0, concentrated ones are the uniform draw", "[weights]") {
  ModelSpec s = builtin_spec("tiny_moe");
  ThreadPool pool(2);
  for (DType dt : {DType::Q4_0, DType::Q8_0, DType::F16}) {
    s.dtype = dt;
    CAPTURE(dtype_name(dt));
    auto bal = make_synthetic_weights(s, 5, &pool);
    auto conc = make_synthetic_weights(s, 5, &pool, false, SyntheticRouting::Concentrated);
    const TensorView& b = bal->tensor("blk.0.ffn_down_exps.weight");
    const TensorView& c = conc->tensor("blk.0.ffn_down_exps.weight");
    REQUIRE(b.nbytes == c.nbytes);
    if (dt == DType::F16) {
      CHECK(std::memcmp(b.data, c.data, b.nbytes) == 0);
      continue;
    }
    auto code_sum = [&](const TensorView& t, int64_t* zeros) {
      int64_t sum = 0, n = 0;
      *zeros = 0;
      const auto* p = static_cast<const uint8_t*>(t.data);
      const uint64_t blocks = t.nbytes / (dt == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0));
      for (uint64_t i = 0; i < blocks; ++i) {
        if (dt == DType::Q4_0) {
          const auto* blk = reinterpret_cast<const BlockQ4_0*>(p) + i;
          for (uint8_t byte : blk->qs)
            for (int nib : {byte & 15, byte >> 4}) {
              sum += nib - 8;
              *zeros += nib == 0;
              ++n;
            }
        } else {
          const auto* blk = reinterpret_cast<const BlockQ8_0*>(p) + i;
          for (int8_t q : blk->qs) {
            sum += q;
            *zeros += q == -128;
            ++n;
          }
        }
      }
      return static_cast<double>(sum) / static_cast<double>(n);
    };
    int64_t zb = 0, zc = 0;
    const double mb = code_sum(b, &zb), mc = code_sum(c, &zc);
    CHECK(zb == 0);  // never the code that breaks the symmetry
    CHECK(std::abs(mb) < 0.05);
    if (dt == DType::Q4_0) {
      CHECK(zc > 0);
      CHECK(mc < -0.4);  // the uniform draw's -0.5
    }
  }
}

TEST_CASE("HF directories: canonical names, merged experts, tied embeddings", "[weights]") {
  auto moe = open_weights(hf("qwen3moe_norm"));
  const ModelSpec& s = moe->spec();
  CHECK(s.family == Family::Qwen3Moe);
  CHECK(s.norm_topk_prob);
  CHECK(moe->rope_style() == RopeStyle::Neox);
  const TensorView& g = moe->tensor("blk.1.ffn_gate_exps.weight");
  CHECK(g.shape == Shape{s.num_experts, s.moe_intermediate_size, s.hidden_size});
  CHECK_FALSE(open_weights(hf("qwen3moe_nonorm"))->spec().norm_topk_prob);
  auto q3 = open_weights(hf("qwen3"));
  CHECK(q3->spec().tie_word_embeddings);
  CHECK_FALSE(q3->has_tensor("output.weight"));
  CHECK(open_weights(hf("mistral"))->spec().head_dim == 32);
}

TEST_CASE("GGUF export: written files reproduce the HF logits per dtype", "[weights][gguf]") {
  struct Case {
    DType dtype;
    double tol;
  };
  // Tolerances: the dtype's rounding of random weights (f16 ~5e-4, bf16 ~4e-3, q8_0 ~1.5e-2 measured
  // on llama.cpp's own conversions of such models), with headroom.
  const Case cases[] = {{DType::F32, 1e-4}, {DType::F16, 3e-3}, {DType::BF16, 2.5e-2}, {DType::Q8_0, 6e-2}};
  for (const char* name : {"llama", "mistral", "qwen3", "qwen3moe_nonorm"}) {
    auto src = open_weights(hf(name));
    const auto ids = test::load_npy_ints(hf(name) + "/ref_prompt_ids.npy");
    const auto ref = test::load_npy_floats(hf(name) + "/ref_prompt_logits.npy");
    for (const Case& c : cases) {
      const std::string path = test::temp_path(std::string(name) + "." + dtype_name(c.dtype) + ".gguf");
      write_gguf(*src, path, c.dtype);
      auto back = open_weights(path);
      INFO(name << " " << dtype_name(c.dtype));
      CHECK(back->spec().family == src->spec().family);
      CHECK(back->spec().tie_word_embeddings == src->spec().tie_word_embeddings);
      // llama-family files use llama.cpp's Q/K row order and adjacent-pair RoPE.
      CHECK(back->rope_style() == (src->spec().family == Family::Llama ? RopeStyle::Normal : RopeStyle::Neox));
      const double err = test::max_rel_error(test::fast_logits(*back, ids), ref, src->spec().vocab_size);
      CHECK(err <= c.tol);
      if (c.dtype == DType::F32) CHECK(err <= 1e-5);
    }
  }
}

TEST_CASE("GGUF export of a llama.cpp file keeps its row order", "[weights][gguf]") {
  const std::string in = test::fixtures_dir() + "/llamacpp/gguf/llama_small.f16.gguf";
  auto src = open_weights(in);
  const std::string out = test::temp_path("llama_small_copy.gguf");
  write_gguf(*src, out, DType::F16);
  auto back = open_weights(out);
  for (const auto& kv : src->tensors()) {
    const TensorView& b = back->tensor(kv.first);
    REQUIRE(b.nbytes == kv.second.nbytes);
    REQUIRE(std::memcmp(b.data, kv.second.data, b.nbytes) == 0);
  }
  GgufFile f(out);
  CHECK(f.find("general.architecture")->s == "llama");
  CHECK(f.find("llama.attention.key_length")->u == 16);
}

namespace {

// An HF directory of `src` (f32 tensors) under transformers' qwen2 names: config.json + model.safetensors.
// `lm` prefixes the language model's tensors ("model.", or "model.language_model." as transformers 5 saves
// a vision-language model); `extra` tensors (f32 zeros of the given shape) are added as they are named.
void write_qwen2_hf_dir(const WeightSource& src, const std::string& dir, bool zero_biases = false,
                        const std::string& lm = "model.",
                        const std::vector<std::pair<std::string, Shape>>& extra = {}) {
  const ModelSpec& s = src.spec();
  std::vector<std::pair<std::string, std::string>> names = {{lm + "embed_tokens.weight", "token_embd.weight"},
                                                            {lm + "norm.weight", "output_norm.weight"},
                                                            {"lm_head.weight", "output.weight"}};

  for (int64_t l = 0; l < s.num_hidden_layers; ++l)
    for (const auto& m : test::qwen2_hf_layer_names())
      names.emplace_back(lm + "layers." + std::to_string(l) + "." + m.first,
                         "blk." + std::to_string(l) + "." + m.second);
  std::string header = "{", data;
  for (const auto& n : names) {
    const TensorView& t = src.tensor(n.second);
    REQUIRE(t.dtype == DType::F32);
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += (header.size() > 1 ? "," : "") +
              ("\"" + n.first + "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
               std::to_string(data.size()) + "," + std::to_string(data.size() + t.nbytes) + "]}");
    if (zero_biases && n.first.find(".bias") != std::string::npos)
      data.append(t.nbytes, '\0');
    else
      data.append(static_cast<const char*>(t.data), t.nbytes);
  }
  for (const auto& e : extra) {
    std::string shape;
    int64_t elems = 1;
    for (int64_t d : e.second) {
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
      elems *= d;
    }
    header += ",\"" + e.first + "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + 4 * elems) + "]}";
    data.append(static_cast<size_t>(4 * elems), '\0');
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::filesystem::create_directories(dir);
  std::ofstream st(dir + "/model.safetensors", std::ios::binary);
  const uint64_t n = header.size();
  st.write(reinterpret_cast<const char*>(&n), 8);
  st << header << data;
  std::ofstream(dir + "/config.json")
      << "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": " << s.hidden_size
      << ", \"num_hidden_layers\": " << s.num_hidden_layers << ", \"num_attention_heads\": " << s.num_attention_heads
      << ", \"num_key_value_heads\": " << s.num_key_value_heads << ", \"intermediate_size\": " << s.intermediate_size
      << ", \"vocab_size\": " << s.vocab_size << ", \"rms_norm_eps\": " << s.rms_norm_eps
      << ", \"rope_theta\": " << s.rope_theta << ", \"tie_word_embeddings\": false, \"use_sliding_window\": false"
      << ", \"torch_dtype\": \"float32\"}";
}

}  // namespace

TEST_CASE("qwen2: the q/k/v biases go through synthetic weights, an HF directory and a GGUF file", "[weights]") {
  auto src = open_weights("synthetic:tiny_qwen2?seed=5");
  REQUIRE(src->has_tensor("blk.1.attn_k.bias"));
  CHECK(src->tensor("blk.1.attn_v.bias").shape == Shape{src->spec().kv_dim()});
  const std::vector<int32_t> ids = {1, 17, 250, 3, 99, 42};
  const auto ref = test::fast_logits(*src, ids);

  const std::string dir = test::temp_path("qwen2_hf");
  write_qwen2_hf_dir(*src, dir);
  auto from_hf = open_weights(dir);
  CHECK(from_hf->spec().family == Family::Qwen2);
  CHECK(from_hf->rope_style() == RopeStyle::Neox);
  CHECK(test::max_rel_error(test::fast_logits(*from_hf, ids), ref, src->spec().vocab_size) == 0.0);

  const std::string path = test::temp_path("qwen2.f32.gguf");
  write_gguf(*src, path, DType::F32);
  auto back = open_weights(path);
  CHECK(back->spec().family == Family::Qwen2);
  CHECK(back->rope_style() == RopeStyle::Neox);
  CHECK(test::max_rel_error(test::fast_logits(*back, ids), ref, src->spec().vocab_size) == 0.0);

  // The biases matter: the same directory with zero biases gives other logits.
  const std::string zero_dir = test::temp_path("qwen2_hf_zero_bias");
  write_qwen2_hf_dir(*src, zero_dir, true);
  CHECK(test::max_rel_error(test::fast_logits(*open_weights(zero_dir), ids), ref, src->spec().vocab_size) > 1e-2);
  CHECK_THROWS_WITH(
      spec_from_hf_config_json("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                               "\"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8, "
                               "\"use_sliding_window\": true}",
                               "c.json"),
      Contains("use_sliding_window"));
}

TEST_CASE("Qwen2.5-VL: the language model of both config layouts and both weight-name layouts", "[weights]") {
  auto src = open_weights("synthetic:tiny_qwen2?seed=6");
  const ModelSpec& s = src->spec();
  const std::vector<int32_t> ids = {4, 8, 15, 16, 23, 42};
  const auto ref = test::fast_logits(*src, ids);
  const std::string text = "\"hidden_size\": " + std::to_string(s.hidden_size) +
                           ", \"num_hidden_layers\": " + std::to_string(s.num_hidden_layers) +
                           ", \"num_attention_heads\": " + std::to_string(s.num_attention_heads) +
                           ", \"num_key_value_heads\": " + std::to_string(s.num_key_value_heads) +
                           ", \"intermediate_size\": " + std::to_string(s.intermediate_size) +
                           ", \"vocab_size\": " + std::to_string(s.vocab_size) + ", \"rms_norm_eps\": 1e-06";
  const std::string flat = "{\"model_type\": \"qwen2_5_vl\", " + text +
                           ", \"rope_theta\": 1000000.0, \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": "
                           "[2, 3, 3]}, \"vision_config\": {\"depth\": 1}, \"tie_word_embeddings\": false}";
  const std::string nested = "{\"model_type\": \"qwen2_5_vl\", \"text_config\": {" + text +
                             ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
                             "\"mrope_section\": [2, 3, 3]}}, \"vision_config\": {\"depth\": 1}}";
  for (const std::string* cfg : {&flat, &nested}) {
    const ModelSpec vl = spec_from_hf_config_json(*cfg, "config.json");
    CHECK(vl.family == Family::Qwen2);
    CHECK(vl.vision_tower);
    CHECK(vl.mrope_section == std::vector<int64_t>{2, 3, 3});
    CHECK(vl.rope_theta == 1e6);
    CHECK(vl.hidden_size == s.hidden_size);
    CHECK(vl.num_key_value_heads == s.num_key_value_heads);
  }
  const std::vector<std::pair<std::string, Shape>> tower = {{"model.visual.patch_embed.proj.weight", {4, 3, 2, 2, 2}},
                                                            {"visual.merger.mlp.0.bias", {4}}};
  for (const char* lm : {"model.", "model.language_model."}) {
    const std::string dir = test::temp_path(std::string("vl_") + (lm[6] == 'l' ? "t5" : "flat"));
    write_qwen2_hf_dir(*src, dir, false, lm, tower);
    test::write_file(dir + "/config.json", lm[6] == 'l' ? nested : flat);
    auto from_hf = open_weights(dir);
    INFO(lm);
    CHECK(from_hf->spec().vision_tower);
    // Text alone: M-RoPE's positions are equal, the logits those of the plain qwen2 model.
    CHECK(test::max_rel_error(test::fast_logits(*from_hf, ids), ref, s.vocab_size) == 0.0);
    // As llama.cpp's qwen2vl GGUF (the language model alone): the sections survive, the tower does not.
    const std::string path = dir + ".gguf";
    write_gguf(*from_hf, path, DType::F32);
    auto back = open_weights(path);
    CHECK(back->spec().family == Family::Qwen2);
    CHECK(back->spec().mrope_section == std::vector<int64_t>{2, 3, 3});
    CHECK_FALSE(back->spec().vision_tower);
    CHECK(test::max_rel_error(test::fast_logits(*back, ids), ref, s.vocab_size) == 0.0);
  }
  // A text model's checkpoint holding vision tensors is refused, naming one.
  const std::string dir = test::temp_path("qwen2_with_tower");
  write_qwen2_hf_dir(*src, dir, false, "model.", tower);
  CHECK_THROWS_WITH(open_weights(dir), Contains("unexpected tensor"));
  CHECK_THROWS_WITH(
      spec_from_hf_config_json("{\"model_type\": \"qwen2_5_vl\", " + text +
                                   ", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3]}}",
                               "c.json"),
      Contains("mrope_section"));
}

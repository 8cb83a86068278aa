// Tests for the GGUF block types against llama.cpp itself (tests/fixtures/kquants: files that llama.cpp's
// llama-quantize wrote from the f16 weights of `shardwise synth`, and gguf-py's dequantised values of every
// tensor): dequantisation bit for bit, and our quantisers block for block from the same f16 weights.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/dtype.h"
#include "core/gguf.h"
#include "core/model_spec.h"
#include "core/quant_mix.h"
#include "core/weight_source.h"
#include "test_util.h"

using namespace shardwise;

namespace {

std::string kquants_dir() {
  return test::fixtures_dir() + "/kquants";
}

nlohmann::json reference() {
  std::ifstream f(kquants_dir() + "/reference.json");
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

// 64-bit FNV-1a over the little-endian f32 bytes, as reference.json states.
std::string fnv1a64(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * 4; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool is_source(const nlohmann::json& file) {
  return file["file"].get<std::string>().find(".f16.") != std::string::npos;
}

// The f16 file a fixture was quantised from, written again as `shardwise synth --spec <model>.yaml --dtype f16
// --seed 7` writes it (llama's Q/K rows in GGUF order), once per model.
const GgufFile& source_of(const std::string& file) {
  static std::map<std::string, std::unique_ptr<GgufFile>> made;
  const std::string model = file.substr(0, file.find('.'));
  auto& f = made[model];
  if (!f) {
    const auto src = open_weights("synthetic:" + kquants_dir() + "/" + model + ".yaml?dtype=f16&seed=7");
    const std::string path = test::temp_path(model + ".f16.gguf");
    write_gguf(*src, path, DType::F16);
    f = std::make_unique<GgufFile>(path);
  }
  return *f;
}

}  // namespace

TEST_CASE("every GGUF block type dequantises bit for bit like gguf-py, on files of llama-quantize",
          "[dtype][kquants]") {
  const nlohmann::json ref = reference();
  std::set<DType> seen;
  for (const auto& file : ref["files"]) {
    if (is_source(file)) continue;
    const std::string name = file["file"];
    GgufFile g(kquants_dir() + "/" + name);
    for (const auto& t : file["tensors"]) {
      const GgufTensorInfo* info = g.find_tensor(t["name"]);
      REQUIRE(info != nullptr);
      const DType dt = dtype_from_ggml(info->type_id, t["name"]);
      std::vector<float> y(static_cast<size_t>(elements(info->shape)));
      dequantize_row(dt, g.tensor_data(*info), y.data(), static_cast<int64_t>(y.size()));
      INFO(name << " " << t["name"].get<std::string>() << " " << dtype_name(dt));
      CHECK(fnv1a64(y) == t["fnv1a64"].get<std::string>());
      for (size_t i = 0; i < 8 && i < y.size(); ++i) CHECK(y[i] == t["first8"][i].get<float>());
      seen.insert(dt);
    }
  }
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    if (dtype_is_quantized(t)) CHECK(seen.count(t) == 1);  // the fixtures cover every block type we read
  }
}

TEST_CASE("the f16 sources of the fixtures are written again bit for bit", "[dtype][kquants]") {
  const nlohmann::json ref = reference();
  int sources = 0;
  for (const auto& file : ref["files"]) {
    if (!is_source(file)) continue;
    const GgufFile& g = source_of(file["file"]);
    for (const auto& t : file["tensors"]) {
      const GgufTensorInfo* info = g.find_tensor(t["name"]);
      REQUIRE(info != nullptr);
      std::vector<float> y(static_cast<size_t>(elements(info->shape)));
      dequantize_row(dtype_from_ggml(info->type_id, t["name"]), g.tensor_data(*info), y.data(),
                     static_cast<int64_t>(y.size()));
      INFO(file["file"].get<std::string>() << " " << t["name"].get<std::string>());
      CHECK(fnv1a64(y) == t["fnv1a64"].get<std::string>());
    }
    ++sources;
  }
  CHECK(sources == 2);
}

TEST_CASE("our quantisers write llama-quantize's blocks from the same f16 weights", "[dtype][kquants]") {
  const nlohmann::json ref = reference();
  std::set<DType> checked;
  for (const auto& file : ref["files"]) {
    if (is_source(file)) continue;
    const std::string name = file["file"];
    const GgufFile& src = source_of(name);
    GgufFile g(kquants_dir() + "/" + name);
    for (const auto& t : file["tensors"]) {
      const GgufTensorInfo* info = g.find_tensor(t["name"]);
      REQUIRE(info != nullptr);
      const DType dt = dtype_from_ggml(info->type_id, t["name"]);
      if (!dtype_is_quantized(dt) || dt == DType::IQ4_NL) continue;  // IQ4_NL: a simpler search than llama's
      const GgufTensorInfo* f16 = src.find_tensor(t["name"]);
      REQUIRE(f16 != nullptr);
      REQUIRE(f16->type_id == static_cast<uint32_t>(DType::F16));
      const int64_t n = elements(f16->shape);
      std::vector<float> x(static_cast<size_t>(n));
      dequantize_row(DType::F16, src.tensor_data(*f16), x.data(), n);
      std::vector<uint8_t> q(dtype_row_bytes(dt, n));
      quantize_row(dt, x.data(), q.data(), n);
      REQUIRE(q.size() == info->nbytes);
      const uint8_t* want = g.tensor_data(*info);
      const int64_t bb = dtype_block_bytes(dt);
      int64_t bad = 0, first_bad = -1;
      for (int64_t b = 0; b < static_cast<int64_t>(q.size()) / bb; ++b)
        if (std::memcmp(q.data() + b * bb, want + b * bb, static_cast<size_t>(bb)) != 0) {
          if (first_bad < 0) first_bad = b;
          ++bad;
        }
      INFO(name << " " << t["name"].get<std::string>() << " " << dtype_name(dt) << ": " << bad << " of "
                << q.size() / static_cast<size_t>(bb) << " blocks differ, the first at " << first_bad);
      CHECK(bad == 0);
      checked.insert(dt);
    }
  }
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    if (dtype_is_quantized(t) && t != DType::IQ4_NL && t != DType::Q8_0) CHECK(checked.count(t) == 1);
  }
}

TEST_CASE("the K-quants round trip within their resolution and survive constant and zero blocks", "[dtype][kquants]") {
  const auto x = test::random_floats(kQK_K * 5, 11, -2.0f, 2.0f);
  for (DType t :
       {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    INFO(dtype_name(t));
    std::vector<float> in = x;
    std::fill(in.begin() + kQK_K, in.begin() + 2 * kQK_K, 0.0f);       // an all-zero block
    std::fill(in.begin() + 2 * kQK_K, in.begin() + 3 * kQK_K, 0.75f);  // a constant block
    const int64_t n = static_cast<int64_t>(in.size());
    std::vector<uint8_t> q(dtype_row_bytes(t, n));
    std::vector<float> y(in.size());
    quantize_row(t, in.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    // The worst error of a code of that many bits over [-2, 2]: one step (symmetric codes lose their top
    // level to the sign, and the group scales are themselves rounded).
    const double bits = t == DType::Q2_K                                               ? 2
                        : t == DType::Q3_K                                             ? 3
                        : t == DType::Q6_K                                             ? 6
                        : (t == DType::Q4_K || t == DType::Q4_1 || t == DType::IQ4_NL) ? 4
                                                                                       : 5;
    const double tol = 4.0 / (std::pow(2.0, bits) - 1);
    double worst = 0;
    for (size_t i = 0; i < in.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(y[i] - in[i])));
    CHECK(worst <= tol);
    for (int i = kQK_K; i < 2 * kQK_K; ++i) REQUIRE(y[static_cast<size_t>(i)] == 0.0f);
  }
}

TEST_CASE("llama-quantize's mixes: every tensor of our spec gets the file's type", "[dtype][kquants]") {
  const nlohmann::json ref = reference();
  int files = 0;
  for (const auto& file : ref["files"]) {
    const std::string name = file["file"];
    if (is_source(file) || name.find("pure_") != std::string::npos) continue;
    const std::string model = name.substr(0, name.find('.'));
    const std::string mix_name = name.substr(name.find('.') + 1, name.rfind('.') - name.find('.') - 1);
    ModelSpec spec = load_spec_yaml(kquants_dir() + "/" + model + ".yaml");
    REQUIRE(parse_quant_mix(mix_name, &spec.mix, &spec.dtype));
    std::map<std::string, DType> ours;
    for (const TensorDesc& t : spec.tensors()) ours[t.name] = t.dtype;
    for (const auto& t : file["tensors"]) {
      INFO(name << " " << t["name"].get<std::string>());
      REQUIRE(ours.count(t["name"]) == 1);
      CHECK(std::string(dtype_name(ours[t["name"]])) == ggml_type_name(t["type_id"].get<uint32_t>()));
    }
    CHECK(ours.size() == file["tensors"].size());
    ++files;
  }
  CHECK(files == 7);
}

TEST_CASE("a mix needs rows its blocks divide, with llama.cpp's fallbacks", "[dtype][kquants]") {
  ModelSpec s = load_spec_yaml(kquants_dir() + "/kq_llama.yaml");
  s.hidden_size = 288;  // rows of 288 columns: not whole 256-blocks, whole 32-blocks
  s.num_attention_heads = 4;
  s.head_dim = 72;
  REQUIRE(parse_quant_mix("q4_k_m", &s.mix, &s.dtype));
  CHECK(s.tensor_dtype(TensorKind::AttnQ, 0, {288, 288}) == DType::Q5_0);    // q4_K -> q5_0
  CHECK(s.tensor_dtype(TensorKind::Output, -1, {384, 288}) == DType::Q8_0);  // q6_K -> q8_0
  CHECK(s.tensor_dtype(TensorKind::AttnNorm, 0, {288}) == DType::F32);
  REQUIRE(parse_quant_mix("Q5_K_S", &s.mix, &s.dtype));
  CHECK(s.tensor_dtype(TensorKind::AttnQ, 0, {288, 288}) == DType::Q5_1);  // q5_K -> q5_1
  CHECK(s.tensor_dtype(TensorKind::AttnQ, 0, {288, 100}) == DType::F16);   // nothing divides 100
  REQUIRE(parse_quant_mix("q2_K", &s.mix, &s.dtype));
  CHECK(s.tensor_dtype(TensorKind::AttnQ, 0, {288, 288}) == DType::IQ4_NL);  // q2_K -> iq4_nl
  QuantMix m;
  DType b;
  CHECK_FALSE(parse_quant_mix("q4_K", &m, &b));  // a block type, not a mix
  CHECK(quant_mix_file_type(QuantMix::Q4_K_M, DType::Q4_K) == 15);
}

TEST_CASE("a GGUF written at a mix holds llama-quantize's types and file type", "[dtype][kquants]") {
  const nlohmann::json ref = reference();
  for (const auto& file : ref["files"]) {
    const std::string name = file["file"];
    if (name != "kq_llama.Q4_K_M.gguf" && name != "kq_moe.Q2_K.gguf") continue;
    const std::string model = name.substr(0, name.find('.'));
    const std::string mix = name.substr(name.find('.') + 1, name.rfind('.') - name.find('.') - 1);
    const auto src = open_weights("synthetic:" + kquants_dir() + "/" + model + ".yaml?mix=" + mix + "&seed=3");
    const std::string path = test::temp_path(model + "_" + mix + "_written.gguf");
    write_gguf(*src, path, src->spec().dtype, nullptr, false, src->spec().mix);
    GgufFile g(path);
    INFO(name);
    CHECK(g.find("general.file_type")->as_int("file_type") == file["file_type"].get<int64_t>());
    for (const auto& t : file["tensors"]) {
      const GgufTensorInfo* info = g.find_tensor(t["name"]);
      REQUIRE(info != nullptr);
      CHECK(info->type_id == t["type_id"].get<uint32_t>());
    }
    // The file opens again with every tensor of its own type.
    const auto back = open_weights(path);
    CHECK(back->tensor("output.weight").dtype == DType::Q6_K);
  }
}

// Tests for core/safetensors and the HF weight source: the fixtures parse; crafted headers and
// sharded sets (written here) fail with one Error naming the file and the tensor, or load exactly
// what the single-file model holds.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "core/weight_source.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// 8-byte little-endian header length, the header, then the data section.
std::string st_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(&out[0], &n, 8);
  return out + header + data;
}

struct StEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  std::string bytes;
};

// A safetensors file holding `entries` in order. `misalign` pads the header so the data section
// starts at an odd offset (legal; readers must cope with unaligned tensors).
std::string st_build(const std::vector<StEntry>& entries, bool misalign = false) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& e : entries) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {data.size(), data.size() + e.bytes.size()}}};
    data += e.bytes;
  }
  std::string header = h.dump();
  if (misalign)
    while ((8 + header.size()) % 4 != 1) header += ' ';
  else
    while ((8 + header.size()) % 8 != 0) header += ' ';
  return st_file(header, data);
}

std::vector<StEntry> read_entries(const std::string& path) {
  SafetensorsSet s(path);
  std::vector<StEntry> out;
  for (const auto& kv : s.tensors())
    out.push_back({kv.first, kv.second.dtype_name, kv.second.shape,
                   std::string(reinterpret_cast<const char*>(kv.second.data), kv.second.nbytes)});
  return out;
}

int counter = 0;
std::string write_st(const std::string& bytes) {
  const std::string path = temp_path("st_" + std::to_string(counter++) + ".safetensors");
  write_file(path, bytes);
  return path;
}

// Opens the bytes as a safetensors file; returns the message ("" when it parsed).
std::string st_error(const std::string& bytes, std::string* path_out = nullptr) {
  const std::string path = write_st(bytes);
  if (path_out) *path_out = path;
  try {
    SafetensorsSet s(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void require_st_error(const std::string& bytes, const std::vector<std::string>& parts) {
  std::string path;
  const std::string msg = st_error(bytes, &path);
  INFO("message: " << msg);
  REQUIRE(!msg.empty());
  CHECK_THAT(msg, Contains(path));
  CHECK(msg.find('\n') == std::string::npos);
  for (const auto& p : parts) CHECK_THAT(msg, Contains(p));
}

std::string fresh_dir(const std::string& name) {
  const std::string d = temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string fixture(const std::string& rel) {
  return fixtures_dir() + "/" + rel;
}

// The HF llama fixture's tensors split over two shards (the first with unaligned data) plus the
// index; returns the directory.
std::string write_sharded_llama(const std::string& name, nlohmann::json* index_out = nullptr) {
  const std::string dir = fresh_dir(name);
  fs::copy_file(fixture("hf/llama/config.json"), dir + "/config.json");
  const auto entries = read_entries(fixture("hf/llama/model.safetensors"));
  std::vector<StEntry> a, b;
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  for (size_t i = 0; i < entries.size(); ++i) {
    const bool first = i % 2 == 0;
    (first ? a : b).push_back(entries[i]);
    index["weight_map"][entries[i].name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_file(dir + "/model-00001-of-00002.safetensors", st_build(a, true));
  write_file(dir + "/model-00002-of-00002.safetensors", st_build(b));
  write_file(dir + "/model.safetensors.index.json", index.dump(1));
  if (index_out) *index_out = index;
  return dir;
}

// An HF directory: a config (edited by `edit_config`) and one safetensors file of `entries`.
std::string write_hf_dir(const std::string& name, const std::string& fixture_model,
                         const std::function<void(nlohmann::json&)>& edit_config, const std::vector<StEntry>& entries) {
  const std::string dir = fresh_dir(name);
  nlohmann::json cfg = nlohmann::json::parse(read_file(fixture(fixture_model + "/config.json")));
  edit_config(cfg);
  write_file(dir + "/config.json", cfg.dump(1));
  write_file(dir + "/model.safetensors", st_build(entries));
  return dir;
}

StEntry* find_entry(std::vector<StEntry>& es, const std::string& name) {
  for (auto& e : es)
    if (e.name == name) return &e;
  return nullptr;
}

std::string f32_bytes(size_t n) {
  return std::string(n * 4, '\0');
}

}  // namespace

TEST_CASE("safetensors: the HF fixture parses with names, shapes and dtypes", "[safetensors][fixtures]") {
  SafetensorsSet s(fixture("hf/llama/model.safetensors"));
  CHECK(s.tensors().size() == 30);  // 3 layers * 9 + embed + norm + lm_head
  const SafetensorsTensor* emb = s.find("model.embed_tokens.weight");
  REQUIRE(emb);
  CHECK(emb->dtype_name == "F32");
  CHECK(emb->shape == Shape{211, 64});
  CHECK(emb->nbytes == 211 * 64 * 4);
  CHECK(emb->file == fixture("hf/llama/model.safetensors"));
  const SafetensorsTensor* down = s.find("model.layers.2.mlp.down_proj.weight");
  REQUIRE(down);
  CHECK(down->shape == Shape{64, 136});
  const TensorView v = s.view(*down);
  CHECK(v.dtype == DType::F32);
  CHECK(v.nbytes == 64 * 136 * 4);
  CHECK(s.find("model.layers.3.mlp.down_proj.weight") == nullptr);
  // A directory resolves to its model.safetensors.
  SafetensorsSet d(fixture("hf/llama"));
  CHECK(d.tensors().size() == s.tensors().size());
  SafetensorsSet moe(fixture("hf/qwen3moe_norm"));
  REQUIRE(moe.find("model.layers.1.mlp.experts.11.down_proj.weight"));
  CHECK(moe.find("model.layers.1.mlp.experts.11.down_proj.weight")->shape == Shape{48, 24});
}

TEST_CASE("safetensors: crafted headers fail with the file, the offset and the tensor", "[safetensors]") {
  SECTION("shorter than 8 bytes") {
    require_st_error("abc", {"offset 0", "too short"});
    require_st_error("", {"offset 0", "too short"});
  }
  SECTION("header length past the end, and absurd") {
    std::string f = st_file("{}");
    uint64_t n = 100;
    std::memcpy(&f[0], &n, 8);
    require_st_error(f, {"offset 0", "header length 100", "past the end"});
    n = uint64_t(1) << 62;
    std::memcpy(&f[0], &n, 8);
    require_st_error(f, {"offset 0", "header length 4611686018427387904"});
    n = ~uint64_t(0);
    std::memcpy(&f[0], &n, 8);
    require_st_error(f, {"offset 0", "header length"});
  }
  SECTION("malformed JSON and a header that is not an object") {
    require_st_error(st_file("{\"a\": "), {"offset", "malformed JSON"});
    require_st_error(st_file(std::string("{\"a\": \"\xff\xfe\"}")), {"malformed JSON"});
    require_st_error(st_file("[1, 2]"), {"offset 8", "not a JSON object"});
    require_st_error(st_file("\"x\""), {"not a JSON object"});
    // Deep nesting must not overflow the stack.
    require_st_error(st_file(std::string(100000, '[') + std::string(100000, ']')), {"JSON nested 100000 deep"});
  }
  SECTION("entries with missing or wrong fields") {
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2]}})", f32_bytes(2)),
                     {"'w'", "dtype, shape and data_offsets"});
    require_st_error(st_file(R"({"w": 5})"), {"'w'", "dtype, shape and data_offsets"});
    require_st_error(st_file(R"({"w": {"dtype": 3, "shape": [2], "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "dtype must be a string"});
    require_st_error(st_file(R"({"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "unknown dtype 'F7'"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "non-negative integers"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "non-negative integers"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "shape must be an array"});
    require_st_error(
        st_file(R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", f32_bytes(1)),
        {"'w'", "at most 8"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", f32_bytes(2)),
                     {"'w'", "data_offsets must be [begin, end]"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", f32_bytes(2)),
                     {"'w'", "outside the data section"});
  }
  SECTION("absurd dimensions") {
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2199023255552], "data_offsets": [0, 8]}})"),
                     {"'w'", "absurd"});
    require_st_error(
        st_file(R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 8]}})"),
        {"'w'", "overflows"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 1e30]}})", f32_bytes(2)),
                     {"'w'", "data_offsets"});
  }
  SECTION("data offsets outside the data section, or not matching the shape") {
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", f32_bytes(2)),
                     {"'w'", "outside the data section", "8 bytes"});
    require_st_error(
        st_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [18446744073709551608, 0]}})", f32_bytes(2)),
        {"'w'", "outside"});
    require_st_error(st_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", f32_bytes(2)),
                     {"'w'", "span 8 bytes", "[3]", "needs 12"});
    require_st_error(st_file(R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})", f32_bytes(4)),
                     {"'w'", "span 16 bytes", "needs 8"});
  }
  SECTION("overlapping tensors") {
    require_st_error(st_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                             f32_bytes(3)),
                     {"overlap", "'a'", "'b'"});
    require_st_error(st_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                             f32_bytes(4)),
                     {"overlap", "'a'", "'b'"});
  }
  SECTION("0-dim and empty entries are legal") {
    const std::string path = write_st(st_file(R"({"scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "empty": {"dtype": "F16", "shape": [0, 5], "data_offsets": [2, 2]},
        "next": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                                              f32_bytes(2)));
    SafetensorsSet s(path);
    REQUIRE(s.find("scalar"));
    CHECK(s.find("scalar")->shape.empty());
    CHECK(s.find("scalar")->nbytes == 4);
    REQUIRE(s.find("empty"));
    CHECK(s.find("empty")->shape == Shape{0, 5});
    CHECK(s.find("empty")->nbytes == 0);
    CHECK(s.tensors().size() == 3);
  }
  SECTION("a dtype we cannot compute with fails at view time, naming the tensor") {
    const std::string path =
        write_st(st_file(R"({"ids": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})", f32_bytes(2)));
    SafetensorsSet s(path);
    REQUIRE(s.find("ids"));
    CHECK_THROWS_WITH(s.view(*s.find("ids")), Contains(path) && Contains("'ids'") && Contains("I32"));
  }
  SECTION("a missing file or a directory without safetensors") {
    const std::string missing = temp_path("no_such.safetensors");
    CHECK_THROWS_WITH(SafetensorsSet(missing), Contains(missing));
    const std::string dir = fresh_dir("st_empty_dir");
    CHECK_THROWS_WITH(SafetensorsSet(dir), Contains(dir) && Contains("no model.safetensors"));
  }
}

TEST_CASE("safetensors: a sharded set loads the same tensors as the single file", "[safetensors]") {
  const std::string dir = write_sharded_llama("sharded_llama");
  const auto single = read_entries(fixture("hf/llama/model.safetensors"));
  for (const std::string& path : {dir, dir + "/model.safetensors.index.json"}) {
    SafetensorsSet s(path);
    REQUIRE(s.tensors().size() == single.size());
    for (const auto& e : single) {
      INFO(e.name);
      const SafetensorsTensor* t = s.find(e.name);
      REQUIRE(t);
      CHECK(t->dtype_name == e.dtype);
      CHECK(t->shape == e.shape);
      REQUIRE(t->nbytes == e.bytes.size());
      CHECK(std::memcmp(t->data, e.bytes.data(), e.bytes.size()) == 0);
      CHECK_THAT(t->file, Contains("-of-00002.safetensors"));
    }
  }
  // The weight source gives the same canonical tensors (the unaligned shard is copied to aligned
  // memory on the way).
  auto a = open_hf_weights(fixture("hf/llama"));
  auto b = open_weights(dir);
  CHECK(b->spec().num_hidden_layers == a->spec().num_hidden_layers);
  REQUIRE(b->tensors().size() == a->tensors().size());
  for (const auto& kv : a->tensors()) {
    INFO(kv.first);
    const TensorView& x = kv.second;
    const TensorView& y = b->tensor(kv.first);
    CHECK(y.dtype == x.dtype);
    CHECK(y.shape == x.shape);
    REQUIRE(y.nbytes == x.nbytes);
    CHECK(reinterpret_cast<uintptr_t>(y.data) % 4 == 0);
    CHECK(std::memcmp(x.data, y.data, x.nbytes) == 0);
  }
}

TEST_CASE("safetensors: a broken index fails naming the index, the shard or the tensor", "[safetensors]") {
  nlohmann::json index;
  const std::string dir = write_sharded_llama("sharded_bad", &index);
  const std::string index_path = dir + "/model.safetensors.index.json";
  auto with_index = [&](const nlohmann::json& j) {
    write_file(index_path, j.dump());
    try {
      SafetensorsSet s(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  REQUIRE(with_index(index).empty());

  nlohmann::json j = index;
  j["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors";
  std::string msg = with_index(j);
  CHECK_THAT(msg, Contains("model-00003-of-00002.safetensors") && Contains(index_path));

  j = index;
  j["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors";
  msg = with_index(j);
  CHECK_THAT(msg, Contains(index_path) && Contains("'model.layers.9.mlp.up_proj.weight'") && Contains("missing from") &&
                      Contains("model-00001-of-00002.safetensors"));

  j = index;  // listed under the wrong shard
  const std::string first = index["weight_map"].begin().key();
  j["weight_map"][first] = index["weight_map"][first] == "model-00001-of-00002.safetensors"
                               ? "model-00002-of-00002.safetensors"
                               : "model-00001-of-00002.safetensors";
  msg = with_index(j);
  CHECK_THAT(msg, Contains("'" + first + "'") && Contains("missing from"));

  for (const char* bad : {"../model-00001-of-00002.safetensors", "sub/x.safetensors", "/etc/passwd", "..", ""}) {
    j = index;
    j["weight_map"]["lm_head.weight"] = bad;
    msg = with_index(j);
    INFO(bad);
    CHECK_THAT(msg, Contains(index_path) && Contains("'lm_head.weight'") && Contains("plain file name"));
  }

  j = index;
  j["weight_map"]["lm_head.weight"] = 5;
  CHECK_THAT(with_index(j), Contains("'lm_head.weight'") && Contains("file name"));
  CHECK_THAT(with_index(nlohmann::json::object()), Contains(index_path) && Contains("weight_map"));
  CHECK_THAT(with_index(nlohmann::json::array()), Contains("weight_map"));
  write_file(index_path, "{\"weight_map\": {");
  CHECK_THROWS_WITH(SafetensorsSet(dir), Contains(index_path) && Contains("malformed JSON"));

  // The same tensor stored in both shards.
  write_file(index_path, index.dump());
  auto entries = read_entries(dir + "/model-00002-of-00002.safetensors");
  entries.push_back(read_entries(dir + "/model-00001-of-00002.safetensors").front());
  write_file(dir + "/model-00002-of-00002.safetensors", st_build(entries));
  CHECK_THROWS_WITH(SafetensorsSet(dir), Contains("more than one file"));
}

TEST_CASE("safetensors: HF directories with a bad config or bad tensors fail clearly", "[safetensors][hf]") {
  const auto llama = read_entries(fixture("hf/llama/model.safetensors"));
  auto same = [](nlohmann::json&) {};
  REQUIRE_NOTHROW(open_hf_weights(write_hf_dir("hf_ok", "hf/llama", same, llama)));

  SECTION("config.json missing") {
    const std::string dir = fresh_dir("hf_noconfig");
    write_file(dir + "/model.safetensors", st_build(llama));
    CHECK_THROWS_WITH(open_weights(dir), Contains(dir) && Contains("no config.json"));
    const std::string empty = fresh_dir("hf_empty");
    CHECK_THROWS_WITH(open_hf_weights(empty), Contains(empty) && Contains("config.json"));
  }
  SECTION("config.json malformed") {
    const std::string dir = write_hf_dir("hf_badjson", "hf/llama", same, llama);
    write_file(dir + "/config.json", "{\"model_type\": \"llama\",");
    CHECK_THROWS_WITH(open_weights(dir), Contains(dir + "/config.json") && Contains("malformed JSON"));
    write_file(dir + "/config.json", "[]");
    CHECK_THROWS_WITH(open_weights(dir), Contains(dir + "/config.json"));
  }
  SECTION("unsupported model_type") {
    for (const char* type : {"gpt2", "bert", ""}) {
      const std::string dir = write_hf_dir(
          "hf_type", "hf/llama", [&](nlohmann::json& c) { c["model_type"] = type; }, llama);
      CHECK_THROWS_WITH(open_weights(dir), Contains(dir + "/config.json") && Contains("model_type"));
    }
    const std::string dir = write_hf_dir(
        "hf_notype", "hf/llama", [](nlohmann::json& c) { c.erase("model_type"); }, llama);
    CHECK_THROWS_WITH(open_weights(dir), Contains("model_type"));
    // Fields of the wrong JSON type still name the file.
    const std::string dir2 = write_hf_dir(
        "hf_inttype", "hf/llama", [](nlohmann::json& c) { c["model_type"] = 5; }, llama);
    CHECK_THROWS_WITH(open_weights(dir2), Contains(dir2 + "/config.json"));
    const std::string dir3 = write_hf_dir(
        "hf_intact", "hf/llama", [](nlohmann::json& c) { c["hidden_act"] = 1; }, llama);
    CHECK_THROWS_WITH(open_weights(dir3), Contains(dir3 + "/config.json"));
  }
  SECTION("config fields of the wrong type or out of range") {
    const std::string dir = write_hf_dir(
        "hf_strdim", "hf/llama", [](nlohmann::json& c) { c["hidden_size"] = "64"; }, llama);
    CHECK_THROWS_WITH(open_weights(dir), Contains("hidden_size") && Contains("integer"));
    const std::string dir2 = write_hf_dir(
        "hf_hugedim", "hf/llama", [](nlohmann::json& c) { c["hidden_size"] = int64_t(1) << 40; }, llama);
    CHECK_THROWS_WITH(open_weights(dir2), Contains("hidden_size") && Contains("out of range"));
  }
  SECTION("a tensor of the wrong shape") {
    const std::string dir = write_hf_dir(
        "hf_shape", "hf/llama", [](nlohmann::json& c) { c["intermediate_size"] = 128; }, llama);
    CHECK_THROWS_WITH(open_weights(dir), Contains(dir) && Contains("blk.0.ffn_gate.weight") && Contains("[136, 64]") &&
                                             Contains("[128, 64]"));
  }
  SECTION("missing, unexpected and non-float tensors") {
    auto es = llama;
    es.erase(es.begin() + (find_entry(es, "model.layers.1.self_attn.v_proj.weight") - es.data()));
    const std::string dir = write_hf_dir("hf_missing", "hf/llama", same, es);
    CHECK_THROWS_WITH(open_weights(dir), Contains(dir) && Contains("blk.1.attn_v.weight"));

    es = llama;
    es.push_back({"model.layers.0.self_attn.q_proj.bias", "F32", {64}, f32_bytes(64)});
    const std::string dir2 = write_hf_dir("hf_extra", "hf/llama", same, es);
    CHECK_THROWS_WITH(open_weights(dir2), Contains("unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"));

    es = llama;
    es.erase(es.begin() + (find_entry(es, "lm_head.weight") - es.data()));
    const std::string dir3 = write_hf_dir("hf_nohead", "hf/llama", same, es);
    CHECK_THROWS_WITH(open_weights(dir3), Contains("'lm_head.weight'") && Contains("tie_word_embeddings"));

    es = llama;
    StEntry* norm = find_entry(es, "model.norm.weight");
    norm->dtype = "I32";
    const std::string dir4 = write_hf_dir("hf_i32", "hf/llama", same, es);
    CHECK_THROWS_WITH(open_weights(dir4), Contains("'model.norm.weight'") && Contains("I32"));
  }
  SECTION("MoE experts: a wrong shape or a missing expert names the tensor") {
    const auto moe = read_entries(fixture("hf/qwen3moe_norm/model.safetensors"));
    REQUIRE_NOTHROW(open_hf_weights(write_hf_dir("hf_moe_ok", "hf/qwen3moe_norm", same, moe)));
    auto es = moe;
    StEntry* e0 = find_entry(es, "model.layers.0.mlp.experts.0.gate_proj.weight");
    REQUIRE(e0);
    REQUIRE(e0->shape == Shape{24, 48});
    e0->shape = {48, 24};  // same bytes, transposed
    const std::string dir = write_hf_dir("hf_moe_shape", "hf/qwen3moe_norm", same, es);
    CHECK_THROWS_WITH(open_weights(dir), Contains("'model.layers.0.mlp.experts.0.gate_proj.weight'") &&
                                             Contains("[48, 24]") && Contains("[24, 48]"));
    es = moe;
    StEntry* e5 = find_entry(es, "model.layers.1.mlp.experts.5.up_proj.weight");
    REQUIRE(e5);
    e5->shape = {48, 24};
    const std::string dir2 = write_hf_dir("hf_moe_shape5", "hf/qwen3moe_norm", same, es);
    CHECK_THROWS_WITH(open_weights(dir2), Contains("'model.layers.1.mlp.experts.5.up_proj.weight'"));
    es = moe;
    es.erase(es.begin() + (find_entry(es, "model.layers.1.mlp.experts.7.down_proj.weight") - es.data()));
    const std::string dir3 = write_hf_dir("hf_moe_missing", "hf/qwen3moe_norm", same, es);
    CHECK_THROWS_WITH(open_weights(dir3), Contains("'model.layers.1.mlp.experts.7.down_proj.weight'"));
    // More experts in the config than in the file.
    const std::string dir4 = write_hf_dir(
        "hf_moe_count", "hf/qwen3moe_norm", [](nlohmann::json& c) { c["num_local_experts"] = 13; }, moe);
    CHECK_THROWS_WITH(open_weights(dir4), Contains("experts.12."));
  }
}

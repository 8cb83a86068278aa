// Tests for core/gguf: the writer/reader round trip of every metadata type and tensor dtype, the
// llama.cpp fixtures, and corrupt files, each of which must give one shardwise::Error naming the
// file, the offset and the field — never a crash, a hang or an allocation sized by the file.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/gguf.h"
#include "core/model_spec.h"
#include "core/weight_source.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

// Little-endian byte builder for hand-made (possibly corrupt) GGUF files.
struct Bytes {
  std::string s;
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& x) {
    put<uint64_t>(x.size());
    s += x;
    return *this;
  }
  Bytes& raw(const std::string& x) {
    s += x;
    return *this;
  }
};

// Encodes a value as the reader expects it, without the writer's checks (so a test can write a
// bool of 2 or an unknown type id).
void encode_value(Bytes& b, const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8:
    case GgufType::BOOL:
      b.put<uint8_t>(static_cast<uint8_t>(v.u));
      break;
    case GgufType::I8:
      b.put<int8_t>(static_cast<int8_t>(v.i));
      break;
    case GgufType::U16:
      b.put<uint16_t>(static_cast<uint16_t>(v.u));
      break;
    case GgufType::I16:
      b.put<int16_t>(static_cast<int16_t>(v.i));
      break;
    case GgufType::U32:
      b.put<uint32_t>(static_cast<uint32_t>(v.u));
      break;
    case GgufType::I32:
      b.put<int32_t>(static_cast<int32_t>(v.i));
      break;
    case GgufType::U64:
      b.put<uint64_t>(v.u);
      break;
    case GgufType::I64:
      b.put<int64_t>(v.i);
      break;
    case GgufType::F32:
      b.put<float>(static_cast<float>(v.f));
      break;
    case GgufType::F64:
      b.put<double>(v.f);
      break;
    case GgufType::STRING:
      b.str(v.s);
      break;
    case GgufType::ARRAY:
      b.put<uint32_t>(static_cast<uint32_t>(v.array_type));
      b.put<uint64_t>(v.array.size());
      for (const auto& e : v.array) encode_value(b, e);
      break;
  }
}

struct RawKv {
  std::string key;
  uint32_t type;
  std::string payload;  // encoded value
};
RawKv kv_value(const std::string& key, const GgufValue& v) {
  Bytes b;
  encode_value(b, v);
  return {key, static_cast<uint32_t>(v.type), b.s};
}
RawKv kv_u32(const std::string& key, uint32_t v) {
  return kv_value(key, GgufValue::of_u32(v));
}
RawKv kv_str(const std::string& key, const std::string& v) {
  return kv_value(key, GgufValue::of_string(v));
}

struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;  // GGUF order, innermost first
  uint32_t type = 0;
  int64_t offset = -1;  // -1: next aligned offset
  std::string data;     // empty: a byte pattern of the size the type and ne give
};

// A GGUF file as fields; build() lays it out like the writer does but lets a test break any rule.
struct RawGguf {
  uint32_t magic = kMagic;
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; write general.alignment yourself when it is not 32
  std::vector<RawKv> kv;
  std::vector<RawTensor> tensors;
  int64_t data_size = -1;  // -1: up to the end of the last tensor (no trailing padding)

  static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

  static uint64_t tensor_size(const RawTensor& t) {
    if (!t.data.empty()) return t.data.size();
    uint32_t be = 0, bb = 0;
    if (!ggml_type_block(t.type, &be, &bb)) return 0;
    uint64_t elems = 1;
    for (uint64_t d : t.ne) {
      if (d == 0 || d > (1u << 20) || elems > (uint64_t(1) << 24)) return 0;  // absurd: no data
      elems *= d;
    }
    return elems / be * bb;
  }

  std::string build() const {
    Bytes b;
    b.put(magic).put(version).put<uint64_t>(tensors.size()).put<uint64_t>(kv.size());
    for (const auto& k : kv) b.str(k.key).put(k.type).raw(k.payload);
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : align_up(next, alignment);
      offsets.push_back(off);
      next = off + tensor_size(t);
      b.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) b.put(d);
      b.put(t.type).put(off);
    }
    b.s.resize(align_up(b.s.size(), alignment), '\0');
    const size_t data_start = b.s.size();
    uint64_t end = 0;
    for (size_t i = 0; i < tensors.size(); ++i) end = std::max(end, offsets[i] + tensor_size(tensors[i]));
    if (data_size >= 0) end = static_cast<uint64_t>(data_size);
    b.s.resize(data_start + end, '\0');
    for (size_t i = 0; i < tensors.size(); ++i) {
      const uint64_t n = tensor_size(tensors[i]);
      for (uint64_t j = 0; j < n && offsets[i] + j < end; ++j)
        b.s[data_start + offsets[i] + j] =
            tensors[i].data.empty() ? static_cast<char>((j * 7 + i + 3) & 0xff) : tensors[i].data[j];
    }
    return b.s;
  }
};

// Two KVs and two tensors; the last tensor ends the file (no trailing padding), so that any
// truncation removes something the reader needs.
RawGguf small_valid() {
  RawGguf g;
  g.kv.push_back(kv_str("general.architecture", "llama"));
  g.kv.push_back(kv_value("test.ids", GgufValue::of_i32s({1, -2, 3})));
  g.tensors.push_back({"a.weight", {8}, 0, -1, ""});      // f32: 32 bytes
  g.tensors.push_back({"b.weight", {16, 1}, 1, -1, ""});  // f16: 32 bytes at offset 32
  return g;
}

int file_counter = 0;
std::string write_temp(const std::string& bytes, const std::string& stem = "t") {
  const std::string path = temp_path("gguf_" + stem + "_" + std::to_string(file_counter++) + ".gguf");
  write_file(path, bytes);
  return path;
}

// Opens the bytes as a GGUF file and returns the error message ("" when it parsed).
std::string open_error(const std::string& bytes, std::string* path_out = nullptr) {
  const std::string path = write_temp(bytes);
  if (path_out) *path_out = path;
  try {
    GgufFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Requires that opening the file fails with a message naming the path and containing every part.
void require_error(const RawGguf& g, const std::vector<std::string>& parts) {
  std::string path;
  const std::string msg = open_error(g.build(), &path);
  INFO("message: " << msg);
  REQUIRE(!msg.empty());
  CHECK_THAT(msg, Contains(path));
  CHECK(msg.find('\n') == std::string::npos);
  for (const auto& p : parts) CHECK_THAT(msg, Contains(p));
}

GgufValue value(GgufType t) {
  GgufValue v;
  v.type = t;
  return v;
}

// A small llama model (hidden 256 so that one matrix row is a whole q4_K block) written by our
// writer, then read back field by field into a RawGguf that tests can edit.
RawGguf small_model_raw() {
  ModelSpec s = parse_spec_yaml_text(
      "family: llama\nhidden_size: 256\nnum_hidden_layers: 1\nnum_attention_heads: 1\nnum_key_value_heads: 1\n"
      "head_dim: 16\nintermediate_size: 32\nvocab_size: 16\n",
      "small_model");
  s.dtype = DType::F16;
  auto src = make_synthetic_weights(s, 7, nullptr);
  const std::string path = temp_path("gguf_small_model.gguf");
  write_gguf(*src, path, DType::F16);
  GgufFile f(path);
  RawGguf g;
  for (const auto& kv : f.metadata()) g.kv.push_back(kv_value(kv.first, kv.second));
  for (const auto& t : f.tensors()) {
    RawTensor r;
    r.name = t.name;
    r.ne = t.ne;
    r.type = t.type_id;
    r.data.assign(reinterpret_cast<const char*>(f.tensor_data(t)), t.nbytes);
    g.tensors.push_back(r);
  }
  return g;
}

RawKv* find_kv(RawGguf& g, const std::string& key) {
  for (auto& k : g.kv)
    if (k.key == key) return &k;
  return nullptr;
}
RawTensor* find_raw_tensor(RawGguf& g, const std::string& name) {
  for (auto& t : g.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trip

TEST_CASE("gguf: writer and reader round-trip every metadata type and tensor dtype", "[gguf]") {
  GgufWriter w(64);
  auto u8 = value(GgufType::U8);
  u8.u = 200;
  auto i8 = value(GgufType::I8);
  i8.i = -100;
  auto u16 = value(GgufType::U16);
  u16.u = 65000;
  auto i16 = value(GgufType::I16);
  i16.i = -32000;
  auto i64 = value(GgufType::I64);
  i64.i = std::numeric_limits<int64_t>::min();
  auto f64 = value(GgufType::F64);
  f64.f = 3.141592653589793;
  w.set("t.u8", u8);
  w.set("t.i8", i8);
  w.set("t.u16", u16);
  w.set("t.i16", i16);
  w.set("t.u32", GgufValue::of_u32(4000000000u));
  w.set("t.i32", GgufValue::of_i32(-2000000000));
  w.set("t.f32", GgufValue::of_f32(-1.25f));
  w.set("t.bool_true", GgufValue::of_bool(true));
  w.set("t.bool_false", GgufValue::of_bool(false));
  w.set("t.string", GgufValue::of_string(std::string("h\xC3\xA9llo\0w", 8)));
  w.set("t.empty_string", GgufValue::of_string(""));
  w.set("t.u64", GgufValue::of_u64(std::numeric_limits<uint64_t>::max()));
  w.set("t.i64", i64);
  w.set("t.f64", f64);
  w.set("t.f32s", GgufValue::of_f32s({0.5f, -2.0f, 1e-3f}));
  w.set("t.i32s", GgufValue::of_i32s({7, -8}));
  w.set("t.strings", GgufValue::of_strings({"a", "", "ccc"}));
  GgufValue empty = value(GgufType::ARRAY);
  empty.array_type = GgufType::U8;
  w.set("t.empty_array", empty);
  GgufValue nested = value(GgufType::ARRAY);  // [[1, 2], [], [3]]
  nested.array_type = GgufType::ARRAY;
  nested.array = {GgufValue::of_i32s({1, 2}), GgufValue::of_i32s({}), GgufValue::of_i32s({3})};
  w.set("t.nested", nested);
  w.set("t.u32", GgufValue::of_u32(4000000001u));  // set() replaces an existing key

  // Tensors of every dtype, odd shapes, filled with real converted data.
  struct Src {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Src> srcs = {{"f32.weight", DType::F32, {3, 5}, {}},         {"f16.weight", DType::F16, {2, 7}, {}},
                           {"bf16.weight", DType::BF16, {9}, {}},          {"q8_0.weight", DType::Q8_0, {3, 64}, {}},
                           {"q4_0.weight", DType::Q4_0, {2, 32}, {}},      {"f32_3d.weight", DType::F32, {2, 3, 4}, {}},
                           {"f16_4d.weight", DType::F16, {2, 1, 3, 2}, {}}};
  uint32_t seed = 1;
  for (auto& s : srcs) {
    const int64_t cols = s.shape.back(), rows = shape_elems(s.shape) / cols;
    s.bytes.resize(tensor_bytes(s.dtype, s.shape));
    const auto x = random_floats(static_cast<size_t>(rows * cols), seed++);
    const uint64_t rb = dtype_row_bytes(s.dtype, cols);
    for (int64_t r = 0; r < rows; ++r) quantize_row(s.dtype, x.data() + r * cols, s.bytes.data() + r * rb, cols);
    TensorView v;
    v.dtype = s.dtype;
    v.shape = s.shape;
    v.data = s.bytes.data();
    v.nbytes = s.bytes.size();
    w.add_tensor(s.name, v);
  }
  const std::string path = temp_path("roundtrip.gguf");
  w.write(path);

  GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  const auto& m = f.metadata();
  CHECK(m.size() == 20);  // 19 set (one replaced) + general.alignment added by the writer
  REQUIRE(f.find("general.alignment"));
  CHECK(f.find("general.alignment")->as_int("a") == 64);
  REQUIRE(f.find("t.u8"));
  CHECK(f.find("t.u8")->type == GgufType::U8);
  CHECK(f.find("t.u8")->u == 200u);
  CHECK(f.find("t.i8")->type == GgufType::I8);
  CHECK(f.find("t.i8")->i == -100);
  CHECK(f.find("t.u16")->u == 65000u);
  CHECK(f.find("t.i16")->i == -32000);
  CHECK(f.find("t.u32")->type == GgufType::U32);
  CHECK(f.find("t.u32")->u == 4000000001u);
  CHECK(f.find("t.i32")->i == -2000000000);
  CHECK(f.find("t.f32")->type == GgufType::F32);
  CHECK(f.find("t.f32")->f == -1.25);
  CHECK(f.find("t.bool_true")->type == GgufType::BOOL);
  CHECK(f.find("t.bool_true")->as_bool("b"));
  CHECK_FALSE(f.find("t.bool_false")->as_bool("b"));
  CHECK(f.find("t.string")->as_string("s") == std::string("h\xC3\xA9llo\0w", 8));
  CHECK(f.find("t.empty_string")->as_string("s").empty());
  CHECK(f.find("t.u64")->u == std::numeric_limits<uint64_t>::max());
  CHECK(f.find("t.i64")->i == std::numeric_limits<int64_t>::min());
  CHECK(f.find("t.f64")->type == GgufType::F64);
  CHECK(f.find("t.f64")->f == 3.141592653589793);
  const GgufValue& f32s = *f.find("t.f32s");
  CHECK(f32s.type == GgufType::ARRAY);
  CHECK(f32s.array_type == GgufType::F32);
  REQUIRE(f32s.array.size() == 3);
  CHECK(f32s.array[0].f == 0.5);
  CHECK(f32s.array[1].f == -2.0);
  CHECK(static_cast<float>(f32s.array[2].f) == 1e-3f);
  const GgufValue& i32s = *f.find("t.i32s");
  REQUIRE(i32s.array.size() == 2);
  CHECK(i32s.array[1].i == -8);
  const GgufValue& strs = *f.find("t.strings");
  CHECK(strs.array_type == GgufType::STRING);
  REQUIRE(strs.array.size() == 3);
  CHECK(strs.array[0].s == "a");
  CHECK(strs.array[1].s.empty());
  CHECK(strs.array[2].s == "ccc");
  CHECK(f.find("t.empty_array")->array.empty());
  CHECK(f.find("t.empty_array")->array_type == GgufType::U8);
  const GgufValue& nest = *f.find("t.nested");
  CHECK(nest.array_type == GgufType::ARRAY);
  REQUIRE(nest.array.size() == 3);
  REQUIRE(nest.array[0].array.size() == 2);
  CHECK(nest.array[0].array[1].i == 2);
  CHECK(nest.array[1].array.empty());
  CHECK(nest.array[2].array[0].i == 3);
  CHECK(f.find("no.such.key") == nullptr);

  REQUIRE(f.tensors().size() == srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i) {
    const auto& s = srcs[i];
    const GgufTensorInfo& t = f.tensors()[i];
    INFO(s.name);
    CHECK(t.name == s.name);  // the writer keeps the order tensors were added in
    CHECK(t.type_id == static_cast<uint32_t>(s.dtype));
    CHECK(t.shape == s.shape);
    CHECK(t.ne == std::vector<uint64_t>(s.shape.rbegin(), s.shape.rend()));
    CHECK(t.offset % 64 == 0);
    CHECK(t.nbytes == s.bytes.size());
    CHECK((f.data_offset() + t.offset) % 64 == 0);
    const TensorView v = f.view(t);
    CHECK(v.dtype == s.dtype);
    CHECK(v.shape == s.shape);
    CHECK(v.nbytes == s.bytes.size());
    CHECK(std::memcmp(v.data, s.bytes.data(), s.bytes.size()) == 0);
    CHECK(f.find_tensor(s.name) == &t);
  }
  CHECK(f.find_tensor("missing") == nullptr);
}

TEST_CASE("gguf: value accessors convert or fail with the context", "[gguf]") {
  CHECK(GgufValue::of_u32(7).as_int("c") == 7);
  CHECK(GgufValue::of_i32(-7).as_double("c") == -7.0);
  CHECK(GgufValue::of_f32(0.5f).as_double("c") == 0.5);
  CHECK(GgufValue::of_u32(1).as_bool("c"));
  CHECK_THROWS_WITH(GgufValue::of_u64(std::numeric_limits<uint64_t>::max()).as_int("ctx.key"),
                    Contains("ctx.key") && Contains("too large"));
  CHECK_THROWS_WITH(GgufValue::of_string("x").as_int("ctx.key"), Contains("ctx.key") && Contains("string"));
  CHECK_THROWS_WITH(GgufValue::of_u32(1).as_string("ctx.key"), Contains("expected a string"));
  CHECK_THROWS_WITH(GgufValue::of_string("x").as_double("ctx.key"), Contains("expected a number"));
  CHECK_THROWS_WITH(GgufValue::of_f32(1).as_bool("ctx.key"), Contains("expected a bool"));
}

TEST_CASE("gguf: the writer refuses what the reader would refuse", "[gguf]") {
  std::vector<float> data(8, 1.0f);
  TensorView v;
  v.dtype = DType::F32;
  v.shape = {8};
  v.data = data.data();
  v.nbytes = 32;
  GgufWriter w;
  w.add_tensor("a", v);
  CHECK_THROWS_WITH(w.add_tensor("a", v), Contains("duplicate tensor 'a'"));
  TensorView bad = v;
  bad.nbytes = 16;
  CHECK_THROWS_WITH(w.add_tensor("b", bad), Contains("'b'") && Contains("16 bytes"));
  TensorView scalar = v;
  scalar.shape = {};
  scalar.nbytes = 4;
  CHECK_THROWS_AS(w.add_tensor("s", scalar), Error);
  TensorView five = v;
  five.shape = {1, 1, 1, 1, 8};
  CHECK_THROWS_WITH(w.add_tensor("five", five), Contains("5 dimensions"));
  TensorView q = v;
  q.dtype = DType::Q8_0;
  q.shape = {33};
  CHECK_THROWS_AS(w.add_tensor("q", q), Error);  // not a whole number of blocks

  GgufValue mixed = GgufValue::of_i32s({1, 2});
  mixed.array.push_back(GgufValue::of_string("x"));
  GgufWriter wm;
  wm.set("mixed", mixed);
  CHECK_THROWS_WITH(wm.write(temp_path("mixed.gguf")), Contains("mixed") && Contains("string"));

  GgufWriter wa(64);
  wa.set("general.alignment", GgufValue::of_u32(32));
  CHECK_THROWS_WITH(wa.write(temp_path("align.gguf")), Contains("general.alignment"));
  GgufWriter wz(48);
  CHECK_THROWS_WITH(wz.write(temp_path("align48.gguf")), Contains("power of two"));

  const std::string nodir = temp_path("no/such/dir/x.gguf");
  CHECK_THROWS_WITH(w.write(nodir), Contains(nodir));
}

// ---------------------------------------------------------------------------------------------
// llama.cpp fixtures

TEST_CASE("gguf: llama.cpp's converter output parses with the expected metadata and shapes", "[gguf][fixtures]") {
  const std::string dir = fixtures_dir() + "/llamacpp/gguf/";
  SECTION("llama_small.f16") {
    GgufFile f(dir + "llama_small.f16.gguf");
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.data_offset() % 32 == 0);
    CHECK(f.metadata().size() == 25);
    CHECK(f.tensors().size() == 21);  // 2 + 9 per layer * 2 + output_norm
    CHECK(f.find("general.architecture")->as_string("a") == "llama");
    CHECK(f.find("general.name")->as_string("a") == "Llama_Small");
    CHECK(f.find("llama.block_count")->as_int("a") == 2);
    CHECK(f.find("llama.embedding_length")->as_int("a") == 64);
    CHECK(f.find("llama.feed_forward_length")->as_int("a") == 96);
    CHECK(f.find("llama.attention.head_count")->as_int("a") == 4);
    CHECK(f.find("llama.attention.head_count_kv")->as_int("a") == 2);
    CHECK(f.find("llama.rope.freq_base")->as_double("a") == 10000.0);
    CHECK(f.find("llama.attention.layer_norm_rms_epsilon")->type == GgufType::F32);
    CHECK(f.find("tokenizer.ggml.tokens")->array.size() == 160);
    CHECK(f.find("tokenizer.ggml.tokens")->array_type == GgufType::STRING);
    CHECK(f.find("tokenizer.ggml.bos_token_id")->as_int("a") == 1);
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    REQUIRE(emb);
    CHECK(emb->ne == std::vector<uint64_t>{64, 160});
    CHECK(emb->shape == Shape{160, 64});
    CHECK(emb->type_id == 1);
    CHECK(emb->nbytes == 160 * 64 * 2);
    const GgufTensorInfo* down = f.find_tensor("blk.0.ffn_down.weight");
    REQUIRE(down);
    CHECK(down->shape == Shape{64, 96});
    const GgufTensorInfo* k = f.find_tensor("blk.1.attn_k.weight");
    REQUIRE(k);
    CHECK(k->shape == Shape{32, 64});
    const GgufTensorInfo* norm = f.find_tensor("blk.0.attn_norm.weight");
    REQUIRE(norm);
    CHECK(norm->type_id == 0);
    CHECK(norm->shape == Shape{64});
    for (const auto& t : f.tensors()) CHECK(t.offset % 32 == 0);
  }
  SECTION("llama_small.q8_0") {
    GgufFile f(dir + "llama_small.q8_0.gguf");
    CHECK(f.tensors().size() == 21);
    CHECK(f.find("general.file_type")->as_int("a") == 7);
    const GgufTensorInfo* q = f.find_tensor("blk.0.attn_q.weight");
    REQUIRE(q);
    CHECK(q->type_id == 8);
    CHECK(q->shape == Shape{64, 64});
    CHECK(q->nbytes == 64 * 2 * 34);
    CHECK(f.view(*q).dtype == DType::Q8_0);
  }
  SECTION("qwen3moe_small.f16 and q8_0") {
    for (const char* name : {"qwen3moe_small.f16.gguf", "qwen3moe_small.q8_0.gguf"}) {
      GgufFile f(dir + name);
      CHECK(f.tensors().size() == 27);
      CHECK(f.metadata().size() == 26);
      CHECK(f.find("general.architecture")->as_string("a") == "qwen3moe");
      CHECK(f.find("qwen3moe.expert_count")->as_int("a") == 8);
      CHECK(f.find("qwen3moe.expert_used_count")->as_int("a") == 2);
      CHECK(f.find("qwen3moe.expert_feed_forward_length")->as_int("a") == 16);
      const GgufTensorInfo* down = f.find_tensor("blk.0.ffn_down_exps.weight");
      REQUIRE(down);
      CHECK(down->ne == std::vector<uint64_t>{16, 32, 8});
      CHECK(down->shape == Shape{8, 32, 16});
      CHECK(down->type_id == 1);  // a row of 16 is not a whole q8_0 block: the converter keeps f16
      CHECK(f.find_tensor("blk.1.ffn_gate_exps.weight")->shape == Shape{8, 16, 32});
      CHECK(f.find_tensor("blk.0.ffn_gate_inp.weight")->shape == Shape{8, 32});
      CHECK(f.find_tensor("blk.0.attn_q_norm.weight")->shape == Shape{16});
    }
  }
  SECTION("the weight source reads the same model from f16 and q8_0") {
    auto a = open_gguf_weights(dir + "llama_small.f16.gguf");
    auto b = open_weights(dir + "llama_small.q8_0.gguf");
    CHECK(a->spec().num_hidden_layers == 2);
    CHECK(a->spec().hidden_size == 64);
    CHECK(a->spec().vocab_size == 160);
    CHECK(a->spec().dtype == DType::F16);
    CHECK(b->spec().dtype == DType::Q8_0);
    CHECK(a->tokenizer().tokens.size() == 160);
    CHECK(a->tensors().size() == b->tensors().size());
    auto m = open_weights(dir + "qwen3moe_small.q8_0.gguf");
    CHECK(m->spec().is_moe());
    CHECK(m->spec().num_experts == 8);
    CHECK(m->tensor("blk.0.ffn_down_exps.weight").dtype == DType::F16);
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt files

TEST_CASE("gguf: the hand-made small file is valid", "[gguf]") {
  const std::string bytes = small_valid().build();
  REQUIRE(open_error(bytes).empty());
  GgufFile f(write_temp(bytes));
  REQUIRE(f.tensors().size() == 2);
  CHECK(f.tensors()[1].shape == Shape{1, 16});
  CHECK(f.data_offset() + 64 == bytes.size());
}

TEST_CASE("gguf: truncation at every byte offset is an Error", "[gguf]") {
  const std::string bytes = small_valid().build();
  REQUIRE(bytes.size() < 1024);
  const std::string path = temp_path("gguf_truncated.gguf");
  int failures = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_file(path, bytes.substr(0, n));
    try {
      GgufFile f(path);
      FAIL("a file truncated to " << n << " of " << bytes.size() << " bytes parsed");
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find(path) == std::string::npos || msg.find('\n') != std::string::npos) {
        ++failures;
        INFO("truncated to " << n << ": " << msg);
        CHECK(false);
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("gguf: bad magic, version and byte order", "[gguf]") {
  RawGguf g = small_valid();
  g.magic = 0x46554746;
  require_error(g, {"offset 0", "magic"});
  g = small_valid();
  g.version = 1;
  require_error(g, {"offset 4", "version 1"});
  g.version = 4;
  require_error(g, {"offset 4", "version 4"});
  g.version = 0x03000000;  // a big-endian file read little-endian
  require_error(g, {"offset 4", "big-endian"});
  CHECK_THAT(open_error("GGUF"), Contains("offset 4"));
  CHECK_THAT(open_error(""), Contains("offset 0"));
  CHECK_THAT(open_error(std::string(100, 'x')), Contains("magic"));
}

TEST_CASE("gguf: absurd counts and lengths fail before any allocation", "[gguf]") {
  const uint64_t huge = uint64_t(1) << 60;
  auto patch_u64 = [](std::string s, size_t at, uint64_t v) {
    std::memcpy(&s[at], &v, 8);
    return s;
  };
  const std::string ok = small_valid().build();
  std::string msg = open_error(patch_u64(ok, 8, huge));
  CHECK_THAT(msg, Contains("offset 8") && Contains("tensor count 1152921504606846976"));
  msg = open_error(patch_u64(ok, 16, huge));
  CHECK_THAT(msg, Contains("offset 16") && Contains("metadata count 1152921504606846976"));
  msg = open_error(patch_u64(ok, 16, 1000));  // plausible alone, but not with the tensors
  CHECK_THAT(msg, Contains("offset"));
  msg = open_error(patch_u64(ok, 24, huge));  // length of the first key
  CHECK_THAT(msg, Contains("offset 24") && Contains("string length 1152921504606846976"));

  RawGguf g = small_valid();
  Bytes s;
  s.put<uint64_t>(huge);
  g.kv.push_back({"test.long_string", 8, s.s});
  require_error(g, {"offset", "string length 1152921504606846976"});

  g = small_valid();
  Bytes a;
  a.put<uint32_t>(0).put<uint64_t>(huge);  // u8 array of 2^60 elements
  g.kv.push_back({"test.huge_array", 9, a.s});
  require_error(g, {"offset", "'test.huge_array'", "1152921504606846976"});

  // An array that fits in a (big, here sparse) file but exceeds the per-file limit of 2^22
  // metadata array elements is refused before anything is reserved for it.
  g = small_valid();
  Bytes many;
  many.put<uint32_t>(0).put<uint64_t>((uint64_t(1) << 22) + 1);
  g.kv.push_back({"test.too_many", 9, many.s});
  const std::string bytes = g.build();
  const std::string path = write_temp(bytes, "sparse");
  std::filesystem::resize_file(path, bytes.size() + (uint64_t(1) << 22) + 64);
  try {
    GgufFile f(path);
    FAIL("an array of 2^22 + 1 elements was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains(path) && Contains("'test.too_many'") && Contains("limit"));
  }
  std::filesystem::remove(path);
  // A real vocabulary's arrays stay well within it: 2^20 elements (four times the largest vocabulary's
  // tokens) are read.
  g = small_valid();
  Bytes vocab;
  vocab.put<uint32_t>(0).put<uint64_t>(uint64_t(1) << 20);
  vocab.s.append(size_t(1) << 20, '\0');
  g.kv.push_back({"test.vocab_sized", 9, vocab.s});
  const std::string ok_path = write_temp(g.build(), "vocab_sized");
  CHECK_NOTHROW(GgufFile(ok_path));
  std::filesystem::remove(ok_path);
}

TEST_CASE("gguf: metadata values are validated", "[gguf]") {
  RawGguf g = small_valid();
  g.kv.push_back({"test.flag", 7, std::string(1, '\x02')});
  require_error(g, {"offset", "'test.flag'", "bool value 2"});

  g = small_valid();
  g.kv.push_back({"test.weird", 13, std::string(4, '\0')});
  require_error(g, {"offset", "'test.weird'", "unknown value type 13"});

  g = small_valid();
  Bytes a;
  a.put<uint32_t>(99).put<uint64_t>(1).put<uint32_t>(0);
  g.kv.push_back({"test.weird_array", 9, a.s});
  require_error(g, {"offset", "'test.weird_array'", "unknown array element type 99"});

  g = small_valid();
  g.kv.push_back(kv_u32("general.architecture", 1));
  require_error(g, {"offset", "duplicate metadata key 'general.architecture'"});

  // Arrays nest up to 4 levels; a fifth is refused (bounds the reader's recursion).
  auto nest = [](int levels) {
    GgufValue v = GgufValue::of_i32s({1});
    for (int l = 1; l < levels; ++l) {
      GgufValue outer = value(GgufType::ARRAY);
      outer.array_type = GgufType::ARRAY;
      outer.array.push_back(v);
      v = outer;
    }
    return v;
  };
  g = small_valid();
  g.kv.push_back(kv_value("test.deep4", nest(4)));
  CHECK(open_error(g.build()).empty());
  g = small_valid();
  g.kv.push_back(kv_value("test.deep5", nest(5)));
  require_error(g, {"offset", "'test.deep5'", "nested deeper than 4"});
  g = small_valid();
  g.kv.push_back(kv_value("test.deep100", nest(100)));
  require_error(g, {"offset", "'test.deep100'", "nested deeper"});

  g = small_valid();
  g.kv.push_back(kv_u32("general.alignment", 48));
  require_error(g, {"general.alignment", "power of two"});
  g = small_valid();
  g.kv.push_back(kv_str("general.alignment", "32"));
  require_error(g, {"general.alignment", "expected an integer"});
}

TEST_CASE("gguf: tensor infos are validated", "[gguf]") {
  SECTION("dimension count 0 and 5") {
    RawGguf g = small_valid();
    g.tensors[1].ne = {};
    require_error(g, {"offset", "'b.weight'", "0 dimensions"});
    g.tensors[1].ne = {2, 2, 2, 2, 2};
    require_error(g, {"offset", "'b.weight'", "5 dimensions"});
  }
  SECTION("dimensions of 0 and 2^50") {
    RawGguf g = small_valid();
    g.tensors[1].ne = {16, 0};
    require_error(g, {"offset", "'b.weight'", "dimension 1", "= 0"});
    g.tensors[1].ne = {uint64_t(1) << 50};
    require_error(g, {"offset", "'b.weight'", "dimension 0", "1125899906842624"});
    g.tensors[1].ne = {uint64_t(1) << 30, uint64_t(1) << 30};  // each fine, the product absurd
    require_error(g, {"offset", "'b.weight'", "element count"});
  }
  SECTION("unknown type id") {
    RawGguf g = small_valid();
    g.tensors[1].type = 99;
    require_error(g, {"offset", "'b.weight'", "unknown tensor type id 99"});
    g.tensors[1].type = 4;  // retired q4_2
    require_error(g, {"offset", "'b.weight'", "unknown tensor type id 4"});
  }
  SECTION("a row that is not a whole number of blocks") {
    RawGguf g = small_valid();
    g.tensors.push_back({"q.weight", {33, 2}, 8, -1, std::string(136, 'x')});
    require_error(g, {"offset", "'q.weight'", "row of 33", "q8_0 block size 32"});
  }
  SECTION("a data offset that is not aligned") {
    RawGguf g = small_valid();
    g.tensors[1].offset = 40;
    require_error(g, {"offset", "'b.weight'", "data offset 40", "alignment 32"});
    g = small_valid();
    g.alignment = 64;
    g.kv.push_back(kv_u32("general.alignment", 64));
    CHECK(open_error(g.build()).empty());
    g.tensors[1].offset = 32;  // aligned to 32 but not to the file's 64
    require_error(g, {"offset", "'b.weight'", "data offset 32", "alignment 64"});
  }
  SECTION("data past the end of the file") {
    RawGguf g = small_valid();
    g.data_size = 63;
    require_error(g, {"offset", "'b.weight'", "past the end"});
    g = small_valid();
    g.tensors[1].offset = 1 << 20;
    g.data_size = 64;
    require_error(g, {"offset", "'b.weight'", "past the end"});
    g.tensors[1].offset = static_cast<int64_t>(uint64_t(1) << 62);  // offset + size would wrap
    require_error(g, {"offset", "'b.weight'", "past the end"});
  }
  SECTION("overlapping tensors") {
    RawGguf g = small_valid();
    g.tensors[1].offset = 0;
    require_error(g, {"offset", "overlaps", "'a.weight'", "'b.weight'"});
    g = small_valid();
    g.tensors.push_back({"c.weight", {64}, 0, 0, ""});  // [0, 256) covers both others
    g.data_size = 256;
    require_error(g, {"offset", "overlaps"});
  }
  SECTION("duplicate tensor names") {
    RawGguf g = small_valid();
    g.tensors[1].name = "a.weight";
    require_error(g, {"offset", "duplicate tensor name 'a.weight'"});
  }
}

// The tensor count (a u64 at byte 8) lowered by one: the last tensor's info is left where padding
// belongs, and every tensor would be read from the wrong place.
std::string one_tensor_short(std::string bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + 8, 8);
  REQUIRE(n > 0);
  --n;
  std::memcpy(&bytes[8], &n, 8);
  return bytes;
}

TEST_CASE("gguf: a tensor count one short is refused, not read as other tensors", "[gguf]") {
  // Hand-made files of 2, 3 and 5 tensors, then real files of llama.cpp's converter.
  for (int n : {2, 3, 5}) {
    RawGguf g = small_valid();
    for (int i = 2; i < n; ++i) g.tensors.push_back({"t" + std::to_string(i) + ".weight", {8, 2}, 0, -1, ""});
    CHECK(open_error(g.build()) == "");
    const std::string msg = open_error(one_tensor_short(g.build()));
    INFO(n << " tensors: " << msg);
    CHECK((msg.find("tensor count") != std::string::npos || msg.find("belong to no tensor") != std::string::npos));
  }
  for (const char* f : {"llamacpp/gguf/llama_small.f16.gguf", "llamacpp/gguf/qwen3moe_small.q8_0.gguf"}) {
    std::string path;
    const std::string msg = open_error(one_tensor_short(read_file(fixtures_dir() + "/" + f)), &path);
    INFO(f << ": " << msg);
    CHECK_THAT(msg, Contains(path) && Contains("the file is corrupt"));
  }
}

TEST_CASE("gguf: tensors tile the data section: no gap, no trailing bytes, zero padding", "[gguf]") {
  SECTION("a gap between two tensors") {
    RawGguf g = small_valid();
    g.tensors[1].offset = 64;
    g.data_size = 96;
    require_error(g, {"'b.weight'", "data at 64 leaves a gap", "ends at 32"});
    g = small_valid();
    g.tensors[0].offset = 32;  // the first tensor not at the start
    g.tensors[1].offset = 64;
    g.data_size = 96;
    require_error(g, {"'a.weight'", "leaves a gap after the start of the data section"});
  }
  SECTION("bytes after the last tensor") {
    RawGguf g = small_valid();
    g.tensors.push_back({"c.weight", {2}, 0, -1, ""});  // f32: 8 bytes at 64, padded to 96
    g.data_size = 96;
    CHECK(open_error(g.build()) == "");
    g.data_size = 97;
    require_error(g, {"25 bytes after the last tensor's data belong to no tensor"});
    g = small_valid();  // its last tensor ends at 64, a multiple of the alignment: no padding
    g.data_size = 64 + 32;
    require_error(g, {"32 bytes after"});
    g.data_size = 64 + 4096;
    require_error(g, {"4096 bytes after"});
  }
  SECTION("a padding byte that is not zero") {
    RawGguf g = small_valid();
    std::string bytes = g.build();
    // The infos end before the aligned data start: the byte just before the data is padding.
    const size_t data_start = bytes.size() - 64;
    REQUIRE(data_start % 32 == 0);
    size_t info_end = data_start;
    while (info_end > 0 && bytes[info_end - 1] == '\0') --info_end;
    REQUIRE(info_end < data_start);
    bytes[data_start - 1] = 7;
    std::string path;
    const std::string msg = open_error(bytes, &path);
    CHECK_THAT(msg, Contains(path) && Contains("offset " + std::to_string(data_start - 1)) && Contains("zero padding"));
  }
}

// ---------------------------------------------------------------------------------------------
// Model-level: types and architectures we cannot run

TEST_CASE("gguf: a tensor of an unsupported type names the tensor and the type", "[gguf]") {
  RawGguf g = small_model_raw();
  const std::string ok = write_temp(g.build(), "model_ok");
  REQUIRE_NOTHROW(open_gguf_weights(ok));

  RawTensor* q = find_raw_tensor(g, "blk.0.attn_q.weight");
  REQUIRE(q);
  REQUIRE(q->ne == std::vector<uint64_t>{256, 16});
  q->type = 23;  // iq4_xs: 256-element blocks of 136 bytes, a type shardwise does not compute with
  q->data = std::string(16 * 136, '\x11');
  const std::string path = write_temp(g.build(), "model_iq4xs");
  CHECK_NOTHROW(GgufFile{path});  // the file itself is well-formed
  CHECK_THROWS_WITH(open_gguf_weights(path), Contains(path) && Contains("blk.0.attn_q.weight") && Contains("iq4_xs") &&
                                                 Contains("not supported"));
  CHECK_THROWS_WITH(open_weights(path), Contains("blk.0.attn_q.weight") && Contains("iq4_xs"));
}

TEST_CASE("gguf: an architecture we do not know names general.architecture", "[gguf]") {
  for (const char* arch : {"gpt2", "bert"}) {
    RawGguf g = small_model_raw();
    RawKv* a = find_kv(g, "general.architecture");
    REQUIRE(a);
    *a = kv_str("general.architecture", arch);
    const std::string path = write_temp(g.build(), arch);
    CHECK_THROWS_WITH(open_weights(path),
                      Contains(path) && Contains("general.architecture") && Contains(std::string("'") + arch + "'"));
  }
  RawGguf g = small_model_raw();
  g.kv.erase(g.kv.begin() + (find_kv(g, "general.architecture") - g.kv.data()));
  const std::string path = write_temp(g.build(), "noarch");
  CHECK_THROWS_WITH(open_weights(path), Contains(path) && Contains("general.architecture is missing"));
  g = small_model_raw();
  *find_kv(g, "general.architecture") = kv_u32("general.architecture", 1);
  CHECK_THROWS_WITH(open_weights(write_temp(g.build(), "intarch")),
                    Contains("general.architecture") && Contains("expected a string"));
}

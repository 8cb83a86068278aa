// The bad-input table: hostile inputs of every class the CLI reads (tokenizer.json, thread counts,
// GGUF, plan tables, weights that give non-finite logits, a results file held by another sweep, sizes,
// errors that must name a file or field, budgets, small values once accepted silently), each run
// through the binary: exit 1, nothing on stdout, one stderr line "error: ..." holding the expected
// parts, in under 10 seconds (a crash, a hang or a silent success fails the row). CTest runs it in the
// ASan/UBSan build too.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "test_util.h"
#include "text/unicode.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using json = nlohmann::json;

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Row {
  std::string what;                 // the input, for the report
  std::string args;                 // shardwise ARGS (quoted as needed)
  std::vector<std::string> expect;  // parts of the error line
};

// Runs the row; a hang is killed after 30 s and fails the row like any other answer.
void check(const Row& r) {
  static int n = 0;
  const std::string out = temp_path("table_out_" + std::to_string(n) + ".txt");
  const std::string err = temp_path("table_err_" + std::to_string(n++) + ".txt");
  const auto t0 = std::chrono::steady_clock::now();
  std::string ignored;
  const int rc = run_command(
      "(timeout -s KILL 30 " + quote(shardwise_bin()) + " " + r.args + " >" + quote(out) + " 2>" + quote(err) + ")",
      &ignored);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string o = read_file(out), e = read_file(err);
  INFO(r.what << "\nshardwise " << r.args << "\nexit " << rc << " after " << s << " s\nstdout: " << o.substr(0, 400)
              << "\nstderr: " << e.substr(0, 2000));
  CHECK(rc == 1);
  CHECK(o.empty());
  CHECK(s < 10.0);
  CHECK(std::count(e.begin(), e.end(), '\n') == 1);
  CHECK_THAT(e, StartsWith("error: "));
  for (const auto& p : r.expect) CHECK_THAT(e, Contains(p));
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string p = temp_path(name);
  write_file(p, bytes);
  return p;
}

// A directory with the HF llama fixture's config and weights and this tokenizer.json.
std::string hf_with_tokenizer(const std::string& name, const std::string& tokenizer_json) {
  const std::string d = temp_path(name);
  std::string ignored;
  REQUIRE(run_command("mkdir -p " + quote(d) + " && cp " + quote(fixtures_dir() + "/hf/llama/config.json") + " " +
                          quote(fixtures_dir() + "/hf/llama/model.safetensors") + " " + quote(d),
                      &ignored) == 0);
  write_file(d + "/tokenizer.json", tokenizer_json);
  return d;
}

std::string small_tokenizer(const std::string& extra) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"], "unk_token": "a"})" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

std::string nested(const std::string& list, int depth, const std::string& leaf) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += R"({"type": "Sequence", ")" + list + R"(": [)";
  s += leaf;
  for (int i = 0; i < depth; ++i) s += "]}";
  return s;
}

// A small f16 model written by `synth` once per process.
const std::string& model() {
  static const std::string path = [] {
    const std::string p = temp_path("table_tiny_llama.gguf");
    std::string out;
    if (run_command(quote(shardwise_bin()) + " synth --spec tiny_llama --dtype f16 --seed 7 -o " + quote(p), &out) != 0)
      throw std::runtime_error("synth failed: " + out);
    return p;
  }();
  return path;
}

// Its plan table for the emulated device, as JSON.
json plan_of_model() {
  const std::string p = temp_path("table_plan.json");
  std::string out;
  REQUIRE(run_command(quote(shardwise_bin()) + " plan --model " + quote(model()) +
                          " --hw h200-host --vram-budget 2M --ctx 64 --save " + quote(p),
                      &out) == 0);
  return json::parse(read_file(p));
}

std::string run_plan(const std::string& name, const json& plan) {
  return "run --model " + quote(model()) + " --device emu --plan " + quote(write(name, plan.dump())) +
         " --tokens 1,2,3 -n 3 --greedy";
}

std::string experiment_yaml(int per_list) {
  std::ostringstream y;
  y << "name: big\nhardware: cli3\nmodels:\n";
  for (int i = 0; i < per_list; ++i)
    y << "  - {name: m" << i << ", weights: \"synthetic:tiny_llama?seed=" << i + 1 << "\"}\n";
  const char* lists[4] = {"budgets", "ctx", "threads", "pcie_caps"};
  for (int l = 0; l < 4; ++l) {
    y << lists[l] << ": [";
    for (int i = 0; i < per_list; ++i) {
      y << (i ? ", " : "");
      if (l == 0) y << i + 2 << "M";
      if (l == 1) y << 64 * (i + 1);
      if (l == 2) y << i + 1;
      if (l == 3) y << i + 1 << "GB/s";
    }
    y << "]\n";
  }
  y << "tiers: [1]\n";
  return y.str();
}

// A Qwen2.5-VL projector in llama.cpp's mmproj layout (hidden 8, 2 heads, merger width 32, output 8),
// holding `blocks_in_file` blocks of tensors while clip.vision.block_count says `block_count`.
// `edit` changes its metadata before it is written.
std::string tiny_mmproj(const std::string& name, int block_count, int blocks_in_file,
                        const std::function<void(GgufWriter&)>& edit = nullptr) {
  static const std::vector<float> values(32 * 32 * 14, 0.01f);  // enough for the largest tensor
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_string("clip"));
  w.set("clip.projector_type", GgufValue::of_string("qwen2.5vl_merger"));
  const std::pair<const char*, uint32_t> keys[] = {{"clip.vision.block_count", static_cast<uint32_t>(block_count)},
                                                   {"clip.vision.embedding_length", 8},
                                                   {"clip.vision.feed_forward_length", 8},
                                                   {"clip.vision.attention.head_count", 2},
                                                   {"clip.vision.projection_dim", 8},
                                                   {"clip.vision.patch_size", 14},
                                                   {"clip.vision.n_wa_pattern", 1}};
  for (const auto& kv : keys) w.set(kv.first, GgufValue::of_u32(kv.second));
  w.set("clip.use_silu", GgufValue::of_bool(true));
  auto add = [&](const std::string& t, const Shape& shape) {
    w.add_tensor(t, TensorView{DType::F32, shape, values.data(), tensor_bytes(DType::F32, shape)});
  };
  add("v.patch_embd.weight", {8, 3, 14, 14});
  add("v.patch_embd.weight.1", {8, 3, 14, 14});
  for (int b = 0; b < blocks_in_file; ++b) {
    const std::string p = "v.blk." + std::to_string(b) + ".";
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down"}) {
      add(p + m + ".weight", {8, 8});
      add(p + m + ".bias", {8});
    }
    add(p + "ln1.weight", {8});
    add(p + "ln2.weight", {8});
  }
  add("v.post_ln.weight", {8});
  add("mm.0.weight", {32, 32});
  add("mm.0.bias", {32});
  add("mm.2.weight", {8, 32});
  add("mm.2.bias", {8});
  if (edit) edit(w);
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

}  // namespace

TEST_CASE("bad input table: tokenizer.json nesting, types and ids", "[cli][bad_table]") {
  auto tokenize = [](const std::string& dir) { return "tokenize --model " + quote(dir) + " --text 'a b'"; };
  for (
      const Row& r : std::vector<Row>{
          {"normalizer Sequence 50000 deep (crashed)",
           tokenize(hf_with_tokenizer(
               "t_norm", small_tokenizer("\"normalizer\": " + nested("normalizers", 50000, R"({"type": "NFC"})")))),
           {"tokenizer.json", "normalizer: Sequence nested more than 64 deep"}},
          {"pre_tokenizer Sequence 6000 deep (took 29 s)",
           tokenize(hf_with_tokenizer(
               "t_pre",
               small_tokenizer("\"pre_tokenizer\": " + nested("pretokenizers", 6000, R"({"type": "Digits"})")))),
           {"pre_tokenizer: Sequence nested more than 64 deep"}},
          {"decoder Sequence 65 deep",
           tokenize(hf_with_tokenizer(
               "t_dec", small_tokenizer("\"decoder\": " + nested("decoders", 65, R"({"type": "Fuse"})")))),
           {"decoder: Sequence nested more than 64 deep"}},
          {"\"type\": 5",
           tokenize(hf_with_tokenizer("t_type", small_tokenizer(R"("normalizer": {"type": 5})"))),
           {"tokenizer.json: normalizer.type: must be a string, got 5"}},
          {"a decoder field of the wrong type",
           tokenize(hf_with_tokenizer("t_strip", small_tokenizer(R"("decoder": {"type": "Strip", "stop": [1]})"))),
           {"decoder.stop: must be an integer"}},
          {"post-processor special id outside the vocabulary",
           tokenize(hf_with_tokenizer(
               "t_special",
               small_tokenizer(
                   R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [150]}}})"))),
           {"post_processor.special_tokens['<s>'].ids[0]: token id 150 is not in the vocabulary"}},
      })
    check(r);
  // A byte-level vocabulary lacking byte 0x41's symbol (text with an 'A' was silently dropped).
  json vocab = json::object();
  for (int b = 0; b < 200; ++b)  // the fixture's vocabulary has 211 rows
    if (b != 0x41) vocab[tok::byte_level_encode(std::string(1, static_cast<char>(b)))] = static_cast<int>(vocab.size());
  const json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
                   {"pre_tokenizer", {{"type", "ByteLevel"}}}};
  check({"byte-level vocabulary without every byte",
         tokenize(hf_with_tokenizer("t_bytes", tj.dump())),
         {"no token for byte 0x41"}});
}

TEST_CASE("bad input table: thread counts", "[cli][bad_table]") {
  const std::string run = "run --model " + quote(model()) + " --tokens 1,2,3 -n 2 ";
  check({"--threads 4096 (64 s for 3 tokens on 2 cores)",
         run + "--threads 4096",
         {"--threads 4096 is out of range", "hardware threads"}});
  check({"--threads -3", run + "--threads -3", {"--threads -3"}});
  check({"profile --threads 100000",
         "profile --quick --device cpu --threads 1,100000 --out " + quote(temp_path("p.json")),
         {"--threads"}});
}

TEST_CASE("bad input table: GGUF files that would read wrong", "[cli][bad_table]") {
  std::string bytes = read_file(model());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + 8, 8);
  std::string short_count = bytes;
  const uint64_t fewer = n - 1;
  std::memcpy(&short_count[8], &fewer, 8);
  check({"tensor count one short (ran with exit 0)",
         "run --greedy --tokens 1,2,3 -n 2 --model " + quote(write("short.gguf", short_count)),
         {"short.gguf", "the file is corrupt"}});
  check({"bytes after the last tensor",
         "info " + quote(write("trailing.gguf", bytes + std::string(4096, '\0'))),
         {"trailing.gguf", "bytes after the last tensor's data belong to no tensor"}});
}

TEST_CASE("bad input table: mmproj files whose keys and tensors disagree", "[cli][bad_table]") {
  const std::string image = quote(fixtures_dir() + "/vision/images/jpeg_baseline420_48x32.jpg");
  std::string out;
  REQUIRE(run_command(quote(shardwise_bin()) + " vision --quiet -m " + quote(tiny_mmproj("mm_ok.gguf", 2, 2)) +
                          " --image " + image,
                      &out) == 0);
  // A block_count below the file's blocks would encode with the first blocks only, silently.
  check({"clip.vision.block_count below the blocks of tensors (ran with exit 0)",
         "vision -m " + quote(tiny_mmproj("mm_extra_block.gguf", 1, 2)) + " --image " + image,
         {"mm_extra_block.gguf", "unexpected tensor v.blk.1.", "clip.vision.block_count"}});
  // Normalisation values the processor refuses: the error names the file and the key, not only the value.
  const auto std0 = [](GgufWriter& w) { w.set("clip.vision.image_std", GgufValue::of_f32s({0.5f, 0.0f, 0.5f})); };
  check({"clip.vision.image_std of 0 (error named neither the file nor the key)",
         "vision -m " + quote(tiny_mmproj("mm_std0.gguf", 2, 2, std0)) + " --image " + image,
         {"mm_std0.gguf", "clip.vision.image_std[1] = 0", "non-zero"}});
}

TEST_CASE("bad input table: plan tables run with --plan", "[cli][bad_table]") {
  const json good = plan_of_model();
  json p = good;
  for (auto& t : p["tiers"])
    for (auto& c : t["candidates"])
      for (auto& r : c["arena"]) r["offset"] = 0;
  check({"every region at offset 0 (nondeterministic tokens)",
         run_plan("zero.json", p),
         {"zero.json: tiers[0].candidates[", "overlap"}});
  p = good;
  for (auto& t : p["tiers"])
    for (auto& c : t["candidates"]) {
      json kept = json::array();
      std::vector<int> id(c["actions"].size(), -1);
      for (const auto& a : c["actions"])
        if (a["kind"] != "compute") {
          id[a["id"].get<size_t>()] = static_cast<int>(kept.size());
          kept.push_back(a);
        }
      for (auto& a : kept) {
        a["id"] = id[a["id"].get<size_t>()];
        json deps = json::array();
        for (const auto& d : a["deps"])
          if (id[d.get<size_t>()] >= 0) deps.push_back(id[d.get<size_t>()]);
        a["deps"] = deps;
      }
      c["actions"] = kept;
    }
  check({"compute actions removed (tokens [0, 0, 0])",
         run_plan("nocompute.json", p),
         {"nocompute.json", "is not computed exactly once"}});
  p = good;
  p["tiers"][0]["candidates"][0]["actions"][1]["kind"] = "teleport";
  check({"an unknown action kind",
         run_plan("teleport.json", p),
         {"teleport.json: tiers[0].candidates[0].actions[1].kind: unknown action kind 'teleport' (one of"}});
  p = good;
  p["tiers"][0]["candidates"][0]["actions"][0]["shard"] = 100000;
  check({"a shard id out of range (leaked vector::_M_range_check)",
         run_plan("shard.json", p),
         {"shard.json", "names shard 100000"}});
  p = good;
  p["tiers"][0]["colour"] = "blue";
  check({"an unknown field", run_plan("field.json", p), {"field.json: tiers[0]: unknown field 'colour'"}});
  p = good;
  p["budget_bytes"] = 9000000000000000000ull;
  check({"a budget of 9e18 bytes", run_plan("budget.json", p), {"budget.json: budget_bytes", "1 PiB"}});
}

TEST_CASE("bad input table: weights that give non-finite logits", "[cli][bad_table]") {
  std::string bytes = read_file(model());
  const GgufFile f(model());
  const GgufTensorInfo* t = f.find_tensor("output.weight");
  REQUIRE(t != nullptr);
  REQUIRE(t->type_id == 1);  // f16: NaN is 0x7E00
  for (uint64_t i = 0; i < t->nbytes; i += 2) {
    bytes[f.data_offset() + t->offset + i] = 0x00;
    bytes[f.data_offset() + t->offset + i + 1] = 0x7E;
  }
  const std::string nan = quote(write("nan.gguf", bytes));
  check({"NaN LM head, greedy on the CPU (token 0 forever)",
         "run --greedy --tokens 1,2,3 -n 4 --model " + nan,
         {"step 1 of the generation", "not finite"}});
  check({"NaN LM head, sampled on the emulated device",
         "run --tokens 1,2,3 -n 4 --device emu --vram-budget 8M --model " + nan,
         {"step 1 of the generation", "token id 0 has logit nan"}});
  check({"NaN LM head, logits",
         "logits --tokens 1,2 --model " + nan + " --out " + quote(temp_path("nan.npy")),
         {"nan.npy: the logits of position 0", "not finite"}});
}

TEST_CASE("bad input table: a results file another sweep is writing", "[cli][bad_table]") {
  const std::string yaml =
      write("lock.yaml",
            "name: lock\nhardware: cli3\nmodels: [\"synthetic:tiny_llama?seed=1\"]\nbudgets: [8M]\n"
            "ctx: [64]\nthreads: [1]\npcie_caps: [none]\ntiers: [1]\n");
  const std::string out = temp_path("held.jsonl");
  const int fd = ::open(out.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  check({"a second writer (both exited 0 with duplicate rows)",
         "sweep " + quote(yaml) + " --device emu --resume --no-progress --out " + quote(out),
         {"held.jsonl: another sweep is writing this file"}});
  ::close(fd);
}

TEST_CASE("bad input table: sizes from outside", "[cli][bad_table]") {
  const std::string run = "run --model " + quote(model()) + " --tokens 1,2,3 -n 2 ";
  for (const Row& r : std::vector<Row>{
           {"10^8 configurations (expanded until memory ran out)",
            "sweep " + quote(write("huge.yaml", experiment_yaml(40))) + " --predict",
            {"huge.yaml: the experiment expands to 102400000 configurations", "more than 100000"}},
           {"--pcie-cap 1B/s (never finished)",
            run + "--device emu --vram-budget 8M --pcie-cap 1B/s",
            {"--pcie-cap", "100MB/s to 1TB/s"}},
           {"--pcie-cap 5TB/s", "plan --model nemo8b --hw cli3 --vram-budget 4G --pcie-cap 5TB/s", {"--pcie-cap"}},
           {"--vram-budget of 9e18 bytes (16777216 TiB of host memory)",
            run + "--device emu --vram-budget 9000000000000000000",
            {"--vram-budget", "1 PiB"}},
           {"plan --vram-budget 2048T",
            "plan --model nemo8b --hw cli3 --vram-budget 2048T",
            {"--vram-budget", "1 PiB"}},
           {"--ctx 2^23", run + "--ctx 8388608", {"--ctx 8388608 is out of range"}},
           {"plan --ctx 2^23", "plan --model nemo8b --hw cli3 --vram-budget 4G --ctx 8388608", {"--ctx 8388608"}},
           {"--batch 2^23", run + "--batch 8388608", {"--batch"}},
       })
    check(r);
}

TEST_CASE("bad input table: errors name the file or flag and the field", "[cli][bad_table]") {
  const std::string bad_key = write("listkey.yaml", "name: x\n[a, b]: 1\nfamily: llama\n");
  for (const Row& r : std::vector<Row>{
           {"synthetic: layers=abc in run (error: stoll)",
            "run --tokens 1 -n 1 --model 'synthetic:tiny_llama?layers=abc'",
            {"synthetic:tiny_llama?layers=abc: layers 'abc' must be a whole number"}},
           {"synthetic: layers=abc in info (ignored)", "info 'synthetic:tiny_llama?layers=abc'", {"layers 'abc'"}},
           {"synthetic: layers=abc in an experiment (error: stoll)",
            "sweep --predict " +
                quote(write("stoll.yaml",
                            "name: s\nhardware: cli3\nmodels: [\"synthetic:tiny_llama?layers=abc\"]\n"
                            "budgets: [8M]\nctx: [64]\nthreads: [1]\npcie_caps: [none]\ntiers: [1]\n")),
            {"stoll.yaml: models[0].weights", "layers 'abc'"}},
           {"a model YAML key that is a list (bad conversion, no file)",
            "info " + quote(bad_key),
            {"listkey.yaml: line 2"}},
           {"synth to a missing directory (synthesised first)",
            "synth --spec tiny_llama -o /nonexistent/dir/x.gguf",
            {"-o", "/nonexistent/dir"}},
           {"a flag CLI11 cannot convert (two lines, exit 105)",
            "run --model " + quote(model()) + " --tokens 1 --ctx abc",
            {"--ctx"}},
           {"a YAML key holding a control character",
            "info " + quote(write("ctl.yaml",
                                  "name: x\n\x1e"
                                  "bad: 1\n")),
            {"\\x1ebad"}},
       })
    check(r);
}

TEST_CASE("bad input table: JSON nested deep", "[cli][bad_table]") {
  // A config.json value nested 200000 deep crashed (its error message dumped it); a plan table alike.
  const std::string dir = hf_with_tokenizer("deep_cfg", small_tokenizer(""));
  std::string cfg = read_file(dir + "/config.json");
  const auto at = cfg.find("\"hidden_size\":");
  REQUIRE(at != std::string::npos);
  cfg = cfg.substr(0, at) + "\"hidden_size\": " + std::string(200000, '[') + "1" + std::string(200000, ']') +
        cfg.substr(cfg.find_first_of(",}", at));
  write_file(dir + "/config.json", cfg);
  check({"config.json value nested 200000 deep (crashed)",
         "info " + quote(dir),
         {"config.json: JSON nested 200001 deep, more than 256 levels"}});
  json plan = plan_of_model();
  plan["machine"] = "@@";
  std::string text = plan.dump();
  text.replace(text.find("\"@@\""), 4, std::string(100000, '{') + std::string(100000, '}'));
  check(
      {"plan table field nested 100000 deep",
       "run --model " + quote(model()) + " --device emu --tokens 1 -n 1 --plan " + quote(write("deep_plan.json", text)),
       {"deep_plan.json: JSON nested 100001 deep"}});
}

TEST_CASE("bad input table: the smallest budget that works", "[cli][bad_table]") {
  check({"a budget below the smallest",
         "plan --model tiny_llama --hw cli3 --vram-budget 1K --ctx 256",
         {"the smallest budget that works is", "bytes)"}});
}

TEST_CASE("bad input table: small values once accepted silently", "[cli][bad_table]") {
  const std::string run = "run --model " + quote(model()) + " --tokens 1,2,3 -n 2 ";
  const std::string dup_exp =
      write("dup.yaml",
            "name: d\nhardware: cli3\nhardware: cli2\nmodels: [\"synthetic:tiny_llama\"]\nbudgets: [8M]\n"
            "ctx: [64]\nthreads: [1]\npcie_caps: [none]\ntiers: [1]\n");
  const std::string dup_model = write("dupmodel.yaml", "name: x\nfamily: llama\nhidden_size: 64\nhidden_size: 128\n");
  for (const Row& r : std::vector<Row>{
           {"--ctx -1", run + "--ctx -1", {"--ctx -1"}},
           {"--batch -1", run + "--batch -1", {"--batch -1"}},
           {"--seed -1 (wrapped)", run + "--seed -1", {"--seed", "'-1'"}},
           {"--seed 2^70 (saturated)", run + "--seed 1180591620717411303424", {"--seed"}},
           {"synth --layers -1",
            "synth --spec tiny_llama --layers -1 -o " + quote(temp_path("l.gguf")),
            {"--layers -1"}},
           {"tokenize --file DIR (read as empty)",
            "tokenize --model " + quote(model()) + " --file " + quote(temp_dir()),
            {"--file", "is a directory"}},
           {"seed= past 2^64 in a synthetic: spec",
            "run --tokens 1 -n 1 --model 'synthetic:tiny_llama?seed=99999999999999999999999'",
            {"seed '99999999999999999999999'"}},
           {"a duplicate key in an experiment (first won)",
            "sweep --predict " + quote(dup_exp),
            {"dup.yaml: line 3: duplicate key 'hardware'"}},
           {"a duplicate key in a model YAML",
            "info " + quote(dup_model),
            {"dupmodel.yaml: line 4: duplicate key 'hidden_size'"}},
       })
    check(r);
}

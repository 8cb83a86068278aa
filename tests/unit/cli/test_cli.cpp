// Tests for the `shardwise` binary ($SHARDWISE_BIN): the verbs on fixtures and synthetic models,
// and bad input, which must end with a non-zero exit and exactly one stderr line "error: ..."
// (no stack trace, no abort, no sanitizer report).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/error.h"
#include "core/gguf.h"
#include "core/npy.h"
#include "core/size.h"
#include "executor/cpu/matmul.h"
#include "microbench/bench_data.h"
#include "microbench/profiler.h"
#include "test_util.h"

using namespace shardwise;
using namespace shardwise::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

struct Result {
  int rc = -1;  // -1: killed by a signal
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string bin() {
  return test::shardwise_bin();
}

std::string fixture(const std::string& rel) {
  return fixtures_dir() + "/" + rel;
}

// Runs `shardwise ARGS` (ARGS already quoted as needed); stdout and stderr apart.
Result shardwise_cli(const std::string& args) {
  static int n = 0;
  const std::string err_path = temp_path("cli_stderr_" + std::to_string(n++) + ".txt");
  Result r;
  // run_command merges stderr into stdout outside the subshell; inside, stderr goes to the file.
  r.rc = run_command("(" + quote(bin()) + " " + args + " 2>" + quote(err_path) + ")", &r.out);
  r.err = read_file(err_path);
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// A failure the CLI handled: exit 1, nothing on stdout, one stderr line starting "error: ".
void require_clean_error(const std::string& args, const std::vector<std::string>& parts = {}) {
  const Result r = shardwise_cli(args);
  INFO("shardwise " << args << "\nexit " << r.rc << "\nstdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.rc == 1);
  CHECK(r.out.empty());
  const auto ls = lines(r.err);
  REQUIRE(ls.size() == 1);
  CHECK_THAT(ls[0], StartsWith("error: "));
  for (const auto& p : parts) CHECK_THAT(ls[0], Contains(p));
}

std::vector<int64_t> npy_ints(const std::string& path) {
  const NpyArray a = read_npy(path);
  std::vector<int64_t> v;
  for (double x : a.values) v.push_back(static_cast<int64_t>(x));
  return v;
}

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// A small synthetic q8_0 model written by `synth` once per test process.
const std::string& synth_model() {
  static const std::string path = [] {
    const std::string p = temp_path("cli_tiny_llama_q8_0.gguf");
    const Result r = shardwise_cli("synth --spec tiny_llama --dtype q8_0 --seed 5 -o " + quote(p));
    if (r.rc != 0) throw std::runtime_error("synth failed: " + r.err);
    return p;
  }();
  return path;
}

}  // namespace

// `synth --dtype MIX` writes llama-quantize's mix (here Q4_K_M of the K-quant fixtures' spec: output and the
// last layer's attn_v and ffn_down in q6_K, the other matrices q4_K), and `info` reports the file's types.
TEST_CASE("cli: synth writes llama-quantize's mixes and info lists the types", "[cli][kquants]") {
  const std::string spec = fixture("kquants/kq_llama.yaml"), p = temp_path("cli_kq_llama_q4_k_m.gguf");
  Result r = shardwise_cli("synth --spec " + quote(spec) + " --dtype q4_k_m --seed 2 -o " + quote(p));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  r = shardwise_cli("info --json " + quote(p));
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["tensors_by_type"] == nlohmann::json({{"f32", 5}, {"q4_K", 13}, {"q6_K", 3}}));
  r = shardwise_cli("info " + quote(p));
  CHECK(r.out.find("types      f32 5 tensors") != std::string::npos);
  // A block type is not a mix: --pure says so.
  require_clean_error("synth --spec " + quote(spec) + " --dtype q4_K -o " + quote(temp_path("q4k.gguf")),
                      {"--pure", "q4_K_M"});
  r = shardwise_cli("synth --spec " + quote(spec) + " --dtype q4_K --pure --seed 2 -o " + quote(p));
  REQUIRE(r.rc == 0);
  r = shardwise_cli("info --json " + quote(p));
  CHECK(nlohmann::json::parse(r.out)["tensors_by_type"] == nlohmann::json({{"f32", 5}, {"q4_K", 16}}));
}

TEST_CASE("cli: info on a GGUF fixture, as text and as JSON", "[cli]") {
  const std::string gguf = fixture("llamacpp/gguf/llama_small.f16.gguf");
  Result r = shardwise_cli("info " + quote(gguf));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("llama") && Contains("2 layers") && Contains("hidden 64") && Contains("vocab 160"));

  r = shardwise_cli("info --json " + quote(gguf));
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"model", "name", "family", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "vocab_size", "n_params", "total_bytes", "bytes_by_kind",
                          "kv_bytes_per_token_f16", "kv_bytes_per_token_f32"})
    CHECK(j.contains(key));
  CHECK(j["family"] == "llama");
  CHECK(j["dtype"] == "f16");
  CHECK(j["num_hidden_layers"] == 2);
  CHECK(j["hidden_size"] == 64);
  CHECK(j["num_key_value_heads"] == 2);
  CHECK(j["vocab_size"] == 160);
  CHECK(j["total_bytes"].get<uint64_t>() > 0);
  CHECK(j["bytes_by_kind"].contains("token_embd"));

  r = shardwise_cli("info --json " + quote(fixture("hf/qwen3moe_norm")));
  REQUIRE(r.rc == 0);
  const auto m = nlohmann::json::parse(r.out);
  CHECK(m["family"] == "qwen3_moe");
  CHECK(m["num_experts"] == 12);
  CHECK(m["num_experts_per_tok"] == 3);
}

TEST_CASE("cli: info on a builtin spec needs no weights", "[cli]") {
  Result r = shardwise_cli("info nemo8b");
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("nemo8b") && Contains("40 layers"));
  r = shardwise_cli("info --json nemo8b");
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["hidden_size"] == 4096);
  CHECK(j["num_hidden_layers"] == 40);
  CHECK(j["vocab_size"] == 131072);
  CHECK(j["total_bytes"].get<uint64_t>() > (uint64_t(15) << 30));
}

TEST_CASE("cli: synth writes a GGUF that info and logits read", "[cli]") {
  const std::string model = synth_model();
  GgufFile f(model);
  CHECK(f.find("general.architecture")->as_string("a") == "llama");
  CHECK(f.find_tensor("blk.0.attn_q.weight")->type_id == 8);

  Result r = shardwise_cli("info --json " + quote(model));
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["dtype"] == "q8_0");
  CHECK(j["num_hidden_layers"] == 3);
  CHECK(j["vocab_size"] == 256);

  const std::string out = temp_path("cli_synth_logits.npy");
  r = shardwise_cli("logits --model " + quote(model) + " --tokens 1,2,3,250 --out " + quote(out));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const NpyArray a = read_npy(out);
  CHECK(a.shape == std::vector<int64_t>{4, 256});
  REQUIRE(a.values.size() == 4 * 256);
  for (double v : a.values) REQUIRE(std::isfinite(v));
  CHECK(a.values[0] != a.values[256]);  // positions differ
}

TEST_CASE("cli: logits of the HF fixture match transformers", "[cli][fixtures]") {
  const std::string dir = fixture("hf/llama");
  const auto prompt = npy_ints(dir + "/ref_prompt_ids.npy");
  const NpyArray ref = read_npy(dir + "/ref_prompt_logits.npy");
  const std::string out = temp_path("cli_hf_logits.npy");
  const Result r = shardwise_cli("logits --model " + quote(dir) + " --tokens " + join(prompt) + " --out " + quote(out));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const NpyArray a = read_npy(out);
  REQUIRE(a.shape == std::vector<int64_t>{static_cast<int64_t>(prompt.size()), 211});
  REQUIRE(a.values.size() == ref.values.size());
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref.values[i]));
    max_diff = std::max(max_diff, std::fabs(a.values[i] - ref.values[i]));
  }
  CHECK(max_diff / max_ref < 1e-3);
}

TEST_CASE("cli: run --json gives the documented keys and the reference greedy tokens", "[cli][fixtures]") {
  const std::string dir = fixture("hf/llama");
  const auto prompt = npy_ints(dir + "/ref_prompt_ids.npy");
  const auto greedy = npy_ints(dir + "/ref_greedy_ids.npy");
  REQUIRE(greedy.size() >= 4);
  const Result r =
      shardwise_cli("run --model " + quote(dir) + " --tokens " + join(prompt) + " -n 4 --greedy --json --device cpu");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"generated_ids", "n_prompt_tokens", "ttft_ms", "decode_tokens_per_s", "device"})
    CHECK(j.contains(key));
  CHECK(j["n_prompt_tokens"] == prompt.size());
  CHECK(j["device"] == "cpu");
  CHECK(j["ttft_ms"].get<double>() > 0);
  CHECK(j["generated_ids"].get<std::vector<int64_t>>() == std::vector<int64_t>(greedy.begin(), greedy.begin() + 4));
}

TEST_CASE("cli: bad input gives exit 1 and one error line", "[cli][bad_input]") {
  const std::string hf = quote(fixture("hf/llama"));
  SECTION("a model path that does not exist") {
    const std::string missing = temp_path("no/such/model.gguf");
    require_clean_error("run --model " + quote(missing) + " --tokens 1 -n 1", {missing, "no such file"});
    require_clean_error("logits --model " + quote(missing) + " --tokens 1 --out " + quote(temp_path("x.npy")),
                        {missing});
    require_clean_error("info " + quote(missing), {missing});
  }
  SECTION("a corrupt GGUF file") {
    const std::string full = read_file(fixture("llamacpp/gguf/llama_small.f16.gguf"));
    for (size_t keep : {size_t(3), size_t(1000), full.size() / 2, full.size() - 1}) {
      const std::string path = temp_path("cli_truncated_" + std::to_string(keep) + ".gguf");
      write_file(path, full.substr(0, keep));
      require_clean_error("info " + quote(path), {path, "offset"});
      require_clean_error("run --model " + quote(path) + " --tokens 1 -n 1", {path});
    }
    std::string flipped = full;
    flipped[4] = 9;  // version 9
    const std::string path = temp_path("cli_version9.gguf");
    write_file(path, flipped);
    require_clean_error("logits --model " + quote(path) + " --tokens 1 --out " + quote(temp_path("v9.npy")),
                        {path, "version 9"});
  }
  SECTION("token ids out of range or malformed") {
    require_clean_error("run --model " + hf + " --tokens 1,2,211 -n 1", {"211", "out of range", "211)"});
    require_clean_error("logits --model " + hf + " --tokens 5000 --out " + quote(temp_path("t.npy")), {"5000"});
    require_clean_error("run --model " + hf + " --tokens 1,,2 -n 1", {"--tokens", "item 2"});
    require_clean_error("run --model " + hf + " --tokens abc -n 1", {"--tokens", "'abc'"});
    require_clean_error("run --model " + hf + " --tokens 1,2, -n 1", {"--tokens"});
    require_clean_error("run --model " + hf + " --tokens ' -1' -n 1", {"--tokens"});
    require_clean_error("run --model " + hf + " --tokens 99999999999 -n 1", {"--tokens"});
    require_clean_error("run --model " + hf + " --tokens 4294967297 -n 1", {"--tokens"});
  }
  SECTION("devices and GPU flags that are not available") {
    require_clean_error("run --model " + hf + " --tokens 1,2 -n 1 --device tpu", {"--device", "tpu"});
    require_clean_error("logits --model " + hf + " --tokens 1 --out " + quote(temp_path("d.npy")) + " --device tpu",
                        {"tpu"});
    require_clean_error("run --model " + hf + " --tokens 1,2 -n 1 --device cuda", {"--device cuda"});
    require_clean_error("run --model " + hf + " --tokens 1,2 -n 1 --vram-budget 4G", {"--vram-budget"});
    require_clean_error("run --model " + hf + " --tokens 1,2 -n 1 --schedule static", {"--schedule"});
  }
  SECTION("sizes out of range") {
    require_clean_error("run --model " + hf + " --tokens 1,2,3 -n 4 --ctx 3", {"--ctx 3", "too small"});
    require_clean_error("run --model " + hf + " --tokens 1 -n -1", {"-n -1"});
    require_clean_error("run --model " + hf + " --tokens 1 -n 1 --threads -2", {"--threads"});
    require_clean_error("run --model " + hf + " -n 1", {"--prompt", "--tokens"});
  }
  SECTION("bad synthetic strings and specs") {
    require_clean_error("run --model 'synthetic:tiny_llama?layers=0' --tokens 1 -n 1", {"layers '0'"});
    require_clean_error("run --model 'synthetic:nosuchspec' --tokens 1 -n 1", {"nosuchspec"});
    require_clean_error("info 'synthetic:tiny_llama?dtype=iq2_xs'", {"iq2_xs"});
    require_clean_error("synth --spec tiny_llama --dtype q5_K -o " + quote(temp_path("q5.gguf")), {"q5_K"});
    require_clean_error("synth --spec nosuchspec -o " + quote(temp_path("n.gguf")), {"nosuchspec"});
    const std::string yaml = temp_path("cli_bad.yaml");
    write_file(yaml, "family: llama\nhidden_size: 64\nnum_hidden_layers: [1\n");
    require_clean_error("info " + quote(yaml), {yaml, "line"});
  }
  SECTION("an unwritable output") {
    const std::string out = temp_path("no/such/dir/out.npy");
    require_clean_error("logits --model " + hf + " --tokens 1 --out " + quote(out), {out});
  }
}

TEST_CASE("cli: missing required flags and unknown verbs exit 1 with one line", "[cli][bad_input]") {
  // CLI11's errors (exit codes 104-114, some of several lines) are normalised like any other.
  for (const std::string& args : {std::string("run --tokens 1 -n 1"), std::string("logits --model x --tokens 1"),
                                  std::string("synth -o x.gguf"), std::string("info"), std::string(""),
                                  std::string("frobnicate"), std::string("run --model x --tokens 1 -n abc")}) {
    require_clean_error(args);
    const Result r = shardwise_cli(args);
    CHECK(r.err.find("AddressSanitizer") == std::string::npos);
    CHECK(r.err.find("terminate called") == std::string::npos);
  }
}

// The profiler on this machine: a quick CPU-only profile that `plan --profile` accepts for CPU
// timings and refuses for GPU ones; --validate measures cases outside the grid.
TEST_CASE("cli: profile --quick writes a CPU profile that plan and validate use", "[cli][profile]") {
  const std::string db = temp_path("quick.profile.json");
  const Result r = shardwise_cli("profile --quick --device cpu --threads 1,2 --no-progress --out " + quote(db));
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["device"] == "cpu");
  CHECK(j["gpu_rows"] == 0);
  CHECK(j["op_rows"].get<int>() > 50);
  CHECK(j["threads"] == nlohmann::json::array({1, 2}));
  const std::string text = read_file(db);
  CHECK(text.size() < 200 * 1024);
  // Every op class the planner asks for on the CPU was measured at both thread counts.
  const auto p = nlohmann::json::parse(text);
  CHECK(p["version"] == 1);
  // CPU matmuls are measured on both sides of the GEMV -> dequantise+sgemm switch, so no token count
  // interpolates across it.
  const int64_t gemm_from = matmul_gemm_threshold();
  bool last_gemv = false;
  for (const auto& op : p["ops"])
    if (op["backend"] == "cpu" && op["kind"] == "matmul")
      for (const auto& pt : op["points"]) last_gemv |= pt[0].get<int64_t>() == gemm_from - 1;
  CHECK(last_gemv);
  // CPU MoE rows reach the step size where the experts switch to the GEMM kernels (the quick grid's
  // 16 experts, top 4: 128 tokens), so larger steps do not extrapolate the GEMV regime.
  bool moe_anchor = false;
  for (const auto& op : p["ops"])
    if (op["backend"] == "cpu" && op["kind"] == "moe_experts")
      for (const auto& pt : op["points"]) moe_anchor |= pt[0].get<int64_t>() == gemm_from * 16 / 4;
  CHECK(moe_anchor);
  // A GPU plan from a CPU-only profile is an error naming the profile ...
  const Result plan =
      shardwise_cli("plan --model nemo4b --profile " + quote(db) + " --vram-budget 2G --threads 2 --ctx 1024");
  CHECK(plan.rc == 1);
  CHECK_THAT(plan.err, Contains("no GPU rows"));
  // ... unless a datasheet answers the GPU side (with a warning).
  const Result plan2 = shardwise_cli("plan --model nemo4b --profile " + quote(db) +
                                     " --hw cli2 --vram-budget 2G --threads 2 --ctx 1024 --json");
  INFO(plan2.err);
  REQUIRE(plan2.rc == 0);
  CHECK(nlohmann::json::parse(plan2.out)["predicted_decode_tokens_per_s"].get<double>() > 0);
  // Attention is measured over the KV cache types that take their own time (f32, f16, q8_0), so those caches
  // plan from the profile's own rows, without the warning that prices a missing type from another's.
  std::set<std::string> kv_types;
  for (const auto& op : p["ops"])
    if (op["backend"] == "cpu" && op["kind"] == "attention") kv_types.insert(op["dtype"].get<std::string>());
  CHECK(kv_types == std::set<std::string>{"f16", "f32", "q8_0"});
  for (const char* kv : {"f16", "q8_0"}) {
    const Result plan_kv =
        shardwise_cli("plan --model nemo4b --profile " + quote(db) +
                      " --hw cli2 --vram-budget 2G --threads 2 --ctx 1024 --kv-dtype " + kv + " --json");
    INFO(plan_kv.err);
    REQUIRE(plan_kv.rc == 0);
    CHECK(nlohmann::json::parse(plan_kv.out)["kv_dtype"] == kv);
    CHECK_THAT(plan_kv.err, !Contains("no cpu attention rows"));
  }
  // Validation: cases the grid never saw, predicted vs measured.
  const std::string vj = temp_path("quick.validation.json");
  const Result v = shardwise_cli("profile --validate " + quote(db) + " --quick --no-progress --json-out " + quote(vj));
  INFO(v.err);
  REQUIRE(v.rc == 0);
  CHECK_THAT(v.out, Contains("all cpu"));
  CHECK_THAT(v.out, Contains("cpu matmul t2"));
  // Rescoring those measurements with the same profile reproduces every prediction and error.
  const std::string rj = temp_path("quick.rescored.json");
  const Result rs =
      shardwise_cli("profile --validate " + quote(db) + " --quick --rescore " + quote(vj) + " --json-out " + quote(rj));
  INFO(rs.err);
  REQUIRE(rs.rc == 0);
  const auto a = nlohmann::json::parse(read_file(vj)), b = nlohmann::json::parse(read_file(rj));
  REQUIRE(a["cases"].size() > 10);
  CHECK(a["cases"] == b["cases"]);
  CHECK(a["cpu"] == b["cpu"]);
  CHECK(b["rescored_from"] == vj);
  // --check: the profile's own rows measured again, DRAM read and two matmuls at 1 and 2 threads.
  // (Whether they agree is not asserted: on CI's two shared cores a quick profile's 20-us point can
  // have been measured 30x slow.)
  {
    const MachineCheck mc = check_machine(load_profile(db));
    REQUIRE(mc.rows.size() >= 4);
    for (const MachineCheckRow& row : mc.rows) CHECK((row.measured_value > 0 && row.profile_value > 0));
    CHECK(mc.max_slowdown >= mc.min_slowdown);
    CHECK(mc.slowdown_by_threads.size() == 2);    // 1 and 2 threads
    CHECK(mc.first_slowdown_by_threads.empty());  // no tolerance given: measured once
    // The oracle's per-configuration probe: the same rows at one thread count, a positive factor;
    // 0 for a thread count the profile has no rows at.
    const ProfileDB pdb = load_profile(db);
    MachineProbe probe(pdb);
    const double s1 = probe.slowdown(1), s2 = probe.slowdown(2);
    CHECK((s1 > 0 && std::isfinite(s1) && s2 > 0 && std::isfinite(s2)));
    CHECK(probe.slowdown(3) == 0);
    // With a tolerance, only a thread count whose first mean fell outside it was measured again.
    const MachineCheck tol = check_machine(load_profile(db), 9.9);
    for (const auto& [t, first] : tol.first_slowdown_by_threads) CHECK((first > 10.9 || first < 1 / 10.9));
    CHECK_THAT(mc.text(), Contains("dram read t1") && Contains("cpu matmul f16"));
    const Result c = shardwise_cli("profile --check " + quote(db) + " --tolerance 9.9");
    if (c.rc == 0) {
      const auto cj = nlohmann::json::parse(c.out);
      CHECK(cj["same_machine"] == true);
      CHECK(cj["rows"].size() == mc.rows.size());
    } else {
      CHECK_THAT(c.err, Contains("machine check: this machine is"));
    }
  }
  // The profile is input: a row whose shape the runner cannot hold is not re-measured (it would read
  // past the weight set).
  {
    auto huge = nlohmann::json::parse(text);
    for (auto& op : huge["ops"])
      if (op["backend"] == "cpu" && op["kind"] == "matmul" && op["dtype"] == "f16" && !op["contention"].get<bool>())
        op["points"].push_back({1, 1 << 23, 1 << 23, 1.0, 0.01, 3});
    const std::string hdb = temp_path("huge.profile.json");
    std::ofstream(hdb) << huge.dump();
    const MachineCheck mc = check_machine(load_profile(hdb));
    REQUIRE_FALSE(mc.rows.empty());
    for (const MachineCheckRow& row : mc.rows) CHECK_THAT(row.what, !Contains("8388608"));
  }
  // A profile whose machine read DRAM and ran matmuls 1000x faster is refused, naming the row.
  {
    auto fast = nlohmann::json::parse(text);
    for (auto& d : fast["dram"]) d["gbps"] = d["gbps"].get<double>() * 1000;
    for (auto& op : fast["ops"])
      if (op["backend"] == "cpu" && op["kind"] == "matmul")
        for (auto& pt : op["points"]) pt[3] = pt[3].get<double>() / 1000;
    const std::string fdb = temp_path("fast.profile.json");
    std::ofstream(fdb) << fast.dump();
    require_clean_error("profile --check " + quote(fdb),
                        {"machine check: this machine is", "slower than", "fast.profile.json", "when first measured"});
    // Refused only after a second measurement of each thread count outside the tolerance (a passing
    // moment of the machine is measured once more; a different machine differs twice).
    const MachineCheck twice = check_machine(load_profile(fdb), 0.2);
    CHECK(twice.first_slowdown_by_threads.size() == 2);
    for (const auto& [t, first] : twice.first_slowdown_by_threads) CHECK(first > 1.2);
    CHECK(twice.slowdown_by_threads.at(1) > 1.2);
    CHECK_THAT(twice.text(), Contains("measured again: the first time"));
    // A sweep whose experiment names that profile refuses to measure here, before writing anything.
    const std::string root = test::fixtures_dir() + "/../..";
    std::string y = read_file(root + "/experiments/smoke.yaml");
    const size_t hw = y.find("hardware: cli3");
    REQUIRE(hw != std::string::npos);
    y.insert(hw, "profile: fast.profile.json\n");  // CPU rows measured; cli3 stands in for the GPU
    for (size_t at; (at = y.find("synthetic:models/")) != std::string::npos;)
      y.replace(at, std::string("synthetic:models/").size(), "synthetic:" + root + "/experiments/models/");
    const std::string exp = temp_path("fast_experiment.yaml"), rows = temp_path("fast_rows.jsonl");
    std::ofstream(exp) << y;
    require_clean_error("sweep " + quote(exp) + " --device emu --machine-check on --no-progress --out " + quote(rows),
                        {"machine check: this machine is", "--machine-check off"});
    CHECK_FALSE(std::ifstream(rows).good());
    // Off at one thread only (the profile's one-thread rows 1000x fast, its two-thread rows as measured):
    // the same machine drifting, not another. The one-thread configurations are deferred — with the
    // probe on too, which finds the machine still off there — the two-thread ones measured; a later
    // --resume (here with the check off) measures the rest.
    {
      auto fast1 = nlohmann::json::parse(text);
      for (auto& d : fast1["dram"])
        if (d["threads"] == 1) d["gbps"] = d["gbps"].get<double>() * 1000;
      for (auto& op : fast1["ops"])
        if (op["backend"] == "cpu" && op["kind"] == "matmul" && op["threads"] == 1)
          for (auto& pt : op["points"]) pt[3] = pt[3].get<double>() / 1000;
      std::ofstream(temp_path("fast1.profile.json")) << fast1.dump();
      std::string y1 = y;
      y1.replace(y1.find("profile: fast.profile.json"), std::string("profile: fast.profile.json").size(),
                 "profile: fast1.profile.json");
      const std::string exp1 = temp_path("fast1_experiment.yaml"), rows1 = temp_path("fast1_rows.jsonl");
      std::ofstream(exp1) << y1;
      auto count_rows = [&](int threads) {
        int n = 0;
        std::ifstream in(rows1);
        for (std::string line; std::getline(in, line);) {
          const auto j = nlohmann::json::parse(line);
          n += j.value("record", "") == "row" && j["threads"] == threads;
        }
        return n;
      };
      for (const char* probe : {"off", "on"}) {
        std::remove(rows1.c_str());
        const Result d = shardwise_cli("sweep " + quote(exp1) + " --device emu --machine-check on --machine-probe " +
                                       probe + " --machine-tolerance 9.9 --no-progress --out " + quote(rows1));
        INFO(probe << ": " << d.err);
        REQUIRE(d.rc == 0);
        const auto sj = nlohmann::json::parse(d.out);
        CHECK(sj["complete"] == false);
        CHECK(sj["rows_deferred"].get<int>() > 0);
        CHECK_THAT(d.err, Contains("deferred"));
        CHECK(count_rows(1) == 0);
        CHECK(count_rows(2) > 0);
        CHECK(count_rows(2) + sj["rows_deferred"].get<int>() == sj["rows_total"].get<int>());
        std::ifstream in(rows1);
        std::string header;
        std::getline(in, header);
        CHECK(nlohmann::json::parse(header)["deferred_threads"].contains("1"));
      }
      const Result later = shardwise_cli(
          "sweep " + quote(exp1) + " --device emu --machine-check off --resume --no-progress --out " + quote(rows1));
      INFO(later.err);
      REQUIRE(later.rc == 0);
      CHECK(nlohmann::json::parse(later.out)["complete"] == true);
      CHECK(count_rows(1) > 0);
    }
    // Another machine by name: rates as measured here (a tolerance no rate misses), but the profile names
    // another CPU. The rows measure only the CPU, so a GPU machine of another kind with the same CPU
    // passes on rates alone; the names refuse it (the profile's GPU is compared the same way on the GPU).
    {
      auto other = nlohmann::json::parse(text);
      other["machine"]["cpu_model"] = "Another CPU 9000";
      const std::string odb = temp_path("other.profile.json");
      std::ofstream(odb) << other.dump();
      const MachineCheck omc = check_machine(load_profile(odb), 9.9);
      CHECK_THAT(omc.hardware_difference, Contains("'Another CPU 9000' in the profile"));
      CHECK_FALSE(omc.within(9.9));
      require_clean_error("profile --check " + quote(odb) + " --tolerance 9.9",
                          {"describes another machine", "Another CPU 9000", "shardwise profile"});
      // The same experiment planned from that profile (--profile: the study on another machine) is refused
      // by the names, before anything is written.
      const std::string rowso = temp_path("other_rows.jsonl");
      require_clean_error("sweep " + quote(exp) + " --profile " + quote(odb) +
                              " --device emu --machine-check on --machine-tolerance 9.9 --no-progress --out " +
                              quote(rowso),
                          {"describes another machine", "Another CPU 9000", "--machine-check off"});
      CHECK_FALSE(std::ifstream(rowso).good());
      // Planned from this machine's own profile (--profile db) it measures, and the results record the
      // profile used as the experiment's.
      const std::string rowsd = temp_path("own_profile_rows.jsonl");
      const Result own =
          shardwise_cli("sweep " + quote(exp) + " --profile " + quote(db) +
                        " --device emu --machine-check off --no-progress --max-minutes 0.02 --out " + quote(rowsd));
      INFO(own.err);
      REQUIRE(own.rc == 0);
      {
        std::ifstream in(rowsd);
        std::string header;
        std::getline(in, header);
        CHECK(nlohmann::json::parse(header)["effective_config"]["profile"] == db);
      }
      require_clean_error("sweep " + quote(exp) + " --profile " + quote(temp_path("missing.profile.json")) +
                              " --device emu --out " + quote(temp_path("never.jsonl")),
                          {"--profile", "missing.profile.json", "cannot open"});
      // The comparison itself: GPUs by name where both sides name one.
      MachineFingerprint h200, h100;
      h200.cpu_model = h100.cpu_model = "Xeon";
      h200.gpu_name = "NVIDIA H200";
      h100.gpu_name = "NVIDIA H100 80GB HBM3";
      CHECK(hardware_difference(h200, h200).empty());
      CHECK(hardware_difference(h200, h100) == "GPU 'NVIDIA H100 80GB HBM3' here, 'NVIDIA H200' in the profile");
      MachineFingerprint no_gpu = h100;
      no_gpu.gpu_name.clear();
      CHECK(hardware_difference(h200, no_gpu).empty());  // a check without the GPU compares the CPU alone
      CHECK(hardware_difference(no_gpu, h200).empty());  // a CPU-only profile names no GPU
      no_gpu.cpu_model = "Epyc";
      CHECK(hardware_difference(h200, no_gpu) == "CPU 'Epyc' here, 'Xeon' in the profile");
    }
    // With the check off and the probe on, each configuration's measured rows record how much slower
    // the machine was than that profile at their thread count just before (about 1000x, give or take
    // how loaded the machine was while the profile above was measured and now: a busy 2-core CI machine
    // measured 99.6x once); without the probe, null.
    for (const char* mode : {"on", "off"}) {
      const std::string probed = temp_path(std::string("probed_") + mode + ".jsonl");
      const Result pr = shardwise_cli("sweep " + quote(exp) + " --device emu --machine-check off --machine-probe " +
                                      mode + " --no-progress --max-minutes 0.08 --out " + quote(probed));
      INFO(mode << ": " << pr.err);
      REQUIRE(pr.rc == 0);
      int measured = 0, cpu_bound = 0;
      std::ifstream in(probed);
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.value("record", "") != "row" || j["status"] != "measured") continue;
        ++measured;
        if (std::string(mode) == "on") {
          CHECK(j["machine_slowdown"].get<double>() > 20);
          // Each row's plan predicted again with the CPU's work scaled by the probe: much slower where
          // CPU work is on the critical path, hardly faster anywhere (slower CPU work reads DRAM at a
          // lower rate beside the copies, which then run a little faster).
          const double again = j["predicted_ms_at_probe"].get<double>(), pred = j["predicted_ms"].get<double>();
          CHECK(again >= pred * 0.99);
          cpu_bound += again > 10 * pred;
        } else {
          CHECK(j["machine_slowdown"].is_null());
          CHECK(j["predicted_ms_at_probe"].is_null());
        }
      }
      CHECK(measured > 0);
      if (std::string(mode) == "on") CHECK(cpu_bound > 0);
    }
    require_clean_error("sweep " + quote(exp) + " --device emu --machine-probe maybe --out " + quote(rows),
                        {"--machine-probe 'maybe'"});
    // Bad values of the check's options, and asking for a check with no profile to check against.
    const std::string smoke = root + "/experiments/smoke.yaml";
    require_clean_error("sweep " + quote(exp) + " --device emu --machine-check maybe --out " + quote(rows),
                        {"--machine-check 'maybe'"});
    require_clean_error("sweep " + quote(exp) + " --device emu --machine-tolerance 0 --out " + quote(rows),
                        {"--machine-tolerance"});
    for (const char* calm : {"-0.1", "10", "nan"})
      require_clean_error("sweep " + quote(exp) + " --device emu --calm " + calm + " --out " + quote(rows), {"--calm"});
    require_clean_error("sweep " + quote(smoke) + " --device emu --machine-check on --out " + quote(rows),
                        {"names no profile"});
    require_clean_error("sweep " + quote(smoke) + " --device emu --machine-probe on --out " + quote(rows),
                        {"names no profile"});
    CHECK_FALSE(std::ifstream(rows).good());
  }
  // Bad input: one line each.
  require_clean_error("profile --check " + quote(db) + " --tolerance 0", {"--tolerance"});
  require_clean_error("profile --rescore " + quote(vj), {"--rescore needs --validate"});
  require_clean_error("profile --validate " + quote(db) + " --quick --rescore " + quote(db), {"'cases' is missing"});
  std::ofstream(temp_path("bad.validation.json"))
      << R"({"cases": [{"class": "cpu matmul t1", "case": "x", "measured_ms": -1}]})";
  require_clean_error(
      "profile --validate " + quote(db) + " --quick --rescore " + quote(temp_path("bad.validation.json")),
      {"cases[0]", "measured_ms"});
}

TEST_CASE("cli: streamed experts as strided copies give the CPU path's tokens, and plan times those copies", "[cli]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const std::string common =
      str_cat(" ", quote(bin()), " run --model ", quote(moe), " --tokens 1,2,3,4,5 -n 4 --greedy --threads 2 --json");
  std::string cpu_out, out;
  REQUIRE(run_command(common + " 2>/dev/null", &cpu_out) == 0);
  REQUIRE(run_command(common + " --device emu --vram-budget 3M --schedule gpu-only 2>/dev/null", &out) ==
          0);  // every expert streamed
  CHECK(nlohmann::json::parse(out)["generated_ids"] == nlohmann::json::parse(cpu_out)["generated_ids"]);
  // `plan` times the copies `run` makes: a streamed decode FFN of a synthetic qwen30b (8 experts, one
  // strided copy each, and the norm) is 9 copies; longer steps' FFNs copy more experts.
  const std::string saved = temp_path("plan_copies.json");
  REQUIRE(run_command(str_cat(quote(bin()),
                              " plan --model 'synthetic:qwen30b?dtype=q4_0' --hw h200-host --vram-budget 2G --ctx 1024",
                              " --threads 16 --only gpu-only --save ", quote(saved), " 2>/dev/null"),
                      &out) == 0);
  std::set<int> copies;
  const auto table = nlohmann::json::parse(read_file(saved));
  for (const auto& t : table["tiers"])
    for (const auto& p : t["candidates"])
      for (const auto& a : p["actions"])
        if (a["kind"] == "copy_weights" && a["copies"].get<int>() > 1) copies.insert(a["copies"].get<int>());
  CHECK(copies.count(9) == 1);
  CHECK(copies.count(25) == 0);
}

TEST_CASE("cli: plan --kv-layers keeps the first N layers' KV in VRAM", "[cli]") {
  for (int n : {10, 40}) {
    const Result r = shardwise_cli(
        "plan --model nemo8b --hw h200-host --vram-budget 2G --ctx 1024 --threads 16 --json --kv-layers " +
        std::to_string(n));
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(nlohmann::json::parse(r.out)["kv_layers_on_gpu"].get<int>() == n);
  }
  require_clean_error("plan --model nemo8b --hw h200-host --vram-budget 2G --ctx 1024 --kv-layers 41",
                      {"out of range"});
}

TEST_CASE("cli: plan --brief names the schedules of the tiers its decode and TTFT come from", "[cli]") {
  // qwen30b 2G/1K: the prompt goes in one 1024-token step (GPU-only) while the 512-token tier picks Dynamic.
  const std::string base = "plan --model qwen30b --hw h200-host --vram-budget 2G --ctx 1024 --threads 16";
  const Result brief = shardwise_cli(base + " --brief"), json = shardwise_cli(base + " --json");
  INFO(brief.err << json.err);
  REQUIRE(brief.rc == 0);
  REQUIRE(json.rc == 0);
  const auto j = nlohmann::json::parse(json.out);
  std::string decode, prefill;
  for (const auto& t : j["tiers"]) {
    if (t["tokens"] == 1) decode = t["chosen"];
    if (t["tokens"] == j["ttft_chunk_tokens"]) prefill = t["chosen"];
  }
  REQUIRE(!decode.empty());
  REQUIRE(!prefill.empty());
  CHECK_THAT(brief.out, Contains("t/s (" + decode));
  CHECK_THAT(brief.out, Contains(" ms (" + prefill));
}

TEST_CASE("cli: plan --only S plans one schedule's own table, as run --schedule S does", "[cli]") {
  const std::string base = "plan --model qwen30b --hw h200-host --vram-budget 4G --ctx 4096 --threads 16 --json";
  const Result mixed = shardwise_cli(base), only = shardwise_cli(base + " --only static");
  INFO(mixed.err << only.err);
  REQUIRE(mixed.rc == 0);
  REQUIRE(only.rc == 0);
  const auto jm = nlohmann::json::parse(mixed.out), jo = nlohmann::json::parse(only.out);
  for (const auto& t : jo["tiers"]) {
    REQUIRE(t["candidates"].size() == 1);
    CHECK(t["candidates"][0]["schedule"] == "static");
  }
  // Its own layout, here not the mix's (for a whole request Static keeps less KV in VRAM, making room
  // for pinned FFNs that its long CPU prefill needs more).
  CHECK(jo["kv_layers_on_gpu"] != jm["kv_layers_on_gpu"]);
  require_clean_error(base + " --only fastest", {"fastest"});
}

TEST_CASE("cli: plan/run --host-kv-attention splits or stages the attention over host KV caches", "[cli]") {
  // nemo8b 2G/1K with 30 of 40 layers' KV on the host: a 1024-token GPU-only prefill is faster staged.
  auto prefill_ms = [](const std::string& how) {
    const Result r = shardwise_cli(
        "plan --model nemo8b --hw h200-host --vram-budget 2G --ctx 1024 --threads 16 --kv-layers 10 "
        "--json --host-kv-attention " +
        how);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const auto j = nlohmann::json::parse(r.out);
    for (const auto& t : j["tiers"])
      if (t["tokens"] == 1024)
        for (const auto& c : t["candidates"])
          if (c["schedule"] == "gpu-only") return c["predicted_ms"].get<double>();
    FAIL("no gpu-only plan at tier 1024");
    return 0.0;
  };
  const double split = prefill_ms("split"), staged = prefill_ms("staged"), choose = prefill_ms("choose");
  CHECK(staged < split);
  CHECK(choose == Approx(staged));
  require_clean_error("plan --model nemo8b --hw h200-host --vram-budget 2G --host-kv-attention maybe",
                      {"--host-kv-attention 'maybe'"});
  require_clean_error("run --model " + quote(fixture("hf/llama")) +
                          " --device emu --vram-budget 1G --tokens 1,2 -n 1 "
                          "--host-kv-attention sometimes",
                      {"--host-kv-attention 'sometimes'"});
}

TEST_CASE("cli: plan --routing-tokens measures an MoE model's routing and plans with it", "[cli][routing]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const Result r = shardwise_cli("plan --model " + quote(moe) +
                                 " --hw cli3 --vram-budget 8M --ctx 64 --threads 2 --routing-tokens 16 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.err, Contains("routing measured on 16 tokens"));
  CHECK(nlohmann::json::parse(r.out)["predicted_decode_tokens_per_s"].get<double>() > 0);
  require_clean_error("plan --model tiny_llama --hw cli3 --vram-budget 1G --routing-tokens 16",
                      {"not a mixture-of-experts"});
  require_clean_error("plan --model qwen30b --hw cli3 --vram-budget 4G --routing-tokens 16", {"needs weights"});
  require_clean_error("plan --model " + quote(moe) + " --hw cli3 --vram-budget 8M --routing-tokens -3",
                      {"--routing-tokens"});
}

TEST_CASE("cli: plan/run --next-layer-hits: experts copied on the layer before's guess", "[cli][routing]") {
  // qwen30b's GPU-only decode at 4G streams its experts; told that 98% of the guesses hit, the plan copies
  // them a layer early and is predicted faster.
  const std::string base =
      "plan --model qwen30b --hw h200-host --vram-budget 4G --ctx 1024 --threads 16 --only gpu-only --json";
  const Result plain = shardwise_cli(base), guessed = shardwise_cli(base + " --next-layer-hits 0.98");
  INFO(plain.err << guessed.err);
  REQUIRE(plain.rc == 0);
  REQUIRE(guessed.rc == 0);
  const auto jp = nlohmann::json::parse(plain.out), jg = nlohmann::json::parse(guessed.out);
  CHECK(jg["predicted_decode_tokens_per_s"].get<double>() > 1.1 * jp["predicted_decode_tokens_per_s"].get<double>());
  for (const auto& t : jg["tiers"])
    if (t["tokens"] == 1) CHECK_THAT(t["candidates"][0]["notes"].get<std::string>(), Contains("98% hits"));
  require_clean_error(base + " --next-layer-hits 1.5", {"--next-layer-hits 1.5 must be a fraction"});
  // run: auto measures the guess on the prompt's first tokens where the model exceeds the budget, and the
  // tokens are the CPU path's whatever is guessed.
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const std::string common = "run --model " + quote(moe) + " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --json ";
  const Result cpu = shardwise_cli(common);
  REQUIRE(cpu.rc == 0);
  for (const char* hits : {"auto", "1", "off"}) {
    const Result r =
        shardwise_cli(common + "--device emu --vram-budget 3M --schedule gpu-only --next-layer-hits " + hits);
    INFO(hits << ": " << r.err);
    REQUIRE(r.rc == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["generated_ids"] == nlohmann::json::parse(cpu.out)["generated_ids"]);
    const double h = j["next_layer_hits"].get<double>();
    if (std::string(hits) == "auto") CHECK((h > 0 && h <= 1));
    if (std::string(hits) == "1") CHECK(h == 1.0);
    if (std::string(hits) == "off") CHECK(h == 0.0);
    CHECK(j["guess_hits"].get<uint64_t>() <= j["guessed_experts"].get<uint64_t>());
  }
  require_clean_error(common + "--device emu --vram-budget 3M --next-layer-hits often", {"--next-layer-hits 'often'"});
}

TEST_CASE("cli: run --device emu plans under a budget, generates the CPU path tokens and exits cleanly",
          "[cli][runtime]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const Result cpu =
      shardwise_cli("run --model " + quote(moe) + " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --json");
  REQUIRE(cpu.rc == 0);
  for (const char* budget : {"3M", "64M"}) {
    const Result r =
        shardwise_cli("run --model " + quote(moe) +
                      " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --json --device emu --vram-budget " + budget);
    INFO(budget << ": " << r.err);
    REQUIRE(r.rc == 0);  // also: no crash when the runtime and its device are torn down
    const auto j = nlohmann::json::parse(r.out), jc = nlohmann::json::parse(cpu.out);
    CHECK(j["generated_ids"] == jc["generated_ids"]);
    CHECK(j["device_peak_bytes"].get<uint64_t>() <= parse_size(budget, "budget"));
  }
}

TEST_CASE("cli: run --schedule X runs every step with X (candidates and baselines), the CPU path's tokens",
          "[cli][runtime]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const std::string common = "run --model " + quote(moe) + " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --json ";
  const Result cpu = shardwise_cli(common);
  REQUIRE(cpu.rc == 0);
  for (const char* s : {"gpu-only", "static", "dynamic", "layer-split", "cpu-moe"}) {
    const Result r = shardwise_cli(common + "--device emu --vram-budget 64M --schedule " + s);
    INFO(s << ": " << r.err);
    if (std::string(s) == "dynamic") {  // the whole model fits: nothing for Dynamic to stream, said so
      CHECK(r.rc == 1);
      CHECK_THAT(r.err, Contains("no plan for 1 tokens") && Contains("dynamic: no CPU shard"));
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      continue;
    }
    REQUIRE(r.rc == 0);
    const auto j = nlohmann::json::parse(r.out), jc = nlohmann::json::parse(cpu.out);
    CHECK(j["generated_ids"] == jc["generated_ids"]);
    REQUIRE(j["steps"].size() >= 2);
    for (const auto& st : j["steps"]) CHECK(st["schedule"] == s);
    // The prediction of every tier the run's own table has, from that table (the schedule it ran).
    REQUIRE(j["predicted_step_ms"].is_object());
    CHECK(j["predicted_step_ms"].size() == j["schedules"].size());
    for (const auto& [tier, ms] : j["predicted_step_ms"].items()) {
      CHECK(j["schedules"][tier] == s);
      CHECK(ms.get<double>() > 0);
    }
  }
}

TEST_CASE("cli: run runs decode steps of a device-resident plan as CUDA graphs by default, same tokens",
          "[cli][runtime]") {
  const std::string model = fixture("hf/llama");
  const std::string base = "run --model " + quote(model) +
                           " --tokens 1,2,3,4,5,6,7,8,9,10,11,12 -n 5 --greedy --threads 2 --json --device emu "
                           "--vram-budget 64M";
  const Result plain = shardwise_cli(base + " --no-cuda-graphs"), graphs = shardwise_cli(base + " --cuda-graphs"),
               dflt = shardwise_cli(base);
  INFO(plain.err << graphs.err << dflt.err);
  REQUIRE(plain.rc == 0);
  REQUIRE(graphs.rc == 0);
  REQUIRE(dflt.rc == 0);
  const auto jp = nlohmann::json::parse(plain.out), jg = nlohmann::json::parse(graphs.out),
             jd = nlohmann::json::parse(dflt.out);
  CHECK(jg["generated_ids"] == jp["generated_ids"]);
  CHECK(jd["generated_ids"] == jp["generated_ids"]);
  CHECK(jp["graph_launches"].get<uint64_t>() == 0);
  // The 12-token prompt runs kernel by kernel; 4 decode steps of one graph each (the fixture's 3
  // layers: 7 GPU compute actions, within one graph's kGraphMaxActions).
  CHECK(jg["graph_launches"].get<uint64_t>() == 4);
  CHECK(jd["graph_launches"].get<uint64_t>() == 4);
  const Result cpu = shardwise_cli("run --model " + quote(model) + " --tokens 1,2 -n 2 --device cpu --cuda-graphs");
  CHECK(cpu.rc != 0);
  CHECK(cpu.err.find("--cuda-graphs needs a device") != std::string::npos);
  const Result both = shardwise_cli(base + " --cuda-graphs --no-cuda-graphs");
  CHECK(both.rc != 0);
  CHECK(both.err.find("give one of --cuda-graphs and --no-cuda-graphs") != std::string::npos);
}

TEST_CASE("cli: run --profiler-runs A:B brackets plan runs A to B-1 with the device's profiler range",
          "[cli][runtime]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const std::string base =
      "run --model " + quote(moe) + " --tokens 1,2,3,4,5 -n 4 --greedy --threads 2 --device emu --vram-budget 3M";
  const Result r = shardwise_cli(base + " --profiler-runs 1:3");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto on = r.err.find("profiler range on"), off = r.err.find("profiler range off");
  REQUIRE(on != std::string::npos);
  REQUIRE(off != std::string::npos);
  CHECK(on < off);
  CHECK(r.err.find("profiler range on", on + 1) == std::string::npos);  // once each
  CHECK(r.err.find("profiler range off", off + 1) == std::string::npos);
  // A window past the last plan run opens no range (4 tokens: the prefill and 3 decode steps).
  const Result late = shardwise_cli(base + " --profiler-runs 4:6");
  REQUIRE(late.rc == 0);
  CHECK(late.err.find("profiler range") == std::string::npos);
  CHECK(late.out == r.out);  // the same tokens either way
  for (const char* bad : {"3:1", "2", "a:b", "-1:2", "1:"}) {
    const Result b = shardwise_cli(base + " --profiler-runs " + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.rc != 0);
    CHECK(b.err.find("--profiler-runs") != std::string::npos);
  }
}

TEST_CASE("cli: run --timeline writes measured and predicted timelines of the first plan runs", "[cli][runtime]") {
  const std::string moe = fixture("hf/qwen3moe_nonorm");
  const std::string path = test::temp_dir() + "/timeline.json";
  const Result r = shardwise_cli("run --model " + quote(moe) +
                                 " --tokens 1,2,3,4,5 -n 4 --greedy --threads 2 --device emu "
                                 "--vram-budget 3M --timeline " +
                                 quote(path) + " --timeline-runs 3");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.find("timeline: 3 plan runs") != std::string::npos);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::map<int, int> spans;  // pid -> complete events
  std::map<int, std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans[e["pid"].get<int>()];
      CHECK(e["dur"].get<double>() >= 0);
    } else if (e["name"] == "process_name") {
      names[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    }
  }
  REQUIRE(names.size() == 6);  // 3 runs, measured and predicted
  for (int run = 0; run < 3; ++run) {
    CHECK(names[2 * run].find("(measured)") != std::string::npos);
    CHECK(names[2 * run + 1].find("(predicted)") != std::string::npos);
    CHECK(spans[2 * run] > 0);
    CHECK(spans[2 * run] == spans[2 * run + 1]);  // every action of the plan, both ways
  }
  // Runs from the third on (steady decode steps): --timeline-runs A:B records runs [A, B) only.
  const Result later = shardwise_cli("run --model " + quote(moe) +
                                     " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --device emu "
                                     "--vram-budget 3M --timeline " +
                                     quote(path) + " --timeline-runs 2:5");
  INFO(later.err);
  REQUIRE(later.rc == 0);
  CHECK(later.err.find("timeline: 3 plan runs") != std::string::npos);
  std::ifstream in2(path);
  const auto trace = nlohmann::json::parse(in2);
  std::set<std::string> runs;
  for (const auto& e : trace["traceEvents"])
    if (e["name"] == "process_name") runs.insert(e["args"]["name"].get<std::string>().substr(0, 6));
  CHECK(runs == std::set<std::string>{"run 2:", "run 3:", "run 4:"});
  for (const char* bad : {"3:1", "0", "2:2", "a", "1:", "-1:2"}) {
    const Result b =
        shardwise_cli("run --model " + quote(moe) + " --tokens 1,2 -n 2 --device emu --vram-budget 3M --timeline " +
                      quote(path) + " --timeline-runs " + bad);
    INFO(bad << ": " << b.err);
    CHECK(b.rc != 0);
    CHECK(b.err.find("--timeline-runs") != std::string::npos);
  }
  // Bad input: one line, non-zero exit, nothing run.
  const Result cpu =
      shardwise_cli("run --model " + quote(moe) + " --tokens 1,2 -n 2 --device cpu --timeline " + quote(path));
  CHECK(cpu.rc != 0);
  CHECK(cpu.err.find("--timeline needs a device run") != std::string::npos);
  const Result nowhere =
      shardwise_cli("run --model " + quote(moe) +
                    " --tokens 1,2 -n 2 --device emu --vram-budget 3M --timeline /nonexistent-dir/t.json");
  CHECK(nowhere.rc != 0);
  CHECK(nowhere.err.find("cannot write") != std::string::npos);
}

TEST_CASE("profile: a first run over the point limit is run again before it decides to skip", "[profile]") {
  // A lazily loaded kernel makes the first launch of a shape slow once; the second run is the op.
  std::vector<double> runs = {68.0, 0.02};
  size_t calls = 0;
  auto once = [&] { return runs[std::min(calls++, runs.size() - 1)]; };
  CHECK(shardwise::first_run_ms(once, 60.0) == 0.02);
  CHECK(calls == 2);
  // Truly expensive: both runs over the limit, the faster counts.
  runs = {90.0, 80.0};
  calls = 0;
  CHECK(shardwise::first_run_ms(once, 60.0) == 80.0);
  // Under the limit: one run only.
  runs = {5.0, 1.0};
  calls = 0;
  CHECK(shardwise::first_run_ms(once, 60.0) == 5.0);
  CHECK(calls == 1);
}

TEST_CASE("profile: an ExpertDeck reads each expert once per pass and keeps the random routing's shape", "[profile]") {
  // The profiler times the CPU MoE block on experts that must come from DRAM: runs on one replica of
  // the layer take the experts of a shuffled order in turn, so that none is read again before every
  // expert has been (random labels re-read experts still in the L3).
  for (const int64_t tokens : {int64_t{1}, int64_t{3}, int64_t{16}}) {
    const int64_t n = 128, k = 8;
    shardwise::ExpertDeck deck(n, 7);
    std::mt19937_64 rng(static_cast<uint64_t>(tokens));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<int> reads(static_cast<size_t>(n), 0);
    int64_t read_total = 0;
    for (int run = 0; run < 40; ++run) {
      std::vector<float> logits(static_cast<size_t>(tokens * n));
      for (auto& l : logits) l = u(rng);
      const std::vector<float> drawn_logits = logits;
      const shardwise::MoeRouting drawn = shardwise::route_tokens(drawn_logits.data(), tokens, n, k, true);
      const shardwise::MoeRouting r = deck.next(logits.data(), tokens, k);
      // The same routing under other labels: each token's weights in order, the experts per token
      // distinct, as many experts in use, and the logits a permutation of the drawn ones.
      REQUIRE(r.expert_ids.size() == drawn.expert_ids.size());
      REQUIRE(r.weights.size() == drawn.weights.size());
      for (size_t i = 0; i < r.weights.size(); ++i)  // the softmax sums in another order: rounding only
        CHECK(r.weights[i] == Approx(drawn.weights[i]).epsilon(1e-5));
      CHECK(r.n_active_experts == drawn.n_active_experts);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> a(drawn_logits.begin() + t * n, drawn_logits.begin() + (t + 1) * n);
        std::vector<float> b(logits.begin() + t * n, logits.begin() + (t + 1) * n);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        CHECK(a == b);
      }
      std::set<int32_t> used(r.expert_ids.begin(), r.expert_ids.end());
      CHECK(static_cast<int64_t>(used.size()) == drawn.n_active_experts);
      // No expert is read twice before every expert has been read once more.
      for (int32_t e : used) ++reads[static_cast<size_t>(e)];
      read_total += static_cast<int64_t>(used.size());
      const auto [lo, hi] = std::minmax_element(reads.begin(), reads.end());
      CHECK(*hi - *lo <= 1);
      CHECK(*lo == read_total / n);
    }
  }
}

TEST_CASE("cli: profile bad input", "[cli][profile][bad_input]") {
  require_clean_error("profile --quick --threads 0 --device cpu --out x.json", {"--threads"});
  require_clean_error("profile --quick --device tpu --out x.json", {"--device"});
  require_clean_error("profile --quick --device cpu", {"--out"});
  const std::string bad = temp_path("bad.profile.json");
  write_file(bad, "{\"version\": 1, \"device\": \"cpu\"");
  require_clean_error("profile --validate " + quote(bad), {"bad.profile.json"});
  require_clean_error("plan --model nemo4b --profile " + quote(bad) + " --vram-budget 2G", {"bad.profile.json"});
}

// --- A llama.cpp user's first commands -------------------------------------------------------------

namespace {

// A GGUF fixture with a real vocabulary (text in, text out).
std::string llama_gguf() {
  return fixture("llamacpp/gguf/llama_small.f16.gguf");
}

nlohmann::json run_json(const std::string& args) {
  const Result r = shardwise_cli(args + " --json");
  INFO("shardwise " << args << "\nstderr: " << r.err);
  REQUIRE(r.rc == 0);
  return nlohmann::json::parse(r.out);
}

// The verbs and, for each, arguments that are complete but for the options under test.
const std::vector<std::string>& every_verb() {
  static const std::vector<std::string> verbs = {"info", "synth", "logits", "run",    "tokenize",
                                                 "plan", "sweep", "report", "profile"};
  return verbs;
}

bool is_hex16(const nlohmann::json& j) {
  if (!j.is_string()) return false;
  const std::string s = j.get<std::string>();
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST_CASE("cli: llama.cpp's short flags mean what they mean there", "[cli][llama]") {
  const std::string m = quote(llama_gguf());
  // -m -p -n -c -t -s --temp --top-k --top-p (and -no-cnv, accepted) against the long forms.
  const auto s = run_json("run -m " + m +
                          " -p 'Hello world' -n 4 -c 64 -t 1 -s 7 --temp 0.7 --top-k 5 --top-p 0.9 --ignore-eos "
                          "--device cpu -no-cnv");
  const auto l = run_json("run --model " + m +
                          " --prompt 'Hello world' --n-predict 4 --ctx 64 --threads 1 --seed 7 --temp 0.7 --top-k 5 "
                          "--top-p 0.9 --ignore-eos --device cpu --no-cnv");
  CHECK(s["generated_ids"] == l["generated_ids"]);
  CHECK(s["generated_ids"].size() == 4);
  CHECK(s["ctx"] == 64);
  CHECK(s["threads"] == 1);
  CHECK(s["seed"] == 7);
  CHECK(s["sampling"]["temperature"].get<double>() == 0.7);
  CHECK(s["sampling"]["top_k"] == 5);
  CHECK(s["sampling"]["top_p"].get<double>() == 0.9);
  // -f FILE: the prompt from a file, its final newline dropped (as llama.cpp reads it).
  const std::string file = temp_path("llama_prompt.txt");
  write_file(file, "Hello world\n");
  const auto f = run_json("run -m " + m + " -f " + quote(file) + " -n 4 -s 7 --temp 0.7 --top-k 5 --top-p 0.9 -c 64 " +
                          "-t 1 --ignore-eos --device cpu");
  CHECK(f["prompt_ids"] == s["prompt_ids"]);
  CHECK(f["generated_ids"] == s["generated_ids"]);
  require_clean_error("run -m " + m + " -f " + quote(temp_path("no_such_prompt.txt")) + " -n 2",
                      {"-f/--file", "no_such_prompt.txt", "cannot open"});
  require_clean_error("run -m " + m + " -f " + quote(temp_dir()) + " -n 2", {"-f/--file", "is a directory"});
  require_clean_error("run -m " + m + " -f " + quote(file) + " -p hi -n 2", {"exactly one of"});
  // -ngl N: no layer count here (CLI11 alone read it as -n gl); the error says what to use instead.
  for (const std::string& verb :
       {std::string("run -m ") + m + " -p hi", std::string("plan -m nemo8b --hw cli3 --vram-budget 4G")}) {
    for (const char* ngl : {"-ngl 10", "--n-gpu-layers 99", "--gpu-layers 0"})
      require_clean_error(verb + " " + ngl, {"-ngl/--n-gpu-layers", "--vram-budget SIZE", "layer-split"});
    require_clean_error(verb + " -fa", {"-fa/--flash-attn"});
    require_clean_error(verb + " -fa on", {"-fa/--flash-attn"});
    require_clean_error(verb + " -ctk q4_0", {"-ctk/--cache-type-k q4_0", "accepted: f32, f16, bf16, q8_0"});
    require_clean_error(verb + " -ctv q5_1", {"-ctv/--cache-type-v q5_1", "accepted: f32, f16, bf16, q8_0"});
    require_clean_error(verb + " -ctk f16 -ctv f32", {"-ctv/--cache-type-v f32", "differs from -ctk"});
    require_clean_error(verb + " --kv-dtype f32 -ctk f16", {"-ctk/--cache-type-k f16", "differs from --kv-dtype"});
  }
  CHECK(shardwise_cli("run -m " + m + " -p hi -n 2 -ctk f32 -ctv f32 --device cpu").rc == 0);
  // -ctk/-ctv name the KV cache type as --kv-dtype does.
  const auto ctk = run_json("run -m " + m + " -p hi -n 2 -ctk f16 -ctv f16 --device cpu");
  CHECK(ctk["kv_dtype"] == "f16");
  // tokenize (llama-tokenize's -m -p -f), logits and plan take the short forms too.
  const Result t1 = shardwise_cli("tokenize -m " + m + " -p 'Hello world' --ids");
  const Result t2 = shardwise_cli("tokenize --model " + m + " --text 'Hello world' --ids");
  REQUIRE(t1.rc == 0);
  CHECK(t1.out == t2.out);
  CHECK(shardwise_cli("tokenize -m " + m + " -f " + quote(file) + " --ids").rc == 0);
  const std::string npy = temp_path("llama_logits.npy");
  CHECK(shardwise_cli("logits -m " + m + " --tokens 1,2 -t 1 --out " + quote(npy)).rc == 0);
  const Result p1 = shardwise_cli("plan -m nemo8b --hw cli3 --vram-budget 4G -c 1024 -t 4 --json");
  const Result p2 = shardwise_cli("plan --model nemo8b --hw cli3 --vram-budget 4G --ctx-size 1024 --threads 4 --json");
  REQUIRE(p1.rc == 0);
  REQUIRE(p2.rc == 0);
  CHECK(nlohmann::json::parse(p1.out)["ctx"] == 1024);
  CHECK(nlohmann::json::parse(p1.out)["threads"] == 4);
  CHECK(nlohmann::json::parse(p1.out)["tiers"] == nlohmann::json::parse(p2.out)["tiers"]);
}

TEST_CASE("cli: llama.cpp's multi-letter flags are rewritten before parsing", "[cli][llama]") {
  using shardwise::cli::rewrite_llama_flags;
  CHECK(rewrite_llama_flags({"run", "-ngl", "10", "-no-cnv", "-fa", "-ctk", "f32", "-ctv", "f32"}) ==
        std::vector<std::string>{"run", "--n-gpu-layers", "10", "--no-cnv", "--flash-attn", "--cache-type-k", "f32",
                                 "--cache-type-v", "f32"});
  // A value after "--", and words that only contain a flag, are left alone.
  CHECK(rewrite_llama_flags({"run", "-p", "-ngly", "--", "-ngl"}) ==
        std::vector<std::string>{"run", "-p", "-ngly", "--", "-ngl"});
}

TEST_CASE("cli: parse errors are one line naming the flag, with the nearest valid option", "[cli][bad_input]") {
  const std::string m = quote(llama_gguf());
  // The exact line for a typo.
  const Result typo = shardwise_cli("run --modle " + m + " -p hi");
  CHECK(typo.rc == 1);
  CHECK(typo.err == "error: run: unknown option --modle; did you mean --model?\n");
  require_clean_error("plan --model nemo8b --hw cli3 --vram-budge 4G",
                      {"plan: unknown option --vram-budge", "did you mean --vram-budget?"});
  require_clean_error("run --model " + m + " -p hi --top_k 4", {"did you mean --top-k?"});
  // Far from every option: no guess, but the verbs that have it.
  require_clean_error("plan --model nemo8b --prompt hi", {"plan: unknown option --prompt", "an option of run"});
  require_clean_error("tokenize -m " + m + " -p hi -ngl 10",
                      {"tokenize: unknown option -ngl", "an option of run, plan"});
  require_clean_error("rnu --model x", {"unknown verb 'rnu'; did you mean run?"});
  require_clean_error("", {"give a verb", "run", "plan"});
  // CLI11's own errors (exit codes 104-114 before): exit 1, one line, the verb and the flag named.
  require_clean_error("run --model " + m + " -p hi --ctx abc", {"run: --ctx: 'abc' is not a whole number"});
  require_clean_error("run --model " + m + " -p hi --temp hot", {"run: --temp: 'hot' is not a number"});
  require_clean_error("run --model", {"run: --model needs a value"});
  require_clean_error("run -p hi", {"run: --model is required"});
  require_clean_error("plan --model nemo8b --hw cli3 --vram-budget 4G extra", {"plan: unexpected argument", "extra"});
  require_clean_error("run --model " + m + " -p hi --greedy 3", {"unexpected argument", "3"});
  require_clean_error("run --model " + m + " -p hi --log-level loud", {"--log-level: 'loud' is not a level"});
  require_clean_error("--quiet run --model " + m + " -p hi --log-level info", {"excludes"});
  // The distance itself: a swap of neighbours is one edit; a name of two letters gets no guess.
  using shardwise::cli::edit_distance;
  using shardwise::cli::nearest_name;
  CHECK(edit_distance("--modle", "--model") == 1);
  CHECK(edit_distance("--ctx", "--ctx-size") == 5);
  CHECK(nearest_name("--modle", {"--prompt", "--model", "--mode"}) == "--model");
  CHECK(nearest_name("-x", {"-m", "-n"}).empty());
  CHECK(nearest_name("--frobnicate", {"--model", "--prompt"}).empty());
}

TEST_CASE("cli: run refuses what it cannot do instead of doing it silently", "[cli][bad_input]") {
  const std::string m = quote(llama_gguf());
  // -n 0 printed "-1 runs" and a TTFT of 0.
  require_clean_error("run -m " + m + " -p hi -n 0", {"-n 0", "--n-predict must be at least 1"});
  // Negative sizes, short and long forms, run and plan.
  for (const char* ctx : {"--ctx -1", "-c -1"}) {
    require_clean_error("run -m " + m + " -p hi -n 2 " + ctx, {"--ctx -1"});
    require_clean_error(std::string("plan -m nemo8b --hw cli3 --vram-budget 4G ") + ctx, {"--ctx -1"});
  }
  // plan accepts only the KV types run executes.
  for (const char* kv : {"q4_0", "q5_1"})
    require_clean_error(std::string("plan -m nemo8b --hw cli3 --vram-budget 4G --kv-dtype ") + kv,
                        {"--kv-dtype", kv, "accepted: f32, f16, bf16, q8_0"});
  for (const char* kv : {"f32", "f16", "q8_0"})
    CHECK(shardwise_cli(std::string("plan -m nemo8b --hw cli3 --vram-budget 4G --brief --kv-dtype ") + kv).rc == 0);
  // --plan FILE and a --vram-budget other than the table's.
  const std::string tiny = temp_path("llama_flags_tiny.gguf");
  REQUIRE(shardwise_cli("synth --spec tiny_llama --dtype f16 --seed 3 -o " + quote(tiny)).rc == 0);
  const std::string plan = temp_path("llama_flags_plan.json");
  REQUIRE(
      shardwise_cli("plan --model " + quote(tiny) + " --hw h200-host --vram-budget 2M --ctx 64 --save " + quote(plan))
          .rc == 0);
  const std::string with_plan =
      "run --model " + quote(tiny) + " --device emu --plan " + quote(plan) + " --tokens 1,2,3 -n 2 --greedy";
  require_clean_error(with_plan + " --vram-budget 4M", {"--vram-budget 4M", "differs from the budget", "2.0 MiB"});
  CHECK(shardwise_cli(with_plan + " --vram-budget 2M").rc == 0);  // the same budget: no conflict
}

// run/serve/logits --kv-dtype: f16 (run's and serve's default, as llama.cpp's) keeps K and V in half the
// bytes, and says so in run --json; f32, bf16 and q8_0 are selectable (f32 is logits' default); an unknown
// type is one error line.
TEST_CASE("cli: --kv-dtype f16 runs the CPU engine over an f16 KV cache", "[cli][kv_f16]") {
  const std::string m = quote(llama_gguf());
  const std::string args = "run -m " + m + " -p 'Hello world' -n 4 -c 64 -t 1 --ignore-eos --device cpu";
  const auto f32 = run_json(args + " --kv-dtype f32");
  const auto f16 = run_json(args);
  CHECK(f32["kv_dtype"] == "f32");
  CHECK(f16["kv_dtype"] == "f16");
  CHECK(f16["kv_cache_bytes"].get<uint64_t>() * 2 == f32["kv_cache_bytes"].get<uint64_t>());
  CHECK(f16["generated_ids"].size() == 4);
  const auto bf16 = run_json(args + " -ctk bf16 -ctv bf16");
  CHECK(bf16["kv_dtype"] == "bf16");
  CHECK(bf16["kv_cache_bytes"] == f16["kv_cache_bytes"]);
  // q8_0 needs each head's row in whole blocks of 32: the llama fixture's head_dim of 16 is one error
  // line naming it.
  require_clean_error(args + " --kv-dtype q8_0", {"q8_0", "head_dim is 16", "multiple of 32"});
  for (const char* verb : {"run -p hi", "serve"})
    require_clean_error(std::string(verb) + " -m " + m + " --device cpu --kv-dtype q9",
                        {"--kv-dtype q9", "accepted: f32, f16, bf16, q8_0"});
  const std::string npy = temp_path("kv_f16_logits.npy");
  require_clean_error("logits -m " + m + " --tokens 1,2 --out " + quote(npy) + " --kv-dtype q9",
                      {"--kv-dtype q9", "accepted: f32, f16, bf16, q8_0"});
  CHECK(shardwise_cli("logits -m " + m + " --tokens 1,2,3 --out " + quote(npy) + " --kv-dtype f16").rc == 0);
  const Result help = shardwise_cli("run --help");
  CHECK(help.out.find("--kv-dtype") != std::string::npos);
  // The emulated device keeps f16 caches too: the CPU engine's greedy tokens, and the plan's type reported.
  const std::string moe = quote(fixture("hf/qwen3moe_nonorm"));
  const std::string greedy = "run --model " + moe + " --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 --kv-dtype f16";
  const auto cpu = run_json(greedy + " --device cpu");
  const auto dev = run_json(greedy + " --device emu --vram-budget 3M");
  CHECK(dev["kv_dtype"] == "f16");
  CHECK(dev["kv_cache_bytes"] == cpu["kv_cache_bytes"]);
  CHECK(dev["generated_ids"] == cpu["generated_ids"]);
  // A q8_0 cache (tiny_moe: head_dim 32) keeps 34 bytes per 32 values, 17/64 of f32's, on the CPU and on
  // the emulated device alike, with the same greedy tokens, and run --json says q8_0.
  const std::string q8 = "run --model 'synthetic:tiny_moe?seed=2' --tokens 1,2,3,4,5 -n 6 --greedy --threads 2 -c 64";
  const auto q8_f32 = run_json(q8 + " --device cpu --kv-dtype f32");
  const auto q8_cpu = run_json(q8 + " --device cpu -ctk q8_0 -ctv q8_0");
  const auto q8_dev = run_json(q8 + " --device emu --vram-budget 3M --kv-dtype q8_0");
  CHECK(q8_cpu["kv_dtype"] == "q8_0");
  CHECK(q8_dev["kv_dtype"] == "q8_0");
  CHECK(q8_cpu["kv_cache_bytes"].get<uint64_t>() * 64 == q8_f32["kv_cache_bytes"].get<uint64_t>() * 17);
  CHECK(q8_dev["kv_cache_bytes"] == q8_cpu["kv_cache_bytes"]);
  CHECK(q8_dev["generated_ids"] == q8_cpu["generated_ids"]);
}

TEST_CASE("cli: a model without a vocabulary prints its generated ids, never raw bytes", "[cli]") {
  // tiny_llama's 256 tokens hold no vocabulary: its pieces were raw bytes, NULs among them.
  const std::string args = "run --model 'synthetic:tiny_llama?seed=2' --tokens 1,2,3 -n 12 --greedy --device cpu";
  const Result r = shardwise_cli(args);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find('\0') == std::string::npos);
  CHECK(r.out.find_first_not_of("0123456789 \n") == std::string::npos);
  CHECK_THAT(r.err, Contains("printing token ids"));
  const auto j = run_json(args);
  CHECK_FALSE(j.contains("text"));
  std::string ids;
  for (const auto& id : j["generated_ids"]) ids += std::to_string(id.get<int>()) + " ";
  CHECK(r.out == ids + "\n");
}

TEST_CASE("cli: without --seed a seed is drawn and recorded, and --seed repeats the run", "[cli]") {
  const std::string args = "run -m " + quote(llama_gguf()) + " -p 'Hello world' -n 16 --ignore-eos --device cpu";
  const auto a = run_json(args), b = run_json(args);
  CHECK(a["sampling"]["seed_given"] == false);
  CHECK(a["seed"] != b["seed"]);  // the same seed twice in 2^32 draws: not in this test's lifetime
  const auto again = run_json(args + " --seed " + std::to_string(a["seed"].get<uint64_t>()));
  CHECK(again["generated_ids"] == a["generated_ids"]);
  CHECK(again["sampling"]["seed_given"] == true);
  const Result text = shardwise_cli(args);
  REQUIRE(text.rc == 0);
  CHECK_THAT(text.err, Contains("seed = ") && Contains("--seed repeats the run"));
}

TEST_CASE("cli: run --json records what repeats the run", "[cli][runtime]") {
  const std::string moe = quote(fixture("hf/qwen3moe_nonorm"));
  const std::string base = "run --model " + moe + " --tokens 1,2,3,4 -n 3 --threads 2 --device emu --vram-budget 3M";
  const auto j = run_json(base + " --hw cli3 --seed 11 --temp 0.5 --top-k 7 --top-p 0.8");
  CHECK(j["sampling"] == nlohmann::json({{"greedy", false},
                                         {"temperature", 0.5},
                                         {"top_k", 7},
                                         {"top_p", 0.8},
                                         {"min_p", 0.05},
                                         {"repeat_penalty", 1.0},
                                         {"repeat_last_n", 64},
                                         {"seed", 11},
                                         {"seed_given", true}}));
  CHECK(j["cost_model"]["hw"] == "cli3");
  CHECK(j["cost_model"]["hw_builtin"] == true);
  CHECK(is_hex16(j["cost_model"]["hw_hash"]));
  CHECK(j["budget_bytes"] == 3 << 20);
  CHECK(j["schedule_requested"] == "auto");
  REQUIRE(j["schedules"].is_object());
  CHECK(!j["schedules"].empty());
  CHECK(j["prompt_ids"] == nlohmann::json({1, 2, 3, 4}));
  REQUIRE(j["revision"].is_string());
  CHECK(!j["revision"].get<std::string>().empty());
  // A machine file: the hash is of its text, wherever it lies.
  const std::string cli3 = read_file(fixtures_dir() + "/../../configs/hardware/cli3.yaml");
  const std::string same = temp_path("same_cli3.yaml"), other = temp_path("other_cli3.yaml");
  write_file(same, cli3);
  write_file(other, cli3 + "\n# another machine\n");
  const auto js = run_json(base + " --hw " + quote(same)), jo = run_json(base + " --hw " + quote(other));
  CHECK(js["cost_model"]["hw"] == same);
  CHECK(js["cost_model"]["hw_builtin"] == false);
  CHECK(is_hex16(jo["cost_model"]["hw_hash"]));
  CHECK(js["cost_model"]["hw_hash"] != jo["cost_model"]["hw_hash"]);
  CHECK(run_json(base + " --hw " + quote(same) + " --greedy")["cost_model"] == js["cost_model"]);
  // A saved table: its path and hash instead of a cost model.
  const std::string plan = temp_path("repeat_plan.json");
  REQUIRE(shardwise_cli("plan --model " + moe + " --hw cli3 --vram-budget 3M --ctx 64 --save " + quote(plan)).rc == 0);
  const auto jp = run_json("run --model " + moe + " --tokens 1,2,3,4 -n 3 --device emu --plan " + quote(plan));
  CHECK(jp["plan"] == plan);
  CHECK(is_hex16(jp["plan_hash"]));
  CHECK_FALSE(jp.contains("cost_model"));
  // On the CPU nothing is planned.
  CHECK_FALSE(run_json("run --model " + moe + " --tokens 1,2 -n 2 --device cpu").contains("cost_model"));
}

TEST_CASE("cli: a budget over the GPU's memory is refused, naming it", "[cli]") {
  using shardwise::cli::gpu_budget_error;
  const uint64_t gib = 1ull << 30;
  CHECK(gpu_budget_error("--vram-budget 80G", 80 * gib, 80 * gib, "NVIDIA H100").empty());
  const std::string e = gpu_budget_error("--vram-budget 200G", 200 * gib, 80 * gib, "NVIDIA H100");
  CHECK_THAT(e, Contains("--vram-budget 200G") && Contains("NVIDIA H100: 80.0 GiB") && Contains("at most"));
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("cli: report and sweep refuse input that gives no result", "[cli][bad_input]") {
  const std::string out = quote(temp_path("report_out"));
  require_clean_error("report " + quote(temp_dir()) + " --out " + out, {"is a directory", "shardwise sweep --out"});
  const std::string text = temp_path("not_results.txt");
  write_file(text, "hello\n");
  require_clean_error("report " + quote(text) + " --out " + out, {"not_results.txt: holds no result rows"});
  require_clean_error("report " + quote(temp_path("no_results.jsonl")) + " --out " + out, {"no such file"});
  // A sweep whose configurations are all dropped said "complete" and exited 0.
  const std::string yaml = temp_path("all_dropped.yaml"), rows = temp_path("all_dropped.jsonl");
  write_file(yaml,
             "name: all_dropped\nhardware: cli3\nmodels: [\"synthetic:tiny_llama\"]\nbudgets: [1G]\nctx: [64]\n"
             "threads: [1]\npcie_caps: [none]\ntiers: [1]\nfilters: {budget_below_model: true}\n");
  require_clean_error("sweep " + quote(yaml) + " --device emu --no-progress --out " + quote(rows),
                      {"nothing to measure", "every configuration was dropped", "budget_below_model"});
  require_clean_error("sweep " + quote(yaml) + " --predict", {"nothing to measure"});
  CHECK_FALSE(std::ifstream(rows).good());
  // Dropped by the planner (the plannable filter): the same error, and no empty results file left.
  const std::string small = temp_path("all_unplannable.yaml"), small_rows = temp_path("all_unplannable.jsonl");
  write_file(small,
             "name: all_unplannable\nhardware: cli3\nmodels: [\"synthetic:tiny_llama\"]\nbudgets: [1K]\nctx: [64]\n"
             "threads: [1]\npcie_caps: [none]\ntiers: [1]\nfilters: {plannable: true}\n");
  const Result r = shardwise_cli("sweep " + quote(small) + " --device emu --no-progress --out " + quote(small_rows));
  CHECK(r.rc == 1);
  const auto ls = lines(r.err);
  REQUIRE(!ls.empty());
  CHECK_THAT(ls.back(), StartsWith("error: ") && Contains("nothing to measure") && Contains("plannable"));
  CHECK_FALSE(std::ifstream(small_rows).good());
  // A vision encoder sweep's rows are not the report's: one line naming the table that reads them; the
  // language sweep's CPU probes are refused for it.
  const std::string vision = temp_path("vision_report.yaml"), vision_rows = temp_path("vision_report.jsonl");
  write_file(vision,
             "name: vision_report\nhardware: cli3\nmodels: [\"synthetic:tiny_qwen2vl\"]\nbudgets: [1G]\n"
             "images: [56x56]\nmeasure: {warmup: 0, min_repeats: 1, max_repeats: 1, expensive_repeats: 1}\n");
  require_clean_error("sweep " + quote(vision) + " --device emu --machine-probe on --out " + quote(vision_rows),
                      {"--machine-probe", "vision encoder experiment"});
  REQUIRE(shardwise_cli("sweep " + quote(vision) + " --device emu --no-progress --out " + quote(vision_rows)).rc == 0);
  require_clean_error("report " + quote(vision_rows) + " --out " + out,
                      {"a vision encoder sweep", "vision_sweep_table.py"});
}

TEST_CASE("cli: --quiet and --log-level are options of every verb, before or after it", "[cli]") {
  for (const std::string& verb : every_verb()) {
    INFO(verb);
    // Known to the verb: a bad level is that option's error, never an unknown option.
    require_clean_error(verb + " --log-level loud", {"--log-level: 'loud'"});
    require_clean_error("--log-level loud " + verb, {"--log-level: 'loud'"});
    CHECK(shardwise_cli(verb + " --quiet --help").rc == 0);
  }
  // What they do: the run's statistics, synth's and logits' notes are information.
  const std::string m = quote(llama_gguf());
  const std::string run = "run -m " + m + " -p hi -n 2 --device cpu";
  CHECK_THAT(shardwise_cli(run).err, Contains("TTFT"));
  for (const std::string& args : {run + " --quiet", "--quiet " + run, run + " --log-level warn",
                                  "synth --spec tiny_llama -o " + quote(temp_path("quiet.gguf")) + " --quiet",
                                  "logits -m " + m + " --tokens 1 --out " + quote(temp_path("q.npy")) + " --quiet"}) {
    const Result r = shardwise_cli(args);
    INFO(args);
    CHECK(r.rc == 0);
    CHECK(r.err.empty());
  }
  CHECK_THAT(shardwise_cli(run + " --log-level debug").err, Contains("debug: phase"));
}

TEST_CASE("cli: plan --explain prints runs of identical layers once, and every layer is covered", "[cli]") {
  // qwen30b at 4G on cli3: the first layers' FFNs pinned, the rest split: two groups, 48 layers in all.
  const Result r = shardwise_cli("plan --model qwen30b --hw cli3 --vram-budget 4G --ctx 4096 --threads 16 --explain");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  std::istringstream lines(r.out);
  std::string line;
  int64_t covered = 0, ffn_rows = 0;
  while (std::getline(lines, line)) {
    int a = -1, b = -1;
    char part[16] = {0};
    if (std::sscanf(line.c_str(), "  L%d-%d.%15s", &a, &b, part) == 3 && std::string(part) == "ffn") {
      covered += b - a + 1;
      ++ffn_rows;
    } else if (std::sscanf(line.c_str(), "  L%d.%15s", &a, part) == 2 && std::string(part) == "ffn") {
      covered += 1;
      ++ffn_rows;
    }
  }
  CHECK(covered == 48);
  CHECK(ffn_rows >= 2);
  CHECK(ffn_rows < 10);
  CHECK_THAT(r.out, Contains("step time"));
}

TEST_CASE("cli: run on a device prints each tier's measured plan-run time beside the prediction", "[cli][runtime]") {
  const Result r = shardwise_cli(
      "run --model synthetic:tiny_llama --tokens 1,2,3,4,5,6,7,8,9,10,11,12 -n 6 --greedy --device emu "
      "--vram-budget 64M");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.err, Contains("measured ms  predicted ms"));
  // The prompt's tier ran one step, decode the other five.
  std::istringstream lines(r.err);
  std::string line;
  int64_t steps = 0;
  while (std::getline(lines, line)) {
    long long tier = 0, n = 0, runs = 0;
    char sched[32] = {0};
    double measured = 0, predicted = 0;
    if (std::sscanf(line.c_str(), " %lld %31s %lld %lld %lf %lf", &tier, sched, &n, &runs, &measured, &predicted) ==
        6) {
      steps += n;
      CHECK(measured > 0);
      CHECK(predicted > 0);
    }
  }
  CHECK(steps == 6);
}

TEST_CASE("cli: run on CUDA without --profile plans with the builtin machine of the GPU it finds", "[cli]") {
  CHECK(cli::builtin_machine_for_gpu("NVIDIA H200") == "h200-host");
  CHECK(cli::builtin_machine_for_gpu("NVIDIA GeForce RTX 5090") == "cli3");
  CHECK(cli::builtin_machine_for_gpu("nvidia geforce rtx 5070 ti") == "cli2");
  CHECK(cli::builtin_machine_for_gpu("NVIDIA GeForce RTX 5070").empty());  // not the Ti of cli2
  CHECK(cli::builtin_machine_for_gpu("NVIDIA H100 80GB HBM3").empty());
  CHECK(cli::builtin_machine_for_gpu("").empty());
}

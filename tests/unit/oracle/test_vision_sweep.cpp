// Tests for the oracle's vision encoder experiments (an experiment with `images`, oracle/vision_sweep.h):
// the file's fields and errors, the configurations, and a sweep on the emulated device — each schedule's
// plan as it ran, the planner's choice, infeasible rows with their reason, the peak within the budget —
// resumed without measuring a row twice.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "executor/device/vision_kernels.h"
#include "oracle/experiment.h"
#include "oracle/results.h"
#include "oracle/vision_sweep.h"
#include "test_util.h"
#include "vision/encoder.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

std::string fixture_vl() {
  return test::fixtures_dir() + "/vl/qwen2_5_vl";
}

// The HF fixture (a 4-block tower) and a synthetic tiny tower, three budgets and two image sizes.
std::string vision_yaml() {
  return "name: v\nhardware: h200-host\nmodels:\n  - name: hf\n    weights: " + fixture_vl() +
         "\n  - name: synth\n    weights: \"synthetic:tiny_qwen2vl?seed=3\"\n"
         "budgets: [1G, 10M, 100K]\nimages: [56x56, 224x168]\n"
         "measure: {warmup: 0, min_repeats: 2, max_repeats: 2}\n";
}

std::string error_of(const std::string& text) {
  try {
    parse_experiment_text(text, "v.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<json> rows_of(const std::string& path) {
  return read_results(path).rows;
}

}  // namespace

TEST_CASE("vision experiment: images make the encoder's experiment, its fields checked", "[oracle][vision]") {
  const Experiment e = parse_experiment_text(vision_yaml(), "v.yaml");
  REQUIRE(e.vision());
  REQUIRE(e.images.size() == 2);
  CHECK(e.images[1].width == 224);
  CHECK(e.images[1].height == 168);
  CHECK(e.models.size() == 2);
  CHECK(json::parse(e.effective_json())["images"] == json({"56x56", "224x168"}));

  // A language experiment's effective config has no `images` (its hash is what it was).
  const std::string lang =
      "name: t\nhardware: cli3\nmodels: [\"synthetic:tiny_llama?dtype=f16\"]\nbudgets: [2M]\nctx: [64]\n"
      "threads: [1]\npcie_caps: [none]\ntiers: [1]\n";
  CHECK_FALSE(json::parse(parse_experiment_text(lang, "t.yaml").effective_json()).contains("images"));

  const std::string base = vision_yaml();
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK_THAT(error_of(base + "ctx: [64]\n"), Contains("v.yaml: ctx: does not apply to a vision encoder experiment"));
  CHECK_THAT(error_of(base + "pcie_caps: [none]\n"), Contains("pcie_caps: does not apply"));
  CHECK_THAT(error_of(replaced("224x168", "224")), Contains("images[1]") && Contains("WIDTHxHEIGHT"));
  CHECK_THAT(error_of(replaced("224x168", "0x168")), Contains("images[1]"));
  CHECK_THAT(error_of(replaced("224x168", "56x56")), Contains("images[1]") && Contains("appears twice"));
  CHECK_THAT(error_of(replaced("[56x56, 224x168]", "[]")), Contains("images: must not be empty"));
  CHECK_THAT(error_of(replaced("100K", "\"25%\"")), Contains("budgets[2]") && Contains("are sizes"));
  CHECK_THAT(error_of(replaced("tiny_qwen2vl", "tiny_llama")),
             Contains("models[1].weights") && Contains("has no vision tower"));
  CHECK_THAT(error_of(replaced(fixture_vl(), test::temp_dir())),
             Contains("models[0].weights") && Contains("neither an HF directory of a vision-language model"));
  CHECK_THAT(error_of(base + "exclude:\n  - ctx: [64]\n"), Contains("exclude[0].ctx") && Contains("unknown field"));
}

TEST_CASE("vision experiment: models x budgets x images minus exclusions, ids per image", "[oracle][vision]") {
  Experiment e = parse_experiment_text(vision_yaml() + "exclude:\n  - {model: synth, budget: 100K}\n", "v.yaml");
  std::vector<std::string> dropped;
  const std::vector<VisionConfiguration> cs = expand_vision_configurations(e, &dropped);
  CHECK(cs.size() == 2 * 3 * 2 - 2);
  CHECK(dropped.size() == 2);
  std::set<std::string> ids;
  for (const auto& c : cs) ids.insert(c.config_id);
  CHECK(ids.size() == cs.size());
  CHECK(cs.front().model_name == "hf");  // model outermost
  CHECK(cs.back().model_name == "synth");
}

TEST_CASE("vision sweep on the emulated device: each schedule's plan, the choice, the peak, resumed",
          "[oracle][vision]") {
  const Experiment e = parse_experiment_text(vision_yaml(), "v.yaml");
  const std::string out = test::temp_path("vision_sweep.jsonl");
  std::filesystem::remove(out);
  SweepOptions o;
  o.out_path = out;
  o.device = "emu";
  o.progress = false;
  const SweepResult r = run_vision_sweep(e, o);
  CHECK(r.complete);
  CHECK(r.configurations == 12);
  CHECK(r.rows_total == 36);
  const std::vector<json> rows = rows_of(out);
  REQUIRE(rows.size() == 36);

  std::map<std::string, std::vector<json>> by_config;
  for (const json& j : rows) by_config[j["config_id"]].push_back(j);
  for (const auto& [id, rs] : by_config) {
    INFO(rs.front().dump());
    REQUIRE(rs.size() == 3);
    int chosen = 0;
    const int64_t depth = rs.front()["blocks"];
    const uint64_t budget = rs.front()["budget_bytes"];
    for (const json& j : rs) {
      chosen += j["chosen"].get<bool>();
      if (j["status"] == "measured") {
        CHECK(j["feasible"] == true);
        CHECK(j["ran_resident_blocks"] == j["resident_blocks"]);
        CHECK(j["device_peak_bytes"].get<uint64_t>() <= budget);
        CHECK(j["within_budget"] == true);
        CHECK(j["repeats"] == 2);
        CHECK(j["measured_ms"].get<double>() > 0);
        const std::string s = j["schedule"];
        CHECK(j["resident_blocks"] == (s == "gpu-only" ? depth : s == "partial" ? depth - 2 : 0));
      } else {
        CHECK(j["status"] == "infeasible");
        CHECK(j["feasible"] == false);
        CHECK_FALSE(j["reason"].get<std::string>().empty());
      }
    }
    const std::string budget_text = rs.front()["budget"];
    if (budget_text == "100K") {  // nothing fits: three infeasible rows, no choice
      CHECK(chosen == 0);
      for (const json& j : rs) CHECK_THAT(j["reason"].get<std::string>(), Contains("needs at least"));
    } else {  // 1G and 10M hold the whole tower: gpu-only is the choice
      CHECK(chosen == 1);
      for (const json& j : rs) CHECK(j["chosen"] == (j["schedule"] == "gpu-only"));
    }
  }

  // Resumed: nothing measured again; another experiment into the same file is refused.
  o.resume = true;
  const SweepResult again = run_vision_sweep(e, o);
  CHECK(again.rows_written == 0);
  CHECK(again.rows_present == 36);
  CHECK(rows_of(out).size() == 36);
  Experiment other = parse_experiment_text(vision_yaml() + "description: other\n", "v.yaml");
  CHECK_THROWS_WITH(run_vision_sweep(other, o), Contains("written by a different experiment"));
  o.resume = false;
  CHECK_THROWS_WITH(run_vision_sweep(e, o), Contains("already holds results"));

  // An image the processor refuses: one error naming the file, the model and the image.
  std::string small = vision_yaml();
  small.replace(small.find("56x56"), 5, "20x20");
  o.out_path = test::temp_path("vision_small.jsonl");
  o.predict_only = true;
  CHECK_THROWS_WITH(run_vision_sweep(parse_experiment_text(small, "v.yaml"), o),
                    Contains("v.yaml: hf at 20x20: ") && Contains("at least 28"));
  // --predict writes a new file.
  o.out_path = out;
  CHECK_THROWS_WITH(run_vision_sweep(e, o), Contains("--predict writes a new file"));
  // Planned for CUDA without a GPU at hand: the CUDA kernels' workspace (f32 matrices: the least of it).
  o.device = "cuda";
  o.out_path = test::temp_path("vision_cuda_predict.jsonl");
  std::filesystem::remove(o.out_path);
  run_vision_sweep(e, o);
  int planned = 0;
  std::ifstream predictions(o.out_path);
  for (std::string line; std::getline(predictions, line);) {
    const json j = json::parse(line);
    if (j.value("record", "") != "prediction" || j["feasible"] != true) continue;
    ++planned;
    CHECK(j["workspace_bytes"] == vision_aligned_bytes(cuda_vision_workspace(DType::F32).min_bytes));
  }
  CHECK(planned > 0);
}

TEST_CASE("vision sweep: a budget between streamed and gpu-only makes partial the choice", "[oracle][vision]") {
  // The fixture's tower planned at a budget found from its own plans: room for every block but one.
  const Experiment probe = parse_experiment_text(vision_yaml(), "v.yaml");
  SweepOptions o;
  o.device = "emu";
  o.progress = false;
  o.predict_only = true;
  o.out_path = test::temp_path("vision_predict.jsonl");
  std::filesystem::remove(o.out_path);
  run_vision_sweep(probe, o);
  uint64_t gpu_only = 0, block = 0;
  int64_t depth = 0;
  std::ifstream in(o.out_path);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j["model"] != "hf" || j["budget"] != "1G" || j["image"] != "56x56") continue;
    CHECK(j["record"] == "prediction");
    depth = j["blocks"];
    if (j["schedule"] == "gpu-only") gpu_only = j["vram_bytes"];
    if (j["schedule"] == "streamed") block = (gpu_only - j["vram_bytes"].get<uint64_t>()) / (depth - 2);
  }
  REQUIRE(depth == 4);
  REQUIRE(block > 0);
  const uint64_t budget = gpu_only - block;  // three blocks' room: one resident, two slots
  const std::string text = "name: p\nhardware: h200-host\nmodels:\n  - name: hf\n    weights: " + fixture_vl() +
                           "\nbudgets: [" + std::to_string(budget) + "B]\nimages: [56x56]\n" +
                           "measure: {warmup: 0, min_repeats: 1, max_repeats: 1, expensive_repeats: 1}\n";
  const Experiment e = parse_experiment_text(text, "p.yaml");
  o.predict_only = false;
  o.out_path = test::temp_path("vision_partial.jsonl");
  std::filesystem::remove(o.out_path);
  run_vision_sweep(e, o);
  std::map<std::string, json> by;
  for (const json& j : rows_of(o.out_path)) by[j["schedule"]] = j;
  REQUIRE(by.size() == 3);
  CHECK(by["gpu-only"]["status"] == "infeasible");
  CHECK_THAT(by["gpu-only"]["reason"].get<std::string>(), Contains("every block resident needs"));
  CHECK(by["partial"]["chosen"] == true);
  CHECK(by["partial"]["resident_blocks"] == 1);
  CHECK(by["partial"]["status"] == "measured");
  CHECK(by["streamed"]["resident_blocks"] == 0);
  CHECK(by["streamed"]["status"] == "measured");
  CHECK(by["streamed"]["planner_choice"] == "partial");
}

// Tests for the oracle's experiment files: every field error names the file and the field; the
// cartesian product with exclusions and filters; config_id stability; the measurement statistics.
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <sstream>

#include "core/error.h"
#include "oracle/experiment.h"
#include "oracle/sweep.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

const char* kBase = R"(name: t
hardware: cli3
models:
  - name: a
    weights: "synthetic:tiny_llama?dtype=f16&seed=1"
  - name: b
    weights: "synthetic:tiny_moe?dtype=q8_0&seed=2"
budgets: [2M, 4M, "150%"]
ctx: [64, 128]
threads: [1, 2]
pcie_caps: [16GB/s, none]
tiers: [1, 16]
)";

Experiment parse(const std::string& text) {
  return parse_experiment_text(text, "exp.yaml");
}

// The error message of parsing `text`, "" when it parses.
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// kBase with one top-level field (and its indented block) replaced, added, or removed (value "").
std::string edit(const std::string& key, const std::string& value, bool remove = false) {
  std::string out;
  bool skipping = false, replaced = false;
  std::istringstream in(kBase);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      if (!remove) out += key + ": " + value + "\n";
      replaced = skipping = true;
      continue;
    }
    if (skipping && !line.empty() && line[0] == ' ') continue;
    skipping = false;
    out += line + "\n";
  }
  if (!replaced && !remove) out += key + ": " + value + "\n";
  return out;
}
std::string with(const std::string& key, const std::string& value) {
  return edit(key, value);
}

}  // namespace

TEST_CASE("experiment: a valid file parses with defaults filled in", "[oracle]") {
  const Experiment e = parse(kBase);
  CHECK(e.name == "t");
  CHECK(e.models.size() == 2);
  CHECK(e.budgets.size() == 3);
  CHECK(e.budgets[2].fraction == Approx(1.5));
  CHECK(e.ctxs == std::vector<int64_t>{64, 128});
  CHECK(e.caps[0].bytes_per_s == Approx(16e9));
  CHECK(e.caps[1].bytes_per_s == 0);
  // Default schedules: the three and the two baselines.
  CHECK(e.schedules.size() == 5);
  CHECK(e.measure.warmup == 1);
  CHECK(e.filters.plannable);
  CHECK(e.hash() == parse(kBase).hash());
  CHECK(e.hash() != parse(with("tiers", "[1, 4]")).hash());
  // The effective config is JSON with every field.
  CHECK_THAT(e.effective_json(), Contains("\"max_step_ms\""));
  // Measurement rounds: one unless given; one round written as before rounds existed (same hash).
  CHECK(e.measure.rounds == 1);
  CHECK_THAT(e.effective_json(), !Contains("rounds"));
  const Experiment two = parse(with("measure", "{rounds: 2}"));
  CHECK(two.measure.rounds == 2);
  CHECK(two.hash() != parse(with("measure", "{rounds: 1}")).hash());
  CHECK(parse(with("measure", "{rounds: 1}")).hash() == parse(with("measure", "{warmup: 1}")).hash());
}

TEST_CASE("experiment: every field error names the file and the field", "[oracle]") {
  struct Case {
    std::string text, field, what;
  };
  const std::vector<Case> cases = {
      {"name: [unclosed", "exp.yaml", "malformed YAML"},
      {"- a\n- b\n", "exp.yaml", "mapping"},
      {with("colour", "red"), "colour", "unknown field"},
      {with("hardware", "cli9"), "hardware", "unknown hardware"},
      {with("budgets", "[2M, 4Q]"), "budgets[1]", "4Q"},
      {with("budgets", "[2M, 2M]"), "budgets[1]", "twice"},
      {with("budgets", "[2M, 2048K]"), "budgets[1]", "same budget"},
      {with("budgets", "[]"), "budgets", "must not be empty"},
      {with("ctx", "[64, big]"), "ctx[1]", "big"},
      {with("threads", "[1, 0]"), "threads[1]", "out of range"},
      {with("threads", "[1, two]"), "threads[1]", "whole number"},
      {with("pcie_caps", "[16GB]"), "pcie_caps[0]", "/s"},
      {with("tiers", "[1, 512]"), "tiers[1]", "exceeds ctx"},
      {with("schedules", "[static, fastest]"), "schedules[1]", "fastest"},
      {with("kv_dtype", "q4_0"), "kv_dtype", "f32, f16, bf16 or q8_0"},
      {with("measure", "{min_repeats: 5, max_repeats: 3}"), "measure.max_repeats", "below"},
      {with("measure", "{warmup: -1}"), "measure.warmup", "out of range"},
      {with("measure", "{repeats: 3}"), "measure.repeats", "unknown field"},
      {with("measure", "{rounds: 0}"), "measure.rounds", "out of range"},
      {with("filters", "{budget_below_model: maybe}"), "filters.budget_below_model", "true or false"},
      {with("exclude", "[{model: c}]"), "exclude[0].model", "not one of the models"},
      {with("exclude", "[{budget: 3M}]"), "exclude[0].budget", "not one of the budgets"},
      {with("exclude", "[{ctx: 256}]"), "exclude[0].ctx", "not one of"},
      {with("exclude", "[{pcie_cap: 8GB/s}]"), "exclude[0].pcie_cap", "not one of"},
      {with("exclude", "[{schedule: dynamic, colour: red}]"), "exclude[0].colour", "unknown field"},
      {with("exclude", "[{}]"), "exclude[0]", "at least one field"},
      {with("models", "[\"synthetic:nemo9b?dtype=f16\"]"), "models[0].weights", "nemo9b"},
      {with("models", "[\"synthetic:tiny_llama?dtype=f17\"]"), "models[0].weights", "f17"},
      {with("models", "[{name: x}]"), "models[0].weights", "missing"},
      {with("models", "[\"synthetic:tiny_llama\", \"synthetic:tiny_llama?seed=2\"]"), "models[1].name", "twice"},
      {with("models", "[/nonexistent/model.gguf]"), "models[0].weights", "nonexistent"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    const std::string err = error_of(c.text);
    CHECK_THAT(err, StartsWith("exp.yaml: "));
    CHECK_THAT(err, Contains(c.field));
    CHECK_THAT(err, Contains(c.what));
  }
  // Required fields.
  for (const char* key : {"hardware", "models", "budgets", "ctx", "threads", "pcie_caps", "tiers"}) {
    INFO(key);
    CHECK_THAT(error_of(edit(key, "", true)), Contains(std::string("exp.yaml: ") + key + ": missing"));
  }
}

TEST_CASE("experiment: the product with exclusions and filters", "[oracle]") {
  const Experiment e = parse(kBase);
  std::vector<std::string> dropped;
  const auto all = expand_configurations(e, &dropped);
  CHECK(all.size() == 2 * 3 * 2 * 2 * 2);
  CHECK(dropped.empty());
  // Model outermost (each model loaded once), indices consecutive, ids unique.
  std::set<std::string> ids;
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].index == static_cast<int>(i));
    CHECK(all[i].model == (i < all.size() / 2 ? 0 : 1));
    ids.insert(all[i].config_id);
    CHECK(all[i].tiers == std::vector<int64_t>{1, 16});
  }
  CHECK(ids.size() == all.size());
  // A share budget is resolved per model (rounded up to 64 KiB).
  const uint64_t a_bytes = experiment_model_spec(e.models[0].weights).total_bytes();
  CHECK(all[16].budget_text == "150%");
  CHECK(all[16].budget_bytes >= static_cast<uint64_t>(1.5 * static_cast<double>(a_bytes)));
  CHECK(all[16].budget_bytes % (64u << 10) == 0);

  // Config-level exclusions drop configurations; row-level ones drop rows.
  const Experiment x =
      parse(with("exclude",
                 "[{model: b, threads: 2}, {ctx: 128, pcie_cap: none, budget: [2M, 4M]}, "
                 "{schedule: cpu-moe, model: a}, {tier: 16, schedule: [static, dynamic], threads: 1}]"));
  dropped.clear();
  const auto kept = expand_configurations(x, &dropped);
  // b with 2 threads: 12 configs; ctx 128 + no cap + {2M,4M}: 2 models x 2 budgets x 2 threads = 8, of which 2 overlap.
  CHECK(kept.size() == all.size() - 12 - 8 + 2);
  CHECK(dropped.size() == 12 + 8 - 2);
  CHECK_THAT(dropped.front(), Contains("excluded by exclude["));
  for (const auto& c : kept) {
    CHECK_FALSE((c.model_name == "b" && c.threads == 2));
    CHECK(c.row_excluded(1, Schedule::CpuMoe) == (c.model_name == "a"));
    CHECK(c.row_excluded(16, Schedule::Static) == (c.threads == 1));
    CHECK_FALSE(c.row_excluded(1, Schedule::Static));
  }
  // The budget filter drops budgets that hold the whole model.
  const Experiment f = parse(with("filters", "{budget_below_model: true}"));
  dropped.clear();
  const auto small = expand_configurations(f, &dropped);
  for (const auto& c : small) CHECK(c.budget_bytes < experiment_model_spec(c.weights).total_bytes());
  CHECK_FALSE(dropped.empty());
  CHECK_THAT(dropped.front(), Contains("budget_below_model"));
}

TEST_CASE("experiment: config_id is a stable hash of model budget ctx threads and cap", "[oracle]") {
  const std::string w = "synthetic:nemo8b?dtype=f16&seed=1";
  // Golden value (FNV-1a of "model=...;budget_bytes=...;ctx=...;threads=...;pcie_cap_bytes_per_s=..."):
  // changing it invalidates every results file (resume would redo everything).
  CHECK(make_config_id(w, 4ull << 30, 4096, 16, 16e9) == make_config_id(w, 4ull << 30, 4096, 16, 16e9));
  CHECK(make_config_id(w, 4ull << 30, 4096, 16, 16e9) == "674ca5c8da1d4933");
  CHECK(make_config_id(w, 4ull << 30, 4096, 16, 16e9).size() == 16);
  const std::set<std::string> ids = {make_config_id(w, 4ull << 30, 4096, 16, 16e9),
                                     make_config_id(w, 8ull << 30, 4096, 16, 16e9),
                                     make_config_id(w, 4ull << 30, 16384, 16, 16e9),
                                     make_config_id(w, 4ull << 30, 4096, 1, 16e9),
                                     make_config_id(w, 4ull << 30, 4096, 16, 0),
                                     make_config_id("synthetic:nemo8b?dtype=f16&seed=2", 4ull << 30, 4096, 16, 16e9)};
  CHECK(ids.size() == 6);
  // Spelling does not matter, the resolved values do.
  const Experiment a = parse(with("budgets", "[4M]"));
  const Experiment b = parse(with("budgets", "[4096K]"));
  CHECK(expand_configurations(a)[0].config_id == expand_configurations(b)[0].config_id);
  const Experiment c = parse(with("pcie_caps", "[16000MB/s]"));
  CHECK(expand_configurations(c)[0].config_id ==
        expand_configurations(parse(with("pcie_caps", "[16GB/s]")))[0].config_id);
}

TEST_CASE("sweep helpers: median IQR repeats and shard text", "[oracle]") {
  CHECK(median_of({3, 1, 2}) == 2);
  CHECK(median_of({4, 1, 2, 3}) == 2.5);
  CHECK(iqr_of({1, 2, 3, 4, 5}) == Approx(2.0));  // numpy: q75 4, q25 2
  CHECK(iqr_of({1, 3}) == Approx(1.0));
  CHECK(iqr_of({7}) == 0);
  MeasureSettings m;
  m.min_repeats = 3;
  m.expensive_repeats = 2;
  m.row_seconds = 2;
  m.warmup = 1;
  CHECK(planned_repeats(m, 10) == 3);    // cheap: min_repeats
  CHECK(planned_repeats(m, 900) == 3);   // 3 x 0.9 s: row_seconds not yet spent after 2
  CHECK(planned_repeats(m, 1500) == 2);  // expensive: fewer
  CHECK(planned_repeats(m, 60000) == 2);
  CHECK(predicted_row_seconds(m, 1500) == Approx(3 * 1.5));
  int i = -1, n = -1;
  parse_shard("2/4", &i, &n);
  CHECK((i == 2 && n == 4));
  for (const char* bad : {"4/4", "-1/4", "1", "a/b", "1/0", "1/"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_shard(bad, &i, &n), Contains("--shard"));
  }
  CHECK(profile_hash("cli3", 16e9) == profile_hash("cli3", 16e9));
  CHECK(profile_hash("cli3", 16e9) != profile_hash("cli3", 0));
  CHECK(profile_hash("cli3", 0) != profile_hash("cli2", 0));
  CHECK_FALSE(build_git_rev().empty());
}

namespace {
// An experiment of `n` entries in each of budgets, ctx, threads and pcie_caps, and `m` models.
std::string product_yaml(int m, int n) {
  std::ostringstream y;
  y << "name: big\nhardware: cli3\nmodels:\n";
  for (int i = 0; i < m; ++i)
    y << "  - name: m" << i << "\n    weights: \"synthetic:tiny_llama?dtype=f16&seed=" << i + 1 << "\"\n";
  y << "budgets: [";
  for (int i = 0; i < n; ++i) y << (i ? ", " : "") << (i + 2) << "M";
  y << "]\nctx: [";
  for (int i = 0; i < n; ++i) y << (i ? ", " : "") << 64 * (i + 1);
  y << "]\nthreads: [";
  for (int i = 0; i < n; ++i) y << (i ? ", " : "") << i + 1;
  y << "]\npcie_caps: [";
  for (int i = 0; i < n; ++i) y << (i ? ", " : "") << (i + 1) << "GB/s";
  y << "]\ntiers: [1, 16]\n";
  return y.str();
}
}  // namespace

TEST_CASE("experiment: one expanding to too many configurations is refused up front, with its count", "[oracle]") {
  // 10 x 10^4 = 100000: allowed; 11 x 10^4 and 40^5 (a file of a few KB) are not, and fail at once.
  CHECK(parse(product_yaml(10, 10)).models.size() == 10);
  CHECK_THAT(error_of(product_yaml(11, 10)),
             Contains("exp.yaml: the experiment expands to 110000 configurations (models 11 x budgets 10 x "
                      "ctx 10 x threads 10 x pcie_caps 10), more than 100000"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string big = product_yaml(40, 40);
  CHECK(big.size() < 20000);
  CHECK_THAT(error_of(big), Contains("expands to 102400000 configurations") && Contains("several experiment files"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  // More tiers than a plan table has.
  std::string tiers = "[";
  for (int i = 1; i <= 65; ++i) tiers += (i > 1 ? ", " : "") + std::to_string(i);
  std::string many = with("tiers", tiers + "]");
  many.replace(many.find("ctx: [64, 128]"), 14, "ctx: [128]");
  CHECK_THAT(error_of(many), Contains("exp.yaml: tiers: 65 tiers: at most 64"));
}

TEST_CASE("experiment: budgets, contexts and PCIe caps are bounded", "[oracle]") {
  CHECK_THAT(error_of(with("budgets", "[2048T]")), Contains("exp.yaml: budgets[0]") && Contains("1 PiB"));
  CHECK_THAT(error_of(with("pcie_caps", "[1B/s]")), Contains("exp.yaml: pcie_caps[0]") && Contains("100MB/s to 1TB/s"));
  CHECK_THAT(error_of(with("pcie_caps", "[5TB/s]")), Contains("pcie_caps[0]"));
  CHECK_THAT(error_of(with("ctx", "[64, 8000K]")), Contains("exp.yaml: ctx[1]: 8192000 is more than 4194304"));
}

TEST_CASE("experiment: a key given twice is refused, not read as its first value", "[oracle]") {
  CHECK_THAT(error_of(std::string(kBase) + "hardware: cli2\n"),
             Contains("exp.yaml: line ") && Contains("duplicate key 'hardware'"));
  CHECK_THAT(error_of(with("measure", "{warmup: 1, warmup: 3}")), Contains("duplicate key 'measure.warmup'"));
  std::string twice = kBase;
  twice.replace(twice.find("  - name: a\n"), 12, "  - name: a\n    name: c\n");
  CHECK_THAT(error_of(twice), Contains("duplicate key 'models[0].name'"));
}

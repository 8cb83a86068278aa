// Tests for `shardwise sweep` on the emulated device, run as a child process: a sweep killed with
// SIGKILL and resumed has no duplicate and no missing row; --shard i/n partitions the rows;
// --max-minutes stops cleanly between rows; files of another experiment or revision are refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "oracle/experiment.h"
#include "oracle/results.h"
#include "oracle/sweep.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

std::string repo_root() {
  return test::fixtures_dir() + "/../..";
}
std::string smoke_yaml() {
  return repo_root() + "/experiments/smoke.yaml";
}

struct Child {
  int rc = -1;  // exit status; -1: killed by a signal
  std::string out, err;
};

// Starts `shardwise ARGS` with stdout/stderr into files; `env` entries are set in the child.
pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err,
            const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const std::string bin = test::shardwise_bin();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(127);
    for (const auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(bin.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

Child finish(pid_t pid, const std::string& out, const std::string& err) {
  int status = 0;
  waitpid(pid, &status, 0);
  Child c;
  c.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  c.out = test::read_file(out);
  c.err = test::read_file(err);
  return c;
}

Child run(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  static int n = 0;
  const std::string out = test::temp_path("sweep_out_" + std::to_string(n) + ".txt");
  const std::string err = test::temp_path("sweep_err_" + std::to_string(n++) + ".txt");
  return finish(spawn(args, out, err, env), out, err);
}

struct Rows {
  std::vector<json> rows, sweeps, ends;
  int bad = 0;
  std::multiset<std::tuple<std::string, int64_t, std::string>> keys;
};

Rows read_rows(const std::string& path) {
  Rows r;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      ++r.bad;
      continue;
    }
    const std::string kind = j.value("record", "");
    if (kind == "row") {
      r.keys.emplace(j["config_id"].get<std::string>(), j["tier"].get<int64_t>(), j["schedule"].get<std::string>());
      r.rows.push_back(j);
    } else if (kind == "sweep") {
      r.sweeps.push_back(j);
    } else if (kind == "sweep_end") {
      r.ends.push_back(j);
    }
  }
  return r;
}

int count_row_lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"record\":\"row\"") != std::string::npos;
  return n;
}

bool no_duplicates(const Rows& r) {
  return std::set<std::tuple<std::string, int64_t, std::string>>(r.keys.begin(), r.keys.end()).size() == r.keys.size();
}

json summary(const Child& c) {
  INFO("stdout: " << c.out << "\nstderr: " << c.err);
  REQUIRE(c.rc == 0);
  return json::parse(c.out);
}

// A small experiment: one model, 4 configurations, quick on the emulated device.
std::string small_yaml(const std::string& name, const std::string& extra = "") {
  const std::string path = test::temp_path(name + ".yaml");
  test::write_file(
      path, "name: " + name +
                "\nhardware: cli3\nmodels:\n  - name: smoke_llama\n    weights: \"synthetic:" + repo_root() +
                "/experiments/models/smoke_llama.yaml?dtype=f16&seed=1\"\n"
                "budgets: [\"70%\", 10M]\nctx: [64]\nthreads: [1, 2]\npcie_caps: [none]\ntiers: [1, 16]\n"
                "measure: {warmup: 1, min_repeats: 2, max_repeats: 3, row_seconds: 0.05, expensive_repeats: 1}\n" +
                extra);
  return path;
}

}  // namespace

TEST_CASE("sweep: killed with SIGKILL mid-sweep, --resume leaves no duplicate and no missing row", "[oracle][sweep]") {
  const std::string out = test::temp_path("kill.jsonl");
  const std::string o = test::temp_path("kill_stdout.txt"), e = test::temp_path("kill_stderr.txt");
  const pid_t pid = spawn({"sweep", smoke_yaml(), "--device", "emu", "--out", out, "--no-progress"}, o, e);
  // Kill once some rows are in, well before the end.
  bool killed = false;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
    if (count_row_lines(out) >= 40) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) break;  // finished before we could kill it
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const Child first = finish(pid, o, e);
  INFO("stderr of the killed sweep: " << first.err);
  REQUIRE(killed);
  CHECK(first.rc == -1);
  const Rows before = read_rows(out);
  CHECK(no_duplicates(before));
  CHECK(before.ends.empty());  // it never got to finish
  // A write torn by a crash: resume must skip it and keep the next line whole.
  {
    std::ofstream f(out, std::ios::app);
    f << "{\"record\":\"row\",\"config_id\":\"torn";
  }
  const Child second = run({"sweep", smoke_yaml(), "--device", "emu", "--out", out, "--resume", "--no-progress"});
  const json s = summary(second);
  CHECK(s["complete"] == true);
  // The MoE model's routing: measured once, by the first call, recorded in its header and reused.
  CHECK_THAT(second.err, Contains("smoke_moe: routing as measured by an earlier call"));
  CHECK_THAT(second.err, !Contains("smoke_moe: routing measured on"));
  CHECK(s["rows_present"].get<size_t>() == before.rows.size());
  const Rows after = read_rows(out);
  CHECK(after.bad == 1);
  CHECK(no_duplicates(after));
  CHECK(after.rows.size() == s["rows_total"].get<size_t>());
  for (const auto& k : before.keys) CHECK(after.keys.count(k) == 1);
  REQUIRE(after.sweeps.size() == 2);
  const json& routing = after.sweeps[0]["routing"]["smoke_moe"];
  CHECK(routing["tokens"] == json::array({1, 16}));
  CHECK(routing["experts"].size() == 2);
  CHECK(routing == after.sweeps[1]["routing"]["smoke_moe"]);
  CHECK_FALSE(after.sweeps[0]["routing"].contains("smoke_llama"));  // dense: nothing to measure
  // Every §6 key in every row.
  for (const auto& r : after.rows)
    for (const char* key :
         {"config_id", "model", "budget_bytes", "ctx", "threads", "pcie_cap", "tier", "schedule", "predicted_ms",
          "measured_ms", "measured_spread_ms", "vram_bytes", "chosen", "machine", "device", "profile_hash", "git_rev"})
      CHECK(r.contains(key));
  // And a third call has nothing left to do.
  const json again =
      summary(run({"sweep", smoke_yaml(), "--device", "emu", "--out", out, "--resume", "--no-progress"}));
  CHECK(again["rows_written"] == 0);
  CHECK(read_rows(out).rows.size() == after.rows.size());
}

TEST_CASE("sweep: a second writer on one results file is refused, the first one's file untouched", "[oracle][sweep]") {
  const std::string yaml = small_yaml("lock");
  const std::string out = test::temp_path("lock.jsonl");
  // Two writers in one process: the lock is per open file, so the second is refused too.
  {
    ResultsWriter first(out);
    CHECK_THROWS_WITH(ResultsWriter(out), Contains(out) && Contains("another sweep is writing this file"));
  }
  CHECK_NOTHROW(ResultsWriter(out));  // released with its writer
  // A sweep while another process holds the file: refused before any work, one line, nothing written.
  const int fd = ::open(out.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const Child second = run({"sweep", yaml, "--device", "emu", "--out", out, "--resume", "--no-progress"});
  CHECK(second.rc == 1);
  CHECK_THAT(second.err, Contains("error: " + out + ": another sweep is writing this file"));
  CHECK(std::count(second.err.begin(), second.err.end(), '\n') == 1);
  CHECK(test::read_file(out).empty());
  ::close(fd);
  // Once it is free, the same sweep runs.
  CHECK(summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--resume", "--no-progress"}))["complete"] ==
        true);
}

TEST_CASE("sweep: --resume skips a parseable row lacking a field like a torn line, with a warning", "[oracle][sweep]") {
  const std::string yaml = small_yaml("incomplete");
  for (const char* edit : {"drop git_rev", "git_rev a number", "tier a string", "drop profile_hash"}) {
    INFO(edit);
    const std::string out = test::temp_path("incomplete.jsonl");
    std::remove(out.c_str());
    REQUIRE(summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--no-progress"}))["complete"] == true);
    // Edit the third row.
    std::vector<std::string> lines;
    {
      std::ifstream in(out);
      for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    int rows = 0;
    json edited;
    for (auto& l : lines) {
      json j = json::parse(l);
      if (j.value("record", "") != "row" || ++rows != 3) continue;
      const std::string e = edit;
      if (e == "drop git_rev") j.erase("git_rev");
      if (e == "git_rev a number") j["git_rev"] = 5;
      if (e == "tier a string") j["tier"] = std::to_string(j["tier"].get<int64_t>());
      if (e == "drop profile_hash") j.erase("profile_hash");
      edited = j;
      l = j.dump();
    }
    REQUIRE(!edited.is_null());
    {
      std::ofstream f(out, std::ios::trunc);
      for (const auto& l : lines) f << l << "\n";
    }
    const Child again = run({"sweep", yaml, "--device", "emu", "--out", out, "--resume", "--no-progress"});
    const json s = summary(again);
    CHECK_THAT(again.err, Contains("skipped 1 torn, unparsable or incomplete line(s)"));
    CHECK(s["complete"] == true);
    CHECK(s["rows_written"] == 1);  // that row measured again, nothing else
    const ExistingResults r = read_results(out);
    CHECK(r.bad_lines == 1);
    CHECK(r.duplicate_rows == 0);
    CHECK(static_cast<int>(r.rows.size()) == s["rows_total"].get<int>());
  }
}

TEST_CASE("sweep: --shard i/n splits the rows: shards are disjoint and their union is the full sweep",
          "[oracle][sweep]") {
  const std::string yaml = small_yaml("shards");
  const std::string full = test::temp_path("full.jsonl");
  const json sf = summary(run({"sweep", yaml, "--device", "emu", "--out", full, "--no-progress"}));
  CHECK(sf["complete"] == true);
  const Rows all = read_rows(full);
  REQUIRE(all.rows.size() > 8);
  // A configuration's candidates are measured in one set-up: their measured rows share one setup_ms,
  // and each row's arena peak is its own schedule's (within the budget).
  std::map<std::string, std::set<double>> setups;
  std::map<std::string, std::set<std::string>> schedules;
  for (const auto& r : all.rows) {
    if (r["status"] != "measured") continue;
    CHECK(r["arena_peak_bytes"].get<uint64_t>() <= r["budget_bytes"].get<uint64_t>());
    if (r["candidate"] != true) continue;
    setups[r["config_id"].get<std::string>()].insert(r["setup_ms"].get<double>());
    schedules[r["config_id"].get<std::string>()].insert(r["schedule"].get<std::string>());
    CHECK(r["arena_peak_bytes"].get<uint64_t>() > 0);
  }
  int shared_setups = 0;
  for (const auto& [config, times] : setups) {
    CHECK(times.size() == 1);
    shared_setups += schedules[config].size() >= 2;
  }
  CHECK(shared_setups > 0);
  std::multiset<std::tuple<std::string, int64_t, std::string>> joined;
  std::map<std::string, int> shards_of_config;
  const std::string shared = test::temp_path("shared.jsonl");
  for (int i = 0; i < 3; ++i) {
    const std::string part = test::temp_path("shard" + std::to_string(i) + ".jsonl");
    const std::string shard = std::to_string(i) + "/3";
    const json s = summary(run({"sweep", yaml, "--device", "emu", "--out", part, "--shard", shard, "--no-progress"}));
    CHECK(s["complete"] == true);
    const Rows r = read_rows(part);
    std::set<std::string> configs;
    for (const auto& row : r.rows) {
      configs.insert(row["config_id"].get<std::string>());
      CHECK(row["shard"] == shard);
    }
    for (const auto& c : configs) ++shards_of_config[c];
    joined.insert(r.keys.begin(), r.keys.end());
    // Shards may also share one file (each line is one O_APPEND write).
    summary(run({"sweep", yaml, "--device", "emu", "--out", shared, "--shard", shard, "--resume", "--no-progress"}));
  }
  CHECK(joined == all.keys);  // union = full set, and no key twice (disjoint)
  for (const auto& kv : shards_of_config) CHECK(kv.second == 1);
  const Rows sh = read_rows(shared);
  CHECK(sh.keys == all.keys);
  CHECK(no_duplicates(sh));
}

TEST_CASE("sweep: a baseline keeping the KV cache elsewhere than the candidates is measured in a set-up of its own",
          "[oracle][sweep]") {
  // layer-split keeps the KV of its GPU layers in VRAM and the rest on the host, whatever layout the
  // table chose for the candidates; switching the candidates' runtime to it was an error in every such
  // row (the study's layer-split rows of nemo8b).
  const std::string path = test::temp_path("kv_elsewhere.yaml");
  test::write_file(
      path,
      "name: kv_elsewhere\nhardware: cli3\nmodels:\n  - name: smoke_llama\n    weights: \"synthetic:" + repo_root() +
          "/experiments/models/smoke_llama.yaml?dtype=f16&seed=1\"\n"
          "budgets: [12M, 16M, 20M]\nctx: [1024]\nthreads: [1]\npcie_caps: [none]\ntiers: [1, 16]\n"
          "measure: {warmup: 1, min_repeats: 2, max_repeats: 3, row_seconds: 0.05, expensive_repeats: 1}\n");
  const std::string out = test::temp_path("kv_elsewhere.jsonl");
  const json s = summary(run({"sweep", path, "--device", "emu", "--out", out, "--no-progress"}));
  CHECK(s["complete"] == true);
  const Rows all = read_rows(out);
  std::map<std::string, std::set<int>> kv_layers;                  // per configuration, over its measured rows
  std::map<std::string, std::map<bool, std::set<double>>> setups;  // per configuration: candidate? -> setup_ms
  int measured_layer_split = 0;
  for (const auto& r : all.rows) {
    INFO(r.dump());
    CHECK(r["status"] != "error");
    if (r["status"] != "measured") continue;
    const std::string id = r["config_id"].get<std::string>();
    kv_layers[id].insert(r["kv_layers_gpu"].get<int>());
    setups[id][r["candidate"].get<bool>()].insert(r["setup_ms"].get<double>());
    measured_layer_split += r["schedule"] == "layer-split";
  }
  CHECK(measured_layer_split > 0);
  int elsewhere = 0;  // configurations whose measured rows keep the KV in two placements
  for (const auto& [id, counts] : kv_layers) {
    if (counts.size() < 2) continue;
    ++elsewhere;
    CHECK(setups[id][true].size() == 1);  // the candidates share one set-up, the baseline has its own
    REQUIRE(setups[id][false].size() == 1);
    CHECK(*setups[id][false].begin() != *setups[id][true].begin());
  }
  CHECK(elsewhere > 0);  // the premise: some budget here makes layer-split keep the KV elsewhere
}

TEST_CASE("sweep: --max-minutes stops cleanly between rows and --resume completes", "[oracle][sweep]") {
  const std::string yaml = small_yaml("timebox");
  const std::string out = test::temp_path("timebox.jsonl");
  const json s =
      summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--max-minutes", "0.00005", "--no-progress"}));
  CHECK(s["stopped_by_time"] == true);
  CHECK(s["complete"] == false);
  CHECK(s["rows_written"].get<int>() >= 1);
  CHECK(s["rows_left"].get<int>() > 0);
  const Rows part = read_rows(out);
  CHECK(part.bad == 0);  // only whole lines
  REQUIRE(part.ends.size() == 1);
  CHECK(part.ends[0]["stopped_by_time"] == true);
  CHECK(part.rows.size() == s["rows_written"].get<size_t>());
  const json r = summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--resume", "--no-progress"}));
  CHECK(r["complete"] == true);
  const Rows all = read_rows(out);
  CHECK(no_duplicates(all));
  CHECK(all.rows.size() == r["rows_total"].get<size_t>());
}

TEST_CASE("sweep: refuses to mix experiments or revisions in one file and --predict runs nothing", "[oracle][sweep]") {
  const std::string yaml = small_yaml("mix");
  const std::string out = test::temp_path("mix.jsonl");
  summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--no-progress", "--max-minutes", "0.00005"}));
  Child c = run({"sweep", yaml, "--device", "emu", "--out", out, "--no-progress"});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains("--resume"));
  c = run({"sweep", yaml, "--device", "emu", "--out", out, "--resume", "--no-progress"},
          {{"SHARDWISE_GIT_REV", "0123abc"}});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains("revision"));
  const std::string other = small_yaml("mix", "exclude: [{threads: 2}]\n");
  c = run({"sweep", other, "--device", "emu", "--out", out, "--resume", "--no-progress"});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains("different experiment"));
  // Predict: the plan-based running time, nothing run; an --out that exists is refused (it writes a
  // new file of predictions: the next test case).
  const std::string none = test::temp_path("never.jsonl");
  c = run({"sweep", smoke_yaml(), "--device", "emu", "--predict"});
  CHECK(c.rc == 0);
  CHECK_THAT(c.err, Contains("predicted running time"));
  c = run({"sweep", smoke_yaml(), "--device", "emu", "--predict", "--out", out});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains(out + " exists"));
  // Field errors reach the user as one line naming the file and field.
  const std::string bad = test::temp_path("bad.yaml");
  test::write_file(
      bad,
      "name: x\nhardware: cli3\nmodels: [\"synthetic:tiny_llama\"]\nbudgets: [4Q]\nctx: [64]\nthreads: [1]\n"
      "pcie_caps: [none]\ntiers: [1]\n");
  c = run({"sweep", bad, "--device", "emu", "--out", none});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains(bad + ": budgets[0]"));
  c = run({"sweep", smoke_yaml(), "--device", "cpu", "--out", none});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains("cuda or emu"));
  c = run({"report", test::temp_path("missing.jsonl"), "--out", test::temp_path("r")});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains("no such file"));
}

TEST_CASE("sweep: --predict --out re-predicts a study's rows with the routing it recorded", "[oracle][sweep]") {
  // An MoE model: its plans depend on the routing the sweep measures on the weights at its start.
  const std::string yaml = test::temp_path("repredict.yaml");
  test::write_file(
      yaml, "name: repredict\nhardware: cli3\nmodels:\n  - name: smoke_moe\n    weights: \"synthetic:" + repo_root() +
                "/experiments/models/smoke_moe.yaml?dtype=q8_0&seed=1\"\n"
                "budgets: [\"70%\"]\nctx: [64]\nthreads: [1]\npcie_caps: [none, 16GB/s]\ntiers: [1, 16]\n"
                "measure: {warmup: 1, min_repeats: 2, max_repeats: 3, row_seconds: 0.05, expensive_repeats: 1}\n");
  const std::string study = test::temp_path("repredict_study.jsonl"), pred = test::temp_path("repredict_pred.jsonl");
  std::remove(study.c_str());
  std::remove(pred.c_str());
  const json s = summary(run({"sweep", yaml, "--device", "emu", "--out", study, "--no-progress"}));
  REQUIRE(s["complete"] == true);
  const Rows rows = read_rows(study);
  REQUIRE(rows.sweeps.size() == 1);
  REQUIRE(rows.sweeps[0]["routing"].contains("smoke_moe"));
  Child c = run({"sweep", yaml, "--device", "emu", "--predict", "--routing-from", study, "--out", pred});
  INFO(c.err);
  REQUIRE(c.rc == 0);
  CHECK_THAT(c.err, Contains("smoke_moe: routing as measured by an earlier call of " + study));
  std::map<std::tuple<std::string, int64_t, std::string>, json> by_key;
  std::ifstream in(pred);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    CHECK(j["record"] == "prediction");
    CHECK(j.value("measured_ms", json()).is_null());
    by_key[{j["config_id"].get<std::string>(), j["tier"].get<int64_t>(), j["schedule"].get<std::string>()}] = j;
  }
  REQUIRE(by_key.size() == rows.rows.size());  // every row of the experiment, once
  // The same binary with the same routing predicts every row exactly as the sweep did.
  int predicted = 0;
  for (const json& r : rows.rows) {
    const auto it =
        by_key.find({r["config_id"].get<std::string>(), r["tier"].get<int64_t>(), r["schedule"].get<std::string>()});
    REQUIRE(it != by_key.end());
    CHECK(it->second["plan_signature"] == r["plan_signature"]);
    CHECK(it->second["planner_choice"] == r["planner_choice"]);
    CHECK(it->second["feasible"] == r["feasible"]);
    if (!r["predicted_ms"].is_number()) continue;
    CHECK(it->second["predicted_ms"].get<double>() == Approx(r["predicted_ms"].get<double>()).epsilon(1e-12));
    ++predicted;
  }
  CHECK(predicted > 0);
  // A file that recorded no routing for the MoE model: one line naming it and the model.
  c = run({"sweep", yaml, "--device", "emu", "--predict", "--routing-from", pred, "--out",
           test::temp_path("repredict_2.jsonl")});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains(pred + ": no sweep record holds smoke_moe's routing"));
  // A recorded routing no routing of the model can have (more distinct experts than it has): one line.
  {
    std::string text = test::read_file(study);
    const size_t r = text.find("\"experts\":[");
    REQUIRE(r != std::string::npos);
    text.insert(r + std::string("\"experts\":[").size(), "1e300,");
    const size_t close = text.find(']', r + 13 + 6);
    const size_t comma = text.rfind(',', close);
    text.erase(comma, close - comma);  // as many counts as before: the first now 1e300
    const std::string edited = test::temp_path("repredict_edited.jsonl");
    test::write_file(edited, text);
    c = run({"sweep", yaml, "--device", "emu", "--predict", "--routing-from", edited});
    CHECK(c.rc == 1);
    CHECK_THAT(c.err, Contains(edited + ": the routing recorded for smoke_moe has 1e+300 distinct experts"));
  }
  // A recorded guess rate of the next layer's experts outside [0, 1]: one line, not a silent re-measure.
  {
    const std::string text = test::read_file(study);
    const std::regex hits("\"next_layer_hits\":[-0-9.eE+]+");
    REQUIRE(std::regex_search(text, hits));
    const std::string edited = test::temp_path("repredict_hits.jsonl");
    test::write_file(edited, std::regex_replace(text, hits, "\"next_layer_hits\":1.5"));
    c = run({"sweep", yaml, "--device", "emu", "--predict", "--routing-from", edited});
    CHECK(c.rc == 1);
    CHECK_THAT(c.err,
               Contains(edited + ": the routing recorded for smoke_moe guesses 1.5 of the next layer's experts"));
  }
  // The same model name with other weights (seed 2): the study's routing is not theirs.
  {
    std::string other = test::read_file(yaml);
    const size_t at = other.find("seed=1");
    REQUIRE(at != std::string::npos);
    other.replace(at, 6, "seed=2");
    const std::string other_yaml = test::temp_path("repredict_seed2.yaml");
    test::write_file(other_yaml, other);
    c = run({"sweep", other_yaml, "--device", "emu", "--predict", "--routing-from", study});
    CHECK(c.rc == 1);
    CHECK_THAT(c.err, Contains(study + ": no sweep record holds smoke_moe's routing"));
    CHECK_THAT(c.err, Contains("seed=2"));
  }
  const std::string missing = test::temp_path("repredict_missing.jsonl");
  c = run({"sweep", yaml, "--device", "emu", "--predict", "--routing-from", missing});
  CHECK(c.rc == 1);
  CHECK_THAT(c.err, Contains(missing + ": no such file"));
}

TEST_CASE("sweep: measure.rounds measures the candidates round by round, each row over all its rounds",
          "[oracle][sweep]") {
  const std::string yaml = small_yaml("rounds", "schedules: [gpu-only, static, dynamic, layer-split]\n");
  std::string y = test::read_file(yaml);
  const std::string m = "measure: {warmup: 1, min_repeats: 2, max_repeats: 3, row_seconds: 0.05, expensive_repeats: 1}";
  const size_t at = y.find(m);
  REQUIRE(at != std::string::npos);
  y.replace(at, m.size(),
            "measure: {warmup: 1, min_repeats: 4, max_repeats: 4, row_seconds: 10, expensive_repeats: 1, rounds: 2}");
  const std::string b = "budgets: [\"70%\", 10M]";
  REQUIRE(y.find(b) != std::string::npos);
  y.replace(y.find(b), b.size(), "budgets: [15M]");  // where the layer-split baseline fits
  test::write_file(yaml, y);
  const std::string out = test::temp_path("rounds.jsonl");
  std::remove(out.c_str());
  const json s = summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--no-progress"}));
  REQUIRE(s["complete"] == true);
  const Rows rows = read_rows(out);
  CHECK(no_duplicates(rows));
  int candidates = 0, baselines = 0;
  for (const json& r : rows.rows) {
    if (r["status"] != "measured") continue;
    const bool candidate = r["candidate"].get<bool>();
    INFO(r["schedule"] << " tier " << r["tier"]);
    // Candidates: two rounds of 2 repeats (4 / 2), each after its own warm-up step; baselines: one of 4.
    CHECK(r["rounds"] == (candidate ? 2 : 1));
    CHECK(r["warmup_ms"].size() == (candidate ? 2u : 1u));
    CHECK(r["samples_ms"].size() == 4u);
    CHECK(r["repeats"] == 4);
    std::vector<double> v = r["samples_ms"].get<std::vector<double>>();
    std::sort(v.begin(), v.end());
    CHECK(r["measured_ms"].get<double>() == Approx((v[1] + v[2]) / 2));  // the median of all rounds' samples
    (candidate ? candidates : baselines) += 1;
  }
  CHECK(candidates > 0);
  CHECK(baselines > 0);
}

TEST_CASE("sweep: a configuration probed on a disturbed machine waits for it to calm, then is measured",
          "[oracle][sweep]") {
  // The machine probe before each configuration (SweepOptions::probe_machine; here scripted): probed
  // more than calm_slowdown slower than the profile, the sweep pauses and probes again, up to
  // calm_retries times, then measures; a machine that stays slow is measured anyway. Rows record every
  // probe of their configuration; a machine faster than its profile never waits.
  const std::string yaml = small_yaml("calm");
  std::string y = test::read_file(yaml);
  const std::string b = "budgets: [\"70%\", 10M]";
  REQUIRE(y.find(b) != std::string::npos);
  y.replace(y.find(b), b.size(), "budgets: [\"70%\", \"60%\"]");  // four configurations, each with rows to measure
  test::write_file(yaml, y);
  const Experiment e = load_experiment(yaml);
  const std::vector<double> script = {2.0, 1.9, 1.05, 1.1, 2.0, 2.0, 2.0, 2.0, 0.7};
  for (double calm : {0.3, 0.0}) {
    INFO("calm " << calm);
    size_t calls = 0;
    SweepOptions o;
    o.out_path = test::temp_path("calm.jsonl");
    std::remove(o.out_path.c_str());
    o.device = "emu";
    o.progress = false;
    o.probe_machine = [&](int) { return script[std::min(calls++, script.size() - 1)]; };
    o.calm_slowdown = calm;
    o.calm_retries = 3;
    o.calm_pause_s = 0.01;
    const SweepResult r = run_sweep(e, o);
    REQUIRE(r.complete);
    std::vector<std::string> order;
    std::map<std::string, std::vector<double>> probes;
    for (const json& row : read_rows(o.out_path).rows) {
      if (row["status"] != "measured") continue;
      const std::string id = row["config_id"].get<std::string>();
      const auto p = row["machine_probes"].get<std::vector<double>>();
      REQUIRE(!p.empty());
      CHECK(row["machine_slowdown"].get<double>() == p.back());
      if (!probes.count(id))
        order.push_back(id);
      else
        CHECK(probes[id] == p);  // one probe series per configuration
      probes[id] = p;
    }
    REQUIRE(order.size() == 4);
    size_t total = 0;
    for (const auto& id : order) total += probes[id].size();
    CHECK(total == calls);
    if (calm > 0) {
      CHECK(probes[order[0]] == std::vector<double>{2.0, 1.9, 1.05});      // waited twice, measured calm
      CHECK(probes[order[1]] == std::vector<double>{1.1});                 // within 1.3x: at once
      CHECK(probes[order[2]] == std::vector<double>{2.0, 2.0, 2.0, 2.0});  // stayed slow: measured after 3 waits
      CHECK(probes[order[3]] == std::vector<double>{0.7});                 // faster than its profile: at once
    } else {
      for (size_t i = 0; i < order.size(); ++i) CHECK(probes[order[i]] == std::vector<double>{script[i]});
    }
  }
}

TEST_CASE("sweep: --timelines records one more step of each measured row, measured beside its prediction",
          "[oracle][sweep]") {
  // Every measured row names its trace; the trace holds that row's plan run, measured and predicted, with the
  // same actions; the recorded step is not one of the row's samples. A file where the directory should be,
  // and --timelines with --predict, are one-line errors.
  const std::string yaml = small_yaml("timelines", "schedules: [gpu-only, static, dynamic]\n");
  const std::string out = test::temp_path("timelines.jsonl"), dir = test::temp_path("timelines_traces");
  std::remove(out.c_str());
  std::filesystem::remove_all(dir);
  const json s = summary(run({"sweep", yaml, "--device", "emu", "--out", out, "--no-progress", "--timelines", dir}));
  REQUIRE(s["complete"] == true);
  int measured = 0;
  for (const json& r : read_rows(out).rows) {
    if (r["status"] != "measured") {
      CHECK_FALSE(r.contains("timeline"));
      continue;
    }
    ++measured;
    const std::string name = r["timeline"].get<std::string>();
    INFO(name);
    CHECK(name == r["config_id"].get<std::string>() + "_t" + std::to_string(r["tier"].get<int64_t>()) + "_" +
                      r["schedule"].get<std::string>() + ".json");
    CHECK(r["samples_ms"].size() == r["repeats"].get<size_t>());
    const json t = json::parse(test::read_file(dir + "/" + name));
    std::map<std::string, std::multiset<std::string>> actions;  // "(measured)" / "(predicted)" -> labels
    std::map<int, std::string> kind;
    const std::string what =
        "tier " + std::to_string(r["plan_tier"].get<int64_t>()) + ", " + r["schedule"].get<std::string>() + " (";
    for (const json& e : t["traceEvents"])
      if (e["name"] == "process_name") {
        const std::string n = e["args"]["name"].get<std::string>();
        CHECK(n.find(what) != std::string::npos);
        kind[e["pid"].get<int>()] = n.substr(n.find('('));
      }
    for (const json& e : t["traceEvents"])
      if (e["ph"] == "X") actions[kind.at(e["pid"].get<int>())].insert(e["name"].get<std::string>());
    CHECK(actions.size() == 2);
    CHECK(!actions["(measured)"].empty());
    CHECK(actions["(measured)"] == actions["(predicted)"]);
  }
  CHECK(measured > 0);

  const std::string file = test::temp_path("timelines_a_file");
  test::write_file(file, "x");
  const std::string out2 = test::temp_path("timelines2.jsonl");
  std::remove(out2.c_str());
  Child c = run({"sweep", yaml, "--device", "emu", "--out", out2, "--no-progress", "--timelines", file});
  CHECK(c.rc == 1);
  CHECK(c.err.find("--timelines " + file + ": cannot create the directory") != std::string::npos);
  c = run({"sweep", yaml, "--device", "emu", "--predict", "--timelines", dir});
  CHECK(c.rc == 1);
  CHECK(c.err.find("--timelines records measured rows: not with --predict") != std::string::npos);
}

// cli/verb_profile.cpp — `shardwise profile`: measure this machine (microbench/profiler.h) into a
// ProfileDB file, or with --validate FILE measure cases that profile never saw and print predicted
// against measured per op class (--json-out writes the same as JSON), or with --check FILE tell
// whether this machine is the one FILE describes (a few of its rows measured again).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "cli/machine_check.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/log.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "costmodel/profile_db.h"
#include "microbench/profiler.h"
#include "oracle/sweep.h"

namespace shardwise::cli {
namespace {

struct ProfileArgs {
  std::string out, threads, caps = "none", device = "auto", validate, json_out, rescore, check;
  bool quick = false, no_progress = false;
  double tolerance = 0.2;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(item);
  return v;
}

ProfileOptions options_of(const ProfileArgs& a) {
  ProfileOptions o;
  o.quick = a.quick;
  o.device = a.device;
  o.progress = !a.no_progress && log_level() <= LogLevel::Info;
  o.git_rev = build_git_rev();
  for (const std::string& t : split_list(a.threads)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || v < 1 || v > max_cli_threads())
      fail("--threads '", a.threads, "': give thread counts like 1,16, each 1 to ", max_cli_threads(),
           " (4 x the hardware threads)");
    o.threads.push_back(v);
  }
  o.pcie_caps_bytes_per_s.clear();
  for (const std::string& c : split_list(a.caps)) o.pcie_caps_bytes_per_s.push_back(parse_pcie_cap(c, "--pcie-cap"));
  if (o.pcie_caps_bytes_per_s.empty()) o.pcie_caps_bytes_per_s = {0};
  return o;
}

// The measured times of an earlier `--validate --json-out` file, for --rescore.
ProfileOptions::Recorded recorded_validation(const std::string& path) {
  nlohmann::json j;
  const std::string text = read_text_file(path);
  check_json_depth(text, path);
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not JSON (", e.what(), "); give a file written by `profile --validate ... --json-out`");
  }
  if (!j.is_object() || !j.contains("cases") || !j["cases"].is_array())
    fail(path, ": field 'cases' is missing; give a file written by `profile --validate ... --json-out`");
  ProfileOptions::Recorded r;
  auto take = [&](const nlohmann::json& list, const char* field,
                  std::map<std::pair<std::string, std::string>, double>* out) {
    size_t i = 0;
    for (const auto& c : list) {
      if (!c.is_object() || !c.contains("class") || !c["class"].is_string() || !c.contains("case") ||
          !c["case"].is_string() || !c.contains("measured_ms") || !c["measured_ms"].is_number() ||
          !(c["measured_ms"].get<double>() > 0))
        fail(path, ": ", field, "[", i, "] needs 'class', 'case' and a positive 'measured_ms'");
      (*out)[{c["class"].get<std::string>(), c["case"].get<std::string>()}] = c["measured_ms"].get<double>();
      ++i;
    }
  };
  take(j["cases"], "cases", &r.cases);
  if (j.contains("contention") && j["contention"].is_array() && !j["contention"].empty()) {
    if (!j.contains("contention_gbps") || !j["contention_gbps"].is_number() ||
        !(j["contention_gbps"].get<double>() > 0))
      fail(path, ": field 'contention_gbps' must be the positive copy rate the contention cases ran under");
    take(j["contention"], "contention", &r.contention);
    r.contention_gbps = j["contention_gbps"].get<double>();
  }
  return r;
}

void run_profile_verb(const ProfileArgs& a) {
  ProfileOptions o = options_of(a);
  for (const auto& out : {std::make_pair("--out", &a.out), std::make_pair("--json-out", &a.json_out)})
    if (!out.second->empty()) check_output_path(*out.second, out.first);  // before minutes of measuring
  if (!a.rescore.empty() && a.validate.empty()) fail("--rescore needs --validate FILE (the profile to predict from)");
  if (!a.check.empty()) {
    if (!a.validate.empty() || !a.out.empty()) fail("--check runs alone: drop --validate and --out");
    if (!(a.tolerance > 0 && a.tolerance < 10)) fail("--tolerance ", a.tolerance, " must be in (0, 10)");
    const ProfileDB db = load_profile(a.check);
    const MachineCheck mc = check_machine(db, a.tolerance, /*compare_gpu=*/true);  // when this machine has one
    require_same_machine(mc, a.check, a.tolerance, "profile this machine (shardwise profile --out FILE)");
    if (log_level() <= LogLevel::Info) std::fputs(mc.text().c_str(), stderr);
    print_json(machine_check_json(mc, a.check, a.tolerance));
    return;
  }
  if (!a.validate.empty()) {
    const ProfileDB db = load_profile(a.validate);
    if (!a.threads.empty()) fail("--validate uses the profile's own thread counts; drop --threads");
    if (!a.rescore.empty()) o.recorded = recorded_validation(a.rescore);
    const ValidationReport r = validate_profile(db, o);
    std::printf("validation of %s (%s, %s%s) on cases its grid never saw\n", a.validate.c_str(),
                db.machine.cpu_model.c_str(), db.has_gpu() ? db.machine.gpu_name.c_str() : "no GPU",
                db.quick ? ", quick" : "");
    std::fputs(r.text().c_str(), stdout);
    if (!a.json_out.empty()) {
      nlohmann::json j;
      j["profile"] = a.validate;
      j["profile_hash"] = profile_hash(db);
      auto cases = nlohmann::json::array();
      for (const auto& c : r.cases)
        cases.push_back({{"class", c.op_class},
                         {"case", c.label},
                         {"predicted_ms", c.predicted_ms},
                         {"measured_ms", c.measured_ms}});
      j["cases"] = cases;
      auto classes = nlohmann::json::array();
      for (const auto& c : r.classes)
        classes.push_back(
            {{"class", c.op_class}, {"cases", c.cases}, {"median_error", c.median_error}, {"p90_error", c.p90_error}});
      j["classes"] = classes;
      j["cpu"] = {
          {"cases", r.all_cpu.cases}, {"median_error", r.all_cpu.median_error}, {"p90_error", r.all_cpu.p90_error}};
      j["gpu"] = {
          {"cases", r.all_gpu.cases}, {"median_error", r.all_gpu.median_error}, {"p90_error", r.all_gpu.p90_error}};
      const bool any = !r.contention_with.empty();
      j["contention_median_error_with"] = any ? nlohmann::json(r.contention_median_with) : nlohmann::json(nullptr);
      j["contention_median_error_without"] =
          any ? nlohmann::json(r.contention_median_without) : nlohmann::json(nullptr);
      j["contention_gbps"] = r.contention_gbps;
      auto cont = nlohmann::json::array();
      for (size_t i = 0; i < r.contention_with.size(); ++i)
        cont.push_back({{"class", r.contention_with[i].op_class},
                        {"case", r.contention_with[i].label},
                        {"measured_ms", r.contention_with[i].measured_ms},
                        {"predicted_with_ms", r.contention_with[i].predicted_ms},
                        {"predicted_without_ms", r.contention_without[i].predicted_ms}});
      j["contention"] = cont;
      if (!a.rescore.empty()) j["rescored_from"] = a.rescore;
      std::ofstream f(a.json_out);
      if (!f) fail(a.json_out, ": cannot create");
      f << j.dump(1) << "\n";
    }
    return;
  }
  if (a.out.empty()) fail("give --out FILE (the ProfileDB to write) or --validate FILE");
  ProfileDB db = run_profile(o);
  save_profile(db, a.out);
  size_t gpu_rows = 0;
  for (const auto& s : db.ops) gpu_rows += s.backend == Backend::Gpu;
  log_info("profile: ", db.ops.size(), " op rows (", gpu_rows, " GPU), ", db.transfers.size(), " copy rows, ",
           db.fits.size(), " fits -> ", a.out);
  print_json({{"out", a.out},
              {"device", db.device},
              {"gpu", db.machine.gpu_name},
              {"cpu", db.machine.cpu_model},
              {"threads", db.threads},
              {"pcie_caps_gbps", db.pcie_caps_gbps},
              {"op_rows", db.ops.size()},
              {"gpu_rows", gpu_rows},
              {"transfer_rows", db.transfers.size()},
              {"fits", db.fits.size()},
              {"profile_hash", profile_hash(db)}});
}

}  // namespace

void register_profile(CLI::App& app) {
  auto* c = app.add_subcommand("profile", "measure this machine's kernels, copies and contention into a ProfileDB");
  auto a = std::make_shared<ProfileArgs>();
  c->add_option("--out", a->out, "ProfileDB file to write");
  c->add_option(
      "-t,--threads", a->threads,
      "CPU thread counts, e.g. 1,16 (default: 1 and all hardware threads; each at most 4 x the hardware threads)");
  c->add_option("--pcie-cap", a->caps, "PCIe caps to measure copies under, e.g. none,16GB/s");
  c->add_option("--device", a->device, "auto | cuda | cpu (cpu: a profile without GPU rows)");
  c->add_flag("--quick", a->quick, "small grid (~30 s): for tests and CPU-only demos");
  c->add_option("--validate", a->validate, "measure cases this profile never saw and print predicted vs measured");
  c->add_option("--check", a->check,
                "re-measure a few of this profile's CPU rows (DRAM read, f16 matmul) and fail if this machine is "
                "not the one it describes");
  c->add_option("--tolerance", a->tolerance, "with --check: the factor allowed either way, as a fraction (0.2)");
  c->add_option("--json-out", a->json_out, "with --validate: also write the results as JSON");
  c->add_option("--rescore", a->rescore,
                "with --validate: take the measured times from this earlier --json-out file and predict them again "
                "(e.g. after a cost-model change); measures nothing");
  c->add_flag("--no-progress", a->no_progress, "no progress bar");
  c->callback([a] { run_profile_verb(*a); });
}

}  // namespace shardwise::cli

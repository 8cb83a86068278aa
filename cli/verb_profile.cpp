// cli/verb_profile.cpp — `shardwise profile`: measure this machine (microbench/profiler.h) into a
// ProfileDB file, or with --validate FILE measure cases that profile never saw and print predicted
// against measured per op class (--json-out writes the same as JSON).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "core/size.h"
#include "costmodel/profile_db.h"
#include "microbench/profiler.h"
#include "oracle/sweep.h"

namespace shardwise::cli {
namespace {

struct ProfileArgs {
  std::string out, threads, caps = "none", device = "auto", validate, json_out;
  bool quick = false, no_progress = false;
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
  o.progress = !a.no_progress;
  o.git_rev = build_git_rev();
  for (const std::string& t : split_list(a.threads)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || v < 1) fail("--threads '", a.threads, "': give thread counts like 1,16");
    o.threads.push_back(v);
  }
  o.pcie_caps_bytes_per_s.clear();
  for (const std::string& c : split_list(a.caps)) o.pcie_caps_bytes_per_s.push_back(parse_bandwidth(c, "--pcie-cap"));
  if (o.pcie_caps_bytes_per_s.empty()) o.pcie_caps_bytes_per_s = {0};
  return o;
}

void run_profile_verb(const ProfileArgs& a) {
  ProfileOptions o = options_of(a);
  if (!a.validate.empty()) {
    const ProfileDB db = load_profile(a.validate);
    if (!a.threads.empty()) fail("--validate uses the profile's own thread counts; drop --threads");
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
        cases.push_back({{"class", c.op_class}, {"case", c.label}, {"predicted_ms", c.predicted_ms}, {"measured_ms", c.measured_ms}});
      j["cases"] = cases;
      auto classes = nlohmann::json::array();
      for (const auto& c : r.classes)
        classes.push_back({{"class", c.op_class}, {"cases", c.cases}, {"median_error", c.median_error}, {"p90_error", c.p90_error}});
      j["classes"] = classes;
      j["cpu"] = {{"cases", r.all_cpu.cases}, {"median_error", r.all_cpu.median_error}, {"p90_error", r.all_cpu.p90_error}};
      j["gpu"] = {{"cases", r.all_gpu.cases}, {"median_error", r.all_gpu.median_error}, {"p90_error", r.all_gpu.p90_error}};
      j["contention_median_error_with"] = r.contention_median_with;
      j["contention_median_error_without"] = r.contention_median_without;
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
  std::fprintf(stderr, "profile: %zu op rows (%zu GPU), %zu copy rows, %zu fits -> %s\n", db.ops.size(), gpu_rows,
               db.transfers.size(), db.fits.size(), a.out.c_str());
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
  c->add_option("--threads", a->threads, "CPU thread counts, e.g. 1,16 (default: 1 and all hardware threads)");
  c->add_option("--pcie-cap", a->caps, "PCIe caps to measure copies under, e.g. none,16GB/s");
  c->add_option("--device", a->device, "auto | cuda | cpu (cpu: a profile without GPU rows)");
  c->add_flag("--quick", a->quick, "small grid (~30 s): for tests and CPU-only demos");
  c->add_option("--validate", a->validate, "measure cases this profile never saw and print predicted vs measured");
  c->add_option("--json-out", a->json_out, "with --validate: also write the results as JSON");
  c->add_flag("--no-progress", a->no_progress, "no progress bar");
  c->callback([a] { run_profile_verb(*a); });
}

}  // namespace shardwise::cli

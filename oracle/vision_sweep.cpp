// oracle/vision_sweep.cpp — see vision_sweep.h.
#include "oracle/vision_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/size.h"
#include "engine/run_setup.h"
#include "engine/vision_planning.h"
#include "executor/device/device.h"
#include "executor/device/vision_kernels.h"
#include "oracle/results.h"
#include "oracle/sweep_common.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/preprocess.h"
#include "vision/vision_runtime.h"
#include "vision/vision_spec.h"
#include "vision/vl_prompt.h"

namespace shardwise {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One schedule of a configuration: the most resident blocks it allows, its plan and price.
struct VisionRow {
  std::string schedule;
  int64_t max_resident = 0;
  bool feasible = false;
  std::string reason;  // why not
  VisionPart part;
  bool chosen = false;
};

struct VisionConfigPlan {
  VisionConfiguration config;
  GridThw grid{};
  int64_t patches = 0, image_tokens = 0, depth = 0;
  std::string machine;  // the cost model, described
  std::vector<VisionRow> rows;
};

// A loaded model's tower, and the dtype its matrices are kept in on the device.
struct LoadedTower {
  int index = -1;
  VisionTower tower;
  double load_ms = 0;
};

// The schedule's plan, or why it is not one (see vision_sweep.h).
VisionRow plan_row(const std::string& schedule, int64_t max_resident, const VisionSpec& spec, const VisionInputs& in,
                   uint64_t budget, DType dtype, const VisionWorkspace& workspace, const CostModel& cost) {
  VisionRow r;
  r.schedule = schedule;
  r.max_resident = max_resident;
  try {
    r.part = plan_vision_inputs(spec, in, budget, dtype, workspace, cost, max_resident);
  } catch (const Error& err) {
    r.reason = err.what();
    return r;
  }
  const VisionPlan& p = r.part.plan;
  if (schedule == "gpu-only" && p.resident_blocks < spec.depth) {
    const uint64_t need =
        p.arena_bytes + static_cast<uint64_t>(spec.depth - p.resident_blocks - p.slots) * p.block_bytes;
    r.reason = str_cat("every block resident needs ", format_bytes(need), "; the budget is ", format_bytes(budget));
  } else if (schedule == "partial" && p.resident_blocks == 0) {
    r.reason = "no block fits beside the two slots (the plan is `streamed`)";
  } else {
    r.feasible = true;
  }
  return r;
}

// What planning needs of a tower (not its weights).
struct TowerFacts {
  VisionSpec spec;
  ImageProcessorConfig processor;
  DType dtype = DType::F32;   // of its matrices
  VisionWorkspace workspace;  // the sweep's device's kernels' (planning_workspace)
};

// The device's kernels' workspace (VisionKernels::workspace), as its encodes plan with it: CUDA's
// without a GPU at hand (--predict on another machine).
VisionWorkspace planning_workspace(const std::string& device, int64_t head_dim, DType dtype) {
  if (device == "cuda") return cuda_vision_workspace(dtype);
  return make_run_device(device)->vision_kernels(head_dim).workspace(dtype);
}

VisionConfigPlan plan_vision_config(const VisionConfiguration& c, const TowerFacts& t, const CostModel& cost) {
  const VisionSpec& spec = t.spec;
  VisionConfigPlan p;
  p.config = c;
  p.machine = cost.describe();
  p.grid = image_grid(c.image.width, c.image.height, t.processor);
  const VisionInputs in = vision_inputs(spec, {p.grid});
  p.patches = in.n_patches;
  p.image_tokens = in.n_patches / spec.merge_unit();
  p.depth = spec.depth;
  const DType dtype = t.dtype;
  const VisionWorkspace workspace = t.workspace;
  const std::pair<const char*, int64_t> schedules[] = {
      {"gpu-only", spec.depth}, {"partial", std::max<int64_t>(0, spec.depth - 2)}, {"streamed", 0}};
  for (const auto& [name, max_resident] : schedules)
    p.rows.push_back(plan_row(name, max_resident, spec, in, c.budget_bytes, dtype, workspace, cost));
  // The planner's plan: every block resident where they fit, else as many as fit.
  for (VisionRow& r : p.rows)
    if (r.feasible) {
      r.chosen = true;
      break;
    }
  return p;
}

// Seeded patch values in [-2, 2] (the normalised pixels' range): an encode's time does not depend on them.
std::vector<float> seeded_patches(int64_t patches, int64_t patch_dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(patches * patch_dim));
  for (float& x : v) x = d(rng);
  return v;
}

// A row's keys before its measurement.
json planned_keys(const Experiment& e, const VisionConfigPlan& p, const VisionRow& r, const std::string& profile_hash,
                  const std::string& git_rev, const std::string& device) {
  const VisionConfiguration& c = p.config;
  const VisionPlan& pl = r.part.plan;
  std::string choice;
  for (const VisionRow& x : p.rows)
    if (x.chosen) choice = x.schedule;
  return json{{"record", "row"},
              {"config_id", c.config_id},
              {"experiment", e.name},
              {"part", "vision"},
              {"model", c.model_name},
              {"weights", c.weights},
              {"budget", c.budget_text},
              {"budget_bytes", c.budget_bytes},
              {"image", c.image.text},
              {"grid_thw", {p.grid[0], p.grid[1], p.grid[2]}},
              {"tier", p.patches},
              {"image_tokens", p.image_tokens},
              {"blocks", p.depth},
              {"schedule", r.schedule},
              {"candidate", true},
              {"feasible", r.feasible},
              {"predicted_ms", r.feasible ? json(r.part.cost.predicted_ms) : json(nullptr)},
              {"resident_blocks", r.feasible ? json(pl.resident_blocks) : json(nullptr)},
              {"mlp_chunk", r.feasible ? json(pl.mlp_chunk) : json(nullptr)},
              {"vram_bytes", r.feasible ? json(pl.arena_bytes) : json(nullptr)},
              {"workspace_bytes", r.feasible ? json(pl.workspace_bytes) : json(nullptr)},
              {"weight_bytes", r.feasible ? json(pl.weight_bytes()) : json(nullptr)},
              {"chosen", r.chosen},
              {"planner_choice", choice.empty() ? json(nullptr) : json(choice)},
              {"hardware", p.machine},
              {"profile_hash", profile_hash},
              {"git_rev", git_rev},
              {"device", device}};
}

}  // namespace

std::vector<VisionConfiguration> expand_vision_configurations(const Experiment& e, std::vector<std::string>* dropped) {
  std::vector<VisionConfiguration> out;
  auto in = [](const auto& list, const auto& v) {
    return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
  };
  for (size_t mi = 0; mi < e.models.size(); ++mi)
    for (const auto& b : e.budgets)
      for (const auto& im : e.images) {
        const ExperimentModel& m = e.models[mi];
        const std::string label = str_cat(m.name, " budget ", b.text, " image ", im.text);
        const auto rule = std::find_if(e.exclude.begin(), e.exclude.end(), [&](const ExclusionRule& r) {
          return in(r.models, m.name) && in(r.budgets, b.text);
        });
        if (rule != e.exclude.end()) {
          if (dropped) dropped->push_back(label + ": excluded by " + rule->where);
          continue;
        }
        VisionConfiguration c;
        c.index = static_cast<int>(out.size());
        c.model = static_cast<int>(mi);
        c.model_name = m.name;
        c.weights = m.weights;
        c.open_path = m.open_path;
        c.budget_text = b.text;
        c.budget_bytes = b.bytes;
        c.image = im;
        c.config_id = make_config_id(m.weights + "?image=" + im.text, b.bytes, 0, 0, 0);
        out.push_back(std::move(c));
      }
  return out;
}

namespace {

// One sweep call of a vision experiment: plan every configuration of this shard, then measure the rows
// left, configuration by configuration, each on a device of its own.
class VisionSweep {
 public:
  VisionSweep(const Experiment& e, const SweepOptions& o)
      : e_(e), o_(o), t_start_(Clock::now()), git_rev_(build_git_rev()), cost_(e) {}

  SweepResult run() {
    if (o_.device != "cuda" && o_.device != "emu") fail("--device '", o_.device, "': the oracle runs on cuda or emu");
    for (const auto& c : expand_vision_configurations(e_, &res_.dropped))
      if (c.index % o_.shard_count == o_.shard_index) mine_.push_back(c);
    res_.configurations = static_cast<int>(mine_.size());
    if (o_.predict_only && !o_.out_path.empty() && std::filesystem::exists(o_.out_path))
      fail(o_.out_path, " exists: --predict writes a new file of predictions, choose another --out");
    if (!o_.predict_only) open_results();
    plan_all();
    if (o_.predict_only) {
      if (!o_.out_path.empty()) write_predictions();
      res_.complete = res_.rows_total == res_.rows_present;
      res_.elapsed_seconds = seconds_since(t_start_);
      return res_;
    }
    if (res_.rows_total > res_.rows_present) {
      write_header();
      progress_ = std::make_unique<Progress>("vision sweep", static_cast<uint64_t>(res_.rows_total - res_.rows_present),
                                             o_.progress);
      for (const auto& p : plans_)
        if (!measure_configuration(p)) break;
      progress_->finish();
    }
    finish();
    return res_;
  }

 private:
  void open_results() { existing_ = open_sweep_results(o_, e_, git_rev_, &writer_); }

  const LoadedTower& tower_of(const VisionConfiguration& c) {
    if (tower_.index != c.model) {
      tower_ = LoadedTower{};
      const auto t0 = Clock::now();
      tower_.tower = load_vision_tower(c.open_path);
      tower_.index = c.model;
      tower_.load_ms = seconds_since(t0) * 1000.0;
      log_info("loaded the vision tower of ", c.model_name, " (", c.weights, ") in ",
               format_fixed(tower_.load_ms / 1000.0, 2), " s");
    }
    return tower_;
  }

  // A synthetic tower's and an HF directory's facts without their weights; an mmproj's from the file.
  const TowerFacts& facts_of(const VisionConfiguration& c) {
    auto it = facts_.find(c.model);
    if (it != facts_.end()) return it->second;
    TowerFacts f;
    const std::string synth = "synthetic:", config = c.open_path + "/config.json";
    if (c.open_path.compare(0, synth.size(), synth) == 0) {
      SyntheticModel sm;
      f.spec = synthetic_tower_spec(c.open_path.substr(synth.size()), &sm);
      f.processor = released_image_processor(f.spec);
      f.dtype = load_vision_tower_dtype(sm.spec.dtype);
    } else if (std::filesystem::is_regular_file(config)) {
      f.spec = vision_spec_from_hf_config(read_text_file(config), config);
      f.processor = model_image_processor(c.open_path, f.spec);
      f.dtype = stored_vision_matrix_dtype(f.spec, c.open_path);
    } else {
      const VisionTower& t = tower_of(c).tower;
      f = TowerFacts{t.model.spec, t.processor, t.model.weights.matrix_dtype};
    }
    f.workspace = planning_workspace(o_.device, f.spec.head_dim(), f.dtype);
    return facts_.emplace(c.model, f).first->second;
  }

  void plan_all() {
    for (const auto& c : mine_) {
      try {
        plans_.push_back(plan_vision_config(c, facts_of(c), cost_.make(0)));
      } catch (const Error& err) {  // an image the processor refuses, a tower that cannot be read
        fail(e_.path, ": ", c.model_name, " at ", c.image.text, ": ", err.what());
      }
      for (const VisionRow& r : plans_.back().rows) {
        ++res_.rows_total;
        const bool present = existing_.keys.count(RowKey{c.config_id, plans_.back().patches, r.schedule}) != 0;
        res_.rows_present += present;
        if (!present && r.feasible)
          res_.predicted_seconds += predicted_row_seconds(e_.measure, r.part.cost.predicted_ms);
      }
    }
    log_info("vision sweep ", e_.name, ": ", res_.configurations, " configuration(s), ", res_.rows_total, " row(s), ",
             res_.rows_present, " already measured; predicted ", format_fixed(res_.predicted_seconds, 1),
             " s of encodes; cost model ", cost_.name);
  }

  void write_predictions() {
    ResultsWriter w(o_.out_path);
    for (const auto& p : plans_)
      for (const VisionRow& r : p.rows) {
        json j = planned_keys(e_, p, r, cost_.hash(e_, 0), git_rev_, o_.device);
        j["record"] = "prediction";
        j["reason"] = r.reason;
        w.append(j);
      }
  }

  void write_header() {
    writer_->append(json{{"record", "sweep"},
                         {"experiment", e_.name},
                         {"experiment_path", e_.path},
                         {"experiment_hash", e_.hash()},
                         {"effective_config", json::parse(e_.effective_json())},
                         {"yaml", e_.text},
                         {"git_rev", git_rev_},
                         {"machine", machine_fingerprint(o_.device)},
                         {"device", o_.device},
                         {"shard", str_cat(o_.shard_index, "/", o_.shard_count)},
                         {"max_minutes", o_.max_minutes},
                         {"started", utc_now()},
                         {"configurations", res_.configurations},
                         {"rows_total", res_.rows_total},
                         {"rows_present", res_.rows_present}});
  }

  bool out_of_time() {
    if (o_.max_minutes <= 0 || res_.rows_measured == 0) return false;
    const double per_row = seconds_since(t_start_) / res_.rows_measured;
    if (seconds_since(t_start_) + per_row <= o_.max_minutes * 60.0) return false;
    res_.stopped_by_time = true;
    return true;
  }

  // The configuration's rows left, on a device of its own. False: out of time.
  bool measure_configuration(const VisionConfigPlan& p) {
    std::unique_ptr<Device> device;
    std::string setup_error;
    std::vector<float> patches;
    for (const VisionRow& r : p.rows) {
      if (existing_.keys.count(RowKey{p.config.config_id, p.patches, r.schedule})) continue;
      json j = planned_keys(e_, p, r, cost_.hash(e_, 0), git_rev_, o_.device);
      j["model_load_ms"] = tower_.load_ms;
      if (!r.feasible) {
        j["status"] = "infeasible";
        j["reason"] = r.reason;
      } else {
        if (out_of_time()) return false;
        if (!device && setup_error.empty()) {
          try {
            device = make_run_device(o_.device);
          } catch (const std::exception& err) {
            setup_error = err.what();
          }
          const VisionSpec& s = tower_of(p.config).tower.model.spec;
          patches = seeded_patches(p.patches, s.patch_dim(), std::hash<std::string>{}(p.config.config_id));
        }
        if (!setup_error.empty()) {
          j["status"] = "error";
          j["reason"] = setup_error;
        } else {
          measure_row(*device, p, r, patches, j);
        }
      }
      j["time"] = utc_now();
      writer_->append(j);
      ++res_.rows_written;
      progress_->add(1);
    }
    return true;
  }

  // Encodes the configuration's image with the row's plan until the measure settings are met.
  void measure_row(Device& device, const VisionConfigPlan& p, const VisionRow& r, const std::vector<float>& patches,
                   json& j) {
    const VisionModel& m = tower_of(p.config).tower.model;
    uint64_t peak = 0;
    VisionPlan ran;
    try {
      const Measurement s = measure_samples(e_.measure, [&] {
        VisionRunStats st;
        encode_images_on_device(device, m.spec, m.weights, patches.data(), {p.grid}, p.config.budget_bytes, &st,
                                r.max_resident);
        peak = std::max(peak, st.device_peak_bytes);
        ran = st.plan;
        return st.encode_ms;
      });
      add_samples(j, s);
      j["arena_bytes"] = ran.arena_bytes;
      j["ran_resident_blocks"] = ran.resident_blocks;
      j["device_peak_bytes"] = peak;
      j["within_budget"] = peak <= p.config.budget_bytes;
      ++res_.rows_measured;
    } catch (const std::exception& err) {
      j["status"] = "error";
      j["reason"] = err.what();
    }
  }

  void finish() {
    const ExistingResults now = read_results(o_.out_path);
    int present = 0;
    for (const auto& p : plans_)
      for (const VisionRow& r : p.rows) present += now.keys.count(RowKey{p.config.config_id, p.patches, r.schedule});
    res_.complete = present == res_.rows_total;
    res_.elapsed_seconds = seconds_since(t_start_);
    writer_->append(sweep_end_record(e_, o_, res_, present));
  }

  const Experiment& e_;
  const SweepOptions& o_;
  const Clock::time_point t_start_;
  const std::string git_rev_;
  const SweepCost cost_;
  SweepResult res_;
  std::vector<VisionConfiguration> mine_;
  std::vector<VisionConfigPlan> plans_;
  ExistingResults existing_;
  std::unique_ptr<ResultsWriter> writer_;
  std::unique_ptr<Progress> progress_;
  LoadedTower tower_;
  std::map<int, TowerFacts> facts_;
};

}  // namespace

SweepResult run_vision_sweep(const Experiment& e, const SweepOptions& o) {
  SW_CHECK(e.vision(), "run_vision_sweep: ", e.name, " has no images");
  if (o.shard_count < 1 || o.shard_index < 0 || o.shard_index >= o.shard_count)
    fail("--shard: bad shard ", o.shard_index, "/", o.shard_count);
  VisionSweep sweep(e, o);
  return sweep.run();
}

}  // namespace shardwise

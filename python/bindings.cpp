// python/bindings.cpp — the compiled half of the Python package `shardwise` (shardwise._native):
// specs, hardware, plan tables and the oracle's experiment expansion, marshalled to Python objects.
// Thin on purpose: every function calls one library function; no logic of its own lives here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/model_spec.h"
#include "core/size.h"
#include "costmodel/cost_model.h"
#include "costmodel/profile_db.h"
#include "engine/cost_source.h"
#include "engine/planning.h"
#include "engine/vision_planning.h"
#include "oracle/experiment.h"
#include "oracle/sweep.h"
#include "oracle/vision_sweep.h"
#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/simulator.h"

namespace py = pybind11;
using namespace shardwise;

namespace {

// Sizes and bandwidths are accepted as numbers (bytes, bytes/s) or as text ("4G", "16GB/s", "none").
uint64_t size_arg(const py::object& v, const char* what) {
  if (v.is_none()) throw Error(str_cat("give ", what, " (bytes, or text such as \"4G\")"));
  if (py::isinstance<py::str>(v)) return parse_size(v.cast<std::string>(), what);
  return v.cast<uint64_t>();
}
double bandwidth_arg(const py::object& v, const char* what) {
  if (v.is_none()) return 0;
  if (py::isinstance<py::str>(v)) return parse_bandwidth(v.cast<std::string>(), what);
  return v.cast<double>();
}
ModelSpec spec_arg(const py::object& v) {
  if (py::isinstance<py::str>(v)) return resolve_spec(v.cast<std::string>());
  return v.cast<ModelSpec>();
}

// The machine of the plan functions: a measured profile (path) when given, where `hardware` (optional
// then) only stands in for the GPU of a CPU-only profile; else the datasheet `hardware` (a name, a
// .yaml path or a HardwareSpec). The engine makes the cost model from it, as for `shardwise plan`.
MachineChoice machine_arg(const py::object& hardware, const py::object& profile) {
  if (profile.is_none() && hardware.is_none())
    throw Error("give hardware= (a builtin machine or a hardware .yaml) or profile= (a ProfileDB file)");
  MachineChoice m;
  if (!hardware.is_none()) {
    if (py::isinstance<py::str>(hardware))
      m.hw = hardware.cast<std::string>();
    else
      m.hw_spec = hardware.cast<HardwareSpec>();
  }
  if (!profile.is_none()) m.profile = profile.cast<std::string>();
  m.hw_option = "hardware";
  m.profile_option = "profile";
  return m;
}

py::dict fingerprint_dict(const MachineFingerprint& m) {
  py::dict d;
  d["cpu_model"] = m.cpu_model;
  d["cpu_cores"] = m.cpu_cores;
  d["isa"] = m.isa;
  d["dram_bytes"] = m.dram_bytes;
  d["gpu_name"] = m.gpu_name;
  d["gpu_driver"] = m.gpu_driver;
  d["vram_bytes"] = m.vram_bytes;
  return d;
}

py::dict op_dict(const OpSample& s) {
  py::dict o;
  o["backend"] = backend_name(s.backend);
  o["threads"] = s.threads;
  o["contention"] = s.contention;
  o["concurrent_gbps"] = s.concurrent_gbps;
  o["kind"] = op_kind_name(s.op.kind);
  o["dtype"] = dtype_name(s.op.dtype);
  o["tokens"] = s.op.tokens;
  o["rows"] = s.op.rows;
  o["cols"] = s.op.cols;
  o["n_experts"] = s.op.n_experts;
  o["top_k"] = s.op.top_k;
  o["ctx"] = s.op.ctx;
  o["n_heads"] = s.op.n_heads;
  o["n_kv_heads"] = s.op.n_kv_heads;
  o["head_dim"] = s.op.head_dim;
  o["elems"] = s.op.elems;
  o["bytes"] = s.op.weight_bytes() + s.op.activation_bytes();
  o["flops"] = s.op.flops();
  o["ms"] = s.ms;
  o["spread"] = s.spread;
  o["repeats"] = s.repeats;
  return o;
}

py::dict transfer_dict(const TransferSample& t) {
  py::dict x;
  x["dir"] = t.dir == Direction::HostToDevice ? "h2d" : "d2h";
  x["pinned"] = t.pinned;
  x["cap_gbps"] = t.cap_gbps;
  x["bytes"] = t.bytes;
  x["ms"] = t.ms;
  x["spread"] = t.spread;
  x["repeats"] = t.repeats;
  x["burst"] = t.burst;  // > 1: ms per copy of that many issued back to back
  return x;
}

py::dict dram_dict(const DramSample& s) {
  py::dict x;
  x["threads"] = s.threads;
  x["contention"] = s.contention;
  x["concurrent_gbps"] = s.concurrent_gbps;
  x["gbps"] = s.gbps;
  return x;
}

py::dict fit_dict(const RooflineFit& f) {
  py::dict x;
  x["backend"] = backend_name(f.backend);
  x["kind"] = op_kind_name(f.kind);
  x["dtype"] = dtype_name(f.dtype);
  x["threads"] = f.threads;
  x["contention"] = f.contention;
  x["peak_gflops"] = f.peak_gflops;
  x["bw_gbps"] = f.bw_gbps;
  x["overhead_ms"] = f.overhead_ms;
  x["points"] = f.points;
  x["median_rel_err"] = f.median_rel_err;
  return x;
}

// A ProfileDB as plain Python data (lists of dicts, ready for pandas.DataFrame).
py::dict profile_dict(const std::string& path) {
  const ProfileDB db = load_profile(path);
  py::dict d;
  d["path"] = path;
  d["hash"] = profile_hash(db);
  d["version"] = db.version;
  d["device"] = db.device;
  d["created"] = db.created;
  d["git_rev"] = db.git_rev;
  d["quick"] = db.quick;
  d["machine"] = fingerprint_dict(db.machine);
  d["threads"] = db.threads;
  d["pcie_caps_gbps"] = db.pcie_caps_gbps;
  d["sync_ms"] = db.sync_ms;
  d["launch_ms"] = db.launch_ms;
  d["copy_issue_ms"] = db.copy_issue_ms;
  d["paced_copy_issue_ms"] = db.paced_copy_issue_ms;
  py::dict counts;
  int64_t cpu = 0, gpu = 0, contention = 0;
  py::list ops, transfers, dram, fits;
  for (const OpSample& s : db.ops) {
    (s.backend == Backend::Cpu ? cpu : gpu) += 1;
    contention += s.contention ? 1 : 0;
    ops.append(op_dict(s));
  }
  counts["ops"] = db.ops.size();
  counts["cpu_ops"] = cpu;
  counts["gpu_ops"] = gpu;
  counts["contention_ops"] = contention;
  counts["transfers"] = db.transfers.size();
  counts["dram"] = db.dram.size();
  counts["fits"] = db.fits.size();
  d["counts"] = counts;
  d["ops"] = ops;
  for (const TransferSample& t : db.transfers) transfers.append(transfer_dict(t));
  for (const DramSample& s : db.dram) dram.append(dram_dict(s));
  for (const RooflineFit& f : db.fits) fits.append(fit_dict(f));
  d["transfers"] = transfers;
  d["dram"] = dram;
  d["fits"] = fits;
  return d;
}

PlannerChoices planner_choices(uint64_t budget, int64_t ctx, int threads, const CostModel& cost,
                               const std::vector<int64_t>& tiers, const std::string& kv_dtype, int kv_layers) {
  PlannerChoices c;
  c.budget_bytes = budget;
  c.ctx = ctx;
  c.threads = threads > 0 ? threads : cost.max_threads();
  c.tiers = tiers;
  c.kv_dtype = parse_dtype(kv_dtype);
  c.kv_layers = kv_layers;
  return c;
}

PlanTable plan_fn(const py::object& model, const py::object& hardware, const py::object& budget, int64_t ctx,
                  int threads, const py::object& pcie_cap, const std::vector<int64_t>& tiers,
                  const std::string& kv_dtype, const py::object& profile, int kv_layers,
                  const std::string& host_kv_attention, double next_layer_hits) {
  const ModelSpec spec = spec_arg(model);
  const double cap = bandwidth_arg(pcie_cap, "pcie_cap");
  const CostSource source(machine_arg(hardware, profile));
  const CostModel& cost = source.at_cap(cap);
  PlannerChoices c = planner_choices(size_arg(budget, "budget"), ctx, threads, cost, tiers, kv_dtype, kv_layers);
  c.host_kv_attention = parse_host_kv_attention(host_kv_attention);
  // A streamed expert's copies as `shardwise run` makes them of synthetic weights of this spec.
  const PlannerConfig cfg = planner_config(spec, c, facts_of_spec(spec, spec.name));
  return plan_table(spec, cost, cfg, NextLayerHits::given(next_layer_hits), cap).table;
}

uint64_t minimum_budget_fn(const py::object& model, const py::object& hardware, int64_t ctx, int threads,
                           const py::object& pcie_cap, const py::object& profile) {
  const CostSource source(machine_arg(hardware, profile));
  const CostModel& cost = source.at_cap(bandwidth_arg(pcie_cap, "pcie_cap"));
  const ModelSpec spec = spec_arg(model);
  return minimum_budget(spec, cost,
                        planner_config(spec, planner_choices(1, ctx, threads, cost, {}, "f32", -1), ModelFacts{}));
}

// A vision-language model's encoder planned for images of the given "WxH" sizes (engine/vision_planning.h).
py::dict plan_vision_fn(const std::string& model_dir, const std::vector<std::string>& image_sizes,
                        const py::object& budget, const py::object& hardware, const py::object& pcie_cap,
                        const py::object& profile) {
  const CostSource source(machine_arg(hardware, profile));
  const CostModel& cost = source.at_cap(bandwidth_arg(pcie_cap, "pcie_cap"));
  std::vector<std::array<int64_t, 2>> sizes;
  for (const std::string& s : image_sizes) sizes.push_back(parse_image_size(s, "image_sizes"));
  const VisionPart v = plan_vision_part(model_dir, sizes, size_arg(budget, "budget"), cost);
  py::dict d;
  d["schedule"] = v.plan.schedule();
  d["patches"] = v.plan.n_patches;
  d["blocks"] = v.plan.depth;
  d["resident_blocks"] = v.plan.resident_blocks;
  d["slots"] = v.plan.slots;
  d["mlp_chunk"] = v.plan.mlp_chunk;
  d["arena_bytes"] = v.plan.arena_bytes;
  d["activation_bytes"] = v.plan.activation_bytes;
  d["workspace_bytes"] = v.plan.workspace_bytes;
  d["weight_bytes"] = v.plan.weight_bytes();
  d["predicted_ms"] = v.cost.predicted_ms;
  d["predicted_block_ms"] = v.cost.block_compute_ms;
  d["predicted_full_block_ms"] = v.cost.full_block_compute_ms;
  d["predicted_block_copy_ms"] = v.cost.copy_ms;
  d["description"] = v.plan.describe();
  return d;
}

// A vision encoder experiment's configurations (oracle/vision_sweep.h): model, budget and image size.
py::list expand_vision_experiment(const Experiment& e) {
  py::list out;
  for (const VisionConfiguration& c : expand_vision_configurations(e)) {
    py::dict d;
    d["config_id"] = c.config_id;
    d["model"] = c.model_name;
    d["weights"] = c.weights;
    d["budget"] = c.budget_text;
    d["budget_bytes"] = c.budget_bytes;
    d["image"] = c.image.text;
    d["image_width"] = c.image.width;
    d["image_height"] = c.image.height;
    out.append(d);
  }
  return out;
}

py::list expand_experiment_fn(const std::string& path) {
  const Experiment e = load_experiment(path);
  if (e.vision()) return expand_vision_experiment(e);
  py::list out;
  for (const Configuration& c : expand_configurations(e)) {
    py::dict d;
    d["config_id"] = c.config_id;
    d["model"] = c.model_name;
    d["weights"] = c.weights;
    d["budget"] = c.budget_text;
    d["budget_bytes"] = c.budget_bytes;
    d["ctx"] = c.ctx;
    d["threads"] = c.threads;
    d["pcie_cap"] = c.pcie_cap_text;
    d["pcie_cap_gbps"] = c.pcie_cap_bytes_per_s / 1e9;
    out.append(d);
  }
  return out;
}

// Specs and machines.
void bind_specs(py::module_& m) {
  py::class_<ModelSpec>(m, "ModelSpec")
      .def_readonly("name", &ModelSpec::name)
      .def_property_readonly("family", [](const ModelSpec& s) { return family_name(s.family); })
      .def_property_readonly("dtype", [](const ModelSpec& s) { return dtype_name(s.dtype); })
      .def_readonly("hidden_size", &ModelSpec::hidden_size)
      .def_readonly("num_hidden_layers", &ModelSpec::num_hidden_layers)
      .def_readonly("num_attention_heads", &ModelSpec::num_attention_heads)
      .def_readonly("num_key_value_heads", &ModelSpec::num_key_value_heads)
      .def_readonly("head_dim", &ModelSpec::head_dim)
      .def_readonly("intermediate_size", &ModelSpec::intermediate_size)
      .def_readonly("vocab_size", &ModelSpec::vocab_size)
      .def_readonly("num_experts", &ModelSpec::num_experts)
      .def_readonly("num_experts_per_tok", &ModelSpec::num_experts_per_tok)
      .def_readonly("moe_intermediate_size", &ModelSpec::moe_intermediate_size)
      .def_property_readonly("is_moe", &ModelSpec::is_moe)
      .def_property_readonly("total_bytes", &ModelSpec::total_bytes)
      .def_property_readonly("n_params", &ModelSpec::n_params)
      .def(
          "kv_bytes_per_token",
          [](const ModelSpec& s, const std::string& dt) { return s.kv_bytes_per_token(parse_dtype(dt)); },
          py::arg("kv_dtype") = "f16")
      .def(
          "with_dtype",
          [](ModelSpec s, const std::string& dt) {
            s.dtype = parse_dtype(dt);
            return s;
          },
          py::arg("dtype"))
      .def("to_yaml", &spec_to_yaml)
      .def("__repr__", [](const ModelSpec& s) {
        return "<ModelSpec " + s.name + " " + family_name(s.family) + " " + dtype_name(s.dtype) + " " +
               format_bytes(s.total_bytes()) + ">";
      });

  py::class_<HardwareSpec>(m, "HardwareSpec")
      .def_readonly("name", &HardwareSpec::name)
      .def_readonly("description", &HardwareSpec::description)
      .def_readonly("approximate", &HardwareSpec::approximate)
      .def_readonly("cpu_cores", &HardwareSpec::cpu_cores)
      .def_readonly("gpu_name", &HardwareSpec::gpu_name)
      .def_readonly("vram_bytes", &HardwareSpec::vram_bytes)
      .def_readonly("gpu_mem_gbps", &HardwareSpec::gpu_mem_gbps)
      .def_readonly("pcie_h2d_gbps", &HardwareSpec::pcie_h2d_gbps)
      .def_readonly("pcie_d2h_gbps", &HardwareSpec::pcie_d2h_gbps)
      .def_readonly("dram_read_gbps", &HardwareSpec::dram_read_gbps)
      .def("dram_gbps", &HardwareSpec::dram_gbps, py::arg("threads"), py::arg("pcie_gbps") = 0.0)
      .def("__repr__", [](const HardwareSpec& h) { return "<HardwareSpec " + h.name + ": " + h.description + ">"; });
}

// Plans and plan tables, read-only.
void bind_plan_types(py::module_& m) {
  py::class_<ShardPlacement>(m, "ShardPlacement")
      .def_readonly("shard", &ShardPlacement::shard)
      .def_readonly("name", &ShardPlacement::name)
      .def_property_readonly("home",
                             [](const ShardPlacement& p) { return p.home == WeightHome::Pinned ? "pinned" : "host"; })
      .def_property_readonly("exec", [](const ShardPlacement& p) { return p.exec == ExecDevice::Gpu ? "gpu" : "cpu"; })
      .def_readonly("streamed", &ShardPlacement::streamed)
      .def_readonly("arena_offset", &ShardPlacement::arena_offset)
      .def_readonly("bytes", &ShardPlacement::bytes);

  py::class_<ArenaRegion>(m, "ArenaRegion")
      .def_readonly("name", &ArenaRegion::name)
      .def_readonly("offset", &ArenaRegion::offset)
      .def_readonly("bytes", &ArenaRegion::bytes);

  py::class_<Plan>(m, "Plan")
      .def_property_readonly("schedule", [](const Plan& p) { return schedule_name(p.schedule); })
      .def_readonly("tier", &Plan::tier)
      .def_readonly("feasible", &Plan::feasible)
      .def_readonly("infeasible_reason", &Plan::infeasible_reason)
      .def_readonly("budget_bytes", &Plan::budget_bytes)
      .def_readonly("vram_bytes", &Plan::vram_bytes)
      .def_readonly("predicted_ms", &Plan::predicted_ms)
      .def_readonly("notes", &Plan::notes)
      .def_readonly("placements", &Plan::placements)
      .def_readonly("arena", &Plan::arena)
      .def_readonly("kv_on_gpu", &Plan::kv_on_gpu)
      .def_property_readonly("n_actions", [](const Plan& p) { return p.actions.size(); })
      .def("to_json", [](const Plan& p) { return plan_to_json(p); })
      .def(
          "chrome_trace", [](const Plan& p, const std::string& title) { return chrome_trace_json(p, title); },
          py::arg("title") = "")
      .def("__repr__", [](const Plan& p) {
        return str_cat("<Plan ", schedule_name(p.schedule), " tier ", p.tier,
                       p.feasible ? str_cat(" ", p.predicted_ms, " ms") : " infeasible", ">");
      });

  py::class_<TierEntry>(m, "TierEntry")
      .def_readonly("tokens", &TierEntry::tokens)
      .def_property_readonly("chosen", [](const TierEntry& e) { return e.feasible ? schedule_name(e.chosen) : "none"; })
      .def_readonly("feasible", &TierEntry::feasible)
      .def_readonly("chunk_tokens", &TierEntry::chunk_tokens)
      .def_readonly("candidates", &TierEntry::candidates)
      .def("find", [](const TierEntry& e, const std::string& s) -> py::object {
        const Plan* p = e.find(parse_schedule(s));
        return p ? py::cast(*p) : py::none();
      });

  py::class_<PlanTable>(m, "PlanTable")
      .def_readonly("model", &PlanTable::model)
      .def_readonly("machine", &PlanTable::machine)
      .def_readonly("device", &PlanTable::device)
      .def_readonly("budget_bytes", &PlanTable::budget_bytes)
      .def_readonly("ctx", &PlanTable::ctx)
      .def_readonly("threads", &PlanTable::threads)
      .def_readonly("pcie_cap_gbps", &PlanTable::pcie_cap_gbps)
      .def_readonly("kv_dtype", &PlanTable::kv_dtype)
      .def_readonly("kv_on_gpu", &PlanTable::kv_on_gpu)
      .def_readonly("tiers", &PlanTable::tiers)
      .def(
          "lookup", [](const PlanTable& t, int64_t n) { return t.lookup(n); }, py::arg("n_tokens"))
      .def(
          "to_json", [](const PlanTable& t, int indent) { return plan_table_to_json(t, indent); },
          py::arg("indent") = -1);
}

// Specs, machines, sizes and the planner's functions.
void bind_planning(py::module_& m) {
  m.def("builtin_specs", &builtin_spec_names, "Names of the builtin model specs");
  m.def("builtin_hardware", &builtin_hardware_names, "Names of the builtin machines");
  m.def("load_spec", &resolve_spec, py::arg("name_or_path"), "A builtin spec name, a model .yaml or an HF config.json");
  m.def("weights_spec", &experiment_model_spec, py::arg("weights"),
        "The spec of synthetic:SPEC?dtype=&layers= (computed) or of a .gguf / HF directory (opened)");
  m.def("load_hardware", &resolve_hardware, py::arg("name_or_path"),
        "A builtin machine (cli1, cli2, cli3, h200-host) or a hardware .yaml");
  m.def(
      "parse_size", [](const std::string& s) { return parse_size(s); }, py::arg("text"));
  m.def(
      "parse_bandwidth", [](const std::string& s) { return parse_bandwidth(s); }, py::arg("text"));
  m.def("default_tiers", &default_tiers);

  m.def("plan", &plan_fn, py::arg("model"), py::arg("hardware") = py::none(), py::arg("budget") = py::none(),
        py::arg("ctx") = 4096, py::arg("threads") = 0, py::arg("pcie_cap") = py::none(),
        py::arg("tiers") = std::vector<int64_t>{}, py::arg("kv_dtype") = "f16", py::arg("profile") = py::none(),
        py::arg("kv_layers") = -1, py::arg("host_kv_attention") = "choose", py::arg("next_layer_hits") = 0.0,
        "Build the plan table (every tier, every schedule) with the analytic cost model of `hardware`, or with the "
        "measured "
        "`profile` (a ProfileDB path; `hardware` then only stands in for the GPU of a CPU-only profile); `kv_layers`: "
        "how many "
        "layers keep their KV in VRAM (-1: chosen by simulating a request); `host_kv_attention`: choose | split | "
        "staged, how "
        "the GPU attends to a host KV cache; `next_layer_hits`: MoE, the fraction of each layer's experts its router "
        "guesses "
        "a layer early (0: no speculative expert prefetch)");

  m.def("plan_vision", &plan_vision_fn, py::arg("model_dir"), py::arg("image_sizes"), py::arg("budget"),
        py::arg("hardware") = py::none(), py::arg("pcie_cap") = py::none(), py::arg("profile") = py::none(),
        "A vision-language model's (HF directory) vision encoder planned on the GPU for images of the given "
        "'WIDTHxHEIGHT' sizes within `budget` (its arena lives before the language model's): the schedule, "
        "resident blocks, arena and the cost model's predicted encode time, as `shardwise plan --image-size`");

  m.def("minimum_budget", &minimum_budget_fn, py::arg("model"), py::arg("hardware") = py::none(), py::arg("ctx") = 4096,
        py::arg("threads") = 0, py::arg("pcie_cap") = py::none(), py::arg("profile") = py::none(),
        "The smallest VRAM budget (bytes) for which some schedule fits the decode tier");
}

// The oracle's experiment handling (for notebooks: what a sweep will run) and profiles.
void bind_oracle(py::module_& m) {
  m.def(
      "experiment_config", [](const std::string& path) { return load_experiment(path).effective_json(); },
      py::arg("path"), "The effective configuration of an experiment YAML, as JSON text");
  m.def("expand_experiment", &expand_experiment_fn, py::arg("path"),
        "The configurations of an experiment YAML (after exclusions and the budget filter); of a vision encoder "
        "experiment (one with images): model, budget and image size");
  m.def("config_id", &make_config_id, py::arg("weights"), py::arg("budget_bytes"), py::arg("ctx"), py::arg("threads"),
        py::arg("pcie_cap_bytes_per_s"));
  m.def("profile_hash", static_cast<std::string (*)(const std::string&, double)>(&profile_hash), py::arg("hardware"),
        py::arg("pcie_cap_bytes_per_s") = 0.0, "The profile_hash of sweep rows planned with a hardware datasheet");
  m.def("load_profile", &profile_dict, py::arg("path"),
        "A measured ProfileDB (`shardwise profile`) as a dict: path, hash, device, machine (fingerprint), threads, "
        "pcie_caps_gbps, sync_ms, counts, and the ops, transfers, dram and fits as lists of dicts (pandas-ready)");
  m.def("git_rev", &build_git_rev);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "shardwise: specs, hardware, plan tables and predictions (compiled part of the shardwise package)";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);
  bind_specs(m);
  bind_plan_types(m);
  bind_planning(m);
  bind_oracle(m);
}

// cli/model_setup.cpp — see model_setup.h.
#include "cli/model_setup.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "cli/args.h"
#include "cli/common.h"
#include "core/builtin_yaml.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/size.h"
#include "executor/cuda/cuda_device.h"
#include "oracle/sweep.h"
#include "planner/planner.h"
#include "vision/mmproj.h"

namespace shardwise::cli {
namespace {

// The flags that need a device, or each other.
void check_device_flags(const ModelFlags& a, const std::string& device) {
  const PlannerFlags& f = *a.planner;
  if (!a.timeline.empty()) {  // before any work: a run that cannot write its timeline is refused
    if (device == "cpu") fail("--timeline needs a device run (--device cuda or emu): the CPU path has no plan");
    std::ofstream probe(a.timeline);
    if (!probe) fail("--timeline ", a.timeline, ": cannot write the file (check the directory and permissions)");
  }
  if (device == "cpu")
    for (const auto& gpu_flag : {std::make_pair("--vram-budget", &f.budget), std::make_pair("--plan", &a.plan)})
      if (!gpu_flag.second->empty()) fail(gpu_flag.first, " needs a device: add --device cuda (or emu)");
  if (device == "cpu" && f.schedule != "auto") fail("--schedule needs a device: add --device cuda (or emu)");
  if (device == "cpu" && a.cuda_graphs) fail("--cuda-graphs needs a device: add --device cuda (or emu)");
  if (a.cuda_graphs && a.no_cuda_graphs) fail("give one of --cuda-graphs and --no-cuda-graphs");
  if (device == "emu" && f.budget.empty() && a.plan.empty()) fail("--device emu needs --vram-budget (e.g. 1G)");
}

bool parse_int(const std::string& t, int64_t* v) {
  char* e = nullptr;
  errno = 0;
  const long long x = std::strtoll(t.c_str(), &e, 10);
  if (t.empty() || errno != 0 || *e != '\0') return false;
  *v = x;
  return true;
}

// --timeline-runs: N (the first N) or A:B (runs [A, B)).
void parse_timeline_runs(const std::string& text, RuntimeOptions& ro) {
  const auto colon = text.find(':');
  int64_t first = 0, end = -1;
  const bool ok = colon == std::string::npos
                      ? parse_int(text, &end)
                      : parse_int(text.substr(0, colon), &first) && parse_int(text.substr(colon + 1), &end);
  SW_CHECK(ok && first >= 0 && end > first && end - first <= 1000 && end <= 1000000, "--timeline-runs '", text,
           "': expected N (the first N plan runs) or A:B (runs [A, B)), at most 1000 runs");
  ro.timeline_first = static_cast<int>(first);
  ro.timeline_runs = static_cast<int>(end - first);
}

// --profiler-runs A:B.
void parse_profiler_runs(const std::string& text, RuntimeOptions& ro) {
  const auto colon = text.find(':');
  int64_t first = -1, end = -1;
  const bool ok = colon != std::string::npos && parse_int(text.substr(0, colon), &first) &&
                  parse_int(text.substr(colon + 1), &end) && first >= 0 && end > first && end <= 1000000;
  SW_CHECK(ok, "--profiler-runs '", text, "': expected A:B with 0 <= A < B (plan runs [A, B), e.g. 3:5)");
  ro.profiler_runs_begin = static_cast<int>(first);
  ro.profiler_runs_end = static_cast<int>(end);
}

RuntimeOptions runtime_options(const ModelFlags& a) {
  RuntimeOptions ro;
  if (const auto s = a.planner->only_schedule()) ro.schedule = *s;
  ro.pcie_cap_bytes_per_s = a.planner->pcie_cap_bytes_per_s();
  if (!a.timeline.empty()) parse_timeline_runs(a.timeline_runs, ro);
  ro.cuda_graphs = !a.no_cuda_graphs;
  ro.pin_host_weights = !a.no_pin_weights;
  if (!a.profiler_runs.empty()) parse_profiler_runs(a.profiler_runs, ro);
  return ro;
}

// A budget more than GPU 0 holds is refused before planning.
void check_gpu_budget(const std::string& what, uint64_t budget) {
  const CudaDeviceInfo info = cuda_device_info(0);
  const std::string error = gpu_budget_error(what, budget, info.total_bytes, info.name);
  if (!error.empty()) fail(error);
}

// The model's tokenizer; null where it is optional and cannot be read.
std::unique_ptr<Tokenizer> model_tokenizer(const WeightSource& src, bool optional) {
  try {
    return std::make_unique<Tokenizer>(src);
  } catch (const Error& e) {
    if (!optional) throw;
    log_info("note: ", e.what(), "; printing token ids instead of text");
  }
  return nullptr;
}

// The cost model a device run plans with, as the run's JSON records it: the machine (builtin or file)
// and the profile, each with the hash of its text, so that a run is repeated with the same inputs.
nlohmann::json cost_model_json(const MachineChoice& m) {
  nlohmann::json j = nlohmann::json::object();
  if (!m.hw.empty()) {
    std::string builtin;
    for (int i = 0; i < kBuiltinHardwareCount; ++i)
      if (m.hw == kBuiltinHardware[i].name) builtin = kBuiltinHardware[i].yaml;
    j["hw"] = m.hw;
    j["hw_builtin"] = !builtin.empty();
    j["hw_hash"] = fnv1a_hex(builtin.empty() ? read_text_file(m.hw) : builtin);
  }
  if (!m.profile.empty()) {
    j["profile"] = m.profile;
    j["profile_hash"] = fnv1a_hex(read_text_file(m.profile));
  }
  return j;
}

// The saved --plan table: its context holds the run (`needed` tokens: `needed_what`), its budget is
// --vram-budget's where both are given, and on CUDA the GPU holds it.
PlanTable saved_plan(const ModelFlags& a, const std::string& device, int64_t needed, const std::string& needed_what,
                     nlohmann::json* inputs) {
  const std::string text = read_text_file(a.plan);
  PlanTable table = plan_table_from_json(text, a.plan);
  if (table.ctx < needed)
    fail(a.plan, ": the plan table's context (", table.ctx, ") is smaller than ", needed_what, " (", needed, ")");
  if (!a.planner->budget.empty() && a.planner->budget_bytes() != table.budget_bytes)
    fail("--vram-budget ", a.planner->budget, " (", format_bytes(a.planner->budget_bytes()),
         ") differs from the budget of the plan table ", a.plan, " (", format_bytes(table.budget_bytes),
         "): drop --vram-budget (the table's is used) or plan again with it");
  if (device == "cuda") check_gpu_budget(a.plan + ": the plan table's budget", table.budget_bytes);
  *inputs = {{"plan", a.plan}, {"plan_hash", fnv1a_hex(text)}};
  return table;
}

// On CUDA without --profile or --hw: the builtin machine whose GPU this is, else the default datasheet
// with one warning that says how to measure this machine. Returns how the cost model was chosen.
std::string choose_cuda_machine(const ModelFlags& a, MachineChoice* m) {
  const bool hw_given = a.planner->hw_option && a.planner->hw_option->count() > 0;
  if (!m->profile.empty() || hw_given) return "given";
  const std::string gpu = cuda_device_info(0).name;
  const std::string match = builtin_machine_for_gpu(gpu);
  if (!match.empty()) {
    m->hw = match;
    log_info("planning with the builtin machine ", match, " (its GPU is this one, ", gpu, ")");
    return "builtin machine of this GPU (" + gpu + ")";
  }
  log_warn("planning from the ", m->hw, " datasheet: no builtin machine has this GPU (", gpu,
           "), so predictions and the schedule choice may be off; `shardwise profile --out my.json --device cuda` "
           "measures this machine (minutes), then run with --profile my.json");
  return "default datasheet (no builtin machine has this GPU, " + gpu + ")";
}

// What the engine sets up: on a device, the saved --plan table or the planner's choices; `inputs`
// receives what the plans come from (the table, or the cost model), null on the CPU.
RunSetupOptions setup_options(const ModelFlags& a, const std::string& device, int64_t ctx, int64_t needed,
                              const std::string& needed_what, nlohmann::json* inputs) {
  RunSetupOptions so;
  so.device = device;
  so.ctx = ctx;
  so.runtime.slots = a.sequences;
  so.planner.kv_dtype = a.planner->kv_type();
  *inputs = nullptr;
  if (device == "cpu") return so;
  so.runtime = runtime_options(a);
  so.runtime.slots = a.sequences;
  if (!a.plan.empty()) {
    so.table = saved_plan(a, device, needed, needed_what, inputs);
    return so;
  }
  so.machine = a.planner->machine();
  const std::string why = device == "cuda" ? choose_cuda_machine(a, &so.machine) : "given";
  so.pcie_cap_bytes_per_s = a.planner->pcie_cap_bytes_per_s();
  so.planner = a.planner->choices(0);  // the run's threads and ctx: the engine's
  so.planner.budget_bytes = a.lm_budget_bytes ? a.lm_budget_bytes : run_budget(a, device);
  so.planner.sequences = a.sequences;
  *inputs = {{"cost_model", cost_model_json(so.machine)}};
  (*inputs)["cost_model"]["chosen"] = why;
  return so;
}

// --device auto on a GPU, with a model of a type the CUDA kernels do not compute with yet: the CPU runs it
// (with a warning), unless the run asked for the GPU's budget or a plan (an error then).
void cpu_for_types_cuda_lacks(const ModelFlags& a, ModelRun& s) {
  if (a.device != "auto" || s.device != "cuda") return;
  for (const auto& kv : s.src->tensors()) {
    if (cuda_computes_dtype(kv.second.dtype)) continue;
    const std::string why =
        kv.first + " is " + dtype_name(kv.second.dtype) + ", which the CUDA device does not compute with yet";
    if (!a.planner->budget.empty() || !a.plan.empty())
      fail(why, ": run it on the CPU (--device cpu, without --vram-budget or --plan)");
    log_warn(why, ": running on the CPU (--device cpu)");
    s.device = "cpu";
    return;
  }
}

}  // namespace

// --vram-budget, or on CUDA the GPU's free memory less a reserve.
uint64_t run_budget(const ModelFlags& a, const std::string& device) {
  const std::string& text = a.planner->budget;
  if (!text.empty()) {
    const uint64_t budget = a.planner->budget_bytes();
    if (device == "cuda") check_gpu_budget("--vram-budget " + text, budget);
    return budget;
  }
  if (device != "cuda") fail("--device ", device, " needs --vram-budget (e.g. 1G)");
  const CudaDeviceInfo info = cuda_device_info(0);
  const uint64_t reserve = 1ull << 30;  // context, modules and headroom
  if (info.free_bytes <= reserve) fail("the GPU has too little free memory; give --vram-budget");
  return info.free_bytes - reserve;
}

void add_model_flags(CLI::App* sub, ModelFlags& f, PlannerVerb verb) {
  f.planner = add_planner_flags(sub, verb);
  sub->add_option(
      "--batch", f.batch,
      "Prompt tokens per prefill step, at most 4194304 (0: 512 on the CPU; on a device, the plan table's tiers)");
  sub->add_option("--device", f.device, "auto|cuda|emu|cpu (auto: the GPU when there is one, else the CPU)");
}

void add_device_run_flags(CLI::App* sub, ModelFlags& f) {
  sub->add_option("--plan", f.plan, "Execute this plan table (from `shardwise plan --save`) instead of planning");
  sub->add_flag(
      "--cuda-graphs", f.cuda_graphs,
      "Run each decode step (<= 8 tokens) of a device-resident plan (whole model and KV in VRAM) as CUDA graphs "
      "of up to 8 blocks: one launch instead of one per kernel (not the --timeline runs); the default on a device");
  sub->add_flag("--no-cuda-graphs", f.no_cuda_graphs,
                "Launch every kernel of a decode step on its own (no CUDA graphs)");
  sub->add_flag("--no-pin-weights", f.no_pin_weights,
                "Leave the host weights pageable instead of pinning them: streamed copies run several times slower "
                "(for systems where pinning fails or hangs)");
  sub->add_option("--wait-timeout", f.wait_timeout_s,
                  "Seconds any one wait (on the GPU, on worker threads) may last before the run stops with an error "
                  "naming it; 0 = no limit")
      ->capture_default_str();
}

void check_model_flags(const ModelFlags& f, const std::string& device) {
  f.planner->check_llama_flags();
  check_device_flags(f, device);
  // One line for a bad planner choice, whatever plans the run.
  parse_host_kv_attention(f.planner->host_kv_attention);
  f.planner->hits();
}

int check_model_sizes(const ModelFlags& f) {
  check_token_flag("--ctx", f.planner->ctx);
  check_token_flag("--batch", f.batch);
  return resolve_threads(f.planner->threads);
}

void open_model(const ModelFlags& f, ModelRun& s, bool tokenizer_optional) {
  s.load_start = std::chrono::steady_clock::now();
  OpenOptions oo;
  oo.threads = s.threads;
  s.loading.emplace("loading " + f.model);
  s.src = open_weights(f.model, oo);
  cpu_for_types_cuda_lacks(f, s);
  s.tok = model_tokenizer(*s.src, tokenizer_optional);
}

void set_up_model(const ModelFlags& f, ModelRun& s, int64_t needed, const std::string& needed_what,
                  const std::vector<int32_t>& probe) {
  const RunSetupOptions so = setup_options(f, s.device, s.ctx, needed, needed_what, &s.plan_inputs);
  if (!s.loading) s.loading.emplace("loading " + f.model);
  s.model = std::make_unique<LoadedModel>(*s.src, s.threads);
  s.loading.reset();
  s.setup = std::make_unique<RunSetup>(*s.model, so, probe);
  s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.load_start).count();
}

VlModel load_vision_side(const ModelFlags& f, const ModelRun& s, const std::string& mmproj) {
  const ModelSpec& spec = s.src->spec();
  if (mmproj.empty()) return load_vl_model(f.model, spec);
  return load_vl_model_gguf(mmproj, spec, s.tok ? s.tok->find_token(kImagePadToken) : -1,
                            s.tok ? s.tok->find_token(kVisionStartToken) : -1);
}

int64_t prefill_chunk(const ModelFlags& f, const ModelRun& s) {
  // On a device the plan table decides how a long prompt is cut (its tiers); --batch caps a step.
  return f.batch > 0 ? f.batch : (s.setup && s.setup->runtime() ? 0 : 512);
}

}  // namespace shardwise::cli

// cli/model_setup.h — what the verbs that generate (`run`, `serve`) share: the flags that choose a
// model and how it runs (device, planner flags, prefill batch, saved plan, CUDA graphs, pinning, waits),
// their checks, and the set-up that opens the model, reads its vocabulary and makes it ready to step
// (planned onto the device, or the CPU engine).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/planner_flags.h"
#include "core/log.h"
#include "core/weight_source.h"
#include "engine/run_setup.h"
#include "text/tokenizer.h"
#include "vision/vl_prompt.h"

namespace shardwise::cli {

struct ModelFlags {
  std::string model, device = "auto";
  int64_t batch = 0;  // --batch: prompt tokens per prefill step (0: the default of the engine)
  std::string plan;   // --plan TABLE.json
  // `run` alone declares these; empty, they change nothing.
  std::string timeline;             // --timeline FILE: Chrome trace of the first plan runs, measured and predicted
  std::string timeline_runs = "4";  // --timeline-runs N (the first N) or A:B (runs [A, B))
  std::string profiler_runs;        // --profiler-runs A:B: plan runs [A, B) inside the device's profiler range
  // Decode steps of device-resident plans as CUDA graphs: on by default on a device (measured on the
  // GPU machine: whole-model decode +4.5% nemo8b, +8.5% qwen30b); --no-cuda-graphs turns them off.
  bool cuda_graphs = false;               // --cuda-graphs given
  bool no_cuda_graphs = false;            // --no-cuda-graphs given
  bool no_pin_weights = false;            // --no-pin-weights
  double wait_timeout_s = 600;            // --wait-timeout
  int sequences = 1;                      // sequences stepped at once (`serve --parallel`): the KV cache's slots
  std::shared_ptr<PlannerFlags> planner;  // --threads, --ctx, --vram-budget, --schedule, --hw, ...
  // Non-zero: the language model's VRAM budget, as the verb computed it from run_budget (`serve
  // --vision-budget` sets the encoder's part apart); set_up_model plans in it instead of run_budget.
  uint64_t lm_budget_bytes = 0;
};

// -m/--model, the planner's flags (as `verb` words them), --batch and --device.
void add_model_flags(CLI::App* sub, ModelFlags& f, PlannerVerb verb);
// --plan, --cuda-graphs, --no-cuda-graphs, --no-pin-weights and --wait-timeout.
void add_device_run_flags(CLI::App* sub, ModelFlags& f);

// Before any work: llama.cpp's flags, the flags that need a device or each other, the planner's
// choices (one error line for a bad one).
void check_model_flags(const ModelFlags& f, const std::string& device);
// --ctx and --batch in range; returns the CPU threads (--threads resolved).
int check_model_sizes(const ModelFlags& f);

// A model made ready to generate, with what the verbs report of it.
struct ModelRun {
  std::string device;  // "cuda", "emu" or "cpu" (resolved)
  int threads = 0;
  int64_t ctx = 0;  // the KV capacity asked of the set-up
  double load_ms = 0;
  std::unique_ptr<WeightSource> src;
  std::unique_ptr<Tokenizer> tok;  // null only where open_model was told a vocabulary is optional
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<RunSetup> setup;
  nlohmann::json plan_inputs;  // what the plans come from (cost model, or the saved table); null on the CPU
  std::chrono::steady_clock::time_point load_start;
  std::optional<Phase> loading;
};

// Opens the weights (with --device auto, a model of a type the CUDA kernels lack runs on the CPU, with
// a warning) and the tokenizer. With tokenizer_optional, a model whose vocabulary cannot be read still
// opens (s.tok null, a note said); else that is an error. s.device and s.threads must be set.
void open_model(const ModelFlags& f, ModelRun& s, bool tokenizer_optional);
// Sets the run up with a KV cache of s.ctx tokens: on a device, the saved --plan table (whose context
// must hold `needed` tokens; `needed_what` says what they are in the error) or the planner's table, the
// routing guess measured on `probe`; on the CPU, the CPU engine.
void set_up_model(const ModelFlags& f, ModelRun& s, int64_t needed, const std::string& needed_what,
                  const std::vector<int32_t>& probe);
// The VRAM budget on `device`: --vram-budget (checked against the GPU on CUDA), else on CUDA the GPU's
// free memory less a reserve (an Error on emu: it has no memory of its own to measure).
uint64_t run_budget(const ModelFlags& f, const std::string& device);
// The vision side of a vision-language model (vision/vl_prompt.h): with `mmproj`, llama.cpp's projector
// GGUF beside the language model (the placeholders' ids from s.tok's vocabulary); else the HF directory's
// own tower. An Error says why the pair or the directory is not one.
VlModel load_vision_side(const ModelFlags& f, const ModelRun& s, const std::string& mmproj);
// Prompt tokens per prefill step: --batch, else 512 on the CPU and 0 on a device (the plan table's tiers).
int64_t prefill_chunk(const ModelFlags& f, const ModelRun& s);

}  // namespace shardwise::cli

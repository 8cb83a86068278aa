// cli/common.h — helpers shared by the verbs: argument conversion, model opening, JSON printing.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/weight_source.h"

namespace shardwise::cli {

// "1,2,3" -> ids; throws Error on anything but comma-separated non-negative integers.
std::vector<int32_t> parse_token_list(const std::string& text);

// Thread count flag: 0 = all hardware threads; at most max_cli_threads() (core/thread_pool.h).
int resolve_threads(int threads);
extern const char* const kThreadsHelp;  // --threads' help text, with its limits

// For unsigned options (seeds): decimal digits only, at most 2^64 - 1. CLI11 alone wraps "-1" and
// saturates larger numbers.
extern const CLI::Validator kUnsignedInteger;

// --ctx of run: 0 (the default) or 1 to kMaxContext tokens; --batch: 0 or 1 to kMaxContext.
void check_token_flag(const char* flag, int64_t value);

// Checks --device for verbs that run on the CPU only so far: auto/cpu pass, cuda/emu error.
std::string resolve_cpu_device(const std::string& device);
// --device auto|cuda|emu|cpu -> "cuda", "emu" or "cpu" (auto = cuda when this build has CUDA and the
// machine a GPU, else cpu).
std::string resolve_device(const std::string& device);

// The spec of MODEL without loading weights when possible: a builtin name, .yaml or config.json;
// synthetic:SPEC (not materialised); .gguf files and HF directories are opened and validated.
ModelSpec resolve_model_spec(const std::string& model, std::string* origin, DType* dtype, bool* has_weights,
                             std::map<std::string, DType>* file_dtypes = nullptr);

// Prints a JSON object on one line to stdout.
void print_json(const nlohmann::json& j);

// Each verb registers itself as a subcommand.
void register_info(CLI::App& app);
void register_synth(CLI::App& app);
void register_logits(CLI::App& app);
void register_run(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_plan(CLI::App& app);
void register_sweep(CLI::App& app);
void register_report(CLI::App& app);
void register_profile(CLI::App& app);
void register_serve(CLI::App& app);
void register_loadgen(CLI::App& app);
void register_vision(CLI::App& app);

}  // namespace shardwise::cli

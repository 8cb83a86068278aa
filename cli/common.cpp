// cli/common.cpp — shared verb helpers.
#include "cli/common.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/size.h"
#include "core/thread_pool.h"
#include "executor/cuda/cuda_device.h"

namespace shardwise::cli {

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t comma = text.find(',', i);
    std::string item = text.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 10)
      fail("--tokens: '", item, "' at item ", ids.size() + 1, " is not a token id (give e.g. --tokens 1,2,3)");
    long long v = std::stoll(item);
    if (v > INT32_MAX) fail("--tokens: id ", v, " is too large");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

const CLI::Validator kUnsignedInteger(
    [](const std::string& text) -> std::string {
      errno = 0;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
      (void)v;
      if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE || *end != '\0')
        return "'" + text + "' must be a whole number from 0 to 18446744073709551615";
      return "";
    },
    "UINT64");

void check_token_flag(const char* flag, int64_t value) {
  if (value < 0 || value > kMaxContext)
    fail(flag, " ", value, " is out of range: 0 (the default) or 1 to ", kMaxContext, " tokens");
}

const char* const kThreadsHelp = "CPU threads (0 = all cores; at most 4 x the hardware threads, and 1024)";

int resolve_threads(int threads) {
  if (threads < 0 || threads > max_cli_threads())
    fail("--threads ", threads, " is out of range: 0 (all cores) to ", max_cli_threads(), " (4 x the ",
         hardware_threads(), " hardware threads, at most ", kMaxPoolThreads, ")");
  return threads == 0 ? hardware_threads() : threads;
}

std::string resolve_cpu_device(const std::string& device) {
  if (device == "auto" || device == "cpu") return "cpu";
  if (device == "cuda" || device == "emu")
    fail("--device ", device, ": this verb runs on the CPU only (use `run` for the device executor)");
  fail("--device '", device, "' is unknown (auto, cuda, emu, cpu)");
}

// A builtin name, .yaml or config.json needs no weights; synthetic: specs are described without
// materialising them; files and directories are opened (and validated).
ModelSpec resolve_model_spec(const std::string& model, std::string* origin, DType* dtype_out, bool* has_weights,
                             std::map<std::string, DType>* file_dtypes) {
  const std::string synth = "synthetic:";
  struct stat st;
  *has_weights = false;
  if (model.compare(0, synth.size(), synth) == 0) {
    const ModelSpec s = parse_synthetic(model.substr(synth.size())).spec;  // all its options, checked
    *origin = model;
    *dtype_out = s.dtype;
    return s;
  }
  if (::stat(model.c_str(), &st) == 0 &&
      !(model.size() > 5 && (model.rfind(".yaml") == model.size() - 5 || model.rfind(".json") == model.size() - 5))) {
    auto src = open_weights(model);
    *origin = src->origin();
    *dtype_out = src->spec().dtype;
    *has_weights = true;
    if (file_dtypes)
      for (const auto& kv : src->tensors()) (*file_dtypes)[kv.first] = kv.second.dtype;
    return src->spec();
  }
  const bool looks_like_path =
      model.find('/') != std::string::npos || (model.size() > 5 && (model.compare(model.size() - 5, 5, ".gguf") == 0 ||
                                                                    model.compare(model.size() - 5, 5, ".json") == 0 ||
                                                                    model.compare(model.size() - 5, 5, ".yaml") == 0));
  if (looks_like_path && ::stat(model.c_str(), &st) != 0)
    fail(model,
         ": no such file or directory (MODEL is a .gguf file, an HF directory, synthetic:SPEC or a builtin spec)");
  ModelSpec s = resolve_spec(model);
  *origin = model;
  *dtype_out = s.dtype;
  return s;
}

std::string resolve_device(const std::string& device) {
  if (device == "auto") return cuda_device_count() > 0 ? "cuda" : "cpu";
  if (device == "cuda") {
    if (!cuda_built())
      fail("--device cuda: this build has no CUDA backend (build with nvcc present, SHARDWISE_CUDA=ON)");
    if (cuda_device_count() == 0)
      fail("--device cuda: no CUDA device is visible on this machine (try --device emu or cpu)");
    return device;
  }
  if (device == "emu" || device == "cpu") return device;
  fail("--device '", device, "' is unknown (auto, cuda, emu, cpu)");
}

void print_json(const nlohmann::json& j) {
  std::string s = j.dump();
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace shardwise::cli

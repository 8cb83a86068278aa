// cli/args.h — pure rules over the command line, apart from CLI11 so that tests check them without
// the binary: llama.cpp's flags of several letters after one dash in their long form, the valid name
// nearest a mistyped one, and whether a VRAM budget fits the GPU.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/hardware_spec.h"
#include "core/size.h"

namespace shardwise::cli {

// llama.cpp's multi-letter single-dash flags, which CLI11 reads as a short flag and its value
// (-ngl 10 as -n gl), and the long form each is parsed as (the verbs give each a meaning or an error).
struct LlamaFlag {
  const char* single_dash;
  const char* long_form;
};
inline constexpr LlamaFlag kLlamaFlags[] = {
    {"-ngl", "--n-gpu-layers"}, {"-no-cnv", "--no-cnv"},    {"-fa", "--flash-attn"},
    {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-np", "--parallel"},
};

// `args` (without the program name) with each of those flags in its long form; "--" ends the options,
// so nothing after it is rewritten.
inline std::vector<std::string> rewrite_llama_flags(std::vector<std::string> args) {
  for (auto& arg : args) {
    if (arg == "--") break;
    for (const LlamaFlag& f : kLlamaFlags)
      if (arg == f.single_dash) arg = f.long_form;
  }
  return args;
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours
// (the commonest typo, --modle) each count 1.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The candidate nearest `name` ("--modle" -> "--model"), or "" when none is near enough to be the one
// meant: within 1 edit for a name of up to 5 letters (dashes aside), 2 up to 10, 3 beyond; a name of
// one or two letters gets no suggestion (every short flag is one edit from it). Ties: the first.
inline std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  const size_t letters = name.size() - std::min(name.find_first_not_of('-'), name.size());
  const size_t limit = letters <= 2 ? 0 : letters <= 5 ? 1 : letters <= 10 ? 2 : 3;
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// Empty when a budget of `budget` bytes fits a GPU of `gpu_total` bytes; else the error line, naming
// the GPU's memory (a plan for more VRAM than the card has would fail at its first allocation).
inline std::string gpu_budget_error(const std::string& what, uint64_t budget, uint64_t gpu_total,
                                    const std::string& gpu_name) {
  if (budget <= gpu_total) return "";
  return str_cat(what, " (", format_bytes(budget), ") is more than the memory of the GPU (", gpu_name, ": ",
                 format_bytes(gpu_total),
                 "): give a budget of at most that, or leave --vram-budget out (on CUDA "
                 "the default is the free memory minus 1 GiB)");
}

// The builtin machine whose datasheet describes this GPU: its GPU name (e.g. "RTX 5090") within the
// name CUDA reports ("NVIDIA GeForce RTX 5090"), ignoring case; "" when none does.
inline std::string builtin_machine_for_gpu(const std::string& gpu_name) {
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  const std::string gpu = lower(gpu_name);
  for (const std::string& name : builtin_hardware_names()) {
    const std::string g = lower(builtin_hardware(name).gpu_name);
    if (!g.empty() && gpu.find(g) != std::string::npos) return name;
  }
  return "";
}

}  // namespace shardwise::cli

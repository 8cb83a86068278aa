// executor/cpu/blas_env.cpp — OpenBLAS kernel selection (see blas_env.h).
#include "executor/cpu/blas_env.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "executor/cpu/cpu_features.h"

extern "C" char* openblas_get_corename(void);

namespace shardwise {

const char* blas_core_name() {
  return openblas_get_corename();
}

void ensure_fast_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("SHARDWISE_BLAS_REEXEC") != nullptr) return;
  const Isa isa = cpu_max_isa();
  const char* want = isa == Isa::Avx512 ? "SkylakeX" : isa == Isa::Avx2 ? "Haswell" : nullptr;
  if (want == nullptr) return;
  std::string core = openblas_get_corename();
  for (auto& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // The cores OpenBLAS falls back to for CPUs it does not know; anything else it chose on purpose.
  static const char* kFallbacks[] = {"prescott", "core2",      "penryn",    "dunnington", "nehalem", "atom",
                                     "katmai",   "coppermine", "northwood", "banias",     "unknown", "sandybridge"};
  bool fallback = false;
  for (const char* f : kFallbacks) fallback = fallback || core == f;
  if (!fallback) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  setenv("SHARDWISE_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc?): carry on with the slow kernels.
}

}  // namespace shardwise

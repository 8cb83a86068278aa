// executor/cpu/kernels_avx512.cpp — AVX-512 kernels (compiled with their own flags).
// PLACEHOLDER until the SIMD kernels land: reports the level as absent so dispatch falls back.
#include "executor/cpu/kernels.h"

namespace shardwise {
const CpuKernels* avx512_kernels() { return nullptr; }
}  // namespace shardwise

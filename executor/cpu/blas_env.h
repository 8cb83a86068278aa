// executor/cpu/blas_env.h — makes sure OpenBLAS runs its fast kernels on this CPU.
// OpenBLAS picks its kernels when the library loads; version 0.3.21 does not recognise some recent
// Xeons and falls back to SSE3 ("Prescott") kernels, about 5x slower for sgemm. Call this first thing
// in main(): when OpenBLAS chose an old core although the CPU has AVX2 / AVX-512, it sets
// OPENBLAS_CORETYPE (Haswell / SkylakeX) and re-executes the program, once. An explicit
// OPENBLAS_CORETYPE from the user is always respected.
#pragma once

namespace shardwise {

void ensure_fast_blas(char** argv);
// The kernel set OpenBLAS is using ("SkylakeX", "Prescott", ...).
const char* blas_core_name();

}  // namespace shardwise

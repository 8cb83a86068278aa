// executor/cpu/cpu_features.h — which SIMD level this CPU offers, detected once from CPUID.
// Kernels are compiled per level (baseline AVX2+FMA+F16C; AVX-512 in its own files) and chosen at
// run time. SHARDWISE_ISA=scalar|avx2|avx512 caps the level (tests run every level the host has).
#pragma once

namespace shardwise {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const char* isa_name(Isa isa);
// Highest level the CPU supports (ignores SHARDWISE_ISA).
Isa cpu_max_isa();
// Level in use: min(cpu_max_isa(), SHARDWISE_ISA, set_isa_cap()).
Isa active_isa();
// Caps the level used from now on (for tests and benchmarks); returns the level in effect.
Isa set_isa_cap(Isa cap);

}  // namespace shardwise

// executor/cpu/cpu_features.cpp — CPUID-based ISA detection.
#include "executor/cpu/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace shardwise {
namespace {

Isa detect() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::Scalar;
  const bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!(fma && f16c && osxsave && avx)) return Isa::Scalar;
  unsigned xlo, xhi;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0x6) != 0x6) return Isa::Scalar;  // OS must save YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::Scalar;
  const bool avx2 = b & (1u << 5);
  if (!avx2) return Isa::Scalar;
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const bool zmm_saved = (xlo & 0xE6) == 0xE6;
  if (avx512f && avx512dq && avx512bw && avx512vl && zmm_saved) return Isa::Avx512;
  return Isa::Avx2;
#else
  return Isa::Scalar;
#endif
}

Isa env_cap() {
  const char* e = std::getenv("SHARDWISE_ISA");
  if (!e) return Isa::Avx512;
  std::string v = e;
  if (v == "scalar") return Isa::Scalar;
  if (v == "avx2") return Isa::Avx2;
  return Isa::Avx512;
}

std::atomic<int> g_cap{static_cast<int>(Isa::Avx512)};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

Isa cpu_max_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  static const Isa env = env_cap();
  int v = static_cast<int>(cpu_max_isa());
  v = std::min(v, static_cast<int>(env));
  v = std::min(v, g_cap.load());
  return static_cast<Isa>(v);
}

Isa set_isa_cap(Isa cap) {
  g_cap.store(static_cast<int>(cap));
  return active_isa();
}

}  // namespace shardwise

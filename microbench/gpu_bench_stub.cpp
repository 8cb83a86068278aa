// microbench/gpu_bench_stub.cpp — GpuBench in a build without CUDA: there is no GPU to profile.
#include "core/error.h"
#include "microbench/gpu_bench.h"

namespace shardwise {

std::unique_ptr<GpuBench> GpuBench::open(uint64_t) {
  fail("profile: this build has no CUDA backend; profile with --device cpu (a profile without GPU rows)");
}

}  // namespace shardwise

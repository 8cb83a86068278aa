// executor/cuda/cuda_device.h — CUDA device discovery and the first GPU kernels (dequantisation of
// GGUF blocks), behind a header with no CUDA types so that CPU-only code can include it.
// In a build without CUDA every function reports "no device" (count 0) and the kernels throw.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace shardwise {

struct CudaDeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int driver_version = 0;
  int runtime_version = 0;
};

bool cuda_built();                            // was this binary built with the CUDA backend?
int cuda_device_count();                      // 0 when not built, no driver or no device (never throws)
CudaDeviceInfo cuda_device_info(int device);  // throws Error on failure

// Whether the CUDA executor computes with weights of that type (the runtime refuses a model with a
// tensor it cannot, and `--device auto` then picks the CPU). False without CUDA.
bool cuda_computes_dtype(DType dtype);

// Dequantises n elements (a multiple of the block size) of `dtype` on the GPU: copies `src` to
// the device, runs the kernel, copies f32 back into dst. A self-contained check of the toolchain
// and of the block layouts on the device; the executor's kernels build on the same device code.
void cuda_dequantize(DType dtype, const void* src, float* dst, int64_t n);

}  // namespace shardwise

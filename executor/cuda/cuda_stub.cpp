// executor/cuda/cuda_stub.cpp — the CUDA entry points in a build without CUDA: no devices.
#include "core/error.h"
#include "executor/cuda/cuda_device.h"
#include "executor/device/device.h"

namespace shardwise {

bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
bool cuda_computes_dtype(DType) {
  return false;
}
CudaDeviceInfo cuda_device_info(int) {
  fail("this build has no CUDA backend (configure with SHARDWISE_CUDA=ON)");
}
std::unique_ptr<Device> make_cuda_device(int) {
  fail("--device cuda: this build has no CUDA backend (configure with SHARDWISE_CUDA=ON on a machine with nvcc)");
}
void cuda_dequantize(DType, const void*, float*, int64_t) {
  fail("this build has no CUDA backend (configure with SHARDWISE_CUDA=ON)");
}

}  // namespace shardwise

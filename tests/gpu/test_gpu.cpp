// GPU test suite: runs on the GPU machine; exits 77 (reported by CTest as skipped, not passed)
// where this build has no CUDA or the machine has no GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "executor/cuda/cuda_device.h"
#include "test_util.h"

using namespace shardwise;

TEST_CASE("CUDA device is visible and described", "[gpu]") {
  REQUIRE(cuda_device_count() >= 1);
  CudaDeviceInfo info = cuda_device_info(0);
  INFO(info.name);
  CHECK(!info.name.empty());
  CHECK(info.total_bytes > (1ull << 30));
  CHECK(info.free_bytes <= info.total_bytes);
}

TEST_CASE("GPU dequantisation is bit-exact with the CPU reference", "[gpu]") {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    for (int64_t n : {32, 4128, 32 * 1001}) {
      const auto x = test::random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + int(t)), -4.0f, 4.0f);
      std::vector<uint8_t> q(dtype_row_bytes(t, n));
      quantize_row(t, x.data(), q.data(), n);
      std::vector<float> cpu(static_cast<size_t>(n)), gpu(static_cast<size_t>(n), std::nanf(""));
      dequantize_row(t, q.data(), cpu.data(), n);
      cuda_dequantize(t, q.data(), gpu.data(), n);
      INFO(dtype_name(t) << " n=" << n);
      REQUIRE(std::memcmp(cpu.data(), gpu.data(), cpu.size() * 4) == 0);
    }
  }
}

int main(int argc, char** argv) {
  if (!cuda_built() || cuda_device_count() == 0) {
    std::printf("GPU tests skipped: %s\n", cuda_built() ? "no CUDA device on this machine" : "built without CUDA");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

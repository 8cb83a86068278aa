// GPU test suite: runs on the GPU machine; exits 77 (reported by CTest as skipped, not passed)
// where this build has no CUDA or the machine has no GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "executor/cuda/cuda_device.h"
#include "executor/ops/op_table.h"
#include "executor/reference/op_reference.h"
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

TEST_CASE("op table: dequant cases on the GPU are bit-exact with the reference", "[gpu]") {
  for (const OpCase& c : check_cases(OpId::Dequant)) {
    const int64_t n = c.cols;
    const auto x = test::random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + int(c.dtype)), -4.0f, 4.0f);
    std::vector<uint8_t> q(dtype_row_bytes(c.dtype, n));
    quantize_row(c.dtype, x.data(), q.data(), n);
    std::vector<float> gpu(static_cast<size_t>(n), std::nanf(""));
    cuda_dequantize(c.dtype, q.data(), gpu.data(), n);
    const OpReference ref = reference_dequant(c.dtype, q.data(), n);
    const RefCheck rc = compare_to_reference(gpu.data(), ref, c.tol);
    INFO(c.label() << ": " << describe(rc, gpu.data(), ref, c.tol));
    REQUIRE(rc.ok());
  }
}

int main(int argc, char** argv) {
  if (!cuda_built() || cuda_device_count() == 0) {
    std::printf("GPU tests skipped: %s\n", cuda_built() ? "no CUDA device on this machine" : "built without CUDA");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

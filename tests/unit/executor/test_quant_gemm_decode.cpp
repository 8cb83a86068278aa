// tests/unit/executor/test_quant_gemm_decode.cpp — the quantised prefill GEMM's weight decoding
// (executor/cuda/quant_gemm.cu), run on the host: for every block type it computes, the codes, scales and
// mins its kernels take from each stage give dequantize_row's weights, from rows at every alignment the
// kernels' loads distinguish. Built with CUDA only; needs no GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "executor/cuda/cuda_kernels.h"

namespace shardwise {
namespace {

// Byte offsets of a block's f16 fields (scale, min) that random bytes must not make infinite or NaN.
std::vector<int> half_fields(DType dt) {
  switch (dt) {
    case DType::Q2_K:
      return {80, 82};
    case DType::Q3_K:
      return {108};
    case DType::Q4_K:
    case DType::Q5_K:
      return {0, 2};
    case DType::Q6_K:
      return {208};
    default:  // q8_0, q4_0
      return {0};
  }
}

// Rows of `cols` columns: quantize_row of random values at several magnitudes, then random bytes (every code
// and sub-scale pattern, q6_K's scales of -128 included) with finite f16 fields.
std::vector<std::vector<uint8_t>> test_rows(DType dt, int64_t cols, std::mt19937& rng) {
  const uint64_t rb = dtype_row_bytes(dt, cols);
  std::vector<std::vector<uint8_t>> rows;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::vector<float> v(static_cast<size_t>(cols));
    for (float& x : v) x = scale * normal(rng);
    v[3] = 40.0f * scale;  // an outlier: its block's other codes are small
    std::vector<uint8_t> row(rb);
    quantize_row(dt, v.data(), row.data(), cols);
    rows.push_back(row);
  }
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> mag(-8.0f, 8.0f);
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> row(rb);
    for (uint8_t& b : row) b = static_cast<uint8_t>(byte(rng));
    const int64_t bb = dtype_block_bytes(dt);
    for (int64_t blk = 0; blk < static_cast<int64_t>(rb) / bb; ++blk)
      for (int off : half_fields(dt)) {
        const uint16_t h = f32_to_f16(std::ldexp(normal(rng), static_cast<int>(mag(rng))));
        std::memcpy(row.data() + blk * bb + off, &h, 2);
      }
    rows.push_back(row);
  }
  return rows;
}

TEST_CASE("the quantised GEMM kernels decode every block type's weights as dequantize_row does", "[kernels]") {
  std::mt19937 rng(7);
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    // q8_0 and q4_0: three blocks, so the last stage holds one; the K-quants: two super-blocks.
    const int64_t cols = dtype_block_elems(dt) == 32 ? 96 : 512;
    for (const std::vector<uint8_t>& row : test_rows(dt, cols, rng)) {
      std::vector<float> want(static_cast<size_t>(cols));
      dequantize_row(dt, row.data(), want.data(), cols);
      // 16 bytes into a buffer, then 0, 2 or 4 more: the kernels' 16-byte, funnel-shift and 4-byte loads,
      // with the bytes around the row that the funnel-shift loads read.
      for (int shift : {0, 2, 4}) {
        std::vector<uint8_t> buf(row.size() + 64, 0xAB);
        uint8_t* at = buf.data() + 16 + shift;
        std::memcpy(at, row.data(), row.size());
        std::vector<float> got(static_cast<size_t>(cols), -1.0f);
        cuda::quant_gemm_decode_row(dt, at, cols, got.data());
        int64_t bad = 0, first = -1;
        for (int64_t c = 0; c < cols; ++c)
          if (!(got[static_cast<size_t>(c)] == want[static_cast<size_t>(c)])) {
            if (first < 0) first = c;
            ++bad;
          }
        INFO(dtype_name(dt) << ", row at +" << shift << ": " << bad << " of " << cols << " columns differ, first "
                            << first << ": " << (first >= 0 ? got[static_cast<size_t>(first)] : 0.0f) << " against "
                            << (first >= 0 ? want[static_cast<size_t>(first)] : 0.0f));
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("the quantised GEMM decoding refuses types it has no kernel for, and partial blocks", "[kernels]") {
  std::vector<uint8_t> row(1024);
  std::vector<float> out(512);
  CHECK_THROWS_AS(cuda::quant_gemm_decode_row(DType::F16, row.data(), 256, out.data()), Error);
  CHECK_THROWS_AS(cuda::quant_gemm_decode_row(DType::Q4_1, row.data(), 256, out.data()), Error);
  CHECK_THROWS_AS(cuda::quant_gemm_decode_row(DType::Q4_K, row.data(), 128, out.data()), Error);
}

}  // namespace
}  // namespace shardwise

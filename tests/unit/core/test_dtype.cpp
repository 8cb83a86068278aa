// Tests for core/dtype: known bit patterns of f16/bf16 conversion and GGUF block layouts.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "test_util.h"

using namespace shardwise;
using Catch::Matchers::Contains;

TEST_CASE("f16 conversion matches IEEE half bit patterns", "[dtype]") {
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f32_to_f16(-2.0f) == 0xC000);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(0.5f) == 0x3800);
  CHECK(f32_to_f16(0.0f) == 0x0000);
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(5.9604645e-8f) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16(65520.0f) == 0x7C00);       // rounds up to infinity
  CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK((f32_to_f16(std::nanf("")) & 0x7C00) == 0x7C00);
  CHECK((f32_to_f16(std::nanf("")) & 0x03FF) != 0);
  // Round to nearest even: 1 + 2^-11 is halfway between 0x3C00 and 0x3C01 -> even (0x3C00);
  // 1 + 3*2^-11 is halfway between 0x3C01 and 0x3C02 -> even (0x3C02).
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(f16_to_f32(0xC000) == -2.0f);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(f16_to_f32(0x7C00)));
  CHECK(std::isnan(f16_to_f32(0x7E00)));
  // Every finite half survives a round trip exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    REQUIRE(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))) == h);
  }
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN quiet", "[dtype]") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(-2.0f) == 0xC000);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and the next value -> even (1.0).
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  uint16_t qnan = f32_to_bf16(std::nanf(""));
  CHECK(std::isnan(bf16_to_f32(qnan)));
}

TEST_CASE("Q8_0 quantises exactly like ggml's reference", "[dtype]") {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) / 8.0f;  // amax 2 at j = 0
  BlockQ8_0 b;
  quantize_row(DType::Q8_0, x, &b, 32);
  CHECK(b.d == 0x2408);  // f16(2/127)
  CHECK(b.qs[0] == -127);
  CHECK(b.qs[1] == -119);  // round(-15/8 * 63.5) = round(-119.06)
  CHECK(b.qs[16] == 0);
  CHECK(b.qs[31] == 119);
  float y[32];
  dequantize_row(DType::Q8_0, &b, y, 32);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == static_cast<float>(b.qs[j]) * f16_to_f32(b.d));
}

TEST_CASE("Q4_0 quantises exactly like ggml's reference", "[dtype]") {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // max magnitude -16 -> d = 2
  BlockQ4_0 b;
  quantize_row(DType::Q4_0, x, &b, 32);
  CHECK(f16_to_f32(b.d) == 2.0f);
  // q_j = min(15, (int8)(x_j / 2 + 8.5)); element j in the low nibble of qs[j], j+16 in the high.
  CHECK(b.qs[0] == 0x80);   // q0 = 0, q16 = 8
  CHECK(b.qs[1] == 0x91);   // q1 = 1, q17 = 9
  CHECK(b.qs[15] == 0xF8);  // q15 = 8, q31 = min(15, 16) = 15
  float y[32];
  dequantize_row(DType::Q4_0, &b, y, 32);
  CHECK(y[0] == -16.0f);
  CHECK(y[16] == 0.0f);
  CHECK(y[31] == 14.0f);
}

TEST_CASE("quantisation round trips within the type's resolution", "[dtype]") {
  const auto x = test::random_floats(32 * 37, 7, -3.0f, 3.0f);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> q(dtype_row_bytes(t, static_cast<int64_t>(x.size())));
    std::vector<float> y(x.size());
    quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    dequantize_row(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
    const double tol = t == DType::F32    ? 0
                       : t == DType::F16  ? 2e-3
                       : t == DType::BF16 ? 1.6e-2
                       : t == DType::Q8_0 ? 1.5e-2
                                          : 0.22;
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(std::fabs(y[i] - x[i]) <= tol * 3.0 + 1e-12);
  }
}

TEST_CASE("dtype sizes, names and unsupported GGML types", "[dtype]") {
  CHECK(dtype_row_bytes(DType::F32, 10) == 40);
  CHECK(dtype_row_bytes(DType::BF16, 10) == 20);
  CHECK(dtype_row_bytes(DType::Q8_0, 64) == 68);
  CHECK(dtype_row_bytes(DType::Q4_0, 64) == 36);
  CHECK(dtype_bits_per_elem(DType::Q4_0) == 4.5);
  CHECK_THROWS_WITH(dtype_row_bytes(DType::Q4_0, 33), Contains("32-element blocks"));
  CHECK(parse_dtype("Q8_0") == DType::Q8_0);
  CHECK(parse_dtype("bfloat16") == DType::BF16);
  CHECK(parse_dtype("Q4_K") == DType::Q4_K);
  CHECK(parse_dtype("iq4_nl") == DType::IQ4_NL);
  CHECK(std::string(dtype_name(DType::Q6_K)) == "q6_K");
  CHECK(dtype_row_bytes(DType::Q4_K, 512) == 288);
  CHECK(dtype_bits_per_elem(DType::Q6_K) == 6.5625);
  CHECK(dtype_bits_per_elem(DType::Q2_K) == 2.625);
  CHECK_THROWS_WITH(dtype_row_bytes(DType::Q4_K, 4096 + 32), Contains("256-element blocks"));
  CHECK_THROWS_WITH(parse_dtype("iq2_xs"), Contains("unknown dtype") && Contains("q4_K"));
  CHECK(std::string(ggml_type_name(12)) == "q4_K");
  CHECK(std::string(ggml_type_name(999)) == "type#999");
  CHECK_THROWS_WITH(dtype_from_ggml(17, "model.gguf: tensor 'blk.0.attn_q.weight'"),
                    Contains("blk.0.attn_q.weight") && Contains("iq2_xs") && Contains("not supported"));

  CHECK(dtype_from_ggml(30, "x") == DType::BF16);
  uint32_t be = 0, bb = 0;
  CHECK(ggml_type_block(10, &be, &bb));  // q2_K
  CHECK(be == 256);
  CHECK(bb == 84);
}

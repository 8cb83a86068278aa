// tests/unit/executor/test_op_table.cpp — the op table itself (executor/ops/op_table.h): its cases are
// well formed and keep the coverage the kernel tests had.
#include <algorithm>
#include <catch2/catch.hpp>
#include <utility>
#include <vector>

#include "executor/cpu/matmul.h"
#include "executor/ops/op_table.h"

namespace shardwise {
namespace {

using Dims = std::pair<int64_t, int64_t>;

bool has_matmul(DType dt, int64_t rows, int64_t cols, int64_t tokens) {
  for (const OpCase& c : check_cases(OpId::Matmul))
    if (c.dtype == dt && c.rows == rows && c.cols == cols && c.tokens == tokens) return true;
  return false;
}

}  // namespace

TEST_CASE("op table: every case is well formed", "[op_table]") {
  for (OpId op :
       {OpId::Matmul, OpId::Dequant, OpId::Attention, OpId::RmsNorm, OpId::Rope, OpId::Swiglu, OpId::Axpy, OpId::Dot}) {
    const std::vector<OpCase> cases = check_cases(op);
    INFO(op_name(op));
    REQUIRE(!cases.empty());
    for (const OpCase& c : cases) {
      INFO(c.label());
      CHECK(c.op == op);
      CHECK((c.tol.exact || c.tol.rtol > 0));
      CHECK(c.tol.exact == (op == OpId::Dequant));
      switch (op) {
        case OpId::Matmul:
          CHECK(c.cols % dtype_block_elems(c.dtype) == 0);
          CHECK(c.tokens * c.rows * c.cols <= kMaxReferenceMacs);
          break;
        case OpId::Dequant:
          CHECK(c.cols % dtype_block_elems(c.dtype) == 0);
          break;
        case OpId::Attention:
          CHECK(c.heads % c.kv_heads == 0);
          CHECK(c.kv_len >= c.pos0 + c.tokens);
          CHECK(c.head_dim >= 1);
          CHECK(c.head_dim <= 256);  // the CUDA kernels' limit
          break;
        case OpId::Rope:
          CHECK(c.head_dim % 2 == 0);
          break;
        default:
          CHECK(c.rows * c.cols > 0);
      }
    }
  }
}

TEST_CASE("op table: the matmul cases keep the shapes and token counts the kernel tests had", "[op_table]") {
  const int64_t thr = matmul_gemm_threshold();
  for (DType dt : weight_dtypes()) {
    INFO(dtype_name(dt));
    // The CPU GEMV kernels: every shape of their grid at 1..kGemvMaxTokens tokens.
    for (int64_t cols : {32, 96, 4096 + 32, 11520})
      for (int64_t rows : {1, 7, 111, 500})
        for (int64_t t = 1; t <= 4; ++t) CHECK(has_matmul(dt, rows, cols, t));
    // matmul() on both sides of its GEMM switch.
    for (Dims d : {Dims{131, 1056}, Dims{500, 96}})
      for (int64_t t :
           {int64_t(1), int64_t(2), int64_t(3), int64_t(4), int64_t(5), thr - 1, thr, thr + 1, int64_t(130)})
        CHECK(has_matmul(dt, d.first, d.second, t));
    // The CUDA matmul and its k-split GEMVs (200 tokens where the reference stays quick).
    for (Dims d : {Dims{1, 32}, Dims{37, 96}, Dims{64, 100}, Dims{300, 256}, Dims{129, 4096}, Dims{1000, 544},
                   Dims{4096, 160}, Dims{3, 11520}}) {
      if (d.second % dtype_block_elems(dt) != 0) continue;
      for (int64_t t : {1, 2, 3, 5, 8}) CHECK(has_matmul(dt, d.first, d.second, t));
      if (d.second == 11520) continue;  // (the k-split's shape only)
      for (int64_t t : {9, 33, 64}) CHECK(has_matmul(dt, d.first, d.second, t));
      if (d.first * d.second <= 300 * 256) CHECK(has_matmul(dt, d.first, d.second, 200));
    }
  }
  // Float rows of any length.
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t cols : {1, 7, 9, 17, 33, 1001})
      for (int64_t t = 1; t <= 4; ++t) CHECK(has_matmul(dt, 9, cols, t));
}

}  // namespace shardwise

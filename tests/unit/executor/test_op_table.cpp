// tests/unit/executor/test_op_table.cpp — the op table itself (executor/ops/op_table.h): its cases are
// well formed and keep the coverage the kernel tests had, and the shapes it gives the profiler are
// the grid `shardwise profile` measures (pinned here: a change to a builtin model must not move the
// grid unnoticed).
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/cpu/matmul.h"
#include "executor/ops/op_table.h"

namespace shardwise {
namespace {

using Dims = std::pair<int64_t, int64_t>;

std::vector<Dims> dims_of(const std::vector<MatrixShape>& m) {
  std::vector<Dims> d;
  for (const MatrixShape& s : m) d.emplace_back(s.rows, s.cols);
  return d;
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> layouts_of(const std::vector<AttentionLayout>& l) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (const AttentionLayout& a : l) out.emplace_back(a.heads, a.kv_heads, a.head_dim);
  return out;
}

std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> moes_of(const std::vector<MoeShape>& m) {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> out;
  for (const MoeShape& s : m) out.emplace_back(s.experts, s.top_k, s.ffn, s.hidden);
  return out;
}

bool has_matmul(DType dt, int64_t rows, int64_t cols, int64_t tokens) {
  static const std::set<std::tuple<int, int64_t, int64_t, int64_t>> cases = [] {
    std::set<std::tuple<int, int64_t, int64_t, int64_t>> s;
    for (const OpCase& c : check_cases(OpId::Matmul)) s.emplace(static_cast<int>(c.dtype), c.rows, c.cols, c.tokens);
    return s;
  }();
  return cases.count({static_cast<int>(dt), rows, cols, tokens}) > 0;
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
    // (the K-quants' 256-element blocks divide only 11520 of the four widths: they get 256 and 768 as well)
    const bool k_quant = dtype_block_elems(dt) == 256;
    std::vector<int64_t> widths = {32, 96, 4096 + 32, 11520};
    if (k_quant) widths = {256, 768, 11520};
    for (int64_t cols : widths)
      for (int64_t rows : {1, 7, 111, 500})
        for (int64_t t = 1; t <= 4; ++t)
          if (cols % dtype_block_elems(dt) == 0) CHECK(has_matmul(dt, rows, cols, t));
    // matmul() on both sides of its GEMM switch.
    for (Dims d : k_quant ? std::vector<Dims>{Dims{111, 768}} : std::vector<Dims>{Dims{131, 1056}, Dims{500, 96}})
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

TEST_CASE("op table: the full profile grid is the dense and MoE models' layers", "[op_table]") {
  const PerfGrid g = profile_grid(false);
  CHECK(dims_of(g.matrices) == std::vector<Dims>{{4096, 4096},
                                                 {1024, 4096},
                                                 {11520, 4096},
                                                 {4096, 11520},
                                                 {4096, 2048},
                                                 {512, 2048},
                                                 {2048, 4096},
                                                 {768, 2048},
                                                 {2048, 768},
                                                 {128, 2048},
                                                 {32768, 2048}});
  const int64_t last_gemv = matmul_gemm_threshold() - 1;
  std::vector<int64_t> cpu = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  if (!std::binary_search(cpu.begin(), cpu.end(), last_gemv))
    cpu.insert(std::lower_bound(cpu.begin(), cpu.end(), last_gemv), last_gemv);
  CHECK(g.cpu_tokens == cpu);
  CHECK(g.gpu_tokens == std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
  CHECK(layouts_of(g.attention) ==
        std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 8, 128}, {32, 4, 128}, {16, 16, 128}, {32, 32, 64}});
  CHECK(g.attention_tokens == std::vector<int64_t>{1, 4, 16, 64, 256, 1024});
  CHECK(g.contexts == std::vector<int64_t>{512, 2048, 8192, 32768, 65536, 131072});
  CHECK(moes_of(g.moe) ==
        std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
            {128, 8, 768, 2048}, {64, 4, 1024, 2048}, {32, 2, 2048, 1024}, {128, 8, 1024, 4096}, {64, 6, 2048, 2560}});
  CHECK(g.moe_tokens == std::vector<int64_t>{1, 4, 16, 64, 256, 1024});
  CHECK(g.gpu_moe_tokens == std::vector<int64_t>{1, 4, 16, 64, 256, 1024, 4096, 8192});
  CHECK(g.elems == std::vector<int64_t>{4096, 65536, 1 << 20, 1 << 23});
  CHECK(dims_of(g.contention_matrices) == std::vector<Dims>{{4096, 4096}, {11520, 4096}, {768, 2048}, {512, 2048}});
  CHECK(g.contention_tokens == std::vector<int64_t>{1, 4, 16, 64, 256, 1024});
  // The vision encoder's attention: Qwen2.5-VL's tower layout, windows and whole frames.
  CHECK(layouts_of(g.vision_attention) == std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 16, 80}});
  CHECK(g.vision_segments == std::vector<int64_t>{16, 64, 256, 1024, 4096, 16384});
  CHECK(g.vision_tokens == std::vector<int64_t>{1024, 4096, 16384});
}

TEST_CASE("op table: the validation cases are other models' layers, never in the profile grid", "[op_table]") {
  for (bool quick : {false, true}) {
    INFO((quick ? "quick" : "full"));
    const PerfGrid g = profile_grid(quick);
    const ValidationGrid v = validation_grid(quick);
    if (!quick) {
      CHECK(dims_of(v.matrices) == std::vector<Dims>{{4096, 3072},
                                                     {1024, 3072},
                                                     {3072, 4096},
                                                     {9216, 3072},
                                                     {3072, 9216},
                                                     {8192, 4096},
                                                     {512, 4096},
                                                     {4096, 8192}});
      CHECK(layouts_of(v.attention) == std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 8, 128}, {64, 4, 128}});
      CHECK(moes_of(v.moe) == std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{128, 8, 1536, 4096}});
      CHECK(v.tokens == std::vector<int64_t>{3, 24, 96, 768, 3000});
      CHECK(v.context == 24576);
    }
    const std::vector<Dims> grid = dims_of(g.matrices);
    for (Dims d : dims_of(v.matrices)) CHECK(std::find(grid.begin(), grid.end(), d) == grid.end());
    for (int64_t t : v.tokens) CHECK(std::find(g.cpu_tokens.begin(), g.cpu_tokens.end(), t) == g.cpu_tokens.end());
    CHECK(std::find(g.contexts.begin(), g.contexts.end(), v.context) == g.contexts.end());
    // Vision attention cases: rows or segment length off the grid's (each a row count the grid never has).
    CHECK(layouts_of(v.vision_attention) == layouts_of(g.vision_attention));
    CHECK(!v.vision_cases.empty());
    for (const auto& [rows, segment] : v.vision_cases) {
      CHECK(segment <= rows);
      CHECK(std::find(g.vision_tokens.begin(), g.vision_tokens.end(), rows) == g.vision_tokens.end());
    }
  }
}

}  // namespace shardwise

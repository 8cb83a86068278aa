// executor/ops/op_table.h — the op cases, defined once (in the spirit of ggml's test-backend-ops): every
// kernel op with its dtypes, shapes (odd sizes included), token counts and tolerance against the f64
// reference (executor/reference/op_reference.h), and the model-derived shapes that are timed.
//
//   check_cases(op)  the correctness sweep: the CPU kernel tests (every ISA level) and the CUDA kernel
//                    tests run every case of an op their backend has a kernel for, each against the
//                    f64 reference within the case's tolerance.
//   profile_grid, validation_grid, perf_dense_model, perf_moe_model
//                    what `shardwise profile`, its validation and the benchmarks time, drawn from the
//                    builtin models' shapes (layer_matrices, attention_layout, moe_shape of a ModelSpec).
//
// Adding an op: one OpId, one entry in check_cases() (op_table.cpp), one reference function, and the
// backends' runners in the kernel tests. Nothing here runs a kernel.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/model_spec.h"

namespace shardwise {

enum class OpId {
  Matmul,     // y[t, r] = sum_c W[r, c] x[t, c]: the GEMV kernels (few tokens) and the GEMM path
  Dequant,    // one row of a weight dtype to f32
  Attention,  // causal GQA attention of `tokens` queries at positions pos0.. over a KV cache
  RmsNorm,    // y = x / sqrt(mean(x^2) + eps) * w, per row
  Rope,       // rotary embedding of the heads of each token row, both pairings
  Swiglu,     // gate = silu(gate) * up
  Axpy,       // y += a x
  Dot,        // sum a b (f32)
};
const char* op_name(OpId op);

// A result element passes when |got - ref| <= atol + rtol * mag, with the reference's double result
// `ref` and magnitude `mag` (op_reference.h says per op what mag is: the sum of the terms' magnitudes
// for dot products, |ref| for element-wise ops); exact: equal bit for bit (NaN stays NaN).
struct Tolerance {
  double atol = 0, rtol = 0;
  bool exact = false;
  double bound(double mag) const { return atol + rtol * mag; }
};

// One case. Fields an op does not use stay 0.
struct OpCase {
  OpId op = OpId::Matmul;
  DType dtype = DType::F32;  // Matmul, Dequant: the weights' dtype; Attention: the KV cache's; activations are f32
  int64_t rows = 1;          // Matmul: W {rows, cols}; RmsNorm, Swiglu: rows of `cols` elements
  int64_t cols = 0;          // Matmul: W's columns; Dequant, Axpy, Dot, RmsNorm, Swiglu: elements per row
  int64_t tokens = 1;        // Matmul: activation rows; Attention, Rope: token rows of the step
  // Attention, Rope: the head layout; Attention: queries at positions pos0 .. pos0 + tokens - 1 over a
  // cache of kv_len positions (kv_len > pos0 + tokens: rows past the last query that must not be read).
  int64_t heads = 0, kv_heads = 0, head_dim = 0, pos0 = 0, kv_len = 0;
  int threads = 0;  // CPU pool size where the CPU's work split depends on it (Attention); 0 = any
  Tolerance tol;
  std::string label() const;  // e.g. "matmul q4_0 111x4128 t3", "attention 8/2x64 t37 pos0 0 kv 37"
};

// The tolerance every case of `op` is checked with (weights are converted to f32 exactly, so one
// tolerance serves every dtype).
Tolerance tolerance(OpId op);

// Every case of `op`, in a fixed order (dtype, then shape, then tokens). Matmul cases are every
// (dtype, shape, tokens) whose columns the dtype's block divides and whose reference costs at most
// kMaxReferenceMacs multiply-adds.
std::vector<OpCase> check_cases(OpId op);
constexpr int64_t kMaxReferenceMacs = 4096 * 160 * 64;

// Every weight dtype: each op that reads weights is checked in all of them, on the CPU and on CUDA.
const std::vector<DType>& weight_dtypes();
// The dtypes the profiler times (f32, f16, bf16, q8_0, q4_0); the other block types are priced from these
// (the measured cost model's nearest type by bits per weight).
const std::vector<DType>& profiled_dtypes();

// ---- model-derived shapes (what is timed) ------------------------------------------------------------

// One matrix of a layer, by its role: "q", "kv" (k and v), "o", "gate_up", "down" (dense FFN),
// "router", "expert_gate_up", "expert_down" (one expert of an MoE FFN).
struct MatrixShape {
  std::string role;
  int64_t rows = 0, cols = 0;
};
// A layer's distinct matrix shapes, in the order q, kv, o, FFN (dense, or the experts and the router);
// `with_experts` false leaves an MoE layer's experts and router out.
std::vector<MatrixShape> layer_matrices(const ModelSpec& spec, bool with_experts = true);
MatrixShape layer_matrix(const ModelSpec& spec, const std::string& role);  // Error when the layer has none

struct AttentionLayout {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
};
AttentionLayout attention_layout(const ModelSpec& spec);

struct MoeShape {
  int64_t experts = 0, top_k = 0, ffn = 0, hidden = 0;  // ffn: one expert's width
};
MoeShape moe_shape(const ModelSpec& spec);  // Error for a dense model

// The op shapes of the profiler's grid (`shardwise profile`; --quick: a small grid for tests and demos).
struct PerfGrid {
  std::vector<MatrixShape> matrices;
  std::vector<int64_t> cpu_tokens, gpu_tokens;  // Matmul token counts per backend
  std::vector<AttentionLayout> attention;
  std::vector<int64_t> attention_tokens, contexts;
  std::vector<MoeShape> moe;
  std::vector<int64_t> moe_tokens, gpu_moe_tokens;
  std::vector<int64_t> elems;                    // Norm / Rope / Elementwise / Embed: f32 elements
  std::vector<MatrixShape> contention_matrices;  // timed again under copy traffic
  std::vector<int64_t> contention_tokens;
  // The vision encoder's attention (GPU): head layouts, segment lengths (windows and whole frames) and
  // row counts; each row count at least its segment length.
  std::vector<AttentionLayout> vision_attention;
  std::vector<int64_t> vision_segments, vision_tokens;
};
// The full grid: the layers of the dense and the MoE model the profile is for (perf_dense_model,
// perf_moe_model), MHA layouts and other expert shapes beside them; the quick grid: small shapes.
PerfGrid profile_grid(bool quick);
// Cases the profile's grid never has, to validate its fit: other models' layers (nemo4b's and
// qwen235b's), other token counts, a longer context.
struct ValidationGrid {
  std::vector<MatrixShape> matrices;
  std::vector<int64_t> tokens;
  std::vector<AttentionLayout> attention;
  int64_t context = 0;
  std::vector<MoeShape> moe;
  std::vector<DType> dtypes;
  // The vision encoder's attention: (rows, segment length) pairs of other image sizes than the grid's.
  std::vector<AttentionLayout> vision_attention;
  std::vector<std::pair<int64_t, int64_t>> vision_cases;
};
ValidationGrid validation_grid(bool quick);

// The models whose shapes are timed: a dense one (nemo8b) and an MoE one (qwen30b).
ModelSpec perf_dense_model();
ModelSpec perf_moe_model();
constexpr int64_t kPrefillTokens = 512;  // the prefill step the benchmarks time (decode: 1 token)

}  // namespace shardwise

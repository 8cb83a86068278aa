// executor/ops/op_table.cpp — the op cases and the timed shapes (see op_table.h).
#include "executor/ops/op_table.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "executor/cpu/matmul.h"

namespace shardwise {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::Matmul:
      return "matmul";
    case OpId::Dequant:
      return "dequant";
    case OpId::Attention:
      return "attention";
    case OpId::RmsNorm:
      return "rms_norm";
    case OpId::Rope:
      return "rope";
    case OpId::Swiglu:
      return "swiglu";
    case OpId::Axpy:
      return "axpy";
    case OpId::Dot:
      return "dot";
  }
  return "?";
}

std::string OpCase::label() const {
  std::ostringstream s;
  s << op_name(op);
  switch (op) {
    case OpId::Matmul:
      s << " " << dtype_name(dtype) << " " << rows << "x" << cols << " t" << tokens;
      break;
    case OpId::Dequant:
      s << " " << dtype_name(dtype) << " n " << cols;
      break;
    case OpId::Attention:
      s << " " << heads << "/" << kv_heads << "x" << head_dim << " t" << tokens << " pos0 " << pos0 << " kv " << kv_len;
      if (dtype != DType::F32) s << " " << dtype_name(dtype) << " cache";
      if (threads > 0) s << " threads " << threads;
      break;
    case OpId::Rope:
      s << " t" << tokens << " " << heads << "x" << head_dim << " pos0 " << pos0;
      break;
    default:
      s << " " << rows << "x" << cols;
  }
  return s.str();
}

Tolerance tolerance(OpId op) {
  switch (op) {
    case OpId::Matmul:
      return {0, 1e-5, false};  // f32 accumulation: relative to sum |w x|
    case OpId::Dequant:
      return {0, 0, true};
    // Relative to the output's magnitude grown by the scores' (op_reference.h).
    case OpId::Attention:
      return {1e-6, 1e-5, false};
    case OpId::RmsNorm:
      return {0, 1e-5, false};
    case OpId::Rope:
      return {0, 1e-6, false};  // relative to |a| + |b| of the rotated pair
    // |gate| up to 95 (exp beyond the f32 range) in the tests' data: results below any float, hence
    // the absolute floor.
    case OpId::Swiglu:
      return {1e-30, 1e-6, false};
    case OpId::Axpy:
      return {0, 1e-6, false};
    case OpId::Dot:
      return {1e-6, 1e-5, false};
  }
  return {};
}

const std::vector<DType>& weight_dtypes() {
  static const std::vector<DType> d(std::begin(kAllDTypes), std::end(kAllDTypes));
  return d;
}

const std::vector<DType>& profiled_dtypes() {
  static const std::vector<DType> d = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  return d;
}

namespace {

// ---- the correctness sweep ---------------------------------------------------------------------------

struct Dims {
  int64_t rows, cols;
};

// Weight matrices: one row, seven (below a group of eight), 111 and 500 rows by one block, three, 4096 +
// one and 11520 (nemo8b's FFN width) columns; short float rows of any length (vector tails: quantised
// dtypes skip them); rows shorter than a warp's step (3), f16 rows that are not 16-byte aligned (100),
// many rows of few columns (4096x160) and blocks of 17 and 33.
std::vector<Dims> matmul_shapes(DType dt) {
  std::vector<Dims> s;
  for (int64_t cols : {32, 96, 4096 + 32, 11520})
    for (int64_t rows : {1, 7, 111, 500}) s.push_back({rows, cols});
  // Rows of one and three 256-element blocks for the K-quants, whose blocks few of the shapes above divide.
  if (dtype_block_elems(dt) == kQK_K)
    for (int64_t cols : {256, 768})
      for (int64_t rows : {1, 7, 111, 500}) s.push_back({rows, cols});
  for (int64_t cols : {1, 7, 9, 17, 33, 1001}) s.push_back({9, cols});
  for (Dims d : {Dims{131, 1056}, Dims{37, 96}, Dims{64, 100}, Dims{300, 256}, Dims{129, 4096}, Dims{1000, 544},
                 Dims{4096, 160}, Dims{3, 11520}})
    s.push_back(d);
  return s;
}

// 1..5: the CPU GEMV kernels' token groups (kGemvMaxTokens) and one past them; 8, 9: either side of the
// CUDA GEMV / GEMM switch; the CPU's GEMM switch (matmul_gemm_threshold) and either side of it; 64, 130,
// 200: GEMMs of several tiles.
std::vector<int64_t> matmul_tokens() {
  const int64_t thr = matmul_gemm_threshold();
  std::vector<int64_t> t = {1, 2, 3, 4, 5, 8, 9, thr - 1, thr, thr + 1, 64, 130, 200};
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

std::vector<OpCase> matmul_cases() {
  std::vector<OpCase> out;
  for (DType dt : weight_dtypes())
    for (Dims d : matmul_shapes(dt)) {
      if (d.cols % dtype_block_elems(dt) != 0) continue;
      for (int64_t t : matmul_tokens()) {
        if (t * d.rows * d.cols > kMaxReferenceMacs) continue;
        OpCase c;
        c.op = OpId::Matmul;
        c.dtype = dt;
        c.rows = d.rows;
        c.cols = d.cols;
        c.tokens = t;
        c.tol = tolerance(OpId::Matmul);
        out.push_back(c);
      }
    }
  return out;
}

std::vector<OpCase> dequant_cases() {
  std::vector<OpCase> out;
  for (DType dt : weight_dtypes())
    for (int64_t n : {1, 7, 9, 31, 32, 33, 96, 1001, 4096 + 32, 11520, 32 * 1001}) {
      if (n % dtype_block_elems(dt) != 0) continue;
      OpCase c;
      c.op = OpId::Dequant;
      c.dtype = dt;
      c.cols = n;
      c.tol = tolerance(OpId::Dequant);
      out.push_back(c);
    }
  return out;
}

OpCase attn(int64_t heads, int64_t kv_heads, int64_t hd, int64_t n, int64_t pos0, int64_t kv_len = 0, int threads = 0) {
  OpCase c;
  c.op = OpId::Attention;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = hd;
  c.tokens = n;
  c.pos0 = pos0;
  c.kv_len = kv_len > 0 ? kv_len : pos0 + n;
  c.threads = threads;
  c.tol = tolerance(OpId::Attention);
  return c;
}

// Head sizes below, at and between vector widths and up to 256 (the CUDA kernels' padded sizes and
// element-wise loads included), GQA groups 1..8 and odd head counts, prefill chunks over cached
// prefixes, decode over long contexts with the CPU's key splits at several thread counts, and short
// contexts (one split, partial steps of keys).
std::vector<OpCase> attention_cases() {
  std::vector<OpCase> out;
  const int64_t groups[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 5}, {6, 2}, {7, 1}, {8, 1}, {12, 3}};
  for (int64_t hd : {8, 16, 24, 32, 40, 48, 64, 128})
    for (const auto& g : groups) out.push_back(attn(g[0], g[1], hd, 3, 0, 0, 2));
  out.push_back(attn(8, 2, 64, 37, 0, 0, 3));       // a prompt, causal inside one chunk
  out.push_back(attn(6, 3, 48, 21, 50, 0, 2));      // a second chunk over a cached prefix
  out.push_back(attn(4, 1, 24, 100, 129, 300, 4));  // many token blocks; a cache longer than used
  out.push_back(attn(32, 8, 128, 70, 1000, 0, 3));  // nemo8b's heads
  out.push_back(attn(3, 3, 16, 9, 4000, 0, 1));     // a short chunk over a long cache: keys split
  for (int threads : {1, 2, 5, 16}) out.push_back(attn(32, 8, 128, 1, 4999, 0, threads));
  for (int threads : {1, 2, 5, 16}) out.push_back(attn(7, 1, 40, 2, 9000, 9100, threads));
  out.push_back(attn(2, 2, 8, 1, 20000, 0, 3));
  out.push_back(attn(8, 1, 128, 1, 511, 0, 4));  // exactly one split chunk
  out.push_back(attn(8, 1, 128, 1, 512, 0, 4));  // one key into the second chunk
  // Long contexts: deep split-K decode, tiled prefill.
  for (const OpCase& c :
       {attn(8, 2, 128, 1, 4095), attn(8, 2, 128, 5, 4000), attn(8, 8, 64, 1, 2999), attn(8, 2, 128, 100, 3996),
        attn(4, 1, 32, 300, 0), attn(2, 1, 256, 70, 1000), attn(16, 4, 64, 8, 5000)})
    out.push_back(c);
  // Short contexts at every full head size.
  for (int64_t hd : {32, 64, 128, 256})
    for (int64_t kv_len : {1, 31, 33, 100})
      for (int64_t n : {1, 3, 8})
        if (kv_len >= n) out.push_back(attn(8, 2, hd, n, kv_len - n));
  // Any head_dim: decode and prefill at the padded sizes, then head_dim % 4 != 0 and the edges.
  for (int64_t hd : {8, 24, 48, 80, 96})
    for (const OpCase& c : {attn(4, 4, hd, 1, 37), attn(6, 2, hd, 3, 100), attn(8, 2, hd, 5, 1500),
                            attn(4, 1, hd, 77, 0), attn(3, 3, hd, 33, 300), attn(4, 2, hd, 129, 2000)})
      out.push_back(c);
  for (int64_t hd : {1, 2, 6, 10, 30, 33, 62, 100, 130, 200, 254, 256})
    for (const OpCase& c : {attn(4, 2, hd, 1, 300), attn(2, 1, hd, 3, 0), attn(4, 2, hd, 21, 250)}) out.push_back(c);
  // q8_0 caches (head_dims of whole blocks): decode with split keys, a prefill chunk over a cached prefix,
  // a cache longer than used, a padded head_dim (96) decoding and prefilling, 256, short contexts.
  for (OpCase c : {attn(8, 2, 128, 1, 4999, 0, 2), attn(6, 2, 64, 21, 50, 0, 2), attn(4, 1, 32, 100, 129, 300, 4),
                   attn(6, 2, 96, 5, 1500), attn(4, 1, 96, 77, 0), attn(2, 1, 256, 70, 1000), attn(8, 2, 64, 3, 30),
                   attn(8, 2, 32, 1, 0)}) {
    c.dtype = DType::Q8_0;
    out.push_back(c);
  }
  return out;
}

std::vector<OpCase> row_cases(OpId op, int64_t rows, std::initializer_list<int64_t> widths) {
  std::vector<OpCase> out;
  for (int64_t w : widths) {
    OpCase c;
    c.op = op;
    c.rows = rows;
    c.cols = w;
    c.tol = tolerance(op);
    out.push_back(c);
  }
  return out;
}

std::vector<OpCase> rope_cases() {
  std::vector<OpCase> out;
  struct R {
    int64_t tokens, heads, hd, pos0;
  };
  // nemo8b's heads, a long position, odd half sizes (head_dim 10 and 2).
  for (R r : {R{3, 4, 128, 0}, R{5, 3, 64, 4000}, R{1, 32, 128, 40000}, R{7, 2, 10, 37}, R{2, 6, 2, 9}}) {
    OpCase c;
    c.op = OpId::Rope;
    c.tokens = r.tokens;
    c.heads = r.heads;
    c.head_dim = r.hd;
    c.pos0 = r.pos0;
    c.tol = tolerance(OpId::Rope);
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::vector<OpCase> check_cases(OpId op) {
  switch (op) {
    case OpId::Matmul:
      return matmul_cases();
    case OpId::Dequant:
      return dequant_cases();
    case OpId::Attention:
      return attention_cases();
    // Rows of 1 (a single element per row), 96, 1000 and 4096.
    case OpId::RmsNorm:
      return row_cases(op, 7, {1, 96, 1000, 4096});
    case OpId::Rope:
      return rope_cases();
    // Vector tails around 8 and 16 lanes, an odd width and long rows (nemo8b's FFN width).
    case OpId::Swiglu:
      return row_cases(op, 5, {1, 7, 8, 15, 16, 17, 33, 333, 4097, 11520});
    case OpId::Axpy:
    case OpId::Dot:
      return row_cases(op, 1, {1, 7, 8, 31, 33, 4097, 11520});
  }
  return {};
}

// ---- model-derived shapes ------------------------------------------------------------------------------

std::vector<MatrixShape> layer_matrices(const ModelSpec& s, bool with_experts) {
  std::vector<MatrixShape> m = {
      {"q", s.q_dim(), s.hidden_size}, {"kv", s.kv_dim(), s.hidden_size}, {"o", s.hidden_size, s.q_dim()}};
  if (s.is_moe()) {
    if (with_experts) {
      m.push_back({"expert_gate_up", s.moe_intermediate_size, s.hidden_size});
      m.push_back({"expert_down", s.hidden_size, s.moe_intermediate_size});
      m.push_back({"router", s.num_experts, s.hidden_size});
    }
  } else {
    m.push_back({"gate_up", s.intermediate_size, s.hidden_size});
    m.push_back({"down", s.hidden_size, s.intermediate_size});
  }
  return m;
}

MatrixShape layer_matrix(const ModelSpec& spec, const std::string& role) {
  for (const MatrixShape& m : layer_matrices(spec))
    if (m.role == role) return m;
  fail("op table: ", spec.name, " has no ", role, " matrix");
}

AttentionLayout attention_layout(const ModelSpec& s) {
  return {s.num_attention_heads, s.num_key_value_heads, s.head_dim};
}

MoeShape moe_shape(const ModelSpec& s) {
  SW_CHECK(s.is_moe(), "op table: ", s.name, " has no experts");
  return {s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size, s.hidden_size};
}

ModelSpec perf_dense_model() {
  return builtin_spec("nemo8b");
}
ModelSpec perf_moe_model() {
  return builtin_spec("qwen30b");
}

namespace {

// Appends the shapes of `add` whose (rows, cols) `to` does not have yet, in order.
void add_distinct(std::vector<MatrixShape>& to, const std::vector<MatrixShape>& add) {
  for (const MatrixShape& m : add)
    if (std::none_of(to.begin(), to.end(), [&](const MatrixShape& t) { return t.rows == m.rows && t.cols == m.cols; }))
      to.push_back(m);
}

PerfGrid quick_grid() {
  PerfGrid g;
  g.matrices = {{"small", 256, 512}, {"small", 512, 256}, {"small", 1024, 512}, {"small", 128, 1024}};
  g.cpu_tokens = g.gpu_tokens = {1, 4, 16, 64};
  g.attention = {{8, 2, 64}, {8, 8, 32}};
  g.attention_tokens = {1, 16};
  g.contexts = {256, 1024};
  g.moe = {{16, 4, 128, 256}};
  g.moe_tokens = g.gpu_moe_tokens = {1, 16};
  g.elems = {4096, 65536, 1 << 20};
  g.contention_matrices = {{"small", 1024, 512}};
  g.contention_tokens = {1, 16};
  g.vision_attention = {{4, 4, 16}};
  g.vision_segments = {16, 64};
  g.vision_tokens = {64, 256};
  return g;
}

PerfGrid full_grid() {
  const ModelSpec dense = perf_dense_model(), moe = perf_moe_model();
  PerfGrid g;
  add_distinct(g.matrices, layer_matrices(dense));
  add_distinct(g.matrices, layer_matrices(moe));
  add_distinct(g.matrices, {{"lm_head_rows", 32768, moe.hidden_size}});  // rows beyond any layer's: LM heads
  g.cpu_tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  g.gpu_tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  g.attention = {attention_layout(dense), attention_layout(moe), {16, 16, 128}, {32, 32, 64}};  // and two MHA layouts
  g.attention_tokens = {1, 4, 16, 64, 256, 1024};
  g.contexts = {512, 2048, 8192, 32768, 65536, 131072};  // to 128K: the longest contexts the planner places
  g.moe = {moe_shape(moe), {64, 4, 1024, 2048}, {32, 2, 2048, 1024}, {128, 8, 1024, 4096}, {64, 6, 2048, 2560}};
  g.moe_tokens = {1, 4, 16, 64, 256, 1024};
  // The GPU runs MoE prefills whose routers send hundreds of tokens to each expert (the synthetic
  // qwen30b sends ~430 of 512 tokens x 8 to each of ~10 experts; a real one 256 per expert at a 4K
  // chunk): uniform rows up to 8192 tokens (512 per expert of 128) cover them.
  g.gpu_moe_tokens = {1, 4, 16, 64, 256, 1024, 4096, 8192};
  g.elems = {4096, 65536, 1 << 20, 1 << 23};
  g.contention_matrices = {layer_matrix(dense, "q"), layer_matrix(dense, "gate_up"),
                           layer_matrix(moe, "expert_gate_up"), layer_matrix(moe, "kv")};
  g.contention_tokens = {1, 4, 16, 64, 256, 1024};
  // Qwen2.5-VL's towers (1280 wide: 16 heads of 80): windows of up to 64 patches (fewer at a frame's
  // edge), whole frames of 2K-19K patches from 480p to 1440p.
  g.vision_attention = {{16, 16, 80}};
  g.vision_segments = {16, 64, 256, 1024, 4096, 16384};
  g.vision_tokens = {1024, 4096, 16384};
  return g;
}

}  // namespace

PerfGrid profile_grid(bool quick) {
  PerfGrid g = quick ? quick_grid() : full_grid();
  // CPU matmuls switch from the GEMV kernels to dequantise + sgemm at matmul_gemm_threshold() tokens,
  // ~3x slower at the switch on the GPU host (16 threads, f16 4096x4096: 16 tokens 0.78 ms by GEMV, 32
  // tokens 2.26 ms by sgemm): the last GEMV count is measured too, so that counts between the grid's
  // powers of two interpolate on the kernel that runs them, never across the switch.
  const int64_t last_gemv = matmul_gemm_threshold() - 1;
  std::vector<int64_t>& t = g.cpu_tokens;
  if (last_gemv > t.front() && last_gemv < t.back() && !std::binary_search(t.begin(), t.end(), last_gemv))
    t.insert(std::lower_bound(t.begin(), t.end(), last_gemv), last_gemv);
  return g;
}

ValidationGrid validation_grid(bool quick) {
  ValidationGrid v;
  if (quick) {
    v.matrices = {{"small", 384, 512}, {"small", 768, 256}};
    v.tokens = {3, 24};
    v.attention = {{8, 4, 64}};
    v.context = 600;
    v.moe = {{16, 4, 192, 256}};
    v.dtypes = {DType::F16, DType::Q4_0};
    v.vision_attention = {{4, 4, 16}};
    v.vision_cases = {{96, 96}, {192, 32}};
    return v;
  }
  const ModelSpec nemo4b = builtin_spec("nemo4b"), qwen235b = builtin_spec("qwen235b");
  add_distinct(v.matrices, layer_matrices(nemo4b));
  add_distinct(v.matrices, layer_matrices(qwen235b, false));
  v.tokens = {3, 24, 96, 768, 3000};
  v.attention = {attention_layout(nemo4b), attention_layout(qwen235b)};
  v.context = 24576;
  v.moe = {moe_shape(qwen235b)};
  v.dtypes = {DType::F16, DType::Q8_0, DType::Q4_0};
  // Whole frames of a 480p and a 1080p image, and the windows of a 720p one (64 patches, and the
  // smaller windows at a frame's edge).
  v.vision_attention = {{16, 16, 80}};
  v.vision_cases = {{2040, 2040}, {10764, 10764}, {4800, 64}, {4800, 40}};
  return v;
}

}  // namespace shardwise

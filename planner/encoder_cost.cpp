// planner/encoder_cost.cpp — see encoder_cost.h.
#include "planner/encoder_cost.h"

#include <algorithm>
#include <map>

namespace shardwise {
namespace {

double matmul_ms(const CostModel& c, DType t, int64_t tokens, int64_t rows, int64_t cols) {
  Op op;
  op.kind = OpKind::Matmul;
  op.dtype = t;
  op.tokens = tokens;
  op.rows = rows;
  op.cols = cols;
  return c.op_ms(op, ExecEnv{Backend::Gpu});
}

double elems_ms(const CostModel& c, OpKind k, int64_t elems) {
  Op op;
  op.kind = k;
  op.elems = elems;
  return c.op_ms(op, ExecEnv{Backend::Gpu});
}

// The attention kernel's one launch over segments of these lengths (each query attends its whole
// segment), priced per segment length as that length's segments' rows: the windows of one length
// are one row count.
double attention_ms(const CostModel& c, const EncoderShape& s, const std::vector<int64_t>& segments) {
  std::map<int64_t, int64_t> count;
  for (int64_t l : segments)
    if (l > 0) ++count[l];
  double ms = 0;
  for (const auto& [len, n] : count) {
    Op op;
    op.kind = OpKind::VisionAttention;
    op.dtype = DType::F32;
    op.tokens = len * n;
    op.ctx = len;
    op.n_heads = op.n_kv_heads = s.heads;
    op.head_dim = s.head_dim;
    ms += c.op_ms(op, ExecEnv{Backend::Gpu});
  }
  return ms;
}

double block_ms(const CostModel& c, const EncoderShape& s, bool full) {
  const int64_t n = s.tokens, h = s.hidden, f = s.intermediate;
  double ms = 2 * elems_ms(c, OpKind::Norm, n * h) + elems_ms(c, OpKind::Rope, 2 * n * h);
  ms += matmul_ms(c, s.dtype, n, 3 * h, h) + matmul_ms(c, s.dtype, n, h, h);
  ms += attention_ms(c, s, full ? s.frames : s.windows);
  for (int64_t t0 = 0; t0 < n; t0 += s.mlp_chunk) {
    const int64_t k = std::min(s.mlp_chunk, n - t0);
    ms += 2 * matmul_ms(c, s.dtype, k, f, h) + matmul_ms(c, s.dtype, k, h, f) + elems_ms(c, OpKind::Elementwise, k * f);
  }
  return ms + elems_ms(c, OpKind::Elementwise, 4 * n * h);  // biases and residual adds
}

}  // namespace

EncoderCost predict_encoder(const CostModel& c, const EncoderShape& s) {
  EncoderCost r;
  const int64_t depth = static_cast<int64_t>(s.full_attention.size());
  if (depth == 0 || s.tokens <= 0) return r;
  r.block_compute_ms = block_ms(c, s, false);
  r.full_block_compute_ms = block_ms(c, s, true);
  r.copy_ms = c.transfer_ms(s.block_bytes, Direction::HostToDevice, s.pinned);
  const int64_t tokens = s.tokens / s.merge_unit, m = s.hidden * s.merge_unit;
  const double embed = matmul_ms(c, s.dtype, s.tokens, s.hidden, s.patch_dim);
  const double merger = matmul_ms(c, s.dtype, tokens, m, m) + matmul_ms(c, s.dtype, tokens, s.out_hidden, m) +
                        elems_ms(c, OpKind::Norm, s.tokens * s.hidden) + elems_ms(c, OpKind::Elementwise, tokens * m);
  // The H2D queue: the edges, then the blocks in order, a streamed block's copy waiting for the compute
  // of the block two before it (its slot's previous user); compute waits for each block's copy.
  double h2d = c.transfer_ms(s.edge_bytes, Direction::HostToDevice, s.pinned);
  double compute = h2d + embed;
  std::vector<double> done(static_cast<size_t>(depth), 0.0);
  for (int64_t b = 0; b < depth; ++b) {
    const double start = b >= s.resident_blocks + 2 ? std::max(h2d, done[static_cast<size_t>(b - 2)]) : h2d;
    h2d = start + r.copy_ms;
    compute = std::max(compute, h2d) +
              (s.full_attention[static_cast<size_t>(b)] ? r.full_block_compute_ms : r.block_compute_ms);
    done[static_cast<size_t>(b)] = compute;
  }
  r.predicted_ms =
      compute + merger + c.transfer_ms(static_cast<uint64_t>(tokens * s.out_hidden) * 4, Direction::DeviceToHost);
  return r;
}

}  // namespace shardwise

// executor/model/cpu_blocks.cpp — step set-up, the router and the output block (see cpu_blocks.h).
#include "executor/model/cpu_blocks.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"

namespace shardwise {

CpuBlocks::CpuBlocks(const ModelSpec& spec, RopeStyle rope_style, ThreadPool& pool)
    : spec_(spec), rope_(rope_style), pool_(pool) {}

void CpuBlocks::prepare_step(int64_t pos0, int64_t n) {
  prepare_step({StepSegment{0, n, pos0, 0}});
}

RopeAngles step_rope_angles(const ModelSpec& spec, const std::vector<StepSegment>& segments) {
  const int64_t n = segments_tokens(segments);
  bool mrope = false;
  for (const StepSegment& s : segments) mrope = mrope || s.rope_pos3 != nullptr;
  RopeAngles angles;
  if (!mrope) {
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (const StepSegment& s : segments)
      for (int64_t i = 0; i < s.n; ++i) positions[static_cast<size_t>(s.t0 + i)] = static_cast<int32_t>(s.pos0 + i);
    angles.compute(positions.data(), n, spec.head_dim, spec.rope_theta);
    return angles;
  }
  SW_CHECK(!spec.mrope_section.empty(), "M-RoPE positions for a model without mrope_section");
  std::vector<int64_t> pos3(static_cast<size_t>(3 * n));
  for (const StepSegment& s : segments)
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t k = 0; k < 3; ++k)
        pos3[static_cast<size_t>(3 * (s.t0 + i) + k)] = s.rope_pos3 ? s.rope_pos3[3 * i + k] : s.pos0 + i;
  angles.compute_sections(pos3.data(), n, spec.head_dim, spec.rope_theta, spec.mrope_section);
  return angles;
}

std::vector<float> step_input_rows(const std::vector<SeqStep>& seqs, const TensorView& token_embd, int64_t hidden) {
  int64_t n = 0;
  for (const SeqStep& s : seqs) n += s.n;
  std::vector<float> rows(static_cast<size_t>(n * hidden));
  float* at = rows.data();
  for (const SeqStep& s : seqs) {
    if (s.embeddings)
      std::copy(s.embeddings, s.embeddings + s.n * hidden, at);
    else
      embed_rows(token_embd, s.tokens, s.n, at);
    at += s.n * hidden;
  }
  return rows;
}

void CpuBlocks::prepare_step(const std::vector<StepSegment>& segments) {
  const int64_t n = segments_tokens(segments);
  segments_ = segments;
  positions_.resize(static_cast<size_t>(n));
  for (const StepSegment& s : segments)
    for (int64_t i = 0; i < s.n; ++i) positions_[static_cast<size_t>(s.t0 + i)] = static_cast<int32_t>(s.pos0 + i);
  angles_ = step_rope_angles(spec_, segments);
}

void CpuBlocks::prepare_step_mrope(int64_t pos0, int64_t n, const int64_t* rope_pos3) {
  prepare_step({StepSegment{0, n, pos0, 0, rope_pos3}});
}

void CpuBlocks::router(const LayerWeights& w, const float* x, int64_t n, float* logits) {
  const int64_t H = spec_.hidden_size;
  norm_.resize(static_cast<size_t>(n * H));
  rms_norm(x, w.ffn_norm.data(), static_cast<float>(spec_.rms_norm_eps), norm_.data(), n, H);
  matmul(w.router, norm_.data(), H, n, logits, spec_.num_experts, pool_);
}

void CpuBlocks::ffn(const LayerWeights& w, float* x, int64_t n, const MoeRouting* routing) {
  const int64_t H = spec_.hidden_size;
  norm_.resize(static_cast<size_t>(n * H));
  out_.resize(static_cast<size_t>(n * H));
  rms_norm(x, w.ffn_norm.data(), static_cast<float>(spec_.rms_norm_eps), norm_.data(), n, H);
  if (spec_.is_moe()) {
    SW_CHECK(routing != nullptr, "MoE FFN block needs the tokens' routing");
    moe_ffn(w, norm_.data(), n, *routing, out_.data());
  } else {
    dense_ffn(w, norm_.data(), n, out_.data());
  }
  add_inplace(x, out_.data(), n * H);
}

void CpuBlocks::moe_share(const LayerWeights& w, const float* x, int64_t n, const MoeRouting& routing, float* out) {
  const int64_t H = spec_.hidden_size;
  SW_CHECK(spec_.is_moe(), "moe_share: the model has no experts");
  norm_.resize(static_cast<size_t>(n * H));
  rms_norm(x, w.ffn_norm.data(), static_cast<float>(spec_.rms_norm_eps), norm_.data(), n, H);
  moe_ffn(w, norm_.data(), n, routing, out);
}

void CpuBlocks::output(const std::vector<float>& out_norm, const TensorView& head, const float* x_row, float* logits,
                       int64_t r0, int64_t r1) {
  const int64_t H = spec_.hidden_size;
  SW_CHECK(r0 >= 0 && r1 <= head.shape.at(0) && r0 < r1, "output rows [", r0, ", ", r1, ") out of range");
  norm_.resize(static_cast<size_t>(H));
  rms_norm(x_row, out_norm.data(), static_cast<float>(spec_.rms_norm_eps), norm_.data(), 1, H);
  matmul_raw(head.dtype, head.row(r0), r1 - r0, H, norm_.data(), H, 1, logits + r0, r1 - r0, pool_);
}

void CpuBlocks::output_rows(const std::vector<float>& out_norm, const TensorView& head, const float* x,
                            const int64_t* rows, int64_t count, float* logits, int64_t ld, int64_t r0, int64_t r1) {
  const int64_t H = spec_.hidden_size;
  SW_CHECK(r0 >= 0 && r1 <= head.shape.at(0) && r0 < r1 && count >= 1, "output rows [", r0, ", ", r1, ") out of range");
  norm_.resize(static_cast<size_t>(count * H));
  for (int64_t i = 0; i < count; ++i)
    rms_norm(x + rows[i] * H, out_norm.data(), static_cast<float>(spec_.rms_norm_eps), norm_.data() + i * H, 1, H);
  matmul_raw(head.dtype, head.row(r0), r1 - r0, H, norm_.data(), H, count, logits + r0, ld, pool_);
}

}  // namespace shardwise

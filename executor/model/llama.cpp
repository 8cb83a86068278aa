// executor/model/llama.cpp — attention (llama; qwen3 adds per-head q/k RMSNorm) and the dense SwiGLU
// FFN on the CPU.
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_blocks.h"

namespace shardwise {

void CpuBlocks::attention_pre(const LayerWeights& w, const float* x, int64_t n, float* qkv) {
  const int64_t H = spec_.hidden_size, QD = spec_.q_dim(), KVD = spec_.kv_dim(), W = qkv_width();
  const float eps = static_cast<float>(spec_.rms_norm_eps);
  SW_CHECK(static_cast<int64_t>(positions_.size()) >= n, "attention: prepare_step was not called for this step");
  norm_.resize(static_cast<size_t>(n * H));
  rms_norm(x, w.attn_norm.data(), eps, norm_.data(), n, H);
  // q, k, v side by side in each row of qkv.
  matmul(w.wq, norm_.data(), H, n, qkv, W, pool_);
  matmul(w.wk, norm_.data(), H, n, qkv + QD, W, pool_);
  matmul(w.wv, norm_.data(), H, n, qkv + QD + KVD, W, pool_);
  for (int64_t t = 0; t < n; ++t) {
    float* q = qkv + t * W;
    float* k = q + QD;
    if (spec_.has_qkv_bias()) {
      SW_CHECK(static_cast<int64_t>(w.q_bias.size()) == QD && static_cast<int64_t>(w.v_bias.size()) == KVD,
               "attention: the q/k/v biases are missing");
      add_inplace(q, w.q_bias.data(), QD);
      add_inplace(k, w.k_bias.data(), KVD);
      add_inplace(k + KVD, w.v_bias.data(), KVD);
    }
    if (spec_.has_qk_norm()) {
      rms_norm_heads(q, 1, spec_.num_attention_heads, spec_.head_dim, w.q_norm.data(), eps);
      rms_norm_heads(k, 1, spec_.num_key_value_heads, spec_.head_dim, w.k_norm.data(), eps);
    }
  }
  rope(qkv, n, spec_.num_attention_heads, spec_.head_dim, angles_, rope_, W);
  rope(qkv + QD, n, spec_.num_key_value_heads, spec_.head_dim, angles_, rope_, W);
}

void CpuBlocks::set_kv_dtype(DType dtype) {
  SW_CHECK(is_kv_dtype(dtype), "the CPU keeps a KV cache in ", kKvDtypeNames, ", not ", dtype_name(dtype));
  check_kv_head_dim(dtype, spec_.head_dim, "the CPU's KV cache");
  kv_dtype_ = dtype;
}

namespace {

// Stores one KV head's row of hd values in the cache's element type (q8_0: hd / 32 blocks, quantised as
// quantize_row does).
void store_kv_row(DType dtype, const float* src, uint8_t* dst, int64_t hd) {
  if (dtype == DType::F32)
    std::memcpy(dst, src, static_cast<size_t>(hd) * sizeof(float));
  else
    quantize_row(dtype, src, dst, hd);
}

}  // namespace

void CpuBlocks::attention_core(const float* qkv, int64_t n, void* k_cache, void* v_cache, float* attn) {
  const int64_t QD = spec_.q_dim(), KVD = spec_.kv_dim(), W = qkv_width();
  const int64_t hd = spec_.head_dim;
  // Bytes of `elems` cache elements (whole rows of hd, so whole blocks of a q8_0 cache).
  const auto bytes = [&](int64_t elems) { return static_cast<int64_t>(dtype_row_bytes(kv_dtype_, elems)); };
  SW_CHECK(!segments_.empty() && segments_.back().t0 + segments_.back().n == n,
           "attention: prepare_step was not called for this step");
  AttentionShape shape{spec_.num_attention_heads, spec_.num_key_value_heads, hd, KVD, hd};  // side by side
  if (kv_capacity_ > 0) shape = head_major(shape, kv_capacity_);
  shape.kv_dtype = kv_dtype_;
  // Gather q into a dense [n, q_dim] block for the attention kernel.
  qkv_.resize(static_cast<size_t>(n * QD));
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(qkv_.data() + t * QD, qkv + t * W, static_cast<size_t>(QD) * sizeof(float));
  // Each sequence over its own rows: its cache seen from its first row on.
  std::vector<AttentionSegment> parts;
  for (const StepSegment& sg : segments_) {
    const int64_t end = sg.pos0 + sg.n;
    if (kv_capacity_ > 0)
      SW_CHECK(sg.row0 + end <= kv_capacity_, "attention: positions up to ", sg.row0 + end, " exceed the cache's ",
               kv_capacity_);
    uint8_t* k = static_cast<uint8_t*>(k_cache) + bytes(sg.row0 * shape.kv_row_stride);
    uint8_t* v = static_cast<uint8_t*>(v_cache) + bytes(sg.row0 * shape.kv_row_stride);
    for (int64_t t = 0; t < sg.n; ++t) {
      const float* r = qkv + (sg.t0 + t) * W;
      const int64_t at = (sg.pos0 + t) * shape.kv_row_stride;
      for (int64_t g = 0; g < spec_.num_key_value_heads; ++g) {
        const int64_t off = bytes(g * shape.kv_head_stride + at);
        store_kv_row(kv_dtype_, r + QD + g * hd, k + off, hd);
        store_kv_row(kv_dtype_, r + QD + KVD + g * hd, v + off, hd);
      }
    }
    parts.push_back({sg.t0, sg.n, k, v, end});
  }
  attention_segments(qkv_.data(), positions_.data(), parts, shape, attn, pool_);
}

void CpuBlocks::attention_post(const LayerWeights& w, float* x, const float* attn, int64_t n) {
  const int64_t H = spec_.hidden_size, QD = spec_.q_dim();
  out_.resize(static_cast<size_t>(n * H));
  matmul(w.wo, attn, QD, n, out_.data(), H, pool_);
  add_inplace(x, out_.data(), n * H);
}

void CpuBlocks::attention(const LayerWeights& w, float* x, int64_t n, void* k_cache, void* v_cache) {
  std::vector<float> qkv(static_cast<size_t>(n * qkv_width()));
  attn_.resize(static_cast<size_t>(n * spec_.q_dim()));
  attention_pre(w, x, n, qkv.data());
  attention_core(qkv.data(), n, k_cache, v_cache, attn_.data());
  attention_post(w, x, attn_.data(), n);
}

void CpuBlocks::dense_ffn(const LayerWeights& w, const float* xn, int64_t n, float* out) {
  const int64_t H = spec_.hidden_size, F = spec_.intermediate_size;
  gate_.resize(static_cast<size_t>(n * F));
  up_.resize(static_cast<size_t>(n * F));
  matmul(w.ffn_gate, xn, H, n, gate_.data(), F, pool_);
  matmul(w.ffn_up, xn, H, n, up_.data(), F, pool_);
  swiglu(gate_.data(), up_.data(), n * F, pool_);
  matmul(w.ffn_down, gate_.data(), F, n, out, H, pool_);
}

}  // namespace shardwise

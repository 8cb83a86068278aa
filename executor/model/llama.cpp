// executor/model/llama.cpp — attention block (llama; qwen3 adds per-head q/k RMSNorm) and the dense
// SwiGLU FFN, on the CPU.
#include "core/thread_pool.h"
#include "executor/cpu/attention.h"
#include "executor/cpu/matmul.h"
#include "executor/model/cpu_model.h"
#include "executor/session/kv_cache.h"

namespace shardwise {

void CpuModel::attention_block(int64_t layer, float* x, int64_t n, KvCache& kv) {
  const ModelSpec& sp = w_.spec;
  const LayerWeights& lw = w_.layers.at(static_cast<size_t>(layer));
  const int64_t H = sp.hidden_size, QD = sp.q_dim(), KVD = sp.kv_dim();
  const float eps = static_cast<float>(sp.rms_norm_eps);
  s_.norm.resize(static_cast<size_t>(n * H));
  s_.q.resize(static_cast<size_t>(n * QD));
  s_.attn.resize(static_cast<size_t>(n * QD));
  s_.ffn_out.resize(static_cast<size_t>(n * H));

  rms_norm(x, lw.attn_norm.data(), eps, s_.norm.data(), n, H);
  matmul(lw.wq, s_.norm.data(), H, n, s_.q.data(), QD, pool_);
  // K and V of the new tokens go straight into the cache rows of their positions.
  const int64_t pos0 = s_.positions.at(0);
  float* k_rows = kv.k(layer) + pos0 * KVD;
  float* v_rows = kv.v(layer) + pos0 * KVD;
  matmul(lw.wk, s_.norm.data(), H, n, k_rows, KVD, pool_);
  matmul(lw.wv, s_.norm.data(), H, n, v_rows, KVD, pool_);
  if (sp.has_qk_norm()) {
    rms_norm_heads(s_.q.data(), n, sp.num_attention_heads, sp.head_dim, lw.q_norm.data(), eps);
    rms_norm_heads(k_rows, n, sp.num_key_value_heads, sp.head_dim, lw.k_norm.data(), eps);
  }
  rope(s_.q.data(), n, sp.num_attention_heads, sp.head_dim, s_.rope, w_.rope_style);
  rope(k_rows, n, sp.num_key_value_heads, sp.head_dim, s_.rope, w_.rope_style);

  attention(s_.q.data(), n, s_.positions.data(), kv.k(layer), kv.v(layer), pos0 + n,
            {sp.num_attention_heads, sp.num_key_value_heads, sp.head_dim}, s_.attn.data(), pool_);
  matmul(lw.wo, s_.attn.data(), QD, n, s_.ffn_out.data(), H, pool_);
  add_inplace(x, s_.ffn_out.data(), n * H);
}

void CpuModel::dense_ffn(const LayerWeights& lw, const float* xn, int64_t n, float* out) {
  const int64_t H = w_.spec.hidden_size, F = w_.spec.intermediate_size;
  s_.gate.resize(static_cast<size_t>(n * F));
  s_.up.resize(static_cast<size_t>(n * F));
  matmul(lw.ffn_gate, xn, H, n, s_.gate.data(), F, pool_);
  matmul(lw.ffn_up, xn, H, n, s_.up.data(), F, pool_);
  swiglu(s_.gate.data(), s_.up.data(), n * F);
  matmul(lw.ffn_down, s_.gate.data(), F, n, out, H, pool_);
}

}  // namespace shardwise

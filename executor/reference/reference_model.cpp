// executor/reference/reference_model.cpp — the reference forward pass (see the header).
#include "executor/reference/reference_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace shardwise {
namespace {

using Vec = std::vector<double>;

// W (rows, cols) of any dtype times x [cols] -> [rows]; `slice` selects one expert of a 3-D tensor.
Vec matvec(const TensorView& w, const Vec& x, int64_t slice = -1) {
  TensorView m = slice >= 0 ? w.slice(slice) : w;
  const int64_t rows = m.shape[0], cols = m.shape[1];
  std::vector<float> row(static_cast<size_t>(cols));
  Vec y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(m.dtype, m.row(r), row.data(), cols);
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(row[c]) * x[c];
    y[r] = acc;
  }
  return y;
}

Vec to_vec(const TensorView& t) {
  std::vector<float> f(static_cast<size_t>(shape_elems(t.shape)));
  dequantize_row(t.dtype, t.data, f.data(), static_cast<int64_t>(f.size()));
  return Vec(f.begin(), f.end());
}

Vec rms_norm(const Vec& x, const Vec& w, double eps, size_t offset = 0, size_t dim = 0) {
  if (dim == 0) dim = x.size();
  double ss = 0;
  for (size_t i = 0; i < dim; ++i) ss += x[offset + i] * x[offset + i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
  Vec y(dim);
  for (size_t i = 0; i < dim; ++i) y[i] = x[offset + i] * scale * w[i];
  return y;
}

// Rotates each head of v (n_heads * head_dim) for a token at positions pos3 (temporal, height, width):
// pair i turns by the position of its M-RoPE section (sections empty: plain RoPE, pos3[0]).
void apply_rope(Vec& v, int64_t n_heads, int64_t hd, const int64_t* pos3, double theta, RopeStyle style,
                const std::vector<int64_t>& sections) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * hd;
    for (int64_t i = 0; i < half; ++i) {
      const int sec = sections.empty() ? 0 : i < sections[0] ? 0 : i < sections[0] + sections[1] ? 1 : 2;
      const double angle =
          static_cast<double>(pos3[sec]) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double c = std::cos(angle), s = std::sin(angle);
      // NeoX pairs dimension i with i + half; Normal pairs 2i with 2i + 1.
      const int64_t a = style == RopeStyle::Neox ? i : 2 * i;
      const int64_t b = style == RopeStyle::Neox ? i + half : 2 * i + 1;
      const double xa = x[a], xb = x[b];
      x[a] = xa * c - xb * s;
      x[b] = xb * c + xa * s;
    }
  }
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

Vec swiglu_ffn(const TensorView& gate, const TensorView& up, const TensorView& down, const Vec& x, int64_t slice) {
  Vec g = matvec(gate, x, slice), u = matvec(up, x, slice);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  return matvec(down, g, slice);
}

// Rounds each value as a KV cache of `kv` stores it (f32 is taken as exact: the reference's own
// precision; f16 and bf16 round through f32 to the nearest even, as the engines store them; q8_0
// quantises the row through f32 in blocks of 32, which never straddle two heads (head_dim is a multiple
// of 32), with the engines' quantiser, and reads the blocks back as they do).
void store_as(DType kv, Vec& v) {
  if (kv == DType::F16) {
    for (double& e : v) e = static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(e))));
  } else if (kv == DType::BF16) {
    for (double& e : v) e = static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(e))));
  } else if (kv == DType::Q8_0) {
    const int64_t n = static_cast<int64_t>(v.size());
    std::vector<float> f(v.begin(), v.end());
    std::vector<BlockQ8_0> blocks(static_cast<size_t>(n / kQK8_0));
    quantize_row(kv, f.data(), blocks.data(), n);
    dequantize_row(kv, blocks.data(), f.data(), n);
    std::copy(f.begin(), f.end(), v.begin());
  }
}

// Layer prefix p's attention block, added to the residual stream x: project every position, then let
// each attend to positions <= itself (over K and V as a cache of kv would hold them).
void attention_block(const WeightSource& src, const std::string& p, std::vector<Vec>& x,
                     const std::vector<int64_t>& pos3, DType kv) {
  const ModelSpec& sp = src.spec();
  const int64_t n = static_cast<int64_t>(x.size()), H = sp.hidden_size, hd = sp.head_dim;
  const int64_t n_heads = sp.num_attention_heads, n_kv = sp.num_key_value_heads, group = n_heads / n_kv;
  const double eps = sp.rms_norm_eps;
  auto T = [&](const std::string& name) -> const TensorView& { return src.tensor(name); };
  const Vec attn_norm = to_vec(T(p + "attn_norm.weight"));
  std::vector<Vec> q(n), k(n), v(n);
  for (int64_t t = 0; t < n; ++t) {
    Vec xn = rms_norm(x[t], attn_norm, eps);
    q[t] = matvec(T(p + "attn_q.weight"), xn);
    k[t] = matvec(T(p + "attn_k.weight"), xn);
    v[t] = matvec(T(p + "attn_v.weight"), xn);
    if (sp.has_qkv_bias()) {
      const Vec qb = to_vec(T(p + "attn_q.bias")), kb = to_vec(T(p + "attn_k.bias")), vb = to_vec(T(p + "attn_v.bias"));
      for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += qb[i];
      for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += kb[i];
      for (size_t i = 0; i < v[t].size(); ++i) v[t][i] += vb[i];
    }
    if (sp.has_qk_norm()) {
      const Vec qn = to_vec(T(p + "attn_q_norm.weight")), kn = to_vec(T(p + "attn_k_norm.weight"));
      for (int64_t h = 0; h < n_heads; ++h) {
        Vec r = rms_norm(q[t], qn, eps, static_cast<size_t>(h * hd), static_cast<size_t>(hd));
        std::copy(r.begin(), r.end(), q[t].begin() + h * hd);
      }
      for (int64_t h = 0; h < n_kv; ++h) {
        Vec r = rms_norm(k[t], kn, eps, static_cast<size_t>(h * hd), static_cast<size_t>(hd));
        std::copy(r.begin(), r.end(), k[t].begin() + h * hd);
      }
    }
    apply_rope(q[t], n_heads, hd, &pos3[static_cast<size_t>(3 * t)], sp.rope_theta, src.rope_style(), sp.mrope_section);
    apply_rope(k[t], n_kv, hd, &pos3[static_cast<size_t>(3 * t)], sp.rope_theta, src.rope_style(), sp.mrope_section);
    store_as(kv, k[t]);
    store_as(kv, v[t]);
  }
  for (int64_t t = 0; t < n; ++t) {
    Vec attn(static_cast<size_t>(n_heads * hd), 0.0);
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      Vec scores(static_cast<size_t>(t + 1));
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += q[t][h * hd + d] * k[j][g * hd + d];
        scores[j] = s / std::sqrt(static_cast<double>(hd));
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - m));
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t d = 0; d < hd; ++d) attn[h * hd + d] += scores[j] / sum * v[j][g * hd + d];
    }
    Vec o = matvec(T(p + "attn_output.weight"), attn);
    for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
  }
}

// The softmax-routed experts of layer prefix p for one normed row xn: the top-k experts' SwiGLU outputs,
// weighted by their probabilities (renormalised over the top k when the model says so).
Vec moe_ffn(const WeightSource& src, const std::string& p, const Vec& xn) {
  const ModelSpec& sp = src.spec();
  auto T = [&](const std::string& name) -> const TensorView& { return src.tensor(name); };
  Vec out(static_cast<size_t>(sp.hidden_size), 0.0);
  Vec logits = matvec(T(p + "ffn_gate_inp.weight"), xn);
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& z : logits) sum += (z = std::exp(z - m));
  for (double& z : logits) z /= sum;
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  order.resize(static_cast<size_t>(sp.num_experts_per_tok));
  double top_sum = 0;
  for (int64_t e : order) top_sum += logits[e];
  for (int64_t e : order) {
    const double w = sp.norm_topk_prob ? logits[e] / top_sum : logits[e];
    Vec y =
        swiglu_ffn(T(p + "ffn_gate_exps.weight"), T(p + "ffn_up_exps.weight"), T(p + "ffn_down_exps.weight"), xn, e);
    for (int64_t i = 0; i < sp.hidden_size; ++i) out[i] += w * y[i];
  }
  return out;
}

// Layer prefix p's FFN block (dense SwiGLU, or softmax-routed experts), added to x.
void ffn_block(const WeightSource& src, const std::string& p, std::vector<Vec>& x) {
  const ModelSpec& sp = src.spec();
  const int64_t H = sp.hidden_size;
  auto T = [&](const std::string& name) -> const TensorView& { return src.tensor(name); };
  const Vec ffn_norm = to_vec(T(p + "ffn_norm.weight"));
  for (size_t t = 0; t < x.size(); ++t) {
    Vec xn = rms_norm(x[t], ffn_norm, sp.rms_norm_eps);
    Vec out(static_cast<size_t>(H), 0.0);
    if (!sp.is_moe()) {
      out = swiglu_ffn(T(p + "ffn_gate.weight"), T(p + "ffn_up.weight"), T(p + "ffn_down.weight"), xn, -1);
    } else {
      out = moe_ffn(src, p, xn);
    }
    for (int64_t i = 0; i < H; ++i) x[t][i] += out[i];
  }
}

}  // namespace

namespace {

// The layers and the LM head over residual streams x (one per position) at positions pos3 [n, 3].
std::vector<float> reference_from(const WeightSource& src, std::vector<Vec> x, const std::vector<int64_t>& pos3,
                                  DType kv) {
  SW_CHECK(is_kv_dtype(kv), "reference: a KV cache of ", dtype_name(kv), " is not supported (", kKvDtypeNames, ")");
  check_kv_head_dim(kv, src.spec().head_dim, "reference");
  const ModelSpec& sp = src.spec();
  const int64_t n = static_cast<int64_t>(x.size());
  auto T = [&](const std::string& name) -> const TensorView& { return src.tensor(name); };
  for (int64_t l = 0; l < sp.num_hidden_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    attention_block(src, p, x, pos3, kv);
    ffn_block(src, p, x);
  }
  const Vec out_norm = to_vec(T("output_norm.weight"));
  const TensorView& head = sp.tie_word_embeddings ? T("token_embd.weight") : T("output.weight");
  std::vector<float> logits(static_cast<size_t>(n * sp.vocab_size));
  for (int64_t t = 0; t < n; ++t) {
    Vec y = matvec(head, rms_norm(x[t], out_norm, sp.rms_norm_eps));
    for (int64_t i = 0; i < sp.vocab_size; ++i) logits[t * sp.vocab_size + i] = static_cast<float>(y[i]);
  }
  return logits;
}

}  // namespace

std::vector<float> reference_logits(const WeightSource& src, const std::vector<int32_t>& tokens, DType kv_dtype) {
  const ModelSpec& sp = src.spec();
  const int64_t n = static_cast<int64_t>(tokens.size()), H = sp.hidden_size;
  // Residual stream per position, starting from the embedding rows; positions 0, 1, ...
  std::vector<Vec> x(static_cast<size_t>(n));
  std::vector<int64_t> pos3;
  const TensorView& emb = src.tensor("token_embd.weight");
  for (int64_t t = 0; t < n; ++t) {
    SW_CHECK(tokens[t] >= 0 && tokens[t] < sp.vocab_size, "token id ", tokens[t], " out of range");
    std::vector<float> row(static_cast<size_t>(H));
    dequantize_row(emb.dtype, emb.row(tokens[t]), row.data(), H);
    x[t] = Vec(row.begin(), row.end());
    pos3.insert(pos3.end(), {t, t, t});
  }
  return reference_from(src, std::move(x), pos3, kv_dtype);
}

std::vector<float> reference_logits_embedded(const WeightSource& src, const std::vector<float>& x,
                                             const std::vector<int64_t>& pos3, DType kv_dtype) {
  const int64_t H = src.spec().hidden_size, n = static_cast<int64_t>(x.size()) / H;
  SW_CHECK(n * H == static_cast<int64_t>(x.size()) && static_cast<int64_t>(pos3.size()) == 3 * n,
           "reference: the inputs are not [n, hidden] rows with [n, 3] positions");
  std::vector<Vec> rows(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) rows[t] = Vec(x.begin() + t * H, x.begin() + (t + 1) * H);
  return reference_from(src, std::move(rows), pos3, kv_dtype);
}

}  // namespace shardwise

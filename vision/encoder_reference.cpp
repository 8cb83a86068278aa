// vision/encoder_reference.cpp — the f64 reference of the vision encoder (see the header). Each function
// mirrors one step of transformers' code; the comments name it.
#include "vision/encoder_reference.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardwise {
double vision_activation_reference(VisionAct act, double x) {
  switch (act) {
    case VisionAct::Silu:
      return x / (1.0 + std::exp(-x));
    case VisionAct::Gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case VisionAct::GeluTanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case VisionAct::QuickGelu:
      return x / (1.0 + std::exp(-1.702 * x));
  }
  return x;
}

namespace {

using Rows = std::vector<double>;  // row-major [n, width]

// nn.Linear: y [n, out_f] = x [n, in_f] · wᵀ + bias (bias may be empty).
Rows linear_ref(const Rows& x, int64_t n, int64_t in_f, const VisionMatrix& matrix, const std::vector<float>& bias,
                int64_t out_f) {
  const std::vector<float> w = matrix.values();
  Rows y(static_cast<size_t>(n * out_f));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out_f; ++o) {
      double acc = bias.empty() ? 0.0 : bias[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in_f; ++i)
        acc += static_cast<double>(w[static_cast<size_t>(o * in_f + i)]) * x[t * in_f + i];
      y[t * out_f + o] = acc;
    }
  return y;
}

// Qwen2RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, per row.
Rows rms_norm_ref(const Rows& x, int64_t n, int64_t dim, const std::vector<float>& w, double eps) {
  Rows y(x.size());
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += x[t * dim + i] * x[t * dim + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      y[t * dim + i] = static_cast<double>(w[static_cast<size_t>(i)]) * (x[t * dim + i] * r);
  }
  return y;
}

// rot_pos_emb, then cat((freqs, freqs)): the angle of each of head_dim channels of each patch (input
// order). inv_freq over dim = head_dim / 2 channels: 1 / theta^(i / dim) for i = 0, 2, 4, ...; a patch
// at (row, col) has freqs [row * inv_freq, col * inv_freq].
Rows rotary_angles_ref(const VisionSpec& s, const std::vector<GridThw>& grids) {
  const int64_t hd = s.head_dim(), dim = hd / 2;
  std::vector<double> inv_freq;
  for (int64_t i = 0; i < dim; i += 2)
    inv_freq.push_back(1.0 / std::pow(s.rope_theta, static_cast<double>(i) / static_cast<double>(dim)));
  const auto pos = vision_patch_positions(s, grids);
  const int64_t q = static_cast<int64_t>(inv_freq.size());
  Rows emb(pos.size() * static_cast<size_t>(hd));
  for (size_t p = 0; p < pos.size(); ++p)
    for (int64_t j = 0; j < dim; ++j) {
      const double f = static_cast<double>(j < q ? pos[p][0] : pos[p][1]) * inv_freq[static_cast<size_t>(j % q)];
      emb[p * hd + j] = f;
      emb[p * hd + dim + j] = f;
    }
  return emb;
}

// apply_rotary_pos_emb_vision on one of q or k: x * cos + rotate_half(x) * sin, rotate_half(x) =
// cat(-x2, x1). x rows are `stride` apart, the heads from `offset`.
void rotary_ref(Rows& x, int64_t n, int64_t offset, int64_t stride, int64_t heads, int64_t hd, const Rows& emb) {
  std::vector<double> rot(static_cast<size_t>(hd));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x.data() + t * stride + offset + h * hd;
      for (int64_t d = 0; d < hd; ++d) rot[d] = d < hd / 2 ? -v[d + hd / 2] : v[d - hd / 2];
      for (int64_t d = 0; d < hd; ++d) v[d] = v[d] * std::cos(emb[t * hd + d]) + rot[d] * std::sin(emb[t * hd + d]);
    }
}

// Qwen2_5_VLVisionBlock: x + proj(attn(norm1 x)), then + down(act(gate) * up)(norm2 x).
void block_ref(const VisionSpec& s, const VisionBlockWeights& w, const std::vector<int64_t>& cu, const Rows& emb,
               int64_t n, Rows& x) {
  const int64_t h = s.hidden_size, f = s.intermediate_size, hd = s.head_dim();
  Rows qkv = linear_ref(rms_norm_ref(x, n, h, w.norm1, s.rms_norm_eps), n, h, w.qkv_w, w.qkv_b, 3 * h);
  rotary_ref(qkv, n, 0, 3 * h, s.num_heads, hd, emb);
  rotary_ref(qkv, n, h, 3 * h, s.num_heads, hd, emb);
  Rows att(static_cast<size_t>(n * h));
  varlen_attention_reference(qkv.data(), qkv.data() + h, qkv.data() + 2 * h, 3 * h, att.data(), h, cu, s.num_heads, hd);
  const Rows proj = linear_ref(att, n, h, w.proj_w, w.proj_b, h);
  for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];

  const Rows xn = rms_norm_ref(x, n, h, w.norm2, s.rms_norm_eps);
  Rows gate = linear_ref(xn, n, h, w.gate_w, w.gate_b, f);
  const Rows up = linear_ref(xn, n, h, w.up_w, w.up_b, f);
  const VisionAct act = s.act();
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = vision_activation_reference(act, gate[i]) * up[i];
  const Rows down = linear_ref(gate, n, f, w.down_w, w.down_b, h);
  for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
}

// Qwen2_5_VLPatchMerger: mlp(ln_q(x).view(-1, hidden * merge^2)), mlp = Linear, GELU (erf), Linear.
Rows merger_ref(const VisionSpec& s, const VisionWeights& w, const Rows& x, int64_t n) {
  const int64_t m = s.merger_width(), tokens = n / s.merge_unit();
  Rows mid = linear_ref(rms_norm_ref(x, n, s.hidden_size, w.merger_norm, s.rms_norm_eps), tokens, m, w.merger_fc1_w,
                        w.merger_fc1_b, m);
  for (double& v : mid) v = vision_activation_reference(VisionAct::Gelu, v);
  return linear_ref(mid, tokens, m, w.merger_fc2_w, w.merger_fc2_b, s.out_hidden_size);
}

// rows[window_index, :, :] over groups of `unit` rows of `width`.
Rows gather_groups(const Rows& rows, const std::vector<int64_t>& index, int64_t unit, int64_t width) {
  Rows out(rows.size());
  for (size_t i = 0; i < index.size(); ++i)
    std::copy_n(rows.begin() + index[i] * unit * width, unit * width,
                out.begin() + static_cast<int64_t>(i) * unit * width);
  return out;
}

}  // namespace

void varlen_attention_reference(const double* q, const double* k, const double* v, int64_t in_stride, double* out,
                                int64_t out_stride, const std::vector<int64_t>& cu, int64_t n_heads, int64_t head_dim) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> p;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t s0 = cu[s], s1 = cu[s + 1];
    p.resize(static_cast<size_t>(std::max<int64_t>(0, s1 - s0)));
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t t = s0; t < s1; ++t) {
        const double* qt = q + t * in_stride + h * head_dim;
        double mx = -INFINITY;
        for (int64_t j = s0; j < s1; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < head_dim; ++d) dot += qt[d] * k[j * in_stride + h * head_dim + d];
          p[j - s0] = dot * scale;
          mx = std::max(mx, p[j - s0]);
        }
        double sum = 0.0;
        for (double& e : p) sum += (e = std::exp(e - mx));
        double* o = out + t * out_stride + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
          double acc = 0.0;
          for (int64_t j = s0; j < s1; ++j) acc += p[j - s0] * v[j * in_stride + h * head_dim + d];
          o[d] = acc / sum;
        }
      }
  }
}

std::vector<double> encode_images_reference(const VisionSpec& s, const VisionWeights& w, const float* pixel_values,
                                            const std::vector<GridThw>& grids) {
  validate_vision_spec(s, "encode_images_reference");
  validate_grids(s, grids, "encode_images_reference");
  check_vision_weights(s, w);
  const int64_t n = vision_patch_count(grids), h = s.hidden_size, unit = s.merge_unit(), hd = s.head_dim();

  // Qwen2_5_VisionPatchEmbed: a Conv3d whose kernel is the whole patch, i.e. a dot product per channel.
  const Rows pixels(pixel_values, pixel_values + n * s.patch_dim());
  const Rows embedded = linear_ref(pixels, n, s.patch_dim(), w.patch_embed, {}, h);

  // get_window_index; hidden states and rotary angles in window order; cu_seqlens per frame.
  const VisionWindows win = vision_windows(s, grids);
  Rows x = gather_groups(embedded, win.window_index, unit, h);
  const Rows emb = gather_groups(rotary_angles_ref(s, grids), win.window_index, unit, hd);
  const std::vector<int64_t> cu_frames = vision_frame_seqlens(grids);
  for (int64_t l = 0; l < s.depth; ++l)
    block_ref(s, w.blocks[static_cast<size_t>(l)], s.full_attention(l) ? cu_frames : win.cu_window_seqlens, emb, n, x);

  // The merger, then hidden_states[argsort(window_index)]: token i of the window order goes back to
  // window_index[i].
  const Rows merged = merger_ref(s, w, x, n);
  const int64_t out = s.out_hidden_size;
  Rows result(merged.size());
  for (size_t i = 0; i < win.window_index.size(); ++i)
    std::copy_n(merged.begin() + static_cast<int64_t>(i) * out, out, result.begin() + win.window_index[i] * out);
  return result;
}

}  // namespace shardwise

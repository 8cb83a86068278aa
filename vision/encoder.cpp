// vision/encoder.cpp — the vision encoder's weights (loading, checking, random) and its f32 forward pass.
#include "vision/encoder.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

#include "core/error.h"
#include "core/file_util.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/cpu/ops.h"
#include "vision/vision_attention.h"

namespace shardwise {
namespace {

// Each tensor of the tower: its HF name below the prefix, its shape, and where it goes (Vec is const
// for a check of loaded weights).
template <typename Vec>
struct VisionTensorSlot {
  std::string name;
  Shape shape;
  Vec* dst;
};

template <typename W,
          typename Vec = std::conditional_t<std::is_const_v<W>, const std::vector<float>, std::vector<float>>>
std::vector<VisionTensorSlot<Vec>> vision_tensor_slots(const VisionSpec& s, W& w) {
  const int64_t h = s.hidden_size, f = s.intermediate_size, m = s.merger_width(), out = s.out_hidden_size;
  std::vector<VisionTensorSlot<Vec>> slots;
  slots.push_back(
      {"patch_embed.proj.weight", {h, s.in_chans, s.temporal_patch_size, s.patch_size, s.patch_size}, &w.patch_embed});
  for (int64_t i = 0; i < s.depth; ++i) {
    auto& b = w.blocks[static_cast<size_t>(i)];
    const std::string p = "blocks." + std::to_string(i) + ".";
    slots.push_back({p + "norm1.weight", {h}, &b.norm1});
    slots.push_back({p + "norm2.weight", {h}, &b.norm2});
    slots.push_back({p + "attn.qkv.weight", {3 * h, h}, &b.qkv_w});
    slots.push_back({p + "attn.qkv.bias", {3 * h}, &b.qkv_b});
    slots.push_back({p + "attn.proj.weight", {h, h}, &b.proj_w});
    slots.push_back({p + "attn.proj.bias", {h}, &b.proj_b});
    slots.push_back({p + "mlp.gate_proj.weight", {f, h}, &b.gate_w});
    slots.push_back({p + "mlp.gate_proj.bias", {f}, &b.gate_b});
    slots.push_back({p + "mlp.up_proj.weight", {f, h}, &b.up_w});
    slots.push_back({p + "mlp.up_proj.bias", {f}, &b.up_b});
    slots.push_back({p + "mlp.down_proj.weight", {h, f}, &b.down_w});
    slots.push_back({p + "mlp.down_proj.bias", {h}, &b.down_b});
  }
  slots.push_back({"merger.ln_q.weight", {h}, &w.merger_norm});
  slots.push_back({"merger.mlp.0.weight", {m, m}, &w.merger_fc1_w});
  slots.push_back({"merger.mlp.0.bias", {m}, &w.merger_fc1_b});
  slots.push_back({"merger.mlp.2.weight", {out, m}, &w.merger_fc2_w});
  slots.push_back({"merger.mlp.2.bias", {out}, &w.merger_fc2_b});
  return slots;
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The safetensors of `path`: one set where SafetensorsSet finds an index or model.safetensors (or the
// path is a file), else every *.safetensors file of the directory.
std::vector<std::unique_ptr<SafetensorsSet>> open_safetensors(const std::string& path) {
  std::vector<std::unique_ptr<SafetensorsSet>> sets;
  if (!is_directory(path) || is_file(path + "/model.safetensors.index.json") || is_file(path + "/model.safetensors")) {
    sets.push_back(std::make_unique<SafetensorsSet>(path));
    return sets;
  }
  std::vector<std::string> names;
  if (DIR* d = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  SW_CHECK(!names.empty(), path, ": no .safetensors files in this directory");
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) sets.push_back(std::make_unique<SafetensorsSet>(path + "/" + n));
  return sets;
}

struct FoundTensor {
  const SafetensorsSet* set = nullptr;
  const SafetensorsTensor* tensor = nullptr;
};

FoundTensor find_tensor(const std::vector<std::unique_ptr<SafetensorsSet>>& sets, const std::string& name) {
  for (const auto& s : sets)
    if (const SafetensorsTensor* t = s->find(name)) return {s.get(), t};
  return {};
}

// The tensor as f32, element by element through memcpy: safetensors data may be misaligned.
std::vector<float> tensor_to_f32(const SafetensorsSet& set, const SafetensorsTensor& t) {
  const TensorView v = set.view(t);
  const size_t n = static_cast<size_t>(shape_elems(v.shape));
  std::vector<float> out(n);
  const auto* src = static_cast<const uint8_t*>(v.data);
  SW_CHECK(v.nbytes == n * (v.dtype == DType::F32 ? 4u : 2u), t.file, ": tensor '", t.name, "' holds ", v.nbytes,
           " bytes, not what its shape needs");
  if (v.dtype == DType::F32) {
    if (n > 0) std::memcpy(out.data(), src, n * sizeof(float));
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    out[i] = v.dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
  }
  return out;
}

// Seeded N(0, 1) draws from splitmix64 and Box-Muller: the same numbers on every platform, unlike
// std::normal_distribution.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : state_(seed) {}
  float operator()() {
    const double u1 = uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  uint64_t state_;
};

}  // namespace

void check_vision_weights(const VisionSpec& s, const VisionWeights& w) {
  SW_CHECK(w.blocks.size() == static_cast<size_t>(s.depth), "vision weights: ", w.blocks.size(),
           " blocks, the spec has depth ", s.depth);
  for (const auto& slot : vision_tensor_slots(s, w))
    SW_CHECK(slot.dst->size() == static_cast<size_t>(shape_elems(slot.shape)), "vision weights: ", slot.name, " has ",
             slot.dst->size(), " values, expected ", shape_str(slot.shape));
}

VisionWeights load_vision_weights(const VisionSpec& spec, const std::string& path) {
  validate_vision_spec(spec, path);
  const auto sets = open_safetensors(path);
  std::string prefix;
  for (const char* p : {"visual.", "model.visual."})
    if (prefix.empty() && find_tensor(sets, std::string(p) + "patch_embed.proj.weight").tensor) prefix = p;
  SW_CHECK(!prefix.empty(), path,
           ": no visual.patch_embed.proj.weight (nor model.visual.patch_embed.proj.weight): not a Qwen2.5-VL "
           "checkpoint with its vision tower");
  VisionWeights w;
  w.blocks.resize(static_cast<size_t>(spec.depth));
  for (const auto& slot : vision_tensor_slots(spec, w)) {
    const std::string name = prefix + slot.name;
    const FoundTensor t = find_tensor(sets, name);
    SW_CHECK(t.tensor, path, ": tensor ", name, " is missing");
    SW_CHECK(t.tensor->shape == slot.shape, t.tensor->file, ": tensor ", name, " has shape ",
             shape_str(t.tensor->shape), ", the vision config needs ", shape_str(slot.shape));
    *slot.dst = tensor_to_f32(*t.set, *t.tensor);
  }
  return w;
}

VisionModel load_vision_model(const std::string& dir) {
  const std::string cfg = dir + "/config.json";
  SW_CHECK(is_file(cfg), dir, ": no config.json (an HF model directory needs config.json and safetensors)");
  VisionModel m;
  m.spec = vision_spec_from_hf_config(read_text_file(cfg), cfg);
  m.weights = load_vision_weights(m.spec, dir);
  return m;
}

VisionWeights random_vision_weights(const VisionSpec& spec, uint64_t seed, float stddev) {
  validate_vision_spec(spec, "random_vision_weights");
  VisionWeights w;
  w.blocks.resize(static_cast<size_t>(spec.depth));
  Gaussian g(seed);
  for (const auto& slot : vision_tensor_slots(spec, w)) {
    const bool norm = slot.name.find("norm") != std::string::npos || slot.name.find("ln_q") != std::string::npos;
    slot.dst->resize(static_cast<size_t>(shape_elems(slot.shape)));
    for (float& x : *slot.dst) x = norm ? 1.0f + 0.1f * g() : stddev * g();
  }
  return w;
}

namespace {

// fn(begin, end) over row ranges of about 32K floats.
void for_rows(ThreadPool& pool, int64_t n_rows, int64_t row_floats, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_floats));
  pool.parallel_for(n_rows, grain, [&](int64_t a, int64_t b, int) { fn(a, b); });
}

// y [n, out_f] = x [n, in_f] · wᵀ + bias.
void linear(const std::vector<float>& w, const std::vector<float>& bias, int64_t out_f, int64_t in_f, const float* x,
            int64_t n, float* y, ThreadPool& pool) {
  const TensorView view{DType::F32, {out_f, in_f}, w.data(), w.size() * sizeof(float)};
  matmul(view, x, in_f, n, y, out_f, pool);
  for_rows(pool, n, out_f, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) add_inplace(y + r * out_f, bias.data(), out_f);
  });
}

void norm_rows(const float* x, const std::vector<float>& w, double eps, float* y, int64_t n, int64_t dim,
               ThreadPool& pool) {
  for_rows(pool, n, dim, [&](int64_t a, int64_t b) {
    rms_norm(x + a * dim, w.data(), static_cast<float>(eps), y + a * dim, b - a, dim);
  });
}

void add_rows(float* y, const float* x, int64_t n, int64_t dim, ThreadPool& pool) {
  for_rows(pool, n, dim, [&](int64_t a, int64_t b) { add_inplace(y + a * dim, x + a * dim, (b - a) * dim); });
}

float activation(VisionAct act, float x) {
  switch (act) {
    case VisionAct::Silu:
      return x / (1.0f + std::exp(-x));
    case VisionAct::Gelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case VisionAct::GeluTanh:
      return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case VisionAct::QuickGelu:
      return x / (1.0f + std::exp(-1.702f * x));
  }
  return x;
}

// gate = act(gate) * up, element-wise over n values.
void gated_activation(VisionAct act, float* gate, const float* up, int64_t n, ThreadPool& pool) {
  if (act == VisionAct::Silu) return swiglu(gate, up, n, pool);
  for_rows(pool, n, 1, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) gate[i] = activation(act, gate[i]) * up[i];
  });
}

// cos and sin [n, head_dim / 2] of each patch (in window order): the first quarter of a head turns with
// the patch's row, the second with its column, at frequencies theta^(-4i / head_dim).
struct RotaryTable {
  int64_t half = 0;
  std::vector<float> cos, sin;
};

RotaryTable rotary_table(const VisionSpec& s, const std::vector<std::array<int64_t, 2>>& pos) {
  RotaryTable t;
  t.half = s.head_dim() / 2;
  const int64_t quarter = t.half / 2;
  t.cos.resize(pos.size() * static_cast<size_t>(t.half));
  t.sin.resize(t.cos.size());
  for (size_t p = 0; p < pos.size(); ++p)
    for (int64_t i = 0; i < quarter; ++i) {
      const double inv_freq = std::pow(s.rope_theta, -4.0 * static_cast<double>(i) / static_cast<double>(s.head_dim()));
      for (int axis = 0; axis < 2; ++axis) {
        const double angle = static_cast<double>(pos[p][axis]) * inv_freq;
        const size_t at = p * static_cast<size_t>(t.half) + static_cast<size_t>(axis * quarter + i);
        t.cos[at] = static_cast<float>(std::cos(angle));
        t.sin[at] = static_cast<float>(std::sin(angle));
      }
    }
  return t;
}

// HF's rotate-half rotary, in place, on n rows (row_stride floats apart) of n_heads heads.
void apply_rotary(float* x, int64_t n, int64_t row_stride, int64_t n_heads, const RotaryTable& t, ThreadPool& pool) {
  const int64_t half = t.half;
  for_rows(pool, n, n_heads * 2 * half, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {
      const float* cs = t.cos.data() + r * half;
      const float* sn = t.sin.data() + r * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + r * row_stride + h * 2 * half;
        for (int64_t i = 0; i < half; ++i) {
          const float lo = v[i], hi = v[i + half];
          v[i] = lo * cs[i] - hi * sn[i];
          v[i + half] = hi * cs[i] + lo * sn[i];
        }
      }
    }
  });
}

// The activations of one encode call, in window order: n patches.
struct EncoderBuffers {
  std::vector<float> x, xn, qkv, att, proj, gate, up;
  EncoderBuffers(const VisionSpec& s, int64_t n) {
    const auto hn = static_cast<size_t>(n * s.hidden_size), fn = static_cast<size_t>(n * s.intermediate_size);
    x.resize(hn), xn.resize(hn), qkv.resize(3 * hn), att.resize(hn), proj.resize(hn), gate.resize(fn), up.resize(fn);
  }
};

void block_forward(const VisionSpec& s, const VisionBlockWeights& w, const std::vector<int64_t>& cu_seqlens,
                   const RotaryTable& rot, int64_t n, EncoderBuffers& b, ThreadPool& pool) {
  const int64_t h = s.hidden_size, f = s.intermediate_size;
  norm_rows(b.x.data(), w.norm1, s.rms_norm_eps, b.xn.data(), n, h, pool);
  linear(w.qkv_w, w.qkv_b, 3 * h, h, b.xn.data(), n, b.qkv.data(), pool);
  apply_rotary(b.qkv.data(), n, 3 * h, s.num_heads, rot, pool);      // q
  apply_rotary(b.qkv.data() + h, n, 3 * h, s.num_heads, rot, pool);  // k
  VarlenAttentionShape shape;
  shape.n_heads = s.num_heads;
  shape.head_dim = s.head_dim();
  shape.q_stride = shape.kv_stride = 3 * h;
  shape.out_stride = h;
  varlen_attention(b.qkv.data(), b.qkv.data() + h, b.qkv.data() + 2 * h, b.att.data(), cu_seqlens, shape, pool);
  linear(w.proj_w, w.proj_b, h, h, b.att.data(), n, b.proj.data(), pool);
  add_rows(b.x.data(), b.proj.data(), n, h, pool);

  norm_rows(b.x.data(), w.norm2, s.rms_norm_eps, b.xn.data(), n, h, pool);
  linear(w.gate_w, w.gate_b, f, h, b.xn.data(), n, b.gate.data(), pool);
  linear(w.up_w, w.up_b, f, h, b.xn.data(), n, b.up.data(), pool);
  gated_activation(s.act(), b.gate.data(), b.up.data(), n * f, pool);
  linear(w.down_w, w.down_b, h, f, b.gate.data(), n, b.proj.data(), pool);
  add_rows(b.x.data(), b.proj.data(), n, h, pool);
}

// The merger on the window-ordered residual: RMSNorm, merge_unit patches side by side, Linear, erf GELU,
// Linear; then each image token back to its place in the input order.
std::vector<float> merger_forward(const VisionSpec& s, const VisionWeights& w, const std::vector<int64_t>& window_index,
                                  int64_t n, EncoderBuffers& b, ThreadPool& pool) {
  const int64_t h = s.hidden_size, m = s.merger_width(), out = s.out_hidden_size, tokens = n / s.merge_unit();
  norm_rows(b.x.data(), w.merger_norm, s.rms_norm_eps, b.xn.data(), n, h, pool);
  float* mid = b.qkv.data();  // [tokens, m]: fits in qkv's n * 3h
  linear(w.merger_fc1_w, w.merger_fc1_b, m, m, b.xn.data(), tokens, mid, pool);
  for_rows(pool, tokens, m, [&](int64_t a, int64_t e) {
    for (int64_t i = a * m; i < e * m; ++i) mid[i] = activation(VisionAct::Gelu, mid[i]);
  });
  std::vector<float> y(static_cast<size_t>(tokens * out)), result(y.size());
  linear(w.merger_fc2_w, w.merger_fc2_b, out, m, mid, tokens, y.data(), pool);
  for (int64_t i = 0; i < tokens; ++i)
    std::copy_n(y.data() + i * out, out, result.data() + window_index[static_cast<size_t>(i)] * out);
  return result;
}

}  // namespace

uint64_t vision_encoder_scratch_bytes(const VisionSpec& s, int64_t n_patches, int n_threads) {
  const uint64_t n = static_cast<uint64_t>(n_patches), h = static_cast<uint64_t>(s.hidden_size);
  const uint64_t f = static_cast<uint64_t>(s.intermediate_size), hd = static_cast<uint64_t>(s.head_dim());
  const uint64_t tokens = n / static_cast<uint64_t>(s.merge_unit()), out = static_cast<uint64_t>(s.out_hidden_size);
  const uint64_t floats = n * (7 * h + 2 * f) + n * hd /* rotary cos, sin */ + 2 * tokens * out;
  const uint64_t index_bytes = 2 * n * sizeof(std::array<int64_t, 2>) + tokens * sizeof(int64_t);  // positions, order
  return sizeof(float) * floats + index_bytes + varlen_attention_scratch_bytes(s.head_dim(), n_threads);
}

std::vector<float> encode_images(const VisionSpec& s, const VisionWeights& w, const float* pixel_values,
                                 const std::vector<GridThw>& grids, ThreadPool& pool) {
  validate_vision_spec(s, "encode_images");
  validate_grids(s, grids, "encode_images");
  check_vision_weights(s, w);
  const int64_t n = vision_patch_count(grids), unit = s.merge_unit(), h = s.hidden_size;
  const VisionWindows win = vision_windows(s, grids);
  const std::vector<int64_t> cu_frames = vision_frame_seqlens(grids);
  const std::vector<std::array<int64_t, 2>> pos = vision_patch_positions(s, grids);

  // Patch embedding (the Conv3d as a matmul over flattened patches), then patches and their positions
  // in window order, merge_unit patches at a time.
  EncoderBuffers b(s, n);
  const TensorView embed{DType::F32, {h, s.patch_dim()}, w.patch_embed.data(), w.patch_embed.size() * sizeof(float)};
  matmul(embed, pixel_values, s.patch_dim(), n, b.xn.data(), h, pool);
  std::vector<std::array<int64_t, 2>> pos_win(pos.size());
  for (size_t i = 0; i < win.window_index.size(); ++i) {
    const int64_t src = win.window_index[i] * unit, dst = static_cast<int64_t>(i) * unit;
    std::copy_n(b.xn.data() + src * h, unit * h, b.x.data() + dst * h);
    std::copy_n(pos.begin() + src, unit, pos_win.begin() + dst);
  }
  const RotaryTable rot = rotary_table(s, pos_win);
  for (int64_t l = 0; l < s.depth; ++l)
    block_forward(s, w.blocks[static_cast<size_t>(l)], s.full_attention(l) ? cu_frames : win.cu_window_seqlens, rot, n,
                  b, pool);
  return merger_forward(s, w, win.window_index, n, b, pool);
}

}  // namespace shardwise

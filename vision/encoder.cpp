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
#include "core/host_buffer.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "executor/cpu/matmul.h"
#include "executor/cpu/ops.h"
#include "executor/cpu/varlen_attention.h"
#include "executor/device/vision_kernels.h"

namespace shardwise {
namespace {

// Each tensor of the tower: its HF name below the prefix, its shape, and where it goes: a matrix or an
// f32 vector (const for a check of loaded weights).
template <bool Const>
struct VisionTensorSlot {
  using Vec = std::conditional_t<Const, const std::vector<float>, std::vector<float>>;
  using Mat = std::conditional_t<Const, const VisionMatrix, VisionMatrix>;
  std::string name;
  Shape shape;
  Vec* vec = nullptr;
  Mat* mat = nullptr;
};

template <typename W, bool Const = std::is_const_v<W>>
std::vector<VisionTensorSlot<Const>> vision_tensor_slots(const VisionSpec& s, W& w) {
  const int64_t h = s.hidden_size, f = s.intermediate_size, m = s.merger_width(), out = s.out_hidden_size;
  std::vector<VisionTensorSlot<Const>> slots;
  auto vec = [&slots](std::string name, Shape shape, auto* v) {
    slots.push_back({std::move(name), shape, v, nullptr});
  };
  auto mat = [&slots](std::string name, Shape shape, auto* v) {
    slots.push_back({std::move(name), shape, nullptr, v});
  };
  mat("patch_embed.proj.weight", {h, s.in_chans, s.temporal_patch_size, s.patch_size, s.patch_size}, &w.patch_embed);
  for (int64_t i = 0; i < s.depth; ++i) {
    auto& b = w.blocks[static_cast<size_t>(i)];
    const std::string p = "blocks." + std::to_string(i) + ".";
    vec(p + "norm1.weight", {h}, &b.norm1);
    vec(p + "norm2.weight", {h}, &b.norm2);
    mat(p + "attn.qkv.weight", {3 * h, h}, &b.qkv_w);
    vec(p + "attn.qkv.bias", {3 * h}, &b.qkv_b);
    mat(p + "attn.proj.weight", {h, h}, &b.proj_w);
    vec(p + "attn.proj.bias", {h}, &b.proj_b);
    mat(p + "mlp.gate_proj.weight", {f, h}, &b.gate_w);
    vec(p + "mlp.gate_proj.bias", {f}, &b.gate_b);
    mat(p + "mlp.up_proj.weight", {f, h}, &b.up_w);
    vec(p + "mlp.up_proj.bias", {f}, &b.up_b);
    mat(p + "mlp.down_proj.weight", {h, f}, &b.down_w);
    vec(p + "mlp.down_proj.bias", {h}, &b.down_b);
  }
  vec("merger.ln_q.weight", {h}, &w.merger_norm);
  mat("merger.mlp.0.weight", {m, m}, &w.merger_fc1_w);
  vec("merger.mlp.0.bias", {m}, &w.merger_fc1_b);
  mat("merger.mlp.2.weight", {out, m}, &w.merger_fc2_w);
  vec("merger.mlp.2.bias", {out}, &w.merger_fc2_b);
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

// A matrix of the file kept in dtype: its bytes as they are where the file stores that dtype, else its
// values converted (exact where they came from dtype or a narrower type).
VisionMatrix stored_matrix(const SafetensorsSet& set, const SafetensorsTensor& t, DType dtype) {
  const TensorView v = set.view(t);
  if (v.dtype != dtype) return VisionMatrix::from_values(tensor_to_f32(set, t), dtype);
  const size_t n = static_cast<size_t>(shape_elems(v.shape));
  SW_CHECK(v.nbytes == n * static_cast<size_t>(dtype_block_bytes(dtype)), t.file, ": tensor '", t.name, "' holds ",
           v.nbytes, " bytes, not what its shape needs");
  VisionMatrix m;
  m.dtype = dtype;
  const auto* src = static_cast<const uint8_t*>(v.data);
  m.bytes.assign(src, src + v.nbytes);
  return m;
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

VisionMatrix VisionMatrix::from_values(const std::vector<float>& values, DType dtype) {
  SW_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16, "vision weights: matrices of ",
           dtype_name(dtype), " (f32, f16 or bf16)");
  VisionMatrix m;
  m.dtype = dtype;
  m.bytes.resize(values.size() * static_cast<size_t>(dtype_block_bytes(dtype)));
  if (!values.empty()) quantize_row(dtype, values.data(), m.bytes.data(), static_cast<int64_t>(values.size()));
  return m;
}

std::vector<float> VisionMatrix::values() const {
  std::vector<float> v(size());
  if (!v.empty()) dequantize_row(dtype, bytes.data(), v.data(), static_cast<int64_t>(v.size()));
  return v;
}

void check_vision_weights(const VisionSpec& s, const VisionWeights& w) {
  SW_CHECK(w.blocks.size() == static_cast<size_t>(s.depth), "vision weights: ", w.blocks.size(),
           " blocks, the spec has depth ", s.depth);
  for (const auto& slot : vision_tensor_slots(s, w)) {
    const size_t n = slot.mat ? slot.mat->size() : slot.vec->size();
    SW_CHECK(n == static_cast<size_t>(shape_elems(slot.shape)), "vision weights: ", slot.name, " has ", n,
             " values, expected ", shape_str(slot.shape));
    SW_CHECK(!slot.mat || slot.mat->dtype == w.matrix_dtype, "vision weights: ", slot.name, " is ",
             dtype_name(slot.mat->dtype), ", the other matrices ", dtype_name(w.matrix_dtype));
  }
}

DType vision_matrix_dtype(const std::vector<DType>& stored) {
  if (stored.empty()) return DType::F32;
  for (DType t : {DType::F16, DType::BF16})
    if (std::all_of(stored.begin(), stored.end(), [t](DType d) { return d == t; })) return t;
  return DType::F32;
}

namespace {

template <typename W, typename M = std::conditional_t<std::is_const_v<W>, const VisionMatrix, VisionMatrix>>
std::vector<M*> matrices_of(W& w) {
  std::vector<M*> m = {&w.patch_embed, &w.merger_fc1_w, &w.merger_fc2_w};
  for (auto& b : w.blocks)
    for (M* x : {&b.qkv_w, &b.proj_w, &b.gate_w, &b.up_w, &b.down_w}) m.push_back(x);
  return m;
}

}  // namespace

std::vector<const VisionMatrix*> vision_matrices(const VisionWeights& w) {
  return matrices_of(w);
}

void convert_vision_matrices(VisionWeights& w, DType dtype) {
  for (VisionMatrix* m : matrices_of(w))
    if (m->dtype != dtype) *m = VisionMatrix::from_values(m->values(), dtype);
  w.matrix_dtype = dtype;
}

namespace {

std::string vision_prefix(const std::vector<std::unique_ptr<SafetensorsSet>>& sets, const std::string& path) {
  for (const char* p : {"visual.", "model.visual."})
    if (find_tensor(sets, std::string(p) + "patch_embed.proj.weight").tensor) return p;
  fail(path,
       ": no visual.patch_embed.proj.weight (nor model.visual.patch_embed.proj.weight): not a Qwen2.5-VL "
       "checkpoint with its vision tower");
}

// The tower's tensors of `sets`, each checked against its slot's shape, with its slot.
template <typename Slot>
std::vector<std::pair<const Slot*, FoundTensor>> found_tensors(const std::vector<Slot>& slots,
                                                               const std::vector<std::unique_ptr<SafetensorsSet>>& sets,
                                                               const std::string& path) {
  const std::string prefix = vision_prefix(sets, path);
  std::vector<std::pair<const Slot*, FoundTensor>> out;
  for (const auto& slot : slots) {
    const std::string name = prefix + slot.name;
    const FoundTensor t = find_tensor(sets, name);
    SW_CHECK(t.tensor, path, ": tensor ", name, " is missing");
    SW_CHECK(t.tensor->shape == slot.shape, t.tensor->file, ": tensor ", name, " has shape ",
             shape_str(t.tensor->shape), ", the vision config needs ", shape_str(slot.shape));
    out.push_back({&slot, t});
  }
  return out;
}

DType matrix_dtype_of(const std::vector<std::pair<const VisionTensorSlot<false>*, FoundTensor>>& found) {
  std::vector<DType> stored;
  for (const auto& [slot, t] : found)
    if (slot->mat) stored.push_back(t.set->view(*t.tensor).dtype);
  return vision_matrix_dtype(stored);
}

// Calls f with the tower's tensors found in `path`'s safetensors, paired with the slots of w (sized by
// spec) they belong to; the files stay open for the call.
template <class F>
auto with_tower_tensors(const VisionSpec& spec, const std::string& path, VisionWeights& w, F&& f) {
  validate_vision_spec(spec, path);
  const auto sets = open_safetensors(path);
  w.blocks.resize(static_cast<size_t>(spec.depth));
  const auto slots = vision_tensor_slots(spec, w);
  return f(found_tensors(slots, sets, path));
}

}  // namespace

DType stored_vision_matrix_dtype(const VisionSpec& spec, const std::string& path) {
  VisionWeights w;
  return with_tower_tensors(spec, path, w, [](const auto& found) { return matrix_dtype_of(found); });
}

VisionWeights load_vision_weights(const VisionSpec& spec, const std::string& path) {
  VisionWeights w;
  with_tower_tensors(spec, path, w, [&w](const auto& found) {
    w.matrix_dtype = matrix_dtype_of(found);
    for (const auto& [slot, t] : found) {
      if (slot->mat)
        *slot->mat = stored_matrix(*t.set, *t.tensor, w.matrix_dtype);
      else
        *slot->vec = tensor_to_f32(*t.set, *t.tensor);
    }
  });
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

VisionWeights random_vision_weights(const VisionSpec& spec, uint64_t seed, float stddev, DType matrix_dtype) {
  validate_vision_spec(spec, "random_vision_weights");
  VisionWeights w;
  w.blocks.resize(static_cast<size_t>(spec.depth));
  Gaussian g(seed);
  w.matrix_dtype = matrix_dtype;
  for (const auto& slot : vision_tensor_slots(spec, w)) {
    const bool norm = slot.name.find("norm") != std::string::npos || slot.name.find("ln_q") != std::string::npos;
    std::vector<float> v(static_cast<size_t>(shape_elems(slot.shape)));
    for (float& x : v) x = norm ? 1.0f + 0.1f * g() : stddev * g();
    if (slot.mat)
      *slot.mat = VisionMatrix::from_values(v, matrix_dtype);
    else
      *slot.vec = std::move(v);
  }
  return w;
}

namespace {

// cos and sin [n, head_dim / 2] of each patch (in window order): the first quarter of a head turns with
// the patch's row, the second with its column, at frequencies theta^(-4i / head_dim).
void rotary_table(const VisionSpec& s, const std::vector<std::array<int64_t, 2>>& pos, VisionInputs& in) {
  const int64_t half = s.head_dim() / 2, quarter = half / 2;
  in.cos.resize(pos.size() * static_cast<size_t>(half));
  in.sin.resize(in.cos.size());
  for (size_t p = 0; p < pos.size(); ++p)
    for (int64_t i = 0; i < quarter; ++i) {
      const double inv_freq = std::pow(s.rope_theta, -4.0 * static_cast<double>(i) / static_cast<double>(s.head_dim()));
      for (int axis = 0; axis < 2; ++axis) {
        const double angle = static_cast<double>(pos[p][axis]) * inv_freq;
        const size_t at = p * static_cast<size_t>(half) + static_cast<size_t>(axis * quarter + i);
        in.cos[at] = static_cast<float>(std::cos(angle));
        in.sin[at] = static_cast<float>(std::sin(angle));
      }
    }
}

std::vector<int32_t> to_i32(const std::vector<int64_t>& v) {
  return std::vector<int32_t>(v.begin(), v.end());  // bounded by kMaxVisionPatches
}

int64_t longest_segment(const std::vector<int64_t>& cu) {
  int64_t m = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) m = std::max(m, cu[i + 1] - cu[i]);
  return m;
}

// The activation regions in order: x, xn, qkv (which also holds the pixels before the blocks and the
// merger's output before its reorder), att, gate, up, cos, sin, tokens, then the int32 tables.
std::array<uint64_t, 12> activation_sizes(const VisionSpec& s, int64_t n, int64_t chunk, const VisionInputs& in) {
  const uint64_t h = static_cast<uint64_t>(s.hidden_size), f = static_cast<uint64_t>(s.intermediate_size);
  const uint64_t un = static_cast<uint64_t>(n), tokens = un / static_cast<uint64_t>(s.merge_unit());
  const uint64_t out = static_cast<uint64_t>(s.out_hidden_size), half = static_cast<uint64_t>(s.head_dim() / 2);
  const uint64_t wide = std::max({3 * h * un, static_cast<uint64_t>(s.patch_dim()) * un, tokens * out});
  const uint64_t F = sizeof(float), I = sizeof(int32_t);
  return {F * un * h,
          F * un * h,
          F * wide,
          F * un * h,
          F * static_cast<uint64_t>(chunk) * f,
          F * static_cast<uint64_t>(chunk) * f,
          F * un * half,
          F * un * half,
          F * tokens * out,
          I * in.window_index.size(),
          I * in.cu_windows.size(),
          I * in.cu_frames.size()};
}

}  // namespace

uint64_t vision_aligned_bytes(uint64_t b) {
  constexpr uint64_t kAlign = 256;
  return (b + kAlign - 1) / kAlign * kAlign;
}

VisionInputs vision_inputs(const VisionSpec& s, const std::vector<GridThw>& grids) {
  validate_grids(s, grids, "encode_images");
  VisionInputs in;
  in.n_patches = vision_patch_count(grids);
  const int64_t unit = s.merge_unit();
  const VisionWindows win = vision_windows(s, grids);
  const std::vector<int64_t> cu_frames = vision_frame_seqlens(grids);
  const std::vector<std::array<int64_t, 2>> pos = vision_patch_positions(s, grids);
  std::vector<std::array<int64_t, 2>> pos_win(pos.size());
  for (size_t i = 0; i < win.window_index.size(); ++i)
    std::copy_n(pos.begin() + win.window_index[i] * unit, unit, pos_win.begin() + static_cast<int64_t>(i) * unit);
  rotary_table(s, pos_win, in);
  in.window_index = to_i32(win.window_index);
  in.cu_windows = to_i32(win.cu_window_seqlens);
  in.cu_frames = to_i32(cu_frames);
  in.max_window = longest_segment(win.cu_window_seqlens);
  in.max_frame = longest_segment(cu_frames);
  return in;
}

uint64_t vision_activation_bytes(const VisionSpec& s, const VisionInputs& in, int64_t mlp_chunk) {
  uint64_t total = 0;
  for (uint64_t b : activation_sizes(s, in.n_patches, mlp_chunk, in)) total += vision_aligned_bytes(b);
  return total;
}

VisionActivations carve_vision_activations(const VisionSpec& s, const VisionInputs& in, int64_t mlp_chunk,
                                           uint8_t* base) {
  const auto sizes = activation_sizes(s, in.n_patches, mlp_chunk, in);
  uint8_t* p = base;
  std::array<uint8_t*, 12> at{};
  for (size_t i = 0; i < sizes.size(); ++i) {
    at[i] = p;
    p += vision_aligned_bytes(sizes[i]);
  }
  VisionActivations a;
  a.n = in.n_patches;
  a.mlp_chunk = mlp_chunk;
  float** floats[] = {&a.x, &a.xn, &a.qkv, &a.att, &a.gate, &a.up, &a.cos, &a.sin, &a.tokens};
  for (size_t i = 0; i < 9; ++i) *floats[i] = reinterpret_cast<float*>(at[i]);
  a.window_index = reinterpret_cast<int32_t*>(at[9]);
  a.cu_windows = reinterpret_cast<int32_t*>(at[10]);
  a.cu_frames = reinterpret_cast<int32_t*>(at[11]);
  a.n_windows = static_cast<int64_t>(in.cu_windows.size()) - 1;
  a.n_frames = static_cast<int64_t>(in.cu_frames.size()) - 1;
  a.max_window = in.max_window;
  a.max_frame = in.max_frame;
  return a;
}

void vision_embed(VisionKernels& k, const VisionSpec& s, const DevMat& patch_embed, const VisionActivations& a) {
  const int64_t h = s.hidden_size, unit = s.merge_unit();
  k.linear(patch_embed, nullptr, a.qkv, s.patch_dim(), a.n, a.xn, h, false);  // the Conv3d over flattened patches
  k.permute_rows(a.xn, a.window_index, a.x, a.n / unit, unit * h, false);     // into window order
}

void vision_block(VisionKernels& k, const VisionSpec& s, const VisionBlockPtrs& w, const VisionActivations& a,
                  bool full_attention) {
  const int64_t h = s.hidden_size, f = s.intermediate_size, n = a.n;
  const auto eps = static_cast<float>(s.rms_norm_eps);
  k.rms_norm(a.x, w.norm1, eps, a.xn, n, h);
  k.linear(w.qkv, w.qkv_b, a.xn, h, n, a.qkv, 3 * h, false);
  k.rotary(a.qkv, a.cos, a.sin, n, s.num_heads, s.head_dim());
  if (full_attention)
    k.attention(a.qkv, a.att, a.cu_frames, a.n_frames, a.max_frame, s.num_heads, s.head_dim());
  else
    k.attention(a.qkv, a.att, a.cu_windows, a.n_windows, a.max_window, s.num_heads, s.head_dim());
  k.linear(w.proj, w.proj_b, a.att, h, n, a.x, h, true);

  k.rms_norm(a.x, w.norm2, eps, a.xn, n, h);
  for (int64_t t0 = 0; t0 < n; t0 += a.mlp_chunk) {
    const int64_t c = std::min(a.mlp_chunk, n - t0);
    k.linear(w.gate, w.gate_b, a.xn + t0 * h, h, c, a.gate, f, false);
    k.linear(w.up, w.up_b, a.xn + t0 * h, h, c, a.up, f, false);
    k.activation(s.act(), a.gate, a.up, c * f);
    k.linear(w.down, w.down_b, a.gate, f, c, a.x + t0 * h, h, true);
  }
}

void vision_merger(VisionKernels& k, const VisionSpec& s, const VisionMergerPtrs& w, const VisionActivations& a) {
  const int64_t h = s.hidden_size, m = s.merger_width(), out = s.out_hidden_size, tokens = a.n / s.merge_unit();
  k.rms_norm(a.x, w.norm, static_cast<float>(s.rms_norm_eps), a.xn, a.n, h);
  // merge_unit patches side by side are one row of m: the normed rows as they lie.
  k.linear(w.fc1, w.fc1_b, a.xn, m, tokens, a.att, m, false);
  k.activation(VisionAct::Gelu, a.att, nullptr, tokens * m);
  k.linear(w.fc2, w.fc2_b, a.att, m, tokens, a.qkv, out, false);
  k.permute_rows(a.qkv, a.window_index, a.tokens, tokens, out, true);  // back to the input order
}

namespace {

DevMat host_mat(const VisionMatrix& m, int64_t rows, int64_t cols) {
  return DevMat{m.dtype, rows, cols, m.bytes.data()};
}

}  // namespace

VisionBlockPtrs vision_block_ptrs(const VisionSpec& s, const VisionBlockWeights& w) {
  const int64_t h = s.hidden_size, f = s.intermediate_size;
  VisionBlockPtrs p;
  p.norm1 = w.norm1.data(), p.norm2 = w.norm2.data();
  p.qkv = host_mat(w.qkv_w, 3 * h, h), p.qkv_b = w.qkv_b.data();
  p.proj = host_mat(w.proj_w, h, h), p.proj_b = w.proj_b.data();
  p.gate = host_mat(w.gate_w, f, h), p.gate_b = w.gate_b.data();
  p.up = host_mat(w.up_w, f, h), p.up_b = w.up_b.data();
  p.down = host_mat(w.down_w, h, f), p.down_b = w.down_b.data();
  return p;
}

VisionMergerPtrs vision_merger_ptrs(const VisionSpec& s, const VisionWeights& w) {
  const int64_t m = s.merger_width();
  VisionMergerPtrs p;
  p.norm = w.merger_norm.data();
  p.fc1 = host_mat(w.merger_fc1_w, m, m), p.fc1_b = w.merger_fc1_b.data();
  p.fc2 = host_mat(w.merger_fc2_w, s.out_hidden_size, m), p.fc2_b = w.merger_fc2_b.data();
  return p;
}

DevMat vision_patch_embed_mat(const VisionSpec& s, const VisionWeights& w) {
  return host_mat(w.patch_embed, s.hidden_size, s.patch_dim());
}

void upload_vision_inputs(const VisionInputs& in, const VisionActivations& a,
                          const std::function<void(void*, const void*, uint64_t)>& copy) {
  copy(a.cos, in.cos.data(), in.cos.size() * sizeof(float));
  copy(a.sin, in.sin.data(), in.sin.size() * sizeof(float));
  copy(a.window_index, in.window_index.data(), in.window_index.size() * sizeof(int32_t));
  copy(a.cu_windows, in.cu_windows.data(), in.cu_windows.size() * sizeof(int32_t));
  copy(a.cu_frames, in.cu_frames.data(), in.cu_frames.size() * sizeof(int32_t));
}

uint64_t vision_encoder_scratch_bytes(const VisionSpec& s, int64_t n_patches, int n_threads) {
  // The CPU encoder's activations with the MLP in one piece, and the attention's per-thread scratch; the
  // tables' sizes depend on the images only through their window count, at most one window per patch.
  VisionInputs in;
  in.n_patches = n_patches;
  in.window_index.resize(static_cast<size_t>(n_patches / s.merge_unit()));
  in.cu_windows.resize(static_cast<size_t>(n_patches + 1));
  in.cu_frames.resize(static_cast<size_t>(n_patches + 1));
  return vision_activation_bytes(s, in, n_patches) + varlen_attention_scratch_bytes(s.head_dim(), n_threads);
}

std::vector<float> encode_images(const VisionSpec& s, const VisionWeights& w, const float* pixel_values,
                                 const std::vector<GridThw>& grids, ThreadPool& pool) {
  validate_vision_spec(s, "encode_images");
  const VisionInputs in = vision_inputs(s, grids);
  check_vision_weights(s, w);
  const int64_t n = in.n_patches;
  HostBuffer buf(vision_activation_bytes(s, in, n));
  const VisionActivations a = carve_vision_activations(s, in, n, buf.data());
  upload_vision_inputs(in, a, [](void* d, const void* h, uint64_t b) { std::memcpy(d, h, b); });
  std::memcpy(a.qkv, pixel_values, static_cast<size_t>(n * s.patch_dim()) * sizeof(float));
  std::unique_ptr<VisionKernels> k = make_cpu_vision_kernels(pool);
  vision_embed(*k, s, vision_patch_embed_mat(s, w), a);
  for (int64_t l = 0; l < s.depth; ++l)
    vision_block(*k, s, vision_block_ptrs(s, w.blocks[static_cast<size_t>(l)]), a, s.full_attention(l));
  vision_merger(*k, s, vision_merger_ptrs(s, w), a);
  const int64_t tokens = n / s.merge_unit();
  return std::vector<float>(a.tokens, a.tokens + tokens * s.out_hidden_size);
}

}  // namespace shardwise

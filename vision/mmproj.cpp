// vision/mmproj.cpp — see mmproj.h.
#include "vision/mmproj.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <type_traits>

#include "core/error.h"
#include "core/gguf.h"
#include "core/quant_mix.h"
#include "core/tensor.h"

namespace shardwise {
namespace {

int64_t key_int(const GgufFile& f, const std::string& key, int64_t fallback = -1) {
  const GgufValue* v = f.find(key);
  if (!v) {
    SW_CHECK(fallback >= 0, f.path(), ": no ", key, " (not a vision projector file of llama.cpp's converter?)");
    return fallback;
  }
  return v->as_int(f.path() + ": " + key);
}

// The tensor as f32 values, its shape checked.
std::vector<float> tensor_f32(const GgufFile& f, const std::string& name, const Shape& shape) {
  const GgufTensorInfo* t = f.find_tensor(name);
  SW_CHECK(t, f.path(), ": tensor ", name, " is missing");
  SW_CHECK(t->shape == shape, f.path(), ": tensor ", name, " has shape ", shape_str(t->shape),
           ", the vision spec needs ", shape_str(shape));
  const TensorView v = f.view(*t);
  const int64_t n = shape_elems(shape);
  std::vector<float> out(static_cast<size_t>(n));
  if (v.dtype == DType::F32)
    std::memcpy(out.data(), v.data, static_cast<size_t>(n) * sizeof(float));
  else
    dequantize_row(v.dtype, v.data, out.data(), n);
  return out;
}

// Copies between the Conv3d kernel (hidden, C, T, P, P) with T = 2 and its frames, each (hidden, C, P, P)
// (what the file stores): the frames into the kernel with `join`, the kernel into the frames without.
void patch_embed_frames(const VisionSpec& s, std::vector<float>& kernel, std::vector<float> frames[2], bool join) {
  const int64_t hc = s.hidden_size * s.in_chans, p2 = s.patch_size * s.patch_size;
  const size_t bytes = static_cast<size_t>(p2) * sizeof(float);
  const size_t n = static_cast<size_t>(hc * p2);
  if (join) {
    kernel.resize(2 * n);
  } else {
    frames[0].resize(n);
    frames[1].resize(n);
  }
  for (int64_t i = 0; i < hc; ++i)
    for (int t = 0; t < 2; ++t) {
      float* k = kernel.data() + (i * 2 + t) * p2;
      float* fr = frames[t].data() + i * p2;
      std::memcpy(join ? k : fr, join ? fr : k, bytes);
    }
}

std::vector<float> patch_embed(const GgufFile& f, const VisionSpec& s) {
  const Shape frame = {s.hidden_size, s.in_chans, s.patch_size, s.patch_size};
  std::vector<float> frames[2] = {tensor_f32(f, "v.patch_embd.weight", frame),
                                  tensor_f32(f, "v.patch_embd.weight.1", frame)};
  std::vector<float> kernel;
  patch_embed_frames(s, kernel, frames, true);
  return kernel;
}

// One tensor of the file besides the patch embedding, and where its values sit in VisionWeights: from
// `offset` of `vec` or `mat` (q, k and v are the thirds of the fused qkv), as many as the shape holds.
template <bool Const>
struct MmprojSlot {
  using Vec = std::conditional_t<Const, const std::vector<float>, std::vector<float>>;
  using Mat = std::conditional_t<Const, const VisionMatrix, VisionMatrix>;
  std::string name;
  Shape shape;
  Vec* vec;
  Mat* mat;
  int64_t offset;
};

// The file's tensors in the converter's names, for the loader and the writer alike.
template <typename W, bool Const = std::is_const_v<W>>
std::vector<MmprojSlot<Const>> mmproj_slots(const VisionSpec& s, W& w) {
  const int64_t h = s.hidden_size, ff = s.intermediate_size, mw = s.merger_width();
  std::vector<MmprojSlot<Const>> out;
  auto vec = [&out](std::string name, Shape shape, auto* v, int64_t offset) {
    out.push_back({std::move(name), shape, v, nullptr, offset});
  };
  auto mat = [&out](std::string name, Shape shape, auto* m, int64_t offset) {
    out.push_back({std::move(name), shape, nullptr, m, offset});
  };
  for (int64_t i = 0; i < s.depth; ++i) {
    auto& b = w.blocks[static_cast<size_t>(i)];
    const std::string p = "v.blk." + std::to_string(i) + ".";
    const char* qkv[] = {"attn_q", "attn_k", "attn_v"};
    for (int64_t k = 0; k < 3; ++k) {
      mat(p + qkv[k] + ".weight", {h, h}, &b.qkv_w, k * h * h);
      vec(p + qkv[k] + ".bias", {h}, &b.qkv_b, k * h);
    }
    mat(p + "attn_out.weight", {h, h}, &b.proj_w, 0);
    vec(p + "attn_out.bias", {h}, &b.proj_b, 0);
    vec(p + "ln1.weight", {h}, &b.norm1, 0);
    vec(p + "ln2.weight", {h}, &b.norm2, 0);
    mat(p + "ffn_gate.weight", {ff, h}, &b.gate_w, 0);
    vec(p + "ffn_gate.bias", {ff}, &b.gate_b, 0);
    mat(p + "ffn_up.weight", {ff, h}, &b.up_w, 0);
    vec(p + "ffn_up.bias", {ff}, &b.up_b, 0);
    mat(p + "ffn_down.weight", {h, ff}, &b.down_w, 0);
    vec(p + "ffn_down.bias", {h}, &b.down_b, 0);
  }
  vec("v.post_ln.weight", {h}, &w.merger_norm, 0);
  mat("mm.0.weight", {mw, mw}, &w.merger_fc1_w, 0);
  vec("mm.0.bias", {mw}, &w.merger_fc1_b, 0);
  mat("mm.2.weight", {s.out_hidden_size, mw}, &w.merger_fc2_w, 0);
  vec("mm.2.bias", {s.out_hidden_size}, &w.merger_fc2_b, 0);
  return out;
}

// The dtype of a tensor of the file (its shape checked by tensor_f32 when read).
DType stored_dtype(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  SW_CHECK(t, f.path(), ": tensor ", name, " is missing");
  return f.view(*t).dtype;
}

VisionSpec mmproj_spec(const GgufFile& f) {
  const GgufValue* type = f.find("clip.projector_type");
  const std::string t = type ? type->as_string(f.path() + ": clip.projector_type") : "";
  if (t != kQwen25VlProjector)
    fail(f.path(), ": clip.projector_type is '", t, "'; only Qwen2.5-VL projectors (", kQwen25VlProjector,
         ") are supported");
  const GgufValue* has = f.find("clip.has_vision_encoder");
  SW_CHECK(!has || has->as_bool(f.path() + ": clip.has_vision_encoder"), f.path(), ": the file has no vision encoder");
  VisionSpec s;
  s.depth = key_int(f, "clip.vision.block_count");
  s.hidden_size = key_int(f, "clip.vision.embedding_length");
  s.intermediate_size = key_int(f, "clip.vision.feed_forward_length");
  s.num_heads = key_int(f, "clip.vision.attention.head_count");
  s.out_hidden_size = key_int(f, "clip.vision.projection_dim");
  s.patch_size = key_int(f, "clip.vision.patch_size");
  s.spatial_merge_size = key_int(f, "clip.vision.spatial_merge_size", 2);
  s.temporal_patch_size = 2;
  s.window_size = 112;
  const int64_t wa = key_int(f, "clip.vision.n_wa_pattern");
  SW_CHECK(wa >= 1 && wa <= kMaxVisionDepth, f.path(), ": clip.vision.n_wa_pattern ", wa, " out of range");
  for (int64_t i = wa - 1; i < std::min(s.depth, kMaxVisionDepth); i += wa) s.fullatt_block_indexes.push_back(int(i));
  if (const GgufValue* eps = f.find("clip.vision.attention.layer_norm_epsilon"))
    s.rms_norm_eps = eps->as_double(f.path() + ": clip.vision.attention.layer_norm_epsilon");
  const GgufValue* silu = f.find("clip.use_silu");
  s.hidden_act = silu && silu->as_bool(f.path() + ": clip.use_silu") ? "silu" : "gelu";
  validate_vision_spec(s, f.path());
  return s;
}

}  // namespace

VisionModel load_mmproj(const std::string& path) {
  const GgufFile f(path);
  VisionModel m;
  m.spec = mmproj_spec(f);
  m.weights.blocks.resize(static_cast<size_t>(m.spec.depth));
  const auto slots = mmproj_slots(m.spec, m.weights);
  // The matrices are read as f32 (q, k and v into the thirds of one), then kept in the dtype they share.
  std::vector<DType> stored = {stored_dtype(f, "v.patch_embd.weight"), stored_dtype(f, "v.patch_embd.weight.1")};
  for (const auto& slot : slots)
    if (slot.mat) stored.push_back(stored_dtype(f, slot.name));
  m.weights.matrix_dtype = vision_matrix_dtype(stored);
  std::map<VisionMatrix*, std::vector<float>> matrices;
  std::set<std::string> read = {"v.patch_embd.weight", "v.patch_embd.weight.1"};
  for (const auto& slot : slots) {
    const std::vector<float> v = tensor_f32(f, slot.name, slot.shape);
    std::vector<float>& dst = slot.mat ? matrices[slot.mat] : *slot.vec;
    dst.resize(std::max(dst.size(), static_cast<size_t>(slot.offset) + v.size()));
    std::copy(v.begin(), v.end(), dst.begin() + slot.offset);
    read.insert(slot.name);
  }
  m.weights.patch_embed = VisionMatrix::from_values(patch_embed(f, m.spec), m.weights.matrix_dtype);
  for (auto& [mat, values] : matrices) *mat = VisionMatrix::from_values(values, m.weights.matrix_dtype);
  // A tensor the tower does not read means the keys describe another tower than the tensors do (e.g. a
  // clip.vision.block_count below the file's blocks would drop the last ones and encode garbage).
  for (const auto& t : f.tensors())
    SW_CHECK(read.count(t.name), path, ": unexpected tensor ", t.name, " for a Qwen2.5-VL tower of ", m.spec.depth,
             " blocks (clip.vision.block_count)");
  check_vision_weights(m.spec, m.weights);
  return m;
}

// The released Qwen2.5-VL checkpoints' processor for this tower: their pixel limits, the tower's patches.
ImageProcessorConfig released_image_processor(const VisionSpec& spec) {
  ImageProcessorConfig c;
  c.min_pixels = 3136;
  c.max_pixels = 12845056;
  c.patch_size = spec.patch_size;
  c.temporal_patch_size = spec.temporal_patch_size;
  c.merge_size = spec.spatial_merge_size;
  return c;
}

ImageProcessorConfig mmproj_image_processor(const std::string& path, const VisionSpec& spec) {
  const GgufFile f(path);
  ImageProcessorConfig c = released_image_processor(spec);
  for (const auto& [key, dst] :
       {std::make_pair("clip.vision.image_mean", c.image_mean), std::make_pair("clip.vision.image_std", c.image_std)}) {
    const GgufValue* v = f.find(key);
    if (!v) continue;
    SW_CHECK(v->type == GgufType::ARRAY && v->array.size() == 3, path, ": ", key, " must hold 3 numbers");
    const bool divisor = dst == c.image_std;  // pixels are divided by the std
    for (size_t i = 0; i < 3; ++i) {
      dst[i] = static_cast<float>(v->array[i].as_double(path + ": " + key));
      // Checked here too (the processor checks again) so that the error names this file and key.
      SW_CHECK(std::isfinite(dst[i]) && !(divisor && dst[i] == 0.0f), path, ": ", key, "[", i, "] = ", dst[i],
               divisor ? " must be finite and non-zero" : " must be finite");
    }
  }
  return c;
}

VlModel load_vl_model_gguf(const std::string& mmproj_path, const ModelSpec& lm, int32_t image_token_id,
                           int32_t vision_start_token_id) {
  if (lm.mrope_section.empty())
    fail(
        "--mmproj: the language model has no M-RoPE sections (a Qwen2-VL family GGUF, general.architecture "
        "qwen2vl, is needed)");
  VlModel m;
  m.vision = load_mmproj(mmproj_path);
  SW_CHECK(image_token_id >= 0 && vision_start_token_id >= 0, "--mmproj: the language model's vocabulary has no ",
           kImagePadToken, " or ", kVisionStartToken, " token");
  if (m.vision.spec.out_hidden_size != lm.hidden_size)
    fail(mmproj_path, ": clip.vision.projection_dim ", m.vision.spec.out_hidden_size,
         " is not the language model's hidden size ", lm.hidden_size);
  m.tokens.image_token_id = image_token_id;
  m.tokens.vision_start_token_id = vision_start_token_id;
  m.tokens.spatial_merge_size = m.vision.spec.spatial_merge_size;
  m.processor = mmproj_image_processor(mmproj_path, m.vision.spec);
  return m;
}

namespace {

// Refuses a tower that the file cannot describe as llama.cpp reads it: clip.cpp fixes the temporal patch
// at 2, the merge at 2 and the channels at 3 (the tensors' shapes follow from them); n_wa_pattern puts
// full attention in every n-th block; use_silu is the only activation key both readers take for SiLU. The
// window is not stored either: readers take 112 pixels whatever the tower was drawn with.
void check_mmproj_writable(const VisionSpec& s, DType dtype, const std::string& path) {
  validate_vision_spec(s, path);
  SW_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16, path, ": an mmproj's weights are ",
           "written as f32, f16 or bf16, not ", dtype_name(dtype));
  SW_CHECK(s.temporal_patch_size == 2 && s.spatial_merge_size == 2 && s.in_chans == 3, path,
           ": llama.cpp's Qwen2.5-VL projector fixes the temporal patch (2), the merge (2) and the channels (3); ",
           "this tower has ", s.temporal_patch_size, ", ", s.spatial_merge_size, " and ", s.in_chans);
  SW_CHECK(s.act() == VisionAct::Silu, path, ": the tower's activation is ", s.hidden_act, "; the file says only silu");
  const int64_t n = s.fullatt_block_indexes.empty() ? 0 : s.fullatt_block_indexes.front() + 1;
  std::vector<int> every_nth;
  for (int64_t b = n - 1; n > 0 && b < s.depth; b += n) every_nth.push_back(static_cast<int>(b));
  SW_CHECK(n > 0 && every_nth == s.fullatt_block_indexes, path,
           ": the blocks of full attention must be every n-th (n - 1, 2n - 1, ...) for clip.vision.n_wa_pattern");
}

void write_mmproj_metadata(GgufWriter& w, const VisionSpec& s, const ImageProcessorConfig& processor, DType dtype) {
  auto u32 = [](int64_t v) { return GgufValue::of_u32(static_cast<uint32_t>(v)); };
  w.set("general.architecture", GgufValue::of_string("clip"));
  w.set("general.type", GgufValue::of_string("mmproj"));
  w.set("general.name", GgufValue::of_string("Qwen2.5-VL vision tower"));
  w.set("general.file_type", u32(quant_mix_file_type(QuantMix::Pure, dtype)));
  w.set("clip.has_vision_encoder", GgufValue::of_bool(true));
  w.set("clip.vision.projection_dim", u32(s.out_hidden_size));
  w.set("clip.vision.image_size", u32(560));  // the converter's default for Qwen2-VL (clip.cpp then uses 1024)
  w.set("clip.vision.patch_size", u32(s.patch_size));
  w.set("clip.vision.embedding_length", u32(s.hidden_size));
  w.set("clip.vision.feed_forward_length", u32(s.intermediate_size));
  w.set("clip.vision.block_count", u32(s.depth));
  w.set("clip.vision.attention.head_count", u32(s.num_heads));
  w.set("clip.vision.image_mean", GgufValue::of_f32s({processor.image_mean, processor.image_mean + 3}));
  w.set("clip.vision.image_std", GgufValue::of_f32s({processor.image_std, processor.image_std + 3}));
  w.set("clip.projector_type", GgufValue::of_string(kQwen25VlProjector));
  w.set("clip.use_silu", GgufValue::of_bool(true));
  w.set("clip.vision.n_wa_pattern", u32(s.fullatt_block_indexes.front() + 1));
  w.set("clip.vision.attention.layer_norm_epsilon", GgufValue::of_f32(static_cast<float>(s.rms_norm_eps)));
  w.set("general.quantization_version", u32(2));
}

// The writer's tensors: f32 ones point into the model, others into their converted copies here.
struct MmprojTensors {
  GgufWriter w;
  std::vector<std::vector<uint8_t>> converted;  // moving a vector keeps its buffer where the views point
  void add(const std::string& name, const float* v, const Shape& shape, DType dtype) {
    const int64_t n = shape_elems(shape);
    const uint64_t bytes = tensor_bytes(dtype, shape);
    if (dtype == DType::F32) {
      w.add_tensor(name, TensorView{dtype, shape, v, bytes});
      return;
    }
    converted.emplace_back(bytes);
    quantize_row(dtype, v, converted.back().data(), n);
    w.add_tensor(name, TensorView{dtype, shape, converted.back().data(), bytes});
  }
};

}  // namespace

void write_mmproj(const VisionModel& m, const ImageProcessorConfig& processor, const std::string& path, DType dtype) {
  const VisionSpec& s = m.spec;
  check_mmproj_writable(s, dtype, path);
  check_vision_weights(s, m.weights);
  MmprojTensors out;
  write_mmproj_metadata(out.w, s, processor, dtype);
  std::vector<float> kernel = m.weights.patch_embed.values(), frames[2];
  patch_embed_frames(s, kernel, frames, false);
  const Shape frame = {s.hidden_size, s.in_chans, s.patch_size, s.patch_size};
  out.add("v.patch_embd.weight", frames[0].data(), frame, DType::F16);  // the converter's forced type
  out.add("v.patch_embd.weight.1", frames[1].data(), frame, DType::F16);
  std::map<const VisionMatrix*, std::vector<float>> values;  // each matrix widened once
  for (const auto& slot : mmproj_slots(s, m.weights)) {
    const float* v = slot.vec ? slot.vec->data() : nullptr;
    if (slot.mat) {
      auto it = values.find(slot.mat);
      if (it == values.end()) it = values.emplace(slot.mat, slot.mat->values()).first;
      v = it->second.data();
    }
    out.add(slot.name, v + slot.offset, slot.shape, slot.shape.size() == 1 ? DType::F32 : dtype);
  }
  out.w.write(path);
}

VisionSpec synthetic_tower_spec(const std::string& text, SyntheticModel* model) {
  *model = parse_synthetic(text);
  VisionSpec spec;
  if (!builtin_vision_spec(model->spec.name, &spec)) {
    std::string known;
    for (const auto& n : builtin_vision_spec_names()) known += (known.empty() ? "" : ", ") + n;
    fail("synthetic:", text, ": the spec '", model->spec.name, "' has no vision tower (specs with one: ", known, ")");
  }
  return spec;
}

DType load_vision_tower_dtype(DType lm) {
  return lm == DType::F32 || lm == DType::BF16 ? lm : DType::F16;
}

VisionTower load_vision_tower(const std::string& path) {
  const std::string synth = "synthetic:";
  if (path.compare(0, synth.size(), synth) == 0) {
    SyntheticModel sm;
    VisionTower t;
    t.model.spec = synthetic_tower_spec(path.substr(synth.size()), &sm);
    t.model.weights = random_vision_weights(t.model.spec, sm.seed, 0.02f, load_vision_tower_dtype(sm.spec.dtype));
    t.processor = released_image_processor(t.model.spec);
    return t;
  }
  const bool gguf = path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  VisionTower t;
  t.model = gguf ? load_mmproj(path) : load_vision_model(path);
  t.processor = gguf ? mmproj_image_processor(path, t.model.spec) : model_image_processor(path, t.model.spec);
  return t;
}

}  // namespace shardwise

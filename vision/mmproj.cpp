// vision/mmproj.cpp — see mmproj.h.
#include "vision/mmproj.h"

#include <cstring>

#include "core/error.h"
#include "core/gguf.h"
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

// The Conv3d kernel (hidden, C, T, P, P) from its T = 2 frames, each (hidden, C, P, P).
std::vector<float> patch_embed(const GgufFile& f, const VisionSpec& s) {
  const int64_t h = s.hidden_size, c = s.in_chans, p2 = s.patch_size * s.patch_size;
  const Shape frame = {h, c, s.patch_size, s.patch_size};
  const std::vector<float> f0 = tensor_f32(f, "v.patch_embd.weight", frame);
  const std::vector<float> f1 = tensor_f32(f, "v.patch_embd.weight.1", frame);
  std::vector<float> out(static_cast<size_t>(h * c * 2 * p2));
  for (int64_t hc = 0; hc < h * c; ++hc) {
    std::memcpy(out.data() + (hc * 2) * p2, f0.data() + hc * p2, static_cast<size_t>(p2) * sizeof(float));
    std::memcpy(out.data() + (hc * 2 + 1) * p2, f1.data() + hc * p2, static_cast<size_t>(p2) * sizeof(float));
  }
  return out;
}

VisionBlockWeights block(const GgufFile& f, const VisionSpec& s, int64_t i) {
  const int64_t h = s.hidden_size, ff = s.intermediate_size;
  const std::string p = "v.blk." + std::to_string(i) + ".";
  VisionBlockWeights b;
  b.norm1 = tensor_f32(f, p + "ln1.weight", {h});
  b.norm2 = tensor_f32(f, p + "ln2.weight", {h});
  for (const char* part : {"attn_q", "attn_k", "attn_v"}) {
    const std::vector<float> w = tensor_f32(f, p + part + ".weight", {h, h});
    const std::vector<float> bias = tensor_f32(f, p + part + ".bias", {h});
    b.qkv_w.insert(b.qkv_w.end(), w.begin(), w.end());
    b.qkv_b.insert(b.qkv_b.end(), bias.begin(), bias.end());
  }
  b.proj_w = tensor_f32(f, p + "attn_out.weight", {h, h});
  b.proj_b = tensor_f32(f, p + "attn_out.bias", {h});
  b.gate_w = tensor_f32(f, p + "ffn_gate.weight", {ff, h});
  b.gate_b = tensor_f32(f, p + "ffn_gate.bias", {ff});
  b.up_w = tensor_f32(f, p + "ffn_up.weight", {ff, h});
  b.up_b = tensor_f32(f, p + "ffn_up.bias", {ff});
  b.down_w = tensor_f32(f, p + "ffn_down.weight", {h, ff});
  b.down_b = tensor_f32(f, p + "ffn_down.bias", {h});
  return b;
}

VisionSpec mmproj_spec(const GgufFile& f) {
  const GgufValue* type = f.find("clip.projector_type");
  const std::string t = type ? type->as_string(f.path() + ": clip.projector_type") : "";
  if (t != "qwen2.5vl")
    fail(f.path(), ": clip.projector_type is '", t, "'; only Qwen2.5-VL projectors (qwen2.5vl) are supported");
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
  const VisionSpec& s = m.spec;
  const int64_t mw = s.merger_width();
  m.weights.patch_embed = patch_embed(f, s);
  for (int64_t i = 0; i < s.depth; ++i) m.weights.blocks.push_back(block(f, s, i));
  m.weights.merger_norm = tensor_f32(f, "v.post_ln.weight", {s.hidden_size});
  m.weights.merger_fc1_w = tensor_f32(f, "mm.0.weight", {mw, mw});
  m.weights.merger_fc1_b = tensor_f32(f, "mm.0.bias", {mw});
  m.weights.merger_fc2_w = tensor_f32(f, "mm.2.weight", {s.out_hidden_size, mw});
  m.weights.merger_fc2_b = tensor_f32(f, "mm.2.bias", {s.out_hidden_size});
  check_vision_weights(s, m.weights);
  return m;
}

ImageProcessorConfig mmproj_image_processor(const std::string& path, const VisionSpec& spec) {
  const GgufFile f(path);
  ImageProcessorConfig c;
  c.min_pixels = 3136;
  c.max_pixels = 12845056;
  c.patch_size = spec.patch_size;
  c.temporal_patch_size = spec.temporal_patch_size;
  c.merge_size = spec.spatial_merge_size;
  for (const auto& [key, dst] :
       {std::make_pair("clip.vision.image_mean", c.image_mean), std::make_pair("clip.vision.image_std", c.image_std)}) {
    const GgufValue* v = f.find(key);
    if (!v) continue;
    SW_CHECK(v->type == GgufType::ARRAY && v->array.size() == 3, path, ": ", key, " must hold 3 numbers");
    for (size_t i = 0; i < 3; ++i) dst[i] = static_cast<float>(v->array[i].as_double(path + ": " + key));
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

}  // namespace shardwise

// vision/vision_spec.cpp — VisionSpec: validation, reading an HF config.json, sizes, and the patch
// geometry (rotary positions, windows, segments) of a batch of images.
#include "vision/vision_spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_util.h"

namespace shardwise {

int64_t VisionSpec::window_merged() const {
  if (spatial_merge_size <= 0 || patch_size <= 0) return 0;
  return window_size / spatial_merge_size / patch_size;
}

bool VisionSpec::full_attention(int64_t block) const {
  return std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(), block) != fullatt_block_indexes.end();
}

VisionAct VisionSpec::act() const {
  if (hidden_act == "silu" || hidden_act == "swish") return VisionAct::Silu;
  if (hidden_act == "gelu") return VisionAct::Gelu;
  if (hidden_act == "gelu_pytorch_tanh") return VisionAct::GeluTanh;
  if (hidden_act == "quick_gelu") return VisionAct::QuickGelu;
  fail("vision_config.hidden_act '", hidden_act,
       "' is not supported (supported: silu, gelu, gelu_pytorch_tanh, quick_gelu)");
}

void validate_vision_spec(const VisionSpec& s, const std::string& ctx) {
  auto in_range = [&](const char* field, int64_t v, int64_t max) {
    SW_CHECK(v >= 1 && v <= max, ctx, ": vision_config.", field, " = ", v, " is out of range (1 to ", max, ")");
  };
  in_range("depth", s.depth, kMaxVisionDepth);
  in_range("hidden_size", s.hidden_size, kMaxVisionWidth);
  in_range("intermediate_size", s.intermediate_size, kMaxVisionIntermediate);
  in_range("num_heads", s.num_heads, kMaxVisionHeads);
  in_range("in_chans", s.in_chans, kMaxVisionChannels);
  in_range("out_hidden_size", s.out_hidden_size, kMaxVisionWidth);
  in_range("patch_size", s.patch_size, kMaxVisionPatch);
  in_range("temporal_patch_size", s.temporal_patch_size, kMaxVisionTemporalPatch);
  in_range("spatial_merge_size", s.spatial_merge_size, kMaxVisionMerge);
  in_range("window_size", s.window_size, kMaxVisionWindow);
  SW_CHECK(s.hidden_size % s.num_heads == 0, ctx, ": vision_config.hidden_size = ", s.hidden_size,
           " is not a multiple of num_heads = ", s.num_heads);
  SW_CHECK(s.head_dim() % 4 == 0, ctx, ": the vision head_dim hidden_size / num_heads = ", s.head_dim(),
           " is not a multiple of 4 (the 2-D rotary splits each half of a head between rows and columns)");
  const int64_t merged_patch = s.patch_size * s.spatial_merge_size;
  SW_CHECK(s.window_size % merged_patch == 0, ctx, ": vision_config.window_size = ", s.window_size,
           " is not a multiple of patch_size * spatial_merge_size = ", merged_patch);
  for (int b : s.fullatt_block_indexes)
    SW_CHECK(b >= 0 && b < s.depth, ctx, ": vision_config.fullatt_block_indexes holds ", b,
             ", outside the blocks 0 to ", s.depth - 1);
  try {
    (void)s.act();
  } catch (const Error& e) {
    fail(ctx, ": ", e.what());
  }
  SW_CHECK(std::isfinite(s.rms_norm_eps) && s.rms_norm_eps > 0 && s.rms_norm_eps < 1, ctx,
           ": the vision rms_norm_eps = ", s.rms_norm_eps, " is out of range (0 to 1, exclusive)");
  SW_CHECK(std::isfinite(s.rope_theta) && s.rope_theta > 1, ctx, ": the vision rope_theta = ", s.rope_theta,
           " must be a finite number above 1");
  SW_CHECK(vision_params(s) <= kMaxVisionParams, ctx, ": the vision tower would have ", vision_params(s),
           " parameters, more than the limit of ", kMaxVisionParams);
}

namespace {

VisionSpec qwen25vl7b_tower() {
  VisionSpec s;
  s.depth = 32;
  s.hidden_size = 1280;
  s.intermediate_size = 3420;
  s.num_heads = 16;
  s.out_hidden_size = 3584;
  s.fullatt_block_indexes = {7, 15, 23, 31};
  return s;  // patch 14, temporal patch 2, merge 2, window 112, silu, 3 channels: VisionSpec's defaults
}

// The intermediate width differs from the hidden one: llama.cpp's clip.cpp swaps ffn_up and ffn_down of a
// file whose ffn_down rows are hidden_size long (a legacy layout), which a square MLP would trigger.
VisionSpec tiny_tower() {
  VisionSpec s;
  s.depth = 4;
  s.hidden_size = 32;
  s.intermediate_size = 48;
  s.num_heads = 2;
  s.out_hidden_size = 64;  // tiny_qwen2vl's hidden_size
  s.fullatt_block_indexes = {1, 3};
  return s;
}

struct BuiltinTower {
  const char* lm_spec_name;
  VisionSpec (*make)();
};
const BuiltinTower kBuiltinTowers[] = {{"qwen2vl7b", qwen25vl7b_tower}, {"tiny_qwen2vl", tiny_tower}};

}  // namespace

bool builtin_vision_spec(const std::string& lm_spec_name, VisionSpec* out) {
  for (const BuiltinTower& t : kBuiltinTowers)
    if (lm_spec_name == t.lm_spec_name) {
      *out = t.make();
      return true;
    }
  return false;
}

std::vector<std::string> builtin_vision_spec_names() {
  std::vector<std::string> names;
  for (const BuiltinTower& t : kBuiltinTowers) names.emplace_back(t.lm_spec_name);
  return names;
}

namespace {

using nlohmann::json;

// An integer field of vision_config; `dflt` when absent and not required. Ranges are checked by
// validate_vision_spec.
int64_t config_int(const json& vc, const char* key, bool required, int64_t dflt, const std::string& ctx) {
  if (!vc.contains(key)) {
    SW_CHECK(!required, ctx, ": vision_config has no ", key);
    return dflt;
  }
  const json& v = vc[key];
  SW_CHECK(v.is_number_integer(), ctx, ": vision_config.", key, " = ", json_brief(v), " is not an integer");
  if (v.is_number_unsigned())
    SW_CHECK(v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), ctx, ": vision_config.",
             key, " = ", json_brief(v), " is out of range");
  return v.get<int64_t>();
}

std::vector<int> config_fullatt(const json& vc, const std::string& ctx) {
  if (!vc.contains("fullatt_block_indexes")) return {7, 15, 23, 31};  // HF's default
  const json& a = vc["fullatt_block_indexes"];
  SW_CHECK(a.is_array(), ctx, ": vision_config.fullatt_block_indexes is ", json_brief(a), ", not a list");
  SW_CHECK(a.size() <= static_cast<size_t>(kMaxVisionDepth), ctx, ": vision_config.fullatt_block_indexes has ",
           a.size(), " entries, more than the ", kMaxVisionDepth, " blocks a tower may have");
  std::vector<int> out;
  for (const json& e : a) {
    SW_CHECK(e.is_number_integer(), ctx, ": vision_config.fullatt_block_indexes holds ", json_brief(e),
             ", not an integer");
    const bool fits = e.is_number_unsigned() ? e.get<uint64_t>() <= static_cast<uint64_t>(kMaxVisionDepth)
                                             : std::llabs(e.get<int64_t>()) <= kMaxVisionDepth;
    SW_CHECK(fits, ctx, ": vision_config.fullatt_block_indexes holds ", json_brief(e), ", outside the blocks");
    out.push_back(static_cast<int>(e.get<int64_t>()));
  }
  return out;
}

VisionSpec spec_from_vision_config(const json& vc, const std::string& ctx) {
  VisionSpec s;
  s.depth = config_int(vc, "depth", true, 0, ctx);
  s.hidden_size = config_int(vc, "hidden_size", true, 0, ctx);
  s.intermediate_size = config_int(vc, "intermediate_size", true, 0, ctx);
  s.num_heads = config_int(vc, "num_heads", true, 0, ctx);
  s.out_hidden_size = config_int(vc, "out_hidden_size", true, 0, ctx);
  // Released configs write in_chans, which HF's config class does not read (it takes in_channels,
  // default 3): in_channels wins where both are present.
  s.in_chans = config_int(vc, "in_channels", false, config_int(vc, "in_chans", false, 3, ctx), ctx);
  s.patch_size = config_int(vc, "patch_size", false, 14, ctx);
  s.temporal_patch_size = config_int(vc, "temporal_patch_size", false, 2, ctx);
  s.spatial_merge_size = config_int(vc, "spatial_merge_size", false, 2, ctx);
  s.window_size = config_int(vc, "window_size", false, 112, ctx);
  s.fullatt_block_indexes = config_fullatt(vc, ctx);
  if (vc.contains("hidden_act")) {
    SW_CHECK(vc["hidden_act"].is_string(), ctx, ": vision_config.hidden_act = ", json_brief(vc["hidden_act"]),
             " is not a string");
    s.hidden_act = vc["hidden_act"].get<std::string>();
  }
  validate_vision_spec(s, ctx);
  return s;
}

}  // namespace

VisionSpec vision_spec_from_hf_config(const std::string& text, const std::string& ctx) {
  check_json_depth(text, ctx);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ctx, ": not valid JSON: ", e.what());
  }
  SW_CHECK(j.is_object(), ctx, ": config.json is not a JSON object");
  SW_CHECK(j.contains("model_type") && j["model_type"].is_string(), ctx,
           ": no model_type (a Qwen2.5-VL config.json has model_type qwen2_5_vl)");
  const std::string type = j["model_type"].get<std::string>();
  if (type == "qwen2_vl")
    fail(ctx, ": model_type qwen2_vl (Qwen2-VL) is not supported yet: its vision tower differs from Qwen2.5-VL's ",
         "(LayerNorm, no window attention)");
  SW_CHECK(type == "qwen2_5_vl", ctx, ": model_type '", type,
           "' is not a vision-language model shardwise reads (supported: qwen2_5_vl)");
  SW_CHECK(j.contains("vision_config") && j["vision_config"].is_object(), ctx, ": no vision_config object");
  return spec_from_vision_config(j["vision_config"], ctx);
}

uint64_t vision_patch_embed_params(const VisionSpec& s) {
  return static_cast<uint64_t>(s.hidden_size) * static_cast<uint64_t>(s.patch_dim());
}

uint64_t vision_block_params(const VisionSpec& s) {
  const uint64_t h = static_cast<uint64_t>(s.hidden_size), f = static_cast<uint64_t>(s.intermediate_size);
  const uint64_t norms = 2 * h;
  const uint64_t attn = (3 * h * h + 3 * h) + (h * h + h);  // qkv, proj
  const uint64_t mlp = 2 * (f * h + f) + (h * f + h);       // gate, up, down
  return norms + attn + mlp;
}

uint64_t vision_merger_params(const VisionSpec& s) {
  const uint64_t h = static_cast<uint64_t>(s.hidden_size), m = static_cast<uint64_t>(s.merger_width());
  const uint64_t out = static_cast<uint64_t>(s.out_hidden_size);
  return h + (m * m + m) + (out * m + out);
}

uint64_t vision_params(const VisionSpec& s) {
  return vision_patch_embed_params(s) + static_cast<uint64_t>(s.depth) * vision_block_params(s) +
         vision_merger_params(s);
}

namespace {

uint64_t float_bytes(DType dtype) {
  SW_CHECK(!dtype_is_quantized(dtype), "vision weight sizes: ", dtype_name(dtype),
           " is a quantised type; the vision tower's weights are f32, f16 or bf16");
  return dtype_row_bytes(dtype, 1);
}

}  // namespace

uint64_t vision_block_bytes(const VisionSpec& s, DType dtype) {
  return vision_block_params(s) * float_bytes(dtype);
}

uint64_t vision_weight_bytes(const VisionSpec& s, DType dtype) {
  return vision_params(s) * float_bytes(dtype);
}

int64_t vision_patch_count(const std::vector<GridThw>& grids) {
  int64_t n = 0;
  for (const GridThw& g : grids) n += g[0] * g[1] * g[2];
  return n;
}

int64_t vision_image_tokens(const VisionSpec& s, const GridThw& g) {
  return g[0] * g[1] * g[2] / s.merge_unit();
}

void validate_grids(const VisionSpec& s, const std::vector<GridThw>& grids, const std::string& ctx) {
  SW_CHECK(!grids.empty(), ctx, ": no images (grid_thw is empty)");
  int64_t total = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const GridThw& g = grids[i];
    SW_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[0] <= kMaxVisionPatches && g[1] <= kMaxVisionPatches &&
                 g[2] <= kMaxVisionPatches,
             ctx, ": image ", i, ": grid (", g[0], ", ", g[1], ", ", g[2], ") is out of range (1 to ",
             kMaxVisionPatches, " each)");
    SW_CHECK(g[1] % s.spatial_merge_size == 0 && g[2] % s.spatial_merge_size == 0, ctx, ": image ", i, ": grid (", g[0],
             ", ", g[1], ", ", g[2], "): h and w must be multiples of spatial_merge_size = ", s.spatial_merge_size);
    SW_CHECK(g[1] * g[2] <= kMaxVisionPatches && g[0] * g[1] * g[2] <= kMaxVisionPatches - total, ctx,
             ": the images have more than ", kMaxVisionPatches, " patches in all (at image ", i, ")");
    total += g[0] * g[1] * g[2];
  }
}

std::vector<std::array<int64_t, 2>> vision_patch_positions(const VisionSpec& s, const std::vector<GridThw>& grids) {
  std::vector<std::array<int64_t, 2>> pos;
  pos.reserve(static_cast<size_t>(vision_patch_count(grids)));
  const int64_t m = s.spatial_merge_size;
  for (const GridThw& g : grids)
    for (int64_t f = 0; f < g[0]; ++f)
      for (int64_t bh = 0; bh < g[1] / m; ++bh)
        for (int64_t bw = 0; bw < g[2] / m; ++bw)
          for (int64_t ih = 0; ih < m; ++ih)
            for (int64_t iw = 0; iw < m; ++iw) pos.push_back({bh * m + ih, bw * m + iw});
  return pos;
}

VisionWindows vision_windows(const VisionSpec& s, const std::vector<GridThw>& grids) {
  VisionWindows out;
  out.cu_window_seqlens.push_back(0);
  const int64_t vws = s.window_merged(), unit = s.merge_unit();
  int64_t base = 0;  // merged tokens of the images before this one
  for (const GridThw& g : grids) {
    const int64_t lh = g[1] / s.spatial_merge_size, lw = g[2] / s.spatial_merge_size;
    // HF pads by a whole window where the grid divides: those windows are empty and their repeated
    // offsets are dropped below, as unique_consecutive drops them.
    const int64_t n_win_h = (lh + vws - lh % vws) / vws, n_win_w = (lw + vws - lw % vws) / vws;
    for (int64_t f = 0; f < g[0]; ++f)
      for (int64_t wy = 0; wy < n_win_h; ++wy)
        for (int64_t wx = 0; wx < n_win_w; ++wx) {
          int64_t count = 0;
          for (int64_t r = wy * vws; r < std::min((wy + 1) * vws, lh); ++r)
            for (int64_t c = wx * vws; c < std::min((wx + 1) * vws, lw); ++c, ++count)
              out.window_index.push_back(base + f * lh * lw + r * lw + c);
          if (count > 0) out.cu_window_seqlens.push_back(out.cu_window_seqlens.back() + count * unit);
        }
    base += g[0] * lh * lw;
  }
  return out;
}

std::vector<int64_t> vision_frame_seqlens(const std::vector<GridThw>& grids) {
  std::vector<int64_t> cu{0};
  for (const GridThw& g : grids)
    for (int64_t f = 0; f < g[0]; ++f) cu.push_back(cu.back() + g[1] * g[2]);
  return cu;
}

}  // namespace shardwise

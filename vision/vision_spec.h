// vision/vision_spec.h — the shape of a Qwen2.5-VL vision encoder (the ViT tower and its patch merger),
// read from an HF config.json and validated, its weight sizes, and the geometry of a batch of images that
// the forward pass needs: each patch's rotary position, the window order and the attention segments, as
// transformers' Qwen2_5_VisionTransformerPretrainedModel computes them (rot_pos_emb, get_window_index).
// Plain data and arithmetic: nothing here reads weights or computes with them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "executor/device/vision_kernels.h"  // VisionAct

namespace shardwise {

// One image's (or video's) grid in patches: frames t (after temporal patching), rows h, columns w, as the
// image processor reports it (image_grid_thw).
using GridThw = std::array<int64_t, 3>;

// Upper bounds on the fields, far above every released checkpoint (Qwen2.5-VL-72B: depth 32, hidden 1280,
// out 8192), so that a hostile config cannot ask for absurd allocations.
constexpr int64_t kMaxVisionDepth = 256;
constexpr int64_t kMaxVisionWidth = int64_t(1) << 16;         // hidden_size, out_hidden_size
constexpr int64_t kMaxVisionIntermediate = int64_t(1) << 18;  // intermediate_size
constexpr int64_t kMaxVisionHeads = 1024;
constexpr int64_t kMaxVisionPatch = 64;                   // patch_size
constexpr int64_t kMaxVisionTemporalPatch = 16;           // temporal_patch_size
constexpr int64_t kMaxVisionMerge = 16;                   // spatial_merge_size
constexpr int64_t kMaxVisionChannels = 16;                // in_chans
constexpr int64_t kMaxVisionWindow = int64_t(1) << 16;    // window_size, pixels
constexpr uint64_t kMaxVisionParams = uint64_t(1) << 34;  // all weights together
constexpr int64_t kMaxVisionPatches = int64_t(1) << 20;   // patches of one encode call

struct VisionSpec {
  int64_t depth = 0;              // ViT blocks
  int64_t hidden_size = 0;        // ViT width (vision_config.hidden_size)
  int64_t intermediate_size = 0;  // MLP width of a block
  int64_t num_heads = 0;
  int64_t in_chans = 3;
  int64_t out_hidden_size = 0;  // the LLM's width: what the merger emits per image token
  int64_t patch_size = 14;      // pixels per patch side
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;          // patches per merged-token side
  int64_t window_size = 112;               // window side in pixels
  std::vector<int> fullatt_block_indexes;  // blocks that attend over the whole frame; the others within windows
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;  // every RMSNorm of the tower (HF fixes it at 1e-6; config.json has no field)
  double rope_theta = 10000;   // the 2-D rotary's base (fixed in HF as well)

  int64_t head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
  int64_t patch_dim() const { return in_chans * temporal_patch_size * patch_size * patch_size; }  // C*T*P*P
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }  // patches per image token
  int64_t merger_width() const { return hidden_size * merge_unit(); }             // the merger MLP's width
  // A window's side in merged tokens (HF's vit_merger_window_size).
  int64_t window_merged() const;
  bool full_attention(int64_t block) const;
  VisionAct act() const;  // throws Error for an activation the encoder does not compute
};

// Throws Error("<context>: vision_config.<field> ...") for the first field out of range: sizes positive
// and below the bounds above, hidden_size % num_heads == 0, head_dim % 4 == 0 (the rotary splits each
// half of a head between rows and columns), window_size a positive multiple of patch_size *
// spatial_merge_size, fullatt_block_indexes inside [0, depth), a known activation, positive eps and theta.
void validate_vision_spec(const VisionSpec& spec, const std::string& context);

// The vision_config of an HF config.json of model_type qwen2_5_vl (transformers 4, with the text fields
// at the top, or 5, with them under text_config); validated. Fields HF defaults are defaulted the same
// way (patch_size 14, window_size 112, ...); depth, hidden_size, intermediate_size, num_heads and
// out_hidden_size are required. Refuses qwen2_vl (a different tower: LayerNorm, no windows) as not
// supported yet, and every other model_type. `context` names the file in messages.
VisionSpec vision_spec_from_hf_config(const std::string& config_json_text, const std::string& context);

// The vision tower of a builtin language model spec, by the spec's name (configs/models/<name>.yaml):
// Qwen2.5-VL-7B's tower (its config.json's vision_config) for qwen2vl7b, a tiny one for tiny_qwen2vl,
// each emitting tokens of its language model's width. False, `out` untouched, for a name without one.
// A table here rather than a `vision:` section of the model YAML: the tower is vision/'s, and core/, which
// reads the YAML and must not depend on vision/, would have to carry fields it cannot check.
bool builtin_vision_spec(const std::string& lm_spec_name, VisionSpec* out);
std::vector<std::string> builtin_vision_spec_names();

// Parameter counts of the tensors HF stores for the tower.
uint64_t vision_patch_embed_params(const VisionSpec& spec);  // the patch embedding (hidden, C, T, P, P)
uint64_t vision_block_params(const VisionSpec& spec);        // one block: norms, qkv, proj, MLP, with biases
uint64_t vision_merger_params(const VisionSpec& spec);       // ln_q and the merger MLP
uint64_t vision_params(const VisionSpec& spec);              // everything
// Bytes of the same with every tensor stored as `dtype` (released checkpoints: bf16 throughout;
// VisionWeights holds f32). Float dtypes only: throws Error for a quantised one.
uint64_t vision_block_bytes(const VisionSpec& spec, DType dtype);
uint64_t vision_weight_bytes(const VisionSpec& spec, DType dtype);

// Patches of a batch of grids (sum t*h*w), and image tokens one grid gives the LLM (t*h*w / merge^2).
int64_t vision_patch_count(const std::vector<GridThw>& grids);
int64_t vision_image_tokens(const VisionSpec& spec, const GridThw& grid);

// Throws Error("<context>: image i: grid ...") unless there is at least one grid, every t, h, w is
// positive, h and w are multiples of spatial_merge_size, and the batch has at most kMaxVisionPatches patches.
void validate_grids(const VisionSpec& spec, const std::vector<GridThw>& grids, const std::string& context);

// (row, column) of every patch in the order the image processor emits them (merge blocks of
// spatial_merge_size^2 patches, row-major inside a block and over the blocks; frames repeat them).
std::vector<std::array<int64_t, 2>> vision_patch_positions(const VisionSpec& spec, const std::vector<GridThw>& grids);

// HF's get_window_index. window_index[i] is the merged token (index in the input order, over all images)
// that comes i-th in window order: per image and frame, windows of window_merged()^2 merged tokens
// row-major over the frame, tokens row-major inside a window (the grid padded with empty slots to whole
// windows, as HF pads with -100 even when it divides). cu_window_seqlens: the windows' patch offsets in
// that order, from 0, with the empty windows' repeats removed (HF's unique_consecutive).
struct VisionWindows {
  std::vector<int64_t> window_index;       // [patches / merge_unit]
  std::vector<int64_t> cu_window_seqlens;  // [windows + 1]
};
VisionWindows vision_windows(const VisionSpec& spec, const std::vector<GridThw>& grids);

// The full-attention segments (HF's cu_seqlens): one per frame of each image, h*w patches each, from 0.
std::vector<int64_t> vision_frame_seqlens(const std::vector<GridThw>& grids);

}  // namespace shardwise

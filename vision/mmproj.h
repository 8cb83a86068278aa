// vision/mmproj.h — llama.cpp's multimodal projector files for Qwen2.5-VL (the mmproj GGUF that
// convert_hf_to_gguf.py --mmproj writes beside the language model's GGUF): the vision tower's spec, its
// weights and its image processor settings, read into the same VisionModel an HF directory gives.
//
// What the file holds and how it maps (llama.cpp's converter, clip.projector_type "qwen2.5vl_merger"):
//   clip.vision.{block_count, embedding_length, feed_forward_length, attention.head_count, patch_size,
//   projection_dim, attention.layer_norm_epsilon, n_wa_pattern, image_mean, image_std}, clip.use_silu;
//   v.patch_embd.weight and v.patch_embd.weight.1 (the Conv3d's two frames, [hidden, C, P, P] each);
//   v.blk.N.{attn_q, attn_k, attn_v} (fused back into qkv, q rows first), attn_out, ln1, ln2, ffn_gate,
//   ffn_up, ffn_down (weights and biases); v.post_ln (the merger's ln_q); mm.0 and mm.2 (the merger MLP).
// The file does not carry what llama.cpp fixes in code: the temporal patch (2), the merge size (2 unless
// clip.vision.spatial_merge_size says otherwise), the window (112 pixels), the rotary base (10000). Full
// attention is in blocks n_wa_pattern - 1, 2 n_wa_pattern - 1, ...; the activation is SiLU with use_silu,
// else erf GELU. Tensors may be f32, f16, bf16 or a quantised type, dequantised to f32 as gguf-py does.
// The image processor is HF's for Qwen2.5-VL with the file's mean and std and the released checkpoints'
// pixel limits (min 3136, max 12845056): llama.cpp's own resize differs (it caps the longer side).
#pragma once

#include <string>

#include "core/weight_source.h"
#include "vision/vl_prompt.h"

namespace shardwise {

// llama.cpp's name of the Qwen2.5-VL projector (clip.projector_type; clip.cpp's PROJECTOR_TYPE_QWEN25VL).
constexpr const char* kQwen25VlProjector = "qwen2.5vl_merger";

// The tower of an mmproj GGUF. Throws Error naming the file and the key or tensor that is missing or
// wrong (another projector type, shapes that disagree with the spec).
VisionModel load_mmproj(const std::string& path);

// The released Qwen2.5-VL checkpoints' processor settings (min 3136, max 12845056 pixels; HF's mean and
// std) for this tower's patch, temporal patch and merge sizes.
ImageProcessorConfig released_image_processor(const VisionSpec& spec);

// The processor settings of an mmproj GGUF (see above).
ImageProcessorConfig mmproj_image_processor(const std::string& path, const VisionSpec& spec);

// A vision tower and its image processor: an mmproj GGUF (a path ending in .gguf), the tower of a builtin
// spec with seeded random weights ("synthetic:qwen2vl7b?dtype=f16&seed=1": its matrices f16 unless the
// dtype is f32 or bf16, as `synth --mmproj` writes them; released_image_processor), or else an HF
// directory of a vision-language model.
struct VisionTower {
  VisionModel model;
  ImageProcessorConfig processor;
};
VisionTower load_vision_tower(const std::string& path);

// A synthetic tower's matrix dtype for its language model's `lm`: lm where f32 or bf16, else f16 (as llama.cpp
// keeps projectors, and `synth --mmproj` writes them).
DType load_vision_tower_dtype(DType lm);

// The spec of a synthetic tower from the text after "synthetic:" (its options parsed into `model`); an
// Error names the spec when it has no vision tower (builtin_vision_spec).
VisionSpec synthetic_tower_spec(const std::string& text, SyntheticModel* model);

// Writes `m` as llama.cpp's convert_hf_to_gguf.py --mmproj writes a Qwen2.5-VL tower (class
// Qwen2VLVisionModel), so that load_mmproj and llama.cpp's clip.cpp both read it: general.architecture
// "clip", general.type "mmproj", the clip.* keys above with `processor`'s mean and std and the converter's
// clip.vision.image_size 560; the tensors in its names and layout. Matrices are stored as `dtype` (f32,
// f16 or bf16: the converter's --outtype), the patch embedding always as f16 (the converter forces it),
// vectors (norms, biases) as f32. Throws Error for another dtype, or for a tower the file cannot describe
// (llama.cpp's fixed temporal patch 2, merge 2, window 112, 3 channels; full attention in every n-th
// block; silu).
void write_mmproj(const VisionModel& m, const ImageProcessorConfig& processor, const std::string& path, DType dtype);

// The vocabulary strings of Qwen2-VL's image placeholder and vision start, which a GGUF's vocabulary
// holds (its ids are found there: the file carries no image_token_id).
constexpr const char* kImagePadToken = "<|image_pad|>";
constexpr const char* kVisionStartToken = "<|vision_start|>";

// A vision-language model from a language model GGUF (its spec `lm`) and an mmproj, with the special
// token ids of the language model's vocabulary (-1: it has none, an Error): the tower, the processor. An
// Error says why the pair does not fit (out_hidden_size not the language model's hidden size, a language
// model without M-RoPE sections).
VlModel load_vl_model_gguf(const std::string& mmproj_path, const ModelSpec& lm, int32_t image_token_id,
                           int32_t vision_start_token_id);

}  // namespace shardwise

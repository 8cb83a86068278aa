// vision/mmproj.h — llama.cpp's multimodal projector files for Qwen2.5-VL (the mmproj GGUF that
// convert_hf_to_gguf.py --mmproj writes beside the language model's GGUF): the vision tower's spec, its
// weights and its image processor settings, read into the same VisionModel an HF directory gives.
//
// What the file holds and how it maps (llama.cpp's converter, clip.projector_type "qwen2.5vl"):
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

#include "vision/vl_prompt.h"

namespace shardwise {

// The tower of an mmproj GGUF. Throws Error naming the file and the key or tensor that is missing or
// wrong (another projector type, shapes that disagree with the spec).
VisionModel load_mmproj(const std::string& path);

// The processor settings of an mmproj GGUF (see above).
ImageProcessorConfig mmproj_image_processor(const std::string& path, const VisionSpec& spec);

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

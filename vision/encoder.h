// vision/encoder.h — the Qwen2.5-VL vision encoder on the CPU: its weights (f32 on the host, read from an
// HF checkpoint or drawn at random for tests) and its forward pass from the image processor's patches to
// the image tokens the LLM takes, in f32 with the executor's CPU matmul and the tiled attention of
// vision_attention.h. It computes what transformers' Qwen2_5_VisionTransformerPretrainedModel computes,
// in the same order; encoder_reference.h is the f64 reference it is tested against. It never plans and
// never touches a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vision/vision_spec.h"

namespace shardwise {

class ThreadPool;

// One ViT block's tensors, row-major as HF stores them (a linear weight is (out, in)).
struct VisionBlockWeights {
  std::vector<float> norm1, norm2;                // (hidden) RMSNorm weights
  std::vector<float> qkv_w, qkv_b;                // (3 * hidden, hidden), (3 * hidden): q, k, v rows in turn
  std::vector<float> proj_w, proj_b;              // (hidden, hidden), (hidden)
  std::vector<float> gate_w, gate_b, up_w, up_b;  // (intermediate, hidden), (intermediate)
  std::vector<float> down_w, down_b;              // (hidden, intermediate), (hidden)
};

struct VisionWeights {
  std::vector<float> patch_embed;  // (hidden, C * T * P * P): the Conv3d kernel, flattened as a patch is
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> merger_norm;                 // (hidden) ln_q
  std::vector<float> merger_fc1_w, merger_fc1_b;  // (4 * hidden, 4 * hidden), (4 * hidden): merger.mlp.0
  std::vector<float> merger_fc2_w, merger_fc2_b;  // (out_hidden, 4 * hidden), (out_hidden): merger.mlp.2
};

// Throws Error naming the first tensor whose element count does not match the spec.
void check_vision_weights(const VisionSpec& spec, const VisionWeights& weights);

// The tower's tensors from safetensors (`path`: an HF directory, a .safetensors file or an index
// json), named visual.* (transformers 4) or model.visual.* (transformers 5), stored as f32, f16 or bf16
// and converted to f32. Every shape is checked against the spec; an error names the tensor. The LLM's
// tensors in the same files are not read.
VisionWeights load_vision_weights(const VisionSpec& spec, const std::string& path);

struct VisionModel {
  VisionSpec spec;
  VisionWeights weights;
};
// An HF directory's vision tower: the spec from its config.json, the weights from its safetensors.
VisionModel load_vision_model(const std::string& dir);

// Seeded random weights for tests: matrices and biases ~ N(0, stddev), norm weights ~ 1 + N(0, 0.1).
// The same seed gives the same values on every machine.
VisionWeights random_vision_weights(const VisionSpec& spec, uint64_t seed, float stddev = 0.02f);

// Bytes encode_images allocates for n_patches patches with n_threads threads: the activations (the
// residual, the normed input, qkv, the attention output, a projection, the MLP's gate and up, the
// merger's output before and after reordering), the rotary table, the patch positions and the
// attention's scratch. The merger's wide activations reuse the blocks' buffers.
uint64_t vision_encoder_scratch_bytes(const VisionSpec& spec, int64_t n_patches, int n_threads);

// The image tokens of a batch of images: pixel_values [N, C * T * P * P] (the image processor's
// flattened patches of every image in turn, N = vision_patch_count(grid_thw)) → [N / merge^2,
// out_hidden_size], each image's tokens in turn in the processor's order. Throws Error for a bad grid
// or weights that do not match the spec.
std::vector<float> encode_images(const VisionSpec& spec, const VisionWeights& weights, const float* pixel_values,
                                 const std::vector<GridThw>& grid_thw, ThreadPool& pool);

}  // namespace shardwise

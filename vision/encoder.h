// vision/encoder.h — the Qwen2.5-VL vision encoder: its weights (on the host, read from an HF
// checkpoint or drawn at random for tests; the matrices in the checkpoint's f32, f16 or bf16, the norms
// and biases in f32) and its forward pass from the image processor's patches to the image tokens the LLM
// takes, in f32, written once over the operations of VisionKernels
// (executor/device/vision_kernels.h) so that the CPU, the emulated device and CUDA run the same steps:
// the patch embedding, the blocks, the merger. It computes what transformers'
// Qwen2_5_VisionTransformerPretrainedModel computes, in the same order; encoder_reference.h is the f64
// reference it is tested against. encode_images runs it on the CPU; vision_runtime.h plans and runs it on
// a device within a VRAM budget.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "executor/device/vision_kernels.h"
#include "vision/vision_spec.h"

namespace shardwise {

class ThreadPool;

// A weight matrix of the tower, row-major, in f32, f16 or bf16. A 16-bit checkpoint's matrices stay
// 16-bit: half the host memory and copies to the device, and the device's tensor-core GEMMs; every
// kernel widens the values exactly.
struct VisionMatrix {
  DType dtype = DType::F32;
  std::vector<uint8_t> bytes;

  // The values rounded to dtype (to nearest even; exact for values that came from dtype).
  static VisionMatrix from_values(const std::vector<float>& values, DType dtype);
  std::vector<float> values() const;  // widened to f32
  size_t size() const { return bytes.size() / static_cast<size_t>(dtype_block_bytes(dtype)); }
  bool operator==(const VisionMatrix& o) const { return dtype == o.dtype && bytes == o.bytes; }
};

// One ViT block's tensors, row-major as HF stores them (a linear weight is (out, in)).
struct VisionBlockWeights {
  std::vector<float> norm1, norm2;  // (hidden) RMSNorm weights
  VisionMatrix qkv_w;               // (3 * hidden, hidden): q, k, v rows in turn
  std::vector<float> qkv_b;         // (3 * hidden)
  VisionMatrix proj_w;              // (hidden, hidden)
  std::vector<float> proj_b;        // (hidden)
  VisionMatrix gate_w, up_w;        // (intermediate, hidden)
  std::vector<float> gate_b, up_b;  // (intermediate)
  VisionMatrix down_w;              // (hidden, intermediate)
  std::vector<float> down_b;        // (hidden)
};

struct VisionWeights {
  DType matrix_dtype = DType::F32;  // every matrix's dtype
  VisionMatrix patch_embed;         // (hidden, C * T * P * P): the Conv3d kernel, flattened as a patch is
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> merger_norm;   // (hidden) ln_q
  VisionMatrix merger_fc1_w;        // (4 * hidden, 4 * hidden): merger.mlp.0
  std::vector<float> merger_fc1_b;  // (4 * hidden)
  VisionMatrix merger_fc2_w;        // (out_hidden, 4 * hidden): merger.mlp.2
  std::vector<float> merger_fc2_b;  // (out_hidden)
};

// Throws Error naming the first tensor whose element count (or, for a matrix, dtype) does not match the
// spec and matrix_dtype.
void check_vision_weights(const VisionSpec& spec, const VisionWeights& weights);

// The dtype the tower's matrices keep when their stored dtypes are `stored`: f16 or bf16 when all of them
// are that, else f32 (an f32 or mixed checkpoint).
DType vision_matrix_dtype(const std::vector<DType>& stored);

// Every matrix of w: the patch embedding, the merger's two and each block's five.
std::vector<const VisionMatrix*> vision_matrices(const VisionWeights& w);

// Every matrix of w converted to dtype (f32, f16 or bf16; rounded to nearest even where narrower).
void convert_vision_matrices(VisionWeights& w, DType dtype);

// The tower's tensors from safetensors (`path`: an HF directory, a .safetensors file or an index
// json), named visual.* (transformers 4) or model.visual.* (transformers 5), stored as f32, f16 or bf16:
// the matrices kept in vision_matrix_dtype of their stored dtypes, the norms and biases converted to f32.
// Every shape is checked against the spec; an error names the tensor. The LLM's tensors in the same files
// are not read.
VisionWeights load_vision_weights(const VisionSpec& spec, const std::string& path);

// The dtype load_vision_weights would keep the matrices of `path` in, from the files' headers alone.
DType stored_vision_matrix_dtype(const VisionSpec& spec, const std::string& path);

struct VisionModel {
  VisionSpec spec;
  VisionWeights weights;
};
// An HF directory's vision tower: the spec from its config.json, the weights from its safetensors.
VisionModel load_vision_model(const std::string& dir);

// Seeded random weights for tests: matrices and biases ~ N(0, stddev), norm weights ~ 1 + N(0, 0.1),
// the matrices rounded to matrix_dtype. The same seed gives the same values on every machine.
VisionWeights random_vision_weights(const VisionSpec& spec, uint64_t seed, float stddev = 0.02f,
                                    DType matrix_dtype = DType::F32);

// What the forward pass needs of a batch of images besides the pixels, computed on the host: the patch
// count, each patch's rotary cos and sin [n, head_dim / 2] in window order, the window order of the
// merged tokens (vision_windows' window_index) and the window and frame segments, as int32 (bounded by
// kMaxVisionPatches), with their longest segments. Throws Error for a bad grid.
struct VisionInputs {
  int64_t n_patches = 0;
  std::vector<float> cos, sin;
  std::vector<int32_t> window_index, cu_windows, cu_frames;
  int64_t max_window = 0, max_frame = 0;
};
VisionInputs vision_inputs(const VisionSpec& spec, const std::vector<GridThw>& grids);

// The activations of one forward pass in one device's memory, patches in window order: the residual x
// and the normed xn [n, hidden]; qkv [n, 3 * hidden] (wide enough to hold the pixels [n, patch_dim]
// before the blocks and the merger's output before its reorder); the attention's output att [n, hidden]
// (also the merger's middle [n / merge_unit, merger_width]); the MLP's gate and up [mlp_chunk,
// intermediate] (the MLP goes through the tokens mlp_chunk at a time); the rotary tables; the result
// tokens [n / merge_unit, out_hidden] in input order; and the int32 tables of VisionInputs.
struct VisionActivations {
  int64_t n = 0, mlp_chunk = 0;
  float *x = nullptr, *xn = nullptr, *qkv = nullptr, *att = nullptr, *gate = nullptr, *up = nullptr;
  float *cos = nullptr, *sin = nullptr, *tokens = nullptr;
  int32_t *window_index = nullptr, *cu_windows = nullptr, *cu_frames = nullptr;
  int64_t n_windows = 0, n_frames = 0, max_window = 0, max_frame = 0;
};
// Bytes rounded up to the 256-byte alignment of every region the encoder lays out in an arena.
uint64_t vision_aligned_bytes(uint64_t bytes);
// Bytes of those regions (each 256-byte aligned), and the regions laid out from `base`.
uint64_t vision_activation_bytes(const VisionSpec& spec, const VisionInputs& in, int64_t mlp_chunk);
VisionActivations carve_vision_activations(const VisionSpec& spec, const VisionInputs& in, int64_t mlp_chunk,
                                           uint8_t* base);
// The tables of `in` into their regions of `a` through copy(dst, src, bytes) (a host-to-device copy).
void upload_vision_inputs(const VisionInputs& in, const VisionActivations& a,
                          const std::function<void(void*, const void*, uint64_t)>& copy);

// One block's weights, and the merger's, in one device's memory (host memory on the CPU).
struct VisionBlockPtrs {
  const float *norm1 = nullptr, *norm2 = nullptr;
  DevMat qkv, proj, gate, up, down;
  const float *qkv_b = nullptr, *proj_b = nullptr, *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
};
struct VisionMergerPtrs {
  const float* norm = nullptr;
  DevMat fc1, fc2;
  const float *fc1_b = nullptr, *fc2_b = nullptr;
};
// The host weights seen as such (f32).
VisionBlockPtrs vision_block_ptrs(const VisionSpec& spec, const VisionBlockWeights& w);
VisionMergerPtrs vision_merger_ptrs(const VisionSpec& spec, const VisionWeights& w);
DevMat vision_patch_embed_mat(const VisionSpec& spec, const VisionWeights& w);

// The forward pass in three parts, enqueued on k in order: the patch embedding of the pixels in a.qkv
// into window order in a.x; one block (full_attention: over whole frames, else within windows); the
// merger into a.tokens.
void vision_embed(VisionKernels& k, const VisionSpec& spec, const DevMat& patch_embed, const VisionActivations& a);
void vision_block(VisionKernels& k, const VisionSpec& spec, const VisionBlockPtrs& w, const VisionActivations& a,
                  bool full_attention);
void vision_merger(VisionKernels& k, const VisionSpec& spec, const VisionMergerPtrs& w, const VisionActivations& a);

// Bytes encode_images allocates for n_patches patches with n_threads threads: the activations above with
// the MLP in one piece (for the most windows a batch of that many patches can have), and the attention's
// per-thread scratch.
uint64_t vision_encoder_scratch_bytes(const VisionSpec& spec, int64_t n_patches, int n_threads);

// The image tokens of a batch of images: pixel_values [N, C * T * P * P] (the image processor's
// flattened patches of every image in turn, N = vision_patch_count(grid_thw)) → [N / merge^2,
// out_hidden_size], each image's tokens in turn in the processor's order. Throws Error for a bad grid
// or weights that do not match the spec.
std::vector<float> encode_images(const VisionSpec& spec, const VisionWeights& weights, const float* pixel_values,
                                 const std::vector<GridThw>& grid_thw, ThreadPool& pool);

}  // namespace shardwise

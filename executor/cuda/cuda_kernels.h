// executor/cuda/cuda_kernels.h — the model's blocks on an NVIDIA GPU: the CUDA implementation of
// DeviceKernels (device.h), computing the same function as the CPU blocks (cpu_blocks.h) with f32
// activations and accumulation (logits within 1e-4 of the CPU reference; no f16/bf16 rounding of
// activations, no TF32). Owns: its kernels, a small pinned staging ring for host tables (RoPE angles,
// MoE token lists). The blocks never allocate device memory: every temporary comes from the region
// given to set_workspace, and an Error names what did not fit (only the set-up's warm-up,
// cuda_kernels_warm_up, takes a temporary buffer of its own, and frees it before the arena exists). Work is enqueued on
// the given stream in call order; nothing waits for the GPU except pinned-staging reuse (and its rare growth). Only
// .cu/.cpp files of the CUDA build include this header (it needs the CUDA headers).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "executor/device/device.h"

namespace shardwise {

// The blocks for one model. `blas` is used on `compute` (the kernels set its stream, pointer mode
// and math mode around their calls; its workspace is the caller's). prepare_step must follow
// set_workspace in each step (the step's RoPE table lives at the start of the workspace).
std::unique_ptr<DeviceKernels> make_cuda_kernels(const ModelSpec& spec, RopeStyle rope, cudaStream_t compute,
                                                 cublasHandle_t blas);

// The part of a workspace region of `bytes` that cuBLAS gets (its workspace; the blocks get the rest):
// the largest of 8 MiB, 2 MiB and 256 KiB that is at most a quarter of the region (below 1 MiB, a
// quarter). cuBLAS picks its kernels by its workspace too, so it takes few sizes, which the warm-up
// runs (256 KiB and 2 MiB; 8 MiB only comes with real models' scratch, where the warm-up's shrunk
// shapes cannot reproduce cuBLAS's choices anyway).
uint64_t cuda_blas_workspace_bytes(uint64_t bytes);

// What cuda_kernels_warm_up did.
struct CudaWarmUpStats {
  bool exact_shapes = false;  // the blocks ran on the model's own matrix shapes (else on shrunk ones)
  uint64_t temp_bytes = 0;    // device memory it allocated (one cudaMalloc) and freed again
  int64_t steps = 0;          // block steps run (every block of the model per step)
  int64_t matmuls = 0;        // matmul calls of the cuBLAS sweep
  int64_t launches = 0;       // direct launcher calls of the variant sweep
  double ms = 0;              // wall time, including the driver's and cuBLAS's loading
  std::string error;          // empty when every part ran
};

// Part of the set-up before the arena (CudaDevice::kernels): makes every kernel the blocks of
// `kernels` (from make_cuda_kernels) can launch for their model load now, and do its one-time work,
// so that no first launch takes device memory after the arena (lazy module loading loads each kernel,
// ours and cuBLAS's, at its first launch and grows the driver's memory in 2 MiB steps). It runs the
// real blocks of a one-layer copy of the model (its own shapes when small, else shrunk, always with
// its head_dim, top-k and RoPE) in every weight dtype over token counts that take every branch, each
// launcher variant that data decide (GEMV token bucket and alignment, attention row grouping, aligned
// or guarded loads, key splits) directly, and matmul's exact cuBLAS calls with the blocks' shapes,
// strides and offsets for every token count 9..64 (and some up to 256) and the two cuBLAS workspace
// sizes below 8 MiB (cuBLAS's kernels for other token counts or shrunk shapes may still differ).
// Also allocates the kernels' pinned staging for steps of up to 512 tokens. Temporary device memory (a few MiB) is
// allocated and freed here; the stream is synchronized; the cuBLAS handle is left with no workspace (set_workspace
// gives it one). Never throws: a failure is reported in `error` (the kernels still work; first
// launches may then take device memory after the arena).
CudaWarmUpStats cuda_kernels_warm_up(DeviceKernels& kernels);

// Workspace bytes with which steps of up to n_tokens run each block in one piece (less works too:
// blocks then go through the tokens in chunks; the minimum is about the size for one token).
uint64_t cuda_kernels_workspace_bytes(const ModelSpec& spec, int64_t n_tokens);

// The matmul every block uses, for tests and benchmarks: y[t * ldy + r] (+)= sum_c W[r, c] x[t * ldx + c]
// for t < n (GEMV for n <= 8, exact cuBLAS GEMMs above), temporaries from [workspace, + bytes).
void cuda_matmul(const DevMat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                 uint8_t* workspace, uint64_t workspace_bytes, cudaStream_t stream, cublasHandle_t blas);

// Attention over a KV cache (the kernel the attention block uses), for profilers and tests: q
// [n, n_heads * head_dim] (row stride n_heads * head_dim), caches with rows 0 .. pos_first + n - 1 of
// n_kv_heads * head_dim elements of kv_dtype (f32, f16, bf16 or q8_0) each, out [n, n_heads * head_dim]; query t at
// position pos_first + t attends cache rows 0 .. pos_first + t (causal GQA, scale 1/sqrt(head_dim)); head_dim 1 ..
// 256 (q8_0: a multiple of 32).
// Temporaries (split-K partials) from [workspace, + workspace_bytes): less room only means fewer key
// splits (none with 0 bytes). Enqueued on stream; nothing waits. Cache rows before pos_first may be
// read before the kernel enqueued just before this one ends (programmatic dependent launch, kernels.cuh
// AttnArgs): that kernel must not write them.
void cuda_attention(const float* q, const void* k_cache, const void* v_cache, float* out, int64_t n, int64_t pos_first,
                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint8_t* workspace, uint64_t workspace_bytes,
                    cudaStream_t stream, DType kv_dtype = DType::F32);

// The element-wise kernels of the blocks, likewise: RMSNorm of n rows of dim, y[t] = x[t] /
// sqrt(mean(x[t]^2) + eps) * w (y may alias x), and SwiGLU gate = silu(gate) * up over n rows of
// width (dense). Enqueued on stream.
void cuda_rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim, cudaStream_t stream);
void cuda_swiglu(float* gate, const float* up, int64_t n, int64_t width, cudaStream_t stream);

// The vision encoder's operations (vision_kernels.h, vision.cu) enqueued on `compute`, with the blocks'
// exact matmul for linear layers. `blas` is used on `compute` as by the blocks; set_workspace gives it
// the first cuda_blas_workspace_bytes of the region as its workspace and matmul the rest.
std::unique_ptr<VisionKernels> make_cuda_vision_kernels(cudaStream_t compute, cublasHandle_t blas);

// Part of the set-up before the arena, as cuda_kernels_warm_up: launches every kernel the operations of
// `k` (from make_cuda_vision_kernels) can launch for this head_dim, so that lazy module loading takes no
// device memory after the arena: linear with f32, f16 and bf16 weights over GEMV (up to 8 tokens, each
// token bucket, aligned and not) and GEMM token counts under the two cuBLAS workspaces below 8 MiB, the
// bias kernel, RMSNorm, rotary, attention (aligned and not), every activation with and without up, and
// both permutations, all on small shapes in one temporary cudaMalloc that it frees again. Synchronizes
// the stream and leaves cuBLAS with no workspace (and `k` with none: set_workspace again before use).
// Returns "" or what failed; never throws.
std::string cuda_vision_warm_up(VisionKernels& k, int64_t head_dim);

namespace cuda {
// One row of `cols` columns of `dtype` (a type the quantised prefill GEMM computes: q8_0, q4_0, the K-quants)
// as that GEMM's kernels decode it, run on the host: out[c] = d * code - m from the codes, scales and mins
// they take from each stage's blocks (executor/cuda/quant_gemm.cu). A check of their decoding against
// dequantize_row that needs no GPU; an Error for other types or a partial block.
void quant_gemm_decode_row(DType dtype, const uint8_t* row, int64_t cols, float* out);
}  // namespace cuda

}  // namespace shardwise

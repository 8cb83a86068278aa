// executor/cuda/cuda_kernels.h — the model's blocks on an NVIDIA GPU: the CUDA implementation of
// DeviceKernels (device.h), computing the same function as the CPU blocks (cpu_blocks.h) with f32
// activations and accumulation (logits within 1e-4 of the CPU reference; no f16/bf16 rounding of
// activations, no TF32). Owns: its kernels, a small pinned staging ring for host tables (RoPE angles,
// MoE token lists). Never allocates device memory: every temporary comes from the region given to
// set_workspace, and an Error names what did not fit. Work is enqueued on the given stream in call
// order; nothing waits for the GPU except pinned-staging reuse (and its rare growth).
// Only .cu/.cpp files of the CUDA build include this header (it needs the CUDA headers).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "executor/device/device.h"

namespace shardwise {

// The blocks for one model. `blas` is used on `compute` (the kernels set its stream, pointer mode
// and math mode around their calls; its workspace is the caller's). prepare_step must follow
// set_workspace in each step (the step's RoPE table lives at the start of the workspace).
std::unique_ptr<DeviceKernels> make_cuda_kernels(const ModelSpec& spec, RopeStyle rope, cudaStream_t compute,
                                                 cublasHandle_t blas);

// Workspace bytes with which steps of up to n_tokens run each block in one piece (less works too:
// blocks then go through the tokens in chunks; the minimum is about the size for one token).
uint64_t cuda_kernels_workspace_bytes(const ModelSpec& spec, int64_t n_tokens);

// The matmul every block uses, for tests and benchmarks: y[t * ldy + r] (+)= sum_c W[r, c] x[t * ldx + c]
// for t < n (GEMV for n <= 8, exact cuBLAS GEMMs above), temporaries from [workspace, + bytes).
void cuda_matmul(const DevMat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                 uint8_t* workspace, uint64_t workspace_bytes, cudaStream_t stream, cublasHandle_t blas);

// Attention over a KV cache (the kernel the attention block uses), for profilers and tests: q
// [n, n_heads * head_dim] (row stride n_heads * head_dim), caches with rows 0 .. pos_first + n - 1 of
// n_kv_heads * head_dim f32 each, out [n, n_heads * head_dim]; query t at position pos_first + t
// attends cache rows 0 .. pos_first + t (causal GQA, scale 1/sqrt(head_dim)); head_dim 1 .. 256.
// Temporaries (split-K partials) from [workspace, + workspace_bytes): less room only means fewer key
// splits (none with 0 bytes). Enqueued on stream; nothing waits.
void cuda_attention(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t n,
                    int64_t pos_first, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint8_t* workspace,
                    uint64_t workspace_bytes, cudaStream_t stream);

// The element-wise kernels of the blocks, likewise: RMSNorm of n rows of dim, y[t] = x[t] /
// sqrt(mean(x[t]^2) + eps) * w (y may alias x), and SwiGLU gate = silu(gate) * up over n rows of
// width (dense). Enqueued on stream.
void cuda_rms_norm(const float* x, const float* w, float eps, float* y, int64_t n, int64_t dim, cudaStream_t stream);
void cuda_swiglu(float* gate, const float* up, int64_t n, int64_t width, cudaStream_t stream);

}  // namespace shardwise

// executor/cuda/cuda_common.cuh — shared by the CUDA kernel files (never by CPU-only code): error
// checks that turn CUDA/cuBLAS failures into shardwise::Error, the launcher of the blocks' kernels
// (programmatic dependent launch) and its device side, device helpers for the GGUF block dtypes and
// warp reductions, and the workspace bump allocator through which every device temporary of the
// blocks is taken (the kernels never allocate device memory).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace shardwise {
namespace cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(e));
}
inline void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: ", what, ": ", cublasGetStatusString(s));
}
// After a kernel launch: reports a bad configuration (or an earlier asynchronous error) by name.
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

// Programmatic dependent launch (sm_90+): a kernel started by launch_kernel() may be scheduled while the
// kernel before it in the stream still runs; it waits (pdl_wait) before it touches memory, so it sees
// everything that kernel wrote, and that kernel never sees its writes. What overlaps is the launch
// and the block scheduling of one kernel with the tail of the last: decode steps run hundreds of
// small kernels back to back. Other dependencies (events, copies) are unchanged. A device below sm_90
// launches them as plain launches.
bool pdl_enabled();

template <typename... Params, typename... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
inline uint64_t align_up(uint64_t x, uint64_t a = 256) {
  return (x + a - 1) / a * a;
}
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Device temporaries of one block call, carved from the region given to set_workspace. Stack-like:
// a scope takes buffers and gives them back when it ends. All work is ordered on one stream, so a
// buffer given back may be reused at once by later work.
class Workspace {
 public:
  void reset(uint8_t* base, uint64_t bytes) {
    base_ = base;
    bytes_ = bytes;
    used_ = 0;
  }
  uint64_t mark() const { return used_; }
  void release(uint64_t mark) { used_ = mark; }
  uint64_t capacity() const { return bytes_; }
  uint64_t available() const {
    const uint64_t u = align_up(used_);
    return u >= bytes_ ? 0 : bytes_ - u;
  }
  template <typename T>
  T* take(uint64_t count, const char* what) {
    const uint64_t start = align_up(used_);
    const uint64_t bytes = count * sizeof(T);
    SW_CHECK(base_ != nullptr, "CUDA kernels: no workspace was set (call set_workspace before the blocks)");
    SW_CHECK(start + bytes <= bytes_, "CUDA kernels: the workspace is too small for ", what, ": needs ", bytes,
             " bytes, ", (start >= bytes_ ? 0 : bytes_ - start), " of ", bytes_,
             " are free (give the blocks more scratch)");
    used_ = start + bytes;
    return reinterpret_cast<T*>(base_ + start);
  }

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, used_ = 0;
};

struct WorkspaceScope {
  explicit WorkspaceScope(Workspace& w) : ws(w), saved(w.mark()) {}
  ~WorkspaceScope() { ws.release(saved); }
  WorkspaceScope(const WorkspaceScope&) = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;
  Workspace& ws;
  uint64_t saved;
};

// What every launcher needs: the compute stream, the cuBLAS handle, the workspace and a few device
// facts. Device scalars {0, 1} live in device memory for cuBLAS calls in device pointer mode.
struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Workspace* ws = nullptr;
  int sm_count = 132;
  const float* dev_zero_one = nullptr;  // [0.0f, 1.0f]
};

// ---- device helpers ----------------------------------------------------------------------------
#ifdef __CUDACC__

// The first statement of every kernel started by launch_kernel(): waits until the kernel before it in the
// stream has finished and its writes are visible (a no-op for plain launches), then lets the next
// kernel be scheduled (it waits in turn before touching memory). A kernel may read, before its
// pdl_wait, memory that no kernel writes (weights: only copies write them, ordered by events).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Streamed once (weights): bypass L1 so that activations stay there.
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t ld_u16(const void* p) {
  return static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ float f16_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// Exact int -> float for a byte of a word: 2^23 + byte as a float bit pattern, minus the bias.
// byte k (0..3) of w: __byte_perm(w, 0x4B000000, 0x7540 | k) = 0x4B0000bb.
template <int K>
__device__ __forceinline__ float byte_magic(uint32_t w) {
  return __int_as_float(static_cast<int>(__byte_perm(w, 0x4B000000u, 0x7540u | K)));
}
constexpr float kMagic = 8388608.0f;  // 2^23

static __constant__ const int8_t kIq4nlTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                    1,    13,   25,  38,  53,  69,  89,  113};

// Element j of one block of the types below q8_0/q4_0 (core/quants.cpp has their layouts), with the
// reference's f32 roundings (no fused multiply-add), so values equal the CPU's bit for bit.
__device__ __forceinline__ float nibble32(const uint8_t* qs, int j) {  // j < 16 low nibbles, then high ones
  return static_cast<float>(j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4));
}
__device__ __forceinline__ int fifth_bit32(const uint8_t* qh, int j) {
  return ((qh[j / 8] >> (j % 8)) & 1) << 4;
}
__device__ __forceinline__ void scale_min_k4(int g, const uint8_t* q, int* sc, int* m) {
  if (g < 4) {
    *sc = q[g] & 63;
    *m = q[g + 4] & 63;
  } else {
    *sc = (q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4);
    *m = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
  }
}
__device__ __forceinline__ float k_quant_elem(DType t, const uint8_t* blk, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32, g16 = e / 16, g32 = e / 32;
  switch (t) {
    case DType::Q2_K: {
      const float d = f16_bits_to_float(ld_u16(blk + 80)), dmin = f16_bits_to_float(ld_u16(blk + 82));
      const int sc = blk[g16];
      const float q = static_cast<float>((blk[16 + 32 * h + l] >> (2 * s)) & 3);
      return __fsub_rn(__fmul_rn(__fmul_rn(d, static_cast<float>(sc & 0x0F)), q),
                       __fmul_rn(dmin, static_cast<float>(sc >> 4)));
    }
    case DType::Q3_K: {
      const uint8_t* sc = blk + 96;
      const int lo = g16 < 8 ? (sc[g16] & 0x0F) : (sc[g16 - 8] >> 4);
      const int scale = (lo | (((sc[8 + g16 % 4] >> (2 * (g16 / 4))) & 3) << 4)) - 32;
      const int q = ((blk[32 + 32 * h + l] >> (2 * s)) & 3) - (((blk[e % 32] >> (e / 32)) & 1) ? 0 : 4);
      return __fmul_rn(__fmul_rn(f16_bits_to_float(ld_u16(blk + 108)), static_cast<float>(scale)),
                       static_cast<float>(q));
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      int sc, m;
      scale_min_k4(g32, blk + 4, &sc, &m);
      const uint8_t* qs = blk + (t == DType::Q4_K ? 16 : 48);
      int q = (qs[32 * (g32 / 2) + l] >> (4 * (g32 % 2))) & 0x0F;
      if (t == DType::Q5_K) q |= ((blk[16 + l] >> g32) & 1) << 4;
      const float d = f16_bits_to_float(ld_u16(blk)), dmin = f16_bits_to_float(ld_u16(blk + 2));
      return __fsub_rn(__fmul_rn(__fmul_rn(d, static_cast<float>(sc)), static_cast<float>(q)),
                       __fmul_rn(dmin, static_cast<float>(m)));
    }
    default: {  // Q6_K
      const int r = e % 128;
      const int lo = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int hi = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const float dl =
          __fmul_rn(f16_bits_to_float(ld_u16(blk + 208)), static_cast<float>(static_cast<int8_t>(blk[192 + g16])));
      return __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
    }
  }
}

// One element of a weight row of any dtype (slow paths and tests).
__device__ __forceinline__ float load_weight(DType t, const uint8_t* row, int64_t c) {
  switch (t) {
    case DType::F32:
      return reinterpret_cast<const float*>(row)[c];
    case DType::F16:
      return f16_bits_to_float(ld_u16(row + 2 * c));
    case DType::BF16:
      return bf16_bits_to_float(ld_u16(row + 2 * c));
    case DType::Q8_0: {
      const uint8_t* blk = row + (c / 32) * 34;
      return f16_bits_to_float(ld_u16(blk)) * static_cast<float>(static_cast<int8_t>(blk[2 + c % 32]));
    }
    case DType::Q4_0: {
      const uint8_t* blk = row + (c / 32) * 18;
      const int j = static_cast<int>(c % 32);
      const int q = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
      return f16_bits_to_float(ld_u16(blk)) * static_cast<float>(q - 8);
    }
    case DType::Q4_1: {
      const uint8_t* blk = row + (c / 32) * 20;
      return __fadd_rn(__fmul_rn(f16_bits_to_float(ld_u16(blk)), nibble32(blk + 4, static_cast<int>(c % 32))),
                       f16_bits_to_float(ld_u16(blk + 2)));
    }
    case DType::Q5_0: {
      const uint8_t* blk = row + (c / 32) * 22;
      const int j = static_cast<int>(c % 32);
      const int q = static_cast<int>(nibble32(blk + 6, j)) | fifth_bit32(blk + 2, j);
      return __fmul_rn(f16_bits_to_float(ld_u16(blk)), static_cast<float>(q - 16));
    }
    case DType::Q5_1: {
      const uint8_t* blk = row + (c / 32) * 24;
      const int j = static_cast<int>(c % 32);
      const int q = static_cast<int>(nibble32(blk + 8, j)) | fifth_bit32(blk + 4, j);
      return __fadd_rn(__fmul_rn(f16_bits_to_float(ld_u16(blk)), static_cast<float>(q)),
                       f16_bits_to_float(ld_u16(blk + 2)));
    }
    case DType::IQ4_NL: {
      const uint8_t* blk = row + (c / 32) * 18;
      const int q = static_cast<int>(nibble32(blk + 2, static_cast<int>(c % 32)));
      return __fmul_rn(f16_bits_to_float(ld_u16(blk)), static_cast<float>(kIq4nlTable[q]));
    }
    case DType::Q2_K:
      return k_quant_elem(t, row + (c / 256) * 84, static_cast<int>(c % 256));
    case DType::Q3_K:
      return k_quant_elem(t, row + (c / 256) * 110, static_cast<int>(c % 256));
    case DType::Q4_K:
      return k_quant_elem(t, row + (c / 256) * 144, static_cast<int>(c % 256));
    case DType::Q5_K:
      return k_quant_elem(t, row + (c / 256) * 176, static_cast<int>(c % 256));
    case DType::Q6_K:
      return k_quant_elem(t, row + (c / 256) * 210, static_cast<int>(c % 256));
  }
  return 0.0f;
}

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace shardwise

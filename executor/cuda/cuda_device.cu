// executor/cuda/cuda_device.cu — device discovery and GGUF-block dequantisation kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "executor/cuda/cuda_common.cuh"
#include "executor/cuda/cuda_device.h"
#include "executor/device/device.h"

namespace shardwise {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: ", what, ": ", cudaGetErrorString(e));
}

__global__ void dequant_f16(const __half* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = __half2float(src[i]);
}

__global__ void dequant_bf16(const __nv_bfloat16* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = __bfloat162float(src[i]);
}

// One thread per element; element i is in block i/32 at index i%32.
__global__ void dequant_q8_0(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint8_t* blk = src + (i / 32) * 34;
  const __half d = *reinterpret_cast<const __half*>(blk);
  dst[i] = __half2float(d) * static_cast<float>(static_cast<int8_t>(blk[2 + i % 32]));
}

__global__ void dequant_q4_0(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint8_t* blk = src + (i / 32) * 18;
  const __half d = *reinterpret_cast<const __half*>(blk);
  const int j = static_cast<int>(i % 32);
  const int q = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
  dst[i] = __half2float(d) * static_cast<float>(q - 8);
}

// Any other block type, one thread per element, through the GEMV kernels' element decode.
__global__ void dequant_blocks(DType t, const uint8_t* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = cuda::load_weight(t, src, i);
}

}  // namespace

bool cuda_built() {
  return true;
}

bool cuda_computes_dtype(DType) {
  return true;  // every type of kAllDTypes: GEMVs of their own or the generic one, dequantised GEMMs
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp p;
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  CudaDeviceInfo info;
  info.name = p.name;
  info.sm_major = p.major;
  info.sm_minor = p.minor;
  info.multiprocessors = p.multiProcessorCount;
  check(cudaSetDevice(device), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  info.total_bytes = total_b;
  info.free_bytes = free_b;
  check(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  return info;
}

void cuda_dequantize(DType dtype, const void* src, float* dst, int64_t n) {
  const uint64_t in_bytes = dtype_row_bytes(dtype, n);
  void* d_src = nullptr;
  float* d_dst = nullptr;
  check(cudaMalloc(&d_src, in_bytes), "cudaMalloc");
  if (cudaMalloc(&d_dst, static_cast<size_t>(n) * sizeof(float)) != cudaSuccess) {
    cudaFree(d_src);
    fail("CUDA: cudaMalloc failed");
  }
  cudaError_t e = cudaMemcpy(d_src, src, in_bytes, cudaMemcpyHostToDevice);
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  if (e == cudaSuccess) {
    switch (dtype) {
      case DType::F32:
        e = cudaMemcpy(d_dst, d_src, in_bytes, cudaMemcpyDeviceToDevice);
        break;
      case DType::F16:
        dequant_f16<<<blocks, threads>>>(static_cast<const __half*>(d_src), d_dst, n);
        break;
      case DType::BF16:
        dequant_bf16<<<blocks, threads>>>(static_cast<const __nv_bfloat16*>(d_src), d_dst, n);
        break;
      case DType::Q8_0:
        dequant_q8_0<<<blocks, threads>>>(static_cast<const uint8_t*>(d_src), d_dst, n);
        break;
      case DType::Q4_0:
        dequant_q4_0<<<blocks, threads>>>(static_cast<const uint8_t*>(d_src), d_dst, n);
        break;
      default:
        dequant_blocks<<<blocks, threads>>>(dtype, static_cast<const uint8_t*>(d_src), d_dst, n);
        break;
    }
    if (e == cudaSuccess) e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(dst, d_dst, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d_src);
  cudaFree(d_dst);
  check(e, "dequantise");
}

}  // namespace shardwise

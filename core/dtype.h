// core/dtype.h — element types of weights, bit-exact with GGUF/ggml block layouts.
// Supported for compute: F32, F16, BF16, Q8_0, Q4_0. Every other GGML type id is known by name
// only, so that a file using one fails with a clear message naming the tensor and the type.
// Reference (scalar, readable) conversion and (de)quantisation live here; fast kernels live in
// executor/ and are tested against these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardwise {

// Values are the GGML type ids used in GGUF files.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  BF16 = 30,
};

constexpr int kQK8_0 = 32;  // elements per Q8_0 block
constexpr int kQK4_0 = 32;  // elements per Q4_0 block

// Q8_0: one f16 scale, 32 signed bytes; x = d * q.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes as in GGUF");

// Q4_0: one f16 scale, 16 bytes of nibbles; element j (j < 16) is the low nibble of qs[j],
// element j + 16 the high nibble; x = d * (q - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes as in GGUF");

// Name of any GGML type id ("q4_K", "iq2_xs", ...); "type#N" for ids unknown to us.
const char* ggml_type_name(uint32_t type_id);
// Block layout of any GGML type id (also the ones we cannot compute with); false if unknown.
bool ggml_type_block(uint32_t type_id, uint32_t* block_elems, uint32_t* block_bytes);
// True for the five types we compute with.
bool is_supported_dtype(uint32_t type_id);
// Throws Error("<context>: tensor type q4_K is not supported ...") for unsupported ids.
DType dtype_from_ggml(uint32_t type_id, const std::string& context);

const char* dtype_name(DType t);             // "f32", "f16", "bf16", "q8_0", "q4_0"
DType parse_dtype(const std::string& name);  // accepts the names above, case-insensitive
int64_t dtype_block_elems(DType t);          // 1 for float types, 32 for the quantised ones
int64_t dtype_block_bytes(DType t);          // bytes per block
bool dtype_is_quantized(DType t);

// Bytes of n elements; n must be a multiple of the block size (throws Error otherwise).
uint64_t dtype_row_bytes(DType t, int64_t n);
// Effective bits per weight (e.g. 4.5 for Q4_0).
double dtype_bits_per_elem(DType t);

// IEEE half / bfloat16 conversions, round-to-nearest-even, as ggml does them.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Reference conversion of n elements to/from f32 (scalar; for tests, writers and slow paths).
// src/dst must be aligned for their element or block type (2 bytes for f16/bf16/q8_0/q4_0).
// quantize_row uses ggml's reference quantisers, so blocks are bit-identical to llama.cpp's.
void quantize_row(DType t, const float* src, void* dst, int64_t n);
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace shardwise

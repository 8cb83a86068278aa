// core/dtype.h — element types of weights, bit-exact with GGUF/ggml block layouts.
// Supported: F32, F16, BF16, the 32-element blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the
// 256-element "K-quants" Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Every other GGML type id is known by name
// only, so that a file using one fails with a clear message naming the tensor and the type.
// Reference (scalar, readable) conversion and (de)quantisation live here (core/quants.cpp for the
// blocks); fast kernels live in executor/ and are tested against these.
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
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  BF16 = 30,
};

// Every supported type, in the order of their CPU kernel slots (executor/cpu/kernels.h).
constexpr DType kAllDTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q4_0,
                                DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::Q2_K,
                                DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
constexpr int kNumDTypes = static_cast<int>(sizeof(kAllDTypes) / sizeof(kAllDTypes[0]));

constexpr int kQK8_0 = 32;  // elements per Q8_0 block
constexpr int kQK4_0 = 32;  // elements per Q4_0 block (and Q4_1, Q5_0, Q5_1, IQ4_NL)
constexpr int kQK_K = 256;  // elements per K-quant super-block

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

// Q4_1: scale and minimum (f16), nibbles as in Q4_0; x = d * q + m.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
// Q5_0: like Q4_0 with a fifth bit per element in qh (bit j of the little-endian word); x = d * (q - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// Q5_1: Q5_0's bits with Q4_1's minimum; x = d * q + m.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// IQ4_NL: nibbles index a fixed non-linear table (kIq4nlValues); x = d * table[q].
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
extern const int8_t kIq4nlValues[16];
// Q2_K: 16 groups of 16; scales[j] = scale (low nibble) | min (high nibble); 2-bit codes, element
// 128h + 32s + l in bits 2s of qs[32h + l]; x = d * sc * q - dmin * m.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
// Q3_K: 16 groups of 16 with 6-bit signed scales packed in 12 bytes; 2 low bits as in Q2_K and a high
// bit (element 32i + l: bit i of hmask[l]) whose absence subtracts 4; x = d * (sc - 32) * q.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
// Q4_K: 8 groups of 32 with 6-bit scales and minimums packed in 12 bytes; element 64c + l (l < 32)
// in the low nibble of qs[32c + l], 64c + 32 + l in the high; x = d * sc * q - dmin * m.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// Q5_K: Q4_K plus a fifth bit (element 32i + l: bit i of qh[l]).
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Q6_K: 16 groups of 16 with int8 scales; element 128h + 64n + l (l < 64) in nibble n of ql[64h + l],
// element 128h + 32s + l in bits 2s of qh[32h + l] (the high two bits); x = d * sc * (q - 32).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 &&
                  sizeof(BlockIQ4_NL) == 18,
              "32-element block sizes as in GGUF");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
                  sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210,
              "K-quant block sizes as in GGUF");

// Name of any GGML type id ("q4_K", "iq2_xs", ...); "type#N" for ids unknown to us.
const char* ggml_type_name(uint32_t type_id);
// Block layout of any GGML type id (also the ones we cannot compute with); false if unknown.
bool ggml_type_block(uint32_t type_id, uint32_t* block_elems, uint32_t* block_bytes);
// True for the types we compute with (kAllDTypes).
bool is_supported_dtype(uint32_t type_id);
// Throws Error("<context>: tensor type q4_K is not supported ...") for unsupported ids.
DType dtype_from_ggml(uint32_t type_id, const std::string& context);

const char* dtype_name(DType t);             // "f32", "f16", "bf16", "q8_0", "q4_0", ..., "q4_K" (ggml's names)
DType parse_dtype(const std::string& name);  // accepts the names above, case-insensitive
int64_t dtype_block_elems(DType t);          // 1 for float types, 32 or 256 for the quantised ones
int64_t dtype_block_bytes(DType t);          // bytes per block
bool dtype_is_quantized(DType t);

// Bytes of n elements; n must be a multiple of the block size (throws Error otherwise).
uint64_t dtype_row_bytes(DType t, int64_t n);
// Effective bits per weight (e.g. 4.5 for Q4_0).
double dtype_bits_per_elem(DType t);

// The KV cache element types the executors keep: f32, f16 and bf16 (rows rounded to nearest even as
// they are stored) and q8_0 (each KV head's row quantised as it is stored, in blocks of 32 as
// quantize_row does: ggml's quantize_row_q8_0_ref). kKvDtypeNames lists them for messages.
bool is_kv_dtype(DType t);
constexpr const char* kKvDtypeNames = "f32, f16, bf16 or q8_0";
// Throws Error unless a KV cache of t can hold rows of head_dim values: a block type's blocks must not
// straddle two heads (q8_0: head_dim a multiple of 32). `what` starts the message.
void check_kv_head_dim(DType t, int64_t head_dim, const char* what);

// IEEE half / bfloat16 conversions, round-to-nearest-even, as ggml does them.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

// Reference conversion of n elements to/from f32 (scalar; for tests, writers and slow paths).
// src/dst must be aligned for their element or block type (2 bytes for every block type).
// quantize_row follows ggml's reference quantisers (the ones llama-quantize uses without an importance
// matrix), so blocks are bit-identical to llama.cpp's, except IQ4_NL's (valid blocks of a simpler search).
// dequantize_row computes each value with the same f32 operations as ggml and gguf-py.
void quantize_row(DType t, const float* src, void* dst, int64_t n);
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Q4_K/Q5_K: the 6-bit scales sc[8] and minimums m[8] of the 8 groups packed into the block's 12 bytes.
void pack_scales_k4(const uint8_t* sc, const uint8_t* m, uint8_t* packed);

// One block of a quantised type (dtype_block_elems values), the reference code of the two above.
void quantize_block(DType t, const float* x, void* block);
void dequantize_block(DType t, const void* block, float* y);

}  // namespace shardwise

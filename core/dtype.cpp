// core/dtype.cpp — reference dtype conversions and GGML type table (see dtype.h).
#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace shardwise {
namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct GgmlTypeName {
  uint32_t id;
  const char* name;
  uint32_t block_elems;
  uint32_t block_bytes;
};
// All GGML type ids as of the GGUF v3 spec (ids 4, 5 and 31-33 are retired or unassigned).
const GgmlTypeName kGgmlTypes[] = {
    {0, "f32", 1, 4},         {1, "f16", 1, 2},         {2, "q4_0", 32, 18},      {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},      {8, "q8_0", 32, 34},      {9, "q8_1", 32, 36},
    {10, "q2_K", 256, 84},    {11, "q3_K", 256, 110},   {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},   {15, "q8_K", 256, 292},   {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},   {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},   {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},        {27, "i64", 1, 8},        {28, "f64", 1, 8},        {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},   {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},
};

}  // namespace

const char* ggml_type_name(uint32_t type_id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == type_id) return t.name;
  static thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "type#%u", type_id);
  return buf;
}

bool ggml_type_block(uint32_t type_id, uint32_t* block_elems, uint32_t* block_bytes) {
  for (const auto& t : kGgmlTypes) {
    if (t.id == type_id) {
      *block_elems = t.block_elems;
      *block_bytes = t.block_bytes;
      return true;
    }
  }
  return false;
}

bool is_supported_dtype(uint32_t id) {
  for (DType t : kAllDTypes)
    if (static_cast<uint32_t>(t) == id) return true;
  return false;
}

namespace {
std::string supported_list() {
  std::string s;
  for (DType t : kAllDTypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(t));
  return s;
}
}  // namespace

DType dtype_from_ggml(uint32_t id, const std::string& context) {
  if (!is_supported_dtype(id))
    fail(context, ": tensor type ", ggml_type_name(id), " is not supported (supported: ", supported_list(),
         "; requantise the model, e.g. llama-quantize --allow-requantize IN OUT Q4_K_M)");
  return static_cast<DType>(id);
}

const char* dtype_name(DType t) {
  return ggml_type_name(static_cast<uint32_t>(t));
}

DType parse_dtype(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "float32") return DType::F32;
  if (n == "float16") return DType::F16;
  if (n == "bfloat16") return DType::BF16;
  for (DType t : kAllDTypes) {
    std::string tn = dtype_name(t);
    std::transform(tn.begin(), tn.end(), tn.begin(), [](unsigned char c) { return std::tolower(c); });
    if (n == tn) return t;
  }
  fail("unknown dtype '", name, "' (use ", supported_list(), ")");
}

int64_t dtype_block_elems(DType t) {
  uint32_t elems = 0, bytes = 0;
  ggml_type_block(static_cast<uint32_t>(t), &elems, &bytes);
  return elems;
}

int64_t dtype_block_bytes(DType t) {
  uint32_t elems = 0, bytes = 0;
  ggml_type_block(static_cast<uint32_t>(t), &elems, &bytes);
  return bytes;
}

bool dtype_is_quantized(DType t) {
  return dtype_block_elems(t) > 1;
}

bool is_kv_dtype(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0;
}

void check_kv_head_dim(DType t, int64_t head_dim, const char* what) {
  const int64_t be = dtype_block_elems(t);
  if (head_dim % be != 0)
    fail(what, ": a ", dtype_name(t), " KV cache needs a head_dim that is a multiple of ", be, " (each head's row is ",
         "quantised in blocks of ", be, "), and this model's head_dim is ", head_dim,
         " (f32, f16 and bf16 caches take any)");
}

uint64_t dtype_row_bytes(DType t, int64_t n) {
  int64_t be = dtype_block_elems(t);
  if (n < 0 || n % be != 0)
    fail("a row of ", n, " ", dtype_name(t), " elements is not a whole number of ", be, "-element blocks");
  return static_cast<uint64_t>(n / be) * static_cast<uint64_t>(dtype_block_bytes(t));
}

double dtype_bits_per_elem(DType t) {
  return 8.0 * static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_elems(t));
}

// Half conversion after Maratyszcza's FP16 library (the algorithm ggml uses without F16C; F16C's
// vcvtps2ph with round-to-nearest-even gives identical bits).
float f16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = bits_f32(0x7800000u);  // 2^-112
  const float normalized = bits_f32((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = bits_f32((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denormalized_cutoff ? f32_bits(denormalized) : f32_bits(normalized));
  return bits_f32(result);
}

uint16_t f32_to_f16(float f) {
  const float scale_to_inf = bits_f32(0x77800000u);   // 2^112
  const float scale_to_zero = bits_f32(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  dtype_row_bytes(t, n);  // validates block multiple
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    default: {
      const int64_t be = dtype_block_elems(t), bb = dtype_block_bytes(t);
      for (int64_t b = 0; b < n / be; ++b) quantize_block(t, src + b * be, static_cast<uint8_t*>(dst) + b * bb);
    }
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  dtype_row_bytes(t, n);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    default: {
      const int64_t be = dtype_block_elems(t), bb = dtype_block_bytes(t);
      for (int64_t b = 0; b < n / be; ++b) dequantize_block(t, static_cast<const uint8_t*>(src) + b * bb, dst + b * be);
    }
  }
}

}  // namespace shardwise

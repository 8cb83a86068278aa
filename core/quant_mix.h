// core/quant_mix.h — llama-quantize's type mixes ("ftypes" such as Q4_K_M): which GGML type each tensor of
// a model gets when a file is written at that mix, so that `synth` writes the files users download and
// the benchmarks run (`synth --dtype q4_k_m`). The rules are llama.cpp b6097's llama_tensor_get_type for
// the tensors our families have, without an importance matrix:
//   - the output matrix (or the tied token embedding) is q6_K, or q8_0 for the Q8_0 mix and rows that are
//     not whole 256-blocks;
//   - attn_v and ffn_down get more bits in some layers (Q2_K, Q3_K_M/L, Q4_K_S/M, Q5_K_M), attn_output in
//     some mixes; 8-expert MoE models keep attn_k and attn_v at q8_0;
//   - a row that a K-quant block does not divide takes llama.cpp's fallback (q4_K -> q5_0, q5_K -> q5_1,
//     q6_K -> q8_0; q2_K/q3_K -> iq4_nl), then f16.
// The pure form (`--pure`, like llama-quantize's) gives every matrix the mix's base type, with the same
// fallbacks.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace shardwise {

enum class QuantMix : uint8_t {
  Pure,  // every matrix the one type (ModelSpec::dtype)
  Q2_K,
  Q3_K_S,
  Q3_K_M,
  Q3_K_L,
  Q4_K_S,
  Q4_K_M,
  Q5_K_S,
  Q5_K_M,
  Q6_K,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
};

// "q4_K_M", ... ("pure" for Pure).
const char* quant_mix_name(QuantMix m);
// A mix's name (case-insensitive: q4_k_m, Q4_K_M); false for anything else. *base gets the mix's main type.
bool parse_quant_mix(const std::string& name, QuantMix* mix, DType* base);
// The mix's names, for help texts and errors.
std::string quant_mix_names();
// llama.cpp's general.file_type of a file written at the mix (llama_ftype).
uint32_t quant_mix_file_type(QuantMix m, DType base);

struct ModelSpec;
enum class TensorKind : int;

// The type of a matrix (kind, layer, row-major shape) of `spec` at the mix; vectors and the MoE router
// stay f32. `base` is the pure type (ModelSpec::dtype).
DType mix_tensor_dtype(const ModelSpec& spec, QuantMix mix, DType base, TensorKind kind, int layer, const Shape& shape);

}  // namespace shardwise

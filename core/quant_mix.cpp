// core/quant_mix.cpp — llama-quantize's type mixes (quant_mix.h).
#include "core/quant_mix.h"

#include <algorithm>
#include <cctype>

#include "core/model_spec.h"

namespace shardwise {
namespace {

struct MixInfo {
  QuantMix mix;
  const char* name;
  DType base;
  uint32_t file_type;  // llama_ftype
};
const MixInfo kMixes[] = {
    {QuantMix::Q2_K, "q2_K", DType::Q2_K, 10},     {QuantMix::Q3_K_S, "q3_K_S", DType::Q3_K, 11},
    {QuantMix::Q3_K_M, "q3_K_M", DType::Q3_K, 12}, {QuantMix::Q3_K_L, "q3_K_L", DType::Q3_K, 13},
    {QuantMix::Q4_K_S, "q4_K_S", DType::Q4_K, 14}, {QuantMix::Q4_K_M, "q4_K_M", DType::Q4_K, 15},
    {QuantMix::Q5_K_S, "q5_K_S", DType::Q5_K, 16}, {QuantMix::Q5_K_M, "q5_K_M", DType::Q5_K, 17},
    {QuantMix::Q6_K, "q6_K", DType::Q6_K, 18},     {QuantMix::Q4_0, "q4_0", DType::Q4_0, 2},
    {QuantMix::Q4_1, "q4_1", DType::Q4_1, 3},      {QuantMix::Q5_0, "q5_0", DType::Q5_0, 8},
    {QuantMix::Q5_1, "q5_1", DType::Q5_1, 9},      {QuantMix::Q8_0, "q8_0", DType::Q8_0, 7},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// llama.cpp's "more bits" layers of attn_v / ffn_down: the first and last eighth and every third between.
bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool one_of(QuantMix m, std::initializer_list<QuantMix> set) {
  return std::find(set.begin(), set.end(), m) != set.end();
}

// The type llama.cpp gives a matrix before its row-size fallback.
DType mix_rule(const ModelSpec& s, QuantMix m, DType base, TensorKind kind, int layer) {
  const int n = static_cast<int>(s.num_hidden_layers);
  const bool eight_experts = s.is_moe() && s.num_experts == 8;
  const int64_t n_gqa = s.num_key_value_heads > 0 ? s.num_attention_heads / s.num_key_value_heads : 1;
  const bool is_output = kind == TensorKind::Output || (kind == TensorKind::TokenEmbd && s.tie_word_embeddings);
  if (is_output) return base == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K;
  switch (kind) {
    case TensorKind::AttnV: {
      DType t = base;
      if (m == QuantMix::Q2_K) t = n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
      if (m == QuantMix::Q3_K_M) t = layer < 2 ? DType::Q5_K : DType::Q4_K;
      if (m == QuantMix::Q3_K_L) t = DType::Q5_K;
      if (one_of(m, {QuantMix::Q4_K_M, QuantMix::Q5_K_M}) && use_more_bits(layer, n)) t = DType::Q6_K;
      if (m == QuantMix::Q4_K_S && layer < 4) t = DType::Q5_K;
      return eight_experts ? DType::Q8_0 : t;
    }
    case TensorKind::AttnK:
      return eight_experts ? DType::Q8_0 : base;
    case TensorKind::FfnDown:
    case TensorKind::MoeDown:
      if (m == QuantMix::Q2_K) return DType::Q3_K;
      if (m == QuantMix::Q3_K_M) return layer < n / 16 ? DType::Q5_K : DType::Q4_K;
      if (m == QuantMix::Q3_K_L) return DType::Q5_K;
      if (one_of(m, {QuantMix::Q4_K_M, QuantMix::Q5_K_M}) && use_more_bits(layer, n)) return DType::Q6_K;
      if (m == QuantMix::Q4_K_S && layer < n / 8) return DType::Q5_K;
      return base;
    case TensorKind::AttnOut:
      if (eight_experts)
        return one_of(m, {QuantMix::Q2_K, QuantMix::Q3_K_S, QuantMix::Q3_K_M, QuantMix::Q4_K_S, QuantMix::Q4_K_M})
                   ? DType::Q5_K
                   : base;
      if (m == QuantMix::Q2_K) return DType::Q3_K;
      if (m == QuantMix::Q3_K_M) return DType::Q4_K;
      if (m == QuantMix::Q3_K_L) return DType::Q5_K;
      return base;
    default:
      return base;
  }
}

}  // namespace

const char* quant_mix_name(QuantMix m) {
  for (const auto& x : kMixes)
    if (x.mix == m) return x.name;
  return "pure";
}

bool parse_quant_mix(const std::string& name, QuantMix* mix, DType* base) {
  for (const auto& x : kMixes) {
    if (lower(name) == lower(x.name)) {
      *mix = x.mix;
      *base = x.base;
      return true;
    }
  }
  return false;
}

std::string quant_mix_names() {
  std::string s;
  for (const auto& x : kMixes) s += (s.empty() ? "" : ", ") + std::string(x.name);
  return s;
}

uint32_t quant_mix_file_type(QuantMix m, DType base) {
  for (const auto& x : kMixes)
    if (x.mix == m) return x.file_type;
  switch (base) {  // pure files: the K-quants as their "_S" mixes
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 32;
    case DType::IQ4_NL:
      return 25;
    default:
      for (const auto& x : kMixes)
        if (x.base == base) return x.file_type;
      return 0;
  }
}

DType mix_tensor_dtype(const ModelSpec& spec, QuantMix mix, DType base, TensorKind kind, int layer,
                       const Shape& shape) {
  if (shape.size() <= 1 || kind == TensorKind::MoeRouter) return DType::F32;
  DType t = mix == QuantMix::Pure ? base : mix_rule(spec, mix, base, kind, layer);
  const int64_t cols = shape.back();
  if (!dtype_is_quantized(t) || cols % dtype_block_elems(t) == 0) return t;
  switch (t) {  // llama.cpp's fallback for rows a K-quant block does not divide
    case DType::Q4_K:
      t = DType::Q5_0;
      break;
    case DType::Q5_K:
      t = DType::Q5_1;
      break;
    case DType::Q6_K:
      t = DType::Q8_0;
      break;
    case DType::Q2_K:
    case DType::Q3_K:
      t = DType::IQ4_NL;
      break;
    default:
      break;
  }
  return cols % dtype_block_elems(t) == 0 ? t : DType::F16;
}

}  // namespace shardwise

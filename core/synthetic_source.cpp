// core/synthetic_source.cpp — seeded random weights for any spec and dtype, materialised in memory
// with the thread pool. Values depend only on (seed, tensor name, element index), never on the
// thread count. Quantised tensors are generated as random blocks directly (random scale and
// codes), which is how a real quantised model looks to a kernel, and ~10x faster than quantising.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/host_buffer.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "core/weight_source.h"

namespace shardwise {
namespace {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Uniform in [-1, 1) from 32 random bits.
inline float unit(uint32_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits)) * (1.0f / 2147483648.0f);
}

struct TensorRecipe {
  float center;  // values are center + amplitude * U[-1, 1)
  float amplitude;
};

// Attention with random q and k is nearly uniform over the prefix (a trained head attends to a few
// tokens), so its output is almost the same for neighbouring tokens. Written back at full spread, layer
// after layer, it becomes a component of the hidden state that consecutive tokens share, and a deep MoE
// model then routes neighbours to the same experts (at full spread, a 48-layer model's windows of 16
// tokens reach under half the distinct experts of a load-balanced router). Two changes keep every layer's routing
// within a few percent of uniform up to 94 layers (tests/unit/executor/test_forward.cpp): scores four
// times sharper (q and k, or their norms, at twice the scale), as a trained head's are, and the output
// projection at a quarter of the other matrices' spread.
constexpr float kQkScale = 2.0f;
constexpr float kAttnOutScale = 0.25f;

TensorRecipe recipe_for(const TensorDesc& d) {
  // Keeps activations O(1) through the layers: std = 1/sqrt(3*fan_in).
  const float matrix = 1.0f / std::sqrt(static_cast<float>(d.shape.back()));
  switch (d.kind) {
    case TensorKind::AttnNorm:
    case TensorKind::FfnNorm:
    case TensorKind::OutputNorm:
      return {1.0f, 0.1f};
    case TensorKind::AttnQNorm:
    case TensorKind::AttnKNorm:
      return {kQkScale, 0.1f * kQkScale};
    case TensorKind::AttnQ:
    case TensorKind::AttnK:
      return {0.0f, kQkScale * matrix};
    case TensorKind::AttnOut:
      return {0.0f, kAttnOutScale * matrix};
    case TensorKind::AttnQBias:
    case TensorKind::AttnKBias:
    case TensorKind::AttnVBias:
      return {0.0f, 0.5f};  // trained qwen2 biases are O(1), k's often larger
    case TensorKind::TokenEmbd:
      return {0.0f, 1.0f};
    default:
      return {0.0f, matrix};
  }
}

// Element e of a tensor: half of the hash of pair e/2, so any split of a tensor gives the same values.
float element_value(int64_t e, uint64_t key, TensorRecipe r) {
  const uint64_t h = splitmix64(key ^ static_cast<uint64_t>(e >> 1));
  return r.center + r.amplitude * unit(static_cast<uint32_t>((e & 1) ? (h >> 32) : h));
}

// Fills elements [e0, e1) of a float-type tensor (in units of elements).
void fill_float(DType dt, uint8_t* out, int64_t e0, int64_t e1, uint64_t key, TensorRecipe r) {
  for (int64_t e = e0; e < e1; ++e) {
    const float v = element_value(e, key, r);
    switch (dt) {
      case DType::F32:
        reinterpret_cast<float*>(out)[e] = v;
        break;
      case DType::F16:
#if defined(__F16C__)
        reinterpret_cast<uint16_t*>(out)[e] = _cvtss_sh(v, 0);
#else
        reinterpret_cast<uint16_t*>(out)[e] = f32_to_f16(v);
#endif
        break;
      case DType::BF16:
        reinterpret_cast<uint16_t*>(out)[e] = f32_to_bf16(v);
        break;
      default:
        break;
    }
  }
}

// Q4_0 codes are nibbles c with the value c - 8, so uniform random nibbles have the mean -0.5 (of a
// spread of 4.6). A matrix whose values share a mean sums any common component of its input coherently
// (n * mean against sqrt(n) * spread), and layer after layer every token's hidden state turns towards
// one direction: the router then sends all tokens to the same few experts. Nibble 0 becomes 8 (the
// value 0): values -7..7, symmetric, mean 0.
inline uint64_t zero_mean_nibbles(uint64_t q) {
  const uint64_t any = (q | (q >> 1) | (q >> 2) | (q >> 3)) & 0x1111111111111111ull;
  return q | ((~any & 0x1111111111111111ull) << 3);
}

// One K-quant super-block of random codes and group scales whose values have the largest magnitude
// `amplitude` and mean 0 (a direct fill: the reference quantiser's searches would take most of an
// hour for the largest models). Asymmetric types (q2_K, q4_K, q5_K: value = d*sc*q - dmin*m) take
// m = sc/2 and dmin = (codes - 1) * d, which centres every group on 0; symmetric ones (q3_K, q6_K, whose
// codes reach one step further below 0 than above) take scales of random sign, so groups cancel.
void fill_kquant(DType dt, uint8_t* blk, uint64_t h, float amplitude) {
  const int64_t bb = dtype_block_bytes(dt);
  for (int64_t i = 0; i < bb; i += 8) {  // random codes everywhere; scales written over them below
    const uint64_t v = splitmix64(h + static_cast<uint64_t>(i));
    std::memcpy(blk + i, &v, static_cast<size_t>(std::min<int64_t>(8, bb - i)));
  }
  const uint64_t g = splitmix64(h ^ 0x9E3779B97F4A7C15ull);  // the group scales' bits
  const uint64_t sign = splitmix64(g);                       // and their signs
  auto sc_at = [&](int k, int lo, int span) { return lo + static_cast<int>((g >> (4 * (k % 16))) & 15) * span / 16; };
  auto put_half = [&](int64_t at, float v) {
    const uint16_t x = f32_to_f16(v);
    std::memcpy(blk + at, &x, 2);
  };
  switch (dt) {
    case DType::Q2_K: {  // codes 0..3, sc 2..14 (even), m = sc / 2, dmin = 3 d
      const float d = amplitude / (1.5f * 8.0f);
      for (int k = 0; k < 16; ++k) {
        const int sc = 2 * sc_at(k, 1, 7);
        blk[k] = static_cast<uint8_t>(sc | ((sc / 2) << 4));
      }
      put_half(80, d);
      put_half(82, 3.0f * d);
      return;
    }
    case DType::Q3_K: {  // codes -4..3, signed 6-bit scales of magnitude 8..30
      std::memset(blk + 96, 0, 12);
      for (int k = 0; k < 16; ++k) {
        const int mag = sc_at(k, 8, 24), l = ((sign >> k) & 1 ? mag : -mag) + 32;
        if (k < 8)
          blk[96 + k] = static_cast<uint8_t>(l & 0x0F);
        else
          blk[96 + k - 8] |= static_cast<uint8_t>((l & 0x0F) << 4);
        blk[96 + 8 + k % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (k / 4)));
      }
      put_half(108, amplitude / (4.0f * 20.0f));
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {  // codes 0..15 (0..31), sc 32..62 (even), m = sc / 2, dmin = 15 d (31 d)
      const float top = dt == DType::Q4_K ? 15.0f : 31.0f;
      uint8_t sc[8], m[8];
      for (int k = 0; k < 8; ++k) {
        sc[k] = static_cast<uint8_t>(2 * sc_at(k, 16, 16));
        m[k] = static_cast<uint8_t>(sc[k] / 2);
      }
      pack_scales_k4(sc, m, blk + 4);
      const float d = amplitude / (0.5f * top * 47.0f);
      put_half(0, d);
      put_half(2, top * d);
      return;
    }
    default: {  // Q6_K: codes -32..31, int8 scales of magnitude 32..122 and random sign
      for (int k = 0; k < 16; ++k) {
        const int mag = sc_at(k, 32, 96);
        blk[192 + k] = static_cast<uint8_t>(static_cast<int8_t>((sign >> k) & 1 ? mag : -mag));
      }
      put_half(208, amplitude / (32.0f * 80.0f));
      return;
    }
  }
}

// Fills blocks [b0, b1) of a quantised tensor with random codes and scales such that the values
// have the recipe's spread and mean 0, like the symmetric weights of a trained layer. Zero-mean
// values keep the hidden states of different tokens apart, so a model's router spreads them over
// its experts as a trained, load-balanced router does.
void fill_quant(DType dt, uint8_t* out, int64_t b0, int64_t b1, uint64_t key, TensorRecipe r, bool balanced) {
  if (dtype_block_elems(dt) == kQK_K) {
    for (int64_t b = b0; b < b1; ++b)
      fill_kquant(dt, out + b * dtype_block_bytes(dt), splitmix64(key ^ (static_cast<uint64_t>(b) * 0x100000001B3ull)),
                  r.amplitude);
    return;
  }
  if (dt != DType::Q8_0 && dt != DType::Q4_0) {
    // The other 32-element types: the float tensor's (symmetric, zero-mean) values through the
    // reference quantiser, block by block (their quantisers are cheap).
    const int64_t be = dtype_block_elems(dt), bb = dtype_block_bytes(dt);
    float x[kQK_K];
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t j = 0; j < be; ++j) x[j] = element_value(b * be + j, key, r);
      quantize_block(dt, x, out + b * bb);
    }
    return;
  }
  for (int64_t b = b0; b < b1; ++b) {
    uint64_t h = splitmix64(key ^ (static_cast<uint64_t>(b) * 0x100000001B3ull));
    const float jitter = 0.75f + 0.25f * unit(static_cast<uint32_t>(h >> 32));
    if (dt == DType::Q8_0) {
      auto* blk = reinterpret_cast<BlockQ8_0*>(out) + b;
      blk->d = f32_to_f16(r.amplitude * jitter / 127.0f);
      for (int j = 0; j < kQK8_0; j += 8) {
        uint64_t q = splitmix64(h + static_cast<uint64_t>(j));
        for (int k = 0; k < 8; ++k) {
          const int v = static_cast<int>(static_cast<uint8_t>(q >> (8 * k))) - 128;
          // Balanced: -127..127, symmetric, mean 0. Concentrated: -128 read as -127, mean -0.5.
          blk->qs[j + k] = static_cast<int8_t>(v == -128 ? (balanced ? 0 : -127) : v);
        }
      }
    } else {
      auto* blk = reinterpret_cast<BlockQ4_0*>(out) + b;
      blk->d = f32_to_f16(r.amplitude * jitter / 8.0f);
      uint64_t q0 = splitmix64(h + 1), q1 = splitmix64(h + 2);
      if (balanced) {
        q0 = zero_mean_nibbles(q0);
        q1 = zero_mean_nibbles(q1);
      }
      std::memcpy(blk->qs, &q0, 8);
      std::memcpy(blk->qs + 8, &q1, 8);
    }
  }
}

}  // namespace

std::map<std::string, uint64_t> synthetic_tensor_offsets(const ModelSpec& spec) {
  std::map<std::string, uint64_t> at;
  uint64_t offset = 0;
  for (const auto& d : spec.tensors()) {
    at[d.name] = offset;
    offset += (d.bytes + 63) / 64 * 64;  // each tensor 64-byte aligned
  }
  return at;
}

namespace {

class SyntheticWeights : public WeightSource {
 public:
  SyntheticWeights(const ModelSpec& spec, uint64_t seed, ThreadPool* pool, bool show_progress,
                   SyntheticRouting routing) {
    spec_ = spec;
    spec_.validate("synthetic:" + spec.name);
    rope_style_ = RopeStyle::Neox;
    // Text tokenises as in the GGUF file `synth` writes of these weights (and as llama.cpp reads it).
    tokenizer_ = synthetic_vocabulary(spec);
    origin_ = "synthetic:" + spec.name +
              (spec.mix == QuantMix::Pure ? std::string("?dtype=") + dtype_name(spec.dtype)
                                          : std::string("?mix=") + quant_mix_name(spec.mix)) +
              "&seed=" + std::to_string(seed);
    if (routing != SyntheticRouting::Balanced) origin_ += std::string("&routing=") + synthetic_routing_name(routing);
    const bool balanced = routing == SyntheticRouting::Balanced;
    const std::vector<TensorDesc> descs = spec_.tensors();
    const std::map<std::string, uint64_t> at = synthetic_tensor_offsets(spec_);
    uint64_t total = 0;
    for (const auto& d : descs) total += d.bytes;
    storage_ = HostBuffer(total + 64 * descs.size());
    ThreadPool local(1);
    ThreadPool& tp = pool ? *pool : local;
    Progress progress("synthesise " + spec.name, total, show_progress);
    for (const auto& d : descs) {
      uint8_t* out = storage_.data() + at.at(d.name);
      const uint64_t key = splitmix64(seed ^ hash_name(d.name));
      const TensorRecipe r = recipe_for(d);
      const bool quant = dtype_is_quantized(d.dtype);
      const int64_t units = quant ? shape_elems(d.shape) / dtype_block_elems(d.dtype) : shape_elems(d.shape);
      const int64_t grain = 1 << 16;
      const double bytes_per_unit = static_cast<double>(d.bytes) / static_cast<double>(units);
      tp.parallel_for(units, grain, [&](int64_t u0, int64_t u1, int) {
        if (quant)
          fill_quant(d.dtype, out, u0, u1, key, r, balanced);
        else
          fill_float(d.dtype, out, u0, u1, key, r);
        progress.add(static_cast<uint64_t>(bytes_per_unit * static_cast<double>(u1 - u0)));
      });
      TensorView v;
      v.dtype = d.dtype;
      v.shape = d.shape;
      v.data = out;
      v.nbytes = d.bytes;
      tensors_[d.name] = v;
    }
    progress.finish();
    check_complete(origin_);
  }

 private:
  HostBuffer storage_;
};

}  // namespace

std::unique_ptr<WeightSource> make_synthetic_weights(const ModelSpec& spec, uint64_t seed, ThreadPool* pool,
                                                     bool show_progress, SyntheticRouting routing) {
  return std::make_unique<SyntheticWeights>(spec, seed, pool, show_progress, routing);
}

const char* synthetic_routing_name(SyntheticRouting r) {
  return r == SyntheticRouting::Concentrated ? "concentrated" : "balanced";
}

SyntheticRouting parse_synthetic_routing(const std::string& name) {
  if (name == "balanced") return SyntheticRouting::Balanced;
  if (name == "concentrated") return SyntheticRouting::Concentrated;
  fail("routing '", name, "' is not balanced or concentrated");
}

namespace {
// A whole decimal number from lo to hi, else an Error naming the option.
uint64_t checked_number(const std::string& ctx, const std::string& key, const std::string& value, uint64_t lo,
                        uint64_t hi) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE || *end != '\0' ||
      v < lo || v > hi)
    fail(ctx, ": ", key, " '", value, "' must be a whole number from ", lo, " to ", hi);
  return v;
}
}  // namespace

SyntheticModel parse_synthetic(const std::string& text) {
  const std::string ctx = "synthetic:" + text;
  std::string name = text, query;
  auto q = text.find('?');
  if (q != std::string::npos) {
    name = text.substr(0, q);
    query = text.substr(q + 1);
  }
  if (name.empty()) fail(ctx, ": missing spec name (e.g. synthetic:qwen30b?dtype=q4_0&seed=1)");
  SyntheticModel m{resolve_spec(name), 1};
  ModelSpec& spec = m.spec;
  size_t pos = 0;
  while (pos < query.size()) {
    size_t amp = query.find('&', pos);
    std::string kv = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    pos = amp == std::string::npos ? query.size() : amp + 1;
    auto eq = kv.find('=');
    if (eq == std::string::npos) fail(ctx, ": option '", kv, "' must be key=value");
    std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "dtype") {
      try {
        spec.dtype = parse_dtype(value);
      } catch (const Error& e) {
        fail(ctx, ": option dtype: ", e.what());
      }
    } else if (key == "mix") {
      if (!parse_quant_mix(value, &spec.mix, &spec.dtype))
        fail(ctx, ": option mix: unknown mix '", value, "' (known: ", quant_mix_names(), ")");
    } else if (key == "seed") {
      m.seed = checked_number(ctx, key, value, 0, UINT64_MAX);
    } else if (key == "layers") {
      spec.num_hidden_layers =
          static_cast<int64_t>(checked_number(ctx, key, value, 1, static_cast<uint64_t>(kMaxLayers)));
    } else if (key == "routing") {
      try {
        m.routing = parse_synthetic_routing(value);
      } catch (const Error& e) {
        fail(ctx, ": option routing: ", e.what());
      }
    } else {
      fail(ctx, ": unknown option '", key, "' (known: dtype, mix, seed, layers, routing)");
    }
  }
  spec.validate(ctx);
  return m;
}

std::unique_ptr<WeightSource> open_synthetic_weights(const std::string& text, const OpenOptions& options) {
  const SyntheticModel m = parse_synthetic(text);
  ThreadPool pool(options.threads);
  return make_synthetic_weights(m.spec, m.seed, &pool, false, m.routing);
}

}  // namespace shardwise

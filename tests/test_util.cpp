// tests/test_util.cpp — shared test helpers.
#include "test_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardwise::test {
namespace {
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/shardwise-test-XXXXXX";
    char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path + "'";
    if (std::system(cmd.c_str()) != 0) {
    }
  }
};
}  // namespace

std::string fixtures_dir() {
  const char* e = std::getenv("SHARDWISE_FIXTURES");
  if (e && *e) return e;
#ifdef SHARDWISE_DEFAULT_FIXTURES
  return SHARDWISE_DEFAULT_FIXTURES;
#else
  return "tests/fixtures";
#endif
}

std::string shardwise_bin() {
  const char* e = std::getenv("SHARDWISE_BIN");
  if (e && *e) return e;
#ifdef SHARDWISE_DEFAULT_BIN
  return SHARDWISE_DEFAULT_BIN;
#else
  throw std::runtime_error("SHARDWISE_BIN is not set (the test needs the shardwise binary)");
#endif
}

std::string temp_dir() {
  static TempDir dir;
  return dir.path;
}

std::string temp_path(const std::string& name) {
  return temp_dir() + "/" + name;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

int run_command(const std::string& command, std::string* output) {
  std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace shardwise::test

#include <algorithm>
#include <cmath>

#include "core/npy.h"
#include "core/thread_pool.h"
#include "executor/model/cpu_model.h"
#include "executor/session/kv_cache.h"

namespace shardwise::test {

std::vector<float> fast_logits(const WeightSource& source, const std::vector<int32_t>& tokens, int threads,
                               DType kv_dtype) {
  ThreadPool pool(threads);
  ModelWeights w = ModelWeights::from_source(source);
  CpuModel model(w, pool);
  KvCache kv(source.spec(), static_cast<int64_t>(tokens.size()), kv_dtype);
  std::vector<float> logits(tokens.size() * static_cast<size_t>(source.spec().vocab_size));
  model.forward(tokens.data(), static_cast<int64_t>(tokens.size()), kv, logits.data(), true);
  return logits;
}

double max_rel_error(const std::vector<float>& a, const std::vector<float>& ref, int64_t width) {
  if (a.size() != ref.size()) return INFINITY;
  double worst = 0;
  for (size_t r = 0; r < ref.size() / static_cast<size_t>(width); ++r) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < width; ++i) {
      const size_t k = r * static_cast<size_t>(width) + static_cast<size_t>(i);
      if (std::isnan(a[k])) return INFINITY;
      d = std::max(d, std::fabs(static_cast<double>(a[k]) - ref[k]));
      m = std::max(m, std::fabs(static_cast<double>(ref[k])));
    }
    worst = std::max(worst, d / m);
  }
  return worst;
}

std::vector<float> load_npy_floats(const std::string& path) {
  NpyArray a = read_npy(path);
  return std::vector<float>(a.values.begin(), a.values.end());
}

std::vector<int32_t> load_npy_ints(const std::string& path) {
  NpyArray a = read_npy(path);
  std::vector<int32_t> v;
  for (double x : a.values) v.push_back(static_cast<int32_t>(x));
  return v;
}

const std::vector<std::pair<std::string, std::string>>& qwen2_hf_layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  return names;
}

std::vector<uint8_t> kv_cache_of(DType kv_dtype, std::vector<float>& values, int64_t row_elems, int64_t first_unread) {
  const int64_t n = static_cast<int64_t>(values.size()), rows = n / row_elems;
  const uint64_t row_bytes = dtype_row_bytes(kv_dtype, row_elems);
  for (int64_t i = first_unread * row_elems; i < n; ++i) values[static_cast<size_t>(i)] = NAN;
  std::vector<uint8_t> bits(static_cast<size_t>(rows) * row_bytes);
  if (kv_dtype == DType::Q8_0) {  // the read rows quantised; the others' blocks of NaN scale
    quantize_row(kv_dtype, values.data(), bits.data(), first_unread * row_elems);
    auto* blocks = reinterpret_cast<BlockQ8_0*>(bits.data());
    for (int64_t b = first_unread * row_elems / kQK8_0; b < n / kQK8_0; ++b) blocks[b] = BlockQ8_0{0x7e00, {}};
  } else {
    quantize_row(kv_dtype, values.data(), bits.data(), n);  // (f32, f16 and bf16 keep NaN)
  }
  dequantize_row(kv_dtype, bits.data(), values.data(), n);
  return bits;
}

}  // namespace shardwise::test

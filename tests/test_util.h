// tests/test_util.h — helpers shared by the unit tests: fixture paths, temp files, random data.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::test {

// Folder of committed fixtures (tests/fixtures), from $SHARDWISE_FIXTURES.
std::string fixtures_dir();
// The `shardwise` binary under test, from $SHARDWISE_BIN or the build.
std::string shardwise_bin();
// A fresh temporary directory for this test process (removed at exit).
std::string temp_dir();
std::string temp_path(const std::string& name);
// Random floats in [lo, hi) from a seeded generator.
std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);
// Writes bytes to a file.
void write_file(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int run_command(const std::string& command, std::string* output);

}  // namespace shardwise::test

#include "core/weight_source.h"

namespace shardwise::test {

// Logits [tokens, vocab] of the CPU fast path (one prefill step) with `threads` threads, over a KV cache
// of kv_dtype.
std::vector<float> fast_logits(const WeightSource& source, const std::vector<int32_t>& tokens, int threads = 2,
                               DType kv_dtype = DType::F32);
// max over rows of max|a-b| / max|ref| (the error metric), rows of `width`.
double max_rel_error(const std::vector<float>& a, const std::vector<float>& ref, int64_t width);
// Reads an .npy fixture as floats / ints.
std::vector<float> load_npy_floats(const std::string& path);
std::vector<int32_t> load_npy_ints(const std::string& path);
// A qwen2 layer's tensors: (transformers' name under model.layers.N., our name under blk.N.).
const std::vector<std::pair<std::string, std::string>>& qwen2_hf_layer_names();
// The bytes of a KV cache of kv_dtype holding `values` (rows of row_elems values; quantize_row's
// encoding), rows from first_unread on NaN (rows no result may read: a q8_0 block's scale is made NaN).
// `values` becomes what the cache holds, read back in f32 (the values attention must see).
std::vector<uint8_t> kv_cache_of(DType kv_dtype, std::vector<float>& values, int64_t row_elems, int64_t first_unread);

}  // namespace shardwise::test

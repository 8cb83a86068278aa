// tests/vl_test_util.h — what the vision-language tests share: the tiny Qwen2.5-VL models' special token
// ids (the HF fixture tests/fixtures/vl/qwen2_5_vl and the synthetic directories of test_vl_prompt use
// the same), a tokenizer for them, the fixture's language model as a GGUF (vision/mmproj.h writes its
// tower as an mmproj GGUF beside it), and a GGUF file's tensor left out for error tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/weight_source.h"
#include "vision/encoder.h"

namespace shardwise::test {

constexpr int32_t kVlImStart = 280, kVlImEnd = 281, kVlVisionStart = 290, kVlVisionEnd = 291, kVlImage = 292;

// A byte-level BPE tokenizer.json in `dir` for the tiny models' vocabulary of 300: byte b is token b,
// ChatML's and the vision tokens at the ids above, no merges (every byte of text is its own token).
void write_vl_tokenizer(const std::string& dir);

// The HF fixture's directory copied to a fresh temporary directory with write_vl_tokenizer's tokenizer
// (the fixture has none): a model `run --prompt` and `serve` can read text for.
std::string vl_fixture_with_tokenizer(const std::string& name);

// The ids of a Qwen2.5-VL model's image placeholder and the markers around it.
struct VlTokenIds {
  int32_t image, vision_start, vision_end;
};

// An HF Qwen2.5-VL directory in `dir` (which must exist) in transformers 5's layout: config.json and an
// f32 model.safetensors holding `lm`'s weights (an f32 qwen2 source) as the language model with the
// M-RoPE sections `mrope`, and the tower `vs` with the weights `vw`. No tokenizer, no
// preprocessor_config.json: a test writes those it needs.
void write_vl_hf_dir(const std::string& dir, const WeightSource& lm, const std::vector<int64_t>& mrope,
                     const VisionSpec& vs, const VisionWeights& vw, VlTokenIds ids);

// Rewrites the GGUF file at `path` without its tensor `name` (a file that lacks it, for error tests).
void drop_gguf_tensor(const std::string& path, const std::string& name);

// The HF fixture's language model as a qwen2vl GGUF at `path` with write_vl_tokenizer's vocabulary
// (byte-level BPE, the ChatML and vision tokens at their ids): a language model `run --mmproj` and
// `serve --mmproj` can read text and find the image placeholders for.
void write_vl_language_gguf(const std::string& path);

}  // namespace shardwise::test

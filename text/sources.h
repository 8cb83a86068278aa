// text/sources.h — building a Pipeline from what a model file carries: a GGUF
// vocabulary (tokenizer.ggml.*, read the way llama.cpp reads it) or an HF tokenizer.json (read the
// way HF `tokenizers` reads it). Unsupported kinds are one-line errors naming the file and the kind.
#pragma once

#include <string>
#include <vector>

#include "core/weight_source.h"
#include "text/pipeline.h"

namespace shardwise::tok {

// tokenizer.ggml.model "gpt2" (byte-level BPE; the regexes that tokenizer.ggml.pre names) or
// "llama" (SentencePiece-style BPE by score with <0xXX> byte fallback). `origin` names the file.
Pipeline pipeline_from_gguf(const TokenizerInfo& info, const std::string& origin);

// tokenizer.json with model type BPE. `side` carries tokenizer_config.json's flags (add_bos_token /
// add_eos_token override the file's post-processor, as transformers does).
Pipeline pipeline_from_tokenizer_json(const std::string& path, const TokenizerInfo& side);

// The pre-tokeniser regexes llama.cpp uses for a tokenizer.ggml.pre name (applied one after the
// other, each splitting the pieces of the previous one); throws for names we do not know.
std::vector<std::string> gguf_pre_regexes(const std::string& pre, const std::string& origin);

}  // namespace shardwise::tok

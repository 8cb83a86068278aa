// cli/verb_tokenize.cpp — `shardwise tokenize`: the ids a model sees for a text, and their pieces.
#include <cstdio>

#include "cli/common.h"
#include "core/error.h"
#include "core/file_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace shardwise::cli {
namespace {

struct TokenizeArgs {
  std::string model, text, file;
  bool json = false, add_special = false, no_parse_special = false, ids_only = false;
  bool has_text = false, has_file = false;  // --text "" is a valid (empty) text
};

// A synthetic model's vocabulary follows from its spec (core/weight_source.h), so no weights are made.
class SpecOnlySource : public WeightSource {
 public:
  SpecOnlySource(const ModelSpec& spec, const std::string& origin) {
    spec_ = spec;
    origin_ = origin;
    tokenizer_ = synthetic_vocabulary(spec);
  }
};

// --file's text (a directory, or a file that cannot be read, is an error, not an empty text).
std::string read_prompt_file(const std::string& path) {
  try {
    return read_text_file(path);
  } catch (const Error& e) {
    fail("--file ", e.what());
  }
}

// A piece for display: control tokens by name, bytes as text (a lone byte of a UTF-8 sequence as \xNN).
std::string display_piece(const Tokenizer& tok, int32_t id) {
  if (tok.is_control(id)) return tok.token_text(id);
  const std::string p = tok.piece(id);
  if (tok::utf8_invalid_offset(p) == std::string::npos) return p;
  std::string out;
  for (unsigned char c : p) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02X", c);
    out += b;
  }
  return out;
}

void run_tokenize(const TokenizeArgs& a) {
  if (a.has_text == a.has_file) fail("give exactly one of --text TEXT or --file PATH");
  const std::string text = a.file.empty() ? a.text : read_prompt_file(a.file);
  std::unique_ptr<WeightSource> src;
  if (a.model.compare(0, 10, "synthetic:") == 0) {
    std::string origin;
    DType dt;
    bool has_weights = false;
    src = std::make_unique<SpecOnlySource>(resolve_model_spec(a.model, &origin, &dt, &has_weights), a.model);
  } else {
    src = open_weights(a.model);
  }
  const Tokenizer tok(*src);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, a.add_special, !a.no_parse_special);
  } catch (const Error& e) {  // the tokenizer names the byte and its offset; this names the file
    if (a.file.empty()) throw;
    fail("--file ", a.file, ": ", e.what());
  }
  if (a.json) {
    nlohmann::json j;
    j["ids"] = ids;
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tok::utf8_sanitize(tok.token_text(id)));
    j["pieces"] = pieces;
    j["n_tokens"] = ids.size();
    j["tokenizer"] = tok.kind();
    print_json(j);
    return;
  }
  if (a.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    std::printf("%s]\n", line.c_str());
    return;
  }
  for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, display_piece(tok, id).c_str());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "Show the token ids a model sees for a text");
  sub->add_option("-m,--model", a->model, "A .gguf file, an HF directory or synthetic:SPEC")->required();
  CLI::Option* text = sub->add_option("-p,--text,--prompt", a->text, "Text to tokenise (UTF-8)");
  CLI::Option* file = sub->add_option("-f,--file", a->file, "Read the text from a file instead of --text");
  sub->add_flag("--add-special", a->add_special, "Add BOS/EOS as the model does for a prompt");
  sub->add_flag("--no-parse-special", a->no_parse_special,
                "Tokenise control-token text such as <|im_start|> as plain text instead of as that token");
  sub->add_flag("--ids", a->ids_only, "Print only the ids, as [1, 2, 3]");
  sub->add_flag("--json", a->json,
                "Print {\"ids\": [...], \"pieces\": [...]} (pieces: the tokens' vocabulary strings)");
  sub->callback([a, text, file] {
    a->has_text = text->count() > 0;
    a->has_file = file->count() > 0;
    run_tokenize(*a);
  });
}

}  // namespace shardwise::cli

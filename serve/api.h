// serve/api.h — the OpenAI API's shapes: a request body read into typed values (unknown fields
// ignored, a known field of the wrong type or out of range refused with a 400 naming it), turned into a
// checked, tokenised generation; and the JSON of responses, stream chunks and errors.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "serve/channel.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace shardwise::serve {

// Thrown while reading a request: what the client gets back.
class ApiFailure : public std::runtime_error {
 public:
  explicit ApiFailure(ApiError e) : std::runtime_error(e.message), error(std::move(e)) {}
  ApiError error;
};

enum class Endpoint { Chat, Completion };  // POST /v1/chat/completions, POST /v1/completions

// An image of a chat message: an "image_url" content part's data: URL, its base64 decoded (the bytes are
// checked as an image only when the prompt is encoded).
struct ApiImage {
  size_t message = 0;  // its message in ApiRequest::messages
  size_t offset = 0;   // where its placeholder goes in that message's content (a byte offset)
  std::string bytes;
};

// A request body's fields, typed; absent optional fields are empty.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;                  // echoed in the response ("" when not given)
  std::vector<ChatMessage> messages;  // Chat
  std::vector<ApiImage> images;       // Chat: the user messages' images, in order
  std::string prompt;                 // Completion, as text
  std::vector<int32_t> prompt_ids;    // Completion, as token ids (used as given: no BOS added)
  bool prompt_is_ids = false;
  std::optional<int64_t> max_tokens;  // max_tokens, or max_completion_tokens
  std::optional<double> temperature, top_p, min_p, repeat_penalty;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;  // -1 and absent: drawn per request
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  // llama-server's extensions.
  bool ignore_eos = false;
  bool cache_prompt = true;
  bool return_tokens = false;  // the generated ids beside the text
};

// Limits on what a body may hold (beyond its size, which the HTTP side bounds).
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxMessages = 100000;
// Images of one request, and the decoded bytes of one image (checked on the base64's length, before
// anything is allocated).
constexpr size_t kMaxImagesPerRequest = 8;
constexpr size_t kMaxImageBytes = size_t{20} << 20;

// RFC 4648 base64 (the standard alphabet, '=' padding to a multiple of 4, zero pad bits; no whitespace)
// decoded into at most max_bytes; nullopt for anything else.
std::optional<std::string> decode_base64(const std::string& text, size_t max_bytes);

// The body of a POST to `endpoint`. Throws ApiFailure (400) for JSON that does not parse, is nested
// too deep or is not an object, a missing messages/prompt, a field of the wrong type or out of range,
// and n other than 1.
ApiRequest parse_request(Endpoint endpoint, const std::string& body);

// The body of POST /admin/budget: {"vram_budget": "4G"} (a size as --vram-budget takes it) or a number
// of bytes; between 16 MiB and 16 TiB. Throws ApiFailure (400) otherwise.
uint64_t parse_budget_request(const std::string& body);

class ImageEncoder;  // serve/images.h

// What the API side knows of the served model.
struct ServedModel {
  std::string id;  // the file name (GET /v1/models; "model" of responses that give none)
  const Tokenizer* tokenizer = nullptr;
  ChatFormat chat_format = ChatFormat::ChatML;
  int64_t context = 0;     // KV capacity: prompt and reply together
  int64_t vocab_size = 0;  // prompt ids must be below it
  int64_t n_predict = -1;  // -n: the most tokens a request may generate (-1: up to the context)
  int64_t created = 0;     // Unix time the server started (GET /v1/models)
  // A vision-language model's image side (null: a text model, which refuses images).
  std::shared_ptr<ImageEncoder> images;
};

// The generation a request asks for: the prompt tokenised (chat messages through the chat template), the
// sampling settings, max_tokens capped by -n and the context. Throws ApiFailure (400) for a prompt that
// gives no tokens, holds ids outside the vocabulary, or is longer than the context, and for images the
// model cannot take or that do not decode. A request with images is encoded here (the vision encoder on
// the CPU, see ImageEncoder::encode): the caller's thread is busy for as long as that takes.
GenerationRequest make_generation(const ApiRequest& request, const ServedModel& model);

// {"error": {"message", "type", "param": null, "code"}}.
std::string error_json(const ApiError& e);

// The JSON of one response, whole or streamed.
class ResponseWriter {
 public:
  ResponseWriter(const ApiRequest& request, const ServedModel& model, uint64_t serial);

  // Non-streamed: the whole response.
  std::string full(const std::string& text, const std::vector<int32_t>& tokens, Finish finish,
                   const Usage& usage) const;
  // Streamed, as SSE events ("data: {...}\n\n"): the first chunk (chat: the assistant role), then one per
  // delta, then the end (the finish_reason chunk, the usage chunk where asked, "data: [DONE]").
  std::string sse_start() const;
  std::string sse_delta(const std::string& text, const std::vector<int32_t>& tokens) const;
  std::string sse_end(Finish finish, const Usage& usage) const;
  // An error after the stream began: one event with the error object.
  static std::string sse_error(const ApiError& e);

 private:
  nlohmann::json chunk(nlohmann::json choices) const;  // a stream chunk's fields
  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool return_tokens_, include_usage_;
};

// GET /v1/models.
std::string models_json(const ServedModel& model);

}  // namespace shardwise::serve

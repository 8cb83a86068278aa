// serve/api.cpp — see api.h.
#include "serve/api.h"

#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/json_util.h"
#include "core/size.h"
#include "serve/images.h"

namespace shardwise::serve {

std::optional<std::string> decode_base64(const std::string& text, size_t max_bytes) {
  if (text.size() % 4 != 0) return std::nullopt;
  const size_t pad = text.empty() ? 0 : text.back() != '=' ? 0 : text[text.size() - 2] == '=' ? 2 : 1;
  const size_t n = text.size() / 4 * 3 - pad;
  if (n > max_bytes) return std::nullopt;  // before anything is allocated
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  out.reserve(n);
  const size_t data = text.size() - pad;
  uint32_t bits = 0;
  int have = 0;
  for (size_t i = 0; i < data; ++i) {
    const int v = value(text[i]);
    if (v < 0) return std::nullopt;  // a stray '=', whitespace or another character
    bits = (bits << 6) | static_cast<uint32_t>(v);
    have += 6;
    if (have >= 8) {
      have -= 8;
      out.push_back(static_cast<char>((bits >> have) & 0xFF));
    }
  }
  if ((bits & ((1u << have) - 1)) != 0) return std::nullopt;  // the pad bits must be zero
  return out;
}

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const char* code, const std::string& message) {
  throw ApiFailure({400, "invalid_request_error", code, message});
}

// Text that never throws: a value in a message may hold any bytes.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The field, or null when it is absent or JSON null (OpenAI's clients send null for "not given").
const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string not_a(const char* key, const char* what, const json& v) {
  return str_cat("'", key, "' must be ", what, ", not ", json_brief(v));
}

std::optional<double> number_field(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad("invalid_type", not_a(key, "a number", *v));
  return v->get<double>();
}

// An integer (a number with no fraction); values beyond int64 saturate.
std::optional<int64_t> integer_field(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                          : static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
  }
  bad("invalid_type", not_a(key, "an integer", *v));
}

bool bool_field(const json& body, const char* key, bool fallback) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad("invalid_type", not_a(key, "true or false", *v));
  return v->get<bool>();
}

// The bytes of an image part's URL: only a data: URL of base64 with an image/* media type (the server
// fetches nothing).
std::string image_url_bytes(const std::string& url, const std::string& where) {
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  const std::string head = lower(url.substr(0, std::min<size_t>(url.size(), 256)));
  if (head.rfind("data:", 0) != 0)
    bad("invalid_image_url",
        str_cat("'", where, "' must be a data: URL (data:image/png;base64,...): images must be ",
                "sent inline, this server fetches nothing", head.rfind("http", 0) == 0 ? " (not an http(s) URL)" : ""));
  const size_t comma = url.find(',');
  const std::string meta = comma == std::string::npos || comma > 205 ? "" : lower(url.substr(5, comma - 5));
  if (meta.rfind("image/", 0) != 0 || meta.size() < 7 || meta.compare(meta.size() - 7, 7, ";base64") != 0)
    bad("invalid_image_url", str_cat("'", where, "' must be data:image/TYPE;base64,DATA (e.g. image/png, image/jpeg)"));
  const size_t b64 = url.size() - comma - 1;
  if (b64 / 4 * 3 > kMaxImageBytes + 2)
    bad("image_too_large", str_cat("'", where, "': the image is larger than the limit of ", kMaxImageBytes, " bytes (",
                                   kMaxImageBytes >> 20, " MiB)"));
  std::optional<std::string> bytes = decode_base64(url.substr(comma + 1), kMaxImageBytes);
  if (!bytes)
    bad("invalid_image_url",
        str_cat("'", where, "': the data is not valid base64 (standard alphabet, '=' padding, no whitespace)",
                " or is larger than ", kMaxImageBytes, " bytes"));
  if (bytes->empty()) bad("invalid_image_url", str_cat("'", where, "': the image is empty"));
  return std::move(*bytes);
}

// An "image_url" part's URL: {"url": "data:..."} (OpenAI's form), or the URL as a plain string.
const std::string& image_part_url(const json& part, const std::string& where) {
  const json* iu = field(part, "image_url");
  if (iu && iu->is_object()) iu = field(*iu, "url");
  if (!iu || !iu->is_string())
    bad("invalid_type", str_cat("'", where, "' must be {\"type\": \"image_url\", \"image_url\": {\"url\": ",
                                "\"data:image/...;base64,...\"}}"));
  return iu->get_ref<const std::string&>();
}

// A message's content: a string, or an array of parts: {"type": "text", "text": ...} (consecutive text
// parts joined by newlines) and, in user messages, {"type": "image_url", ...}, whose placeholder goes
// where the part is (added to `images`, message `index`).
std::string content_text(const json& c, size_t index, bool user, std::vector<ApiImage>& images) {
  if (c.is_string()) return c.get<std::string>();
  const std::string where = str_cat("messages[", index, "].content");
  if (!c.is_array())
    bad("invalid_type", str_cat("'", where, "' must be a string or an array of content parts, not ", json_brief(c)));
  std::string text;
  bool after_text = false;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    const std::string at = str_cat(where, "[", k, "]");
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    const std::string kind = type && type->is_string() ? type->get<std::string>() : "";
    if (kind == "image_url" && user) {
      if (images.size() >= kMaxImagesPerRequest)
        bad("too_many_images", str_cat("the request holds more than ", kMaxImagesPerRequest, " images"));
      images.push_back({index, text.size(), image_url_bytes(image_part_url(part, at), at)});
      after_text = false;
      continue;
    }
    const json* t = part.is_object() ? field(part, "text") : nullptr;
    if (kind != "text" || !t || !t->is_string())
      bad("invalid_value", str_cat("'", at, "' must be {\"type\": \"text\", \"text\": string}",
                                   user ? " or {\"type\": \"image_url\", \"image_url\": {\"url\": string}}"
                                        : " (images go in user messages)"));
    text += (after_text ? "\n" : "") + t->get<std::string>();
    after_text = true;
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& body, std::vector<ApiImage>& images) {
  const json* m = field(body, "messages");
  if (!m) bad("missing_field", "'messages' is required: an array of {\"role\", \"content\"} objects");
  if (!m->is_array()) bad("invalid_type", not_a("messages", "an array", *m));
  if (m->empty()) bad("invalid_value", "'messages' is empty: give at least one message");
  if (m->size() > kMaxMessages) bad("invalid_value", str_cat("'messages' holds more than ", kMaxMessages, " messages"));
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    if (!msg.is_object()) bad("invalid_type", str_cat("'messages[", i, "]' must be an object, not ", json_brief(msg)));
    const json* role = field(msg, "role");
    if (!role || !role->is_string())
      bad("invalid_type", str_cat("'messages[", i, "].role' must be a string (system, user or assistant)"));
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant")
      bad("invalid_value", str_cat("'messages[", i, "].role' ", json_brief(*role),
                                   " is not supported (system, user, assistant or developer)"));
    const json* content = field(msg, "content");
    if (!content && r != "assistant") bad("missing_field", str_cat("'messages[", i, "].content' is required"));
    out.push_back({r, content ? content_text(*content, i, r == "user", images) : std::string()});
  }
  return out;
}

// prompt: a string, an array of token ids, or an array of one string.
void read_prompt(const json& body, ApiRequest& rq) {
  const json* p = field(body, "prompt");
  if (!p) bad("missing_field", "'prompt' is required: a string (or an array of token ids)");
  if (p->is_string()) {
    rq.prompt = p->get<std::string>();
    return;
  }
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    rq.prompt = (*p)[0].get<std::string>();
    return;
  }
  if (p->is_array() && !p->empty()) {
    for (const json& id : *p) {
      if (id.is_object())
        bad("invalid_value",
            "'prompt' holds an object: images (and content parts) are taken by /v1/chat/completions only");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("invalid_type", "'prompt' as an array must hold token ids (integers from 0) or one string");
      rq.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    rq.prompt_is_ids = true;
    return;
  }
  bad("invalid_type", not_a("prompt", "a string, an array of token ids or an array of one string", *p));
}

std::vector<std::string> read_stop(const json& body) {
  const json* s = field(body, "stop");
  if (!s) return {};
  if (s->is_string()) return {s->get<std::string>()};
  if (!s->is_array()) bad("invalid_type", not_a("stop", "a string or an array of strings", *s));
  if (s->size() > kMaxStopStrings)
    bad("invalid_value", str_cat("'stop' holds more than ", kMaxStopStrings, " strings"));
  std::vector<std::string> out;
  for (const json& x : *s) {
    if (!x.is_string()) bad("invalid_type", "'stop' must be a string or an array of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

void read_sampling(const json& body, ApiRequest& rq) {
  rq.temperature = number_field(body, "temperature");
  rq.top_p = number_field(body, "top_p");
  rq.min_p = number_field(body, "min_p");
  rq.repeat_penalty = number_field(body, "repeat_penalty");
  rq.top_k = integer_field(body, "top_k");
  if (const json* seed = field(body, "seed")) {
    if (seed->is_number_unsigned())
      rq.seed = seed->get<uint64_t>();
    else if (!(seed->is_number_integer() && seed->get<int64_t>() == -1))
      bad("invalid_type", not_a("seed", "an integer from 0 to 2^64-1 (or -1: drawn)", *seed));
  }
}

void read_stream(const json& body, ApiRequest& rq) {
  rq.stream = bool_field(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("invalid_type", not_a("stream_options", "an object", *so));
    rq.include_usage = bool_field(*so, "include_usage", false);
  }
}

json parse_body(const std::string& body) {
  try {
    check_json_depth(body, "the request body");
  } catch (const Error& e) {
    bad("invalid_json", e.what());
  }
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) bad("invalid_json", "the request body is not valid JSON");
  if (!j.is_object()) bad("invalid_json", "the request body must be a JSON object, not " + json_brief(j));
  return j;
}

void check_range(bool ok, const char* key, double v, const char* range) {
  if (!ok) bad("invalid_value", str_cat("'", key, "' ", v, " is out of range: ", range));
}

SamplingParams sampling_of(const ApiRequest& rq) {
  SamplingParams p;  // `run`'s defaults for what the request leaves out
  if (rq.temperature) {
    check_range(*rq.temperature >= 0 && std::isfinite(*rq.temperature), "temperature", *rq.temperature,
                "0 (greedy) or more");
    p.temp = static_cast<float>(*rq.temperature);
  }
  if (rq.top_p) {
    check_range(*rq.top_p > 0 && *rq.top_p <= 1, "top_p", *rq.top_p, "(0, 1]");
    p.top_p = static_cast<float>(*rq.top_p);
  }
  if (rq.min_p) {
    check_range(*rq.min_p >= 0 && *rq.min_p <= 1, "min_p", *rq.min_p, "[0, 1]");
    p.min_p = static_cast<float>(*rq.min_p);
  }
  if (rq.repeat_penalty) {
    check_range(*rq.repeat_penalty > 0 && std::isfinite(*rq.repeat_penalty), "repeat_penalty", *rq.repeat_penalty,
                "more than 0 (1: off)");
    p.repeat_penalty = static_cast<float>(*rq.repeat_penalty);
  }
  if (rq.top_k) {
    check_range(*rq.top_k >= 0, "top_k", static_cast<double>(*rq.top_k), "0 (off) or more");
    p.top_k = static_cast<int32_t>(std::min<int64_t>(*rq.top_k, std::numeric_limits<int32_t>::max()));
  }
  p.greedy = p.temp <= 0;
  p.seed = rq.seed ? *rq.seed : static_cast<uint32_t>(std::random_device{}());
  p.validate();
  return p;
}

// The chat messages with each image's placeholder at its place and Qwen2-VL's default system message.
std::vector<ChatMessage> messages_with_images(const ApiRequest& rq, const ServedModel& m) {
  std::vector<ChatMessage> messages = rq.messages;
  const MropeTokens& t = m.images->tokens();
  const std::string placeholder = vl_image_placeholder(*m.tokenizer, t.vision_start_token_id, t.image_token_id);
  for (size_t i = rq.images.size(); i-- > 0;) {  // from the back: the earlier offsets stay valid
    const ApiImage& im = rq.images[i];
    messages[im.message].content.insert(im.offset, placeholder);
  }
  add_vl_default_system(messages);
  return messages;
}

std::vector<int32_t> prompt_tokens(const ApiRequest& rq, const ServedModel& m) {
  if (rq.endpoint == Endpoint::Completion && rq.prompt_is_ids) {
    for (size_t i = 0; i < rq.prompt_ids.size(); ++i)
      if (rq.prompt_ids[i] >= m.vocab_size)
        bad("invalid_value", str_cat("'prompt' token id ", rq.prompt_ids[i], " at ", i,
                                     " is outside the vocabulary of ", m.vocab_size, " tokens"));
    return rq.prompt_ids;
  }
  std::string text = rq.prompt;
  if (rq.endpoint == Endpoint::Chat)
    text = apply_chat_template(m.chat_format, rq.images.empty() ? rq.messages : messages_with_images(rq, m));
  try {  // as `run` encodes a prompt: BOS per the model, control tokens written in the text parsed
    return m.tokenizer->encode(text, true, true);
  } catch (const Error& e) {
    bad("invalid_value", str_cat("the prompt cannot be tokenised: ", e.what()));
  }
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

}  // namespace

uint64_t parse_budget_request(const std::string& body) {
  const json j = parse_body(body);
  const json* v = field(j, "vram_budget");
  if (!v) bad("missing_field", "the body needs 'vram_budget', e.g. {\"vram_budget\": \"4G\"}");
  uint64_t bytes = 0;
  if (v->is_number_unsigned()) {
    bytes = v->get<uint64_t>();
  } else if (v->is_string()) {
    try {
      bytes = parse_size(v->get<std::string>(), "'vram_budget'");
    } catch (const Error& e) {
      bad("invalid_value", e.what());
    }
  } else {
    bad("invalid_type", not_a("vram_budget", "a size such as \"4G\" or a number of bytes", *v));
  }
  constexpr uint64_t kLeast = 16ull << 20, kMost = 16ull << 40;
  if (bytes < kLeast || bytes > kMost)
    bad("invalid_value", str_cat("'vram_budget' ", bytes, " bytes is out of range: 16M to 16T"));
  return bytes;
}

ApiRequest parse_request(Endpoint endpoint, const std::string& body) {
  const json j = parse_body(body);
  ApiRequest rq;
  rq.endpoint = endpoint;
  if (const json* model = field(j, "model")) {
    if (!model->is_string()) bad("invalid_type", not_a("model", "a string", *model));
    rq.model = model->get<std::string>();
  }
  if (endpoint == Endpoint::Chat)
    rq.messages = read_messages(j, rq.images);
  else
    read_prompt(j, rq);
  rq.max_tokens = integer_field(
      j, endpoint == Endpoint::Chat && field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
  if (rq.max_tokens && *rq.max_tokens < 1)
    bad("invalid_value", str_cat("'max_tokens' ", *rq.max_tokens, " must be at least 1"));
  if (const auto n = integer_field(j, "n"); n && *n != 1)
    bad("invalid_value", str_cat("'n' ", *n, " is not supported: one choice per request (n = 1)"));
  read_sampling(j, rq);
  rq.stop = read_stop(j);
  read_stream(j, rq);
  rq.ignore_eos = bool_field(j, "ignore_eos", false);
  rq.cache_prompt = bool_field(j, "cache_prompt", true);
  rq.return_tokens = bool_field(j, "return_tokens", false);
  return rq;
}

GenerationRequest make_generation(const ApiRequest& rq, const ServedModel& m) {
  GenerationRequest g;
  g.sampling = sampling_of(rq);
  if (!rq.images.empty() && !m.images)
    bad("images_not_supported",
        str_cat("the model ", m.id, " takes no images (it has no vision tower): send text only"));
  g.prompt = prompt_tokens(rq, m);
  if (!rq.images.empty()) {
    EncodedPrompt e = m.images->encode(g.prompt, rq.images, m.context);
    g.prompt = std::move(e.ids);
    g.image = std::move(e.image);
  }
  if (g.prompt.empty())
    bad("invalid_value", "the prompt gives no tokens (and this model adds no BOS): give a non-empty prompt");
  const int64_t n_prompt = static_cast<int64_t>(g.prompt.size());
  if (n_prompt > m.context)
    bad("context_length_exceeded", str_cat("the prompt has ", n_prompt, " tokens, more than the context of ", m.context,
                                           " (the server's --ctx-size)"));
  const int64_t room = m.context - n_prompt + 1;  // the last token generated is never stepped
  int64_t n = rq.max_tokens.value_or(m.n_predict > 0 ? m.n_predict : room);
  if (m.n_predict > 0) n = std::min(n, m.n_predict);
  g.max_tokens = std::min(n, room);
  g.stop = rq.stop;
  g.ignore_eos = rq.ignore_eos;
  g.cache_prompt = rq.cache_prompt;
  return g;
}

std::string error_json(const ApiError& e) {
  return dump({{"error", {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", e.code}}}});
}

ResponseWriter::ResponseWriter(const ApiRequest& rq, const ServedModel& m, uint64_t serial)
    : endpoint_(rq.endpoint),
      id_((rq.endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + std::to_string(m.created) + "-" +
          std::to_string(serial)),
      model_(rq.model.empty() ? m.id : rq.model),
      created_(static_cast<int64_t>(std::time(nullptr))),
      return_tokens_(rq.return_tokens),
      include_usage_(rq.include_usage) {}

std::string ResponseWriter::full(const std::string& text, const std::vector<int32_t>& tokens, Finish finish,
                                 const Usage& usage) const {
  const bool chat = endpoint_ == Endpoint::Chat;
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_name(finish)}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  if (return_tokens_) choice["tokens"] = tokens;
  return dump({{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"choices", json::array({choice})},
               {"usage", usage_json(usage)}});
}

nlohmann::json ResponseWriter::chunk(nlohmann::json choices) const {
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(choices)}};
}

namespace {
std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}
}  // namespace

std::string ResponseWriter::sse_start() const {
  if (endpoint_ != Endpoint::Chat) return "";
  return sse(chunk(
      json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}})));
}

std::string ResponseWriter::sse_delta(const std::string& text, const std::vector<int32_t>& tokens) const {
  json choice = {{"index", 0}, {"finish_reason", nullptr}};
  if (endpoint_ == Endpoint::Chat) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  if (return_tokens_) choice["tokens"] = tokens;
  return sse(chunk(json::array({choice})));
}

std::string ResponseWriter::sse_end(Finish finish, const Usage& usage) const {
  json choice = {{"index", 0}, {"finish_reason", finish_name(finish)}};
  if (endpoint_ == Endpoint::Chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
    choice["logprobs"] = nullptr;
  }
  std::string out = sse(chunk(json::array({choice})));
  if (include_usage_) {  // OpenAI's last chunk: no choices, the usage
    json j = chunk(json::array());
    j["usage"] = usage_json(usage);
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

std::string ResponseWriter::sse_error(const ApiError& e) {
  return "data: " + error_json(e) + "\n\n";
}

std::string models_json(const ServedModel& m) {
  return dump({{"object", "list"},
               {"data", json::array({{{"id", m.id},
                                      {"object", "model"},
                                      {"created", m.created},
                                      {"owned_by", "shardwise"},
                                      {"meta", {{"n_ctx", m.context}, {"n_vocab", m.vocab_size}}}}})}});
}

}  // namespace shardwise::serve

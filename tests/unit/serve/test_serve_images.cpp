// Images in /v1/chat/completions: the HF fixture's tiny Qwen2.5-VL (tests/fixtures/vl/qwen2_5_vl, with a
// byte-level tokenizer) served with data: URL images generates what `run --image --prompt` generates (on
// the CPU and the emulated device), batched with other requests, without reusing another image's cache;
// and bad image input is one 400 JSON error, after which the server goes on serving. With --vision-budget
// the images are encoded on the emulated device (or on the CPU where they do not fit it) to the same
// tokens, the language model planned in the rest of the budget; --mmproj serves llama.cpp's GGUF pair.
#include <signal.h>

#include <catch2/catch.hpp>

#include "core/weight_source.h"
#include "serve/images.h"
#include "serve_test_util.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/mmproj.h"
#include "vision/vl_prompt.h"
#include "vl_test_util.h"

using namespace shardwise;
using namespace shardwise::test::serve;
using Catch::Matchers::Contains;

namespace {

std::string image_path(const std::string& name) {
  return test::fixtures_dir() + "/vl/qwen2_5_vl/images/" + name + "/image.png";
}

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? abc[v & 63] : '=';
  }
  return out;
}

std::string data_url(const std::string& image) {
  return "data:image/png;base64," + base64(test::read_file(image_path(image)));
}

json image_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

// A greedy chat request: one user message of `parts` (a string: its text alone).
json chat(const json& content, int64_t n) {
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", n},
          {"temperature", 0},
          {"return_tokens", true}};
}

json image_chat(const std::string& image, const std::string& text, int64_t n) {
  return chat(json::array({image_part(data_url(image)), {{"type", "text"}, {"text", text}}}), n);
}

// The fixture with a tokenizer, once per test binary.
const std::string& vl_dir() {
  static const std::string dir = test::vl_fixture_with_tokenizer("serve_vl_model");
  return dir;
}

struct RunResult {
  std::vector<int32_t> tokens;
  std::string text;
};

// `shardwise run --image IMAGE --prompt TEXT --greedy` on `device` (no image: --chat, the text alone).
RunResult run_reference(const std::string& image, const std::string& text, int64_t n, const std::string& device) {
  std::string cmd = "'" + test::shardwise_bin() + "' run -m '" + vl_dir() + "' --prompt '" + text + "' --greedy -n " +
                    std::to_string(n) + " --json --device " + device;
  cmd += image.empty() ? " --chat" : " --image '" + image_path(image) + "'";
  if (device == "emu") cmd += " --vram-budget 1500K";
  std::string out;
  const int rc = test::run_command("(" + cmd + " 2>/dev/null)", &out);
  INFO(cmd << "\n" << out);
  REQUIRE(rc == 0);
  const json j = json::parse(out);
  return {j["generated_ids"].get<std::vector<int32_t>>(), j["text"].get<std::string>()};
}

std::vector<int32_t> tokens_of(const TestServer::Reply& r) {
  INFO(r.text);
  REQUIRE(r.status == 200);
  return r.body["choices"][0]["tokens"].get<std::vector<int32_t>>();
}

// `shardwise ARGS` (serve on a free port) as a child process, and a client for it; stopped (SIGTERM, exit 0)
// by stop().
struct ServeBinary {
  explicit ServeBinary(const std::vector<std::string>& args) : c(with_free_port(args)) {
    const std::string first = c.line();
    INFO("stdout: " << first << "\nstderr: " << test::read_file(c.err_path));
    REQUIRE(first.rfind("listening on http://127.0.0.1:", 0) == 0);
    client = std::make_unique<HttpClient>(parse_url(first.substr(first.find("http://"))), 60);
  }
  json post(const std::string& path, const json& body) {
    const HttpResponse r = client->request("POST", path, body.dump());
    INFO(path << ": " << r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body);
  }
  double metric(const std::string& name) { return metric_sample(client->request("GET", "/metrics", "").body, name); }
  std::string log() const { return test::read_file(c.err_path); }
  void stop() {
    REQUIRE(kill(c.pid, SIGTERM) == 0);
    CHECK(c.wait_exit() == 0);
  }
  static std::vector<std::string> with_free_port(std::vector<std::string> args) {
    args.insert(args.end(), {"--port", "0"});
    return args;
  }
  Child c;
  std::unique_ptr<HttpClient> client;
};

// A chat reply's tokens and text are `want`'s.
void check_reply(const json& j, const RunResult& want) {
  CHECK(j["choices"][0]["tokens"].get<std::vector<int32_t>>() == want.tokens);
  CHECK(j["choices"][0]["message"]["content"] == want.text);
}

const std::string kDeviceEncodes = "shardwise_vision_encodes_total{on=\"device\"}";
const std::string kCpuEncodes = "shardwise_vision_encodes_total{on=\"cpu\"}";

// The fixture model in-process: a CPU engine of `slots` slots (held at a gate the test controls) behind
// a server whose model takes images.
struct VlServer {
  explicit VlServer(int slots, int64_t prefill_chunk = 0)
      : source(open_weights(vl_dir())),
        tok(*source),
        model(*source, 2),
        cpu(model.weights, model.pool, kContext * slots, slots),
        gate(cpu) {
    ServedModel m;
    m.id = "vl";
    m.tokenizer = &tok;
    m.chat_format = choose_chat_format(tok.chat_template(), source->spec().family, tok).format;
    m.context = kContext;
    m.vocab_size = source->spec().vocab_size;
    m.images =
        std::make_shared<ImageEncoder>(load_vl_model(vl_dir(), source->spec()), source->tensor("token_embd.weight"), 2);
    ServerOptions o;
    o.parallel = slots;
    o.prefill_chunk = prefill_chunk;
    o.max_body_bytes = 8 << 20;
    s = std::make_unique<TestServer>(gate, m, o);
  }
  static constexpr int64_t kContext = 256;
  std::unique_ptr<WeightSource> source;
  Tokenizer tok;
  LoadedModel model;
  CpuEngine cpu;
  GatedEngine gate;
  std::unique_ptr<TestServer> s;
};

}  // namespace

TEST_CASE("serve images: a chat request with an image generates run --image's tokens, on cpu and emu",
          "[serve][images][cli]") {
  const std::string text = "What is in the picture?";
  for (const std::string device : {"cpu", "emu"}) {
    INFO(device);
    std::vector<std::string> args = {"serve", "-m", vl_dir(), "--device", device};
    if (device == "emu") args.insert(args.end(), {"--vram-budget", "1500K"});
    ServeBinary server(args);
    const json j = server.post("/v1/chat/completions", image_chat("img_56x56", text, 10));
    check_reply(j, run_reference("img_56x56", text, 10, device));
    CHECK(j["usage"]["prompt_tokens"].get<int64_t>() > 40);  // the image's tokens, not one placeholder
    // Without --vision-budget the CPU encodes the images, also on a device.
    CHECK(server.metric(kCpuEncodes) == 1);
    CHECK(server.metric(kDeviceEncodes) == 0);
    server.stop();
  }
}

// The fixture's encoder needs 1271 KiB for img_56x56 with its 4 blocks resident (993 KiB streamed), its
// language model at least 1288 KiB: each server below plans the language model in 1500K, whatever part of
// its budget it sets apart for the encoder.

// The reply to an image chat of a server on the emulated device that encodes on the CPU (no
// --vision-budget), its language model in 1500K.
RunResult cpu_encoded_reply(const std::string& image, const std::string& text, int64_t n) {
  ServeBinary server({"serve", "-m", vl_dir(), "--device", "emu", "--vram-budget", "1500K"});
  const json j = server.post("/v1/chat/completions", image_chat(image, text, n));
  REQUIRE(server.metric(kCpuEncodes) == 1);
  server.stop();
  return {j["choices"][0]["tokens"].get<std::vector<int32_t>>(), j["choices"][0]["message"]["content"]};
}

TEST_CASE(
    "serve images: --vision-budget encodes on the emulated device to the CPU encoder's tokens, the language "
    "model planned in the rest",
    "[serve][images][cli][vision_budget]") {
  const std::string text = "What is in the picture?";
  const RunResult want = cpu_encoded_reply("img_56x56", text, 10);
  // 1000K: the encoder streams its blocks through two slots.
  ServeBinary server(
      {"serve", "-m", vl_dir(), "--device", "emu", "--vram-budget", "2500K", "--vision-budget", "1000K"});
  CHECK(server.metric("shardwise_vram_arena_bytes") == 1500 << 10);
  CHECK(server.metric(kDeviceEncodes) == 0);
  // The encoder's arena is allocated once, before the first request, and kept: no device allocation or
  // release per request (on CUDA one would synchronise the whole GPU under the language model's graphs).
  CHECK(server.metric("shardwise_vision_held_bytes") == 1000 << 10);
  CHECK(server.metric("shardwise_vision_last_encode_milliseconds") == 0);
  check_reply(server.post("/v1/chat/completions", image_chat("img_56x56", text, 10)), want);
  CHECK(server.metric(kDeviceEncodes) == 1);
  CHECK(server.metric("shardwise_vision_last_encode_milliseconds") > 0);
  CHECK(server.metric(kCpuEncodes) == 0);
  const double arena = server.metric("shardwise_vision_arena_bytes");
  CHECK(arena > 900 << 10);
  CHECK(arena <= 1000 << 10);
  // A new budget is the language model's alone: it gets all of it, the encoder keeps its own.
  const json change = server.post("/admin/budget", {{"vram_budget", "16M"}});
  CHECK(change["vram_budget_bytes"] == 16u << 20);
  CHECK(change["previous_vram_budget_bytes"] == 1500u << 10);
  CHECK(server.metric("shardwise_vram_arena_bytes") == 16u << 20);
  check_reply(server.post("/v1/chat/completions", image_chat("img_56x56", text, 10)), want);
  CHECK(server.metric(kDeviceEncodes) == 2);
  CHECK(server.metric("shardwise_vision_arena_bytes") == arena);
  CHECK(server.metric("shardwise_vision_held_bytes") == 1000 << 10);
  CHECK_THAT(server.log(), !Contains("encoded on the CPU"));
  server.stop();
}

TEST_CASE(
    "serve images: a --vision-budget too small for a request's images encodes them on the CPU to the same "
    "tokens, with one warning",
    "[serve][images][cli][vision_budget]") {
  const std::string text = "What is in the picture?";
  const RunResult want = cpu_encoded_reply("img_56x56", text, 10);
  ServeBinary server({"serve", "-m", vl_dir(), "--device", "emu", "--vram-budget", "1600K", "--vision-budget", "100K"});
  check_reply(server.post("/v1/chat/completions", image_chat("img_56x56", text, 10)), want);
  CHECK(server.metric(kCpuEncodes) == 1);
  CHECK(server.metric(kDeviceEncodes) == 0);
  CHECK(server.metric("shardwise_vision_arena_bytes") == 0);
  const std::string log = server.log();
  INFO(log);
  const size_t at = log.find("warning: the vision encoder needs at least");
  REQUIRE(at != std::string::npos);
  CHECK(log.find("the images are encoded on the CPU", at) != std::string::npos);
  CHECK(log.find("warning: the vision encoder", at + 1) == std::string::npos);  // one request, one warning
  server.stop();
}

// llama.cpp's pair: the fixture's language model as a qwen2vl GGUF with a vocabulary, its tower as an
// mmproj GGUF in the converter's layout.
struct GgufPair {
  std::string lm, mmproj;
};
const GgufPair& gguf_pair() {
  static const GgufPair pair = [] {
    GgufPair p{test::temp_path("serve_vl_lm.gguf"), test::temp_path("serve_vl.mmproj.gguf")};
    test::write_vl_language_gguf(p.lm);
    write_mmproj(load_vision_model(test::fixtures_dir() + "/vl/qwen2_5_vl"), ImageProcessorConfig{}, p.mmproj,
                 DType::F32);
    return p;
  }();
  return pair;
}

TEST_CASE(
    "serve --mmproj: llama.cpp's GGUF pair takes images and generates run --mmproj's tokens, encoded on the "
    "CPU and on the emulated device",
    "[serve][images][cli][mmproj]") {
  const GgufPair& p = gguf_pair();
  const std::string text = "What is in the picture?";
  const std::string cmd = "'" + test::shardwise_bin() + "' run -m '" + p.lm + "' --mmproj '" + p.mmproj +
                          "' --image '" + image_path("img_56x56") + "' --prompt '" + text +
                          "' --greedy -n 10 --json --device cpu";
  std::string out;
  INFO(cmd);
  REQUIRE(test::run_command("(" + cmd + " 2>/dev/null)", &out) == 0);
  const json want = json::parse(out);
  for (const bool device : {false, true}) {
    INFO(device);
    std::vector<std::string> args = {"serve", "-m", p.lm, "--mmproj", p.mmproj, "--device", "cpu"};
    if (device) {
      args.back() = "emu";
      args.insert(args.end(), {"--vram-budget", "2800K", "--vision-budget", "1300K"});
    }
    ServeBinary server(args);
    const json j = server.post("/v1/chat/completions", image_chat("img_56x56", text, 10));
    CHECK(j["choices"][0]["tokens"] == want["generated_ids"]);
    CHECK(j["choices"][0]["message"]["content"] == want["text"]);
    CHECK(j["usage"]["prompt_tokens"].get<int64_t>() > 40);
    CHECK(server.metric(device ? kDeviceEncodes : kCpuEncodes) == 1);
    server.stop();
  }
  // Without --mmproj the language model GGUF takes no images.
  ServeBinary text_only({"serve", "-m", p.lm, "--device", "cpu"});
  const HttpResponse r =
      text_only.client->request("POST", "/v1/chat/completions", image_chat("img_56x56", text, 4).dump());
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Contains("takes no images"));
  text_only.stop();
}

TEST_CASE("serve: --vision-budget and --mmproj refuse what cannot work with one error line", "[serve][images][cli]") {
  const GgufPair& p = gguf_pair();
  const std::string vl = "-m '" + vl_dir() + "' ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {vl + "--device cpu --vision-budget 1M", "--vision-budget needs a device"},
      {vl + "--device emu --vram-budget 4M --vision-budget 4M", "leaves nothing of the VRAM budget"},
      {vl + "--device emu --vram-budget 4M --vision-budget 5M", "leaves nothing of the VRAM budget"},
      {vl + "--device emu --vram-budget 4M --vision-budget lots", "--vision-budget"},
      {vl + "--device emu --vram-budget 4M --vision-budget 0", "--vision-budget"},
      {vl + "--device emu --vram-budget 4M --vision-budget 1M --plan '" + test::temp_path("no_plan.json") + "'",
       "--vision-budget with --plan"},
      {"-m '" + model_name() + "' --device emu --vram-budget 4M --vision-budget 1M",
       "--vision-budget needs a vision-language model"},
      {"-m '" + p.lm + "' --device emu --vram-budget 4M --vision-budget 1M",
       "--vision-budget needs a vision-language model"},
      {"-m '" + model_name() + "' --device cpu --mmproj '" + p.mmproj + "'", "no M-RoPE sections"},
  };
  for (const auto& [args, what] : cases) {
    std::string out;
    const int rc = test::run_command("'" + test::shardwise_bin() + "' serve --port 0 " + args + " 2>&1", &out);
    INFO(args << ": " << out);
    CHECK(rc == 1);
    CHECK(out.rfind("error: ", 0) == 0);
    CHECK_THAT(out, Contains(what));
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
}

TEST_CASE("serve images: two image requests and a text one, batched on 3 slots, each get their tokens alone",
          "[serve][images]") {
  VlServer v(3, 16);  // prompts in chunks of 16 rows, beside the others' decode tokens
  const std::string text = "Describe it.";
  const RunResult a = run_reference("img_56x56", text, 8, "cpu"), b = run_reference("img_37x90", text, 8, "cpu"),
                  t = run_reference("", text, 8, "cpu");
  REQUIRE(a.tokens != b.tokens);  // the images matter
  const std::vector<json> bodies = {image_chat("img_56x56", text, 8), image_chat("img_37x90", text, 8), chat(text, 8)};
  v.gate.close_gate();
  std::vector<std::vector<int32_t>> got(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> clients;
  const std::string url = v.s->server->url();
  for (size_t i = 0; i < 3; ++i)
    clients.emplace_back([&, i] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        HttpClient client(parse_url(url), 60);
        const HttpResponse r = client.request("POST", "/v1/chat/completions", bodies[i].dump());
        if (r.status == 200) got[i] = json::parse(r.body)["choices"][0]["tokens"].get<std::vector<int32_t>>();
      } catch (const std::exception& e) {
        errors[i] = std::string(e.what()) + " after " +
                    std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s";
      }
    });
  // A step is held at the gate with every request in it or waiting for it (the scheduler may have taken
  // one or two before it stepped): then all three go on together.
  CHECK(eventually(
      [&] {
        const auto& m = v.s->server->metrics();
        return v.gate.waiting == 1 && m.in_flight + m.queued == 3;
      },
      60));
  v.gate.open_gate();
  for (auto& c : clients) c.join();
  for (const std::string& e : errors) CHECK(e.empty());
  CHECK(got[0] == a.tokens);
  CHECK(got[1] == b.tokens);
  CHECK(got[2] == t.tokens);
  CHECK(v.gate.max_batch >= 3);
}

TEST_CASE("serve images: the same text with another image reuses no image row of the cache", "[serve][images]") {
  VlServer v(1);
  const std::string text = "Describe it.";
  // Two images of the same grid: their prompts' ids are the same, only the image rows differ.
  const RunResult a = run_reference("img_100x70", text, 10, "cpu"), b = run_reference("img_64x300", text, 10, "cpu");
  REQUIRE(a.tokens != b.tokens);
  const TestServer::Reply first = v.s->post("/v1/chat/completions", image_chat("img_100x70", text, 10));
  CHECK(tokens_of(first) == a.tokens);
  const TestServer::Reply second = v.s->post("/v1/chat/completions", image_chat("img_64x300", text, 10));
  CHECK(tokens_of(second) == b.tokens);
  CHECK(first.body["usage"]["prompt_tokens"] == second.body["usage"]["prompt_tokens"]);
  // The cache reused the rows before the first image (the system message, the user's start), no more.
  const std::vector<int32_t> cached = v.s->server->scheduler().cached_tokens(0);
  const auto first_image = std::find(cached.begin(), cached.end(), -1) - cached.begin();
  REQUIRE(first_image > 10);
  CHECK(cached[static_cast<size_t>(first_image) - 1] == test::kVlVisionStart);
  CHECK(second.body["usage"]["prompt_tokens_details"]["cached_tokens"] == first_image);
  // The first image again, after the second: its own tokens, not the second's.
  CHECK(tokens_of(v.s->post("/v1/chat/completions", image_chat("img_100x70", text, 10))) == a.tokens);
  // The image tokens written as text, with no image, make a text prompt (with the system message an image
  // request gets): an image request after it reuses its rows before the image token, not that token's.
  json spelled = chat("<|vision_start|><|image_pad|><|vision_end|>" + text, 4);
  spelled["messages"].insert(spelled["messages"].begin(),
                             json{{"role", "system"}, {"content", "You are a helpful assistant."}});
  CHECK(v.s->post("/v1/chat/completions", spelled).status == 200);
  const TestServer::Reply after_text = v.s->post("/v1/chat/completions", image_chat("img_64x300", text, 10));
  CHECK(tokens_of(after_text) == b.tokens);
  CHECK(after_text.body["usage"]["prompt_tokens_details"]["cached_tokens"] == first_image);
}

TEST_CASE("serve images: bad image input is one 400 JSON error and the server goes on", "[serve][images]") {
  VlServer v(1);
  const std::string png = data_url("img_56x56");
  auto refused = [&](const json& body, const std::string& path, const std::string& what) {
    const TestServer::Reply r = v.s->post(path, body);
    INFO(what << ": " << r.text);
    CHECK(r.status == 400);
    REQUIRE(r.body.is_object());
    CHECK_THAT(r.body["error"]["message"].get<std::string>(), Contains(what));
    CHECK(tokens_of(v.s->post("/v1/chat/completions", chat("hi", 2))).size() == 2);  // still serving
  };
  refused(chat(json::array({image_part("https://example.com/cat.png")}), 4), "/v1/chat/completions", "data: URL");
  refused(chat(json::array({image_part("data:image/png;base64,iVBOR$w0K")}), 4), "/v1/chat/completions",
          "not valid base64");
  refused(chat(json::array({image_part("data:image/png;base64,iVBORw1=")}), 4), "/v1/chat/completions",
          "not valid base64");  // nonzero pad bits
  refused(chat(json::array({image_part("data:image/png;base64," + base64("not an image, only text"))}), 4),
          "/v1/chat/completions", "cannot read the request's image 1");
  refused(chat(json::array({image_part("data:text/plain;base64," + base64("hello"))}), 4), "/v1/chat/completions",
          "data:image/TYPE;base64");
  json nine = json::array();
  for (int i = 0; i < 9; ++i) nine.push_back(image_part(png));
  refused(chat(nine, 4), "/v1/chat/completions", "more than 8 images");
  refused({{"prompt", json::array({image_part(png)})}, {"max_tokens", 4}}, "/v1/completions",
          "/v1/chat/completions only");
  refused({{"messages", json::array({{{"role", "system"}, {"content", json::array({image_part(png)})}}})}},
          "/v1/chat/completions", "images go in user messages");
  // A text model takes no images.
  TestServer text_model;
  const TestServer::Reply r = text_model.post("/v1/chat/completions", chat(json::array({image_part(png)}), 4));
  CHECK(r.status == 400);
  CHECK_THAT(r.text, Contains("takes no images"));
  CHECK(text_model.post("/v1/chat/completions", chat("hi", 2)).status == 200);
}

TEST_CASE("serve images: content parts in order, base64 decoded strictly within its limit", "[serve][images]") {
  const json body = chat(json::array({{{"type", "text"}, {"text", "A"}},
                                      {{"type", "text"}, {"text", "B"}},
                                      {{"type", "image_url"}, {"image_url", "data:image/png;base64,AAEC"}},
                                      {{"type", "text"}, {"text", "C"}}}),
                         4);
  const ApiRequest rq = parse_request(Endpoint::Chat, body.dump());
  REQUIRE(rq.images.size() == 1);
  CHECK(rq.messages[0].content == "A\nBC");  // text parts joined by newlines, the image between B and C
  CHECK(rq.images[0].offset == 3);
  CHECK(rq.images[0].bytes == std::string("\0\1\2", 3));
  CHECK(decode_base64("aGk=", 16) == std::optional<std::string>("hi"));
  CHECK(decode_base64("aGVsbG8=", 16) == std::optional<std::string>("hello"));
  CHECK(decode_base64("", 16) == std::optional<std::string>(""));
  for (const char* bad : {"aGk", "aG=k", "aGk==", "a Gk", "aGl=", "====", "aGk=\n", "aGV-bG8="}) {
    INFO(bad);
    CHECK(!decode_base64(bad, 16));
  }
  CHECK(!decode_base64("aGVsbG8=", 4));  // 5 bytes over a limit of 4
  CHECK(decode_base64("aGVsbG8=", 5));
}

// A budget change while image requests run on the emulated device: the scheduler pauses them, the new
// runtime's caches are computed again from their image rows and M-RoPE positions (not the placeholders'
// embeddings), and each request gets the tokens it gets with no change.
TEST_CASE("serve images: the budget shrinks and grows under image requests and each keeps its tokens",
          "[serve][images][budget]") {
  auto source = open_weights(vl_dir());
  Tokenizer tok(*source);
  LoadedModel model(*source, 2);
  ImageEncoder encoder(load_vl_model(vl_dir(), source->spec()), source->tensor("token_embd.weight"), 2);
  const int32_t vs = encoder.tokens().vision_start_token_id, img = encoder.tokens().image_token_id;
  const int32_t ve = tok.find_token("<|vision_end|>");
  REQUIRE(ve >= 0);
  const int slots = 2;
  auto request = [&](const std::string& image, const std::string& text, int64_t n) {
    std::vector<int32_t> ids = {vs, img, ve};
    for (int32_t id : tok.encode(text, false, false)) ids.push_back(id);
    ApiImage a;
    a.bytes = test::read_file(image_path(image));
    EncodedPrompt e = encoder.encode(ids, {a}, 256);
    GenerationRequest r;
    r.prompt = e.ids;
    r.image = e.image;
    r.max_tokens = n;
    r.sampling = greedy();
    r.ignore_eos = true;
    return r;
  };
  const std::vector<GenerationRequest> reqs = {request("img_300x200", "Describe the picture.", 60),
                                               request("img_64x300", "What is tall here?", 50)};
  // Runs the requests on a fresh emulated set-up; `budgets`: changes made while they run.
  auto serve_them = [&](const std::vector<uint64_t>& budgets) {
    RunSetupOptions o;
    o.device = "emu";
    o.ctx = slots * 256;
    o.machine.hw = "h200-host";
    o.planner.budget_bytes = 64 << 20;
    o.runtime.slots = slots;
    RunSetup setup(model, o, reqs[0].prompt);
    SetupBudget control(setup);
    Metrics metrics;
    SchedulerOptions so;
    so.parallel = slots;
    so.prefill_chunk = 16;
    so.change_budget = [&](uint64_t b) { return control.change_budget(b); };
    so.engine = [&]() -> StepEngine& { return control.engine(); };
    Scheduler sched(setup.engine(), tok, metrics, so);
    std::vector<std::shared_ptr<Channel>> out;
    std::vector<Collected> got(reqs.size());
    for (const auto& r : reqs) {
      out.push_back(std::make_shared<Channel>());
      REQUIRE(sched.submit(r, out.back()) == Scheduler::Admit::Queued);
    }
    int refilled = 0;
    for (uint64_t b : budgets) {
      const size_t seen = got[0].tokens.size();
      while (got[0].tokens.size() < seen + 8 && !got[0].done)
        for (size_t i = 0; i < reqs.size(); ++i) collect(*out[i], got[i], std::chrono::milliseconds(5));
      auto c = std::make_shared<Channel>();
      REQUIRE(sched.change_budget(b, c) == Scheduler::Admit::Queued);
      const Collected change = finish(*c);
      INFO(change.text);
      REQUIRE(change.done);
      refilled += json::parse(change.text)["refilled_tokens"].get<int64_t>() > 0;
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      got[i] = finish(*out[i], got[i]);
      REQUIRE(got[i].done);
    }
    CHECK(refilled == static_cast<int>(budgets.size()));  // each change recomputed running caches
    return got;
  };
  const std::vector<Collected> alone = serve_them({});
  const std::vector<Collected> changed = serve_them({1500 << 10, 64 << 20});
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i);
    CHECK(alone[i].tokens.size() == static_cast<size_t>(reqs[i].max_tokens));
    CHECK(changed[i].tokens == alone[i].tokens);
  }
}

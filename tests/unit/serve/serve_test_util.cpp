// tests/unit/serve/serve_test_util.cpp — see serve_test_util.h.
#include "serve_test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <sstream>

#include "test_util.h"

extern char** environ;

namespace shardwise::test::serve {

Child::Child(const std::vector<std::string>& args) {
  static std::atomic<int> serial{0};
  err_path = temp_path("child_stderr_" + std::to_string(++serial) + ".txt");
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_s = {shardwise_bin()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  out = fds[0];
}

Child::~Child() {
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  if (out >= 0) close(out);
}

std::string Child::line() {
  std::string l;
  char c;
  while (read(out, &c, 1) == 1 && c != '\n') l += c;
  return l;
}

int Child::wait_exit() {
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::string model_name() {
  static const std::string name = [] {
    const std::string path = temp_path("serve_test_model.yaml");
    write_file(path,
               "name: serve_test\nfamily: llama\ndtype: f32\nhidden_size: 128\nnum_hidden_layers: 2\n"
               "num_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 32\nintermediate_size: 256\n"
               "vocab_size: 384\nrope_theta: 10000.0\nrms_norm_eps: 1.0e-05\ntie_word_embeddings: false\n"
               "max_position_embeddings: 4096\n");
    return "synthetic:" + path + "?seed=1";
  }();
  return name;
}

TestModel& test_model() {
  static TestModel m = [] {
    TestModel t;
    t.source = open_weights(model_name());
    t.tok = std::make_unique<Tokenizer>(*t.source);
    t.served = std::make_unique<LoadedModel>(*t.source, 2);
    t.reference = std::make_unique<LoadedModel>(*t.source, 2);
    t.chat_format = choose_chat_format(t.tok->chat_template(), t.source->spec().family, *t.tok).format;
    return t;
  }();
  return m;
}

ServedModel served_model(int64_t context, int64_t n_predict) {
  TestModel& m = test_model();
  ServedModel s;
  s.id = "serve-test";
  s.tokenizer = m.tok.get();
  s.chat_format = m.chat_format;
  s.context = context;
  s.vocab_size = m.source->spec().vocab_size;
  s.n_predict = n_predict;
  s.created = 1;
  return s;
}

std::vector<int32_t> completion_prompt(const std::string& text) {
  return test_model().tok->encode(text, true, true);
}

std::vector<int32_t> chat_prompt(const std::string& user) {
  return completion_prompt(apply_chat_template(test_model().chat_format, {{"user", user}}));
}

SamplingParams greedy() {
  SamplingParams p;
  p.greedy = true;
  return p;
}

Reference reference_generation(const std::vector<int32_t>& prompt, int64_t n, const SamplingParams& sampling,
                               bool ignore_eos, int64_t context) {
  TestModel& m = test_model();
  CpuEngine engine(m.reference->weights, m.reference->pool, context);
  GenerateOptions go;
  go.n_predict = n;
  go.prefill_chunk = 512;  // as `run` on the CPU
  go.sampling = sampling;
  if (!ignore_eos) go.stop_ids = m.tok->eog_ids();
  Reference r;
  r.tokens = generate(engine, prompt, go).generated;
  tok::TextStream stream;
  for (int32_t id : r.tokens)
    if (ignore_eos || !m.tok->is_eog(id)) r.text += stream.push(m.tok->piece(id));
  r.text += stream.finish();
  r.ended_by_eog = !ignore_eos && !r.tokens.empty() && m.tok->is_eog(r.tokens.back());
  return r;
}

GenerationRequest generation(const std::string& text, int64_t n, const SamplingParams& sampling) {
  GenerationRequest r;
  r.prompt = completion_prompt(text);
  r.max_tokens = n;
  r.sampling = sampling;
  r.ignore_eos = true;
  return r;
}

json SetupBudget::change_budget(uint64_t bytes) {
  const BudgetChange c = s_.change_budget(bytes);
  return {{"previous_vram_budget_bytes", c.previous_bytes},
          {"vram_budget_bytes", c.budget_bytes},
          {"device_peak_bytes", c.device_peak_bytes}};
}

void GatedEngine::step_batch(const std::vector<SeqStep>& seqs) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting;
    cv_.wait(lock, [&] { return open_; });
    --waiting;
  }
  if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us.load()));
  ++steps;
  if (static_cast<int64_t>(seqs.size()) > max_batch) max_batch = static_cast<int64_t>(seqs.size());
  inner_.step_batch(seqs);
}

void GatedEngine::close_gate() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = false;
}

void GatedEngine::open_gate() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
  }
  cv_.notify_all();
}

BackgroundRequest::BackgroundRequest(const std::string& url, const std::string& body, GatedEngine* gate)
    : gate_(gate), thread_([this, url, body] {
        try {
          HttpClient c(parse_url(url), 30);
          status_ = c.request("POST", "/v1/completions", body).status;
        } catch (const std::exception&) {
          status_ = -1;
        }
      }) {}

BackgroundRequest::~BackgroundRequest() {
  if (gate_) gate_->open_gate();
  if (thread_.joinable()) thread_.join();
}

int BackgroundRequest::status() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

TestServer::TestServer(ServerOptions options, int64_t context, int64_t n_predict) {
  TestModel& m = test_model();
  own_engine = std::make_unique<CpuEngine>(m.served->weights, m.served->pool, context);
  options.host = "127.0.0.1";
  options.port = 0;
  server = std::make_unique<Server>(*own_engine, served_model(context, n_predict), options);
  server->start();
  client = std::make_unique<HttpClient>(parse_url(server->url()), 30);
}

TestServer::TestServer(StepEngine& engine, ServerOptions options, int64_t context, Runtime* runtime) {
  options.host = "127.0.0.1";
  options.port = 0;
  server = std::make_unique<Server>(engine, served_model(context), options, runtime);
  server->start();
  client = std::make_unique<HttpClient>(parse_url(server->url()), 30);
}

TestServer::TestServer(StepEngine& engine, ServedModel model, ServerOptions options) {
  options.host = "127.0.0.1";
  options.port = 0;
  server = std::make_unique<Server>(engine, std::move(model), options);
  server->start();
  client = std::make_unique<HttpClient>(parse_url(server->url()), 60);
}

GatedServer::GatedServer(const ServerOptions& options, int64_t context)
    : cpu(test_model().served->weights, test_model().served->pool, context), gate(cpu), s(gate, options, context) {}

TestServer::~TestServer() {
  client.reset();
  server.reset();  // stops it before the engine goes
}

TestServer::Reply TestServer::send(const std::string& method, const std::string& path, const std::string& body,
                                   const HttpClient::Headers& h) {
  const HttpResponse r = client->request(method, path, body, h);
  Reply out;
  out.status = r.status;
  out.text = r.body;
  out.headers = r.headers;
  out.body = json::parse(r.body, nullptr, false);
  if (out.body.is_discarded()) out.body = nullptr;
  return out;
}

TestServer::Reply TestServer::get(const std::string& path, const HttpClient::Headers& h) {
  return send("GET", path, "", h);
}

TestServer::Reply TestServer::post(const std::string& path, const json& body, const HttpClient::Headers& h) {
  return send("POST", path, body.dump(), h);
}

TestServer::Reply TestServer::post_raw(const std::string& path, const std::string& body, const HttpClient::Headers& h) {
  return send("POST", path, body, h);
}

TestServer::Streamed TestServer::stream(const std::string& path, const json& body, const HttpClient::Headers& h) {
  Streamed s;
  const HttpResponse r = client->stream(path, body.dump(), h, [&](const std::string& data) {
    s.events.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    return true;
  });
  s.status = r.status;
  if (!r.body.empty()) s.error_body = json::parse(r.body, nullptr, false);
  return s;
}

double TestServer::metric(const std::string& name) {
  return metric_sample(get("/metrics").text, name);
}

double metric_sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, name.size() + 1, name + " ") == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

std::string streamed_text(const std::vector<json>& events) {
  std::string text;
  for (const json& e : events) {
    if (!e.is_object() || !e.contains("choices")) continue;
    for (const json& c : e["choices"]) {
      if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      if (c.contains("text")) text += c["text"].get<std::string>();
    }
  }
  return text;
}

std::string raw_http(uint16_t port, const std::string& bytes) {
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), port});
  net::write(sock, net::buffer(bytes));
  std::string reply;
  boost::system::error_code ec;
  char buf[4096];
  while (!ec) reply.append(buf, sock.read_some(net::buffer(buf), ec));
  return reply;
}

void send_and_hang_up(uint16_t port, const std::string& bytes, const std::function<bool()>& until) {
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), port});
  net::write(sock, net::buffer(bytes));
  eventually(until);
}

bool eventually(const std::function<bool()>& cond, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return cond();
}

void collect(Channel& c, Collected& into, std::chrono::milliseconds wait) {
  for (const shardwise::serve::Event& e : c.wait_take(wait)) {
    into.tokens.insert(into.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.kind == shardwise::serve::Event::Kind::Done) {
      into.done = true;
      into.text = e.text;
    }
    if (e.kind == shardwise::serve::Event::Kind::Failed) {
      into.failed = true;
      into.status = e.error.status;
    }
  }
}

Collected finish(Channel& c, Collected got) {
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (!got.done && !got.failed && Clock::now() < until) collect(c, got, std::chrono::milliseconds(100));
  return got;
}

}  // namespace shardwise::test::serve

// serve/server.cpp — see server.h. One Session per connection, on its own strand: it reads a request
// (the header first, so that a body over the limit is refused before it is read), answers it, and for a
// generation relays the Channel's events: a whole JSON response, or server-sent events written as HTTP
// chunks as they come. While a generation runs the session watches its socket: a client that closes it
// cancels the generation.
#include "serve/server.h"

#include <array>
#include <atomic>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <future>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "executor/runtime/runtime.h"
#include "serve/images.h"

namespace shardwise::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Session;

struct Server::Impl {
  Impl(StepEngine& engine, ServedModel served, const ServerOptions& options, Runtime* rt);
  void listen();
  void accept();
  void snapshot_device();
  void close_sessions();
  std::chrono::steady_clock::duration idle() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(opt.idle_timeout_s));
  }

  ServerOptions opt;
  ServedModel model;
  Runtime* runtime;
  Metrics metrics;
  std::atomic<int> connections{0}, busy{0};
  std::atomic<uint64_t> serial{0};
  std::mutex sessions_mutex;
  std::vector<std::weak_ptr<Session>> sessions;
  // Declared after what sessions touch: destroying the context destroys the sessions its handlers hold.
  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};  // acceptor, retry timer
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};
  std::optional<net::signal_set> signals;
  std::unique_ptr<Scheduler> scheduler;  // before the context goes: its worker posts to it
  // A vision-language model's image encoding: one thread, so that the encoder's work never holds an I/O
  // thread and requests with images are encoded one at a time. Joined by stop().
  std::unique_ptr<net::thread_pool> encoder;
  std::vector<std::thread> threads;
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stop_asked = false, stopped = false;
  uint16_t port = 0;
  std::string url;
};

namespace {

bool same_secret(const std::string& a, const std::string& b) {
  // Every byte compared whatever differs, so that the time taken does not tell how much of a key matched.
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// "Bearer KEY" (the scheme in any case, as RFC 9110 has it) with the server's key.
bool authorized(beast::string_view header, const std::string& key) {
  const beast::string_view scheme = "bearer ";
  if (header.size() < scheme.size() || !beast::iequals(header.substr(0, scheme.size()), scheme)) return false;
  return same_secret(std::string(header.substr(scheme.size())), key);
}

ApiError api_error(int status, const char* type, const char* code, std::string message) {
  return {status, type, code, std::move(message)};
}

const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

// The generation a request asks for, or the error its client gets instead.
struct Made {
  GenerationRequest gen;
  std::optional<ApiError> error;
};
Made make(const ApiRequest& api, const ServedModel& model) {
  Made m;
  try {
    m.gen = make_generation(api, model);
  } catch (const ApiFailure& f) {
    m.error = f.error;
  } catch (const std::exception& e) {
    m.error = api_error(500, "server_error", "internal_error", e.what());
  }
  return m;
}

// What follows a response: the next request, closing, or closing after reading what the client still
// sends (a request refused before its body was read: closing with unread bytes would reset the
// connection, and the client might lose the response).
enum class After { Next, Close, Drain };

}  // namespace

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, Server::Impl& srv, bool refuse)
      : stream_(std::move(socket)), srv_(srv), refuse_(refuse) {
    ++srv_.connections;
  }
  ~Session() {
    if (channel_) {
      channel_->cancel();
      --srv_.busy;
    }
    --srv_.connections;
  }
  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }
  // From any thread: closes the connection on its strand.
  void close_soon() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

 private:
  using Request = http::request<http::string_body>;

  void read_request();
  void on_header(beast::error_code ec);
  void on_request(beast::error_code ec);
  void read_failed(beast::error_code ec);
  void route(const Request& req);
  void respond(http::status status, std::string body, const char* type, After after = After::Next,
               const char* extra_name = nullptr, const std::string& extra_value = "");
  void respond_error(const ApiError& e, After after = After::Next);
  void end_exchange(After after);
  void close();
  void drain();
  void drain_more(std::shared_ptr<std::array<char, 8192>> scratch);

  void begin_generation(Endpoint endpoint, const Request& req);
  void submit_generation(const ApiRequest& api, GenerationRequest gen);
  void begin_budget(const Request& req);
  void notify();
  void watch_disconnect();
  void on_events();
  void apply(Event& e);
  void pump();
  void write_head();
  void on_stream_written(beast::error_code ec);
  void end_generation();

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server::Impl& srv_;
  bool refuse_;
  unsigned version_ = 11;
  bool keep_alive_ = true, closed_ = false;
  Clock::time_point arrival_;
  // The generation in progress.
  std::shared_ptr<Session> self_;  // holds the session while its generation runs
  std::shared_ptr<Channel> channel_;
  std::optional<ResponseWriter> writer_;
  std::atomic<bool> notify_pending_{false};
  bool streaming_ = false, return_tokens_ = false, started_ = false, head_begun_ = false, ended_ = false;
  bool admin_ = false;  // the channel carries a budget change's report, not a generation
  bool writing_ = false, last_written_ = false;
  std::string text_, out_, writing_buf_;
  std::vector<int32_t> tokens_;
  uint64_t watch_ = 0;  // the disconnect watch in progress; a stale one's completion is ignored
  http::response<http::empty_body> head_;
  std::optional<http::response_serializer<http::empty_body>> head_sr_;
};

void Session::read_request() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(16 * 1024);
  parser_->body_limit(srv_.opt.max_body_bytes);
  stream_.expires_after(srv_.idle());
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_header(beast::error_code ec) {
  if (ec) return read_failed(ec);
  arrival_ = Clock::now();
  const Request& req = parser_->get();
  version_ = req.version();
  keep_alive_ = req.keep_alive();
  const auto length = parser_->content_length();
  if (length && *length > srv_.opt.max_body_bytes) {
    ++srv_.metrics.http_requests;
    const bool sent = !beast::iequals(req[http::field::expect], "100-continue");  // else it waits for our word
    return respond_error(api_error(413, "invalid_request_error", "body_too_large",
                                   str_cat("the request body (", *length, " bytes) is larger than the limit of ",
                                           srv_.opt.max_body_bytes, " bytes")),
                         sent ? After::Drain : After::Close);
  }
  auto read_body = [self = shared_from_this()] {
    self->stream_.expires_after(self->srv_.idle());
    http::async_read(self->stream_, self->buffer_, *self->parser_,
                     [self](beast::error_code e, size_t) { self->on_request(e); });
  };
  if (beast::iequals(req[http::field::expect], "100-continue") && !parser_->is_done()) {
    net::async_write(stream_, net::buffer(kContinue, sizeof kContinue - 1),
                     [self = shared_from_this(), read_body](beast::error_code e, size_t) {
                       if (e) return self->close();
                       read_body();
                     });
    return;
  }
  read_body();
}

void Session::on_request(beast::error_code ec) {
  if (ec) return read_failed(ec);
  route(parser_->get());
}

void Session::read_failed(beast::error_code ec) {
  const bool http_error = ec.category() == beast::error_code(http::error::body_limit).category();
  if (!http_error || ec == http::error::end_of_stream) return close();  // closed, silent, or broken
  ++srv_.metrics.http_requests;
  if (ec == http::error::body_limit)
    return respond_error(
        api_error(413, "invalid_request_error", "body_too_large",
                  str_cat("the request body is larger than the limit of ", srv_.opt.max_body_bytes, " bytes")),
        After::Drain);
  if (ec == http::error::header_limit)
    return respond_error(
        api_error(431, "invalid_request_error", "headers_too_large", "the request headers are too large"),
        After::Drain);
  respond_error(api_error(400, "invalid_request_error", "bad_http", "malformed HTTP request: " + ec.message()),
                After::Drain);
}

void Session::route(const Request& req) {
  ++srv_.metrics.http_requests;
  if (refuse_)
    return respond_error(api_error(503, "unavailable_error", "too_many_connections",
                                   str_cat("more than ", srv_.opt.max_connections, " connections are open")),
                         After::Close);
  std::string target(req.target());
  target = target.substr(0, target.find('?'));
  const bool guarded = target.rfind("/v1/", 0) == 0 || target.rfind("/admin/", 0) == 0;
  if (guarded && !srv_.opt.api_key.empty() && !authorized(req[http::field::authorization], srv_.opt.api_key)) {
    srv_.metrics.reject(401);
    return respond(http::status::unauthorized,
                   error_json(api_error(401, "authentication_error", "invalid_api_key",
                                        "missing or wrong API key: send the header 'Authorization: Bearer KEY'")),
                   "application/json", After::Next, "WWW-Authenticate", "Bearer");
  }
  const struct {
    const char* path;
    http::verb method;
  } routes[] = {{"/health", http::verb::get},          {"/metrics", http::verb::get},
                {"/v1/models", http::verb::get},       {"/v1/chat/completions", http::verb::post},
                {"/v1/completions", http::verb::post}, {"/admin/budget", http::verb::post}};
  for (const auto& r : routes) {
    if (target != r.path) continue;
    if (req.method() != r.method) {
      srv_.metrics.reject(405);
      const std::string allow(http::to_string(r.method));
      return respond(
          http::status::method_not_allowed,
          error_json(api_error(405, "invalid_request_error", "method_not_allowed",
                               str_cat(r.path, " takes ", allow, ", not ", std::string(req.method_string())))),
          "application/json", After::Next, "Allow", allow);
    }
    if (target == "/health") return respond(http::status::ok, "{\"status\":\"ok\"}", "application/json");
    if (target == "/metrics") {
      if (srv_.model.images) srv_.metrics.set_vision(srv_.model.images->encodes());  // the encoder's counts now
      return respond(http::status::ok, srv_.metrics.prometheus(), "text/plain; version=0.0.4");
    }
    if (target == "/v1/models") return respond(http::status::ok, models_json(srv_.model), "application/json");
    if (target == "/admin/budget") return begin_budget(req);
    return begin_generation(target == "/v1/completions" ? Endpoint::Completion : Endpoint::Chat, req);
  }
  respond_error(api_error(404, "not_found_error", "not_found",
                          "no such endpoint: " + target +
                              " (GET /health, /metrics, /v1/models; POST /v1/chat/completions, /v1/completions, "
                              "/admin/budget)"));
}

void Session::respond(http::status status, std::string body, const char* type, After after, const char* extra_name,
                      const std::string& extra_value) {
  auto res = std::make_shared<http::response<http::string_body>>(status, version_);
  res->set(http::field::server, "shardwise");
  res->set(http::field::content_type, type);
  if (extra_name) res->set(extra_name, extra_value);
  res->keep_alive(keep_alive_ && after == After::Next);
  res->body() = std::move(body);
  res->prepare_payload();
  stream_.expires_after(srv_.idle());
  http::async_write(stream_, *res, [self = shared_from_this(), res, after](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->end_exchange(after == After::Next && !res->keep_alive() ? After::Close : after);
  });
}

void Session::respond_error(const ApiError& e, After after) {
  srv_.metrics.reject(e.status);
  respond(static_cast<http::status>(e.status), error_json(e), "application/json", after);
}

void Session::end_exchange(After after) {
  end_generation();
  if (after == After::Close) return close();
  if (after == After::Drain) return drain();
  read_request();
}

void Session::drain() {
  if (closed_) return;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(std::chrono::seconds(1));  // for all of it
  drain_more(std::make_shared<std::array<char, 8192>>());
}

void Session::drain_more(std::shared_ptr<std::array<char, 8192>> scratch) {
  stream_.async_read_some(net::buffer(*scratch), [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
    if (ec) return self->close();  // the client closed, or a second passed
    self->drain_more(scratch);
  });
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  end_generation();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

void Session::begin_generation(Endpoint endpoint, const Request& req) {
  auto api = std::make_shared<ApiRequest>();
  try {
    *api = parse_request(endpoint, req.body());
  } catch (const ApiFailure& f) {
    return respond_error(f.error);
  } catch (const std::exception& e) {
    return respond_error(api_error(500, "server_error", "internal_error", e.what()));
  }
  if (api->images.empty() || !srv_.encoder) {
    Made m = make(*api, srv_.model);
    if (m.error) return respond_error(*m.error);
    return submit_generation(*api, std::move(m.gen));
  }
  // The images are encoded on the encoder's thread; the session reads nothing meanwhile, and goes on on
  // its strand (unless it was closed: the server stops).
  net::post(*srv_.encoder, [self = shared_from_this(), api] {
    auto m = std::make_shared<Made>(make(*api, self->srv_.model));
    net::post(self->stream_.get_executor(), [self, api, m] {
      if (self->closed_) return;
      if (m->error) return self->respond_error(*m->error);
      self->submit_generation(*api, std::move(m->gen));
    });
  });
}

void Session::submit_generation(const ApiRequest& api, GenerationRequest gen) {
  if (srv_.opt.timeout_s > 0)
    gen.deadline =
        arrival_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(srv_.opt.timeout_s));
  writer_.emplace(api, srv_.model, ++srv_.serial);
  streaming_ = api.stream;
  return_tokens_ = api.return_tokens;
  std::weak_ptr<Session> weak = shared_from_this();
  channel_ = std::make_shared<Channel>([weak] {
    if (auto s = weak.lock()) s->notify();
  });
  switch (srv_.scheduler->submit(std::move(gen), channel_)) {
    case Scheduler::Admit::Queued:
      break;
    case Scheduler::Admit::QueueFull:
      channel_.reset();
      return respond_error(api_error(429, "rate_limit_error", "queue_full",
                                     str_cat("the server is busy: ", srv_.opt.queue_limit,
                                             " requests wait already (--queue-limit); retry later")));
    case Scheduler::Admit::Stopping:
      channel_.reset();
      return respond_error(api_error(503, "unavailable_error", "shutting_down", "the server is shutting down"),
                           After::Close);
  }
  self_ = shared_from_this();
  ++srv_.busy;
  watch_disconnect();
}

// POST /admin/budget {"vram_budget": "4G" or bytes}: the scheduler changes the budget between two steps;
// its report (or error) comes through the channel like a generation's end.
void Session::begin_budget(const Request& req) {
  uint64_t bytes = 0;
  try {
    bytes = parse_budget_request(req.body());
  } catch (const ApiFailure& f) {
    return respond_error(f.error);
  }
  if (!srv_.scheduler->can_change_budget())
    return respond_error(api_error(400, "invalid_request_error", "unsupported",
                                   "this server's budget cannot change (it runs on the CPU, or a saved --plan table)"));
  std::weak_ptr<Session> weak = shared_from_this();
  channel_ = std::make_shared<Channel>([weak] {
    if (auto s = weak.lock()) s->notify();
  });
  if (srv_.scheduler->change_budget(bytes, channel_) != Scheduler::Admit::Queued) {
    channel_.reset();
    return respond_error(api_error(503, "unavailable_error", "shutting_down", "the server is shutting down"),
                         After::Close);
  }
  admin_ = true;
  self_ = shared_from_this();
  ++srv_.busy;
}

// On the worker's thread: wake the session on its strand (once for any number of events).
void Session::notify() {
  if (notify_pending_.exchange(true)) return;
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->on_events(); });
}

// A readable socket is told apart by peeking at one byte without waiting: none at the end of the stream
// (the client closed it), would_block for a wake-up with nothing there (the watch goes on), a byte for a
// pipelined request (the client is still there: no more watching).
void Session::watch_disconnect() {
  const uint64_t id = ++watch_;
  stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id](beast::error_code ec) {
    if (id != self->watch_ || !self->channel_ || ec == net::error::operation_aborted) return;
    char byte;
    beast::error_code e = ec;
    if (!e) self->stream_.socket().non_blocking(true, e);
    if (!e) self->stream_.socket().receive(net::buffer(&byte, 1), tcp::socket::message_peek, e);
    if (e == net::error::would_block || e == net::error::try_again) return self->watch_disconnect();
    if (!e) return;            // a byte is there
    self->channel_->cancel();  // end of stream, or an error: the client is gone
    self->close();
  });
}

void Session::on_events() {
  notify_pending_ = false;
  if (!channel_) return;
  for (Event& e : channel_->take()) {
    apply(e);
    if (!channel_) return;  // answered whole
  }
  pump();
}

void Session::apply(Event& e) {
  switch (e.kind) {
    case Event::Kind::Started:
      started_ = true;
      if (streaming_) out_ += writer_->sse_start();
      break;
    case Event::Kind::Delta:
      if (!streaming_) {
        text_ += e.text;
        tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
      } else if (!e.text.empty() || return_tokens_) {
        out_ += writer_->sse_delta(e.text, e.tokens);
      }
      break;
    case Event::Kind::Done:
      if (admin_) {
        std::string body = std::move(e.text);
        end_generation();
        respond(http::status::ok, std::move(body), "application/json");
      } else if (streaming_) {
        out_ += writer_->sse_end(e.finish, e.usage);
        ended_ = true;
      } else {
        const std::string body = writer_->full(text_, tokens_, e.finish, e.usage);
        end_generation();
        respond(http::status::ok, body, "application/json");
      }
      break;
    case Event::Kind::Failed:
      if (streaming_ && head_begun_) {
        out_ += ResponseWriter::sse_error(e.error);
        ended_ = true;
      } else {
        end_generation();
        respond_error(e.error);
      }
      break;
  }
}

void Session::pump() {
  if (writing_ || !streaming_ || closed_) return;
  if (!head_begun_) {
    if (started_) write_head();
    return;
  }
  if (!out_.empty()) {
    writing_buf_ = std::move(out_);
    out_.clear();
    writing_ = true;
    stream_.expires_after(srv_.idle());
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->on_stream_written(ec); };
    if (version_ >= 11)
      net::async_write(stream_, http::make_chunk(net::buffer(writing_buf_)), done);
    else
      net::async_write(stream_, net::buffer(writing_buf_), done);
    return;
  }
  if (!ended_ || last_written_) return;
  last_written_ = true;
  if (version_ < 11) return end_exchange(After::Close);  // HTTP/1.0: the end of the body is the connection's
  writing_ = true;
  stream_.expires_after(srv_.idle());
  net::async_write(stream_, http::make_chunk_last(),
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_stream_written(ec); });
}

void Session::write_head() {
  head_ = http::response<http::empty_body>(http::status::ok, version_);
  head_.set(http::field::server, "shardwise");
  head_.set(http::field::content_type, "text/event-stream");
  head_.set(http::field::cache_control, "no-cache");
  if (version_ >= 11)
    head_.chunked(true);
  else
    keep_alive_ = false;
  head_.keep_alive(keep_alive_);
  head_sr_.emplace(head_);
  head_begun_ = true;
  writing_ = true;
  stream_.expires_after(srv_.idle());
  http::async_write_header(stream_, *head_sr_,
                           [self = shared_from_this()](beast::error_code ec, size_t) { self->on_stream_written(ec); });
}

void Session::on_stream_written(beast::error_code ec) {
  writing_ = false;
  if (ec) {  // the client is gone or stopped reading
    if (channel_) channel_->cancel();
    return close();
  }
  if (last_written_ && out_.empty()) return end_exchange(keep_alive_ ? After::Next : After::Close);
  pump();
}

void Session::end_generation() {
  if (channel_) {
    channel_->cancel();  // no-op for a generation that ended; stops one still running
    channel_.reset();
    ++watch_;
    beast::error_code ignored;
    if (stream_.socket().is_open()) stream_.socket().cancel(ignored);  // the disconnect watch
    --srv_.busy;
  }
  writer_.reset();
  streaming_ = return_tokens_ = started_ = head_begun_ = ended_ = last_written_ = admin_ = false;
  text_.clear();
  out_.clear();
  tokens_.clear();
  head_sr_.reset();
  self_.reset();  // last: the caller's handler still holds the session
}

Server::Impl::Impl(StepEngine& engine, ServedModel served, const ServerOptions& options, Runtime* rt)
    : opt(options), model(std::move(served)), runtime(rt), metrics(options.parallel) {
  SW_CHECK(opt.io_threads >= 1, "serve: io_threads ", opt.io_threads, " must be at least 1");
  listen();
  snapshot_device();
  SchedulerOptions so;
  so.parallel = opt.parallel;
  so.queue_limit = opt.queue_limit;
  so.prefill_chunk = opt.prefill_chunk;
  so.after_request = [this] { snapshot_device(); };
  if (opt.budget) {
    // On the worker: the runtime the device metrics read is the new one (or the old budget's again).
    so.change_budget = [this](uint64_t bytes) {
      try {
        nlohmann::json r = opt.budget->change_budget(bytes);
        runtime = opt.budget->runtime();
        return r;
      } catch (...) {
        runtime = opt.budget->runtime();
        throw;
      }
    };
    so.engine = [this]() -> StepEngine& { return opt.budget->engine(); };
  }
  scheduler = std::make_unique<Scheduler>(engine, *model.tokenizer, metrics, so);
  if (model.images) encoder = std::make_unique<net::thread_pool>(1);
}

namespace {

// Opens `acceptor` listening on host:port; one error line naming the flags when it cannot.
void open_listener(net::io_context& ioc, tcp::acceptor& acceptor, const std::string& host, uint16_t port) {
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) fail("--host ", host, ": cannot resolve it (", ec.message(), ")");
  const tcp::endpoint at = found.begin()->endpoint();
  acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", host, " port ", port, ": ", ec.message(), " (--host, --port)");
}

}  // namespace

void check_listen_address(const std::string& host, uint16_t port) {
  net::io_context ioc;
  tcp::acceptor acceptor(ioc);
  open_listener(ioc, acceptor, host, port);
  beast::error_code ignored;
  acceptor.close(ignored);
}

void Server::Impl::listen() {
  open_listener(ioc, acceptor, opt.host, opt.port);
  port = acceptor.local_endpoint().port();
  const net::ip::address a = acceptor.local_endpoint().address();
  url = "http://" + (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(port);
}

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open() || ec == net::error::operation_aborted) return;
    if (ec) {  // e.g. out of file descriptors: try again shortly instead of spinning
      log_warn("serve: accepting a connection failed: ", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code) { accept(); });
      return;
    }
    const bool refuse = connections.load() >= opt.max_connections;
    auto session = std::make_shared<Session>(std::move(socket), *this, refuse);
    {
      std::lock_guard<std::mutex> lock(sessions_mutex);
      sessions.erase(std::remove_if(sessions.begin(), sessions.end(), [](const auto& w) { return w.expired(); }),
                     sessions.end());
      sessions.push_back(session);
    }
    session->start();
    accept();
  });
}

void Server::Impl::snapshot_device() {
  if (!runtime) return;
  const RuntimeMemory m = runtime->memory();
  metrics.set_device({m.budget_bytes, m.arena_peak_bytes, m.device_peak_bytes, m.context_bytes});
  runtime->forget_steps();
}

void Server::Impl::close_sessions() {
  std::lock_guard<std::mutex> lock(sessions_mutex);
  for (const auto& w : sessions)
    if (auto s = w.lock()) s->close_soon();
}

Server::Server(StepEngine& engine, ServedModel model, const ServerOptions& options, Runtime* runtime)
    : impl_(std::make_unique<Impl>(engine, std::move(model), options, runtime)) {}

Server::~Server() {
  stop();
}

uint16_t Server::port() const {
  return impl_->port;
}
std::string Server::url() const {
  return impl_->url;
}
Metrics& Server::metrics() {
  return impl_->metrics;
}
Scheduler& Server::scheduler() {
  return *impl_->scheduler;
}
const ServedModel& Server::model() const {
  return impl_->model;
}

void Server::start() {
  SW_CHECK(impl_->threads.empty(), "serve: the server was started already");
  impl_->accept();
  for (int i = 0; i < impl_->opt.io_threads; ++i)
    impl_->threads.emplace_back([this] {
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {  // a handler's failure ends its connection, not the server
          log_warn("serve: ", e.what());
        }
      }
    });
}

void Server::stop_on_signals() {
  impl_->signals.emplace(impl_->ioc, SIGINT, SIGTERM);
  impl_->signals->async_wait([this](beast::error_code ec, int) {
    if (!ec) request_stop();
  });
}

void Server::wait() {
  std::unique_lock<std::mutex> lock(impl_->stop_mutex);
  impl_->stop_cv.wait(lock, [&] { return impl_->stop_asked; });
}

void Server::request_stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mutex);
    impl_->stop_asked = true;
  }
  impl_->stop_cv.notify_all();
}

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.stop_mutex);
    if (s.stopped) return;
    s.stopped = true;
    s.stop_asked = true;
  }
  s.stop_cv.notify_all();
  auto stop_accepting = [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
    if (s.signals) s.signals->cancel(ignored);
  };
  if (s.threads.empty()) {
    stop_accepting();
  } else {  // on the acceptor's strand, and done before anything else: no connection is accepted after
    std::promise<void> closed;
    net::post(s.accept_strand, [&] {
      stop_accepting();
      closed.set_value();
    });
    closed.get_future().wait();
  }
  s.scheduler->stop();  // what waits or runs ends: the sessions tell their clients
  for (int i = 0; i < 100 && s.busy.load() > 0 && !s.threads.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.close_sessions();
  for (int i = 0; i < 100 && s.connections.load() > 0 && !s.threads.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  if (s.encoder) s.encoder->join();  // an encoding in progress ends; what it posts is never run
}

}  // namespace shardwise::serve

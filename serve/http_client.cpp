// serve/http_client.cpp — see http_client.h. Every operation is asynchronous with the stream's
// deadline, run to its end on the client's own io_context: a blocking call that cannot hang.
#include "serve/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <optional>

#include "core/error.h"

namespace shardwise::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
constexpr uint64_t kMaxBody = uint64_t(64) << 20;  // a whole (not streamed) response

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

Url parse_url(const std::string& text) {
  const std::string scheme = "http://";
  if (text.compare(0, scheme.size(), scheme) != 0)
    fail("--url ", text, ": give http://HOST:PORT (https is not supported)");
  std::string rest = text.substr(scheme.size());
  Url u;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  }
  const size_t bracket = rest.find(']');
  const size_t colon = rest.find(':', bracket == std::string::npos ? 0 : bracket);
  u.host = rest.substr(0, colon);
  if (colon != std::string::npos) u.port = rest.substr(colon + 1);
  if (u.host.size() > 1 && u.host.front() == '[' && u.host.back() == ']') u.host = u.host.substr(1, u.host.size() - 2);
  if (u.host.empty() || u.port.empty() || u.port.find_first_not_of("0123456789") != std::string::npos)
    fail("--url ", text, ": give http://HOST:PORT");
  return u;
}

struct HttpClient::Impl {
  Url url;
  double timeout_s;
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  bool connected = false;

  // Starts one asynchronous operation and runs it to its end; its error.
  template <class Start>
  beast::error_code run(Start&& start) {
    beast::error_code result = net::error::would_block;
    stream.expires_after(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s)));
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  void connect() {
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    const auto found = resolver.resolve(url.host, url.port, ec);
    if (ec) fail("cannot resolve ", url.host, ": ", ec.message());
    ec = run([&](auto&& done) { stream.async_connect(found, done); });
    if (ec) fail("cannot connect to ", url.host, ":", url.port, ": ", ec.message());
    buffer.clear();
    connected = true;
  }

  http::request<http::string_body> make(const std::string& method, const std::string& path, const std::string& body,
                                        const Headers& headers) const {
    http::request<http::string_body> req{http::string_to_verb(method), url.prefix + path, 11};
    req.set(http::field::host, url.host + ":" + url.port);
    req.set(http::field::user_agent, "shardwise");
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : headers) req.set(name, value);
    req.body() = body;
    req.prepare_payload();
    return req;
  }

  using Parser = http::response_parser<http::string_body>;

  // Sends `req` and reads the response's header into a new parser `p` with that body limit (none:
  // unbounded). A GET on a kept-alive connection the server closed meanwhile is sent again once on a new
  // one; a POST never is (the server may have taken it: a generation must not run twice).
  void send(http::request<http::string_body>& req, std::optional<Parser>& p, boost::optional<uint64_t> limit) {
    for (int attempt = 0;; ++attempt) {
      p.emplace();
      p->body_limit(limit);
      const bool reused = connected;
      if (!connected) connect();
      beast::error_code ec = run([&](auto&& done) { http::async_write(stream, req, done); });
      if (!ec) ec = run([&](auto&& done) { http::async_read_header(stream, buffer, *p, done); });
      if (!ec) return;
      close();
      if (!reused || attempt > 0 || ec == beast::error::timeout || req.method() != http::verb::get)
        fail("request to ", url.host, ":", url.port, " failed: ", ec.message());
    }
  }

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
    connected = false;
  }

  static void take_header(const Parser& p, HttpResponse& r) {
    r.status = static_cast<int>(p.get().result_int());
    for (const auto& f : p.get().base()) r.headers[lower(std::string(f.name_string()))] = std::string(f.value());
  }

  void read_body(Parser& p, HttpResponse& r) {
    const beast::error_code ec = run([&](auto&& done) { http::async_read(stream, buffer, p, done); });
    if (ec) {
      close();
      fail("reading the response from ", url.host, ":", url.port, " failed: ", ec.message());
    }
    r.body = std::move(p.get().body());
    if (!p.get().keep_alive()) close();
  }

  // Feeds the complete lines of `pending` that are SSE data to on_data; false when it asked to stop.
  static bool dispatch_lines(std::string& pending, HttpResponse& r,
                             const std::function<bool(const std::string&)>& on_data) {
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.compare(0, 5, "data:") == 0) {
        const size_t at = line.size() > 5 && line[5] == ' ' ? 6 : 5;
        if (!on_data(line.substr(at))) return false;
      } else if (!line.empty()) {
        r.body += line + "\n";
      }
    }
    pending.erase(0, start);
    return true;
  }
};

HttpClient::HttpClient(Url url, double timeout_s) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->timeout_s = timeout_s;
}

HttpClient::~HttpClient() {
  impl_->close();
}

void HttpClient::close() {
  impl_->close();
}

HttpResponse HttpClient::request(const std::string& method, const std::string& path, const std::string& body,
                                 const Headers& headers) {
  auto req = impl_->make(method, path, body, headers);
  std::optional<Impl::Parser> p;
  impl_->send(req, p, kMaxBody);
  HttpResponse r;
  Impl::take_header(*p, r);
  impl_->read_body(*p, r);
  return r;
}

HttpResponse HttpClient::stream(const std::string& path, const std::string& body, const Headers& headers,
                                const std::function<bool(const std::string&)>& on_data) {
  auto req = impl_->make("POST", path, body, headers);
  std::optional<Impl::Parser> parser;
  impl_->send(req, parser, kMaxBody);
  Impl::Parser& p = *parser;
  HttpResponse r;
  Impl::take_header(p, r);
  if (r.headers["content-type"].find("text/event-stream") == std::string::npos) {
    impl_->read_body(p, r);
    return r;
  }
  p.body_limit(boost::none);  // read piece by piece, each piece taken out
  std::string pending;
  while (!p.is_done()) {
    const beast::error_code ec =
        impl_->run([&](auto&& done) { http::async_read_some(impl_->stream, impl_->buffer, p, done); });
    if (ec) {
      impl_->close();
      fail("reading the event stream from ", impl_->url.host, ":", impl_->url.port, " failed: ", ec.message());
    }
    pending += p.get().body();
    p.get().body().clear();
    if (!Impl::dispatch_lines(pending, r, on_data)) {
      impl_->close();
      r.aborted = true;
      return r;
    }
  }
  pending += "\n";
  Impl::dispatch_lines(pending, r, on_data);
  if (!p.get().keep_alive()) impl_->close();
  return r;
}

}  // namespace shardwise::serve

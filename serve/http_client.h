// serve/http_client.h — a small HTTP/1.1 client on Boost.Beast for the load generator and the tests:
// one keep-alive connection to a server, each request bounded by a deadline, and responses whose body
// is server-sent events read event by event as they arrive.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::serve {

// "http://HOST[:PORT][/PREFIX]"; throws Error for another scheme (https is not supported) or no host.
struct Url {
  std::string host, port = "80";
  std::string prefix;  // without a trailing '/': requests go to PREFIX + path
};
Url parse_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // a streamed response: what was not an SSE data line
  bool aborted = false;                        // stream(): the caller stopped reading and the connection was closed
};

class HttpClient {
 public:
  using Headers = std::vector<std::pair<std::string, std::string>>;

  // `timeout_s` bounds connecting and each read or write (a streamed response may take longer in all).
  explicit HttpClient(Url url, double timeout_s = 60);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One request (a body is sent as JSON). Throws Error when the connection fails or times out; an HTTP
  // error status is a response like any other.
  HttpResponse request(const std::string& method, const std::string& path, const std::string& body = "",
                       const Headers& headers = {});
  // POST whose response may be server-sent events: on_data gets each event's data (the text after
  // "data: ") as it arrives; returning false closes the connection there, as a client that goes away.
  HttpResponse stream(const std::string& path, const std::string& body, const Headers& headers,
                      const std::function<bool(const std::string&)>& on_data);
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwise::serve

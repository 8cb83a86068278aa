// core/error.h — the one exception type of shardwise and helpers to build its messages.
// Every user-facing failure is an Error whose message is one line: what (file, offset, field) and
// what to do. Code never aborts on bad input; the CLI prints the message and exits non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardwise {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates any streamable values into a string: str_cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Items as a message lists them: "a, b, c".
inline std::string comma_list(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& x : items) s += (s.empty() ? "" : ", ") + x;
  return s;
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

// Checks a condition on untrusted input; the message is only built on failure.
#define SW_CHECK(cond, ...)                      \
  do {                                           \
    if (!(cond)) ::shardwise::fail(__VA_ARGS__); \
  } while (0)

}  // namespace shardwise

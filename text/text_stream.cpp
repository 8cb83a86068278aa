// text/text_stream.cpp — streaming text with UTF-8 and stop-string hold-back.
#include "text/text_stream.h"

#include <algorithm>

#include "text/unicode.h"

namespace shardwise::tok {

TextStream::TextStream(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::emit(size_t n) {
  std::string out = utf8_sanitize(pending_.substr(0, n));
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::push(const std::string& bytes) {
  if (stopped_) return std::string();
  pending_ += bytes;
  // The earliest stop string in the pending text ends the stream there.
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at != std::string::npos && (first == std::string::npos || at < first)) {
      first = at;
      hit_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = emit(first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string, and an incomplete
  // UTF-8 sequence.
  size_t hold = utf8_incomplete_tail(pending_);
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return emit(pending_.size() - hold);
}

std::string TextStream::finish() {
  if (stopped_) return std::string();
  return emit(pending_.size());
}

}  // namespace shardwise::tok

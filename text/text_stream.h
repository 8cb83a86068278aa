// text/text_stream.h — turning token pieces into printable text as they arrive.
// Bytes that end in an incomplete UTF-8 sequence are held back until it completes (as llama.cpp
// does), and so is any tail that could be the start of a stop string: a stop string is never
// printed, and nothing after it is. What is returned is always valid UTF-8.
#pragma once

#include <string>
#include <vector>

namespace shardwise::tok {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_strings = {});

  // Adds the bytes of one token; returns the text that can be printed now ("" once stopped).
  std::string push(const std::string& bytes);
  // End of generation: returns what was held back (a cut-off UTF-8 sequence becomes U+FFFD).
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& stop_string() const { return hit_; }  // the stop string that ended it
  const std::string& text() const { return text_; }        // everything returned so far

 private:
  std::string emit(size_t n);
  std::vector<std::string> stops_;
  std::string pending_, text_, hit_;
  bool stopped_ = false;
};

}  // namespace shardwise::tok

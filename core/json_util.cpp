// core/json_util.cpp — nesting depth of JSON text and short descriptions of values (json_util.h).
#include "core/json_util.h"

#include <algorithm>

#include "core/error.h"

namespace shardwise {

size_t json_nesting_depth(const char* begin, const char* end) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (c == '\\')
        ++p;  // the escaped character, whatever it is
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_depth(const char* begin, const char* end, const std::string& ctx) {
  const size_t d = json_nesting_depth(begin, end);
  if (d > kMaxJsonDepth)
    fail(ctx, ": JSON nested ", d, " deep, more than ", kMaxJsonDepth, " levels (the file is corrupt)");
}

std::string json_brief(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  const std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

}  // namespace shardwise

// core/json_util.h — guards for untrusted JSON (model configs, safetensors headers, profiles, plan
// tables, results lines). nlohmann::json parses any nesting without recursion, but dumping, copying or
// comparing a value recurses through it: a value nested 200000 deep (a 400 KB file) overflows the
// stack there. Readers refuse documents nested deeper than kMaxJsonDepth before parsing them, and show
// values in messages with json_brief (never a dump of a subtree).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace shardwise {

// Far above any file we read (a plan table nests 6 deep, a profile 5, a config.json 3).
constexpr size_t kMaxJsonDepth = 256;

// The deepest nesting of arrays and objects in JSON text (strings skipped): one linear scan.
size_t json_nesting_depth(const char* begin, const char* end);
// Throws Error "<ctx>: JSON nested N deep, more than 256 levels" for text nested deeper than allowed.
void check_json_depth(const char* begin, const char* end, const std::string& ctx);
inline void check_json_depth(const std::string& text, const std::string& ctx) {
  check_json_depth(text.data(), text.data() + text.size(), ctx);
}

// A value for a message: a scalar as written (cut at 40 characters), else "an object" or "an array".
std::string json_brief(const nlohmann::json& v);

}  // namespace shardwise

// core/file_util.h — reading a whole (small) text file: configs, JSON, YAML, plan tables.
#pragma once

#include <string>

namespace shardwise {

// The file's bytes; throws Error("<path>: ...") when it cannot be read or is a directory (whose
// read would give no bytes, taken for an empty file).
std::string read_text_file(const std::string& path);

// Refuses, before any work, an output path that cannot be written: its directory missing or not
// writable, or the path a directory. `what` names the flag (e.g. "-o").
void check_output_path(const std::string& path, const std::string& what);

}  // namespace shardwise

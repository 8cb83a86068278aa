// core/file_util.h — reading a whole (small) text file: configs, JSON, YAML, plan tables.
#pragma once

#include <string>

namespace shardwise {

// The file's bytes; throws Error("<path>: cannot open") when it cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace shardwise

// core/file_util.cpp — whole-file reading (see file_util.h).
#include "core/file_util.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace shardwise {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) fail(path, ": read failed");
  return os.str();
}

}  // namespace shardwise

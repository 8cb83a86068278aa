// core/file_util.cpp — whole-file reading (see file_util.h).
#include "core/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace shardwise {

std::string read_text_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail(path, ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) fail(path, ": read failed");
  return os.str();
}

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) fail(what, ": the output path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail(what, " ", path, ": is a directory; give a file name");
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(what, " ", path, ": the directory ", dir, " does not exist");
  if (::access(dir.c_str(), W_OK) != 0) fail(what, " ", path, ": the directory ", dir, " is not writable");
}

}  // namespace shardwise

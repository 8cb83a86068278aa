// oracle/results.cpp — crash-safe JSONL appends and reading results back for --resume.
#include "oracle/results.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/json_util.h"

namespace shardwise {

ResultsWriter::ResultsWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open for appending (", std::strerror(errno), ")");
  // One writer per file: a second sweep would measure under the first one's load and write its rows
  // again. The lock goes with the descriptor (released when the writer, or the process, ends).
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      fail(path,
           ": another sweep is writing this file (it holds its lock): wait for it to end, or choose another --out");
    fail(path, ": cannot lock the file (", std::strerror(err), ")");
  }
  // A sweep killed inside write() could leave a torn last line; end it so the next line is whole.
  struct stat st;
  if (::fstat(fd_, &st) == 0 && st.st_size > 0) {
    const int rd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    char last = '\n';
    if (rd >= 0) {
      if (::pread(rd, &last, 1, st.st_size - 1) != 1) last = '\n';
      ::close(rd);
    }
    if (last != '\n' && ::write(fd_, "\n", 1) != 1) fail(path, ": write failed (", std::strerror(errno), ")");
  }
}

ResultsWriter::~ResultsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultsWriter::append(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  // One write() per line: with O_APPEND the line lands whole at the end.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()))
    fail(path_, ": short write (", n < 0 ? std::strerror(errno) : "disk full?", ")");
  if (::fsync(fd_) != 0) fail(path_, ": fsync failed (", std::strerror(errno), ")");
}

RowKey row_key(const nlohmann::json& row) {
  return RowKey{row.at("config_id").get<std::string>(), row.at("tier").get<int64_t>(),
                row.at("schedule").get<std::string>()};
}

namespace {
// The fields a resumed sweep reads of each record, with their types: a line without one of them is
// no record of this file (an edit, or a line torn where it still parses) and is skipped.
bool complete(const nlohmann::json& j, const std::string& kind) {
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string(); };
  if (kind == "sweep") return str("experiment_hash");
  return str("config_id") && j.contains("tier") && j["tier"].is_number_integer() && str("schedule") && str("git_rev") &&
         str("device") && str("profile_hash");
}
}  // namespace

ExistingResults read_results(const std::string& path) {
  ExistingResults r;
  std::ifstream in(path, std::ios::binary);
  if (!in) return r;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
    if (json_nesting_depth(line.data(), line.data() + line.size()) > kMaxJsonDepth) {  // no line we write nests so
      ++r.bad_lines;
      continue;
    }
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      ++r.bad_lines;
      continue;
    }
    if (!j.is_object()) {
      ++r.bad_lines;
      continue;
    }
    const std::string kind = j.contains("record") && j["record"].is_string() ? j["record"].get<std::string>() : "row";
    if ((kind == "sweep" || kind == "row") && !complete(j, kind)) {
      ++r.bad_lines;
      continue;
    }
    if (kind == "sweep") {
      r.sweeps.push_back(std::move(j));
    } else if (kind == "row") {
      if (!r.keys.insert(row_key(j)).second) ++r.duplicate_rows;
      r.rows.push_back(std::move(j));
    }
  }
  return r;
}

}  // namespace shardwise

// oracle/results.cpp — crash-safe JSONL appends and reading results back for --resume.
#include "oracle/results.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace shardwise {

ResultsWriter::ResultsWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot open for appending (", std::strerror(errno), ")");
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
  // One write() per line: with O_APPEND the line lands whole at the end, even with several shards
  // appending to the same file.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()))
    fail(path_, ": short write (", n < 0 ? std::strerror(errno) : "disk full?", ")");
  if (::fsync(fd_) != 0) fail(path_, ": fsync failed (", std::strerror(errno), ")");
}

RowKey row_key(const nlohmann::json& row) {
  return RowKey{row.at("config_id").get<std::string>(), row.at("tier").get<int64_t>(), row.at("schedule").get<std::string>()};
}

ExistingResults read_results(const std::string& path) {
  ExistingResults r;
  std::ifstream in(path, std::ios::binary);
  if (!in) return r;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
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
    const std::string kind = j.value("record", "row");
    if (kind == "sweep") {
      r.sweeps.push_back(std::move(j));
    } else if (kind == "row") {
      try {
        if (!r.keys.insert(row_key(j)).second) ++r.duplicate_rows;
      } catch (const nlohmann::json::exception&) {
        ++r.bad_lines;
        continue;
      }
      r.rows.push_back(std::move(j));
    }
  }
  return r;
}

}  // namespace shardwise

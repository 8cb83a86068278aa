// oracle/results.h — the oracle's results file: JSON lines, appended crash-safely. Each line is
// written with one write() to a file opened with O_APPEND and fsync'ed, so a killed sweep leaves
// only whole lines (or, at worst, one torn last line, which readers skip and writers terminate).
// Lines carry "record": "row" (one per configuration × tier × schedule, DESIGN.md §6 keys), "sweep"
// (one per invocation: the effective experiment, revision, machine, shard) or "sweep_end".
// One writer at a time: the writer holds an exclusive flock on the file and a second one is refused
// (shards may share a file one after the other, not at once).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace shardwise {

class ResultsWriter {
 public:
  // Opens (creating) `path` for appending and locks it; throws Error when another writer holds it.
  // If the file ends in a torn line, terminates it first.
  explicit ResultsWriter(const std::string& path);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  // One line, one write(), then fsync. Throws Error on a short write.
  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// (config_id, tier, schedule name): the key of a row.
using RowKey = std::tuple<std::string, int64_t, std::string>;

struct ExistingResults {
  std::vector<nlohmann::json> rows;    // "row" records, in file order
  std::vector<nlohmann::json> sweeps;  // "sweep" records
  std::set<RowKey> keys;
  int duplicate_rows = 0;  // rows whose key appeared before (never written by a correct sweep)
  int bad_lines = 0;       // torn, unparsable or incomplete lines (skipped): a row lacking a key field,
                           // git_rev, device or profile_hash (as strings), a sweep lacking experiment_hash
};

// Reads a results file; a missing file gives an empty result.
ExistingResults read_results(const std::string& path);

RowKey row_key(const nlohmann::json& row);

}  // namespace shardwise

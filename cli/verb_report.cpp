// cli/verb_report.cpp — `shardwise report`: the planner-accuracy report of an oracle results file,
// drawn by the Python package (oracle/report.h).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"
#include "oracle/report.h"
#include "oracle/results.h"

namespace shardwise::cli {
namespace {

struct ReportArgs {
  std::string results, out;
};

// The report reads any path it is given; what is not a results file is refused here in one line
// (Python would answer a directory or a file of other text with a traceback).
void check_report_paths(const ReportArgs& a) {
  const char* what = "give the JSON-lines file `shardwise sweep --out` wrote";
  struct stat st;
  if (::stat(a.results.c_str(), &st) != 0) fail(a.results, ": no such file (", what, ")");
  if (S_ISDIR(st.st_mode)) fail(a.results, ": is a directory (", what, ")");
  if (!S_ISREG(st.st_mode) || !std::ifstream(a.results)) fail(a.results, ": cannot read it (", what, ")");
  const ExistingResults r = read_results(a.results);
  if (r.rows.empty())
    fail(a.results, ": holds no result rows (", r.bad_lines,
         r.bad_lines == 1 ? " line is not a results record, " : " lines are not results records, ", r.sweeps.size(),
         r.sweeps.size() == 1 ? " sweep header" : " sweep headers", "): ", what);
  if (r.rows.front().value("part", "") == "vision")
    fail(a.results,
         ": a vision encoder sweep (an experiment with images): its table is "
         "scripts/analysis/vision_sweep_table.py ",
         a.results);
  if (::stat(a.out.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    fail("--out ", a.out, ": is a file; give the folder for report.md and its plots");
}

}  // namespace

void register_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub =
      app.add_subcommand("report", "Write the planner-accuracy report (Markdown + PNG) of a sweep's results");
  sub->add_option("RESULTS", a->results, "Results file written by `shardwise sweep` (JSON lines)")->required();
  sub->add_option("--out", a->out, "Folder for report.md and the plots")->required();
  sub->callback([a] {
    check_report_paths(*a);
    write_report(a->results, a->out);
    log_info("report: ", a->out, "/report.md");
  });
}

}  // namespace shardwise::cli

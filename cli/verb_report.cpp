// cli/verb_report.cpp — `shardwise report`: the planner-accuracy report of an oracle results file,
// drawn by the Python package (oracle/report.h).
#include <cstdio>

#include "cli/common.h"
#include "oracle/report.h"

namespace shardwise::cli {
namespace {

struct ReportArgs {
  std::string results, out;
};

}  // namespace

void register_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub =
      app.add_subcommand("report", "Write the planner-accuracy report (Markdown + PNG) of a sweep's results");
  sub->add_option("RESULTS", a->results, "Results file written by `shardwise sweep` (JSON lines)")->required();
  sub->add_option("--out", a->out, "Folder for report.md and the plots")->required();
  sub->callback([a] {
    write_report(a->results, a->out);
    std::fprintf(stderr, "report: %s/report.md\n", a->out.c_str());
  });
}

}  // namespace shardwise::cli

// oracle/report.h — `shardwise report`: the accuracy report (Markdown + PNG) of a results file is
// drawn by the Python package (python/shardwise/report.py); this runs it.
#pragma once

#include <string>

namespace shardwise {

// Runs `python3 -m shardwise.report RESULTS --out DIR`, which writes DIR/report.md and its PNGs.
// Python: $SHARDWISE_PYTHON, else /usr/bin/python3 (Debian's, which has numpy, pandas, matplotlib).
// The package: $SHARDWISE_PYTHONPATH, else this build's python/ folder when the module was built,
// else the source tree's python/ (the report needs only the pure-Python part). Throws Error when the
// file is missing or Python fails.
void write_report(const std::string& results_path, const std::string& out_dir);

// The folder put on PYTHONPATH (see above).
std::string report_python_path();

}  // namespace shardwise

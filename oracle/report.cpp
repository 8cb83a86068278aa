// oracle/report.cpp — runs the Python report with argv (no shell), PYTHONPATH and the Agg backend.
#include "oracle/report.h"

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

extern char** environ;

namespace shardwise {
namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

// The folder holding the package an installed binary came with: <prefix>/bin/shardwise ->
// <prefix>/<SHARDWISE_PYTHON_INSTALL_DIR>.
std::string installed_python_path() {
#ifdef SHARDWISE_PYTHON_INSTALL_DIR
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "";
  std::string dir(exe, static_cast<size_t>(n));
  for (int up = 0; up < 2 && dir.find('/') != std::string::npos; ++up) dir = dir.substr(0, dir.rfind('/'));
  return dir + "/" + SHARDWISE_PYTHON_INSTALL_DIR;
#else
  return "";
#endif
}

std::string report_python_path() {
  const char* env = std::getenv("SHARDWISE_PYTHONPATH");
  if (env && *env) return env;
  const std::string installed = installed_python_path();
  if (!installed.empty() && exists(installed + "/shardwise/report.py")) return installed;
#ifdef SHARDWISE_PYTHON_BUILD_DIR
  if (exists(std::string(SHARDWISE_PYTHON_BUILD_DIR) + "/shardwise/report.py")) return SHARDWISE_PYTHON_BUILD_DIR;
#endif
#ifdef SHARDWISE_PYTHON_SOURCE_DIR
  return SHARDWISE_PYTHON_SOURCE_DIR;
#else
  return "python";
#endif
}

void write_report(const std::string& results_path, const std::string& out_dir) {
  if (!exists(results_path)) fail(results_path, ": no such file");
  const char* py_env = std::getenv("SHARDWISE_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "/usr/bin/python3";
  if (!exists(python))
    fail(python, ": not found (the report needs Debian's python3 with pandas and matplotlib; set $SHARDWISE_PYTHON)");
  const std::string pkg = report_python_path();
  if (!exists(pkg + "/shardwise/report.py"))
    fail(pkg,
         ": the Python package shardwise is not there (set $SHARDWISE_PYTHONPATH to the repository's python/ folder)");

  std::vector<std::string> env_strings;
  const char* old_pp = std::getenv("PYTHONPATH");
  env_strings.push_back("PYTHONPATH=" + pkg + (old_pp && *old_pp ? ":" + std::string(old_pp) : ""));
  env_strings.push_back("MPLBACKEND=Agg");
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0 && std::strncmp(*e, "MPLBACKEND=", 11) != 0)
      env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {python, "-m", "shardwise.report", results_path, "--out", out_dir};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  const int rc = posix_spawn(&pid, python.c_str(), nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) fail("cannot start ", python, ": ", std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waiting for ", python, ": ", std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("the report failed (", python, " -m shardwise.report exited with ",
         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), "; its messages are above)");
}

}  // namespace shardwise

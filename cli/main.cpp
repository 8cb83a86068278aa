// cli/main.cpp — the `shardwise` binary: registers the verbs and turns errors into one line + exit 1.
#include <cstdio>
#include <exception>

#include "cli/common.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "executor/cpu/blas_env.h"
#include "executor/cpu/kernels.h"

int main(int argc, char** argv) {
  shardwise::ensure_fast_blas(argv);
  CLI::App app{"shardwise: run and plan LLM inference across CPU and GPU under a VRAM budget"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardwise 0.1.0");
  shardwise::cli::register_info(app);
  shardwise::cli::register_synth(app);
  shardwise::cli::register_logits(app);
  shardwise::cli::register_run(app);
  shardwise::cli::register_tokenize(app);
  shardwise::cli::register_plan(app);
  shardwise::cli::register_sweep(app);
  shardwise::cli::register_report(app);
  shardwise::cli::register_profile(app);
  try {
    shardwise::check_cpu_kernel_env();
    shardwise::check_thread_pool_env();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A bad flag or value is bad input like any other: one line, exit 1.
    std::string msg = e.what();
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "error: %s (--help lists the options)\n", msg.c_str());
    return 1;
  } catch (const shardwise::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

// cli/main.cpp — the `shardwise` binary: registers the verbs and turns errors into one line + exit 1.
#include <cstdio>
#include <exception>
#include <string>

#include "cli/common.h"
#include "core/error.h"
#include "executor/cpu/blas_env.h"

namespace {
// A message as one printable line: messages quote untrusted text (a YAML key, a token, a path) whose
// control characters and Unicode line or paragraph separators would break it or drive the terminal.
std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const bool c1 = c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9F;  // U+0080..U+009F (NEL among them)
    const bool sep = c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
                     (static_cast<unsigned char>(s[i + 2]) == 0xA8 || static_cast<unsigned char>(s[i + 2]) == 0xA9);
    if (c < 0x20 || c == 0x7F || c1 || sep) {
      const size_t n = sep ? 3 : c1 ? 2 : 1;
      for (size_t k = 0; k < n; ++k) {
        char hex[5];
        std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(s[i + k]));
        out += hex;
      }
      i += n - 1;
    } else {
      out += s[i];
    }
  }
  return out;
}

int fail_with(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", one_line(message).c_str());
  return 1;
}
}  // namespace

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
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);                           // --help, --version
    return fail_with(std::string(e.what()) + " (--help lists the options)");  // bad input like any other
  } catch (const shardwise::Error& e) {
    return fail_with(e.what());
  } catch (const std::bad_alloc&) {
    return fail_with("out of memory");
  } catch (const std::exception& e) {
    return fail_with(e.what());
  }
  return 0;
}

// cli/main.cpp — the `shardwise` binary: registers the verbs and turns errors into one line + exit 1.
#include <cctype>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"
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

// --log-level's words, in LogLevel's order.
const char* const kLevels[] = {"debug", "info", "warn", "error", "quiet"};

// --quiet and --log-level on the app. The verbs inherit fallthrough, so both work before or after the
// verb; their callbacks run while the options are processed, before the verb's callback runs.
void add_log_options(CLI::App& app) {
  CLI::Option* level = app.add_option_function<std::string>(
      "--log-level",
      [](const std::string& v) {
        for (int i = 0; i < 5; ++i)
          if (v == kLevels[i]) return shardwise::set_log_level(static_cast<shardwise::LogLevel>(i));
        throw CLI::ValidationError("--log-level", "'" + v + "' is not a level: debug, info, warn, error or quiet");
      },
      "What goes to stderr besides results and errors: debug|info|warn|error|quiet (default info, or "
      "$SHARDWISE_LOG); before or after the verb");
  app.add_flag_callback(
         "--quiet", [] { shardwise::set_log_level(shardwise::LogLevel::Quiet); },
         "Print only results and errors (--log-level quiet)")
      ->excludes(level);
}

// A word that names an option ("-x", "--name", "--name=value"), not a value such as "-1" or "-".
bool looks_like_option(const std::string& s) {
  if (s.size() < 2 || s[0] != '-' || s == "--") return false;
  return !(std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.');
}

// The option a word names in `scope` or, falling through, in `app` (null when neither knows it).
// "-n5" is -n with its value, as CLI11 reads it.
const CLI::Option* find_option(const CLI::App& scope, const CLI::App& app, const std::string& word) {
  const std::string name = word.substr(0, word.find('='));
  for (const CLI::App* a : {&scope, &app}) {
    if (const CLI::Option* o = a->get_option_no_throw(name)) return o;
    if (name.size() > 2 && name[1] != '-')
      if (const CLI::Option* o = a->get_option_no_throw(name.substr(0, 2))) return o;
  }
  return nullptr;
}

// The index of the first word of args[from, to) naming an option that `scope` and `app` lack (`to` if
// none); the value after an option that takes one is skipped.
size_t unknown_option(const CLI::App& scope, const CLI::App& app, const std::vector<std::string>& args, size_t from,
                      size_t to) {
  for (size_t i = from; i < to; ++i) {
    if (args[i] == "--") break;
    if (!looks_like_option(args[i])) continue;
    const CLI::Option* o = find_option(scope, app, args[i]);
    if (!o) return i;
    const bool attached = args[i].find('=') != std::string::npos || (args[i][1] != '-' && args[i].size() > 2);
    if (o->get_items_expected_min() > 0 && !attached) ++i;
  }
  return to;
}

// The verb args name: the first word that is not an option of the app or its value. *at is its index
// (args.size() when there is none), *word that word ("" when there is none).
CLI::App* find_verb(CLI::App& app, const std::vector<std::string>& args, size_t* at, std::string* word) {
  *at = args.size();
  word->clear();
  for (size_t i = 0; i < args.size(); ++i) {
    if (looks_like_option(args[i])) {
      const CLI::Option* o = find_option(app, app, args[i]);
      if (o && o->get_items_expected_min() > 0 && args[i].find('=') == std::string::npos) ++i;
      continue;
    }
    *at = i;
    *word = args[i];
    const auto named = app.get_subcommands([&](CLI::App* v) { return v->check_name(args[i]); });
    return named.empty() ? nullptr : named.front();
  }
  return nullptr;
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> verb_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* v : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(v->get_name());
  return names;
}

// "an option of run, tokenize; " for an option other verbs have ("" when none has it).
std::string verbs_with(const CLI::App& app, const std::string& option) {
  std::string verbs;
  for (const CLI::App* v : app.get_subcommands([](const CLI::App*) { return true; }))
    if (v->get_option_no_throw(option)) verbs += (verbs.empty() ? "" : ", ") + v->get_name();
  return verbs.empty() ? "" : "an option of " + verbs + "; ";
}

// CLI11's message, one line, naming the flag: a value that does not convert says what it should be.
std::string cli11_message(const CLI::App& scope, const CLI::ParseError& e) {
  std::string m = e.what();
  for (size_t at; (at = m.find('\n')) != std::string::npos;) m.replace(at, 1, "; ");
  const std::string convert = "Could not convert: ", extras = "not expected: ";
  if (m.compare(0, convert.size(), convert) == 0 && m.find(" = ") != std::string::npos) {
    const std::string name = m.substr(convert.size(), m.find(" = ") - convert.size());
    const std::string value = m.substr(m.find(" = ") + 3);
    const CLI::Option* o = scope.get_option_no_throw(name);
    const std::string type = o ? o->get_type_name() : "";
    const std::string want = type == "INT"     ? "a whole number"
                             : type == "UINT"  ? "a whole number of 0 or more"
                             : type == "FLOAT" ? "a number"
                                               : "a value of type " + type;
    return name + ": '" + value + "' is not " + want;
  }
  if (m.find(extras) != std::string::npos) return "unexpected argument(s): " + m.substr(m.find(extras) + extras.size());
  const size_t missing = m.find(" required ");
  if (missing != std::string::npos && m.size() > 8 && m.compare(m.size() - 8, 8, " missing") == 0)
    return m.substr(0, m.find(':')) + " needs a value";
  return m;
}

// The one line a parse error prints: the verb, then an unknown option with the nearest valid one (a
// typo), an unknown verb with the nearest verb, or CLI11's message (which names the flag). `args` are
// as parsed (llama.cpp's flags rewritten), `given` as typed: a message names a word as typed.
std::string parse_error_line(CLI::App& app, const std::vector<std::string>& args, const std::vector<std::string>& given,
                             const CLI::ParseError& e) {
  size_t at = 0;
  std::string word;
  CLI::App* verb = find_verb(app, args, &at, &word);
  const CLI::App& scope = verb ? *verb : app;
  const std::string prefix = verb ? verb->get_name() + ": " : "";
  const std::string help = verb ? "shardwise " + verb->get_name() + " --help" : "shardwise --help";
  size_t bad = unknown_option(app, app, args, 0, at);
  if (bad == at && verb) bad = unknown_option(*verb, app, args, at + 1, args.size());
  if (bad < args.size() && bad != at) {
    const std::string name = args[bad].substr(0, args[bad].find('=')),
                      typed = given[bad].substr(0, given[bad].find('='));
    std::vector<std::string> names = option_names(scope);
    for (const auto& n : option_names(app)) names.push_back(n);
    const std::string near = shardwise::cli::nearest_name(name, names);
    if (!near.empty()) return prefix + "unknown option " + typed + "; did you mean " + near + "?";
    return prefix + "unknown option " + typed + " (" + verbs_with(app, name) + help + " lists the options)";
  }
  if (!verb) {
    if (word.empty())
      return "give a verb: " + shardwise::comma_list(verb_names(app)) + " (" + help + " describes them)";
    const std::string near = shardwise::cli::nearest_name(word, verb_names(app));
    return "unknown verb '" + word + "'" + (near.empty() ? "" : "; did you mean " + near + "?") +
           " (verbs: " + shardwise::comma_list(verb_names(app)) + ")";
  }
  return prefix + cli11_message(scope, e) + " (" + help + " lists the options)";
}
}  // namespace

int main(int argc, char** argv) {
  shardwise::ensure_fast_blas(argv);
  CLI::App app{"shardwise: run and plan LLM inference across CPU and GPU under a VRAM budget"};
  app.require_subcommand(1);
  app.fallthrough();  // before the verbs: they inherit it, and pass --quiet and --log-level up
  app.set_version_flag("--version", "shardwise 0.1.0");
  add_log_options(app);
  shardwise::cli::register_info(app);
  shardwise::cli::register_synth(app);
  shardwise::cli::register_logits(app);
  shardwise::cli::register_run(app);
  shardwise::cli::register_tokenize(app);
  shardwise::cli::register_plan(app);
  shardwise::cli::register_sweep(app);
  shardwise::cli::register_report(app);
  shardwise::cli::register_profile(app);
  shardwise::cli::register_serve(app);
  shardwise::cli::register_loadgen(app);
  shardwise::cli::register_vision(app);
  for (CLI::App* verb : app.get_subcommands([](CLI::App*) { return true; }))
    verb->footer("Every verb also takes --quiet and --log-level LEVEL (shardwise --help).");
  // llama.cpp's -ngl, -no-cnv, ... in their long form (CLI11 would read -ngl 10 as -n gl).
  const std::vector<std::string> given(argv + 1, argv + argc);
  const std::vector<std::string> args = shardwise::cli::rewrite_llama_flags(given);
  std::vector<char*> rewritten = {argv[0]};
  for (const auto& a : args) rewritten.push_back(const_cast<char*>(a.c_str()));
  try {
    app.parse(static_cast<int>(rewritten.size()), rewritten.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return fail_with(parse_error_line(app, args, given, e));
  } catch (const shardwise::Error& e) {
    return fail_with(e.what());
  } catch (const std::bad_alloc&) {
    return fail_with("out of memory");
  } catch (const std::exception& e) {
    return fail_with(e.what());
  }
  return 0;
}

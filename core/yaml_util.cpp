// core/yaml_util.cpp — YAML with duplicate keys, non-scalar keys and aliases refused (yaml_util.h).
#include "core/yaml_util.h"

#include <yaml-cpp/eventhandler.h>

#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace shardwise {
namespace {

// Walks the parser's events (no tree, so linear in the text): a stack of open collections, each
// mapping with the keys seen so far and whether its next node is a key.
class KeyCheck : public YAML::EventHandler {
 public:
  explicit KeyCheck(const std::string& ctx) : ctx_(ctx) {}
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, "~", false); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    fail(ctx_, ": line ", mark.line + 1, ": aliases (*name) are not supported: write the value out");
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string& value) override {
    node(mark, value, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark, "", true);
    open_.push_back({false, true, {}, path()});
  }
  void OnSequenceEnd() override { open_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark, "", true);
    open_.push_back({true, true, {}, path()});
  }
  void OnMapEnd() override { open_.pop_back(); }

 private:
  struct Open {
    bool map;
    bool expect_key;  // a mapping's next node is a key
    std::set<std::string> keys;
    std::string path;  // of the collection, e.g. "models[0]"
  };
  std::string path() const { return last_path_; }
  // A node inside the innermost open collection (a key, a value or an item).
  void node(const YAML::Mark& mark, const std::string& scalar, bool collection) {
    if (open_.empty()) {
      last_path_.clear();
      return;
    }
    Open& o = open_.back();
    if (!o.map) {
      last_path_ = o.path + "[" + std::to_string(o.keys.size()) + "]";
      o.keys.insert(std::to_string(o.keys.size()));  // counts the items
      return;
    }
    if (o.expect_key) {
      const std::string where = o.path.empty() ? "" : o.path + ".";
      if (collection)
        fail(ctx_, ": line ", mark.line + 1, ": a key of ", o.path.empty() ? "the top level" : o.path,
             " is a list or mapping, not a name");
      if (!o.keys.insert(scalar).second)
        fail(ctx_, ": line ", mark.line + 1, ": duplicate key '", where, scalar, "' (YAML would keep only the first)");
      key_path_ = where + scalar;
      o.expect_key = false;
    } else {
      last_path_ = key_path_;
      o.expect_key = true;
    }
  }

  std::string ctx_;
  std::vector<Open> open_;
  std::string key_path_, last_path_;
};

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& ctx) {
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    KeyCheck check(ctx);
    while (parser.HandleNextDocument(check)) {
    }
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(ctx, ": malformed YAML at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg);
  }
}

}  // namespace shardwise

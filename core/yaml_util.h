// core/yaml_util.h — reading untrusted YAML (model specs, machines, experiments) with the checks
// yaml-cpp leaves out: a duplicate key (yaml-cpp keeps the first and drops the rest without a word),
// a key that is a list or mapping (yaml-cpp throws a bare "bad conversion" later), and an alias
// (*name: a few lines of nested aliases stand for a document of billions of nodes). Errors name the
// file (ctx), the line and the key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace shardwise {

YAML::Node load_yaml(const std::string& text, const std::string& ctx);

}  // namespace shardwise

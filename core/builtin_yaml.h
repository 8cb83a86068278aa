// core/builtin_yaml.h — (internal) the YAML files of configs/ embedded at build time.
#pragma once

namespace shardwise {

struct BuiltinYamlText {
  const char* name;
  const char* yaml;
};
extern const BuiltinYamlText kBuiltinSpecs[];  // configs/models/*.yaml
extern const int kBuiltinSpecsCount;
extern const BuiltinYamlText kBuiltinHardware[];  // configs/hardware/*.yaml
extern const int kBuiltinHardwareCount;

}  // namespace shardwise

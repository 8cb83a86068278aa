// core/safetensors.cpp — safetensors reader (see safetensors.h).
#include "core/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"

namespace shardwise {
namespace {

constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
std::string dirname_of(const std::string& p) {
  auto pos = p.find_last_of('/');
  return pos == std::string::npos ? "." : p.substr(0, pos);
}

uint64_t element_size(const std::string& dt) {
  static const std::pair<const char*, uint64_t> kSizes[] = {
      {"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},    {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  for (const auto& s : kSizes)
    if (dt == s.first) return s.second;
  return 0;
}

}  // namespace

SafetensorsSet::SafetensorsSet(const std::string& path_in) {
  std::string path = path_in;
  if (is_dir(path)) {
    if (exists(path + "/model.safetensors.index.json"))
      path += "/model.safetensors.index.json";
    else if (exists(path + "/model.safetensors"))
      path += "/model.safetensors";
    else
      fail(path_in, ": no model.safetensors or model.safetensors.index.json in this directory");
  }
  const std::string suffix = ".json";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string text = read_text_file(path);
    nlohmann::json j;
    check_json_depth(text, path);
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail(path, ": malformed JSON at byte ", e.byte);
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(path, ": missing object field 'weight_map'");
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(path, ": weight_map['", it.key(), "'] must be a file name");
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty())
        fail(path, ": weight_map['", it.key(), "'] = '", f, "' must be a plain file name in the same directory");
      files.insert(f);
    }
    const std::string dir = dirname_of(path);
    for (const auto& f : files) {
      try {
        load_file(dir + "/" + f);
      } catch (const Error& e) {
        fail(e.what(), " (a shard listed in ", path, ")");
      }
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string shard = dir + "/" + it.value().get<std::string>();
      auto t = tensors_.find(it.key());
      if (t == tensors_.end() || t->second.file != shard)
        fail(path, ": tensor '", it.key(), "' is listed in weight_map but missing from ", shard,
             t == tensors_.end() ? std::string() : " (it is in " + t->second.file + ")");
    }
  } else {
    load_file(path);
  }
}

void SafetensorsSet::load_file(const std::string& path) {
  files_.push_back(std::make_unique<MappedFile>(path));
  const MappedFile& f = *files_.back();
  if (f.size() < 8) fail(path, ": offset 0: file is ", f.size(), " bytes, too short for a safetensors header");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8)
    fail(path, ": offset 0: header length ", n, " runs past the end of the file (", f.size(),
         " bytes; the file is truncated or not safetensors)");
  if (n > kMaxHeaderBytes)
    fail(path, ": offset 0: header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes (corrupt file?)");
  nlohmann::json h;
  check_json_depth(reinterpret_cast<const char*>(f.data()) + 8, reinterpret_cast<const char*>(f.data()) + 8 + n,
                   path + ": header");
  try {
    h = nlohmann::json::parse(f.data() + 8, f.data() + 8 + n);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, ": offset ", 8 + e.byte, ": malformed JSON header");
  }
  if (!h.is_object()) fail(path, ": offset 8: header is not a JSON object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = f.size() - data_start;
  std::vector<std::pair<uint64_t, std::pair<uint64_t, std::string>>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    const std::string ctx = path + ": tensor '" + it.key() + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(ctx, ": header entry needs dtype, shape and data_offsets");
    if (!e["dtype"].is_string()) fail(ctx, ": dtype must be a string");
    SafetensorsTensor t;
    t.name = it.key();
    t.file = path;
    t.dtype_name = e["dtype"].get<std::string>();
    uint64_t esize = element_size(t.dtype_name);
    if (esize == 0) fail(ctx, ": unknown dtype '", t.dtype_name, "'");
    if (!e["shape"].is_array() || e["shape"].size() > 8) fail(ctx, ": shape must be an array of at most 8 sizes");
    uint64_t elems = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) fail(ctx, ": shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t(1) << 40)) fail(ctx, ": dimension ", v, " is absurd");
      if (v != 0 && elems > (uint64_t(1) << 50) / v) fail(ctx, ": element count overflows");
      elems *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(ctx, ": data_offsets must be [begin, end]");
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size)
      fail(ctx, ": data_offsets [", b, ", ", en, "] lie outside the data section (", data_size,
           " bytes; the file is truncated or corrupt)");
    if (en - b != elems * esize)
      fail(ctx, ": data_offsets span ", en - b, " bytes but shape ", shape_str(t.shape), " of ", t.dtype_name,
           " needs ", elems * esize);
    t.data = f.data() + data_start + b;
    t.nbytes = en - b;
    if (en > b) ranges.push_back({b, {en, t.name}});  // empty tensors overlap nothing
    if (tensors_.count(t.name)) fail(ctx, ": tensor appears in more than one file");
    tensors_.emplace(t.name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second.first)
      fail(path, ": tensor '", ranges[i].second.second, "': data_offsets [", ranges[i].first, ", ",
           ranges[i].second.first, "] overlap tensor '", ranges[i - 1].second.second, "' [", ranges[i - 1].first, ", ",
           ranges[i - 1].second.first, "] (the file is corrupt)");
}

const SafetensorsTensor* SafetensorsSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

TensorView SafetensorsSet::view(const SafetensorsTensor& t) const {
  TensorView v;
  if (t.dtype_name == "F32")
    v.dtype = DType::F32;
  else if (t.dtype_name == "F16")
    v.dtype = DType::F16;
  else if (t.dtype_name == "BF16")
    v.dtype = DType::BF16;
  else
    fail(t.file, ": tensor '", t.name, "': dtype ", t.dtype_name, " is not supported for weights (F32, F16, BF16)");
  v.shape = t.shape;
  v.data = t.data;
  v.nbytes = t.nbytes;
  return v;  // may be misaligned when the header length is odd; weight sources copy such tensors
}

}  // namespace shardwise

// core/npy.cpp — minimal .npy reader/writer.
#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/mapped_file.h"

namespace shardwise {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::ostringstream hdr;
  hdr << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    hdr << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    n *= shape[i];
  }
  hdr << "), }";
  std::string h = hdr.str();
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(path, ": cannot create");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(h.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
  if (!out) fail(path, ": write failed");
}

NpyArray read_npy(const std::string& path) {
  MappedFile f(path);
  const uint8_t* d = f.data();
  if (f.size() < 10 || std::memcmp(d, "\x93NUMPY", 6) != 0) fail(path, ": not a .npy file");
  uint64_t hlen = 0, hstart = 0;
  if (d[6] == 1) {
    hlen = static_cast<uint64_t>(d[8]) | (static_cast<uint64_t>(d[9]) << 8);
    hstart = 10;
  } else if (d[6] == 2 || d[6] == 3) {
    if (f.size() < 12) fail(path, ": truncated header");
    uint32_t l;
    std::memcpy(&l, d + 8, 4);
    hlen = l;
    hstart = 12;
  } else {
    fail(path, ": unsupported .npy version ", int(d[6]));
  }
  if (hstart + hlen > f.size()) fail(path, ": header runs past the end of the file");
  std::string h(reinterpret_cast<const char*>(d + hstart), static_cast<size_t>(hlen));
  // The value text after 'key': in the header dict (the header is a Python literal written by numpy).
  auto field = [&](const std::string& key) -> std::string {
    auto p = h.find("'" + key + "'");
    if (p == std::string::npos) fail(path, ": header has no '", key, "'");
    p = h.find(':', p);
    if (p == std::string::npos) fail(path, ": header field '", key, "' has no value");
    return h.substr(p + 1);
  };
  std::string descr = field("descr");
  descr = descr.substr(0, descr.find(','));  // the descr value ends at the next field
  auto q1 = descr.find('\''), q2 = q1 == std::string::npos ? q1 : descr.find('\'', q1 + 1);
  if (q2 == std::string::npos) fail(path, ": header field 'descr' is not a quoted string");
  descr = descr.substr(q1 + 1, q2 - q1 - 1);
  const std::string fortran = field("fortran_order");
  if (fortran.find("True") < fortran.find(',')) fail(path, ": Fortran order is not supported");
  std::string sh = field("shape");
  const auto open_paren = sh.find('('), close_paren = sh.find(')');
  if (open_paren == std::string::npos || close_paren == std::string::npos || close_paren < open_paren)
    fail(path, ": header field 'shape' is not a tuple");
  sh = sh.substr(open_paren + 1, close_paren - open_paren - 1);
  NpyArray a;
  uint64_t n = 1;
  std::stringstream ss(sh);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    const auto b = tok.find_first_not_of(' '), e = tok.find_last_not_of(' ');
    if (b == std::string::npos) continue;
    tok = tok.substr(b, e - b + 1);
    if (tok.empty() || tok.size() > 13 || tok.find_first_not_of("0123456789") != std::string::npos)
      fail(path, ": shape entry '", tok, "' is not a non-negative integer");
    const int64_t v = std::stoll(tok);  // <= 13 digits: cannot overflow
    if (v > (int64_t(1) << 40)) fail(path, ": shape entry ", v, " is absurd");
    a.shape.push_back(v);
    // n <= 2^50 (checked below against the file size), so this product cannot overflow.
    n = v == 0 ? 0 : (n > (uint64_t(1) << 50) / static_cast<uint64_t>(v) ? (uint64_t(1) << 50) + 1 : n * v);
  }
  size_t esize = descr == "<f4" || descr == "<i4" ? 4 : descr == "<f8" || descr == "<i8" ? 8 : 0;
  if (esize == 0) fail(path, ": dtype '", descr, "' is not supported (<f4, <f8, <i4, <i8)");
  const uint64_t data_start = hstart + hlen;
  if (n > (f.size() - data_start) / esize)
    fail(path, ": data is truncated (shape needs ", n, " elements of ", esize, " bytes)");
  a.values.resize(static_cast<size_t>(n));
  const uint8_t* p = d + data_start;
  for (uint64_t i = 0; i < n; ++i) {
    if (descr == "<f4") {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      a.values[i] = v;
    } else if (descr == "<f8") {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      a.values[i] = v;
    } else if (descr == "<i4") {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      a.values[i] = v;
    } else {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      a.values[i] = static_cast<double>(v);
    }
  }
  return a;
}

}  // namespace shardwise

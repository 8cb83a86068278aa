// costmodel/profile_db.cpp — the ProfileDB file: canonical compact JSON, strict validation on load,
// atomic save and the content hash (see profile_db.h).
//
// Layout (version 1). Measured rows are short arrays grouped by everything they share, so the full
// GPU-machine profile (~3000 op rows) stays near 130 KB; each group names its columns:
//   {"format":"shardwise-profile","version":1,"device":"cuda","created":"…","git_rev":"…","quick":false,
//    "machine":{"cpu_model":…,"cpu_cores":…,"isa":…,"dram_bytes":…,"gpu_name":…,"gpu_driver":…,"vram_bytes":…},
//    "threads":[1,16],"pcie_caps_gbps":[0,16],"sync_ms":0.0042,"launch_ms":0.0021,
//    "ops":[{"backend":"cpu","threads":16,"contention":false,"kind":"matmul","dtype":"q4_0",
//            "columns":["tokens","rows","cols","ms","spread","repeats"],"points":[[1,4096,4096,0.3141,0.02,20],…]},…],
//    "transfers":[{"dir":"h2d","pinned":true,"cap_gbps":0,"columns":["bytes","ms","spread","repeats"],"points":[…]},…],
//                 (a group of back-to-back copies adds "burst":N, N >= 2: ms is per copy of N issued together)
//    "dram":[{"threads":16,"contention":true,"concurrent_gbps":101.2,"gbps":88.1},…],
//    "fits":[{"backend":"cpu","kind":"matmul","dtype":"q4_0","threads":16,"contention":false,"peak_gflops":…,
//             "bw_gbps":…,"overhead_ms":…,"points":…,"median_rel_err":…},…]}
// Op columns by kind: matmul tokens,rows,cols; moe_experts tokens,rows,cols,n_experts,top_k; attention
// tokens,ctx,n_heads,n_kv_heads,head_dim; norm/rope/elementwise/embed tokens,elems; contention groups add
// concurrent_gbps; then ms,spread,repeats. Groups and points are sorted, so equal content gives equal text.
#include "costmodel/profile_db.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"

namespace shardwise {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr const char* kFormatName = "shardwise-profile";
const OpKind kAllKinds[] = {OpKind::Matmul, OpKind::MoeExperts,  OpKind::Attention, OpKind::Norm,
                            OpKind::Rope,   OpKind::Elementwise, OpKind::Embed,     OpKind::VisionAttention};

// Measured numbers are stored to 4 significant digits (the repeats' spread is far larger).
double round4(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
}

const char* dir_name(Direction d) {
  return d == Direction::HostToDevice ? "h2d" : "d2h";
}

// The shape columns of an op kind (after `tokens`).
std::vector<const char*> shape_columns(OpKind k) {
  switch (k) {
    case OpKind::Matmul:
      return {"rows", "cols"};
    case OpKind::MoeExperts:
      return {"rows", "cols", "n_experts", "top_k"};
    case OpKind::Attention:
    case OpKind::VisionAttention:
      return {"ctx", "n_heads", "n_kv_heads", "head_dim"};
    default:
      return {"elems"};
  }
}
std::vector<int64_t> shape_values(const Op& op) {
  switch (op.kind) {
    case OpKind::Matmul:
      return {op.rows, op.cols};
    case OpKind::MoeExperts:
      return {op.rows, op.cols, op.n_experts, op.top_k};
    case OpKind::Attention:
    case OpKind::VisionAttention:
      return {op.ctx, op.n_heads, op.n_kv_heads, op.head_dim};
    default:
      return {op.elems};
  }
}
std::vector<std::string> op_columns(OpKind k, bool contention) {
  std::vector<std::string> c = {"tokens"};
  for (const char* s : shape_columns(k)) c.push_back(s);
  if (contention) c.push_back("concurrent_gbps");
  for (const char* s : {"ms", "spread", "repeats"}) c.push_back(s);
  return c;
}
const std::vector<std::string> kTransferColumns = {"bytes", "ms", "spread", "repeats"};

// ---- writing ---------------------------------------------------------------------------------

using OpGroupKey = std::tuple<int, int, bool, int, int>;  // backend, threads, contention, kind, dtype

std::string points_text(const ojson& header, const std::vector<ojson>& points) {
  std::string s = header.dump();
  s.pop_back();  // the closing brace
  s += ",\"points\":[";
  for (size_t i = 0; i < points.size(); ++i) s += (i ? ",\n" : "\n") + points[i].dump();
  s += "]}";
  return s;
}

std::string list_text(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ",\n" : "\n") + items[i];
  return s + "]";
}

// The header fields, without the closing brace.
std::string head_text(const ProfileDB& db, bool with_created) {
  ojson head;
  head["format"] = kFormatName;
  head["version"] = db.version;
  head["device"] = db.device;
  if (with_created) head["created"] = db.created;
  head["git_rev"] = db.git_rev;
  head["quick"] = db.quick;
  std::string text = head.dump();
  text.pop_back();
  return text;
}

// `"machine":{…}` and the measurement settings, as members to append after a comma.
std::string machine_and_settings_text(const ProfileDB& db) {
  ojson m;
  m["cpu_model"] = db.machine.cpu_model;
  m["cpu_cores"] = db.machine.cpu_cores;
  m["isa"] = db.machine.isa;
  m["dram_bytes"] = db.machine.dram_bytes;
  m["gpu_name"] = db.machine.gpu_name;
  m["gpu_driver"] = db.machine.gpu_driver;
  m["vram_bytes"] = db.machine.vram_bytes;
  // Sets, whatever order they were measured in.
  std::vector<int> threads = db.threads;
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  std::vector<double> caps = db.pcie_caps_gbps;
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  ojson settings;
  settings["threads"] = threads;
  settings["pcie_caps_gbps"] = caps;
  settings["sync_ms"] = round4(db.sync_ms);
  if (db.copy_traffic != "both") settings["copy_traffic"] = db.copy_traffic;  // (absent: both ways, older profiles)
  settings["launch_ms"] = round4(db.launch_ms);
  if (db.copy_issue_ms > 0) settings["copy_issue_ms"] = round4(db.copy_issue_ms);  // (absent: not measured)
  if (db.paced_copy_issue_ms > 0) settings["paced_copy_issue_ms"] = round4(db.paced_copy_issue_ms);
  std::string s = settings.dump();
  return "\"machine\":" + m.dump() + ",\n" + s.substr(1, s.size() - 2);
}

// One op group's rows (all share the group's kind and contention), sorted by shape, tokens, then values.
std::vector<ojson> op_points(const std::vector<const OpSample*>& rows, bool contention) {
  std::vector<std::pair<std::vector<double>, ojson>> pts;  // (sort key, row)
  for (const OpSample* o : rows) {
    ojson p = ojson::array();
    std::vector<double> sort_key;
    for (int64_t v : shape_values(o->op)) sort_key.push_back(static_cast<double>(v));
    sort_key.push_back(static_cast<double>(o->op.tokens));
    p.push_back(o->op.tokens);
    for (int64_t v : shape_values(o->op)) p.push_back(v);
    if (contention) p.push_back(round4(o->concurrent_gbps));
    p.push_back(round4(o->ms));
    p.push_back(round4(o->spread));
    p.push_back(o->repeats);
    sort_key.push_back(round4(o->concurrent_gbps));
    sort_key.push_back(round4(o->ms));
    sort_key.push_back(round4(o->spread));
    sort_key.push_back(o->repeats);
    pts.emplace_back(std::move(sort_key), std::move(p));
  }
  std::stable_sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ojson> plain;
  for (auto& p : pts) plain.push_back(std::move(p.second));
  return plain;
}

// The `ops` list: grouped by backend, threads, contention, kind and dtype, in that order.
std::string ops_text(const ProfileDB& db) {
  std::map<OpGroupKey, std::vector<const OpSample*>> groups;
  for (const OpSample& o : db.ops)
    groups[{static_cast<int>(o.backend), o.threads, o.contention, static_cast<int>(o.op.kind),
            static_cast<int>(o.op.dtype)}]
        .push_back(&o);
  std::vector<std::string> op_groups;
  for (auto& [key, rows] : groups) {
    const OpSample& f = *rows.front();
    ojson h;
    h["backend"] = backend_name(f.backend);
    h["threads"] = f.threads;
    h["contention"] = f.contention;
    h["kind"] = op_kind_name(f.op.kind);
    h["dtype"] = dtype_name(f.op.dtype);
    h["columns"] = op_columns(f.op.kind, f.contention);
    op_groups.push_back(points_text(h, op_points(rows, f.contention)));
  }
  return list_text(op_groups);
}

// The `transfers` list: grouped by direction, pinned first, cap and burst.
std::string transfers_text(const ProfileDB& db) {
  std::map<std::tuple<int, bool, double, int>, std::vector<const TransferSample*>> tgroups;
  for (const TransferSample& t : db.transfers)
    tgroups[{static_cast<int>(t.dir), !t.pinned, t.cap_gbps, t.burst}].push_back(&t);
  std::vector<std::string> t_groups;
  for (auto& [key, rows] : tgroups) {
    const TransferSample& f = *rows.front();
    ojson h;
    h["dir"] = dir_name(f.dir);
    h["pinned"] = f.pinned;
    h["cap_gbps"] = f.cap_gbps;
    if (f.burst > 1) h["burst"] = f.burst;  // absent for single copies: older profiles keep their hash
    h["columns"] = kTransferColumns;
    std::vector<const TransferSample*> sorted = rows;
    std::stable_sort(sorted.begin(), sorted.end(), [](const TransferSample* a, const TransferSample* b) {
      return std::make_tuple(a->bytes, round4(a->ms), round4(a->spread), a->repeats) <
             std::make_tuple(b->bytes, round4(b->ms), round4(b->spread), b->repeats);
    });
    std::vector<ojson> plain;
    for (const TransferSample* t : sorted)
      plain.push_back(ojson::array({t->bytes, round4(t->ms), round4(t->spread), t->repeats}));
    t_groups.push_back(points_text(h, plain));
  }
  return list_text(t_groups);
}

std::string dram_text(const ProfileDB& db) {
  std::vector<DramSample> dram = db.dram;
  std::stable_sort(dram.begin(), dram.end(), [](const DramSample& a, const DramSample& b) {
    return std::make_tuple(a.threads, a.contention, round4(a.concurrent_gbps), round4(a.gbps)) <
           std::make_tuple(b.threads, b.contention, round4(b.concurrent_gbps), round4(b.gbps));
  });
  std::vector<std::string> d_rows;
  for (const DramSample& d : dram) {
    ojson r;
    r["threads"] = d.threads;
    r["contention"] = d.contention;
    r["concurrent_gbps"] = round4(d.concurrent_gbps);
    r["gbps"] = round4(d.gbps);
    d_rows.push_back(r.dump());
  }
  return list_text(d_rows);
}

std::string fits_text(const ProfileDB& db) {
  std::vector<RooflineFit> fits = db.fits;
  std::stable_sort(fits.begin(), fits.end(), [](const RooflineFit& a, const RooflineFit& b) {
    return std::make_tuple(static_cast<int>(a.backend), static_cast<int>(a.kind), static_cast<int>(a.dtype), a.threads,
                           a.contention) < std::make_tuple(static_cast<int>(b.backend), static_cast<int>(b.kind),
                                                           static_cast<int>(b.dtype), b.threads, b.contention);
  });
  std::vector<std::string> f_rows;
  for (const RooflineFit& f : fits) {
    ojson r;
    r["backend"] = backend_name(f.backend);
    r["kind"] = op_kind_name(f.kind);
    r["dtype"] = dtype_name(f.dtype);
    r["threads"] = f.threads;
    r["contention"] = f.contention;
    r["peak_gflops"] = round4(f.peak_gflops);
    r["bw_gbps"] = round4(f.bw_gbps);
    r["overhead_ms"] = round4(f.overhead_ms);
    r["points"] = f.points;
    r["median_rel_err"] = round4(f.median_rel_err);
    f_rows.push_back(r.dump());
  }
  return list_text(f_rows);
}

// The canonical text; `with_created` = false gives the text that is hashed.
std::string canonical_json(const ProfileDB& db, bool with_created) {
  if (db.version != kProfileFormatVersion)
    fail("profile: cannot write format version ", db.version, " (this build writes version ", kProfileFormatVersion,
         ")");
  std::string text = head_text(db, with_created);
  text += ",\n" + machine_and_settings_text(db);
  text += ",\n\"ops\":" + ops_text(db);
  text += ",\n\"transfers\":" + transfers_text(db);
  text += ",\n\"dram\":" + dram_text(db);
  text += ",\n\"fits\":" + fits_text(db) + "}\n";
  return text;
}

// ---- reading ---------------------------------------------------------------------------------

// Every message reads "<file>: field <path>: <problem>".
struct Reader {
  std::string origin;

  template <typename... Args>
  [[noreturn]] void bad(const std::string& field, const Args&... args) const {
    fail(origin, ": field ", field, ": ", args...);
  }

  const json& get(const json& obj, const std::string& key, const std::string& where) const {
    const std::string field = where.empty() ? key : where + "." + key;
    auto it = obj.find(key);
    if (it == obj.end()) bad(field, "missing (required)");
    return *it;
  }

  void check_keys(const json& obj, const std::string& where, const std::vector<std::string>& known) const {
    if (!obj.is_object()) bad(where.empty() ? "(top level)" : where, "must be an object");
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        bad(where.empty() ? it.key() : where + "." + it.key(), "unknown field (known: ", list, ")");
      }
  }

  std::string str(const json& v, const std::string& field) const {
    if (!v.is_string()) bad(field, "must be a string");
    return v.get<std::string>();
  }
  bool boolean(const json& v, const std::string& field) const {
    if (!v.is_boolean()) bad(field, "must be true or false");
    return v.get<bool>();
  }
  int64_t integer(const json& v, const std::string& field, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) bad(field, "must be an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) bad(field, "is too large");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) bad(field, x, " is out of range [", lo, ", ", hi, "]");
    return x;
  }
  uint64_t unsigned_int(const json& v, const std::string& field, uint64_t lo, uint64_t hi) const {
    if (!v.is_number_integer()) bad(field, "must be an integer");
    if (!v.is_number_unsigned() && v.get<int64_t>() < 0) bad(field, "must not be negative");
    const uint64_t x = v.get<uint64_t>();
    if (x < lo || x > hi) bad(field, x, " is out of range [", lo, ", ", hi, "]");
    return x;
  }
  // lo_open: the value must be strictly above lo.
  double number(const json& v, const std::string& field, double lo, double hi, bool lo_open = false) const {
    if (!v.is_number()) bad(field, "must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) bad(field, "must be finite");
    if (lo_open ? !(x > lo) : !(x >= lo)) bad(field, x, lo_open ? " must be greater than " : " must be at least ", lo);
    if (x > hi) bad(field, x, " is larger than ", hi);
    return x;
  }
  const json& array(const json& v, const std::string& field) const {
    if (!v.is_array()) bad(field, "must be a list");
    return v;
  }

  Backend backend(const json& v, const std::string& field) const {
    const std::string s = str(v, field);
    for (Backend b : {Backend::Cpu, Backend::Gpu})
      if (s == backend_name(b)) return b;
    bad(field, "unknown backend '", s, "' (known: cpu, gpu)");
  }
  OpKind kind(const json& v, const std::string& field) const {
    const std::string s = str(v, field);
    std::string list;
    for (OpKind k : kAllKinds) {
      if (s == op_kind_name(k)) return k;
      list += (list.empty() ? "" : ", ") + std::string(op_kind_name(k));
    }
    bad(field, "unknown op kind '", s, "' (known: ", list, ")");
  }
  DType dtype(const json& v, const std::string& field) const {
    const std::string s = str(v, field);
    std::string list;
    for (DType d : kAllDTypes) {
      if (s == dtype_name(d)) return d;
      list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
    }
    bad(field, "unknown dtype '", s, "' (known: ", list, ")");
  }
  void columns(const json& v, const std::string& field, const std::vector<std::string>& expected) const {
    std::string want;
    for (const auto& c : expected) want += (want.empty() ? "" : ", ") + c;
    array(v, field);
    bool ok = v.size() == expected.size();
    for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string() && v[i].get<std::string>() == expected[i];
    if (!ok) bad(field, "must be [", want, "] for this group (written by a different profiler?)");
  }
};

constexpr int64_t kMaxDim = int64_t(1) << 32;  // rows, cols, ctx, ...
constexpr int64_t kMaxElems = int64_t(1) << 48;
constexpr int64_t kMaxTokens = int64_t(1) << 30;
constexpr int kMaxThreads = 4096;
constexpr double kMaxMs = 1e9;
constexpr double kMaxGbps = 1e6;

void read_op_group(const Reader& r, const json& g, const std::string& where, ProfileDB& db) {
  r.check_keys(g, where, {"backend", "threads", "contention", "kind", "dtype", "columns", "points"});
  OpSample base;
  base.backend = r.backend(r.get(g, "backend", where), where + ".backend");
  const bool gpu = base.backend == Backend::Gpu;
  base.threads =
      static_cast<int>(r.integer(r.get(g, "threads", where), where + ".threads", gpu ? 0 : 1, gpu ? 0 : kMaxThreads));
  if (!gpu && std::find(db.threads.begin(), db.threads.end(), base.threads) == db.threads.end())
    r.bad(where + ".threads", base.threads, " is not one of the profile's `threads`");
  if (gpu && !db.has_gpu()) r.bad(where + ".backend", "a gpu group in a profile whose device is cpu");
  base.contention = r.boolean(r.get(g, "contention", where), where + ".contention");
  base.op.kind = r.kind(r.get(g, "kind", where), where + ".kind");
  base.op.dtype = r.dtype(r.get(g, "dtype", where), where + ".dtype");
  const std::vector<std::string> cols = op_columns(base.op.kind, base.contention);
  r.columns(r.get(g, "columns", where), where + ".columns", cols);
  const json& pts = r.array(r.get(g, "points", where), where + ".points");
  if (pts.empty()) r.bad(where + ".points", "must not be empty");
  const bool quantized = dtype_is_quantized(base.op.dtype);
  for (size_t i = 0; i < pts.size(); ++i) {
    const std::string pw = where + ".points[" + std::to_string(i) + "]";
    const json& p = r.array(pts[i], pw);
    if (p.size() != cols.size())
      r.bad(pw, "has ", p.size(), " values, expected ", cols.size(), " (", cols.size(), " columns)");
    auto col = [&](size_t c) { return pw + "[" + std::to_string(c) + "] (" + cols[c] + ")"; };
    OpSample s = base;
    size_t c = 0;
    s.op.tokens = r.integer(p[c], col(c), 1, kMaxTokens);
    ++c;
    switch (s.op.kind) {
      case OpKind::Matmul:
      case OpKind::MoeExperts:
        s.op.rows = r.integer(p[c], col(c), 1, kMaxDim), ++c;
        s.op.cols = r.integer(p[c], col(c), 1, kMaxDim);
        if (quantized && s.op.cols % dtype_block_elems(s.op.dtype) != 0)
          r.bad(col(c), s.op.cols, " is not a multiple of the ", dtype_name(s.op.dtype), " block (",
                dtype_block_elems(s.op.dtype), ")");
        ++c;
        if (s.op.kind == OpKind::MoeExperts) {
          s.op.n_experts = r.integer(p[c], col(c), 1, 1 << 20), ++c;
          s.op.top_k = r.integer(p[c], col(c), 1, s.op.n_experts), ++c;
        }
        break;
      case OpKind::Attention:
      case OpKind::VisionAttention:
        s.op.ctx = r.integer(p[c], col(c), 1, kMaxDim), ++c;
        s.op.n_heads = r.integer(p[c], col(c), 1, 1 << 20), ++c;
        s.op.n_kv_heads = r.integer(p[c], col(c), 1, 1 << 20), ++c;
        s.op.head_dim = r.integer(p[c], col(c), 1, 1 << 20), ++c;
        break;
      default:
        s.op.elems = r.integer(p[c], col(c), 1, kMaxElems), ++c;
    }
    if (s.contention) s.concurrent_gbps = r.number(p[c], col(c), 0, kMaxGbps), ++c;
    s.ms = r.number(p[c], col(c), 0, kMaxMs, true), ++c;
    s.spread = r.number(p[c], col(c), 0, 1e6), ++c;
    s.repeats = static_cast<int>(r.integer(p[c], col(c), 1, 1 << 30));
    db.ops.push_back(s);
  }
}

void read_transfer_group(const Reader& r, const json& g, const std::string& where, ProfileDB& db) {
  r.check_keys(g, where, {"dir", "pinned", "cap_gbps", "burst", "columns", "points"});
  TransferSample base;
  const std::string dir = r.str(r.get(g, "dir", where), where + ".dir");
  if (dir == "h2d")
    base.dir = Direction::HostToDevice;
  else if (dir == "d2h")
    base.dir = Direction::DeviceToHost;
  else
    r.bad(where + ".dir", "unknown direction '", dir, "' (known: h2d, d2h)");
  base.pinned = r.boolean(r.get(g, "pinned", where), where + ".pinned");
  base.cap_gbps = r.number(r.get(g, "cap_gbps", where), where + ".cap_gbps", 0, kMaxGbps);
  bool listed = false;
  for (double c : db.pcie_caps_gbps) listed |= std::fabs(c - base.cap_gbps) <= 1e-9 * std::max(1.0, c);
  if (!listed) r.bad(where + ".cap_gbps", base.cap_gbps, " is not one of the profile's `pcie_caps_gbps`");
  if (g.contains("burst")) base.burst = static_cast<int>(r.integer(g.at("burst"), where + ".burst", 2, 4096));
  r.columns(r.get(g, "columns", where), where + ".columns", kTransferColumns);
  const json& pts = r.array(r.get(g, "points", where), where + ".points");
  if (pts.empty()) r.bad(where + ".points", "must not be empty");
  for (size_t i = 0; i < pts.size(); ++i) {
    const std::string pw = where + ".points[" + std::to_string(i) + "]";
    const json& p = r.array(pts[i], pw);
    if (p.size() != kTransferColumns.size()) r.bad(pw, "has ", p.size(), " values, expected ", kTransferColumns.size());
    auto col = [&](size_t c) { return pw + "[" + std::to_string(c) + "] (" + kTransferColumns[c] + ")"; };
    TransferSample t = base;
    t.bytes = r.unsigned_int(p[0], col(0), 1, uint64_t(1) << 50);
    t.ms = r.number(p[1], col(1), 0, kMaxMs, true);
    t.spread = r.number(p[2], col(2), 0, 1e6);
    t.repeats = static_cast<int>(r.integer(p[3], col(3), 1, 1 << 30));
    db.transfers.push_back(t);
  }
}

// Parses `text` and checks format and version first: a newer file may differ in every other field.
json parse_profile_root(const Reader& r, const std::string& text) {
  json root;
  check_json_depth(text, r.origin);
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail(r.origin, ": not valid JSON (truncated or corrupt file?): ", e.what());
  }
  if (!root.is_object()) fail(r.origin, ": not a shardwise profile (expected a JSON object)");
  const auto fmt = root.find("format");
  if (fmt == root.end() || !fmt->is_string() || fmt->get<std::string>() != kFormatName)
    r.bad("format", "must be \"", kFormatName, "\" (this is not a profile written by `shardwise profile`)");
  const json& ver = r.get(root, "version", "");
  if (!ver.is_number_integer()) r.bad("version", "must be an integer");
  if (ver.get<int64_t>() != kProfileFormatVersion)
    r.bad("version", "format version ", json_brief(ver), " is not supported by this build (it reads version ",
          kProfileFormatVersion, "): re-run `shardwise profile` with this build");
  r.check_keys(
      root, "",
      {"format", "version", "device", "created", "git_rev", "quick", "machine", "threads", "pcie_caps_gbps", "sync_ms",
       "launch_ms", "copy_issue_ms", "paced_copy_issue_ms", "copy_traffic", "ops", "transfers", "dram", "fits"});
  return root;
}

void read_machine(const Reader& r, const json& m, ProfileDB& db) {
  r.check_keys(m, "machine", {"cpu_model", "cpu_cores", "isa", "dram_bytes", "gpu_name", "gpu_driver", "vram_bytes"});
  db.machine.cpu_model = r.str(r.get(m, "cpu_model", "machine"), "machine.cpu_model");
  db.machine.cpu_cores = static_cast<int>(r.integer(r.get(m, "cpu_cores", "machine"), "machine.cpu_cores", 0, 1 << 20));
  db.machine.isa = r.str(r.get(m, "isa", "machine"), "machine.isa");
  if (db.machine.isa != "scalar" && db.machine.isa != "avx2" && db.machine.isa != "avx512")
    r.bad("machine.isa", "'", db.machine.isa, "' must be scalar, avx2 or avx512");
  db.machine.dram_bytes = r.unsigned_int(r.get(m, "dram_bytes", "machine"), "machine.dram_bytes", 0, UINT64_MAX);
  db.machine.gpu_name = r.str(r.get(m, "gpu_name", "machine"), "machine.gpu_name");
  db.machine.gpu_driver =
      static_cast<int>(r.integer(r.get(m, "gpu_driver", "machine"), "machine.gpu_driver", 0, INT32_MAX));
  db.machine.vram_bytes = r.unsigned_int(r.get(m, "vram_bytes", "machine"), "machine.vram_bytes", 0, UINT64_MAX);
  if (db.has_gpu() && db.machine.gpu_name.empty()) r.bad("machine.gpu_name", "must name the GPU of a cuda profile");
}

// threads, pcie_caps_gbps, sync_ms, copy_traffic, launch_ms and the copy issue times.
void read_settings(const Reader& r, const json& root, ProfileDB& db) {
  const json& th = r.array(r.get(root, "threads", ""), "threads");
  if (th.empty()) r.bad("threads", "must list the CPU thread counts measured");
  for (size_t i = 0; i < th.size(); ++i) {
    const std::string f = "threads[" + std::to_string(i) + "]";
    const int t = static_cast<int>(r.integer(th[i], f, 1, kMaxThreads));
    if (i && t <= db.threads.back()) r.bad(f, "thread counts must be ascending without repeats");
    db.threads.push_back(t);
  }
  const json& caps = r.array(r.get(root, "pcie_caps_gbps", ""), "pcie_caps_gbps");
  for (size_t i = 0; i < caps.size(); ++i) {
    const std::string f = "pcie_caps_gbps[" + std::to_string(i) + "]";
    const double c = r.number(caps[i], f, 0, kMaxGbps);
    if (i && c <= db.pcie_caps_gbps.back()) r.bad(f, "caps must be ascending without repeats (0 = none first)");
    db.pcie_caps_gbps.push_back(c);
  }
  db.sync_ms = r.number(r.get(root, "sync_ms", ""), "sync_ms", 0, kMaxMs);
  if (root.contains("copy_traffic")) {  // optional: profiles before it copied both ways
    db.copy_traffic = r.str(root.at("copy_traffic"), "copy_traffic");
    if (db.copy_traffic != "h2d" && db.copy_traffic != "both")
      r.bad("copy_traffic", "'", db.copy_traffic, "' must be h2d or both");
    if (!db.has_gpu()) r.bad("copy_traffic", "copy traffic in a profile whose device is cpu");
  }
  db.launch_ms = r.number(r.get(root, "launch_ms", ""), "launch_ms", 0, kMaxMs);
  for (auto [key, value] : {std::pair<const char*, double*>{"copy_issue_ms", &db.copy_issue_ms},
                            std::pair<const char*, double*>{"paced_copy_issue_ms", &db.paced_copy_issue_ms}})
    if (root.contains(key)) {  // optional: profiles measured before it have none
      *value = r.number(root.at(key), key, 0, kMaxMs);
      if (!db.has_gpu() && *value > 0) r.bad(key, "a copy's issue time in a profile whose device is cpu");
    }
}

DramSample read_dram_row(const Reader& r, const json& row, const std::string& w) {
  r.check_keys(row, w, {"threads", "contention", "concurrent_gbps", "gbps"});
  DramSample d;
  d.threads = static_cast<int>(r.integer(r.get(row, "threads", w), w + ".threads", 1, kMaxThreads));
  d.contention = r.boolean(r.get(row, "contention", w), w + ".contention");
  d.concurrent_gbps = r.number(r.get(row, "concurrent_gbps", w), w + ".concurrent_gbps", 0, kMaxGbps);
  d.gbps = r.number(r.get(row, "gbps", w), w + ".gbps", 0, kMaxGbps, true);
  return d;
}

RooflineFit read_fit(const Reader& r, const json& f, const std::string& w) {
  r.check_keys(f, w,
               {"backend", "kind", "dtype", "threads", "contention", "peak_gflops", "bw_gbps", "overhead_ms", "points",
                "median_rel_err"});
  RooflineFit x;
  x.backend = r.backend(r.get(f, "backend", w), w + ".backend");
  x.kind = r.kind(r.get(f, "kind", w), w + ".kind");
  x.dtype = r.dtype(r.get(f, "dtype", w), w + ".dtype");
  const bool gpu = x.backend == Backend::Gpu;
  x.threads = static_cast<int>(r.integer(r.get(f, "threads", w), w + ".threads", gpu ? 0 : 1, gpu ? 0 : kMaxThreads));
  x.contention = r.boolean(r.get(f, "contention", w), w + ".contention");
  x.peak_gflops = r.number(r.get(f, "peak_gflops", w), w + ".peak_gflops", 0, 1e15, true);
  x.bw_gbps = r.number(r.get(f, "bw_gbps", w), w + ".bw_gbps", 0, 1e12, true);
  x.overhead_ms = r.number(r.get(f, "overhead_ms", w), w + ".overhead_ms", 0, kMaxMs);
  x.points = static_cast<int>(r.integer(r.get(f, "points", w), w + ".points", 1, 1 << 30));
  x.median_rel_err = r.number(r.get(f, "median_rel_err", w), w + ".median_rel_err", 0, 1e9);
  return x;
}

}  // namespace

std::string profile_to_json(const ProfileDB& db) {
  return canonical_json(db, true);
}

ProfileDB profile_from_json(const std::string& text, const std::string& origin) {
  const Reader r{origin.empty() ? std::string("profile") : origin};
  const json root = parse_profile_root(r, text);

  ProfileDB db;
  db.origin = origin;
  db.version = kProfileFormatVersion;
  db.device = r.str(r.get(root, "device", ""), "device");
  if (db.device != "cuda" && db.device != "cpu") r.bad("device", "'", db.device, "' must be cuda or cpu");
  db.created = r.str(r.get(root, "created", ""), "created");
  db.git_rev = r.str(r.get(root, "git_rev", ""), "git_rev");
  db.quick = r.boolean(r.get(root, "quick", ""), "quick");
  read_machine(r, r.get(root, "machine", ""), db);
  read_settings(r, root, db);

  const json& ops = r.array(r.get(root, "ops", ""), "ops");
  for (size_t i = 0; i < ops.size(); ++i) read_op_group(r, ops[i], "ops[" + std::to_string(i) + "]", db);
  const json& tr = r.array(r.get(root, "transfers", ""), "transfers");
  if (!db.has_gpu() && !tr.empty()) r.bad("transfers", "copies in a profile whose device is cpu");
  for (size_t i = 0; i < tr.size(); ++i) read_transfer_group(r, tr[i], "transfers[" + std::to_string(i) + "]", db);
  const json& dram = r.array(r.get(root, "dram", ""), "dram");
  for (size_t i = 0; i < dram.size(); ++i)
    db.dram.push_back(read_dram_row(r, dram[i], "dram[" + std::to_string(i) + "]"));
  const json& fits = r.array(r.get(root, "fits", ""), "fits");
  for (size_t i = 0; i < fits.size(); ++i) db.fits.push_back(read_fit(r, fits[i], "fits[" + std::to_string(i) + "]"));
  return db;
}

ProfileDB load_profile(const std::string& path) {
  return profile_from_json(read_text_file(path), path);
}

void save_profile(const ProfileDB& db, const std::string& path) {
  const std::string text = profile_to_json(db);
  profile_from_json(text, path + " (about to be written)");  // never write a file we would refuse to read
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(path, ": cannot create ", tmp, " (is the folder writable?)");
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail(path, ": write failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, ": cannot replace the file (rename from ", tmp, " failed)");
  }
}

std::string profile_hash(const ProfileDB& db) {
  const std::string text = canonical_json(db, false);
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace shardwise

// core/gguf.cpp — GGUF v3 reader and writer (see gguf.h for the validation contract).
#include "core/gguf.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace shardwise {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 4;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint64_t kMaxDimValue = uint64_t(1) << 40;
// Limits far above any real file (a few hundred KVs and tensors, vocabularies of ~256K tokens: their
// tokens, types, scores and merges are ~0.5-1M array elements) that bound the memory the parsed metadata
// may take, whatever the counts in a corrupt file say: a parsed element takes ~100 bytes, so a file of
// 4 MiB of one-byte elements may take ~400 MB, and no more.
constexpr uint64_t kMaxTensors = uint64_t(1) << 20;
constexpr uint64_t kMaxMetadataKvs = uint64_t(1) << 20;
constexpr uint64_t kMaxMetadataElems = uint64_t(1) << 22;  // array elements over all keys
constexpr uint64_t kReserveCap = uint64_t(1) << 16;        // grow beyond this only as data is read

// Bounds-checked little-endian reader over the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size) : path_(path), data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <typename... Args>
  [[noreturn]] void error_at(uint64_t offset, const Args&... args) const {
    fail(path_, ": offset ", offset, ": ", args...);
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      error_at(pos_, "file ends while reading ", what, " (need ", n, " bytes, ", remaining(),
               " left; the file is truncated or corrupt)");
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    uint64_t at = pos_;
    uint64_t n = read<uint64_t>(what);
    if (n > remaining()) error_at(at, what, ": string length ", n, " runs past the end of the file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    case GgufType::STRING:
      return 8;
    case GgufType::ARRAY:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= 12;
}

GgufValue read_value(Cursor& c, GgufType type, int depth, const std::string& key, uint64_t* elems_left) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8:
      v.u = c.read<uint8_t>("u8 value");
      break;
    case GgufType::I8:
      v.i = c.read<int8_t>("i8 value");
      break;
    case GgufType::U16:
      v.u = c.read<uint16_t>("u16 value");
      break;
    case GgufType::I16:
      v.i = c.read<int16_t>("i16 value");
      break;
    case GgufType::U32:
      v.u = c.read<uint32_t>("u32 value");
      break;
    case GgufType::I32:
      v.i = c.read<int32_t>("i32 value");
      break;
    case GgufType::U64:
      v.u = c.read<uint64_t>("u64 value");
      break;
    case GgufType::I64:
      v.i = c.read<int64_t>("i64 value");
      break;
    case GgufType::F32:
      v.f = c.read<float>("f32 value");
      break;
    case GgufType::F64:
      v.f = c.read<double>("f64 value");
      break;
    case GgufType::BOOL: {
      uint64_t at = c.pos();
      uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.error_at(at, "metadata '", key, "': bool value ", int(b), " is not 0 or 1");
      v.u = b;
      break;
    }
    case GgufType::STRING:
      v.s = c.read_string("string value");
      break;
    case GgufType::ARRAY: {
      uint64_t at = c.pos();
      if (depth >= kMaxArrayDepth) c.error_at(at, "metadata '", key, "': arrays nested deeper than ", kMaxArrayDepth);
      uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_type(et)) c.error_at(at, "metadata '", key, "': unknown array element type ", et);
      uint64_t n = c.read<uint64_t>("array length");
      v.array_type = static_cast<GgufType>(et);
      if (n > c.remaining() / min_encoded_size(v.array_type))
        c.error_at(at, "metadata '", key, "': array of ", n, " ", gguf_type_name(v.array_type),
                   " elements cannot fit in the ", c.remaining(), " bytes left (the file is truncated or corrupt)");
      if (n > *elems_left)
        c.error_at(at, "metadata '", key, "': array of ", n, " elements exceeds the limit of ", kMaxMetadataElems,
                   " metadata array elements per file (corrupt file?)");
      *elems_left -= n;
      v.array.reserve(static_cast<size_t>(std::min(n, kReserveCap)));
      for (uint64_t i = 0; i < n; ++i) v.array.push_back(read_value(c, v.array_type, depth + 1, key, elems_left));
      break;
    }
  }
  return v;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// One tensor info at the cursor: name, dimensions, type and data offset, each checked against the
// limits and the file's alignment.
GgufTensorInfo read_tensor_info(Cursor& c, uint64_t alignment) {
  GgufTensorInfo t;
  t.info_offset = c.pos();
  t.name = c.read_string("tensor name");
  uint64_t dat = c.pos();
  uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
  if (n_dims == 0 || n_dims > kMaxDims)
    c.error_at(dat, "tensor '", t.name, "': ", n_dims, " dimensions (must be 1..", kMaxDims, ")");
  uint64_t elems = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t nat = c.pos();
    uint64_t n = c.read<uint64_t>("tensor dimension");
    if (n == 0 || n > kMaxDimValue)
      c.error_at(nat, "tensor '", t.name, "': dimension ", d, " (ne[", d, "]) = ", n, " is out of range (1..",
                 kMaxDimValue, ")");
    if (elems > (uint64_t(1) << 50) / n)
      c.error_at(nat, "tensor '", t.name, "': element count exceeds 2^50 (the file is corrupt)");
    elems *= n;
    t.ne.push_back(n);
  }
  uint64_t tyat = c.pos();
  t.type_id = c.read<uint32_t>("tensor type");
  uint32_t be = 0, bb = 0;
  if (!ggml_type_block(t.type_id, &be, &bb))
    c.error_at(tyat, "tensor '", t.name, "': unknown tensor type id ", t.type_id);
  if (t.ne[0] % be != 0)
    c.error_at(dat, "tensor '", t.name, "': row of ", t.ne[0], " elements is not a multiple of the ",
               ggml_type_name(t.type_id), " block size ", be);
  t.nbytes = elems / be * bb;
  uint64_t oat = c.pos();
  t.offset = c.read<uint64_t>("tensor data offset");
  if (t.offset % alignment != 0)
    c.error_at(oat, "tensor '", t.name, "': data offset ", t.offset, " is not a multiple of the alignment ", alignment);
  t.shape.assign(t.ne.rbegin(), t.ne.rend());  // every ne <= 2^40, so the int64 shape is exact
  return t;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  uint32_t i = static_cast<uint32_t>(t);
  return i <= 12 ? kNames[i] : "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
      return true;
    default:
      return false;
  }
}

int64_t GgufValue::as_int(const std::string& ctx) const {
  switch (type) {
    case GgufType::U8:
    case GgufType::U16:
    case GgufType::U32:
    case GgufType::U64:
      if (u > static_cast<uint64_t>(INT64_MAX)) fail(ctx, ": value ", u, " is too large");
      return static_cast<int64_t>(u);
    case GgufType::I8:
    case GgufType::I16:
    case GgufType::I32:
    case GgufType::I64:
      return i;
    default:
      fail(ctx, ": expected an integer, found ", gguf_type_name(type));
  }
}
double GgufValue::as_double(const std::string& ctx) const {
  if (type == GgufType::F32 || type == GgufType::F64) return f;
  if (is_integer()) return static_cast<double>(as_int(ctx));
  fail(ctx, ": expected a number, found ", gguf_type_name(type));
}
const std::string& GgufValue::as_string(const std::string& ctx) const {
  if (type != GgufType::STRING) fail(ctx, ": expected a string, found ", gguf_type_name(type));
  return s;
}
bool GgufValue::as_bool(const std::string& ctx) const {
  if (type == GgufType::BOOL) return u != 0;
  if (is_integer()) return as_int(ctx) != 0;
  fail(ctx, ": expected a bool, found ", gguf_type_name(type));
}

GgufValue GgufValue::of_u32(uint32_t x) {
  GgufValue v;
  v.type = GgufType::U32;
  v.u = x;
  return v;
}
GgufValue GgufValue::of_i32(int32_t x) {
  GgufValue v;
  v.type = GgufType::I32;
  v.i = x;
  return v;
}
GgufValue GgufValue::of_u64(uint64_t x) {
  GgufValue v;
  v.type = GgufType::U64;
  v.u = x;
  return v;
}
GgufValue GgufValue::of_f32(float x) {
  GgufValue v;
  v.type = GgufType::F32;
  v.f = x;
  return v;
}
GgufValue GgufValue::of_bool(bool x) {
  GgufValue v;
  v.type = GgufType::BOOL;
  v.u = x ? 1 : 0;
  return v;
}
GgufValue GgufValue::of_string(std::string x) {
  GgufValue v;
  v.type = GgufType::STRING;
  v.s = std::move(x);
  return v;
}
GgufValue GgufValue::of_strings(const std::vector<std::string>& xs) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.array_type = GgufType::STRING;
  for (const auto& x : xs) v.array.push_back(of_string(x));
  return v;
}
GgufValue GgufValue::of_f32s(const std::vector<float>& xs) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.array_type = GgufType::F32;
  for (float x : xs) v.array.push_back(of_f32(x));
  return v;
}
GgufValue GgufValue::of_i32s(const std::vector<int32_t>& xs) {
  GgufValue v;
  v.type = GgufType::ARRAY;
  v.array_type = GgufType::I32;
  for (int32_t x : xs) v.array.push_back(of_i32(x));
  return v;
}

// ---------------------------------------------------------------------------------------------

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  Cursor c(path, file_->data(), file_->size());
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic) c.error_at(0, "bad magic (not a GGUF file)");
  uint64_t at = c.pos();
  version_ = c.read<uint32_t>("version");
  if (version_ == 0x03000000 || version_ == 0x02000000) c.error_at(at, "big-endian GGUF files are not supported");
  if (version_ != 2 && version_ != 3)
    c.error_at(at, "GGUF version ", version_, " is not supported (need version 3; re-convert the model)");
  at = c.pos();
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each tensor info takes >= 8+1+4+8+4+8 bytes; each KV >= 8+1+4+1 bytes.
  if (n_tensors > c.remaining() / 33 || n_tensors > kMaxTensors)
    c.error_at(at, "tensor count ", n_tensors, " cannot fit in the file (", c.remaining(),
               " bytes left; the file is truncated or corrupt)");
  if (n_kv > c.remaining() / 14 || n_kv > kMaxMetadataKvs)
    c.error_at(at + 8, "metadata count ", n_kv, " cannot fit in the file (", c.remaining(),
               " bytes left; the file is truncated or corrupt)");
  if (n_tensors * 33 + n_kv * 14 > c.remaining())
    c.error_at(at, "tensor count ", n_tensors, " and metadata count ", n_kv, " cannot both fit in the file (",
               c.remaining(), " bytes left; the file is truncated or corrupt)");

  uint64_t elems_left = kMaxMetadataElems;
  for (uint64_t k = 0; k < n_kv; ++k) {
    uint64_t kat = c.pos();
    std::string key = c.read_string("metadata key");
    uint64_t tat = c.pos();
    uint32_t t = c.read<uint32_t>("metadata value type");
    if (!valid_type(t)) c.error_at(tat, "metadata '", key, "': unknown value type ", t);
    GgufValue v = read_value(c, static_cast<GgufType>(t), 0, key, &elems_left);
    if (kv_.count(key)) c.error_at(kat, "duplicate metadata key '", key, "'");
    kv_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = find("general.alignment")) {
    int64_t al = a->as_int(path + ": metadata general.alignment");
    if (al <= 0 || al > 65536 || (al & (al - 1)) != 0)
      fail(path, ": metadata general.alignment = ", al, " must be a power of two up to 65536 (the file is corrupt)");
    alignment_ = static_cast<uint64_t>(al);
  }

  tensors_.reserve(static_cast<size_t>(std::min(n_tensors, kReserveCap)));
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    GgufTensorInfo t = read_tensor_info(c, alignment_);
    if (tensor_index_.count(t.name)) c.error_at(t.info_offset, "duplicate tensor name '", t.name, "'");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  check_data_section(c.pos(), n_tensors);
}

// The data section after the tensor infos (which end at infos_end): zero padding up to its aligned
// start, every tensor inside it, none overlapping, and the tensors tiling it.
void GgufFile::check_data_section(uint64_t infos_end, uint64_t n_tensors) {
  const std::string& path = file_->path();
  data_offset_ = align_up(infos_end, alignment_);
  if (data_offset_ > file_->size() && !tensors_.empty())
    fail(path, ": offset ", infos_end, ": the tensor data section starts past the end of the file (truncated)");
  // What lies between the last tensor info and the data is zero padding (fewer bytes than the
  // alignment): a tensor count one short leaves the last tensor's info there instead.
  for (uint64_t i = infos_end; i < std::min<uint64_t>(data_offset_, file_->size()); ++i)
    if (file_->data()[i] != 0)
      fail(path, ": offset ", i, ": byte ", static_cast<int>(file_->data()[i]),
           " between the tensor infos and the tensor data, where only zero "
           "padding belongs (is the tensor count of ",
           n_tensors, " too small? the file is corrupt)");
  const uint64_t data_size = file_->size() > data_offset_ ? file_->size() - data_offset_ : 0;

  // Every tensor inside the data section, and no two overlapping.
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail(path, ": offset ", t.info_offset, ": tensor '", t.name, "': data [", t.offset, ", ", t.offset + t.nbytes,
           ") runs past the end of the data section (", data_size, " bytes; the file is truncated or corrupt)");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    if (cur->offset < prev->offset + prev->nbytes)
      fail(path, ": offset ", cur->info_offset, ": tensor '", cur->name, "': data [", cur->offset, ", ",
           cur->offset + cur->nbytes, ") overlaps tensor '", prev->name, "' [", prev->offset, ", ",
           prev->offset + prev->nbytes, ") (offsets relative to the data section; the file is corrupt)");
  }
  check_tiling(by_offset, data_size);
}

// The tensors tile the data section as GGUF writers lay it out: the first at 0, each next one at the
// aligned end of the one before, the file ending at the last one's end (padded to the alignment or
// not). A gap or trailing bytes mean the offsets, the count or the length are not what was written.
void GgufFile::check_tiling(const std::vector<const GgufTensorInfo*>& by_offset, uint64_t data_size) const {
  const std::string& path = file_->path();
  uint64_t end = 0;
  for (const GgufTensorInfo* t : by_offset) {
    if (t->offset != align_up(end, alignment_))
      fail(path, ": offset ", t->info_offset, ": tensor '", t->name, "': data at ", t->offset,
           " leaves a gap after the ",
           end == 0 ? "start of the data section" : "tensor before it, which ends at " + std::to_string(end),
           " (GGUF tensors follow one another at the alignment of ", alignment_, "; the file is corrupt)");
    end = t->offset + t->nbytes;
  }
  if (data_size > align_up(end, alignment_))
    fail(path, ": offset ", data_offset_ + end, ": ", data_size - end,
         " bytes after the last tensor's data belong to no tensor ",
         "(is the tensor count too small? the file is corrupt)");
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

TensorView GgufFile::view(const GgufTensorInfo& t) const {
  TensorView v;
  v.dtype = dtype_from_ggml(t.type_id, path() + ": tensor '" + t.name + "'");
  v.shape = t.shape;
  v.data = tensor_data(t);
  v.nbytes = t.nbytes;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

class FileOut {
 public:
  explicit FileOut(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) fail(path, ": cannot create (", std::strerror(errno), ")");
  }
  ~FileOut() {
    if (f_) std::fclose(f_);
  }
  void bytes(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) fail(path_, ": write failed (", std::strerror(errno), ")");
    pos_ += n;
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[64] = {};
    uint64_t target = align_up(pos_, alignment);
    while (pos_ < target) bytes(zeros, static_cast<size_t>(std::min<uint64_t>(64, target - pos_)));
  }
  void close() {
    if (std::fflush(f_) != 0 || std::fclose(f_) != 0) {
      f_ = nullptr;
      fail(path_, ": write failed (", std::strerror(errno), ")");
    }
    f_ = nullptr;
  }
  uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t pos_ = 0;
};

void write_value(FileOut& out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::U8:
      out.put<uint8_t>(static_cast<uint8_t>(v.u));
      break;
    case GgufType::I8:
      out.put<int8_t>(static_cast<int8_t>(v.i));
      break;
    case GgufType::U16:
      out.put<uint16_t>(static_cast<uint16_t>(v.u));
      break;
    case GgufType::I16:
      out.put<int16_t>(static_cast<int16_t>(v.i));
      break;
    case GgufType::U32:
      out.put<uint32_t>(static_cast<uint32_t>(v.u));
      break;
    case GgufType::I32:
      out.put<int32_t>(static_cast<int32_t>(v.i));
      break;
    case GgufType::U64:
      out.put<uint64_t>(v.u);
      break;
    case GgufType::I64:
      out.put<int64_t>(v.i);
      break;
    case GgufType::F32:
      out.put<float>(static_cast<float>(v.f));
      break;
    case GgufType::F64:
      out.put<double>(v.f);
      break;
    case GgufType::BOOL:
      out.put<uint8_t>(v.u ? 1 : 0);
      break;
    case GgufType::STRING:
      out.str(v.s);
      break;
    case GgufType::ARRAY:
      SW_CHECK(static_cast<uint32_t>(v.array_type) <= 12, "gguf writer: metadata '", key,
               "': invalid array element type ", static_cast<uint32_t>(v.array_type));
      out.put<uint32_t>(static_cast<uint32_t>(v.array_type));
      out.put<uint64_t>(v.array.size());
      for (const auto& e : v.array) {
        // The file declares one element type per array; a mismatched element would corrupt it.
        SW_CHECK(e.type == v.array_type, "gguf writer: metadata '", key, "': array of ", gguf_type_name(v.array_type),
                 " holds a ", gguf_type_name(e.type), " element");
        write_value(out, e, key);
      }
      break;
  }
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, const TensorView& view) {
  // The reader accepts 1..4 dimensions of at least one element; never write what it would refuse.
  SW_CHECK(!view.shape.empty() && view.shape.size() <= kMaxDims, "gguf writer: tensor '", name, "' has ",
           view.shape.size(), " dimensions (GGUF allows 1..", kMaxDims, ")");
  for (int64_t d : view.shape)
    SW_CHECK(d >= 1 && static_cast<uint64_t>(d) <= kMaxDimValue, "gguf writer: tensor '", name, "' has shape ",
             shape_str(view.shape), " (every dimension must be 1..", kMaxDimValue, ")");
  SW_CHECK(view.nbytes == tensor_bytes(view.dtype, view.shape), "gguf writer: tensor '", name, "' has ", view.nbytes,
           " bytes but its shape needs ", tensor_bytes(view.dtype, view.shape));
  for (const auto& t : tensors_) SW_CHECK(t.first != name, "gguf writer: duplicate tensor '", name, "'");
  tensors_.emplace_back(name, view);
}

void GgufWriter::write(const std::string& path) const {
  SW_CHECK(alignment_ > 0 && alignment_ <= 65536 && (alignment_ & (alignment_ - 1)) == 0, path,
           ": gguf writer: alignment ", alignment_, " must be a power of two up to 65536");
  for (const auto& kv : kv_) {
    if (kv.first != "general.alignment") continue;
    SW_CHECK(
        kv.second.is_integer() && kv.second.as_int(path + ": general.alignment") == static_cast<int64_t>(alignment_),
        path, ": gguf writer: metadata general.alignment must equal the writer's alignment ", alignment_,
        " (pass the alignment to the GgufWriter constructor)");
  }
  for (const auto& kv : kv_) {
    SW_CHECK(static_cast<uint32_t>(kv.second.type) <= 12, path, ": gguf writer: metadata '", kv.first,
             "' has an invalid type");
  }
  const std::string tmp = path + ".tmp";
  try {
    FileOut out(tmp);
    out.put<uint32_t>(kGgufMagic);
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors_.size());
    bool has_alignment = false;
    for (const auto& kv : kv_) has_alignment = has_alignment || kv.first == "general.alignment";
    out.put<uint64_t>(kv_.size() + ((alignment_ != 32 && !has_alignment) ? 1 : 0));
    for (const auto& kv : kv_) {
      out.str(kv.first);
      out.put<uint32_t>(static_cast<uint32_t>(kv.second.type));
      write_value(out, kv.second, kv.first);
    }
    if (alignment_ != 32 && !has_alignment) {
      out.str("general.alignment");
      out.put<uint32_t>(static_cast<uint32_t>(GgufType::U32));
      out.put<uint32_t>(static_cast<uint32_t>(alignment_));
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      out.str(t.first);
      const Shape& s = t.second.shape;
      out.put<uint32_t>(static_cast<uint32_t>(s.size()));
      for (auto it = s.rbegin(); it != s.rend(); ++it) out.put<uint64_t>(static_cast<uint64_t>(*it));
      out.put<uint32_t>(static_cast<uint32_t>(t.second.dtype));
      out.put<uint64_t>(offset);
      offset = align_up(offset + t.second.nbytes, alignment_);
    }
    out.pad_to(alignment_);
    for (const auto& t : tensors_) {
      const uint8_t* p = static_cast<const uint8_t*>(t.second.data);
      uint64_t left = t.second.nbytes;
      while (left > 0) {
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, uint64_t(1) << 28));
        out.bytes(p, chunk);
        p += chunk;
        left -= chunk;
      }
      out.pad_to(alignment_);
    }
    out.close();
  } catch (...) {
    std::remove(tmp.c_str());  // never leave a half-written file behind
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    fail(path, ": cannot rename the written file into place (", std::strerror(e), ")");
  }
}

}  // namespace shardwise

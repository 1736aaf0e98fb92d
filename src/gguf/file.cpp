#include "gguf/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "wgllm/error.h"

namespace wgllm {

namespace {

// "a directory", "a FIFO", ... for the error on a path that is not a regular file.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

// ---- metadata value types ---------------------------------------------------

const char* value_type_name(GgufValueType t) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::string GgufValue::type_string() const {
  if (type != GgufValueType::Array) return value_type_name(type);
  return std::string("array of ") + value_type_name(std::get<GgufArray>(v).elem_type());
}

std::string GgufTensor::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// ---- array views -----------------------------------------------------------

namespace {

// Bytes of one number or bool of type t; 0 for strings and arrays (their size is in their bytes).
uint64_t fixed_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::Bool: return 1;
    case GgufValueType::U16:
    case GgufValueType::I16: return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32: return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64: return 8;
    case GgufValueType::String:
    case GgufValueType::Array: return 0;
  }
  return 0;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Encoded size of the element of type t at p, in bytes the parser has checked.
uint64_t element_bytes(const uint8_t* p, GgufValueType t) {
  if (const uint64_t n = fixed_bytes(t)) return n;
  if (t == GgufValueType::String) return 8 + load<uint64_t>(p);
  const auto et = static_cast<GgufValueType>(load<uint32_t>(p));
  const auto n = load<uint64_t>(p + 4);
  if (const uint64_t size = fixed_bytes(et)) return 12 + n * size;
  uint64_t b = 12;
  for (uint64_t i = 0; i < n; ++i) b += element_bytes(p + b, et);
  return b;
}

[[noreturn]] void wrong_type(GgufValueType have, const char* want) {
  throw std::logic_error(std::string("GgufArray: ") + want + " access to an array of " + value_type_name(have));
}

}  // namespace

// The parser's way in: it checks the bytes and records the marks as it goes.
struct GgufArrayAccess {
  static GgufArray make(GgufValueType et, uint64_t count, const uint8_t* first) {
    GgufArray a;
    a.elem_type_ = et;
    a.count_ = count;
    a.first_ = first;
    if (fixed_bytes(et) == 0) a.marks_.reserve(count / GgufArray::kStride + 1);
    return a;
  }
  static void mark(GgufArray& a, uint64_t offset) { a.marks_.push_back(offset); }
};

GgufArray GgufArray::at(const uint8_t* p) {
  const auto et = static_cast<GgufValueType>(load<uint32_t>(p));
  GgufArray a = GgufArrayAccess::make(et, load<uint64_t>(p + 4), p + 12);
  if (fixed_bytes(et) == 0) {
    uint64_t off = 0;
    for (uint64_t i = 0; i < a.count_; ++i) {
      if (i % kStride == 0) a.marks_.push_back(off);
      off += element_bytes(a.first_ + off, et);
    }
  }
  return a;
}

std::span<const uint8_t> GgufArray::bytes() const {
  return {first_, static_cast<size_t>(count_ * fixed_bytes(elem_type_))};
}

const uint8_t* GgufArray::element(size_t i) const {
  if (i >= count_) throw std::out_of_range("GgufArray: element " + std::to_string(i) + " of " + std::to_string(count_));
  if (const uint64_t size = fixed_bytes(elem_type_)) return first_ + i * size;
  const uint8_t* p = first_ + marks_[i / kStride];
  for (size_t j = 0; j < i % kStride; ++j) p += element_bytes(p, elem_type_);
  return p;
}

uint64_t GgufArray::u64(size_t i) const {
  switch (elem_type_) {
    case GgufValueType::U8: return load<uint8_t>(element(i));
    case GgufValueType::U16: return load<uint16_t>(element(i));
    case GgufValueType::U32: return load<uint32_t>(element(i));
    case GgufValueType::U64: return load<uint64_t>(element(i));
    default: wrong_type(elem_type_, "unsigned integer");
  }
}

int64_t GgufArray::i64(size_t i) const {
  switch (elem_type_) {
    case GgufValueType::I8: return load<int8_t>(element(i));
    case GgufValueType::I16: return load<int16_t>(element(i));
    case GgufValueType::I32: return load<int32_t>(element(i));
    case GgufValueType::I64: return load<int64_t>(element(i));
    default: wrong_type(elem_type_, "signed integer");
  }
}

double GgufArray::f64(size_t i) const {
  switch (elem_type_) {
    case GgufValueType::F32: return load<float>(element(i));
    case GgufValueType::F64: return load<double>(element(i));
    default: wrong_type(elem_type_, "float");
  }
}

bool GgufArray::boolean(size_t i) const {
  if (elem_type_ != GgufValueType::Bool) wrong_type(elem_type_, "bool");
  return load<uint8_t>(element(i)) != 0;
}

std::string_view GgufArray::string(size_t i) const {
  if (elem_type_ != GgufValueType::String) wrong_type(elem_type_, "string");
  const uint8_t* p = element(i);
  return {reinterpret_cast<const char*>(p + 8), static_cast<size_t>(load<uint64_t>(p))};
}

std::vector<std::string> GgufArray::strings() const {
  if (elem_type_ != GgufValueType::String) wrong_type(elem_type_, "string");
  std::vector<std::string> out;
  out.reserve(count_);
  const uint8_t* p = first_;
  for (uint64_t i = 0; i < count_; ++i) {
    const auto n = load<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), static_cast<size_t>(n));
    p += 8 + n;
  }
  return out;
}

GgufArray GgufArray::array(size_t i) const {
  if (elem_type_ != GgufValueType::Array) wrong_type(elem_type_, "array");
  return at(element(i));
}

// ---- the mmap --------------------------------------------------------------

struct GgufFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path, Parts parts) {
  GgufFile f;
  f.label_ = path;
  f.metadata_only_ = parts == Parts::MetadataOnly;
  // What the path is, before opening it: opening a FIFO for reading would wait for a writer.
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) throw ModelError(path + ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(before.st_mode)) throw ModelError(path + ": " + file_kind(before.st_mode) + ", not a regular file");
  // O_NONBLOCK: should the path be swapped for a FIFO meanwhile, the open still returns (and fstat below refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ModelError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw ModelError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ModelError(path + ": " + file_kind(st.st_mode) + ", not a regular file");
  }
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw ModelError(path + ": cannot map: " + std::strerror(e));
    f.mapping_ = std::make_unique<Mapping>();
    f.mapping_->addr = p;
    f.mapping_->size = f.size_;
    f.data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  f.parse();
  return f;
}

GgufFile GgufFile::from_bytes(std::span<const uint8_t> bytes, const std::string& label) {
  GgufFile f;
  f.label_ = label;
  f.owned_.assign(bytes.begin(), bytes.end());
  f.data_ = f.owned_.data();
  f.size_ = f.owned_.size();
  f.parse();
  return f;
}

// ---- the parser ------------------------------------------------------------

namespace {

constexpr uint32_t kMaxNesting = 8;  // arrays of arrays of ...

// Smallest encoded size of one value of type t (a string needs its 8-byte length; an array its type + length).
uint64_t min_value_bytes(uint32_t t) {
  const auto type = static_cast<GgufValueType>(t);
  if (type == GgufValueType::String) return 8;
  if (type == GgufValueType::Array) return 12;
  return fixed_bytes(type);  // 0 for an id that is no type
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& label) : p_(data), size_(size), label_(label) {}

  uint64_t pos() const { return pos_; }
  const uint8_t* here() const { return p_ + pos_; }
  uint64_t left() const { return size_ - pos_; }
  void set_context(std::string c) { context_ = std::move(c); }

  [[noreturn]] void fail(const std::string& what, uint64_t at) const {
    std::ostringstream s;
    s << label_ << ": byte " << at << ": " << context_ << (context_.empty() ? "" : ": ") << what;
    throw ModelError(s.str());
  }

  void need(uint64_t n, const char* what) {
    if (n > left()) {
      std::ostringstream s;
      s << "truncated: " << what << " needs " << n << " bytes, " << left() << " left";
      fail(s.str(), pos_);
    }
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A count of items that each take at least `min_bytes` in the rest of the file.
  uint64_t read_count(const char* what, uint64_t min_bytes) {
    const uint64_t at = pos_;
    const auto n = read<uint64_t>(what);
    if (min_bytes && n > left() / min_bytes) {
      std::ostringstream s;
      s << what << " " << n << " exceeds the " << left() << " bytes left";
      fail(s.str(), at);
    }
    return n;
  }

  // A string's bytes, checked and passed over.
  std::string_view skip_string(const char* what) {
    const uint64_t at = pos_;
    const auto n = read<uint64_t>(what);
    if (n > left()) {
      std::ostringstream s;
      s << what << " length " << n << " exceeds the " << left() << " bytes left";
      fail(s.str(), at);
    }
    const std::string_view str(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return str;
  }
  std::string read_string(const char* what) { return std::string(skip_string(what)); }

  // n elements of `size` bytes each (n * size cannot overflow: n was checked by read_count).
  void skip(uint64_t n, uint64_t size, const char* what) {
    need(n * size, what);
    pos_ += n * size;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& label_;
  std::string context_;
};

void read_scalar(Reader& r, GgufValueType t, GgufValue& out) {
  switch (t) {
    case GgufValueType::U8: out.v = uint64_t{r.read<uint8_t>("u8 value")}; break;
    case GgufValueType::U16: out.v = uint64_t{r.read<uint16_t>("u16 value")}; break;
    case GgufValueType::U32: out.v = uint64_t{r.read<uint32_t>("u32 value")}; break;
    case GgufValueType::U64: out.v = uint64_t{r.read<uint64_t>("u64 value")}; break;
    case GgufValueType::I8: out.v = int64_t{r.read<int8_t>("i8 value")}; break;
    case GgufValueType::I16: out.v = int64_t{r.read<int16_t>("i16 value")}; break;
    case GgufValueType::I32: out.v = int64_t{r.read<int32_t>("i32 value")}; break;
    case GgufValueType::I64: out.v = int64_t{r.read<int64_t>("i64 value")}; break;
    case GgufValueType::F32: out.v = double{r.read<float>("f32 value")}; break;
    case GgufValueType::F64: out.v = r.read<double>("f64 value"); break;
    case GgufValueType::Bool: out.v = r.read<uint8_t>("bool value") != 0; break;
    case GgufValueType::String: out.v = r.read_string("string"); break;
    case GgufValueType::Array: break;  // handled by read_array
  }
}

// Checks an array's bytes and returns its view.
GgufArray read_array(Reader& r, uint32_t depth) {
  const uint64_t at = r.pos();
  if (depth > kMaxNesting) r.fail("arrays nested deeper than " + std::to_string(kMaxNesting), at);
  const auto et = r.read<uint32_t>("array element type");
  const uint64_t min = min_value_bytes(et);
  if (min == 0) r.fail("unknown array element type " + std::to_string(et), at);
  const uint64_t n = r.read_count("array length", min);
  const auto type = static_cast<GgufValueType>(et);
  GgufArray a = GgufArrayAccess::make(type, n, r.here());
  if (const uint64_t size = fixed_bytes(type)) {
    r.skip(n, size, "array elements");
    return a;
  }
  const uint64_t first = r.pos();
  for (uint64_t i = 0; i < n; ++i) {
    if (i % GgufArray::kStride == 0) GgufArrayAccess::mark(a, r.pos() - first);
    if (type == GgufValueType::String)
      r.skip_string("string element");
    else
      read_array(r, depth + 1);
  }
  return a;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

}  // namespace

void GgufFile::parse() {
  Reader r(data_, size_, label_);
  // ---- header
  r.set_context("header");
  if (size_ < 4 || std::memcmp(data_, "GGUF", 4) != 0) {
    if (size_ < 4) r.fail("truncated: file has " + std::to_string(size_) + " bytes, not a GGUF file", 0);
    r.fail("bad magic (not a GGUF file)", 0);
  }
  r.read<uint32_t>("magic");
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    std::string msg = "GGUF version " + std::to_string(version_) + " is not supported (supported: 2, 3)";
    if (version_ == 1) msg = "GGUF version 1 is not supported (supported: 2, 3; re-convert the model)";
    if (version_ > 0xFFFF && (version_ >> 24) <= 3) msg += "; big-endian file?";
    r.fail(msg, 4);
  }
  // Each tensor info takes at least 32 bytes (name length, n_dims, one dim, type, offset); each KV 13.
  const uint64_t n_tensors = r.read_count("tensor count", 32);
  const uint64_t n_kv = r.read_count("metadata key count", 13);
  if (n_tensors * 32 > r.left() || n_kv > (r.left() - n_tensors * 32) / 13)
    r.fail("metadata key count " + std::to_string(n_kv) + " and tensor count " + std::to_string(n_tensors) +
               " exceed the " + std::to_string(r.left()) + " bytes left",
           16);

  // ---- metadata
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = r.pos();
    r.set_context("metadata key #" + std::to_string(i));
    std::string key = r.read_string("key");
    r.set_context("metadata key #" + std::to_string(i) + " (" + quoted(key) + ")");
    if (kv_.count(key)) r.fail("duplicate key", at);
    GgufValue val;
    const uint64_t type_at = r.pos();
    const auto t = r.read<uint32_t>("value type");
    if (min_value_bytes(t) == 0) r.fail("unknown value type " + std::to_string(t), type_at);
    val.type = static_cast<GgufValueType>(t);
    val.offset = r.pos();
    if (val.type == GgufValueType::Array)
      val.v = read_array(r, 1);
    else
      read_scalar(r, val.type, val);
    kv_.emplace(std::move(key), std::move(val));
  }

  // ---- alignment
  r.set_context("");
  if (const GgufValue* a = find("general.alignment")) {
    const uint32_t align = get_u32("general.alignment");
    if (align == 0 || (align & (align - 1)) != 0)
      r.fail("key 'general.alignment': " + std::to_string(align) + " is not a power of two", a->offset);
    alignment_ = align;
  }

  if (metadata_only_) return;

  // ---- tensor infos
  tensors_.reserve(n_tensors);  // bounded by the bytes left (32 per tensor)
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.info_offset = r.pos();
    r.set_context("tensor #" + std::to_string(i));
    t.name = r.read_string("tensor name");
    r.set_context("tensor #" + std::to_string(i) + " (" + quoted(t.name) + ")");
    if (tensor_index_.count(t.name)) r.fail("duplicate tensor name", t.info_offset);
    const uint64_t dims_at = r.pos();
    t.n_dims = r.read<uint32_t>("n_dims");
    if (t.n_dims == 0 || t.n_dims > 4) r.fail("n_dims " + std::to_string(t.n_dims) + " is outside 1..4", dims_at);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t at = r.pos();
      t.ne[d] = r.read<uint64_t>("dimension");
      if (t.ne[d] == 0) r.fail("dimension " + std::to_string(d) + " is 0", at);
      if (t.ne[d] > uint64_t(std::numeric_limits<int64_t>::max()) || mul_overflows(n_el, t.ne[d], &n_el))
        r.fail("dimensions " + t.shape_string() + "... overflow 64 bits", at);
    }
    if (n_el > uint64_t(std::numeric_limits<int64_t>::max()))
      r.fail("dimensions " + t.shape_string() + " overflow 63 bits", dims_at);
    t.n_elements = n_el;
    const uint64_t type_at = r.pos();
    const auto type_id = r.read<uint32_t>("tensor type");
    if (!is_known_type(type_id)) {
      const char* name = ggml_type_name(type_id);
      if (!name) r.fail("unknown tensor type id " + std::to_string(type_id), type_at);
      r.fail(std::string("type ") + name + " (id " + std::to_string(type_id) +
                 ") was removed from ggml: no GGUF file holds it",
             type_at);
    }
    t.type = static_cast<GgufType>(type_id);
    const uint64_t be = block_elems(t.type);
    if (t.ne[0] % be != 0)
      r.fail("row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + type_name(t.type) +
                 " block size " + std::to_string(be),
             dims_at);
    uint64_t row_bytes = 0, n_bytes = 0;
    if (mul_overflows(t.ne[0] / be, block_bytes(t.type), &row_bytes) ||
        mul_overflows(row_bytes, t.n_elements / t.ne[0], &n_bytes))
      r.fail("size of " + t.shape_string() + " overflows 64 bits", dims_at);
    t.n_bytes = n_bytes;
    const uint64_t off_at = r.pos();
    t.offset = r.read<uint64_t>("tensor data offset");
    if (t.offset % alignment_ != 0)
      r.fail("data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                 std::to_string(alignment_),
             off_at);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // ---- data section
  r.set_context("");
  const uint64_t end_of_infos = r.pos();
  data_offset_ = end_of_infos + (alignment_ - end_of_infos % alignment_) % alignment_;
  if (tensors_.empty()) {
    data_offset_ = std::min(data_offset_, size_);
    return;
  }
  if (data_offset_ > size_)
    r.fail("truncated: the data section starts at byte " + std::to_string(data_offset_) + " past the end of the " +
               std::to_string(size_) + "-byte file",
           end_of_infos);
  const uint64_t data_size = size_ - data_offset_;
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      std::ostringstream s;
      s << label_ << ": byte " << t.info_offset << ": tensor " << quoted(t.name) << ": data [" << t.offset << ", "
        << "+" << t.n_bytes << ") runs past the end of the " << data_size << "-byte data section";
      throw ModelError(s.str());
    }
  }
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (a.offset + a.n_bytes > b.offset)
      throw ModelError(label_ + ": byte " + std::to_string(b.info_offset) + ": tensor " + quoted(b.name) +
                       ": data overlaps tensor " + quoted(a.name));
  }
}

// ---- metadata getters ------------------------------------------------------

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::require(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw ModelError(label_ + ": key " + quoted(key) + " is missing");
  return *v;
}

void GgufFile::key_error(const std::string& key, const GgufValue& v, const std::string& what) const {
  throw ModelError(label_ + ": byte " + std::to_string(v.offset) + ": key " + quoted(key) + ": " + what);
}

namespace {

bool is_int(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::U16:
    case GgufValueType::I16:
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::U64:
    case GgufValueType::I64: return true;
    default: return false;
  }
}

template <typename T>
std::optional<T> fit(const std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray>& v) {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(*u);
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    if (*i >= 0 ? static_cast<uint64_t>(*i) <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                : (std::numeric_limits<T>::is_signed && *i >= static_cast<int64_t>(std::numeric_limits<T>::min())))
      return static_cast<T>(*i);
  }
  return std::nullopt;
}

// double -> float without undefined behaviour: out-of-range values become infinities.
float to_f32(double d) {
  if (d > std::numeric_limits<float>::max()) return std::numeric_limits<float>::infinity();
  if (d < -std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(d);  // NaN stays NaN
}

std::string int_string(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v.v)) return std::to_string(*i);
  return "?";
}

}  // namespace

#define WGLLM_INT_GETTER(NAME, T, TNAME)                                                                \
  T GgufFile::get_##NAME(const std::string& key) const {                                                \
    const GgufValue& v = require(key);                                                                  \
    if (!is_int(v.type)) key_error(key, v, "expected " TNAME ", found " + v.type_string());             \
    const auto r = fit<T>(v.v);                                                                         \
    if (!r) key_error(key, v, v.type_string() + " value " + int_string(v) + " does not fit in " TNAME); \
    return *r;                                                                                          \
  }
WGLLM_INT_GETTER(u32, uint32_t, "u32")
WGLLM_INT_GETTER(i32, int32_t, "i32")
WGLLM_INT_GETTER(u64, uint64_t, "u64")
#undef WGLLM_INT_GETTER

float GgufFile::get_f32(const std::string& key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufValueType::F32 && v.type != GgufValueType::F64)
    key_error(key, v, "expected f32, found " + v.type_string());
  return to_f32(std::get<double>(v.v));
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufValueType::Bool) key_error(key, v, "expected bool, found " + v.type_string());
  return std::get<bool>(v.v);
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufValueType::String) key_error(key, v, "expected string, found " + v.type_string());
  return std::get<std::string>(v.v);
}

const GgufArray& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = require(key);
  const GgufArray* a = std::get_if<GgufArray>(&v.v);
  if (!a || a->elem_type() != GgufValueType::String)
    key_error(key, v, "expected array of string, found " + v.type_string());
  return *a;
}

std::vector<float> GgufFile::get_f32_array(const std::string& key) const {
  const GgufValue& v = require(key);
  const GgufArray* a = std::get_if<GgufArray>(&v.v);
  if (!a || (a->elem_type() != GgufValueType::F32 && a->elem_type() != GgufValueType::F64))
    key_error(key, v, "expected array of f32, found " + v.type_string());
  std::vector<float> out(a->size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = to_f32(a->f64(i));
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(const std::string& key) const {
  const GgufValue& v = require(key);
  const GgufArray* a = std::get_if<GgufArray>(&v.v);
  if (!a || !is_int(a->elem_type())) key_error(key, v, "expected array of i32, found " + v.type_string());
  std::vector<int32_t> out;
  out.reserve(a->size());
  auto bad = [&](const std::string& x, size_t i) {
    key_error(key, v, "element " + std::to_string(i) + " (" + x + ") does not fit in i32");
  };
  const bool is_unsigned = a->elem_type() == GgufValueType::U8 || a->elem_type() == GgufValueType::U16 ||
                           a->elem_type() == GgufValueType::U32 || a->elem_type() == GgufValueType::U64;
  for (size_t i = 0; i < a->size(); ++i) {
    if (is_unsigned) {
      const uint64_t u = a->u64(i);
      if (u > uint64_t(std::numeric_limits<int32_t>::max())) bad(std::to_string(u), i);
      out.push_back(static_cast<int32_t>(u));
    } else {
      const int64_t x = a->i64(i);
      if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) bad(std::to_string(x), i);
      out.push_back(static_cast<int32_t>(x));
    }
  }
  return out;
}

std::optional<uint32_t> GgufFile::find_u32(const std::string& key) const {
  return has(key) ? std::optional(get_u32(key)) : std::nullopt;
}
std::optional<int32_t> GgufFile::find_i32(const std::string& key) const {
  return has(key) ? std::optional(get_i32(key)) : std::nullopt;
}
std::optional<float> GgufFile::find_f32(const std::string& key) const {
  return has(key) ? std::optional(get_f32(key)) : std::nullopt;
}
std::optional<bool> GgufFile::find_bool(const std::string& key) const {
  return has(key) ? std::optional(get_bool(key)) : std::nullopt;
}
std::optional<std::string> GgufFile::find_string(const std::string& key) const {
  return has(key) ? std::optional(get_string(key)) : std::nullopt;
}

// ---- tensors ---------------------------------------------------------------

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw ModelError(label_ + ": tensor " + quoted(name) + " is missing");
  return *t;
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensor& t) const {
  // Bounds were checked at parse time for this file's tensors; check again for a foreign one.
  if (t.offset > size_ - data_offset_ || t.n_bytes > size_ - data_offset_ - t.offset)
    throw ModelError(label_ + ": tensor " + quoted(t.name) + ": data runs past the end of the file");
  return {data_ + data_offset_ + t.offset, static_cast<size_t>(t.n_bytes)};
}

}  // namespace wgllm

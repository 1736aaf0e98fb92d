// GGUF model files (versions 2 and 3): metadata, tensor infos and tensor data, read from a read-only mmap or
// from bytes in memory. Every count, length, dimension and offset is checked against the file before use;
// a malformed file gives one ModelError naming the field and its byte offset.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "gguf/types.h"

namespace wgllm {

// Metadata value types.
enum class GgufValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* value_type_name(GgufValueType t);

// An array value, a view of its elements in the file's bytes (valid while the GgufFile lives; moving the file
// keeps it valid). Numbers and bools are read from the file on access; strings and nested arrays are found through
// the offset of every kStride-th element, so an array costs at most 1/16 of its bytes beyond the file itself.
// Accessors of the wrong element type throw std::logic_error; indices past the end std::out_of_range.
class GgufArray {
 public:
  static constexpr size_t kStride = 16;

  GgufValueType elem_type() const { return elem_type_; }
  size_t size() const { return static_cast<size_t>(count_); }
  // Numbers and bools: the elements as stored (little-endian, packed). Empty for strings and arrays.
  std::span<const uint8_t> bytes() const;

  uint64_t u64(size_t i) const;  // U8, U16, U32, U64
  int64_t i64(size_t i) const;   // I8, I16, I32, I64
  double f64(size_t i) const;    // F32, F64
  bool boolean(size_t i) const;  // Bool
  std::string_view string(size_t i) const;
  std::vector<std::string> strings() const;  // every string, copied
  GgufArray array(size_t i) const;           // a nested array

 private:
  friend struct GgufArrayAccess;  // the parser (file.cpp)
  // The array whose header (element type, count) starts at `p`, in bytes the parser has checked.
  static GgufArray at(const uint8_t* p);
  const uint8_t* element(size_t i) const;

  GgufValueType elem_type_ = GgufValueType::U8;
  uint64_t count_ = 0;
  const uint8_t* first_ = nullptr;  // the first element's bytes
  std::vector<uint64_t> marks_;     // strings and arrays: byte offset from first_ of elements 0, kStride, ...
};

struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  uint64_t offset = 0;  // byte offset of the value in the file
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v;
  std::string type_string() const;  // "u32", "string", "array of string", ...
};

struct GgufTensor {
  std::string name;
  GgufType type = GgufType::F32;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // ne[0] = row length (innermost); unused dims are 1
  uint64_t offset = 0;                     // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t info_offset = 0;  // byte offset of this tensor's info in the file
  std::span<const uint64_t> dims() const { return {ne.data(), n_dims}; }
  std::string shape_string() const;  // "[4096, 32000]"
};

class GgufFile {
 public:
  // What open() parses: everything, or the header and metadata alone (no tensor infos: tensors() is empty, and a
  // file whose tensors wgllm cannot read still gives its metadata, e.g. its vocabulary).
  enum class Parts { All, MetadataOnly };
  // Maps `path` read-only. Throws ModelError (cannot open, malformed, unsupported).
  static GgufFile open(const std::string& path, Parts parts = Parts::All);
  // Parses a copy of `bytes`; `label` stands for the file name in errors.
  static GgufFile from_bytes(std::span<const uint8_t> bytes, const std::string& label = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& label() const { return label_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }  // the whole file

  // ---- metadata
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Integer getters accept any integer type whose value fits; float getters accept f32/f64.
  // Missing key or wrong type: ModelError "<file>: byte N: key 'k': expected u32, found string".
  uint32_t get_u32(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const GgufArray& get_string_array(const std::string& key) const;  // .strings() copies them out
  std::vector<float> get_f32_array(const std::string& key) const;
  std::vector<int32_t> get_i32_array(const std::string& key) const;
  // Absent key: nullopt; present with the wrong type: ModelError.
  std::optional<uint32_t> find_u32(const std::string& key) const;
  std::optional<int32_t> find_i32(const std::string& key) const;
  std::optional<float> find_f32(const std::string& key) const;
  std::optional<bool> find_bool(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;

  // ---- tensors (in file order)
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;
  const GgufTensor& tensor(const std::string& name) const;  // ModelError "tensor 'x' is missing"
  std::span<const uint8_t> tensor_data(const GgufTensor& t) const;

 private:
  GgufFile() = default;
  void parse();
  [[noreturn]] void key_error(const std::string& key, const GgufValue& v, const std::string& what) const;
  const GgufValue& require(const std::string& key) const;

  struct Mapping;
  std::unique_ptr<Mapping> mapping_;  // the mmap, when opened from a path
  std::vector<uint8_t> owned_;        // the bytes, when parsed from memory
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string label_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  bool metadata_only_ = false;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace wgllm

#include "gguf/types.h"

#include <iterator>

namespace wgllm {

namespace {

struct TypeRow {
  GgufType type;
  uint32_t block_elems, block_bytes;
};
// The loadable types, in the order error messages list them.
constexpr TypeRow kTypes[] = {
    {GgufType::F32, 1, 4},    {GgufType::F16, 1, 2},    {GgufType::BF16, 1, 2},
    {GgufType::Q8_0, 32, 34}, {GgufType::Q4_0, 32, 18},
};

const TypeRow* find(uint32_t id) {
  for (const TypeRow& r : kTypes)
    if (static_cast<uint32_t>(r.type) == id) return &r;
  return nullptr;
}

const TypeRow& row(GgufType t) {
  static constexpr TypeRow kNone{GgufType::F32, 1, 0};
  const TypeRow* r = find(static_cast<uint32_t>(t));
  return r ? *r : kNone;
}

}  // namespace

const char* ggml_type_name(uint32_t id) {
  static constexpr const char* kNames[] = {
      "F32",    "F16",      "Q4_0",     "Q4_1",     "Q4_2",  "Q4_3",  "Q5_0",       "Q5_1",       "Q8_0",       "Q8_1",
      "Q2_K",   "Q3_K",     "Q4_K",     "Q5_K",     "Q6_K",  "Q8_K",  "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",    "IQ1_S",
      "IQ4_NL", "IQ3_S",    "IQ2_S",    "IQ4_XS",   "I8",    "I16",   "I32",        "I64",        "F64",        "IQ1_M",
      "BF16",   "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
  };
  if (id >= std::size(kNames)) return nullptr;
  return kNames[id];
}

const char* type_name(GgufType t) { return ggml_type_name(static_cast<uint32_t>(t)); }

bool is_supported_type(uint32_t id) { return find(id) != nullptr; }

std::string supported_type_names() {
  std::string s;
  for (const TypeRow& r : kTypes) s += (s.empty() ? "" : ", ") + std::string(type_name(r.type));
  return s;
}

uint32_t block_elems(GgufType t) { return row(t).block_elems; }

uint32_t block_bytes(GgufType t) { return row(t).block_bytes; }

uint64_t tensor_bytes(GgufType t, uint64_t ne0, uint64_t rows) { return ne0 / block_elems(t) * block_bytes(t) * rows; }

}  // namespace wgllm

#include "gguf/types.h"

#include <iterator>

namespace wgllm {

namespace {

struct TypeRow {
  const char* name;
  uint32_t block_elems, block_bytes;  // 0, 0: an id ggml has removed (no GGUF file may hold it)
  bool runs;                          // wgllm dequantises and multiplies it on the GPU
};
// Indexed by ggml type id; block sizes as ggml-common.h (and gguf-py's GGML_QUANT_SIZES) define them.
constexpr TypeRow kTypes[] = {
    {"F32", 1, 4, true},         {"F16", 1, 2, true},         {"Q4_0", 32, 18, true},      {"Q4_1", 32, 20, true},
    {"Q4_2", 0, 0, false},       {"Q4_3", 0, 0, false},       {"Q5_0", 32, 22, true},      {"Q5_1", 32, 24, true},
    {"Q8_0", 32, 34, true},      {"Q8_1", 32, 36, false},     {"Q2_K", 256, 84, true},     {"Q3_K", 256, 110, true},
    {"Q4_K", 256, 144, true},    {"Q5_K", 256, 176, true},    {"Q6_K", 256, 210, true},    {"Q8_K", 256, 292, false},
    {"IQ2_XXS", 256, 66, false}, {"IQ2_XS", 256, 74, false},  {"IQ3_XXS", 256, 98, false}, {"IQ1_S", 256, 50, false},
    {"IQ4_NL", 32, 18, false},   {"IQ3_S", 256, 110, false},  {"IQ2_S", 256, 82, false},   {"IQ4_XS", 256, 136, false},
    {"I8", 1, 1, false},         {"I16", 1, 2, false},        {"I32", 1, 4, false},        {"I64", 1, 8, false},
    {"F64", 1, 8, false},        {"IQ1_M", 256, 56, false},   {"BF16", 1, 2, true},        {"Q4_0_4_4", 0, 0, false},
    {"Q4_0_4_8", 0, 0, false},   {"Q4_0_8_8", 0, 0, false},   {"TQ1_0", 256, 54, false},   {"TQ2_0", 256, 66, false},
    {"IQ4_NL_4_4", 0, 0, false}, {"IQ4_NL_4_8", 0, 0, false}, {"IQ4_NL_8_8", 0, 0, false}, {"MXFP4", 32, 17, true},
    {"NVFP4", 64, 36, false},    {"Q1_0", 128, 18, false},    {"Q2_0", 64, 18, false},
};

const TypeRow* find(uint32_t id) { return id < std::size(kTypes) ? &kTypes[id] : nullptr; }

// The runnable types, in the order error messages list them.
constexpr GgufType kRunOrder[] = {GgufType::F32,  GgufType::F16,  GgufType::BF16, GgufType::Q8_0, GgufType::Q4_0,
                                  GgufType::Q4_1, GgufType::Q5_0, GgufType::Q5_1, GgufType::Q2_K, GgufType::Q3_K,
                                  GgufType::Q4_K, GgufType::Q5_K, GgufType::Q6_K, GgufType::MXFP4};

}  // namespace

const char* ggml_type_name(uint32_t id) {
  const TypeRow* r = find(id);
  return r ? r->name : nullptr;
}

const char* type_name(GgufType t) {
  const char* n = ggml_type_name(static_cast<uint32_t>(t));
  return n ? n : "?";
}

bool is_known_type(uint32_t id) {
  const TypeRow* r = find(id);
  return r && r->block_elems != 0;
}

bool is_supported_type(uint32_t id) {
  const TypeRow* r = find(id);
  return r && r->runs;
}

std::string supported_type_names() {
  std::string s;
  for (GgufType t : kRunOrder) s += (s.empty() ? "" : ", ") + std::string(type_name(t));
  return s;
}

uint32_t block_elems(GgufType t) {
  const TypeRow* r = find(static_cast<uint32_t>(t));
  return r && r->block_elems ? r->block_elems : 1;
}

uint32_t block_bytes(GgufType t) {
  const TypeRow* r = find(static_cast<uint32_t>(t));
  return r ? r->block_bytes : 0;
}

uint64_t tensor_bytes(GgufType t, uint64_t ne0, uint64_t rows) { return ne0 / block_elems(t) * block_bytes(t) * rows; }

}  // namespace wgllm

// The element types of GGUF tensors: every ggml type id with its name and block layout, and which of them wgllm
// runs. This is the one list of weight types: a new runnable one gets `runs` in types.cpp, its CPU dequantisation in
// dequant.cpp and its GPU layout and loads in the weight kernels (kernels/weight.*, matmul_common.wgsl) — nothing
// else names types.
#pragma once
#include <cstdint>
#include <string>

namespace wgllm {

// ggml type ids as stored in GGUF. A GgufType may hold any id the parser accepts (is_known_type); the named ones
// below are those wgllm runs or refers to.
enum class GgufType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  BF16 = 30,
  MXFP4 = 39,
};

// Name of any ggml type id ("Q4_K", "IQ2_XS", ...); nullptr for an id ggml never had.
const char* ggml_type_name(uint32_t type_id);
const char* type_name(GgufType t);
// True for the ids a GGUF file may hold: ggml's types with a block layout (not the removed Q4_2, Q4_0_4_4, ...).
bool is_known_type(uint32_t type_id);
// True for the types wgllm can run (dequantise and multiply on the GPU).
bool is_supported_type(uint32_t type_id);
// "F32, F16, BF16, Q8_0, ...": the runnable types, for error messages.
std::string supported_type_names();

uint32_t block_elems(GgufType t);  // elements per block: 1 for F32/F16/BF16, 32 for Q8_0/Q4_0/MXFP4, 256 for K-quants
uint32_t block_bytes(GgufType t);  // bytes per block: 4, 2, 34, 18, 144, ... (0 for an unknown id)
// Bytes of `rows` rows of ne0 elements (ne0 a multiple of block_elems(t)).
uint64_t tensor_bytes(GgufType t, uint64_t ne0, uint64_t rows = 1);

}  // namespace wgllm

// The element types of GGUF tensors: ggml's type ids, and the block layout of each type wgllm runs. This is the one
// list of weight types: a new one gets its row in types.cpp, its CPU dequantisation in dequant.cpp and its GPU
// layout and loads in the weight kernels (kernels/weight.*, matmul_common.wgsl) — nothing else names types.
#pragma once
#include <cstdint>
#include <string>

namespace wgllm {

// ggml type ids as stored in GGUF, for the types wgllm can load.
enum class GgufType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, BF16 = 30 };

// Name of any ggml type id ("Q4_K", "IQ2_XS", ...); nullptr for an id ggml never had.
const char* ggml_type_name(uint32_t type_id);
const char* type_name(GgufType t);
// True for the ids of GgufType.
bool is_supported_type(uint32_t type_id);
// "F32, F16, BF16, Q8_0, Q4_0": the loadable types, for error messages.
std::string supported_type_names();

uint32_t block_elems(GgufType t);  // elements per block: 1 for F32/F16/BF16, 32 for Q8_0/Q4_0
uint32_t block_bytes(GgufType t);  // bytes per block: 4, 2, 2, 34, 18
// Bytes of `rows` rows of ne0 elements (ne0 a multiple of block_elems(t)).
uint64_t tensor_bytes(GgufType t, uint64_t ne0, uint64_t rows = 1);

}  // namespace wgllm

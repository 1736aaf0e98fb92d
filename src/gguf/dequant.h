// CPU conversion of GGUF tensor data to f32: the reference the GPU weight kernels are tested against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

#include "gguf/types.h"

namespace wgllm {

// Converts `n` elements of `type` at `src` (GGUF layout) to f32. For Q8_0 / Q4_0, `n` must be a multiple of 32
// (InvalidArgument otherwise). Q8_0 block: f16 scale d + 32 int8 q, x = q*d. Q4_0 block: f16 scale d + 16 bytes,
// element j in the low nibble of byte j and element j+16 in its high nibble, x = (nibble - 8)*d.
void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n);

// The first of `n` elements of `type` at `src` that is NaN or infinite — for Q8_0 / Q4_0 the first element of the
// first block whose scale is — or nullopt when every element is finite. A model with such a weight computes NaN.
std::optional<uint64_t> find_non_finite(GgufType type, const uint8_t* src, uint64_t n);

}  // namespace wgllm

// CPU conversion of GGUF tensor data to f32: the reference the GPU weight kernels are tested against.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/types.h"

namespace wgllm {

// Converts `n` elements of `type` at `src` (GGUF layout) to f32. For Q8_0 / Q4_0, `n` must be a multiple of 32
// (InvalidArgument otherwise). Q8_0 block: f16 scale d + 32 int8 q, x = q*d. Q4_0 block: f16 scale d + 16 bytes,
// element j in the low nibble of byte j and element j+16 in its high nibble, x = (nibble - 8)*d.
void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n);

}  // namespace wgllm

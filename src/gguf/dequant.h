// CPU conversions of GGUF tensor data to f32, and the f16 / bf16 <-> f32 conversions they use.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/file.h"

namespace wgllm {

// IEEE binary16 -> f32 (exact: subnormals, infinities and NaN payloads kept).
float f16_to_f32(uint16_t h);
// f32 -> binary16, round to nearest even; overflow gives infinity, NaN stays a (quiet) NaN.
uint16_t f32_to_f16(float f);
// bfloat16 -> f32 (exact).
float bf16_to_f32(uint16_t h);
// f32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
uint16_t f32_to_bf16(float f);

// Converts `n` elements of `type` at `src` (GGUF layout) to f32. For Q8_0 / Q4_0, `n` must be a multiple of 32
// (InvalidArgument otherwise). Q8_0 block: f16 scale d + 32 int8 q, x = q*d. Q4_0 block: f16 scale d + 16 bytes,
// element j in the low nibble of byte j and element j+16 in its high nibble, x = (nibble - 8)*d.
void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n);

}  // namespace wgllm

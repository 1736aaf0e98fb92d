// f16 (IEEE binary16) and bfloat16 <-> f32 conversions on the CPU, exact where the format allows.
#pragma once
#include <cstdint>

namespace wgllm {

// IEEE binary16 -> f32 (exact: subnormals, infinities and NaN payloads kept).
float f16_to_f32(uint16_t h);
// f32 -> binary16, round to nearest even; overflow gives infinity, NaN stays a (quiet) NaN.
uint16_t f32_to_f16(float f);
// bfloat16 -> f32 (exact).
float bf16_to_f32(uint16_t h);
// f32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
uint16_t f32_to_bf16(float f);

}  // namespace wgllm

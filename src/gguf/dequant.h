// CPU conversion of GGUF tensor data to f32: the reference the GPU weight kernels are tested against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "gguf/types.h"

namespace wgllm {

// Converts `n` elements of `type` at `src` (GGUF layout) to f32, bit for bit as ggml (and the gguf Python package)
// does. For a block type, `n` must be a multiple of block_elems(type) (InvalidArgument otherwise, and for a type
// wgllm does not run). Each block is as ggml-common.h lays it out:
//   Q8_0  d, q[32] int8                              x = q * d
//   Q4_0  d, qs[16]: element j low nibble of byte j, x = (nibble - 8) * d
//         element j + 16 its high nibble
//   Q4_1  d, m, qs[16] as Q4_0                       x = d * nibble + m
//   Q5_0  d, qh (u32: bit j the 5th bit of element j), qs[16] as Q4_0     x = (q - 16) * d
//   Q5_1  d, m, qh, qs[16]                           x = d * q + m
// K-quants: 256-element super-blocks of 16- or 32-element sub-blocks, each with its own scale (and min):
//   Q2_K  scales[16] (low nibble scale, high min), qs[64] (2 bits), d, dmin     x = d*sc * q - dmin*m
//   Q3_K  hmask[32], qs[64] (2 bits), scales[12] (16 x 6 bits), d              x = d*(sc - 32) * (q - 4*!hbit)
//   Q4_K  d, dmin, scales[12] (8 x 6-bit scale + min), qs[128]                 x = d*sc * q - dmin*m
//   Q5_K  d, dmin, scales[12], qh[32] (5th bits), qs[128]                      x = d*sc * q - dmin*m
//   Q6_K  ql[128], qh[64], scales[16] int8, d                                  x = d*sc * (q - 32)
// MXFP4 (OCP microscaling FP4, gpt-oss's experts): 32 E2M1 values sharing a power-of-two scale:
//   MXFP4 e (E8M0), qs[16] as Q4_0                   x = kv[nibble] * e8m0_half(e)
//         kv = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}: twice the E2M1 values (bit 3 the sign)
void dequantize_row(GgufType type, const uint8_t* src, float* dst, size_t n);

// 2^(e - 128), the E8M0 scale e (2^(e - 127)) halved as ggml's GGML_E8M0_TO_FP32_HALF builds it from bits: the
// exponent e - 1 for e >= 2, the subnormals 2^-128 and 2^-127 for e = 0 and 1; never NaN (e = 255 gives 2^127).
float e8m0_half(uint8_t e);

// Byte offsets in a block of `type` of its f16 scales (d, and dmin or m where present), from ggml-common.h; empty
// for float types, MXFP4 (its scale is a byte, e8m0_half) and types wgllm does not run.
std::vector<size_t> scale_fields(GgufType type);

// The first of `n` elements of `type` at `src` that is NaN or infinite — for a block type with f16 scales the first
// element of the first block whose scale (d, dmin or m) is; for MXFP4, whose scale is finite, the first element whose
// product with it overflows — or nullopt when every element is finite. A model with such a weight computes NaN.
std::optional<uint64_t> find_non_finite(GgufType type, const uint8_t* src, uint64_t n);

}  // namespace wgllm

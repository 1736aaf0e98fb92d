// x as packed 8-bit digits (int_dot.wgsl) for the one-token Q4_K products on packed integer dot products: each
// element as three 8-bit digits under one scale per 32 elements (23 bits against the block's largest element, not
// f32's 24 per element), which matvec.wgsl's MV_INT multiplies against the weight's nibbles with WGSL's
// dot4I8Packed / dot4U8Packed (MatmulOptions::digits). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `IntDotParams` in int_dot.wgsl.
struct IntDotParams {
  uint32_t n_in, n_tokens, grid_x, norm;
  uint32_t scales, x_first, pad1, pad2;
};
static_assert(sizeof(IntDotParams) == 32);

// x's digits and per-block scales and sums, for n_tokens rows of n_in (a multiple of 32): per 32 elements 96 bytes
// of digits, then (from vec4 scales_vec4() on) 16 bytes of scale and sums, in one buffer.
struct XDigits {
  gpu::Buffer data;
  uint32_t n_in = 0, n_tokens = 0;
  uint64_t blocks() const { return uint64_t(n_in / 32) * n_tokens; }
  uint64_t scales_vec4() const { return blocks() * 6; }
  uint64_t bytes() const { return blocks() * 112; }
};
XDigits make_x_digits(gpu::Context& ctx, uint32_t n_in, uint32_t n_tokens);

// x (n_tokens rows of xd.n_in floats from offset 0) into xd: the digits of x, or of x * norm (xd.n_in floats: an
// RMSNorm's weights, whose 1 / rms a product takes from the blocks' sums of squares of x).
void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const XDigits& xd,
                     const gpu::Buffer* norm = nullptr);

// The same for rows of x from a binding window (x_offset bytes into x, x_bytes long, the first row at element x_first
// of it) into `data` (at least XDigits::bytes() for n_tokens rows of n_in): the prompt products' digits
// (encode_matmul with ContextOptions::prompt_digits), in a scratch buffer.
void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, uint64_t x_offset,
                     uint64_t x_bytes, uint32_t x_first, const gpu::Buffer& data, uint32_t n_in, uint32_t n_tokens,
                     const gpu::Buffer* norm);

}  // namespace wgllm::kernels

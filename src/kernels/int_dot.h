// One-token Q4_K products on packed 8-bit integer dot products (int_dot.wgsl): x first as three 8-bit digits per
// element under one scale per 32 elements (23 bits against the block's largest element, not f32's 24 per element),
// then the product against the weight's nibbles with WGSL's dot4I8Packed / dot4U8Packed. Not yet used by the model:
// `wgllm-bench ops --decode-table --int-dot` times it beside the f32 matvec (PERF.md, "Q4_K on packed int8 dot
// products"). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <optional>

#include "gpu/batch.h"
#include "kernels/weight.h"

namespace wgllm::kernels {

// Mirrors `IntDotParams` in int_dot.wgsl.
struct IntDotParams {
  uint32_t n_in, n_rows, n_tokens, grid_x;
  uint32_t norm;
  float eps;
  uint32_t pad0, pad1;
};
static_assert(sizeof(IntDotParams) == 32);

// x's digits and per-block scales and sums, for n_tokens rows of n_in (a multiple of 32).
struct XDigits {
  gpu::Buffer digits;  // 96 bytes per 32 elements
  gpu::Buffer scales;  // 16 bytes per 32 elements
  uint32_t n_in = 0, n_tokens = 0;
};
XDigits make_x_digits(gpu::Context& ctx, uint32_t n_in, uint32_t n_tokens);

// x (n_tokens rows of xd.n_in floats from offset 0) into xd: the digits of x, or of x * norm (xd.n_in floats: an
// RMSNorm's weights, whose 1 / rms a product takes from the blocks' sums of squares of x, xsc's w).
void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const XDigits& xd,
                     const gpu::Buffer* norm = nullptr);

// y[r] = sum_i w[r][i] x[i] for one token (xd.n_tokens == 1): w Q4_K in one piece, n_in == xd.n_in. With norm_eps
// (xd holding the digits of x * g): y[r] = sum_i w[r][i] x[i] g[i] / rms(x), rms(x) = sqrt(mean(x^2) + eps).
void encode_matvec_int(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const XDigits& xd,
                       const gpu::Buffer& y, std::optional<float> norm_eps = std::nullopt);

}  // namespace wgllm::kernels

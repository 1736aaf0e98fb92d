// Host encoders for src/kernels/elementwise.wgsl.
#pragma once
#include <cstdint>

#include "gpu/context.h"

namespace wgllm::kernels {

// Mirrors `ElementwiseParams` in elementwise.wgsl.
struct ElementwiseParams {
  uint32_t n;
  uint32_t grid_x;
  uint32_t pad0 = 0, pad1 = 0;
};
static_assert(sizeof(ElementwiseParams) == 16);

// out[i] = a[i] + b[i] for i < n. All three buffers hold at least n f32.
void encode_add(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& a, const gpu::Buffer& b,
                const gpu::Buffer& out, uint64_t n);

}  // namespace wgllm::kernels

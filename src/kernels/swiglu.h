// SwiGLU (swiglu.wgsl) on its own, for gate and up weights of different types (the matmul epilogue fuses it
// otherwise). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `SwigluParams` in swiglu.wgsl.
struct SwigluParams {
  uint32_t n, grid_x, pad0 = 0, pad1 = 0;
};
static_assert(sizeof(SwigluParams) == 16);

// out[i] = silu(gate[i]) * up[i] for i < n; out must differ from gate and up.
void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n);

}  // namespace wgllm::kernels

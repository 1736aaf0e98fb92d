// Scaling and soft-capping in place (scale.wgsl): gemma's embedding scale and final logit softcapping.
// Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `ScaleParams` in scale.wgsl.
struct ScaleParams {
  uint32_t n, grid_x;
  float scale, softcap;
};
static_assert(sizeof(ScaleParams) == 16);

// x[i] = x[i] * scale for i < n, then, with softcap > 0, softcap * tanh(x[i] / softcap).
void encode_scale(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, uint64_t n, float scale,
                  float softcap = 0.f);

}  // namespace wgllm::kernels

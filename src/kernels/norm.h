// RMSNorm (norm.wgsl): a row-wise norm on its own, for what the matmul epilogue cannot fold in (per-head q/k
// norm over a chunk). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `NormParams` in norm.wgsl.
struct NormParams {
  uint32_t n_rows, dim;
  float eps;
  uint32_t grid_x;
  float scale;
  uint32_t pad[3];
};
static_assert(sizeof(NormParams) == 32);

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for n_rows rows of `dim` f32; w: [dim] f32.
// x and y may be the same buffer (in place). Per-head q/k norm: n_rows = tokens * heads,
// dim = head_dim. accumulate: y[r] = (y[r] + the norm) * out_scale instead (gemma's post-norms into the residual,
// Gemma 4's layer output scale; x != y; out_scale 1 leaves the sum's bits as they are). silu_gate ([n_rows][dim]
// f32, not y): the norm times silu(silu_gate) element by element (qwen35's gated DeltaNet output).
void encode_rms_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w,
                     const gpu::Buffer& y, uint32_t n_rows, uint32_t dim, float eps, bool accumulate = false,
                     const gpu::Buffer* silu_gate = nullptr, float out_scale = 1.f);

}  // namespace wgllm::kernels

#include "kernels/norm.h"

#include <cmath>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

void encode_rms_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w,
                     const gpu::Buffer& y, uint32_t n_rows, uint32_t dim, float eps, bool accumulate,
                     const gpu::Buffer* silu_gate, float out_scale) {
  const char* fn = "encode_rms_norm";
  if (n_rows == 0) fail(fn, "n_rows must be > 0");
  if (dim == 0) fail(fn, "dim must be > 0");
  if (!(eps >= 0) || !std::isfinite(eps)) fail(fn, "eps must be finite and >= 0");
  const uint64_t bytes = uint64_t(n_rows) * dim * 4;
  need(fn, "x", x, bytes, ctx);
  need(fn, "y", y, bytes, ctx);
  need(fn, "w", w, uint64_t(dim) * 4, ctx);
  if (w.get() == y.get()) fail(fn, "w and y must be different buffers");
  const bool in_place = x.get() == y.get();
  if (in_place && accumulate) fail(fn, "accumulate needs x and y to be different buffers");
  if (!std::isfinite(out_scale)) fail(fn, "out_scale must be finite");
  if (out_scale != 1.f && !accumulate) fail(fn, "out_scale scales an accumulated sum: it needs accumulate");
  if (silu_gate) {
    need(fn, "silu_gate", *silu_gate, bytes, ctx);
    if (silu_gate->get() == y.get()) fail(fn, "silu_gate and y must be different buffers");
  }
  const auto grid = gpu::fold_grid(n_rows, ctx.limits().maxComputeWorkgroupsPerDimension);
  const NormParams p{n_rows, dim, eps, grid.x, out_scale, {}};
  WGPUComputePipeline pipe = ctx.pipeline(
      {"norm.wgsl",
       "rms_norm",
       {{"IN_PLACE", in_place ? 1.0 : 0.0}, {"ACCUMULATE", accumulate ? 1.0 : 0.0}, {"GATED", silu_gate ? 1.0 : 0.0}},
       ""});
  // In place, x and y are one buffer: it may be bound writable only once, so x gets the placeholder.
  const gpu::BufferBinding b[] = {
      batch.uniform(0, p),
      in_place ? gpu::BufferBinding{1, &ctx.placeholder_storage()} : gpu::BufferBinding{1, &x, 0, bytes},
      {2, &w, 0, uint64_t(dim) * 4},
      {3, &y, 0, bytes},
      silu_gate ? gpu::BufferBinding{4, silu_gate, 0, bytes} : gpu::BufferBinding{4, &ctx.placeholder_storage()}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

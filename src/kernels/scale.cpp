#include "kernels/scale.h"

#include <cmath>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

void encode_scale(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, uint64_t n, float scale,
                  float softcap) {
  const char* fn = "encode_scale";
  constexpr uint32_t kWorkgroup = 256;
  if (n == 0) fail(fn, "n must be > 0");
  if (n > UINT32_MAX) fail(fn, "n exceeds 2^32-1");
  if (!std::isfinite(scale)) fail(fn, "scale must be finite");
  if (!(softcap >= 0.f) || !std::isfinite(softcap)) fail(fn, "softcap must be finite and >= 0");
  need(fn, "x", x, n * 4, ctx);
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const ScaleParams p{uint32_t(n), grid.x, scale, softcap};
  WGPUComputePipeline pipe = ctx.pipeline({"scale.wgsl", "scale", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p), {1, &x, 0, n * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

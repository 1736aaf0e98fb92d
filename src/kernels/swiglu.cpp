#include "kernels/swiglu.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n, GateAct act) {
  const char* fn = "encode_swiglu";
  constexpr uint32_t kWorkgroup = 256;
  if (n == 0) fail(fn, "n must be > 0");
  if (n > UINT32_MAX) fail(fn, "n exceeds 2^32-1");
  need(fn, "gate", gate, n * 4, ctx);
  need(fn, "up", up, n * 4, ctx);
  need(fn, "out", out, n * 4, ctx);
  if (out.get() == gate.get() || out.get() == up.get()) fail(fn, "out must differ from gate and up");
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const SwigluParams p{uint32_t(n), grid.x, uint32_t(act)};
  WGPUComputePipeline pipe = ctx.pipeline({"swiglu.wgsl", "swiglu", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p), {1, &gate, 0, n * 4}, {2, &up, 0, n * 4}, {3, &out, 0, n * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

#include "kernels/swiglu.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n, GateAct act, UpRows up_rows) {
  const char* fn = "encode_swiglu";
  constexpr uint32_t kWorkgroup = 256;
  if (n == 0) fail(fn, "n must be > 0");
  if (n > UINT32_MAX) fail(fn, "n exceeds 2^32-1");
  need(fn, "gate", gate, n * 4, ctx);
  uint64_t up_floats = n;
  if (up_rows.width > 0) {
    if (n % up_rows.width != 0)
      fail(fn, "n = " + std::to_string(n) + " is not a multiple of up_rows.width = " + std::to_string(up_rows.width));
    if (uint64_t(up_rows.offset) + up_rows.width > up_rows.stride)
      fail(fn, "up_rows.offset + width = " + std::to_string(uint64_t(up_rows.offset) + up_rows.width) +
                   " exceeds up_rows.stride = " + std::to_string(up_rows.stride));
    up_floats = (n / up_rows.width - 1) * up_rows.stride + up_rows.offset + up_rows.width;
  }
  need(fn, "up", up, up_floats * 4, ctx);
  need(fn, "out", out, n * 4, ctx);
  if (out.get() == gate.get() || out.get() == up.get()) fail(fn, "out must differ from gate and up");
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const SwigluParams p{.n = uint32_t(n),
                       .grid_x = grid.x,
                       .act = uint32_t(act),
                       .width = up_rows.width,
                       .up_stride = up_rows.stride,
                       .up_offset = up_rows.offset};
  WGPUComputePipeline pipe = ctx.pipeline({"swiglu.wgsl", "swiglu", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p), {1, &gate, 0, n * 4}, {2, &up, 0, up_floats * 4}, {3, &out, 0, n * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

#include "kernels/int_dot.h"

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

XDigits make_x_digits(gpu::Context& ctx, uint32_t n_in, uint32_t n_tokens) {
  if (n_in == 0 || n_in % 32 != 0) fail("make_x_digits", "n_in must be a positive multiple of 32");
  if (n_tokens == 0) fail("make_x_digits", "n_tokens must be > 0");
  XDigits xd{{}, n_in, n_tokens};
  if (xd.bytes() > ctx.max_binding_size()) fail("make_x_digits", "the digits exceed the storage-binding limit");
  xd.data = ctx.create_buffer(xd.bytes(), WGPUBufferUsage_Storage, "x digits");
  return xd;
}

void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const XDigits& xd,
                     const gpu::Buffer* norm) {
  const char* fn = "encode_x_digits";
  if (xd.n_in == 0 || xd.n_in % 32 != 0 || xd.n_tokens == 0) fail(fn, "xd is not made by make_x_digits");
  need(fn, "x", x, uint64_t(xd.n_in) * xd.n_tokens * 4, ctx);
  need(fn, "xd.data", xd.data, xd.bytes(), ctx);
  if (norm) need(fn, "norm", *norm, uint64_t(xd.n_in) * 4, ctx);
  const auto grid = gpu::fold_grid((xd.blocks() + 7) / 8, ctx.limits().maxComputeWorkgroupsPerDimension);
  const IntDotParams p{xd.n_in, xd.n_tokens, grid.x, norm ? 1u : 0u, uint32_t(xd.scales_vec4()), 0, 0, 0};
  WGPUComputePipeline pipe = ctx.pipeline({"int_dot.wgsl", "x_digits", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &x, 0, uint64_t(xd.n_in) * xd.n_tokens * 4},
                                  {2, &xd.data, 0, xd.bytes()},
                                  {3, norm ? norm : &ctx.placeholder_storage(), 0, norm ? uint64_t(xd.n_in) * 4 : 0}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

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
  if (xd.n_in == 0 || xd.n_in % 32 != 0 || xd.n_tokens == 0) fail("encode_x_digits", "xd is not made by make_x_digits");
  encode_x_digits(batch, ctx, x, 0, uint64_t(xd.n_in) * xd.n_tokens * 4, 0, xd.data, xd.n_in, xd.n_tokens, norm);
}

void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, uint64_t x_offset,
                     uint64_t x_bytes, uint32_t x_first, const gpu::Buffer& data, uint32_t n_in, uint32_t n_tokens,
                     const gpu::Buffer* norm) {
  const char* fn = "encode_x_digits";
  if (n_in == 0 || n_in % 32 != 0 || n_tokens == 0) fail(fn, "n_in must be a positive multiple of 32, n_tokens > 0");
  if ((uint64_t(x_first) + uint64_t(n_in) * n_tokens) * 4 > x_bytes) fail(fn, "the rows run past x's window");
  need(fn, "x", x, x_offset + x_bytes, ctx);
  const XDigits shape{{}, n_in, n_tokens};
  need(fn, "data", data, shape.bytes(), ctx);
  if (norm) need(fn, "norm", *norm, uint64_t(n_in) * 4, ctx);
  const auto grid = gpu::fold_grid((shape.blocks() + 31) / 32, ctx.limits().maxComputeWorkgroupsPerDimension);
  const IntDotParams p{n_in, n_tokens, grid.x, norm ? 1u : 0u, uint32_t(shape.scales_vec4()), x_first, 0, 0};
  WGPUComputePipeline pipe = ctx.pipeline({"int_dot.wgsl", "x_digits", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &x, x_offset, x_bytes},
                                  {2, &data, 0, shape.bytes()},
                                  {3, norm ? norm : &ctx.placeholder_storage(), 0, norm ? uint64_t(n_in) * 4 : 0}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

#include "kernels/shortconv.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

void encode_shortconv(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                      const gpu::Buffer& taps, const gpu::Buffer& ring, const gpu::Buffer& y) {
  const char* fn = "encode_shortconv";
  constexpr uint32_t kWorkgroup = 256;
  if (s.n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (s.n_embd == 0) fail(fn, "n_embd must be > 0");
  if (s.taps < 2) fail(fn, "taps must be >= 2");
  if (uint64_t(s.n_tokens) + s.taps - 1 > s.ring_rows)
    fail(fn, "ring_rows " + std::to_string(s.ring_rows) + " < n_tokens + taps - 1 = " +
                 std::to_string(uint64_t(s.n_tokens) + s.taps - 1) + " (the rows written would overwrite rows read)");
  if (uint64_t(s.pos) + s.n_tokens > UINT32_MAX) fail(fn, "pos + n_tokens exceeds 2^32-1");
  const uint64_t E = s.n_embd, n = uint64_t(s.n_tokens) * E, end = (uint64_t(s.row) + s.n_tokens) * E;
  if (3 * end > UINT32_MAX || uint64_t(s.ring_rows) * E > UINT32_MAX) fail(fn, "index space exceeds 2^32-1");
  need(fn, "bcx", bcx, 3 * end * 4, ctx);
  need(fn, "taps", taps, E * s.taps * 4, ctx);
  need(fn, "ring", ring, uint64_t(s.ring_rows) * E * 4, ctx);
  need(fn, "y", y, end * 4, ctx);
  if (y.get() == bcx.get() || y.get() == ring.get() || ring.get() == bcx.get())
    fail(fn, "bcx, ring and y must be different buffers");
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const ConvParams p{s.n_tokens, s.n_embd, s.taps, s.pos, s.ring_rows, grid.x, s.row, 0};
  WGPUComputePipeline pipe = ctx.pipeline({"shortconv.wgsl", "shortconv", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &bcx, 0, 3 * end * 4},
                                  {2, &taps, 0, E * s.taps * 4},
                                  {3, &ring, 0, uint64_t(s.ring_rows) * E * 4},
                                  {4, &y, 0, end * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

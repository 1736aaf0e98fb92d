#include "kernels/shortconv.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {

// The checks both entry points share; returns the flat grid.
gpu::FoldedGrid check_conv(const char* fn, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                           const gpu::Buffer& taps, const gpu::Buffer& ring, uint64_t ring_bytes, const gpu::Buffer& y,
                           uint64_t end_row) {
  constexpr uint32_t kWorkgroup = 256;
  if (s.n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (s.n_embd == 0) fail(fn, "n_embd must be > 0");
  if (s.taps < 2) fail(fn, "taps must be >= 2");
  const uint64_t E = s.n_embd, end = end_row * E;
  if (3 * end > UINT32_MAX || ring_bytes / 4 > UINT32_MAX) fail(fn, "index space exceeds 2^32-1");
  need(fn, "bcx", bcx, 3 * end * 4, ctx);
  need(fn, "taps", taps, E * s.taps * 4, ctx);
  need(fn, "ring", ring, ring_bytes, ctx);
  need(fn, "y", y, end * 4, ctx);
  if (y.get() == bcx.get() || y.get() == ring.get() || ring.get() == bcx.get())
    fail(fn, "bcx, ring and y must be different buffers");
  return gpu::fold_grid((uint64_t(s.n_tokens) * E + kWorkgroup - 1) / kWorkgroup,
                        ctx.limits().maxComputeWorkgroupsPerDimension);
}

}  // namespace

void encode_shortconv(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                      const gpu::Buffer& taps, const gpu::Buffer& ring, const gpu::Buffer& y) {
  const char* fn = "encode_shortconv";
  if (uint64_t(s.n_tokens) + s.taps - 1 > s.ring_rows)
    fail(fn, "ring_rows " + std::to_string(s.ring_rows) + " < n_tokens + taps - 1 = " +
                 std::to_string(uint64_t(s.n_tokens) + s.taps - 1) + " (the rows written would overwrite rows read)");
  if (uint64_t(s.pos) + s.n_tokens > UINT32_MAX) fail(fn, "pos + n_tokens exceeds 2^32-1");
  if (s.ring_offset % 4) fail(fn, "ring_offset must be a multiple of 4 bytes");
  const uint64_t E = s.n_embd, ring_end = s.ring_offset + uint64_t(s.ring_rows) * E * 4;
  const auto grid = check_conv(fn, ctx, s, bcx, taps, ring, ring_end, y, uint64_t(s.row) + s.n_tokens);
  const ConvParams p{s.n_tokens, s.n_embd, s.taps, s.pos, s.ring_rows, grid.x, s.row, uint32_t(s.ring_offset / 4)};
  WGPUComputePipeline pipe = ctx.pipeline({"shortconv.wgsl", "shortconv", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &bcx, 0, 3 * (uint64_t(s.row) + s.n_tokens) * E * 4},
                                  {2, &taps, 0, E * s.taps * 4},
                                  {3, &ring, 0, ring_end},
                                  {4, &y, 0, (uint64_t(s.row) + s.n_tokens) * E * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

void encode_shortconv_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                           const gpu::Buffer& taps, const gpu::Buffer& rings, const gpu::Buffer& seqs,
                           const gpu::Buffer& y) {
  const char* fn = "encode_shortconv_rows";
  if (uint64_t(s.taps) > s.ring_rows) fail(fn, "ring_rows must be >= taps");
  const uint64_t E = s.n_embd, ring_bytes = uint64_t(s.ring_rows) * E * 4;
  if (rings.size < ring_bytes) fail(fn, "rings holds less than one ring of ring_rows rows");
  const auto grid = check_conv(fn, ctx, s, bcx, taps, rings, rings.size & ~uint64_t(3), y, s.n_tokens);
  need(fn, "seqs", seqs, uint64_t(s.n_tokens) * 8, ctx);
  const ConvParams p{s.n_tokens, s.n_embd, s.taps, 0, s.ring_rows, grid.x, 0, 0};
  WGPUComputePipeline pipe = ctx.pipeline({"shortconv.wgsl", "shortconv_rows", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &bcx, 0, 3 * uint64_t(s.n_tokens) * E * 4},
                                  {2, &taps, 0, E * s.taps * 4},
                                  {3, &rings, 0, rings.size & ~uint64_t(3)},
                                  {4, &y, 0, uint64_t(s.n_tokens) * E * 4},
                                  {5, &seqs, 0, uint64_t(s.n_tokens) * 8}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

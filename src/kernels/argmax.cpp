#include "kernels/argmax.h"

#include <algorithm>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {
constexpr uint32_t kArgmaxWorkgroup = 256;
constexpr uint32_t kArgmaxChunk = 2 * kArgmaxWorkgroup;  // values per partial
}  // namespace

uint64_t argmax_scratch_bytes(uint32_t n, uint32_t rows) {
  return 8ull * std::max<uint32_t>(1, (n + kArgmaxChunk - 1) / kArgmaxChunk) * std::max<uint32_t>(rows, 1);
}

void encode_argmax(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& values, uint32_t n,
                   const gpu::Buffer& scratch, const gpu::Buffer& out, uint32_t out_index, uint32_t rows) {
  const char* fn = "encode_argmax";
  if (n == 0) fail(fn, "n must be > 0");
  if (rows == 0 || rows > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, "rows = " + std::to_string(rows) + " must be in [1, maxComputeWorkgroupsPerDimension]");
  const uint32_t n_partials = (n + kArgmaxChunk - 1) / kArgmaxChunk;
  if (n_partials > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, "n = " + std::to_string(n) + " needs more workgroups than maxComputeWorkgroupsPerDimension");
  const uint64_t value_bytes = uint64_t(n) * rows * 4, scratch_bytes = argmax_scratch_bytes(n, rows),
                 out_bytes = (uint64_t(out_index) + rows) * 4;
  need(fn, "values", values, value_bytes, ctx);
  need(fn, "scratch", scratch, scratch_bytes, ctx);
  need(fn, "out", out, out_bytes, ctx);
  if (scratch.get() == values.get() || scratch.get() == out.get() || out.get() == values.get())
    fail(fn, "values, scratch and out must be three different buffers");
  const ArgmaxParams p{n, kArgmaxChunk, n_partials, out_index};
  const gpu::BufferBinding params = batch.uniform(0, p);
  const gpu::BufferBinding part = {2, &scratch, 0, scratch_bytes};
  const gpu::BufferBinding first[] = {params, {1, &values, 0, value_bytes}, part};
  const gpu::BufferBinding second[] = {params, part, {3, &out, 0, out_bytes}};
  batch.dispatch(ctx.pipeline({"argmax.wgsl", "argmax_partial", {}, ""}), first, n_partials, rows);
  batch.dispatch(ctx.pipeline({"argmax.wgsl", "argmax_final", {}, ""}), second, rows);
}

}  // namespace wgllm::kernels

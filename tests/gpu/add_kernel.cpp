#include "add_kernel.h"

#include <string>

#include "wgllm/error.h"

namespace wgllm::test {

void encode_add(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& a, const gpu::Buffer& b,
                const gpu::Buffer& out, uint64_t n) {
  constexpr uint32_t kWorkgroup = 256;
  if (n == 0) throw InvalidArgument("encode_add: n must be > 0");
  if (n > UINT32_MAX) throw InvalidArgument("encode_add: n = " + std::to_string(n) + " exceeds 2^32-1");
  const uint64_t bytes = n * sizeof(float);
  for (auto [name, buf] : {std::pair{"a", &a}, std::pair{"b", &b}, std::pair{"out", &out}})
    if (buf->size < bytes)
      throw InvalidArgument(std::string("encode_add: buffer '") + name + "' holds " + std::to_string(buf->size) +
                            " bytes, needs " + std::to_string(bytes));
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const ElementwiseParams params{static_cast<uint32_t>(n), grid.x};
  WGPUComputePipeline pipe = ctx.pipeline({"elementwise.wgsl", "add", {{"WG", kWorkgroup}}, ""});
  const gpu::BufferBinding bindings[] = {
      batch.uniform(0, params), {1, &a, 0, bytes}, {2, &b, 0, bytes}, {3, &out, 0, bytes}};
  batch.dispatch(pipe, bindings, grid.x, grid.y);
}

}  // namespace wgllm::test

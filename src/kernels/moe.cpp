#include "kernels/moe.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {

constexpr const char* kShader = "moe_choose.wgsl+moe.wgsl";

}  // namespace

void encode_moe_route(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& logits,
                      const gpu::Buffer& experts, const gpu::Buffer& weights, uint32_t n_tokens, uint32_t n_expert,
                      uint32_t n_used, bool normalize, const gpu::Buffer* sigmoid_bias) {
  const char* fn = "encode_moe_route";
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (n_expert == 0 || n_expert > kMoeMaxExperts)
    fail(fn, "n_expert " + std::to_string(n_expert) + " must be in [1, " + std::to_string(kMoeMaxExperts) + "]");
  if (n_used == 0 || n_used > n_expert || n_used > kMoeMaxUsed)
    fail(fn, "n_used " + std::to_string(n_used) + " must be in [1, min(n_expert, " + std::to_string(kMoeMaxUsed) +
                 ")]");
  const uint64_t pairs = uint64_t(n_tokens) * n_used;
  need(fn, "logits", logits, uint64_t(n_tokens) * n_expert * 4, ctx);
  need(fn, "experts", experts, pairs * 4, ctx);
  need(fn, "weights", weights, pairs * 4, ctx);
  if (experts.get() == weights.get() || logits.get() == experts.get() || logits.get() == weights.get())
    fail(fn, "logits, experts and weights must be different buffers");
  if (sigmoid_bias) need(fn, "sigmoid_bias", *sigmoid_bias, uint64_t(n_expert) * 4, ctx);
  const auto grid = gpu::fold_grid(n_tokens, ctx.limits().maxComputeWorkgroupsPerDimension);
  const uint32_t flags = (normalize ? 1u : 0u) | (sigmoid_bias ? 2u : 0u);  // CH_NORM_TOP, CH_SIGMOID
  const MoeParams p{n_tokens, n_expert, n_used, flags, 0, grid.x, 0, 0};
  const gpu::BufferBinding b[] = {
      batch.uniform(0, p),
      {1, &logits, 0, uint64_t(n_tokens) * n_expert * 4},
      {2, &experts, 0, pairs * 4},
      {3, &weights, 0, pairs * 4},
      {7, sigmoid_bias ? sigmoid_bias : &ctx.placeholder_storage(), 0, sigmoid_bias ? uint64_t(n_expert) * 4 : 16}};
  batch.dispatch(ctx.pipeline({kShader, "moe_route", {}, ""}), b, grid.x, grid.y);
}

void encode_moe_group(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& experts, const gpu::Buffer& group,
                      uint32_t n_tokens, uint32_t n_expert, uint32_t n_used, uint32_t tile) {
  const char* fn = "encode_moe_group";
  if (n_tokens == 0 || n_used == 0 || n_used > n_expert || n_expert > kMoeMaxExperts)
    fail(fn, "n_tokens (" + std::to_string(n_tokens) + ") > 0 and 1 <= n_used (" + std::to_string(n_used) +
                 ") <= n_expert (" + std::to_string(n_expert) + ") <= " + std::to_string(kMoeMaxExperts) + " needed");
  const uint64_t pairs64 = uint64_t(n_tokens) * n_used;
  if (pairs64 > UINT32_MAX / 8) fail(fn, "n_tokens * n_used too large");
  const uint32_t pairs = uint32_t(pairs64);
  need(fn, "experts", experts, pairs64 * 4, ctx);
  need(fn, "group", group, moe_group_words(pairs) * 4, ctx);
  if (experts.get() == group.get()) fail(fn, "experts and group must be different buffers");
  if (tile == 0) tile = moe_tile(pairs, n_expert);
  const MoeParams p{n_tokens, n_expert, n_used, 0, moe_group_tiles(pairs, n_expert, tile), 1, tile, 0};
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {2, &experts, 0, pairs64 * 4},
                                  {6, &group, 0, moe_group_words(pairs) * 4}};
  batch.dispatch(ctx.pipeline({kShader, "moe_group", {}, ""}), b, 1);
}

void encode_moe_combine(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& ys, const gpu::Buffer& weights,
                        const gpu::Buffer& x, uint32_t n_tokens, uint32_t n_used, uint32_t width) {
  const char* fn = "encode_moe_combine";
  constexpr uint32_t kWorkgroup = 256;
  if (n_tokens == 0 || n_used == 0 || width == 0) fail(fn, "n_tokens, n_used and width must be > 0");
  const uint64_t pairs = uint64_t(n_tokens) * n_used, n = uint64_t(n_tokens) * width;
  if (n > UINT32_MAX) fail(fn, "n_tokens * width exceeds 2^32-1");
  need(fn, "ys", ys, pairs * width * 4, ctx);
  need(fn, "weights", weights, pairs * 4, ctx);
  need(fn, "x", x, n * 4, ctx);
  if (x.get() == ys.get() || x.get() == weights.get()) fail(fn, "x must not be an input");
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const MoeParams p{n_tokens, 0, n_used, 0, width, grid.x, 0, 0};
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {3, &weights, 0, pairs * 4},
                                  {4, &ys, 0, pairs * width * 4},
                                  {5, &x, 0, n * 4}};
  batch.dispatch(ctx.pipeline({kShader, "moe_combine", {}, ""}), b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

#include "kernels/embedding.h"

#include <algorithm>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;

void encode_embedding(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& table, const gpu::Buffer& ids,
                      const gpu::Buffer& out, uint32_t n_tokens) {
  const char* fn = "encode_embedding";
  detail::check_weight(fn, table);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (ids.size < uint64_t(n_tokens) * 4)
    fail(fn, "ids holds " + std::to_string(ids.size) +
                 " bytes, needs n_tokens * 4 = " + std::to_string(uint64_t(n_tokens) * 4));
  if (out.size < uint64_t(n_tokens) * table.n_in * 4)
    fail(fn, "out holds " + std::to_string(out.size) +
                 " bytes, needs n_tokens * n_embd * 4 = " + std::to_string(uint64_t(n_tokens) * table.n_in * 4));
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  const uint32_t step = std::min(detail::tokens_per_binding(fn, ctx, {table.n_in}), max_grid);
  WGPUComputePipeline pipe =
      ctx.pipeline({"matmul_common.wgsl+embedding.wgsl", "embed", {}, detail::weight_prelude(table.type, 1)});
  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const auto iw = detail::row_window(ctx, first, count, 1);
    const auto ow = detail::row_window(ctx, first, count, table.n_in);
    for (size_t i = 0; i < table.pieces.size(); ++i) {
      const auto& piece = table.pieces[i];
      MatmulParams p = detail::piece_params(table, piece, count);
      p.flags = i + 1 == table.pieces.size() ? flags::kLastPiece : 0;
      p.x_off = iw.first_word;
      p.y_off = ow.first_word;
      p.grid_x = count;
      const gpu::BufferBinding bindings[] = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {3, &out, ow.offset_bytes, ow.size_bytes},
          {5, &ids, iw.offset_bytes, iw.size_bytes},
      };
      batch.dispatch(pipe, bindings, count);
    }
  }
}

}  // namespace wgllm::kernels

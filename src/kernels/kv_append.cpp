#include "kernels/kv_append.h"

#include <string>

#include "wgllm/error.h"

namespace wgllm::kernels {

void encode_kv_append(gpu::ComputeBatch& batch, gpu::Context& ctx, KvCache& kv, const gpu::Buffer& k,
                      const gpu::Buffer& v, uint32_t start_pos, uint32_t n_tokens) {
  auto fail = [](const std::string& what) { throw InvalidArgument("encode_kv_append: " + what); };
  const auto& cfg = kv.config();
  const bool f16 = cfg.type == KvType::F16;
  if (n_tokens == 0) fail("n_tokens must be > 0");
  if (uint64_t(start_pos) + n_tokens > cfg.max_seq)
    fail("start_pos + n_tokens (" + std::to_string(uint64_t(start_pos) + n_tokens) + ") exceeds max_seq " +
         std::to_string(cfg.max_seq));
  if (f16 && cfg.kv_dim % 2) fail("kv_dim " + std::to_string(cfg.kv_dim) + " must be even for an F16 cache");
  const uint64_t bytes = uint64_t(n_tokens) * cfg.kv_dim * 4;
  if (k.size < bytes) fail("k holds " + std::to_string(k.size) + " bytes, needs " + std::to_string(bytes));
  if (v.size < bytes) fail("v holds " + std::to_string(v.size) + " bytes, needs " + std::to_string(bytes));
  if (bytes > ctx.max_binding_size()) fail("k/v exceed the storage-binding limit: append fewer tokens per call");
  const uint64_t threads = uint64_t(n_tokens) * (f16 ? cfg.kv_dim / 2 : cfg.kv_dim);
  if (threads > UINT32_MAX) fail("n_tokens * kv_dim exceeds 2^32");

  // The pools the rows touch (usually one).
  bool touched[KvCache::kMaxPools] = {};
  for (uint64_t pos = start_pos; pos < uint64_t(start_pos) + n_tokens;
       pos = (pos / kv.page_size() + 1) * kv.page_size())
    touched[kv.locate(uint32_t(pos)).pool] = true;

  constexpr uint32_t kWorkgroup = 256;
  const auto grid =
      gpu::fold_grid((threads + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  WGPUComputePipeline pipe = ctx.pipeline({"kv_append.wgsl", "kv_append", {}, ""});
  for (uint32_t pool = 0; pool < kv.n_pools(); ++pool) {
    if (!touched[pool]) continue;
    const KvAppendParams p{cfg.kv_dim,          start_pos, n_tokens,      kv.page_size(),
                           kv.pages_per_pool(), pool,      f16 ? 1u : 0u, grid.x};
    const gpu::BufferBinding b[] = {
        batch.uniform(0, p), {1, &k, 0, bytes}, {2, &v, 0, bytes}, {3, &kv.page_table()}, {4, &kv.pool(pool)}};
    batch.dispatch(pipe, b, grid.x, grid.y);
  }
}

}  // namespace wgllm::kernels

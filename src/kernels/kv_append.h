// Host encoder for kv_append.wgsl: appending new K/V rows to a paged KvCache on the GPU.
#pragma once
#include <cstdint>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"

namespace wgllm::kernels {

// Mirrors `KvAppendParams` in kv_append.wgsl.
struct KvAppendParams {
  uint32_t kv_dim, start_pos, n_tokens, page_size;
  uint32_t pages_per_pool, pool, is_f16, grid_x;
};
static_assert(sizeof(KvAppendParams) == 32);

// Writes k, v ([n_tokens][kv_dim] f32) to cache rows [start_pos, start_pos + n_tokens), rounded
// to f16 for an F16 cache (kv_dim must then be even). Rows may span pages and pools.
void encode_kv_append(gpu::ComputeBatch& batch, gpu::Context& ctx, KvCache& kv, const gpu::Buffer& k,
                      const gpu::Buffer& v, uint32_t start_pos, uint32_t n_tokens);

}  // namespace wgllm::kernels

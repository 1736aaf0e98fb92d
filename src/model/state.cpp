#include "model/state.h"

#include <string>

#include "kernels/delta_net.h"
#include "kernels/shortconv.h"
#include "wgllm/error.h"

namespace wgllm {

SequenceState::SequenceState(gpu::Context& ctx, const ModelConfig& c, uint32_t n_ctx, uint32_t ubatch,
                             kernels::KvType kv_type, const std::vector<std::optional<kernels::KvCache>>* shared_kv,
                             uint32_t kv_first_page) {
  const uint64_t E = c.n_embd, KV = c.max_kv_dim();
  // One page when the whole cache fits a binding, else pages of 256 positions across pools.
  const uint64_t one_page = 2ull * n_ctx * KV * kernels::kv_type_bytes(kv_type);
  const uint32_t page = one_page <= ctx.max_binding_size() ? 0 : 256;
  kv.resize(c.n_layer);
  conv.resize(c.n_layer);
  delta.resize(c.n_layer);
  recurrent = !c.delta_layers.empty();
  conv_taps = recurrent ? c.ssm_conv : c.l_cache;
  conv_rows = recurrent               ? kernels::delta_ring_rows(conv_taps)
              : c.conv_layers.empty() ? 0
                                      : kernels::conv_ring_rows(ubatch, conv_taps);
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (c.is_conv(l)) {
      conv[l] = ctx.create_buffer(uint64_t(conv_rows) * E * 4, WGPUBufferUsage_Storage,
                                  ("conv state " + std::to_string(l)).c_str());
      continue;
    }
    if (c.is_delta(l)) {
      conv[l] = ctx.create_buffer(uint64_t(conv_rows) * c.delta_conv_dim() * 4, WGPUBufferUsage_Storage,
                                  ("conv state " + std::to_string(l)).c_str());
      for (uint32_t i = 0; i < 2; ++i)
        delta[l][i] = ctx.create_buffer(delta_state_bytes(c), WGPUBufferUsage_Storage,
                                        ("recurrent state " + std::to_string(l) + "." + std::to_string(i)).c_str());
      continue;
    }
    if (!c.owns_kv(l)) continue;  // gemma4: attends over an earlier layer's cache
    if (shared_kv) {  // a view of the shared pool
      const auto& owner = shared_kv->at(l);
      if (!owner || n_ctx % owner->page_size() != 0)
        throw InvalidArgument("GpuSession: the shared KV caches do not fit the model or n_ctx " +
                              std::to_string(n_ctx));
      kv[l].emplace(*owner, kv_first_page, n_ctx / owner->page_size(), "kv cache view " + std::to_string(l));
      continue;
    }
    kv[l].emplace(ctx,
                  kernels::KvCacheConfig{.kv_dim = c.kv_dim_at(l), .max_seq = n_ctx, .page_size = page, .type = kv_type},
                  "kv cache " + std::to_string(l));
  }
}

uint64_t SequenceState::kv_bytes() const {
  uint64_t b = 0;
  for (const auto& cache : kv) b += cache ? cache->bytes() : 0;
  return b;
}

bool SequenceState::rewinds_to(uint32_t n, uint32_t n_past) const {
  if (recurrent) return n == n_past;
  // The rings hold rows of positions [n_past - conv_rows + 1, n_past - 1] (one row may hold a step queued ahead):
  // the state at n needs n - (taps - 1) ... n - 1.
  return conv_rows == 0 || uint64_t(n) + conv_rows >= uint64_t(n_past) + conv_taps;
}

std::vector<const gpu::Buffer*> SequenceState::rolling(uint32_t pos) const {
  std::vector<const gpu::Buffer*> buffers;
  for (size_t l = 0; l < conv.size(); ++l) {
    if (!conv[l].size) continue;
    buffers.push_back(&conv[l]);
    if (delta[l][0].size) buffers.push_back(&delta[l][pos % 2]);
  }
  return buffers;
}

void SequenceState::save(gpu::Context& ctx, gpu::ComputeBatch& batch, uint32_t pos) {
  Checkpoint c;
  if (checkpoints.size() == kMaxCheckpoints) {
    c = std::move(checkpoints.front());
    checkpoints.erase(checkpoints.begin());
  }
  c.pos = pos;
  const std::vector<const gpu::Buffer*> from = rolling(pos);
  for (size_t i = 0; i < from.size(); ++i) {
    if (i == c.copies.size())
      c.copies.push_back(ctx.create_buffer(from[i]->size, WGPUBufferUsage_Storage, "state checkpoint"));
    batch.copy(*from[i], 0, c.copies[i], 0, from[i]->size);
  }
  checkpoints.push_back(std::move(c));
}

void SequenceState::restore(gpu::ComputeBatch& batch, const Checkpoint& c) const {
  const std::vector<const gpu::Buffer*> to = rolling(c.pos);
  for (size_t i = 0; i < to.size(); ++i) batch.copy(c.copies[i], 0, *to[i], 0, to[i]->size);
}

const SequenceState::Checkpoint* SequenceState::checkpoint_at_most(uint32_t n) const {
  const Checkpoint* best = nullptr;
  for (const Checkpoint& c : checkpoints)
    if (c.pos <= n && (!best || c.pos > best->pos)) best = &c;
  return best;
}

void SequenceState::drop_checkpoints_after(uint32_t n) {
  std::erase_if(checkpoints, [n](const Checkpoint& c) { return c.pos > n; });
}

uint64_t kv_bytes_per_position(const ModelConfig& c, kernels::KvType type) {
  uint64_t dims = 0;  // over the layers with a cache of their own
  for (uint32_t l = 0; l < c.n_layer; ++l) dims += !c.is_attention(l) || !c.owns_kv(l) ? 0 : c.kv_dim_at(l);
  return 2 * dims * kernels::kv_type_bytes(type);
}

uint64_t delta_state_bytes(const ModelConfig& c) { return uint64_t(c.ssm_v_heads) * c.ssm_dk * c.ssm_dv * 4; }

uint64_t conv_state_bytes(const ModelConfig& c, uint32_t ubatch) {
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (c.is_conv(l)) bytes += uint64_t(kernels::conv_ring_rows(ubatch, c.l_cache)) * c.n_embd * 4;
    if (c.is_delta(l))
      bytes += uint64_t(kernels::delta_ring_rows(c.ssm_conv)) * c.delta_conv_dim() * 4 + 2 * delta_state_bytes(c);
  }
  return bytes;
}

std::vector<std::optional<kernels::KvCache>> make_shared_kv(gpu::Context& ctx, const ModelConfig& c, uint32_t sequences,
                                                            uint32_t n_ctx, uint32_t page_size, kernels::KvType type) {
  if (page_size == 0 || page_size % kernels::KvCache::kPageMultiple != 0 || n_ctx % page_size != 0)
    throw InvalidArgument("make_shared_kv: n_ctx " + std::to_string(n_ctx) + " must be a multiple of page_size " +
                          std::to_string(page_size) + ", itself a multiple of " +
                          std::to_string(kernels::KvCache::kPageMultiple));
  if (uint64_t(sequences) * n_ctx > UINT32_MAX) throw InvalidArgument("make_shared_kv: sequences x n_ctx exceeds 2^32");
  std::vector<std::optional<kernels::KvCache>> kv(c.n_layer);
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (c.is_attention(l) && c.owns_kv(l))
      kv[l].emplace(ctx,
                    kernels::KvCacheConfig{
                        .kv_dim = c.kv_dim_at(l), .max_seq = sequences * n_ctx, .page_size = page_size, .type = type},
                    "shared kv cache " + std::to_string(l));
  return kv;
}

}  // namespace wgllm

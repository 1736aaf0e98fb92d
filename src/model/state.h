// What one sequence carries from step to step besides its tokens, per layer: an attention layer's KV cache, a
// convolution layer's ring of conv rows (lfm2). GpuSession keeps one SequenceState; its truncate (and reset) asks
// the state whether it can rewind in place, and GpuBatchDecode reads and advances the states of several sessions.
// A layer kind with state of its own (a recurrent state) adds it here, beside the others, so that the sizes, the
// rewind rule and the sharing between sessions stay in one place.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "gpu/batch.h"
#include "gpu/context.h"
#include "kernels/kv_cache.h"
#include "model/config.h"

namespace wgllm {

struct SequenceState {
  // Allocates the state of n_ctx positions for prefill chunks of up to ubatch tokens. With shared_kv (the caches
  // of make_shared_kv), the KV caches are views of its pages [kv_first_page, kv_first_page + n_ctx / page size);
  // otherwise each layer gets a cache of its own (one page when it fits a binding, else pages of 256 positions).
  SequenceState() = default;
  SequenceState(gpu::Context& ctx, const ModelConfig& c, uint32_t n_ctx, uint32_t ubatch, kernels::KvType kv_type,
                const std::vector<std::optional<kernels::KvCache>>* shared_kv, uint32_t kv_first_page);

  std::vector<std::optional<kernels::KvCache>> kv;  // [n_layer]; none for convolution layers
  // lfm2: per convolution layer a ring of conv_rows B*x rows, row q % conv_rows holding position q (size 0 for
  // attention layers). Rows of the last conv_rows - 1 positions are kept, so truncate rewinds within them.
  // qwen35's DeltaNet layers keep a ring of their q/k/v in-projection rows (delta_conv_dim wide) of only ssm_conv
  // rows (kernels::delta_ring_rows; a recurrent state does not rewind, so the ring need not either).
  std::vector<gpu::Buffer> conv;  // [n_layer]
  uint32_t conv_rows = 0;         // 0 without convolution layers
  uint32_t conv_taps = 0;         // the convolution's taps (l_cache; qwen35: ssm_conv)
  // qwen35: per DeltaNet layer its recurrent state, [v_heads][dk][dv] f32, in two buffers (size 0 for other
  // layers): the state after position p (p tokens fed) is in delta[l][p % 2]. A step reads one and writes the other,
  // so a decode step run ahead of the host (GpuSession::decode_on_gpu) leaves the state at n_past intact. It cannot
  // rewind further: truncating a sequence that has one feeds the kept tokens again (rewinds_to). At position 0 the
  // kernels start from zeros rather than read it. (delta_state_buffers: which buffer a step reads and writes.)
  std::vector<std::array<gpu::Buffer, 2>> delta;  // [n_layer]
  bool recurrent = false;                         // some layer has a recurrent state

  // Copies of the states that do not rewind in place (the conv rings, the recurrent states) at chosen positions
  // (GpuSession::checkpoint): going back to one of them needs no token fed again. Oldest first; at most
  // kMaxCheckpoints, the oldest replaced (its buffers reused). KV caches need no copy: their rows past a position
  // are simply overwritten later.
  struct Checkpoint {
    uint32_t pos = 0;
    std::vector<gpu::Buffer> copies;  // of rolling(pos)
  };
  std::vector<Checkpoint> checkpoints;
  static constexpr size_t kMaxCheckpoints = 2;
  // Whether some layer keeps a state beyond its KV cache (a conv ring or a recurrent state): what checkpoints copy.
  bool rolls() const { return conv_rows > 0; }
  // The buffers a checkpoint at pos copies, in its order: per layer with a conv ring, the ring, then (qwen35) the
  // recurrent state after pos.
  std::vector<const gpu::Buffer*> rolling(uint32_t pos) const;
  // Encodes the copies of the state after `pos` positions into a checkpoint (a new one, or the oldest replaced).
  void save(gpu::Context& ctx, gpu::ComputeBatch& batch, uint32_t pos);
  // Encodes the copies back from checkpoint c: the state is then the one after c.pos positions.
  void restore(gpu::ComputeBatch& batch, const Checkpoint& c) const;
  // The latest checkpoint at or before position n; null when none.
  const Checkpoint* checkpoint_at_most(uint32_t n) const;
  // Forgets the checkpoints past position n (their tokens are being replaced).
  void drop_checkpoints_after(uint32_t n);

  uint64_t kv_bytes() const;  // GPU memory of the KV caches
  // Whether the state after the first n of n_past positions is at hand in place (0 < n <= n_past): KV rows past n
  // are simply overwritten later, the conv rings still hold the rows of the positions n needs; a recurrent state
  // only at n = n_past. Otherwise the first n tokens are fed again.
  bool rewinds_to(uint32_t n, uint32_t n_past) const;
};

// GPU memory one KV cache position takes over all attention layers (K and V of `type`).
uint64_t kv_bytes_per_position(const ModelConfig& c, kernels::KvType type = kernels::KvType::F16);
// GPU memory of one sequence's conv and recurrent states (lfm2, qwen35; 0 without such layers) for prefill chunks of
// `ubatch`.
uint64_t conv_state_bytes(const ModelConfig& c, uint32_t ubatch);
// GPU memory of one DeltaNet layer's recurrent state (qwen35).
uint64_t delta_state_bytes(const ModelConfig& c);

// Per attention layer one cache of `sequences` x n_ctx positions in pages of `page_size`, for sessions that share
// them (GpuSessionOptions::shared_kv): sequence s takes pages [s * n_ctx / page_size, ...). n_ctx must be a multiple
// of page_size (a multiple of 128).
std::vector<std::optional<kernels::KvCache>> make_shared_kv(gpu::Context& ctx, const ModelConfig& c, uint32_t sequences,
                                                            uint32_t n_ctx, uint32_t page_size,
                                                            kernels::KvType type = kernels::KvType::F16);

}  // namespace wgllm

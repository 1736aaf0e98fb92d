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
#include "wgllm/error.h"

namespace wgllm {

class SharedKv;

struct SequenceState {
  // Allocates the state of n_ctx positions for prefill chunks of up to ubatch tokens. With shared_kv, the KV caches
  // are views of its sequence `sequence` (n_ctx must be its n_ctx); otherwise each layer gets a cache of its own (one
  // page when it fits a binding, else pages of 256 positions).
  SequenceState() = default;
  SequenceState(gpu::Context& ctx, const ModelConfig& c, uint32_t n_ctx, uint32_t ubatch, kernels::KvType kv_type,
                SharedKv* shared_kv, uint32_t sequence);

  std::vector<std::optional<kernels::KvCache>> kv;  // [n_layer]; none for convolution layers
  SharedKv* shared = nullptr;                       // the caches kv views, and which of its sequences
  uint32_t sequence = 0;
  // lfm2: per convolution layer a ring of conv_rows B*x rows, row q % conv_rows holding position q (size 0 for
  // attention layers). Rows of the last conv_rows - 1 positions are kept, so truncate rewinds within them.
  // qwen35's DeltaNet layers keep a ring of their q/k/v in-projection rows (delta_conv_dim wide) of only ssm_conv
  // rows (kernels::delta_ring_rows; a recurrent state does not rewind, so the ring need not either).
  // With shared_kv, the rings are views of its pool (SharedKv::conv_rings, when the pool fits a binding): conv[l] is
  // the pool and the ring starts conv_at[l] bytes into it, conv_bytes[l] long.
  std::vector<gpu::Buffer> conv;     // [n_layer]
  std::vector<uint64_t> conv_at;     // [n_layer] bytes
  std::vector<uint64_t> conv_bytes;  // [n_layer] bytes of the ring (0 for layers without one)
  uint32_t conv_rows = 0;            // 0 without convolution layers
  uint32_t conv_taps = 0;         // the convolution's taps (l_cache; qwen35: ssm_conv)
  // qwen35: per DeltaNet layer its recurrent state, [v_heads][dk][dv] f32, in two buffers (size 0 for other
  // layers): the state after position p (p tokens fed) is in delta[l][p % 2]. A step reads one and writes the other,
  // so a decode step run ahead of the host (GpuSession::decode_on_gpu) leaves the state at n_past intact. It cannot
  // rewind further: truncating a sequence that has one feeds the kept tokens again (rewinds_to). At position 0 the
  // kernels start from zeros rather than read it. With shared_kv (where its pools fit a binding) the two are views of
  // one pool (SharedKv::delta_states, together with the rings): delta[l][i] is the pool and the state starts
  // delta_at[l][i] bytes into it, delta_bytes long.
  std::vector<std::array<gpu::Buffer, 2>> delta;  // [n_layer]
  std::vector<std::array<uint64_t, 2>> delta_at;  // [n_layer] bytes
  uint64_t delta_bytes = 0;                       // a state's bytes (0 without DeltaNet layers)
  bool recurrent = false;                         // some layer has a recurrent state
  // Every ring (and recurrent state) of this sequence is a view of `shared`'s pools, at the same offsets in every
  // layer: a batched step of such sequences of one SharedKv runs them in one dispatch a layer (GpuBatchDecode).
  bool pooled_rings = false;

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

  // Conv rings (lfm2) on a shared pool: at every page boundary P of the pool (mark_every positions apart) the ring
  // rows of positions [P - (conv_taps - 1), P), which are the whole conv state at P, copied aside as a step crosses
  // P (save_marks, in the step's command stream). A sequence whose tokens before a page boundary are another's takes
  // that one's pages and its marks (take_marks), and a truncation to a page boundary restores the rings from the
  // sequence's own: the conv state at P needs no token fed again. The marks of the boundaries up to n_past are
  // those of its tokens as long as every step that advances n_past saves them (encode_conv does). Recurrent states
  // (qwen35) have none: a checkpoint would be a whole state per page.
  std::vector<gpu::Buffer> marks;  // [n_layer]: [n_ctx / mark_every][conv_taps - 1][E] f32 (conv layers)
  uint32_t mark_every = 0;         // 0: no marks
  // The latest page boundary at or before n whose mark a rewind can take (0: none).
  uint32_t mark_at_most(uint32_t n) const { return mark_every ? n - n % mark_every : 0; }
  // Encodes the copies of layer l's ring rows at each page boundary in (pos, pos + n] (a step of n tokens at pos
  // that has written them).
  void save_marks(gpu::ComputeBatch& batch, uint32_t layer, uint32_t pos, uint32_t n) const;
  // Encodes the conv state at page boundary p from `from`'s marks (this state, or another sequence's of the same
  // shape: then its marks up to p as well) into the rings.
  void take_marks(gpu::ComputeBatch& batch, const SequenceState& from, uint32_t p) const;
  // Whether take_marks(from, ...) fits: both keep marks, with the same rings.
  bool takes_marks_of(const SequenceState& from) const;
  uint64_t ring_offset(uint32_t l, uint32_t q) const;  // layer l's ring row of position q, in bytes
  uint64_t mark_offset(uint32_t l, uint32_t p) const;  // layer l's mark of page boundary p, in bytes
  // The buffer ranges a checkpoint at pos copies, in its order: per layer with a conv ring, the ring, then (qwen35) the
  // recurrent state after pos.
  struct Range {
    const gpu::Buffer* buffer;
    uint64_t offset, size;
  };
  std::vector<Range> rolling(uint32_t pos) const;
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
  // Before writing from position n on: the KV pages that hold positions n and later made this sequence's own
  // (SharedKv::own_from; nothing for caches of its own).
  void own_from(uint32_t n);
  // Before writing positions [0, end): their KV pages mapped (SharedKv::reserve; nothing for caches of its own).
  void reserve(uint32_t end);
};

// GPU memory one KV cache position takes over all attention layers (K and V of `type`).
uint64_t kv_bytes_per_position(const ModelConfig& c, kernels::KvType type = kernels::KvType::F16);
// GPU memory of one sequence's conv and recurrent states (lfm2, qwen35; 0 without such layers) for prefill chunks of
// `ubatch`.
uint64_t conv_state_bytes(const ModelConfig& c, uint32_t ubatch);
// GPU memory of one DeltaNet layer's recurrent state (qwen35).
uint64_t delta_state_bytes(const ModelConfig& c);

// Per attention layer one cache of `sequences` x n_ctx positions in pages of `page_size`, which sessions view
// (GpuSessionOptions::shared_kv): sequence s's positions are its logical pages [s * n_ctx / page_size, ...), the
// same in every layer. A prompt that begins as another sequence's cached tokens may take them over (share): the
// whole pages behind them become the same physical pages in both sequences (reference-counted), the last partial
// one is copied. A sequence writes only at or past its n_past, and a truncation first makes the pages it will write
// its own again (own_from: a shared page replaced by a free one, the rows kept copied), so no sequence ever writes
// a page another one reads. n_ctx must be a multiple of page_size (a multiple of 128).
//
// With a page for every logical page (`pages` 0, the default) every sequence holds all of its pages all the time, so
// a free page is at hand whenever one is shared. With fewer, pages are mapped as sequences reach them (reserve,
// which GpuSession and GpuBatchDecode call before they write) and unmapped past a truncation; when none is free, the
// pages of idle sequences (set_idle) go, the least recently used sequence's last pages first, and that sequence's
// cache ends where its pages do (kept; GpuSession::sync_pages truncates it there). Pages only running sequences
// hold are never taken: reserve then throws KvPoolFull.
class SharedKv {
 public:
  SharedKv(gpu::Context& ctx, const ModelConfig& c, uint32_t sequences, uint32_t n_ctx, uint32_t page_size,
           kernels::KvType type = kernels::KvType::F16, uint32_t pages = 0);

  static constexpr uint32_t kNone = UINT32_MAX;  // no page; kept(): nothing evicted

  // Layer l's cache (none for layers without one of their own).
  const std::optional<kernels::KvCache>& layer(uint32_t l) const { return layers_.at(l); }
  uint32_t sequences() const { return sequences_; }
  uint32_t n_ctx() const { return pages_per_sequence_ * page_size_; }  // positions per sequence
  uint32_t page_size() const { return page_size_; }
  uint32_t first_page(uint32_t sequence) const { return sequence * pages_per_sequence_; }
  uint32_t pages() const { return uint32_t(refs_.size()); }  // physical pages
  bool on_demand() const { return pages() < map_.size(); }   // fewer pages than the sequences' logical ones

  // Sequence `to`'s first n positions become those of sequence `from` (n no more than what `from` has written):
  // whole pages shared, the partial last one copied; `to`'s pages from position n on made its own.
  void share(uint32_t to, uint32_t from, uint32_t n);
  // Makes the pages holding sequence s's positions [n, n_ctx) its own, keeping rows [page start, n) of a shared one
  // (on demand: the pages wholly past n unmapped).
  void own_from(uint32_t s, uint32_t n);
  // Pages behind sequence s's positions [0, end) (end clamped to n_ctx), mapping those it lacks; KvPoolFull when no
  // page is free and no idle sequence holds one.
  void reserve(uint32_t s, uint32_t end);
  // Whether sequence s's pages may be taken for others (a sequence that does not run; false at first).
  void set_idle(uint32_t s, bool idle);
  // Where sequence s's cache ends since its pages were taken (kNone: none were), and forgetting it.
  uint32_t kept(uint32_t s) const { return kept_.at(s); }
  void clear_kept(uint32_t s) { kept_.at(s) = kNone; }
  // lfm2: conv layer l's rings of every sequence in one buffer, sequence s's ring_bytes at s * ring_bytes, so that a
  // batched step convolves all its sequences in one dispatch (SequenceState views it). Made on the first call for a
  // layer; null where they would not fit one binding, or for rings of another size than the first call's.
  const gpu::Buffer* conv_rings(uint32_t layer, uint64_t ring_bytes);
  // qwen35: DeltaNet layer l's recurrent states of every sequence in one buffer, sequence s's two
  // (SequenceState::delta) at (2 s + i) * state_bytes, so that a batched step updates all its sequences in one
  // dispatch. As conv_rings.
  const gpu::Buffer* delta_states(uint32_t layer, uint64_t state_bytes);
  // Physical pages in more than one sequence, and in none.
  uint32_t pages_shared() const;
  uint32_t pages_free() const;
  // Sequence s's physical page behind its position `pos` (the same in every layer; kNone when unmapped).
  uint32_t physical_page(uint32_t s, uint32_t pos) const;

 private:
  // Points sequence s's logical page p at `physical` (kNone: unmaps it), in every layer.
  void point(uint32_t s, uint32_t p, uint32_t physical);
  // A physical page no sequence holds: a free one, else (on demand) one an idle sequence gives up.
  uint32_t free_page();
  // The staging buffer of copies within a pool: as large as the widest layer's page.
  const gpu::Buffer& staging();
  struct Busy;

  gpu::Context& ctx_;
  std::vector<std::optional<kernels::KvCache>> layers_;  // [n_layer]
  uint32_t sequences_ = 0, pages_per_sequence_ = 0, page_size_ = 0;
  std::vector<uint32_t> map_;           // [sequences x pages_per_sequence] logical -> physical (or kNone)
  std::vector<uint32_t> refs_;          // [physical pages] how many logical pages point at each
  std::vector<uint32_t> kept_;          // [sequences] see kept()
  std::vector<uint8_t> idle_;           // [sequences]
  std::vector<uint64_t> used_;          // [sequences] when each last reserved (a count)
  uint64_t clock_ = 0;
  std::optional<gpu::Buffer> staging_;  // a page, for copies within a pool
  std::vector<std::optional<gpu::Buffer>> conv_rings_;    // [n_layer]
  uint64_t conv_ring_bytes_ = 0;                          // the rings' size (0: none made yet)
  std::vector<std::optional<gpu::Buffer>> delta_states_;  // [n_layer]
};

// SharedKv::reserve found every page held by running sequences.
class KvPoolFull : public Error {
 public:
  using Error::Error;
};

}  // namespace wgllm

// One decode step of several sequences at once (continuous batching): the token of each sequence goes through the
// layers together with the others, so every weight matrix is read once for all of them; each sequence's attention
// (or convolution) reads and appends its own cache. The sessions keep their state exactly as a decode step of their
// own (forward of one token) would leave it.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "gpu/batch.h"
#include "kernels/sample.h"
#include "model/transformer.h"

namespace wgllm {

class GpuBatchDecode {
 public:
  // Activations for up to max_sequences tokens. The context and model must outlive it. With shared_kv (the caches
  // the sessions are views of: GpuSessionOptions::shared_kv, one pool each), the RoPE + KV append and the attention of
  // every sequence are one dispatch each per layer; otherwise one per sequence.
  GpuBatchDecode(gpu::Context& ctx, const GpuModel& model, uint32_t max_sequences, const SharedKv* shared_kv = nullptr);
  ~GpuBatchDecode();

  // Feeds ids[i] to sessions[i] (distinct sessions of this model, each with room for one more position) and returns
  // the logits of every one: [sessions.size()][n_vocab]. Throws InvalidArgument before any work for a bad id, a full
  // session, a repeated session or more sessions than max_sequences; ModelError for non-finite logits.
  std::vector<float> step(std::span<GpuSession* const> sessions, std::span<const int32_t> ids);
  // The same step with each sequence's next token chosen on the GPU as greedy decoding does (the lowest index of the
  // largest logit, argmax.wgsl) in one dispatch pair for all of them; only the ids come back: [sessions.size()].
  // With queue_next, before reading them it queues the next step of the same sessions, fed these ids on the GPU: a
  // call with these sessions or some of them (in this order), none changed since, and the ids this one returned finds
  // its step already running (ahead_steps); any other call drops it (dropped_steps) and runs its own. A caller that
  // knows its next call will bring another session (BatchEngine: a prompt about to join) leaves queue_next off.
  std::vector<int32_t> step_argmax(std::span<GpuSession* const> sessions, std::span<const int32_t> ids,
                                   bool queue_next = true);

  // The step with row i's token drawn on the GPU as sample.wgsl draws it (kernels::encode_sample_rows with rows[i]'s
  // settings, uniform and recent ids: the id encode_sample gives that sequence's logits alone), all rows in one set of
  // dispatches; only the ids come back, and with `logits` also every row's logits ([sessions.size()][n_vocab]) for
  // rows the caller samples itself. No step is queued ahead. Throws ModelError where a row's logits are not finite.
  std::vector<int32_t> step_sample(std::span<GpuSession* const> sessions, std::span<const int32_t> ids,
                                   std::span<const kernels::SampleRow> rows, std::vector<float>* logits = nullptr);

  // Whether step_sample takes max_sequences() rows: their scratch fits one binding (kernels::sample_rows_scratch_bytes;
  // about 16 bytes a row and vocabulary entry). Fixed for its life, so a caller can choose by it once.
  bool samples_rows() const;

  uint32_t max_sequences() const { return max_; }
  uint64_t bind_groups_made() const { return bind_cache_->misses(); }
  // Steps that ran every sequence's RoPE + append and attention as one dispatch each (shared_kv), over its life.
  uint64_t shared_steps() const { return shared_steps_; }
  // Steps submitted as encoded while the step before them ran (the same sessions, one position on), over its life.
  uint64_t prepared_steps() const { return prepared_steps_; }
  // step_argmax's steps found running when called (queued by the call before), and those dropped unused.
  uint64_t ahead_steps() const { return ahead_steps_; }
  uint64_t dropped_steps() const { return dropped_steps_; }
  // Time the host spent waiting for steps' logits or ids to come back, over its life.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Buffers;
  struct Prepared;
  struct Ahead;
  struct Encoded {
    std::unique_ptr<gpu::ComputeBatch> batch;
    bool shared = false;  // every sequence's RoPE + append and attention one dispatch each
  };
  struct InFlight {
    gpu::SubmissionIndex done_at = 0;
    uint32_t parity = 0;  // the readback buffer its ids go to
    uint32_t n_rows = 0;  // its sessions
    bool shared = false;
  };
  InFlight submit(Encoded step, uint32_t parity, uint32_t n_rows);
  void drop_ahead();
  static bool same_sessions(std::span<GpuSession* const> sessions, const std::vector<GpuSession*>& of);
  static bool at_positions(std::span<GpuSession* const> sessions, const std::vector<uint32_t>& positions);
  static bool all_have_room(std::span<GpuSession* const> sessions);
  // The pages of every session's next position (SharedKv::reserve): false when the pool has none for one.
  static bool reserve_next(std::span<GpuSession* const> sessions);
  // Each session one position on, holding its id, as a decode step of its own leaves it.
  static void advance(std::span<GpuSession* const> sessions, std::span<const int32_t> ids);
  // InvalidArgument (naming fn) for a bad id, a full, foreign or repeated session or too many sessions.
  void check_step(std::span<GpuSession* const> sessions, std::span<const int32_t> ids, const char* fn) const;
  // The step of each session at its position, ids read from the ids buffer when it runs (with id_rows, session i's
  // from row id_rows[i] of it), up to its logits, then `tail`'s encode_tail. Writes the positions' table buffers.
  enum class Tail { None, Argmax };
  Encoded encode_step(std::span<GpuSession* const> sessions, Tail tail, uint32_t parity,
                      std::span<const uint32_t> id_rows = {});
  // After a step's logits: with `sample` each row's id drawn by encode_sample_rows, else with logits_too none, else
  // each row's argmax; the ids written over the ids buffer and copied to readback buffer `parity`; with logits_too
  // the logits copied to the mappable buffer.
  void encode_tail(gpu::ComputeBatch& batch, uint32_t n, std::span<const kernels::SampleRow> sample, bool logits_too,
                   uint32_t parity);
  // step()'s: the next step of the same sessions encoded (without its tail) while this one runs, where each has room.
  void prepare_next(std::span<GpuSession* const> sessions);
  gpu::Context& ctx_;
  const GpuModel& model_;
  uint32_t max_;
  const SharedKv* shared_kv_;
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<gpu::BindCache> bind_cache_;
  uint64_t shared_steps_ = 0;
  uint64_t prepared_steps_ = 0;
  uint64_t ahead_steps_ = 0, dropped_steps_ = 0;
  double wait_seconds_ = 0;
  uint32_t parity_ = 0;             // the readback buffer of the next step submitted
  std::unique_ptr<Prepared> next_;  // step's: the step encoded ahead, if any
  std::unique_ptr<Ahead> ahead_;    // step_argmax's: the step queued ahead, if any
};

}  // namespace wgllm

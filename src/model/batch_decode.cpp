#include "model/batch_decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/sample.h"
#include "kernels/scale.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {
constexpr auto kStorage = WGPUBufferUsage_Storage;
}  // namespace

// Activations for up to max_sequences tokens, row i for sequence i. Row-major [tokens][width] f32.
struct GpuBatchDecode::Buffers {
  SessionBuffers layer;  // what the layers' blocks read and write (ids, x, q, ..., decode_scratch)
  gpu::Buffer logits, logits_host;
  // step_argmax: each row's chosen id goes into layer.ids (the next step's input) and to a mappable copy, one per step
  // parity (a step run ahead copies into the other while the host reads this one's); the argmax's partials.
  std::array<gpu::Buffer, 2> chosen_host;
  gpu::Buffer argmax_scratch;
  // step_sample's: the rows' parameters, their recent ids (grown as needed) and scratch, made on its first call
  gpu::Buffer sample_params, sample_recent, sample_scratch;
  gpu::Buffer ids_before;  // [n] u32: a step's chosen ids, when the step after it takes only some of their rows
  gpu::Buffer rows;     // [n] (position, K offset, V offset, 0): the RoPE + append of every sequence (shared_kv)
  gpu::Buffer queries;  // [n] (position, first page): the attention of every sequence (shared_kv)
  gpu::Buffer conv_seqs;  // [n] (position, ring base): the short convolution of every sequence (pooled rings)
  gpu::Buffer delta_seqs;  // [n] (position, ring, state, state after): every sequence's DeltaNet step (pooled)
};

GpuBatchDecode::GpuBatchDecode(gpu::Context& ctx, const GpuModel& model, uint32_t max_sequences,
                               const SharedKv* shared_kv)
    : ctx_(ctx),
      model_(model),
      max_(max_sequences),
      shared_kv_(shared_kv),
      buf_(std::make_unique<Buffers>()),
      bind_cache_(std::make_unique<gpu::BindCache>(ctx)) {
  if (max_ == 0) throw InvalidArgument("GpuBatchDecode: max_sequences must be >= 1");
  const ModelConfig& c = model.config;
  const uint64_t N = max_, E = c.n_embd, Q = c.max_q_dim(), KV = c.max_kv_dim(), F = c.max_n_ff(), V = c.n_vocab;
  auto make = [&](uint64_t floats, const char* label) {
    return ctx.create_buffer(std::max<uint64_t>(floats, 4) * 4, kStorage, label);
  };
  Buffers& bb = *buf_;
  SessionBuffers& b = bb.layer;
  const bool conv = !c.conv_layers.empty();
  b.ids = make(N, "batch ids");
  b.x = make(N * E, "batch x");
  b.q = make(N * Q, "batch q");
  b.k = make(N * KV, "batch k");
  b.v = make(N * KV, "batch v");
  b.attn = make(N * Q, "batch attn");
  b.gate = make(N * gate_act_width(c), "batch gate");
  b.up = make(N * F, "batch up");
  b.act = make(N * gate_act_width(c), "batch act");
  b.proj = make(c.post_norms ? N * E : 1, "batch proj");
  b.bcx = make(conv ? N * 3 * E : 1, "batch bcx");
  b.conv_y = make(conv ? N * E : 1, "batch conv y");
  b.decode_scratch = make(1, "batch decode scratch");
  make_moe_buffers(ctx, c, b, N);
  make_delta_buffers(ctx, c, b, N);
  make_ple_buffers(ctx, c, b, N);
  bb.logits = make(N * V, "batch logits");
  bb.logits_host = ctx.create_buffer(N * V * 4, WGPUBufferUsage_MapRead, "batch logits readback");
  for (gpu::Buffer& host : bb.chosen_host)
    host = ctx.create_buffer(N * 4, WGPUBufferUsage_MapRead, "batch chosen ids readback");
  bb.argmax_scratch =
      ctx.create_buffer(kernels::argmax_scratch_bytes(uint32_t(V), uint32_t(N)), kStorage, "batch argmax scratch");
  bb.ids_before = make(N, "batch ids before");
  bb.rows = make(N * 4, "batch decode rows");
  bb.queries = make(N * 2, "batch decode queries");
  bb.conv_seqs = make(N * 2, "batch decode conv rows");
  bb.delta_seqs = make(N * 4, "batch decode delta rows");
}

// A step encoded while the previous one ran: the same sessions, each one position on, its ids written when it is
// submitted. Everything else it encodes (positions, cache locations, buffers) follows from the sessions and their
// positions alone.
struct GpuBatchDecode::Prepared {
  std::vector<GpuSession*> sessions;
  std::vector<uint32_t> positions;
  const gpu::Profiler* profiler = nullptr;
  Encoded step;
};

// A step submitted before the host read the ids it feeds (step_argmax): the sessions at their positions, each
// session's change count after the step before, and the ids that step chose (its input).
struct GpuBatchDecode::Ahead {
  std::vector<GpuSession*> sessions;
  std::vector<uint32_t> positions;
  std::vector<uint64_t> changes;
  std::vector<int32_t> fed;
  const gpu::Profiler* profiler = nullptr;
  InFlight step;
};

GpuBatchDecode::~GpuBatchDecode() = default;

namespace {
ModelError non_finite_logits(uint32_t pos, uint32_t sequence) {
  return ModelError("the logits at position " + std::to_string(pos) + " of sequence " + std::to_string(sequence) +
                    " are not finite (NaN or infinity): the model's activations overflow or its weights are corrupt");
}
}  // namespace

std::vector<float> GpuBatchDecode::step(std::span<GpuSession* const> sessions, std::span<const int32_t> ids) {
  check_step(sessions, ids, "GpuBatchDecode::step");
  drop_ahead();
  const uint32_t N = uint32_t(sessions.size()), V = model_.config.n_vocab;
  // The step encoded while the one before ran, when it was made for these sessions at these positions.
  std::unique_ptr<Prepared> prepared = std::move(next_);
  const bool hit = prepared && prepared->profiler == ctx_.profiler() && same_sessions(sessions, prepared->sessions) &&
                   at_positions(sessions, prepared->positions);
  Encoded step = hit ? std::move(prepared->step) : encode_step(sessions, Tail::None, 0);
  prepared.reset();
  encode_tail(*step.batch, N, {}, true, 0);
  ctx_.write_buffer(buf_->layer.ids, 0, ids.data(), ids.size_bytes());
  step.batch->submit();
  if (hit) ++prepared_steps_;
  if (step.shared) ++shared_steps_;
  advance(sessions, ids);
  // While the GPU works, the next step of the same sessions (the likely next call), where each has room for it.
  prepare_next(sessions);
  std::vector<float> logits(size_t(N) * V);
  const auto w0 = std::chrono::steady_clock::now();
  ctx_.read_mapped(buf_->logits_host, 0, logits.data(), uint64_t(N) * V * 4);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  for (uint32_t i = 0; i < N; ++i)
    for (size_t j = 0; j < V; ++j)
      if (!std::isfinite(logits[size_t(i) * V + j])) throw non_finite_logits(sessions[i]->n_past_ - 1, i);
  return logits;
}

std::vector<int32_t> GpuBatchDecode::step_argmax(std::span<GpuSession* const> sessions, std::span<const int32_t> ids,
                                                 bool queue_next) {
  check_step(sessions, ids, "GpuBatchDecode::step_argmax");
  next_.reset();  // encoded to end in logits
  const uint32_t N = uint32_t(sessions.size());
  // The step already queued by the call before serves this one when the sessions are some of its sessions, in its
  // order, each at the position it was queued for, unchanged since, and fed (on the GPU) the id the caller gives now.
  // Its rows of the sessions left out are not taken: what it wrote for them lies past their n_past (the cache rows
  // and conv ring row of the next position, the other of a recurrent state's two buffers), as a dropped step's does.
  std::unique_ptr<Ahead> ahead = std::move(ahead_);
  std::vector<uint32_t> rows;  // each session's row in the step that runs it
  bool hit = ahead && ahead->profiler == ctx_.profiler();
  for (uint32_t i = 0, j = 0; hit && i < N; ++i, ++j) {
    while (j < ahead->sessions.size() && ahead->sessions[j] != sessions[i]) ++j;
    hit = j < ahead->sessions.size() && sessions[i]->n_past_ == ahead->positions[j] &&
          sessions[i]->changes_ == ahead->changes[j] && ids[i] == ahead->fed[j];
    rows.push_back(j);
  }
  InFlight step;
  if (hit) {
    step = ahead->step;
    ++ahead_steps_;
  } else {
    if (ahead) ++dropped_steps_;
    ctx_.write_buffer(buf_->layer.ids, 0, ids.data(), ids.size_bytes());
    step = submit(encode_step(sessions, Tail::Argmax, parity_), parity_, N);
    parity_ ^= 1;
    rows.resize(N);
    for (uint32_t i = 0; i < N; ++i) rows[i] = i;
  }
  ahead.reset();
  if (step.shared) ++shared_steps_;
  advance(sessions, ids);
  // The next step is queued before this one's ids are read: its argmax input is this step's output, already in the
  // ids buffer when it runs, so the GPU goes from one step to the next while the host reads the ids and hands them
  // over (as GpuSession::decode_greedy's steps do).
  if (queue_next && all_have_room(sessions) && reserve_next(sessions)) {
    auto next = std::make_unique<Ahead>();
    next->sessions.assign(sessions.begin(), sessions.end());
    for (const GpuSession* s : sessions) {
      next->positions.push_back(s->n_past_);
      next->changes.push_back(s->changes_);
    }
    next->profiler = ctx_.profiler();
    // Its input: this step's ids, or when this step ran more sessions, their rows of them.
    const std::span<const uint32_t> id_rows = step.n_rows == N ? std::span<const uint32_t>() : rows;
    next->step = submit(encode_step(sessions, Tail::Argmax, parity_, id_rows), parity_, N);
    parity_ ^= 1;
    ahead_ = std::move(next);
  }
  std::vector<uint32_t> all(step.n_rows);
  const auto w0 = std::chrono::steady_clock::now();
  ctx_.read_mapped(buf_->chosen_host[step.parity], 0, all.data(), uint64_t(step.n_rows) * 4, step.done_at);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  std::vector<int32_t> chosen(N);
  for (uint32_t i = 0; i < N; ++i) {
    if (all[rows[i]] == kernels::kArgmaxNonFinite) {
      drop_ahead();
      throw non_finite_logits(sessions[i]->n_past_ - 1, i);
    }
    chosen[i] = int32_t(all[rows[i]]);
  }
  if (ahead_) ahead_->fed = chosen;
  return chosen;
}

std::vector<int32_t> GpuBatchDecode::step_sample(std::span<GpuSession* const> sessions, std::span<const int32_t> ids,
                                                 std::span<const kernels::SampleRow> rows, std::vector<float>* logits) {
  check_step(sessions, ids, "GpuBatchDecode::step_sample");
  const uint32_t N = uint32_t(sessions.size()), V = model_.config.n_vocab;
  if (rows.size() != N)
    throw InvalidArgument("GpuBatchDecode::step_sample: " + std::to_string(rows.size()) + " sampling rows for " +
                          std::to_string(N) + " sessions");
  if (!samples_rows())
    throw InvalidArgument("GpuBatchDecode::step_sample: the scratch of " + std::to_string(max_) + " rows of " +
                          std::to_string(V) + " logits exceeds one binding (samples_rows)");
  drop_ahead();
  // as step(): the step encoded while the one before ran, its choice of the ids appended
  std::unique_ptr<Prepared> prepared = std::move(next_);
  const bool hit = prepared && prepared->profiler == ctx_.profiler() && same_sessions(sessions, prepared->sessions) &&
                   at_positions(sessions, prepared->positions);
  Encoded encoded = hit ? std::move(prepared->step) : encode_step(sessions, Tail::None, 0);
  prepared.reset();
  encode_tail(*encoded.batch, N, rows, logits != nullptr, parity_);
  ctx_.write_buffer(buf_->layer.ids, 0, ids.data(), ids.size_bytes());
  const InFlight step = submit(std::move(encoded), parity_, N);
  parity_ ^= 1;
  if (hit) ++prepared_steps_;
  if (step.shared) ++shared_steps_;
  advance(sessions, ids);
  prepare_next(sessions);
  std::vector<uint32_t> all(N);
  const auto w0 = std::chrono::steady_clock::now();
  ctx_.read_mapped(buf_->chosen_host[step.parity], 0, all.data(), uint64_t(N) * 4, step.done_at);
  if (logits) {
    logits->resize(size_t(N) * V);
    ctx_.read_mapped(buf_->logits_host, 0, logits->data(), uint64_t(N) * V * 4);
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  std::vector<int32_t> chosen(N);
  for (uint32_t i = 0; i < N; ++i) {
    if (all[i] == kernels::kSampleNonFinite) throw non_finite_logits(sessions[i]->n_past_ - 1, i);
    chosen[i] = int32_t(all[i]);
  }
  return chosen;
}

bool GpuBatchDecode::samples_rows() const {
  const uint64_t V = model_.config.n_vocab;
  return kernels::sample_rows_scratch_bytes(max_, uint32_t(V)) <= ctx_.max_binding_size() &&
         kernels::sample_rows_scratch_bytes(max_, uint32_t(V)) / 4 <= UINT32_MAX && uint64_t(max_) * V <= UINT32_MAX;
}

void GpuBatchDecode::prepare_next(std::span<GpuSession* const> sessions) {
  if (!all_have_room(sessions)) return;
  try {
    auto next = std::make_unique<Prepared>();
    next->sessions.assign(sessions.begin(), sessions.end());
    for (const GpuSession* s : sessions) next->positions.push_back(s->n_past_);
    next->profiler = ctx_.profiler();
    next->step = encode_step(sessions, Tail::None, 0);
    next_ = std::move(next);
  } catch (const KvPoolFull&) {  // no page for it now: the next call encodes its own step
  }
}

void GpuBatchDecode::drop_ahead() {
  if (ahead_) ++dropped_steps_;
  ahead_.reset();
}

GpuBatchDecode::InFlight GpuBatchDecode::submit(Encoded step, uint32_t parity, uint32_t n_rows) {
  return {.done_at = step.batch->submit(), .parity = parity, .n_rows = n_rows, .shared = step.shared};
}

bool GpuBatchDecode::same_sessions(std::span<GpuSession* const> sessions, const std::vector<GpuSession*>& of) {
  return std::ranges::equal(sessions, of);
}

bool GpuBatchDecode::at_positions(std::span<GpuSession* const> sessions, const std::vector<uint32_t>& positions) {
  return std::equal(sessions.begin(), sessions.end(), positions.begin(), positions.end(),
                    [](const GpuSession* s, uint32_t pos) { return s->n_past_ == pos; });
}

bool GpuBatchDecode::reserve_next(std::span<GpuSession* const> sessions) {
  for (GpuSession* s : sessions)
    if (!s->try_reserve(s->n_past_ + 1)) return false;
  return true;
}

bool GpuBatchDecode::all_have_room(std::span<GpuSession* const> sessions) {
  return std::all_of(sessions.begin(), sessions.end(), [](const GpuSession* s) { return s->n_past_ < s->n_ctx_; });
}

// Each session now holds its token, as a decode step of its own leaves it.
void GpuBatchDecode::advance(std::span<GpuSession* const> sessions, std::span<const int32_t> ids) {
  for (size_t i = 0; i < sessions.size(); ++i) {
    GpuSession& s = *sessions[i];
    s.next_.reset();
    s.tokens_.resize(s.n_past_);
    s.tokens_.push_back(ids[i]);
    ++s.n_past_;
    ++s.changes_;
  }
}

void GpuBatchDecode::check_step(std::span<GpuSession* const> sessions, std::span<const int32_t> ids,
                                const char* fn) const {
  const ModelConfig& c = model_.config;
  if (sessions.size() != ids.size()) throw InvalidArgument(std::string(fn) + ": sessions and ids differ in count");
  if (sessions.empty() || sessions.size() > max_)
    throw InvalidArgument(std::string(fn) + ": " + std::to_string(sessions.size()) + " sessions (1 to " +
                          std::to_string(max_) + ")");
  const uint32_t N = uint32_t(sessions.size()), V = c.n_vocab;
  for (uint32_t i = 0; i < N; ++i) {
    const GpuSession* s = sessions[i];
    if (!s || &s->model_ != &model_ || &s->ctx_ != &ctx_)
      throw InvalidArgument(std::string(fn) + ": session " + std::to_string(i) + " is not of this model");
    if (std::find(sessions.begin(), sessions.begin() + i, s) != sessions.begin() + i)
      throw InvalidArgument(std::string(fn) + ": session " + std::to_string(i) + " appears twice");
    if (s->n_past_ >= s->n_ctx_)
      throw InvalidArgument(std::string(fn) + ": session " + std::to_string(i) + " is full (" +
                            std::to_string(s->n_ctx_) + " positions)");
    if (ids[i] < 0 || uint32_t(ids[i]) >= V)
      throw InvalidArgument("token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
  }
}

GpuBatchDecode::Encoded GpuBatchDecode::encode_step(std::span<GpuSession* const> sessions, Tail tail, uint32_t parity,
                                                    std::span<const uint32_t> id_rows) {
  const ModelConfig& c = model_.config;
  const uint32_t N = uint32_t(sessions.size()), V = c.n_vocab;
  for (GpuSession* s : sessions) s->state_.reserve(s->n_past_ + 1);  // KvPoolFull: before anything is encoded
  Buffers& bb = *buf_;
  SessionBuffers& b = bb.layer;
  StepRows rows;
  rows.rows = &bb.rows;
  rows.queries = &bb.queries;
  for (GpuSession* s : sessions) {
    rows.states.push_back(&s->state_);
    rows.positions.push_back(s->n_past_);
  }
  // One dispatch for every sequence's RoPE + append and attention when their caches are views of one-pool caches
  // (and the adapter runs the tiled decode kernel).
  int first_attn = -1;
  for (uint32_t l = 0; l < c.n_layer && first_attn < 0; ++l)
    if (c.is_attention(l)) first_attn = int(l);
  // (gemma4's layers that attend over an earlier layer's cache read that layer's pool, checked with it)
  bool shared = shared_kv_ && first_attn >= 0 && ctx_.features().subgroups;
  for (uint32_t l = 0; shared && l < c.n_layer; ++l) {
    if (!c.is_attention(l) || !c.owns_kv(l)) continue;
    const auto& owner = shared_kv_->layer(l);
    shared = owner && owner->n_pools() == 1 && c.head_dim_at(l) % 4 == 0;
    for (GpuSession* s : sessions) shared = shared && s->kv(l).same_pools(*owner);
  }
  uint32_t max_pos = 0;
  if (shared) {
    std::vector<uint32_t> table(size_t(N) * 4), queries(size_t(N) * 2);
    for (uint32_t i = 0; i < N; ++i) {
      const kernels::KvCache& view = sessions[i]->kv(uint32_t(first_attn));
      const uint32_t pos = sessions[i]->n_past_;
      const kernels::KvCache::Location at = view.locate(pos);  // the same in every layer's cache
      table[i * 4] = pos;
      table[i * 4 + 1] = uint32_t(at.k_elem);
      table[i * 4 + 2] = uint32_t(at.v_elem);
      queries[i * 2] = pos;
      queries[i * 2 + 1] = view.page_base();
      max_pos = std::max(max_pos, pos);
    }
    ctx_.write_buffer(bb.rows, 0, table.data(), table.size() * 4);
    ctx_.write_buffer(bb.queries, 0, queries.data(), queries.size() * 4);
    rows.shared = shared_kv_;
    rows.max_pos = max_pos;
  }
  // One dispatch a layer for every sequence's short convolution or DeltaNet step when their rings (and recurrent
  // states) are views of one SharedKv's pools, each sequence's at the same offsets in every layer
  // (SequenceState::pooled_rings).
  const SequenceState& s0 = sessions[0]->state_;
  bool pooled = s0.conv_rows > 0;
  for (GpuSession* s : sessions) pooled = pooled && s->state_.pooled_rings && s->state_.shared == s0.shared;
  if (pooled) {
    uint32_t f = 0;  // the first layer with a ring (a model has one kind: lfm2's conv, qwen35's DeltaNet)
    while (!c.is_conv(f) && !c.is_delta(f)) ++f;
    std::vector<uint32_t> table;
    for (GpuSession* s : sessions) {
      const SequenceState& st = s->state_;
      const uint32_t pos = s->n_past_;
      table.insert(table.end(), {pos, uint32_t(st.conv_at[f] / 4)});
      if (c.is_delta(f))
        table.insert(table.end(), {uint32_t(st.delta_at[f][pos % 2] / 4), uint32_t(st.delta_at[f][(pos + 1) % 2] / 4)});
    }
    const gpu::Buffer& seqs = c.is_delta(f) ? bb.delta_seqs : bb.conv_seqs;
    ctx_.write_buffer(seqs, 0, table.data(), table.size() * 4);
    (c.is_delta(f) ? rows.delta_seqs : rows.conv_seqs) = &seqs;
  }
  // The split-K scratch the longest attention of the step needs.
  // (a layer reading another's cache: that cache's)
  uint64_t scratch = 16;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (!c.is_attention(l)) continue;
    const uint32_t src = c.kv_source(l);
    if (shared) {
      const kernels::AttentionShape all{.n_heads = c.n_head,
                                        .n_kv_heads = c.n_head_kv_at(l),
                                        .head_dim = c.head_dim_at(l),
                                        .n_queries = N,
                                        .window = c.layer_window(l)};
      scratch = std::max(scratch, kernels::attention_decode_rows_scratch_bytes(all, sessions[0]->kv(src), max_pos));
      if (c.arch != Arch::Gemma4) continue;  // (gemma4's layers may still go sequence by sequence: their bound too)
    }
    for (GpuSession* s : sessions) {
      const kernels::AttentionShape shape{.n_heads = c.n_head,
                                          .n_kv_heads = c.n_head_kv_at(l),
                                          .head_dim = c.head_dim_at(l),
                                          .n_queries = 1,
                                          .start_pos = s->n_past_,
                                          .window = c.layer_window(l)};
      scratch = std::max(scratch, kernels::attention_decode_scratch_bound(shape, s->kv(src)));
    }
  }
  if (b.decode_scratch.size < scratch) b.decode_scratch = ctx_.create_buffer(scratch, kStorage, "batch decode scratch");

  auto owned = std::make_unique<gpu::ComputeBatch>(ctx_, "batch decode", bind_cache_.get());
  gpu::ComputeBatch& batch = *owned;
  if (!id_rows.empty()) {  // ids[i] = the ids before's row id_rows[i], a copy per run of consecutive rows
    batch.copy(b.ids, 0, bb.ids_before, 0, bb.ids_before.size);
    for (uint32_t i = 0, end = 0; i < N; i = end) {
      for (end = i + 1; end < N && id_rows[end] == id_rows[i] + (end - i);) ++end;
      batch.copy(bb.ids_before, uint64_t(id_rows[i]) * 4, b.ids, uint64_t(i) * 4, uint64_t(end - i) * 4);
    }
  }
  kernels::encode_embedding(batch, ctx_, model_.weights.token_embd, b.ids, b.x, N);
  if (c.embd_scale != 1.f) kernels::encode_scale(batch, ctx_, b.x, uint64_t(N) * c.n_embd, c.embd_scale);
  // Every product of the step goes through a kernel whose arithmetic for a token does not depend on the tokens
  // beside it, so a sequence's logits are the same bits whatever else runs in the step (the GPUs' tiled kernel,
  // taken from 5 tokens on elsewhere, sums in another order): the layers' blocks see `rows`.
  const LayerProgram& program = layer_program(c.arch);
  for (uint32_t l = 0; l < c.n_layer; ++l)
    program.encode(LayerStep{.batch = batch,
                             .ctx = ctx_,
                             .model = model_,
                             .L = model_.weights.layers[l],
                             .b = b,
                             .layer = l,
                             .n = N,
                             .rows = &rows});
  kernels::encode_matmul(
      batch, ctx_, model_.logits_weight(), b.x, bb.logits, N,
      {.norm = &model_.weights.output_norm, .eps = c.rms_eps, .impl = kernels::token_independent_impl(ctx_)});
  if (c.final_logit_softcap > 0)
    kernels::encode_scale(batch, ctx_, bb.logits, uint64_t(N) * V, 1.f, c.final_logit_softcap);
  if (tail == Tail::Argmax) encode_tail(batch, N, {}, false, parity);
  return {std::move(owned), shared};
}

void GpuBatchDecode::encode_tail(gpu::ComputeBatch& batch, uint32_t N, std::span<const kernels::SampleRow> sample,
                                 bool logits_too, uint32_t parity) {
  Buffers& bb = *buf_;
  SessionBuffers& b = bb.layer;
  const uint32_t V = model_.config.n_vocab;
  if (!sample.empty()) {
    // each row's id drawn here into the ids the next step reads; the ids come back (and the logits too, for the
    // caller's own sampling of other rows)
    const uint64_t recent = std::max<uint64_t>(
        4, 4 * std::accumulate(sample.begin(), sample.end(), uint64_t(0),
                               [](uint64_t a, const kernels::SampleRow& r) { return a + r.recent.size(); }));
    if (!bb.sample_params.size) {
      bb.sample_params = ctx_.create_buffer(kernels::sample_rows_params_bytes(max_), kStorage, "batch sample params");
      bb.sample_scratch =
          ctx_.create_buffer(kernels::sample_rows_scratch_bytes(max_, V), kStorage, "batch sample scratch");
    }
    if (bb.sample_recent.size < recent)
      bb.sample_recent = ctx_.create_buffer(std::max<uint64_t>(recent, 4096), kStorage, "batch sample recent ids");
    kernels::encode_sample_rows(batch, ctx_, sample, bb.logits, V, bb.sample_params, bb.sample_recent,
                                bb.sample_scratch, b.ids);
    batch.copy(b.ids, 0, bb.chosen_host[parity], 0, uint64_t(N) * 4);
    if (logits_too) batch.copy(bb.logits, 0, bb.logits_host, 0, uint64_t(N) * V * 4);
  } else if (!logits_too) {
    // each row's id chosen here (the lowest index of its largest logit) into the ids the next step reads; only the
    // ids come back
    kernels::encode_argmax(batch, ctx_, bb.logits, V, bb.argmax_scratch, b.ids, 0, N);
    batch.copy(b.ids, 0, bb.chosen_host[parity], 0, uint64_t(N) * 4);
  } else {
    batch.copy(bb.logits, 0, bb.logits_host, 0, uint64_t(N) * V * 4);
  }
}

}  // namespace wgllm

#include "model/transformer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/int_dot.h"
#include "kernels/matmul.h"
#include "kernels/scale.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

constexpr auto kStorage = WGPUBufferUsage_Storage;

// The index of the largest value as argmax.wgsl chooses it: the lowest among equals (the values are finite).
int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// Logits that are NaN or infinite mean the forward pass broke down (non-finite activations, or weights the load
// check did not see): sampling them would print plausible garbage, so generation stops with an error.
[[noreturn]] void non_finite_logits(uint32_t pos) {
  throw ModelError("the logits at position " + std::to_string(pos) +
                   " are not finite (NaN or infinity): the model's activations overflow or its weights are corrupt");
}

void check_finite(std::span<const float> logits, uint32_t pos) {
  for (float v : logits)
    if (!std::isfinite(v)) non_finite_logits(pos);
}
}  // namespace

bool int_dot_on(const gpu::Context& ctx, const ModelConfig& c) {
  return ctx.options().int_dot.value_or(!ctx.adapter().is_cpu() && c.n_embd >= kIntDotAutoWidth);
}

bool fuse_post_norms_on(const gpu::Context& ctx, const ModelConfig& c) {
  return ctx.options().fuse_post_norms.value_or(!ctx.adapter().is_cpu() && c.arch == Arch::Gemma3);
}

bool fuse_qk_norm_on(const gpu::Context& ctx, const ModelConfig& c) {
  return c.qk_norm && ctx.options().fuse_qk_norm.value_or(!ctx.adapter().is_cpu());
}

bool fuse_rows_rope_on(const gpu::Context& ctx) { return ctx.options().fuse_qk_norm.value_or(true); }

bool fuse_moe_route_on(const gpu::Context& ctx, const ModelConfig& c) {
  return c.is_moe() && ctx.options().fuse_moe_route.value_or(false);
}

bool fuse_router_on(const gpu::Context& ctx, const ModelConfig& c) {
  return c.is_moe() && ctx.options().fuse_router.value_or(false);
}

GpuSession::GpuSession(gpu::Context& ctx, const GpuModel& model, const GpuSessionOptions& options)
    : ctx_(ctx),
      model_(model),
      n_ctx_(options.n_ctx ? options.n_ctx : model.config.n_ctx_train),
      ubatch_(std::max<uint32_t>(1, std::min(options.ubatch, n_ctx_))),
      layers_per_submit_(options.layers_per_submit.value_or(ctx.adapter().is_cpu() ? 0 : 4)),
      argmax_on_gpu_(options.argmax_on_gpu.value_or(!ctx.adapter().is_cpu())),
      logit_block_rows_(options.logit_block_rows),
      program_(layer_program(model.config.arch)),
      buf_(std::make_unique<SessionBuffers>()),
      bind_cache_(std::make_unique<gpu::BindCache>(
          ctx, options.bind_groups_max ? options.bind_groups_max : gpu::BindCache::kMaxGroups)) {
  const ModelConfig& c = model.config;
  const uint64_t U = ubatch_, E = c.n_embd, Q = c.max_q_dim(), KV = c.max_kv_dim(), F = c.max_n_ff();
  auto make = [&](uint64_t floats, const char* label) { return ctx.create_buffer(floats * 4, kStorage, label); };
  SessionBuffers& b = *buf_;
  b.ids = make(U, "ids");
  b.x = make(U * E, "x");
  b.q = make(U * Q, "q");
  b.k = make(U * KV, "k");
  b.v = make(U * KV, "v");
  b.attn = make(U * Q, "attn");
  b.gate = make(U * gate_act_width(c), "gate");
  b.up = make(U * F, "up");
  b.act = make(U * gate_act_width(c), "act");
  b.proj = make(c.post_norms ? U * E : 1, "proj");
  b.x2 = make(c.post_norms && fuse_post_norms_on(ctx, c) ? U * E : 1, "x2");  // x's other buffer when it trades places
  const bool conv = !c.conv_layers.empty();
  b.bcx = make(conv ? U * 3 * E : 1, "bcx");
  b.conv_y = make(conv ? U * E : 1, "conv y");
  make_moe_buffers(ctx, c, b, U);
  make_delta_buffers(ctx, c, b, U);
  make_ple_buffers(ctx, c, b, U);
  if (int_dot_on(ctx, c) && E % 32 == 0) b.ffn_digits = kernels::make_x_digits(ctx, uint32_t(E), 1);
  b.last = make(E, "last row");
  b.logits = make(c.n_vocab, "logits");
  b.logits_host = ctx.create_buffer(uint64_t(c.n_vocab) * 4, WGPUBufferUsage_MapRead, "logits readback");
  b.argmax_scratch = ctx.create_buffer(kernels::argmax_scratch_bytes(c.n_vocab), kStorage, "argmax scratch");
  for (auto& slot : b.id_readback) slot = ctx.create_buffer(4, WGPUBufferUsage_MapRead, "id readback");

  state_ = SequenceState(ctx, c, n_ctx_, ubatch_, options.kv_type, options.shared_kv, options.kv_sequence);
  decode_qkv_.reserve(c.n_layer);
  for (const GpuLayer& L : model.weights.layers) decode_qkv_.push_back(decode_qkv_for(ctx, c, L));
  uint64_t scratch = 4;
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (state_.kv[l]) {  // either decode kernel may run; the layers' shapes may differ (gemma4)
      const kernels::AttentionShape longest{.n_heads = c.n_head,
                                            .n_kv_heads = c.n_head_kv_at(l),
                                            .head_dim = c.head_dim_at(l),
                                            .n_queries = 1,
                                            .start_pos = n_ctx_ - 1};
      scratch = std::max<uint64_t>(scratch, kernels::attention_decode_scratch_bound(longest, *state_.kv[l]));
    }
  b.decode_scratch = make(scratch / 4, "decode scratch");
  // Compile the kernels now, as part of loading rather than of the first prompt: encode (and drop) a step of each
  // token count the matvec is specialised for and one tiled prefill chunk. The pipelines stay in the context.
  for (uint32_t n = 1; n <= kernels::kMatvecMaxTokens + 1; ++n)
    if (n <= ubatch_ && n <= n_ctx_) encode_step(n, 0, Output::LastLogits, [](Piece) {});
  if (argmax_on_gpu_) encode_step(1, 0, Output::Argmax, [](Piece) {});
  ctx.check_errors();
}

GpuSession::~GpuSession() = default;

void GpuSession::sync_pages() {
  if (!state_.shared) return;
  const uint32_t kept = state_.shared->kept(state_.sequence);
  if (kept == SharedKv::kNone) return;
  state_.shared->clear_kept(state_.sequence);
  try {  // in place; also drops a step encoded ahead for a page now gone
    truncate(rewind_point(std::min(kept, n_past_)));
  } catch (const KvPoolFull&) {  // its partial page shared, and no page to copy it to: nothing kept
    truncate(0);
  }
}

bool GpuSession::try_reserve(uint32_t end) {
  try {
    state_.reserve(end);
    return true;
  } catch (const KvPoolFull&) {
    return false;
  }
}

void GpuSession::truncate(uint32_t n) {
  sync_pages();
  if (n > n_past_)
    throw InvalidArgument("cannot keep " + std::to_string(n) + " positions: " + std::to_string(n_past_) +
                          " are cached");
  state_.drop_checkpoints_after(n);
  // Beyond what the state keeps in place (the conv rings) it is rebuilt from the latest checkpoint or page boundary's
  // mark before n, or from nothing, by feeding the tokens after it again.
  const bool in_place = n == 0 || state_.rewinds_to(n, n_past_);
  const SequenceState::Checkpoint* c = in_place ? nullptr : state_.checkpoint_at_most(n);
  const uint32_t mark = in_place ? 0 : state_.mark_at_most(n);
  const uint32_t from = in_place ? n : std::max(c ? c->pos : 0, mark);
  state_.own_from(from);  // the pages written from here on its own first: KvPoolFull leaves the session as it was
  next_.reset();          // encoded for the old position
  ++changes_;
  if (in_place) {
    n_past_ = n;
    return;
  }
  if (from > 0) {
    gpu::ComputeBatch batch(ctx_, "restore state");
    if (mark == from)
      state_.take_marks(batch, state_, mark);
    else
      state_.restore(batch, *c);
    batch.submit();
  }
  const std::vector<int32_t> keep(tokens_.begin() + from, tokens_.begin() + n);
  n_past_ = from;
  for (size_t i = 0; i < keep.size(); i += ubatch_)
    run_chunk(std::span(keep).subspan(i, std::min<size_t>(ubatch_, keep.size() - i)), Output::None);
}

bool GpuSession::can_share_prefix(const GpuSession& from) const {
  return &from != this && state_.shared && state_.shared == from.state_.shared &&
         (!state_.rolls() || state_.takes_marks_of(from.state_)) && &model_ == &from.model_;
}

uint32_t GpuSession::shareable(const GpuSession& from, uint32_t n) const {
  if (!can_share_prefix(from)) return 0;
  n = std::min(n, from.n_past_);
  return state_.rolls() ? state_.mark_at_most(n) : n;
}

void GpuSession::share_prefix(const GpuSession& from, uint32_t n) {
  sync_pages();
  if (!can_share_prefix(from))
    throw InvalidArgument(
        "share_prefix: the sessions' KV caches are not views of one SharedKv, or the model keeps "
        "states beyond its KV cache and conv rings");
  if (n > from.n_past_)
    throw InvalidArgument("share_prefix: " + std::to_string(n) + " positions asked, the other session holds " +
                          std::to_string(from.n_past_));
  if (shareable(from, n) != n)
    throw InvalidArgument("share_prefix: " + std::to_string(n) + " positions asked, but a conv state is kept only at " +
                          "page boundaries (every " + std::to_string(state_.mark_every) + " positions)");
  next_.reset();
  ++changes_;
  state_.drop_checkpoints_after(0);
  n_past_ = 0;  // its own positions go whatever happens
  tokens_.clear();
  try {
    state_.shared->share(state_.sequence, from.state_.sequence, n);
  } catch (...) {  // KvPoolFull for the partial page: no page of its own left shared (on demand: none mapped)
    state_.own_from(0);
    throw;
  }
  if (state_.rolls() && n > 0) {
    gpu::ComputeBatch batch(ctx_, "take conv state");
    state_.take_marks(batch, from.state_, n);
    batch.submit();
  }
  tokens_.assign(from.tokens_.begin(), from.tokens_.begin() + n);
  n_past_ = n;
}

bool GpuSession::truncates_in_place(uint32_t n) const {
  if (n == 0) return true;
  if (n > n_past_) return false;
  const SequenceState::Checkpoint* c = state_.checkpoint_at_most(n);
  return state_.rewinds_to(n, n_past_) || (c && c->pos == n) || state_.mark_at_most(n) == n;
}

uint32_t GpuSession::rewind_point(uint32_t n) const {
  n = std::min(n, n_past_);
  if (truncates_in_place(n)) return n;
  const SequenceState::Checkpoint* c = state_.checkpoint_at_most(n);
  return std::max(c ? c->pos : 0, state_.mark_at_most(n));
}

void GpuSession::checkpoint() {
  sync_pages();
  if (!state_.rolls() || n_past_ == 0) return;
  if (!state_.checkpoints.empty() && state_.checkpoints.back().pos == n_past_) return;
  state_.drop_checkpoints_after(n_past_);
  gpu::ComputeBatch batch(ctx_, "checkpoint");
  state_.save(ctx_, batch, n_past_);
  batch.submit();
}

std::vector<uint32_t> GpuSession::checkpoints() const {
  std::vector<uint32_t> pos;
  for (const auto& c : state_.checkpoints) pos.push_back(c.pos);
  return pos;
}

void GpuSession::check_tokens(std::span<const int32_t> tokens) const {
  if (tokens.empty()) throw InvalidArgument("GpuSession::forward: no tokens");
  if (uint64_t(n_past_) + tokens.size() > n_ctx_)
    throw InvalidArgument(std::to_string(n_past_) + " cached + " + std::to_string(tokens.size()) +
                          " new tokens exceed the context of " + std::to_string(n_ctx_) + " (-c)");
  for (int32_t t : tokens)
    if (t < 0 || uint32_t(t) >= model_.config.n_vocab)
      throw InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            std::to_string(model_.config.n_vocab) + ")");
}

std::vector<float> GpuSession::forward(std::span<const int32_t> tokens) {
  sync_pages();
  check_tokens(tokens);
  state_.reserve(n_past_ + uint32_t(tokens.size()));  // every chunk's pages: KvPoolFull before any is fed
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); i += ubatch_) {
    const auto chunk = tokens.subspan(i, std::min<size_t>(ubatch_, tokens.size() - i));
    const bool last = i + chunk.size() == tokens.size();
    logits = run_chunk(chunk, last ? Output::LastLogits : Output::None);
  }
  return logits;
}

std::vector<std::vector<float>> GpuSession::forward_all(std::span<const int32_t> tokens) {
  sync_pages();
  check_tokens(tokens);
  state_.reserve(n_past_ + uint32_t(tokens.size()));  // every chunk's pages: KvPoolFull before any is fed
  const uint32_t V = model_.config.n_vocab;
  if (!buf_->logits_all.size) buf_->logits_all = ctx_.create_buffer(uint64_t(ubatch_) * V * 4, kStorage, "logits all");
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < tokens.size(); i += ubatch_) {
    const auto chunk = tokens.subspan(i, std::min<size_t>(ubatch_, tokens.size() - i));
    const std::vector<float> l = run_chunk(chunk, Output::AllLogits);
    for (size_t t = 0; t < chunk.size(); ++t) out.emplace_back(l.begin() + t * V, l.begin() + (t + 1) * V);
  }
  return out;
}

uint32_t GpuSession::logit_rows_per_block() const {
  const uint64_t row = uint64_t(model_.config.n_vocab) * 4;
  const uint64_t fit =
      logit_block_rows_ ? logit_block_rows_ : std::min<uint64_t>(kLogitBlockBytes, ctx_.max_binding_size()) / row;
  return uint32_t(std::clamp<uint64_t>(fit, 1, ubatch_));
}

// Each ubatch chunk runs its layers, then its rows from `first` on go through the logits product a block at a time:
// the block's residual rows copied out of x, their logits computed and read back, handed over. The blocks of one
// chunk queue behind its layers; the host reads each block before the next is encoded (one logits buffer).
void GpuSession::forward_rows(std::span<const int32_t> tokens, uint32_t first, const OnLogitRows& on_rows) {
  sync_pages();
  check_tokens(tokens);
  state_.reserve(n_past_ + uint32_t(tokens.size()));  // every chunk's pages: KvPoolFull before any is fed
  const ModelConfig& c = model_.config;
  const uint32_t V = c.n_vocab, block = logit_rows_per_block();
  SessionBuffers& b = *buf_;
  if (!b.block_x.size) {
    b.block_x = ctx_.create_buffer(uint64_t(block) * c.n_embd * 4, kStorage, "logit block rows");
    b.block_logits = ctx_.create_buffer(uint64_t(block) * V * 4, kStorage, "logit block");
  }
  for (size_t i = 0; i < tokens.size(); i += ubatch_) {
    const auto chunk = tokens.subspan(i, std::min<size_t>(ubatch_, tokens.size() - i));
    const uint32_t n = uint32_t(chunk.size()), pos0 = n_past_;
    run_chunk(chunk, Output::None);  // x: the chunk's final residual rows
    for (uint32_t r = uint32_t(std::clamp<size_t>(first, i, i + n) - i); r < n; r += block) {
      const uint32_t m = std::min(block, n - r);
      gpu::ComputeBatch batch(ctx_, "logit rows");
      batch.copy(b.x, uint64_t(r) * c.n_embd * 4, b.block_x, 0, uint64_t(m) * c.n_embd * 4);
      encode_logit_rows(batch, b.block_x, b.block_logits, m);
      batch.submit();
      const std::vector<float> logits = ctx_.read<float>(b.block_logits, 0, uint64_t(m) * V);
      for (uint32_t t = 0; t < m; ++t) check_finite(std::span(logits).subspan(size_t(t) * V, V), pos0 + r + t);
      on_rows(uint32_t(i + r), logits);
    }
  }
}

std::vector<float> GpuSession::run_chunk(std::span<const int32_t> tokens, Output output) {
  const uint32_t n = uint32_t(tokens.size());
  SessionBuffers& b = *buf_;
  state_.reserve(n_past_ + n);  // before anything changes: KvPoolFull leaves the session as it was
  ++changes_;
  ctx_.write_buffer(b.ids, 0, tokens.data(), tokens.size_bytes());
  tokens_.resize(n_past_);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  // A step encoded ahead is used for the decode call it was made for and dropped otherwise (before anything
  // else is encoded).
  std::unique_ptr<PreparedStep> prepared = std::move(next_);
  const bool decode = n == 1 && output == Output::LastLogits;
  if (decode && prepared && prepared->pos == n_past_ && prepared->profiler == ctx_.profiler()) {
    for (Piece& piece : prepared->pieces) piece->submit();
  } else {
    prepared.reset();
    encode_step(n, n_past_, output, [](Piece piece) { piece->submit(); });
  }
  n_past_ += n;
  const uint32_t V = model_.config.n_vocab;
  if (output == Output::None) return {};
  if (output == Output::AllLogits) {
    ctx_.wait_idle();
    std::vector<float> all = ctx_.read<float>(b.logits_all, 0, uint64_t(n) * V);
    for (uint32_t t = 0; t < n; ++t) check_finite(std::span(all).subspan(size_t(t) * V, V), n_past_ - n + t);
    return all;
  }
  // While the GPU works, encode the next decode step (the likely next call).
  if (n_past_ < n_ctx_ && try_reserve(n_past_ + 1)) {
    auto next = std::make_unique<PreparedStep>();
    next->pos = n_past_;
    next->profiler = ctx_.profiler();
    encode_step(1, n_past_, Output::LastLogits, [&](Piece piece) { next->pieces.push_back(std::move(piece)); });
    next_ = std::move(next);
  }
  std::vector<float> logits(V);
  ctx_.read_mapped(b.logits_host, 0, logits.data(), uint64_t(V) * 4);
  check_finite(logits, n_past_ - 1);
  return logits;
}

uint32_t GpuSession::decode_greedy(int32_t token, uint32_t max_new, const std::function<bool(int32_t)>& on_id) {
  sync_pages();
  check_tokens(std::span(&token, 1));
  next_.reset();  // a step encoded ahead for forward ends in logits, not in an argmax
  if (max_new == 0) return 0;
  if (!argmax_on_gpu_) {  // each step's logits to the host, the argmax there (same choice: see argmax.wgsl)
    uint32_t chosen = 0;
    for (int32_t id = token; chosen < max_new && n_past_ < n_ctx_;) {
      const std::vector<float> logits = run_chunk(std::span(&id, 1), Output::LastLogits);
      id = argmax(logits);
      ++chosen;
      if (on_id && !on_id(id)) break;
    }
    return chosen;
  }
  return decode_on_gpu(token, max_new, Output::Argmax, nullptr, on_id);
}

uint32_t GpuSession::decode_sampled(int32_t token, uint32_t max_new, const DecodeSampling& sampling,
                                    const std::function<bool(int32_t)>& on_id) {
  sync_pages();
  check_tokens(std::span(&token, 1));
  next_.reset();
  if (max_new == 0) return 0;
  if (!sampling.next_uniform) throw InvalidArgument("decode_sampled: next_uniform is not set");
  SessionBuffers& b = *buf_;
  const uint32_t V = model_.config.n_vocab;
  // Made once (a bind group is cached by its buffers): the ring holds every id a session can have, n_ctx + 1.
  if (!b.sample_scratch.size) {
    b.sample_scratch = ctx_.create_buffer(kernels::sample_scratch_bytes(V), kStorage, "sample scratch");
    b.recent_ids = ctx_.create_buffer((uint64_t(n_ctx_) + 1) * 4, kStorage, "recent ids");
  }
  const uint64_t r = sampling.recent.size(), w = std::min<uint64_t>(sampling.window, n_ctx_ + 1ull);
  if (r > w)
    throw InvalidArgument("decode_sampled: " + std::to_string(r) + " recent ids do not fit the window of " +
                          std::to_string(w));
  if (r) ctx_.write_buffer(b.recent_ids, 0, sampling.recent.data(), r * 4);
  // Step k sees the r given ids and the k drawn before it (the last `window` of them) and writes its own over the
  // oldest: slot (r + k) % window.
  auto step = [&](uint32_t k) {
    const kernels::SampleRecent recent{.ids = &b.recent_ids,
                                       .cap = uint32_t(w),
                                       .n_recent = uint32_t(std::min(r + k, w)),
                                       .write_slot = w ? uint32_t((r + k) % w) : 0};
    return StepSample{&sampling.settings, sampling.next_uniform(), recent};
  };
  return decode_on_gpu(token, max_new, Output::Sample, step, on_id);
}

uint32_t GpuSession::decode_on_gpu(int32_t token, uint32_t max_new, Output output,
                                   const std::function<StepSample(uint32_t k)>& step_sample,
                                   const std::function<bool(int32_t id)>& on_id) {
  SessionBuffers& b = *buf_;
  ++changes_;
  ctx_.write_buffer(b.ids, 0, &token, 4);
  const uint32_t pos0 = n_past_;
  const uint32_t steps = std::min(max_new, n_ctx_ - pos0);
  // Step k runs at pos0 + k, reads ids[0] (the token, then step k-1's argmax) and leaves its argmax in ids[0] and
  // in id_readback[k % 2]. Step k+1 is queued before step k's id is read: the GPU goes from one to the next while
  // the host reads, and the host encodes step k+2 while the GPU runs k+1. Only step 0 starts on an idle GPU, so
  // only it is submitted in pieces; the later ones are one command buffer each (H200, Llama-3.2-1B shape: 870
  // tok/s against 800 in pieces of 4 layers; PERF.md).
  std::array<gpu::SubmissionIndex, 2> done_at{};
  auto submit = [&](uint32_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::optional<StepSample> sample = step_sample ? std::optional(step_sample(k)) : std::nullopt;
    state_.reserve(pos0 + k + 1);
    encode_step(
        1, pos0 + k, output, [&](Piece piece) { done_at[k % 2] = piece->submit(); }, k % 2, k > 0,
        sample ? &*sample : nullptr);
    ++host_time_.steps;
    host_time_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  submit(0);
  uint32_t chosen = 0;
  int32_t last = token;
  for (uint32_t k = 0; k < steps; ++k) {
    if (k + 1 < steps) submit(k + 1);
    int32_t id = 0;
    ctx_.read_mapped(b.id_readback[k % 2], 0, &id, 4, done_at[k % 2]);
    tokens_.resize(pos0 + k);
    tokens_.push_back(k == 0 ? token : last);  // step k's input
    last = id;
    n_past_ = pos0 + k + 1;
    static_assert(kernels::kArgmaxNonFinite == kernels::kSampleNonFinite);
    if (uint32_t(id) == kernels::kArgmaxNonFinite) non_finite_logits(pos0 + k);
    ++chosen;
    if (on_id && !on_id(id)) break;
  }
  return chosen;
}

// A decode step (n = 1) runs these dispatches:
//   embedding                   x = token_embd[id]  (gemma: + scale, x *= sqrt(n_embd))
//   per layer                   the architecture's layer program (encode_layer): llama / qwen2's 5 dispatches
//                               (model/arch/llama.cpp), qwen3's 6; gemma3.cpp and lfm2.cpp list theirs
//   matmul                      logits = norm(x) Wout  (gemma: + scale, the final softcap)
//   copy, argmax (2) or sample (3)  the logits to the mappable buffer, or the chosen id to the next step's input
// A prefill chunk runs the same steps over n tokens with the tiled matmul (and the layers' prefill kernels).
void GpuSession::encode_step(uint32_t n, uint32_t pos, Output output, const std::function<void(Piece)>& ready,
                             uint32_t slot, bool one_piece, const StepSample* sample) {
  SessionBuffers& b = *buf_;
  const char* label = n == 1 ? "decode" : "prefill";
  auto batch = std::make_unique<gpu::ComputeBatch>(ctx_, label, bind_cache_.get());
  // token ids -> embedding rows (dequantised) into the residual stream
  kernels::encode_embedding(*batch, ctx_, model_.weights.token_embd, b.ids, b.x, n);
  // gemma: x *= sqrt(n_embd)
  if (model_.config.embd_scale != 1.f)
    kernels::encode_scale(*batch, ctx_, b.x, uint64_t(n) * model_.config.n_embd, model_.config.embd_scale);
  const uint32_t n_layer = model_.config.n_layer;
  for (uint32_t l = 0; l < n_layer; ++l) {
    encode_layer(*batch, l, n, pos);
    // The GPU starts on the first layer while the CPU encodes the next ones: a piece ends after layer 0 and then
    // every layers_per_submit_ layers (queue order keeps the pieces in sequence).
    if (!one_piece && layers_per_submit_ && l + 1 < n_layer && (l == 0 || (l + 1) % layers_per_submit_ == 0)) {
      ready(std::move(batch));
      batch = std::make_unique<gpu::ComputeBatch>(ctx_, label, bind_cache_.get());
    }
  }
  if (output == Output::None || output == Output::AllLogits) flush_pending_norm(*batch, ctx_, model_.config, b);
  if (output != Output::None) encode_logits(*batch, n, output, slot, sample);
  ready(std::move(batch));
}

void GpuSession::encode_layer(gpu::ComputeBatch& batch, uint32_t layer, uint32_t n, uint32_t pos) {
  program_.encode(LayerStep{.batch = batch,
                            .ctx = ctx_,
                            .model = model_,
                            .L = model_.weights.layers[layer],
                            .b = *buf_,
                            .state = &state_,
                            .layer = layer,
                            .n = n,
                            .pos = pos,
                            .decode_qkv = decode_qkv_[layer]});
}

void GpuSession::encode_logits(gpu::ComputeBatch& batch, uint32_t n, Output output, uint32_t slot,
                               const StepSample* sample) {
  const ModelConfig& c = model_.config;
  SessionBuffers& b = *buf_;
  const kernels::MatmulOptions normed{.norm = &model_.weights.output_norm, .eps = c.rms_eps};
  const float cap = c.final_logit_softcap;  // > 0: logits = cap * tanh(logits / cap)
  if (output == Output::AllLogits) {        // logits of every token
    encode_logit_rows(batch, b.x, b.logits_all, n);
    return;
  }
  // the last token's row alone (row 0 when decoding, which takes a pending post-norm: encode_x_product)
  if (n > 1) {
    flush_pending_norm(batch, ctx_, c, b);
    batch.copy(b.x, uint64_t(n - 1) * c.n_embd * 4, b.last, 0, uint64_t(c.n_embd) * 4);
    kernels::encode_matmul(batch, ctx_, model_.logits_weight(), b.last, b.logits, 1, normed);
  } else {
    // With int_dot on, a Q4_K or Q6_K head reads the normed x's digits (the FFN's digit buffer: the same width)
    const kernels::GpuWeight& head = model_.logits_weight();
    kernels::MatmulOptions o = normed;
    if (b.ffn_digits && kernels::matvec_takes_digits(head.type)) {
      flush_pending_norm(batch, ctx_, c, b);
      kernels::encode_x_digits(batch, ctx_, b.x, *b.ffn_digits, &model_.weights.output_norm);
      o.digits = &*b.ffn_digits;
    }
    encode_x_product(batch, ctx_, c, b, head, b.logits, 1, o);
  }
  if (cap > 0) kernels::encode_scale(batch, ctx_, b.logits, c.n_vocab, 1.f, cap);
  if (output == Output::LastLogits) {
    // onto a mappable buffer in the same command buffer: one wait per token
    batch.copy(b.logits, 0, b.logits_host, 0, uint64_t(c.n_vocab) * 4);
  } else {
    // the chosen id (greedy: the argmax; else drawn) becomes the next step's input, and a copy comes back to the host
    if (output == Output::Argmax)
      kernels::encode_argmax(batch, ctx_, b.logits, c.n_vocab, b.argmax_scratch, b.ids);
    else
      kernels::encode_sample(batch, ctx_, *sample->settings, sample->u, b.logits, c.n_vocab, sample->recent,
                             b.sample_scratch, b.ids);
    batch.copy(b.ids, 0, b.id_readback[slot], 0, 4);
  }
}

void GpuSession::encode_logit_rows(gpu::ComputeBatch& batch, const gpu::Buffer& x, const gpu::Buffer& y, uint32_t n) {
  const ModelConfig& c = model_.config;
  const kernels::MatmulOptions normed{.norm = &model_.weights.output_norm, .eps = c.rms_eps};
  kernels::encode_matmul(batch, ctx_, model_.logits_weight(), x, y, n, normed);
  if (c.final_logit_softcap > 0)
    kernels::encode_scale(batch, ctx_, y, uint64_t(n) * c.n_vocab, 1.f, c.final_logit_softcap);
}

}  // namespace wgllm

#include "model/state.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "kernels/delta_net.h"
#include "kernels/shortconv.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

// Another handle on a pool's buffer (a sequence's view of it; the buffer lives while any handle does).
gpu::Buffer view(const gpu::Buffer& pool) {
  wgpuBufferAddRef(pool.get());
  return gpu::Buffer{gpu::BufferHandle(pool.get()), pool.size};
}

}  // namespace

SequenceState::SequenceState(gpu::Context& ctx, const ModelConfig& c, uint32_t n_ctx, uint32_t ubatch,
                             kernels::KvType kv_type, SharedKv* shared_kv, uint32_t sequence)
    : shared(shared_kv), sequence(sequence) {
  const uint64_t E = c.n_embd, KV = c.max_kv_dim();
  // One page when the whole cache fits a binding, else pages of 256 positions across pools.
  const uint64_t one_page = 2ull * n_ctx * KV * kernels::kv_type_bytes(kv_type);
  const uint32_t page = one_page <= ctx.max_binding_size() ? 0 : 256;
  kv.resize(c.n_layer);
  conv.resize(c.n_layer);
  conv_at.assign(c.n_layer, 0);
  conv_bytes.assign(c.n_layer, 0);
  delta.resize(c.n_layer);
  delta_at.assign(c.n_layer, {0, 0});
  recurrent = !c.delta_layers.empty();
  pooled_rings = shared_kv && sequence < shared_kv->sequences();  // until a ring or state gets a buffer of its own
  conv_taps = recurrent ? c.ssm_conv : c.l_cache;
  conv_rows = recurrent               ? kernels::delta_ring_rows(conv_taps)
              : c.conv_layers.empty() ? 0
                                      : kernels::conv_ring_rows(ubatch, conv_taps);
  if (shared_kv && !recurrent && conv_rows && conv_taps > 1) {
    mark_every = shared_kv->page_size();
    marks.resize(c.n_layer);
  }
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (c.is_conv(l)) {
      conv_bytes[l] = uint64_t(conv_rows) * E * 4;
      const gpu::Buffer* pool =
          shared_kv && sequence < shared_kv->sequences() ? shared_kv->conv_rings(l, conv_bytes[l]) : nullptr;
      if (pool) {  // a view of the pool
        conv[l] = view(*pool);
        conv_at[l] = uint64_t(sequence) * conv_bytes[l];
      } else {
        conv[l] =
            ctx.create_buffer(conv_bytes[l], WGPUBufferUsage_Storage, ("conv state " + std::to_string(l)).c_str());
        pooled_rings = false;
      }
      if (mark_every)
        marks[l] = ctx.create_buffer(uint64_t(n_ctx / mark_every) * (conv_taps - 1) * E * 4, WGPUBufferUsage_Storage,
                                     ("conv marks " + std::to_string(l)).c_str());
      continue;
    }
    if (c.is_delta(l)) {
      conv_bytes[l] = uint64_t(conv_rows) * c.delta_conv_dim() * 4;
      delta_bytes = delta_state_bytes(c);
      // views of the pools where both fit a binding, else buffers of its own
      const bool in_pool = shared_kv && sequence < shared_kv->sequences();
      const gpu::Buffer* rings = in_pool ? shared_kv->conv_rings(l, conv_bytes[l]) : nullptr;
      const gpu::Buffer* states = rings ? shared_kv->delta_states(l, delta_bytes) : nullptr;
      if (states) {
        conv[l] = view(*rings);
        conv_at[l] = uint64_t(sequence) * conv_bytes[l];
        for (uint32_t i = 0; i < 2; ++i) {
          delta[l][i] = view(*states);
          delta_at[l][i] = (uint64_t(sequence) * 2 + i) * delta_bytes;
        }
        continue;
      }
      pooled_rings = false;
      conv[l] = ctx.create_buffer(conv_bytes[l], WGPUBufferUsage_Storage, ("conv state " + std::to_string(l)).c_str());
      for (uint32_t i = 0; i < 2; ++i)
        delta[l][i] = ctx.create_buffer(delta_bytes, WGPUBufferUsage_Storage,
                                        ("recurrent state " + std::to_string(l) + "." + std::to_string(i)).c_str());
      continue;
    }
    if (!c.owns_kv(l)) continue;  // gemma4: attends over an earlier layer's cache
    if (shared_kv) {  // a view of the shared pool
      const auto& owner = shared_kv->layer(l);
      if (!owner || n_ctx != shared_kv->n_ctx() || sequence >= shared_kv->sequences())
        throw InvalidArgument("GpuSession: the shared KV caches do not fit the model, n_ctx " + std::to_string(n_ctx) +
                              " or sequence " + std::to_string(sequence));
      kv[l].emplace(*owner, shared_kv->first_page(sequence), n_ctx / owner->page_size(),
                    "kv cache view " + std::to_string(l));
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

std::vector<SequenceState::Range> SequenceState::rolling(uint32_t pos) const {
  std::vector<Range> ranges;
  for (size_t l = 0; l < conv.size(); ++l) {
    if (!conv_bytes[l]) continue;
    ranges.push_back({&conv[l], conv_at[l], conv_bytes[l]});
    if (delta[l][0].size) ranges.push_back({&delta[l][pos % 2], delta_at[l][pos % 2], delta_bytes});
  }
  return ranges;
}

void SequenceState::save(gpu::Context& ctx, gpu::ComputeBatch& batch, uint32_t pos) {
  Checkpoint c;
  if (checkpoints.size() == kMaxCheckpoints) {
    c = std::move(checkpoints.front());
    checkpoints.erase(checkpoints.begin());
  }
  c.pos = pos;
  const std::vector<Range> from = rolling(pos);
  for (size_t i = 0; i < from.size(); ++i) {
    if (i == c.copies.size())
      c.copies.push_back(ctx.create_buffer(from[i].size, WGPUBufferUsage_Storage, "state checkpoint"));
    batch.copy(*from[i].buffer, from[i].offset, c.copies[i], 0, from[i].size);
  }
  checkpoints.push_back(std::move(c));
}

void SequenceState::restore(gpu::ComputeBatch& batch, const Checkpoint& c) const {
  const std::vector<Range> to = rolling(c.pos);
  for (size_t i = 0; i < to.size(); ++i) batch.copy(c.copies[i], 0, *to[i].buffer, to[i].offset, to[i].size);
}

// Byte offsets in layer l's buffers: the ring row of position q, and the mark of page boundary p (its conv_taps - 1
// rows, positions p - conv_taps + 1 .. p - 1 in order).
uint64_t SequenceState::ring_offset(uint32_t l, uint32_t q) const {
  return conv_at[l] + q % conv_rows * (conv_bytes[l] / conv_rows);
}
uint64_t SequenceState::mark_offset(uint32_t l, uint32_t p) const {
  return uint64_t(p / mark_every - 1) * (conv_taps - 1) * (conv_bytes[l] / conv_rows);
}

void SequenceState::save_marks(gpu::ComputeBatch& batch, uint32_t layer, uint32_t pos, uint32_t n) const {
  if (!mark_every || !marks[layer].size) return;
  const uint64_t row = conv_bytes[layer] / conv_rows;
  for (uint32_t p = pos + mark_every - pos % mark_every; p <= pos + n; p += mark_every) {
    if (mark_offset(layer, p + mark_every) > marks[layer].size) break;  // (none past n_ctx)
    for (uint32_t i = 0; i + 1 < conv_taps; ++i)
      batch.copy(conv[layer], ring_offset(layer, p - (conv_taps - 1) + i), marks[layer],
                 mark_offset(layer, p) + i * row, row);
  }
}

bool SequenceState::takes_marks_of(const SequenceState& from) const {
  return mark_every && from.mark_every == mark_every && from.conv_rows == conv_rows && from.conv_taps == conv_taps &&
         from.marks.size() == marks.size();
}

void SequenceState::take_marks(gpu::ComputeBatch& batch, const SequenceState& from, uint32_t p) const {
  if (p == 0) return;
  if (!takes_marks_of(from) || p % mark_every)
    throw InvalidArgument("take_marks: no conv state kept at position " + std::to_string(p));
  for (size_t l = 0; l < marks.size(); ++l) {
    if (!marks[l].size) continue;
    const uint64_t row = conv_bytes[l] / conv_rows;
    const uint32_t layer = uint32_t(l);
    if (&from != this)  // the marks up to p
      batch.copy(from.marks[l], 0, marks[l], 0, mark_offset(layer, p + mark_every));
    for (uint32_t i = 0; i + 1 < conv_taps; ++i)
      batch.copy(marks[l], mark_offset(layer, p) + i * row, conv[l], ring_offset(layer, p - (conv_taps - 1) + i), row);
  }
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

void SequenceState::own_from(uint32_t n) {
  if (shared) shared->own_from(sequence, n);
}

void SequenceState::reserve(uint32_t end) {
  if (shared) shared->reserve(sequence, end);
}

SharedKv::SharedKv(gpu::Context& ctx, const ModelConfig& c, uint32_t sequences, uint32_t n_ctx, uint32_t page_size,
                   kernels::KvType type, uint32_t pages)
    : ctx_(ctx), layers_(c.n_layer), sequences_(sequences), page_size_(page_size) {
  if (page_size == 0 || page_size % kernels::KvCache::kPageMultiple != 0 || n_ctx % page_size != 0)
    throw InvalidArgument("SharedKv: n_ctx " + std::to_string(n_ctx) + " must be a multiple of page_size " +
                          std::to_string(page_size) + ", itself a multiple of " +
                          std::to_string(kernels::KvCache::kPageMultiple));
  if (sequences == 0 || uint64_t(sequences) * n_ctx > UINT32_MAX)
    throw InvalidArgument("SharedKv: " + std::to_string(sequences) + " sequences x n_ctx " + std::to_string(n_ctx) +
                          " must be within [1, 2^32)");
  pages_per_sequence_ = n_ctx / page_size;
  const uint32_t logical = sequences * pages_per_sequence_;
  const uint32_t physical = pages == 0 ? logical : std::min(pages, logical);
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (c.is_attention(l) && c.owns_kv(l))
      layers_[l].emplace(ctx,
                         kernels::KvCacheConfig{.kv_dim = c.kv_dim_at(l),
                                                .max_seq = sequences * n_ctx,
                                                .page_size = page_size,
                                                .type = type,
                                                .physical_pages = physical},
                         "shared kv cache " + std::to_string(l));
  map_.resize(logical);
  refs_.assign(physical, 0);
  if (physical == logical) {  // every sequence's pages at hand, in order
    std::iota(map_.begin(), map_.end(), 0u);
    refs_.assign(physical, 1);
  } else {
    std::fill(map_.begin(), map_.end(), kNone);
  }
  kept_.assign(sequences, kNone);
  idle_.assign(sequences, 0);
  conv_rings_.resize(c.n_layer);
  delta_states_.resize(c.n_layer);
  used_.assign(sequences, 0);
}

uint32_t SharedKv::physical_page(uint32_t s, uint32_t pos) const {
  if (s >= sequences_ || pos >= n_ctx())
    throw InvalidArgument("SharedKv: position " + std::to_string(pos) + " of sequence " + std::to_string(s) +
                          " is outside " + std::to_string(sequences_) + " x " + std::to_string(n_ctx()));
  return map_[first_page(s) + pos / page_size_];
}

const gpu::Buffer* SharedKv::conv_rings(uint32_t layer, uint64_t ring_bytes) {
  if (layer >= conv_rings_.size() || ring_bytes == 0 || (conv_ring_bytes_ && ring_bytes != conv_ring_bytes_) ||
      ring_bytes * sequences_ > ctx_.max_binding_size())
    return nullptr;
  conv_ring_bytes_ = ring_bytes;
  if (!conv_rings_[layer])
    conv_rings_[layer] = ctx_.create_buffer(ring_bytes * sequences_, WGPUBufferUsage_Storage,
                                            ("conv rings " + std::to_string(layer)).c_str());
  return &*conv_rings_[layer];
}

const gpu::Buffer* SharedKv::delta_states(uint32_t layer, uint64_t state_bytes) {
  if (layer >= delta_states_.size() || state_bytes == 0 || state_bytes * 2 * sequences_ > ctx_.max_binding_size())
    return nullptr;
  if (!delta_states_[layer])
    delta_states_[layer] = ctx_.create_buffer(state_bytes * 2 * sequences_, WGPUBufferUsage_Storage,
                                              ("recurrent states " + std::to_string(layer)).c_str());
  return delta_states_[layer]->size == state_bytes * 2 * sequences_ ? &*delta_states_[layer] : nullptr;
}

uint32_t SharedKv::pages_shared() const {
  return uint32_t(std::count_if(refs_.begin(), refs_.end(), [](uint32_t r) { return r > 1; }));
}

uint32_t SharedKv::pages_free() const { return uint32_t(std::count(refs_.begin(), refs_.end(), 0u)); }

void SharedKv::set_idle(uint32_t s, bool idle) { idle_.at(s) = idle; }

uint32_t SharedKv::free_page() {
  for (;;) {
    const auto it = std::find(refs_.begin(), refs_.end(), 0u);
    if (it != refs_.end()) return uint32_t(it - refs_.begin());
    // With a page for every logical page a shared one means a free one: only a pool of fewer pages gets here.
    // The least recently used idle sequence that holds a page gives up its last one.
    uint32_t victim = kNone;
    for (uint32_t v = 0; v < sequences_; ++v)
      if (idle_[v] && map_[first_page(v)] != kNone && (victim == kNone || used_[v] < used_[victim])) victim = v;
    if (victim == kNone || !on_demand())
      throw KvPoolFull("the KV cache pool is full: its " + std::to_string(pages()) + " pages of " +
                       std::to_string(page_size_) + " positions are all held by running sequences");
    uint32_t p = pages_per_sequence_;
    while (map_[first_page(victim) + p - 1] == kNone) --p;
    point(victim, p - 1, kNone);
    kept_[victim] = std::min(kept_[victim], (p - 1) * page_size_);
  }
}

const gpu::Buffer& SharedKv::staging() {
  if (!staging_) {
    uint64_t bytes = 4;
    for (const auto& cache : layers_)
      if (cache) bytes = std::max(bytes, cache->page_bytes());
    staging_ = ctx_.create_buffer(bytes, WGPUBufferUsage_Storage, "kv page staging");
  }
  return *staging_;
}

void SharedKv::point(uint32_t s, uint32_t p, uint32_t physical) {
  uint32_t& at = map_[first_page(s) + p];
  if (at == physical) return;
  if (at != kNone) --refs_[at];
  at = physical;
  if (physical == kNone) return;  // the page tables keep the old entry: nothing reads or writes an unmapped page
  ++refs_[physical];
  for (auto& cache : layers_)
    if (cache) cache->remap(first_page(s) + p, physical);
}

// Keeps sequence s's pages from being taken while it lasts (s's own reserve, or s lending its pages to another).
struct SharedKv::Busy {
  SharedKv& kv;
  uint32_t s;
  uint8_t was;
  Busy(SharedKv& k, uint32_t seq) : kv(k), s(seq), was(k.idle_[seq]) { kv.idle_[s] = 0; }
  ~Busy() { kv.idle_[s] = was; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;
};

void SharedKv::reserve(uint32_t s, uint32_t end) {
  if (s >= sequences_)
    throw InvalidArgument("SharedKv::reserve: sequence " + std::to_string(s) + " of " + std::to_string(sequences_));
  if (!on_demand()) return;  // every page mapped from the start
  const Busy busy(*this, s);
  used_[s] = ++clock_;
  const uint32_t last = (std::min(end, n_ctx()) + page_size_ - 1) / page_size_;
  for (uint32_t p = 0; p < last; ++p)
    if (map_[first_page(s) + p] == kNone) point(s, p, free_page());
}

void SharedKv::own_from(uint32_t s, uint32_t n) {
  if (s >= sequences_ || n > n_ctx())
    throw InvalidArgument("SharedKv::own_from: position " + std::to_string(n) + " of sequence " + std::to_string(s) +
                          " is outside " + std::to_string(sequences_) + " x " + std::to_string(n_ctx()));
  const Busy busy(*this, s);
  std::optional<gpu::ComputeBatch> copies;
  for (uint32_t p = n / page_size_; p < pages_per_sequence_; ++p) {
    const uint32_t old = map_[first_page(s) + p];
    const uint32_t keep = p == n / page_size_ ? n % page_size_ : 0;  // rows before n in its page
    if (old == kNone || (refs_[old] == 1 && (keep > 0 || !on_demand()))) continue;
    if (keep == 0 && on_demand()) {  // nothing of it kept: unmapped until reserved again
      point(s, p, kNone);
      continue;
    }
    const uint32_t fresh = free_page();
    if (keep > 0) {
      if (!copies) copies.emplace(ctx_, "kv page copies");
      for (const auto& cache : layers_)
        if (cache) cache->copy_rows(*copies, old, fresh, keep, staging());
    }
    point(s, p, fresh);
  }
  if (copies) copies->submit();  // after the page-table writes in the queue, before any work that reads them
}

void SharedKv::share(uint32_t to, uint32_t from, uint32_t n) {
  if (to >= sequences_ || from >= sequences_ || n > n_ctx())
    throw InvalidArgument("SharedKv::share: " + std::to_string(n) + " positions of sequence " + std::to_string(from) +
                          " into " + std::to_string(to) + " are outside " + std::to_string(sequences_) + " x " +
                          std::to_string(n_ctx()));
  if (to == from) return own_from(to, n);
  const uint32_t whole = n / page_size_, keep = n % page_size_;
  for (uint32_t p = 0; p < whole + (keep > 0); ++p)
    if (map_[first_page(from) + p] == kNone)
      throw InvalidArgument("SharedKv::share: sequence " + std::to_string(from) + " holds no page at position " +
                            std::to_string(p * page_size_));
  // `from` keeps its pages while `to` takes them: a page for `to` may have to come from an idle sequence.
  const Busy lending(*this, from), taking(*this, to);
  used_[to] = used_[from] = ++clock_;
  for (uint32_t p = 0; p < whole; ++p) point(to, p, map_[first_page(from) + p]);
  own_from(to, whole * page_size_);  // the rest of `to` its own (on demand: unmapped), the partial page included
  if (keep > 0) {
    reserve(to, n);
    gpu::ComputeBatch copies(ctx_, "kv page copies");
    for (const auto& cache : layers_)
      if (cache)
        cache->copy_rows(copies, map_[first_page(from) + whole], map_[first_page(to) + whole], keep, staging());
    copies.submit();
  }
}

}  // namespace wgllm

#include "kernels/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "gguf/half.h"
#include "wgllm/error.h"

namespace wgllm::kernels {

KvCache::KvCache(gpu::Context& ctx, const KvCacheConfig& config, std::string_view label) : ctx_(ctx), config_(config) {
  const std::string name(label);
  if (config_.kv_dim == 0 || config_.max_seq == 0) throw InvalidArgument(name + ": kv_dim and max_seq must be > 0");
  if (config_.page_size == 0) config_.page_size = config_.max_seq;
  const uint64_t esize = kv_type_bytes(config_.type);
  const uint64_t page_bytes = 2ull * config_.page_size * config_.kv_dim * esize;  // K then V
  const uint64_t limit = ctx.max_binding_size();
  if (page_bytes > limit)
    throw InvalidArgument(name + ": one page (" + std::to_string(config_.page_size) + " positions x kv_dim " +
                          std::to_string(config_.kv_dim) + " x K+V = " + std::to_string(page_bytes) +
                          " bytes) exceeds the adapter's storage-binding limit of " + std::to_string(limit) +
                          " bytes; use a smaller page size");
  n_pages_ = (config_.max_seq + config_.page_size - 1) / config_.page_size;
  physical_ = config_.physical_pages ? std::min(config_.physical_pages, n_pages_) : n_pages_;
  if (physical_ != n_pages_ && !config_.page_order.empty())
    throw InvalidArgument(name + ": page_order and physical_pages are exclusive");
  if (n_pages_ > 1 && config_.page_size % kPageMultiple != 0)
    throw InvalidArgument(name + ": page_size " + std::to_string(config_.page_size) + " must be a multiple of " +
                          std::to_string(kPageMultiple) + " (attention key tiles never straddle a page)");
  pages_per_pool_ = static_cast<uint32_t>(std::min<uint64_t>(limit / page_bytes, physical_));
  const uint32_t n_pools = (physical_ + pages_per_pool_ - 1) / pages_per_pool_;
  if (n_pools > kMaxPools)
    throw InvalidArgument(name + ": " + std::to_string(config_.max_seq) + " positions need " + std::to_string(n_pools) +
                          " storage bindings of " + std::to_string(limit) + " bytes; at most " +
                          std::to_string(kMaxPools) + " are supported: lower the context (-c)");
  pools_ = std::make_shared<std::vector<gpu::Buffer>>();
  for (uint32_t p = 0; p < n_pools; ++p) {
    const uint32_t pages = std::min(pages_per_pool_, physical_ - p * pages_per_pool_);
    pools_->push_back(ctx.create_buffer(pages * page_bytes, WGPUBufferUsage_Storage, name + " pool"));
  }
  map_ = std::make_shared<PageMap>();
  std::vector<uint32_t>& table = map_->table;
  table.resize(n_pages_);
  for (uint32_t i = 0; i < n_pages_; ++i) table[i] = i % physical_;
  if (!config_.page_order.empty()) {
    std::vector<uint32_t> sorted = config_.page_order;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != table)
      throw InvalidArgument(name + ": page_order must be a permutation of the " + std::to_string(n_pages_) + " pages");
    table = config_.page_order;
  }
  page_table_ =
      std::make_shared<gpu::Buffer>(ctx.upload<uint32_t>(table, WGPUBufferUsage_Storage, name + " page table"));
}

KvCache::KvCache(const KvCache& owner, uint32_t first_page, uint32_t n_pages, std::string_view label)
    : ctx_(owner.ctx_),
      config_(owner.config_),
      n_pages_(n_pages),
      pages_per_pool_(owner.pages_per_pool_),
      physical_(owner.physical_),
      pools_(owner.pools_),
      map_(owner.map_),
      page_base_(owner.page_base_ + first_page),
      view_(true) {
  const std::string name(label);
  if (n_pages == 0 || uint64_t(first_page) + n_pages > owner.n_pages_)
    throw InvalidArgument(name + ": pages [" + std::to_string(first_page) + ", " +
                          std::to_string(uint64_t(first_page) + n_pages) + ") are not within the owner's " +
                          std::to_string(owner.n_pages_));
  if (n_pages > 1 && config_.page_size % kPageMultiple != 0)
    throw InvalidArgument(name + ": a view of several pages needs a page size that is a multiple of " +
                          std::to_string(kPageMultiple));
  config_.max_seq = n_pages * config_.page_size;
  config_.page_order.clear();
  const auto first = map_->table.begin() + page_base_;
  page_table_ = std::make_shared<gpu::Buffer>(
      ctx_.upload<uint32_t>(std::span(first, first + n_pages), WGPUBufferUsage_Storage, name + " page table"));
  std::erase_if(map_->views, [](const PageMap::ViewTable& v) { return v.buffer.expired(); });
  map_->views.push_back({page_base_, n_pages, page_table_});
}

uint64_t KvCache::bytes() const {
  if (view_) return uint64_t(n_pages_) * 2 * config_.page_size * config_.kv_dim * kv_type_bytes(config_.type);
  uint64_t b = 0;
  for (const auto& p : *pools_) b += p.size;
  return b;
}

uint64_t KvCache::page_bytes() const { return 2ull * config_.page_size * config_.kv_dim * kv_type_bytes(config_.type); }

uint32_t KvCache::physical_page(uint32_t page) const {
  if (page >= n_pages_)
    throw InvalidArgument("KvCache::physical_page: page " + std::to_string(page) + " of " + std::to_string(n_pages_));
  return map_->table[page_base_ + page];
}

void KvCache::remap(uint32_t page, uint32_t physical) {
  if (view_) throw InvalidArgument("KvCache::remap: a view's pages are remapped through its owner");
  if (page >= n_pages_ || physical >= physical_)
    throw InvalidArgument("KvCache::remap: page " + std::to_string(page) + " -> " + std::to_string(physical) +
                          " is outside the " + std::to_string(n_pages_) + " pages (" + std::to_string(physical_) +
                          " physical)");
  map_->table[page] = physical;
  ctx_.write_buffer(*page_table_, uint64_t(page) * 4, &physical, 4);
  for (const PageMap::ViewTable& v : map_->views)
    if (page >= v.first && page < v.first + v.n)
      if (const std::shared_ptr<gpu::Buffer> b = v.buffer.lock())
        ctx_.write_buffer(*b, uint64_t(page - v.first) * 4, &physical, 4);
}

void KvCache::copy_rows(gpu::ComputeBatch& batch, uint32_t from, uint32_t to, uint32_t rows,
                        const gpu::Buffer& staging) const {
  if (view_) throw InvalidArgument("KvCache::copy_rows: a view's rows are copied through its owner");
  if (from >= physical_ || to >= physical_ || rows > config_.page_size)
    throw InvalidArgument("KvCache::copy_rows: rows [0, " + std::to_string(rows) + ") of page " + std::to_string(from) +
                          " -> " + std::to_string(to) + " are outside the " + std::to_string(physical_) +
                          " physical pages of " + std::to_string(config_.page_size) + " rows");
  if (staging.size < page_bytes()) throw InvalidArgument("KvCache::copy_rows: the staging buffer is under a page");
  if (rows == 0 || from == to) return;
  const uint64_t esize = kv_type_bytes(config_.type), half = uint64_t(config_.page_size) * config_.kv_dim * esize;
  const uint64_t bytes = uint64_t(rows) * config_.kv_dim * esize;
  const uint64_t page = 2 * half;
  const gpu::Buffer &src = (*pools_)[from / pages_per_pool_], &dst = (*pools_)[to / pages_per_pool_];
  const uint64_t src_at = (from % pages_per_pool_) * page, dst_at = (to % pages_per_pool_) * page;
  batch.copy(src, src_at, staging, 0, bytes);            // K
  batch.copy(src, src_at + half, staging, half, bytes);  // V
  batch.copy(staging, 0, dst, dst_at, bytes);
  batch.copy(staging, half, dst, dst_at + half, bytes);
}

KvCache::Location KvCache::locate(uint32_t pos) const {
  const uint32_t phys = map_->table[page_base_ + pos / config_.page_size];
  const uint64_t page_elems = 2ull * config_.page_size * config_.kv_dim;
  const uint64_t base = uint64_t(phys % pages_per_pool_) * page_elems;
  const uint64_t row = uint64_t(pos % config_.page_size) * config_.kv_dim;
  return {phys / pages_per_pool_, base + row, base + uint64_t(config_.page_size) * config_.kv_dim + row};
}

// Calls fn(first_row, rows, location of first_row) for each run of rows that share a page
// (such rows are contiguous in their pool).
template <typename Fn>
static void for_each_page_run(const KvCache& kv, uint32_t pos, uint32_t n, Fn fn) {
  for (uint32_t i = 0; i < n;) {
    const uint32_t in_page = kv.page_size() - (pos + i) % kv.page_size();
    const uint32_t rows = std::min(in_page, n - i);
    fn(i, rows, kv.locate(pos + i));
    i += rows;
  }
}

void KvCache::write(uint32_t pos, uint32_t n, std::span<const float> k, std::span<const float> v) {
  const uint32_t kv_dim = config_.kv_dim;
  if (uint64_t(pos) + n > config_.max_seq)
    throw InvalidArgument("KvCache::write: rows [" + std::to_string(pos) + ", " + std::to_string(uint64_t(pos) + n) +
                          ") past max_seq " + std::to_string(config_.max_seq));
  if (k.size() < size_t(n) * kv_dim || v.size() < size_t(n) * kv_dim)
    throw InvalidArgument("KvCache::write: k/v hold fewer than n * kv_dim floats");
  const uint64_t esize = kv_type_bytes(config_.type);
  std::vector<uint8_t> staged;
  auto put = [&](const float* src, size_t count, uint32_t pool, uint64_t elem) {
    staged.resize(count * esize);
    if (config_.type == KvType::F32) {
      std::memcpy(staged.data(), src, staged.size());
    } else {
      auto* h = reinterpret_cast<uint16_t*>(staged.data());
      for (size_t d = 0; d < count; ++d) h[d] = f32_to_f16(src[d]);
    }
    ctx_.write_buffer((*pools_)[pool], elem * esize, staged.data(), staged.size());
  };
  for_each_page_run(*this, pos, n, [&](uint32_t i, uint32_t rows, const Location& loc) {
    put(&k[size_t(i) * kv_dim], size_t(rows) * kv_dim, loc.pool, loc.k_elem);
    put(&v[size_t(i) * kv_dim], size_t(rows) * kv_dim, loc.pool, loc.v_elem);
  });
}

void KvCache::read(uint32_t pos, uint32_t n, std::vector<float>& k, std::vector<float>& v) const {
  const uint32_t kv_dim = config_.kv_dim;
  const uint64_t esize = kv_type_bytes(config_.type);
  k.resize(size_t(n) * kv_dim);
  v.resize(size_t(n) * kv_dim);
  std::vector<uint8_t> staged;
  auto get = [&](float* dst, size_t count, uint32_t pool, uint64_t elem) {
    staged.resize(count * esize);
    ctx_.read_buffer((*pools_)[pool], elem * esize, staged.data(), staged.size());
    if (config_.type == KvType::F32) {
      std::memcpy(dst, staged.data(), staged.size());
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(staged.data());
      for (size_t d = 0; d < count; ++d) dst[d] = f16_to_f32(h[d]);
    }
  };
  for_each_page_run(*this, pos, n, [&](uint32_t i, uint32_t rows, const Location& loc) {
    get(&k[size_t(i) * kv_dim], size_t(rows) * kv_dim, loc.pool, loc.k_elem);
    get(&v[size_t(i) * kv_dim], size_t(rows) * kv_dim, loc.pool, loc.v_elem);
  });
}

}  // namespace wgllm::kernels

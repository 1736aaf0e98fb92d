// The KV cache of one attention layer, made of fixed-size pages.
//
// A page holds `page_size` positions: first the K rows [page_size][kv_dim], then the V rows
// [page_size][kv_dim]. Pages live in up to kMaxPools storage buffers ("pools"), each no larger
// than one storage binding, so a context whose K/V exceeds a binding still runs. A page table
// maps logical page -> physical page (physical p sits in pool p / pages_per_pool at slot
// p % pages_per_pool). A contiguous cache is the special case of a single page.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/batch.h"
#include "gpu/context.h"

namespace wgllm::kernels {

enum class KvType { F16, F32 };

inline uint32_t kv_type_bytes(KvType t) { return t == KvType::F16 ? 2 : 4; }

struct KvCacheConfig {
  uint32_t kv_dim = 0;     // n_kv_heads * head_dim
  uint32_t max_seq = 0;    // positions the cache can hold
  uint32_t page_size = 0;  // positions per page; 0 = one page (contiguous)
  KvType type = KvType::F16;
  // The physical page of each logical page: a permutation of [0, n_pages); empty = in order. Pages out of order are
  // what an allocator shared by several sequences hands out (and what tests use to check the indirection).
  std::vector<uint32_t> page_order = {};
  // Pages the pools hold (0: one per logical page). Fewer: logical pages are pointed at them with remap as they are
  // needed (a pool shared by sequences, SharedKv); until then each points at physical page (logical % this).
  uint32_t physical_pages = 0;
};

class KvCache {
 public:
  static constexpr uint32_t kMaxPools = 4;
  static constexpr uint32_t kPageMultiple = 128;  // page sizes of multi-page caches (largest key tile)

  KvCache(gpu::Context& ctx, const KvCacheConfig& config, std::string_view label = "kv cache");
  // A view: logical pages [first_page, first_page + n_pages) of `owner` as a cache of its own (positions from 0,
  // max_seq n_pages * page_size), in the owner's pools — several sequences' caches in one pool, so a kernel can
  // reach all of them through the owner's page table (page_base() + the view's page). The owner's pools live as
  // long as any view of them.
  KvCache(const KvCache& owner, uint32_t first_page, uint32_t n_pages, std::string_view label = "kv cache view");
  KvCache(KvCache&&) noexcept = default;

  const KvCacheConfig& config() const { return config_; }
  uint32_t page_size() const { return config_.page_size; }
  uint32_t n_pages() const { return n_pages_; }
  uint32_t physical_pages() const { return physical_; }  // an owner's pools' pages
  uint32_t pages_per_pool() const { return pages_per_pool_; }
  uint32_t n_pools() const { return static_cast<uint32_t>(pools_->size()); }
  const gpu::Buffer& pool(uint32_t i) const { return (*pools_)[std::min<uint32_t>(i, n_pools() - 1)]; }
  const gpu::Buffer& page_table() const { return *page_table_; }
  // A view's first page in its owner's page table (0 for an owner), and whether two caches share pools.
  uint32_t page_base() const { return page_base_; }
  bool same_pools(const KvCache& o) const { return pools_ == o.pools_; }
  uint64_t bytes() const;  // GPU memory taken by the pools (a view: by its pages)
  uint64_t page_bytes() const;  // one page's K and V rows

  // The physical page behind logical page `page` (a view's: relative to its first page).
  uint32_t physical_page(uint32_t page) const;
  // Points the owner's logical page `page` at physical page `physical` (pages may then share a physical page): the
  // owner's page table and those of its views that cover it, on the host and on the GPU (a queue write: work
  // submitted before it reads the old entry, work submitted after it the new one). Owners only.
  void remap(uint32_t page, uint32_t physical);
  // Encodes copies of K and V rows [0, rows) of physical page `from` into physical page `to` (rows past them are
  // left alone), through `staging` (at least page_bytes(); a buffer cannot be copied into itself). Owners only.
  void copy_rows(gpu::ComputeBatch& batch, uint32_t from, uint32_t to, uint32_t rows, const gpu::Buffer& staging) const;

  // Element offset (in KV elements, within its pool) of K[pos][0] / V[pos][0], and its pool.
  struct Location {
    uint32_t pool;
    uint64_t k_elem, v_elem;
  };
  Location locate(uint32_t pos) const;

  // Host upload of rows [pos, pos + n): k, v are [n][kv_dim] f32 (rounded to f16 if F16).
  void write(uint32_t pos, uint32_t n, std::span<const float> k, std::span<const float> v);
  // Read back rows [pos, pos + n) as f32 (what the kernels see after rounding).
  void read(uint32_t pos, uint32_t n, std::vector<float>& k, std::vector<float>& v) const;

 private:
  gpu::Context& ctx_;
  KvCacheConfig config_;
  uint32_t n_pages_ = 0, pages_per_pool_ = 0, physical_ = 0;
  // The owner's logical page -> physical page, on the host, and the GPU page tables of its live views (each a slice
  // of it from its first page): shared by an owner and its views, so that remap reaches them all.
  struct PageMap {
    std::vector<uint32_t> table;
    struct ViewTable {
      uint32_t first, n;
      std::weak_ptr<gpu::Buffer> buffer;
    };
    std::vector<ViewTable> views;
  };
  std::shared_ptr<std::vector<gpu::Buffer>> pools_;  // shared by an owner and its views
  std::shared_ptr<PageMap> map_;
  std::shared_ptr<gpu::Buffer> page_table_;  // this cache's slice of the map on the GPU
  uint32_t page_base_ = 0;
  bool view_ = false;
};

}  // namespace wgllm::kernels

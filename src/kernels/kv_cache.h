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
  uint32_t pages_per_pool() const { return pages_per_pool_; }
  uint32_t n_pools() const { return static_cast<uint32_t>(pools_->size()); }
  const gpu::Buffer& pool(uint32_t i) const { return (*pools_)[std::min<uint32_t>(i, n_pools() - 1)]; }
  const gpu::Buffer& page_table() const { return page_table_; }
  // A view's first page in its owner's page table (0 for an owner), and whether two caches share pools.
  uint32_t page_base() const { return page_base_; }
  bool same_pools(const KvCache& o) const { return pools_ == o.pools_; }
  uint64_t bytes() const;  // GPU memory taken by the pools (a view: by its pages)

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
  uint32_t n_pages_ = 0, pages_per_pool_ = 0;
  std::shared_ptr<std::vector<gpu::Buffer>> pools_;  // shared by an owner and its views
  std::vector<uint32_t> table_;                      // logical page -> physical page
  gpu::Buffer page_table_;
  uint32_t page_base_ = 0;
  bool view_ = false;
};

}  // namespace wgllm::kernels

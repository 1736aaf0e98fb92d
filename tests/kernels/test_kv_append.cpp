// The KV append (kv_append.wgsl): rows through the page table into the right pool, f16 and f32 caches.
#include <algorithm>
#include <optional>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/kv_append.h"
#include "kernels/kv_cache.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

// ------------------------------------------------------------------------------- KV append

struct KvAppendCase {
  const char* name;
  uint32_t kv_dim, max_seq, page_size;
  kernels::KvType type;
  uint32_t start_pos, n_tokens;
};

const KvAppendCase kKvAppendCases[] = {
    {"f16_contiguous_decode", 128, 100, 0, kernels::KvType::F16, 37, 1},
    {"f16_contiguous_prefill", 256, 300, 0, kernels::KvType::F16, 0, 75},
    {"f32_paged_across_pages", 64, 1000, 128, kernels::KvType::F32, 50, 200},
    {"f16_paged_decode_page_edge", 128, 512, 128, kernels::KvType::F16, 127, 1},
    {"f16_paged_prefill_odd", 96, 700, 128, kernels::KvType::F16, 3, 333},
    {"f32_paged_kvdim_odd", 33, 384, 128, kernels::KvType::F32, 100, 60},
    // > one binding of K/V (f32, 129 pages of 1 MiB on a 128 MiB adapter): several pools.
    {"f32_multi_pool", 1024, 129 * 128, 128, kernels::KvType::F32, 16000, 450},
};

class KvAppendTable : public ::testing::TestWithParam<KvAppendCase> {};

TEST_P(KvAppendTable, WritesThroughThePageTable) {
  const auto& c = GetParam();
  auto& ctx = context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  kernels::KvCache kv(ctx,
                      {.kv_dim = c.kv_dim,
                       .max_seq = c.max_seq,
                       .page_size = c.page_size,
                       .type = c.type,
                       .page_order = shuffled_pages(c.max_seq, c.page_size, salt)},
                      c.name);
  if (std::string(c.name) == "f32_multi_pool" && ctx.max_binding_size() <= (128ull << 20)) {
    EXPECT_GT(kv.n_pools(), 1u);
  }
  // Neighbour rows written by the host must survive the append.
  const uint32_t lo = c.start_pos ? c.start_pos - 1 : 0;
  const uint32_t hi = std::min(c.max_seq, c.start_pos + c.n_tokens + 1);
  const auto nk = random_floats(size_t(hi - lo) * c.kv_dim, gen), nv = random_floats(size_t(hi - lo) * c.kv_dim, gen);
  kv.write(lo, hi - lo, nk, nv);
  const auto k = random_floats(size_t(c.n_tokens) * c.kv_dim, gen, -4.f, 4.f);
  const auto v = random_floats(size_t(c.n_tokens) * c.kv_dim, gen, -4.f, 4.f);
  auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k");
  auto vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_kv_append(batch, ctx, kv, kb, vb, c.start_pos, c.n_tokens);
  batch.submit_and_wait();
  std::vector<float> gk, gv;
  kv.read(lo, hi - lo, gk, gv);
  // Expected: the neighbours, and the appended rows rounded like the cache's own host writes.
  auto wk = nk, wv = nv;
  const bool f16 = c.type == kernels::KvType::F16;
  auto round = [&](float f) { return f16 ? wgllm::f16_to_f32(wgllm::f32_to_f16(f)) : f; };
  for (size_t i = 0; i < wk.size(); ++i) {
    wk[i] = round(wk[i]);
    wv[i] = round(wv[i]);
  }
  for (size_t i = 0; i < k.size(); ++i) {
    wk[size_t(c.start_pos - lo) * c.kv_dim + i] = round(k[i]);
    wv[size_t(c.start_pos - lo) * c.kv_dim + i] = round(v[i]);
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < wk.size(); ++i) mismatches += (gk[i] != wk[i]) + (gv[i] != wv[i]);
  // pack2x16float may round differently from round-to-nearest-even on a tie: a handful at most.
  EXPECT_LE(mismatches, f16 ? wk.size() / 1000 : 0u);
  const auto rk = compare(gk, wk), rv = compare(gv, wv);
  EXPECT_LE(rk.rel_l2, 1e-6) << "K: " << rk.describe();
  EXPECT_LE(rv.rel_l2, 1e-6) << "V: " << rv.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, KvAppendTable, ::testing::ValuesIn(kKvAppendCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(KvAppend, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  kernels::KvCache odd(ctx, {.kv_dim = 33, .max_seq = 16});
  kernels::KvCache kv(ctx, {.kv_dim = 64, .max_seq = 16});
  auto buf = ctx.create_buffer(16 * 64 * 4, WGPUBufferUsage_Storage, "kv rows");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, odd, buf, buf, 0, 1); }, "kv_dim");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, buf, 10, 7); }, "max_seq");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, buf, 0, 0); }, "n_tokens");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, small, buf, 0, 2); }, "k holds");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, small, 0, 2); }, "v holds");
}

// A view of an owner's pages is a cache of its own: the KV append into a view lands at the owner's position
// first_page * page_size + pos, the owner's other rows stay as they were, and a view past the owner is refused.
TEST(KvCacheView, AppendsIntoTheOwnersPages) {
  auto& ctx = context();
  const uint32_t kv_dim = 8, page = 128;
  kernels::KvCache owner(ctx, {.kv_dim = kv_dim,
                               .max_seq = 4 * page,
                               .page_size = page,
                               .type = kernels::KvType::F32,
                               .page_order = {2, 0, 3, 1}});
  auto gen = rng(77);
  const auto before_k = random_floats(size_t(4) * page * kv_dim, gen, -1.f, 1.f);
  const auto before_v = random_floats(size_t(4) * page * kv_dim, gen, -1.f, 1.f);
  owner.write(0, 4 * page, before_k, before_v);
  kernels::KvCache view(owner, 2, 2);
  EXPECT_EQ(view.config().max_seq, 2 * page);
  EXPECT_EQ(view.page_base(), 2u);
  EXPECT_TRUE(view.same_pools(owner));
  EXPECT_EQ(view.bytes(), uint64_t(2) * 2 * page * kv_dim * 4);
  const uint32_t pos = page + 5, n = 3;  // the view's second page
  const auto k = random_floats(size_t(n) * kv_dim, gen, -1.f, 1.f),
             v = random_floats(size_t(n) * kv_dim, gen, -1.f, 1.f);
  auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k");
  auto vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
  gpu::ComputeBatch batch(ctx);
  kernels::encode_kv_append(batch, ctx, view, kb, vb, pos, n);
  batch.submit_and_wait();
  std::vector<float> got_k, got_v;
  owner.read(0, 4 * page, got_k, got_v);
  const size_t at = size_t(2 * page + pos) * kv_dim;
  for (size_t i = 0; i < got_k.size(); ++i) {
    const bool written = i >= at && i < at + size_t(n) * kv_dim;
    ASSERT_EQ(got_k[i], written ? k[i - at] : before_k[i]) << "K element " << i;
    ASSERT_EQ(got_v[i], written ? v[i - at] : before_v[i]) << "V element " << i;
  }
  EXPECT_THROW(kernels::KvCache(owner, 3, 2), InvalidArgument);
  EXPECT_THROW(kernels::KvCache(owner, 0, 0), InvalidArgument);
}

// An owner's page pointed elsewhere (KvCache::remap) is pointed so in the views that cover it, on the host and on
// the GPU (a KV append through the view lands in the new page); copy_rows copies a page's first rows of K and of V,
// within a pool, and leaves the rest of the page as it was. Views remap nothing, and a staging buffer under a page
// is refused.
TEST(KvCacheView, RemapReachesTheViewsAndCopyRowsCopiesRows) {
  auto& ctx = context();
  const uint32_t kv_dim = 16, page = 128, rows = 50;
  for (kernels::KvType type : {kernels::KvType::F32, kernels::KvType::F16}) {
    SCOPED_TRACE(type == kernels::KvType::F32 ? "f32" : "f16");
    kernels::KvCache owner(ctx, {.kv_dim = kv_dim, .max_seq = 4 * page, .page_size = page, .type = type});
    auto gen = rng(78);
    const auto k0 = random_floats(size_t(4) * page * kv_dim, gen, -1.f, 1.f);
    const auto v0 = random_floats(size_t(4) * page * kv_dim, gen, -1.f, 1.f);
    owner.write(0, 4 * page, k0, v0);
    std::vector<float> before_k, before_v;  // as rounded to the cache's type
    owner.read(0, 4 * page, before_k, before_v);
    std::optional<kernels::KvCache> view(std::in_place, owner, 2, 2), gone(std::in_place, owner, 2, 1);
    gone.reset();       // a view no longer alive is left out
    owner.remap(3, 0);  // the view's second page: the owner's physical page 0
    EXPECT_EQ(view->physical_page(1), 0u);
    EXPECT_EQ(owner.physical_page(3), 0u);
    std::vector<float> got_k, got_v;
    view->read(page, page, got_k, got_v);
    const size_t page_elems = size_t(page) * kv_dim;
    ASSERT_TRUE(std::equal(got_k.begin(), got_k.end(), before_k.begin())) << "the view reads physical page 0";
    const auto k = random_floats(kv_dim, gen, -1.f, 1.f), v = random_floats(kv_dim, gen, -1.f, 1.f);
    auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k"),
         vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
    gpu::ComputeBatch append(ctx);
    kernels::encode_kv_append(append, ctx, *view, kb, vb, page + 7, 1);  // its second page's row 7
    append.submit_and_wait();
    owner.read(7, 1, got_k, got_v);  // physical page 0 is the owner's logical page 0
    for (uint32_t d = 0; d < kv_dim; ++d) ASSERT_NEAR(got_k[d], k[d], 1e-3) << "the GPU page table was not updated";
    owner.read(0, 4 * page, before_k, before_v);

    const gpu::Buffer staging = ctx.create_buffer(owner.page_bytes(), WGPUBufferUsage_Storage, "staging");
    gpu::ComputeBatch copy(ctx);
    owner.copy_rows(copy, 1, 2, rows, staging);  // physical page 1 (logical 1) -> 2 (logical 2)
    copy.submit_and_wait();
    owner.read(0, 4 * page, got_k, got_v);
    for (size_t i = 0; i < got_k.size(); ++i) {
      const bool copied = i >= 2 * page_elems && i < 2 * page_elems + size_t(rows) * kv_dim;
      ASSERT_EQ(got_k[i], copied ? before_k[i - page_elems] : before_k[i]) << "K element " << i;
      ASSERT_EQ(got_v[i], copied ? before_v[i - page_elems] : before_v[i]) << "V element " << i;
    }
    EXPECT_THROW(view->remap(0, 1), InvalidArgument);
    EXPECT_THROW(owner.remap(0, 4), InvalidArgument);
    const gpu::Buffer small = ctx.create_buffer(owner.page_bytes() - 4, WGPUBufferUsage_Storage, "small");
    EXPECT_THROW(owner.copy_rows(copy, 1, 2, rows, small), InvalidArgument);
    EXPECT_THROW(owner.copy_rows(copy, 1, 2, page + 1, staging), InvalidArgument);
  }
}

}  // namespace
}  // namespace wgllm::test

// SharedKv: sessions whose KV caches are views of one pool take over another session's prefix (whole pages shared,
// the last partial one copied) and then run as if they had computed it; what either writes afterwards never reaches
// the other, a truncation into a shared page included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/batch_decode.h"
#include "model/transformer.h"
#include "model_util.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

constexpr uint32_t kCtx = 512, kPage = 128;

std::vector<int32_t> random_ids(uint32_t n_vocab, size_t n, std::mt19937_64& gen) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab) - 1);
  std::vector<int32_t> p;
  while (p.size() < n) p.push_back(d(gen));
  return p;
}

// Every layer's K and V rows [0, n) of sequence s, as the pool holds them.
std::vector<float> rows(const ModelConfig& c, const SharedKv& pool, uint32_t s, uint32_t n) {
  std::vector<float> all, k, v;
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (pool.layer(l)) {
      pool.layer(l)->read(s * pool.n_ctx(), n, k, v);
      all.insert(all.end(), k.begin(), k.end());
      all.insert(all.end(), v.begin(), v.end());
    }
  return all;
}

// A session of kCtx positions, F32 KV, chunks of 32: sequence s of `pool` (none: caches of its own).
std::unique_ptr<GpuSession> f32_session(gpu::Context& ctx, const GpuModel& gm, SharedKv* pool, uint32_t s) {
  return std::make_unique<GpuSession>(
      ctx, gm,
      GpuSessionOptions{
          .n_ctx = kCtx, .ubatch = 32, .kv_type = kernels::KvType::F32, .shared_kv = pool, .kv_sequence = s});
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << what;
}

class SharedKvPrefix : public ::testing::TestWithParam<std::string> {};

// Sessions a, b, c on one pool (pages of 128 positions), twins d and e on another that compute everything
// themselves. b takes a's first 200 positions (a page shared, 72 rows copied) and goes on as e, which computed them;
// a goes on, truncates into the shared page and writes there; b, then c taking b's first 256 (two whole pages),
// write past them: each step's logits equal the twin's bit for bit, and each sequence's rows stay as they were
// wherever another one wrote.
TEST_P(SharedKvPrefix, SessionsTakeOverAnothersPrefix) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const ModelConfig& c = gm.config;
  const uint32_t V = c.n_vocab;
  auto gen = test::rng(47);
  SharedKv pool(ctx, c, 3, kCtx, kPage, kernels::KvType::F32), twins(ctx, c, 2, kCtx, kPage, kernels::KvType::F32);
  auto session = [&](SharedKv& p, uint32_t s) { return f32_session(ctx, gm, &p, s); };
  auto a = session(pool, 0), b = session(pool, 1), cs = session(pool, 2), d = session(twins, 0), e = session(twins, 1);
  auto same = [&](GpuSession& x, GpuSession& twin, const std::vector<int32_t>& ids, const std::string& what) {
    const std::vector<float> got = x.forward(ids), want = twin.forward(ids);
    expect_same_bits(got, want, what);
    EXPECT_TRUE(std::ranges::equal(x.tokens(), twin.tokens())) << what;
  };

  const std::vector<int32_t> prompt = random_ids(V, 300, gen);
  same(*a, *d, prompt, "a's prompt");
  e->forward(prompt);
  e->truncate(200);
  EXPECT_EQ(pool.pages_shared(), 0u);
  b->share_prefix(*a, 200);
  EXPECT_EQ(b->n_past(), 200u);
  EXPECT_TRUE(std::ranges::equal(b->tokens(), std::span(prompt).first(200)));
  EXPECT_EQ(pool.pages_shared(), 1u) << "positions [0, 128)";
  EXPECT_EQ(pool.pages_free(), 1u) << "b's own first page";
  EXPECT_EQ(pool.physical_page(1, 0), pool.physical_page(0, 0));
  EXPECT_NE(pool.physical_page(1, 128), pool.physical_page(0, 128)) << "the partial page is copied";
  expect_same_bits(rows(c, pool, 1, 200), rows(c, pool, 0, 200), "b's rows are a's");

  const std::vector<float> a_rows = rows(c, pool, 0, 300);
  same(*b, *e, random_ids(V, 150, gen), "b after the prefix it took");  // positions 200..350
  expect_same_bits(rows(c, pool, 0, 300), a_rows, "a's rows after b wrote past 200");

  const std::vector<float> b_rows = rows(c, pool, 1, 350);
  same(*a, *d, random_ids(V, 20, gen), "a going on");  // 300..320
  for (GpuSession* s : {a.get(), d.get()}) s->truncate(100);
  EXPECT_EQ(pool.pages_shared(), 0u) << "a's first page copied before a writes into it";
  EXPECT_EQ(pool.pages_free(), 0u);
  same(*a, *d, random_ids(V, 60, gen), "a truncated into the shared page and fed again");  // 100..160
  expect_same_bits(rows(c, pool, 1, 350), b_rows, "b's rows after a wrote into the page they shared");
  same(*b, *e, random_ids(V, 10, gen), "b after a wrote");  // 350..360

  const std::vector<float> before = rows(c, pool, 1, 360);
  cs->share_prefix(*b, 256);
  EXPECT_EQ(pool.pages_shared(), 2u) << "two whole pages, nothing copied";
  const std::vector<float> taken = rows(c, pool, 1, 256);
  const std::vector<int32_t> more = random_ids(V, 40, gen);
  const std::vector<float> got = cs->forward(more);
  e->truncate(256);
  expect_same_bits(got, e->forward(more), "c after the two pages it took from b");
  expect_same_bits(rows(c, pool, 1, 360), before, "b's rows after c wrote past 256");
  b->reset();
  EXPECT_EQ(pool.pages_shared(), 0u) << "b's pages its own again before it writes";
  EXPECT_EQ(pool.pages_free(), 0u) << "the two c left (its own first ones) are b's now";
  b->forward(random_ids(V, 300, gen));
  expect_same_bits(rows(c, pool, 2, 256), taken, "c's rows after b was reset and wrote over [0, 300)");
}

INSTANTIATE_TEST_SUITE_P(Models, SharedKvPrefix,
                         ::testing::Values("llama-f32", "qwen3-f16", "gemma3-tiny-f32", "gemma4-tiny-kv-f32"),
                         test::model_param_name);

// lfm2's conv rings come along at page boundaries (SequenceState::marks): b takes a's first 256 positions (two whole
// pages and the conv state there), not 200; c takes b's first 128, a truncates back to 128 in place; each then goes
// on as a session on caches of its own that computed those positions. A boundary crossed one token at a time keeps
// its mark too.
class ConvPrefix : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvPrefix, ConvStateTakenAtPageBoundaries) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  ASSERT_FALSE(gm.config.conv_layers.empty());
  auto gen = test::rng(49);
  SharedKv pool(ctx, gm.config, 4, kCtx, kPage, kernels::KvType::F32);
  auto session = [&](SharedKv* p, uint32_t s) { return f32_session(ctx, gm, p, s); };
  // a session of its own that computes `prefix` and then `more`: the logits of `more` that x must give
  auto fresh = [&](std::span<const int32_t> prefix, const std::vector<int32_t>& more) {
    auto own = session(nullptr, 0);
    own->forward(prefix);
    return own->forward(more);
  };
  auto a = session(&pool, 0), b = session(&pool, 1), c = session(&pool, 2), g = session(&pool, 3);
  const std::vector<int32_t> prompt = random_ids(V, 300, gen);
  a->forward(prompt);
  EXPECT_TRUE(b->can_share_prefix(*a));
  EXPECT_EQ(b->shareable(*a, 300), 256u);
  EXPECT_EQ(b->shareable(*a, 255), 128u);
  EXPECT_EQ(b->shareable(*a, 100), 0u);
  EXPECT_THROW(b->share_prefix(*a, 200), InvalidArgument) << "not a page boundary";
  EXPECT_EQ(b->n_past(), 0u);
  b->share_prefix(*a, 256);
  EXPECT_EQ(b->n_past(), 256u);
  EXPECT_EQ(pool.pages_shared(), 2u);
  const std::vector<int32_t> more = random_ids(V, 100, gen);
  expect_same_bits(b->forward(more), fresh(std::span(prompt).first(256), more), "b after a's 256 positions");

  const std::vector<int32_t> after_a = random_ids(V, 20, gen);
  expect_same_bits(a->forward(after_a), fresh(prompt, after_a), "a after b wrote past 256");
  c->share_prefix(*b, 128);  // b's marks are a's: taken over with the pages
  const std::vector<int32_t> c_more = random_ids(V, 50, gen);
  expect_same_bits(c->forward(c_more), fresh(std::span(prompt).first(128), c_more), "c after b's first 128");

  EXPECT_EQ(a->rewind_point(200), 128u);
  EXPECT_TRUE(a->truncates_in_place(128));
  a->truncate(128);
  EXPECT_EQ(a->n_past(), 128u);
  const std::vector<int32_t> again = random_ids(V, 40, gen);
  expect_same_bits(a->forward(again), fresh(std::span(prompt).first(128), again), "a rewound to its mark at 128");

  // the boundary at 128 crossed by steps of one token (a twin takes the same steps: the decode products' bits are not
  // the prefill's)
  auto twin = session(nullptr, 0);
  g->forward(std::span(prompt).first(125));
  twin->forward(std::span(prompt).first(125));
  for (uint32_t i = 125; i < 131; ++i) {
    g->forward(std::span(prompt).subspan(i, 1));
    if (i < 128) twin->forward(std::span(prompt).subspan(i, 1));
  }
  b->share_prefix(*g, 128);
  expect_same_bits(b->forward(more), twin->forward(more), "b after g's 128, one token a step");
}

// The mark of a boundary crossed in batched decode steps (GpuBatchDecode, each sequence's convolution over its own
// ring): a steps from 125 to 130 beside c; b takes a's first 128 and goes on as a twin on another pool that took
// the same steps alone to 128 (batched steps' bits do not depend on the company) and then the same tokens.
TEST_P(ConvPrefix, BoundaryCrossedInBatchedSteps) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  auto gen = test::rng(50);
  SharedKv pool(ctx, gm.config, 3, kCtx, kPage, kernels::KvType::F32),
      other(ctx, gm.config, 1, kCtx, kPage, kernels::KvType::F32);
  auto session = [&](SharedKv& p, uint32_t s) { return f32_session(ctx, gm, &p, s); };
  auto a = session(pool, 0), b = session(pool, 1), c = session(pool, 2), twin = session(other, 0);
  GpuBatchDecode together(ctx, gm, 2, &pool), alone(ctx, gm, 1, &other);
  const std::vector<int32_t> prompt = random_ids(V, 131, gen), c_ids = random_ids(V, 60, gen);
  a->forward(std::span(prompt).first(125));
  twin->forward(std::span(prompt).first(125));
  c->forward(std::span(c_ids).first(50));
  for (uint32_t i = 125; i < 131; ++i) {
    GpuSession* step[] = {c.get(), a.get()};
    const int32_t ids[] = {c_ids[50 + i - 125], prompt[i]};
    together.step(step, ids);
    if (i < 128) {
      GpuSession* one[] = {twin.get()};
      alone.step(one, std::span(&prompt[i], 1));
    }
  }
  ASSERT_EQ(a->n_past(), 131u);
  ASSERT_EQ(twin->n_past(), 128u);
  b->share_prefix(*a, 128);
  const std::vector<int32_t> more = random_ids(V, 40, gen);
  expect_same_bits(b->forward(more), twin->forward(more), "b after a's 128, crossed in batched steps");
}

INSTANTIATE_TEST_SUITE_P(Models, ConvPrefix, ::testing::Values("lfm2-tiny-f32", "lfm2-tiny-l4-f32"),
                         test::model_param_name);

// A pool of 6 pages for 3 sequences of 4: pages are mapped as sequences reach them; when none is free, idle
// sequences give theirs up, the least recently used one's last pages first, and its cache is cut back there
// (sync_pages); running sequences' pages are never taken (KvPoolFull). Every step's logits equal those of a twin on
// a pool with every page at hand, cut back alike.
TEST(SharedKvPool, PagesOnDemandTakenFromIdleSequences) {
  const GgufFile f = GgufFile::open(test::model_path("llama-f32"));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  auto gen = test::rng(48);
  SharedKv pool(ctx, gm.config, 3, kCtx, kPage, kernels::KvType::F32, 6),
      full(ctx, gm.config, 3, kCtx, kPage, kernels::KvType::F32);
  EXPECT_TRUE(pool.on_demand());
  EXPECT_FALSE(full.on_demand());
  EXPECT_EQ(pool.pages_free(), 6u);
  auto session = [&](SharedKv& p, uint32_t s) { return f32_session(ctx, gm, &p, s); };
  std::vector<std::unique_ptr<GpuSession>> s, twin;
  for (uint32_t i = 0; i < 3; ++i) {
    s.push_back(session(pool, i));
    twin.push_back(session(full, i));
  }
  auto same = [&](uint32_t i, const std::vector<int32_t>& ids, const std::string& what) {
    const std::vector<float> got = s[i]->forward(ids), want = twin[i]->forward(ids);
    expect_same_bits(got, want, what);
  };
  same(0, random_ids(V, 300, gen), "a: 3 pages");
  same(1, random_ids(V, 250, gen), "b: 2 pages");
  EXPECT_EQ(pool.pages_free(), 1u);
  EXPECT_THROW(s[2]->forward(random_ids(V, 200, gen)), KvPoolFull) << "a and b run: nothing to take";
  EXPECT_EQ(s[2]->n_past(), 0u);
  pool.set_idle(0, true);
  pool.set_idle(1, true);
  same(2, random_ids(V, 200, gen), "c: a page from a, the least recently used");
  EXPECT_EQ(pool.kept(0), 256u);
  EXPECT_EQ(pool.kept(1), SharedKv::kNone);
  EXPECT_EQ(pool.physical_page(0, 256), SharedKv::kNone);
  pool.set_idle(1, false);
  same(1, random_ids(V, 100, gen), "b going on: another page of a");  // 250..350
  EXPECT_EQ(pool.kept(0), 128u);
  EXPECT_EQ(s[0]->n_past(), 300u) << "until it syncs";
  s[0]->sync_pages();
  twin[0]->truncate(128);
  EXPECT_EQ(s[0]->n_past(), 128u);
  EXPECT_TRUE(std::ranges::equal(s[0]->tokens(), twin[0]->tokens()));
  EXPECT_EQ(pool.kept(0), SharedKv::kNone);
  pool.set_idle(0, false);
  pool.set_idle(2, true);
  same(0, random_ids(V, 172, gen), "a fed again from 128: both of c's pages");
  EXPECT_EQ(pool.kept(2), 0u);
  s[2]->sync_pages();
  EXPECT_EQ(s[2]->n_past(), 0u);
  EXPECT_EQ(pool.pages_free(), 0u);
  s[1]->truncate(100);  // b's pages past its first unmapped
  EXPECT_EQ(pool.pages_free(), 2u);
}

// lfm2's conv rings of every sequence in one buffer per layer (what a batched step convolves in one dispatch): made
// once, the same buffer again for rings of that size, none for rings of another size or past one binding.
TEST(SharedKvPool, ConvRingsOneBufferPerLayer) {
  gpu::Context& ctx = test::context();
  const GpuModel lfm2 = load_gpu_model(ctx, GgufFile::open(test::model_path("lfm2-tiny-f32")));
  SharedKv pool(ctx, lfm2.config, 3, kCtx, kPage);
  const uint64_t ring = 4096;
  const gpu::Buffer* rings = pool.conv_rings(0, ring);
  ASSERT_NE(rings, nullptr);
  EXPECT_EQ(rings->size, 3 * ring);
  EXPECT_EQ(pool.conv_rings(0, ring), rings) << "the same buffer again";
  EXPECT_NE(pool.conv_rings(2, ring), rings) << "a buffer per layer";
  EXPECT_EQ(pool.conv_rings(0, 2 * ring), nullptr) << "rings of another size";
  SharedKv big(ctx, lfm2.config, 2, kCtx, kPage);
  EXPECT_EQ(big.conv_rings(0, ctx.max_binding_size() / 2 + 4), nullptr) << "past one binding";
}

TEST(SharedKvPool, DeltaStatesOneBufferPerLayer) {
  gpu::Context& ctx = test::context();
  const GpuModel qwen35 = load_gpu_model(ctx, GgufFile::open(test::model_path("qwen35-tiny-f32")));
  SharedKv pool(ctx, qwen35.config, 3, kCtx, kPage);
  const uint64_t state = 4096;
  const gpu::Buffer* states = pool.delta_states(0, state);
  ASSERT_NE(states, nullptr);
  EXPECT_EQ(states->size, 2 * 3 * state) << "two states a sequence";
  EXPECT_EQ(pool.delta_states(0, state), states) << "the same buffer again";
  EXPECT_NE(pool.delta_states(1, state), states) << "a buffer per layer";
  EXPECT_EQ(pool.delta_states(0, 2 * state), nullptr) << "states of another size";
  EXPECT_EQ(pool.delta_states(0, 0), nullptr);
  SharedKv big(ctx, qwen35.config, 2, kCtx, kPage);
  EXPECT_EQ(big.delta_states(0, ctx.max_binding_size() / 4 + 4), nullptr) << "past one binding";
}

TEST(SharedKvPrefix, RefusedWhereItCannotHold) {
  gpu::Context& ctx = test::context();
  const GgufFile f = GgufFile::open(test::model_path("llama-f32")),
                 g = GgufFile::open(test::model_path("lfm2-tiny-f32"));
  const GpuModel llama = load_gpu_model(ctx, f), lfm2 = load_gpu_model(ctx, g);
  SharedKv pool(ctx, llama.config, 2, kCtx, kPage), other(ctx, llama.config, 1, kCtx, kPage);
  SharedKv conv_pool(ctx, lfm2.config, 2, kCtx, kPage);
  const GpuSessionOptions o{.n_ctx = kCtx, .ubatch = 16};
  auto on = [&](const GpuModel& m, SharedKv* p, uint32_t s) {
    GpuSessionOptions so = o;
    so.shared_kv = p;
    so.kv_sequence = s;
    return std::make_unique<GpuSession>(ctx, m, so);
  };
  auto a = on(llama, &pool, 0), b = on(llama, &pool, 1), elsewhere = on(llama, &other, 0), own = on(llama, nullptr, 0);
  auto ids = [](uint32_t n) { return std::vector<int32_t>(n, 5); };
  a->forward(ids(40));
  EXPECT_TRUE(b->can_share_prefix(*a));
  EXPECT_FALSE(a->can_share_prefix(*a)) << "itself";
  EXPECT_FALSE(elsewhere->can_share_prefix(*a)) << "another pool";
  EXPECT_FALSE(own->can_share_prefix(*a)) << "caches of its own";
  EXPECT_THROW(b->share_prefix(*a, 41), InvalidArgument) << "more than a holds";
  EXPECT_THROW(own->share_prefix(*a, 8), InvalidArgument);
  EXPECT_EQ(b->n_past(), 0u);
  auto x = on(lfm2, &conv_pool, 0), y = on(lfm2, &conv_pool, 1);
  x->forward(ids(40));
  EXPECT_TRUE(y->can_share_prefix(*x));
  EXPECT_EQ(y->shareable(*x, 40), 0u) << "a conv state is kept at page boundaries only";
  EXPECT_THROW(y->share_prefix(*x, 32), InvalidArgument);
  GpuSessionOptions wider = o;  // conv rings of another size
  wider.ubatch = 32;
  wider.shared_kv = &conv_pool;
  wider.kv_sequence = 1;
  EXPECT_FALSE(GpuSession(ctx, lfm2, wider).can_share_prefix(*x));
  const GpuModel qwen35 = load_gpu_model(ctx, GgufFile::open(test::model_path("qwen35-tiny-f32")));
  SharedKv delta_pool(ctx, qwen35.config, 2, kCtx, kPage);
  auto q = on(qwen35, &delta_pool, 0), r = on(qwen35, &delta_pool, 1);
  q->forward(ids(200));
  EXPECT_FALSE(r->can_share_prefix(*q)) << "a recurrent state is not kept at page boundaries";
  EXPECT_EQ(r->shareable(*q, 200), 0u);
  EXPECT_THROW(on(llama, &pool, 2), InvalidArgument) << "a sequence past the pool's";
  EXPECT_THROW(SharedKv(ctx, llama.config, 2, 500, kPage), InvalidArgument) << "n_ctx not whole pages";
}

}  // namespace
}  // namespace wgllm

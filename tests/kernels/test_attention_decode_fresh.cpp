// The decode attention that takes the new token itself (attention_decode_fresh.wgsl) against its two-dispatch twin,
// qk_norm_rope_kv followed by attention_decode: the same output bits and the same cache, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/kv_cache.h"
#include "kernels/qk_norm_rope_kv.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::KvType;
using kernels::RopeType;

// A context whose decode runs the per-head kernel at every depth (CPU adapters default to the grouped one).
gpu::Context& per_head_context() {
  static gpu::Context ctx(context_options([](auto& o) { o.decode_gqa_from = 1u << 30; }));
  return ctx;
}

struct FreshCase {
  const char* name;
  uint32_t n_head, n_kv, head_dim, rope_dim;
  bool neox;
  uint32_t pos, max_seq, page_size;
  KvType kv_type;
  uint32_t row = 0;     // the token's row in q, k, v and out (the rows before it poison)
  bool norm = true;     // off: RoPE alone (no q_norm / k_norm)
  bool v_norm = false;  // Gemma 4
  uint32_t window = 0;  // sliding window
  bool append = true;   // false: q alone over a cache that holds the token (qk_norm_rope_q, then attention_decode)
};
const FreshCase kFreshCases[] = {
    {"gqa2_d128_f16_pos0", 4, 2, 128, 128, true, 0, 64, 0, KvType::F16},
    {"gqa4_d256_f16_gemma", 4, 1, 256, 256, true, 37, 256, 128, KvType::F16},
    {"gqa2_d128_f32_normal_row2", 8, 4, 128, 128, false, 100, 256, 128, KvType::F32, 2},
    {"mha_d128_partial_rope_f16_paged", 4, 4, 128, 64, true, 300, 512, 128, KvType::F16},
    {"gqa8_d128_three_splits_f16", 8, 1, 128, 128, true, 700, 1024, 128, KvType::F16},
    {"gqa2_d512_v_norm_f16", 4, 2, 512, 512, true, 140, 256, 128, KvType::F16, 0, true, true},
    {"gqa4_d256_window_f32", 4, 1, 256, 256, true, 300, 512, 128, KvType::F32, 1, true, false, 100},
    {"gqa2_d128_rope_alone_f16", 4, 2, 128, 128, false, 9, 32, 0, KvType::F16, 0, false},
    {"gqa2_d256_v_norm_last_position_f32", 2, 1, 256, 128, false, 127, 128, 128, KvType::F32, 1, true, true},
    {"q_alone_gqa4_d256_f16_window", 4, 1, 256, 256, true, 300, 512, 128, KvType::F16, 0, true, false, 100, false},
    {"q_alone_gqa2_d512_f32_row1", 4, 2, 512, 512, true, 40, 64, 0, KvType::F32, 1, true, false, 0, false},
};
std::ostream& operator<<(std::ostream& o, const FreshCase& c) { return o << c.name; }

class AttentionDecodeFresh : public ::testing::TestWithParam<FreshCase> {};

TEST_P(AttentionDecodeFresh, SameBitsAsQkNormRopeKvThenAttention) {
  const FreshCase& c = GetParam();
  gpu::Context& ctx = per_head_context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_kv * c.head_dim;
  // The token at row c.row of q, k and v; the rows before it poison.
  auto at_row = [&](std::vector<float> x) {
    std::vector<float> all(x.size() * c.row, std::nanf(""));
    all.insert(all.end(), x.begin(), x.end());
    return all;
  };
  const auto q = at_row(random_floats(qd, gen, -3.f, 3.f));
  const auto k = at_row(random_floats(kvd, gen, -3.f, 3.f)), v = at_row(random_floats(kvd, gen, -3.f, 3.f));
  auto qa = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q a");
  auto qb = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q b");
  auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k"), vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
  auto qn = ctx.upload<float>(random_floats(c.head_dim, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "q_norm");
  auto kn = ctx.upload<float>(random_floats(c.head_dim, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "k_norm");
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, 1e6f);
  // Two caches with the same earlier keys (and random rows at and after pos, which the token must replace or leave)
  const kernels::KvCacheConfig config{.kv_dim = kvd,
                                      .max_seq = c.max_seq,
                                      .page_size = c.page_size,
                                      .type = c.kv_type,
                                      .page_order = shuffled_pages(c.max_seq, c.page_size, salt)};
  kernels::KvCache ca(ctx, config, "a"), cb(ctx, config, "b");
  const uint32_t filled = std::min(c.max_seq, c.pos + 2);
  const auto old_k = random_floats(size_t(filled) * kvd, gen), old_v = random_floats(size_t(filled) * kvd, gen);
  ca.write(0, filled, old_k, old_v);
  cb.write(0, filled, old_k, old_v);
  std::vector<float> before_k, before_v;  // as the cache holds them (rounded to f16)
  cb.read(0, filled, before_k, before_v);
  const std::vector<float> poison(size_t(c.row + 1) * qd, std::nanf(""));
  auto out_a = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "out a");
  auto out_b = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "out b");
  const kernels::AttentionShape shape{.n_heads = c.n_head,
                                      .n_kv_heads = c.n_kv,
                                      .head_dim = c.head_dim,
                                      .n_queries = 1,
                                      .start_pos = c.pos,
                                      .window = c.window,
                                      .row = c.row};
  ASSERT_TRUE(kernels::attention_decode_takes_fresh(ctx, shape));
  auto scratch = ctx.create_buffer(std::max<uint64_t>(16, kernels::attention_decode_scratch_bound(shape, ca)),
                                   WGPUBufferUsage_Storage, "scratch");
  const RopeType type = c.neox ? RopeType::Neox : RopeType::Normal;
  const float eps = 1e-6f;
  gpu::ComputeBatch batch(ctx, c.name);
  const kernels::QkNormRopeKvShape qk{.n_head = c.n_head,
                                      .n_kv = c.n_kv,
                                      .head_dim = c.head_dim,
                                      .rope_dim = c.rope_dim,
                                      .type = type,
                                      .pos = c.pos,
                                      .eps = eps,
                                      .norm = c.norm,
                                      .row = c.row,
                                      .v_norm = c.v_norm};
  if (c.append)
    kernels::encode_qk_norm_rope_kv(batch, ctx, qk, table, qa, kb, vb, qn, kn, ca);
  else
    kernels::encode_qk_norm_rope_q(batch, ctx, qk, table, qa, qn);
  kernels::encode_attention_decode(batch, ctx, shape, qa, ca, out_a, &scratch);
  const kernels::FreshToken fresh{.k = &kb,
                                  .v = &vb,
                                  .q_norm = c.norm ? &qn : nullptr,
                                  .k_norm = c.norm ? &kn : nullptr,
                                  .table = &table,
                                  .rope_dim = c.rope_dim,
                                  .type = type,
                                  .eps = eps,
                                  .v_norm = c.v_norm,
                                  .append = c.append};
  kernels::encode_attention_decode_fresh(batch, ctx, shape, qb, fresh, cb, out_b, &scratch);
  batch.submit_and_wait();

  const auto ga = ctx.read<float>(out_a), gb = ctx.read<float>(out_b);
  const size_t at = size_t(c.row) * qd;
  for (size_t i = 0; i < at; ++i) ASSERT_TRUE(std::isnan(gb[i])) << "out element " << i << " of an earlier row written";
  double worst = 0;
  for (size_t i = at; i < ga.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gb[i])) << "out element " << i;
    worst = std::max(worst, double(std::fabs(ga[i] - gb[i])));
  }
  EXPECT_EQ(std::memcmp(ga.data() + at, gb.data() + at, size_t(qd) * 4), 0)
      << "the output is not the two dispatches' bits (largest difference " << worst << ")";
  std::vector<float> ka, va, kb2, vb2;
  ca.read(0, filled, ka, va);
  cb.read(0, filled, kb2, vb2);
  EXPECT_EQ(std::memcmp(ka.data(), kb2.data(), ka.size() * 4), 0) << "the caches' K differ";
  EXPECT_EQ(std::memcmp(va.data(), vb2.data(), va.size() * 4), 0) << "the caches' V differ";
  // the token's row was written (it differs from the random row before; q alone: it was not), its neighbours were not
  const size_t row_at = size_t(c.pos) * kvd;
  EXPECT_EQ(std::memcmp(kb2.data() + row_at, before_k.data() + row_at, size_t(kvd) * 4) != 0, c.append) << "K row";
  EXPECT_EQ(std::memcmp(vb2.data() + row_at, before_v.data() + row_at, size_t(kvd) * 4) != 0, c.append) << "V row";
  EXPECT_EQ(std::memcmp(kb2.data(), before_k.data(), row_at * 4), 0) << "an earlier K row changed";
  EXPECT_EQ(std::memcmp(kb2.data() + row_at + kvd, before_k.data() + row_at + kvd, (kb2.size() - row_at - kvd) * 4), 0)
      << "a later K row changed";
  EXPECT_EQ(std::memcmp(ctx.read<float>(qb).data() + at, q.data() + at, size_t(qd) * 4), 0) << "q changed";
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionDecodeFresh, ::testing::ValuesIn(kFreshCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Several sequences' tokens at once (continuous batching): encode_attention_decode_rows_fresh against
// encode_qk_norm_rope_kv_rows then encode_attention_decode_rows, over views of one pool of shuffled pages: the same
// output bits, the same pool bits. Three sequences: one at position 0, one whose token starts its second page, one
// deep enough for two splits; with the q/k norms and with RoPE alone, f16 and f32 caches. Without append (q alone over
// caches that hold the token already): encode_qk_norm_rope_q per sequence then the attention rows, the caches
// untouched.
TEST(AttentionDecodeFreshRows, SameBitsAsQkNormRopeKvRowsThenAttentionRows) {
  gpu::Context& ctx = per_head_context();
  const uint32_t n_head = 4, n_kv = 2, hd = 128, page = 128, pages = 4, S = 3;
  const uint32_t qd = n_head * hd, kvd = n_kv * hd;
  const uint32_t positions[S] = {0, 128, 300};
  struct Case {
    bool norm;
    KvType type;
    bool append;
  };
  for (const Case cs :
       {Case{true, KvType::F16, true}, Case{false, KvType::F32, true}, Case{true, KvType::F16, false}}) {
    const bool norm = cs.norm;
    const KvType type = cs.type;
    SCOPED_TRACE(std::string(norm ? "q/k norms" : "RoPE alone") + (type == KvType::F16 ? ", f16" : ", f32") +
                 (cs.append ? "" : ", q alone"));
    auto gen = rng(norm ? (cs.append ? 7 : 9) : 8);
    const kernels::KvCacheConfig config{.kv_dim = kvd,
                                        .max_seq = S * pages * page,
                                        .page_size = page,
                                        .type = type,
                                        .page_order = shuffled_pages(S * pages * page, page, 99)};
    kernels::KvCache owner_a(ctx, config, "a"), owner_b(ctx, config, "b");
    std::vector<kernels::KvCache> views_a, views_b;
    std::vector<std::vector<float>> written_k(S), written_v(S);
    std::vector<uint32_t> rows(S * 4), queries(S * 2);
    uint32_t max_pos = 0;
    for (uint32_t i = 0; i < S; ++i) {
      views_a.emplace_back(owner_a, i * pages, pages, "view a");
      views_b.emplace_back(owner_b, i * pages, pages, "view b");
      const uint32_t filled = positions[i] + 2;  // the earlier keys, and random rows at and after the token's
      const auto old_k = random_floats(size_t(filled) * kvd, gen), old_v = random_floats(size_t(filled) * kvd, gen);
      views_a[i].write(0, filled, old_k, old_v);
      views_b[i].write(0, filled, old_k, old_v);
      views_b[i].read(0, filled, written_k[i], written_v[i]);
      const kernels::KvCache::Location at = views_a[i].locate(positions[i]);
      rows[i * 4] = positions[i];
      rows[i * 4 + 1] = uint32_t(at.k_elem);
      rows[i * 4 + 2] = uint32_t(at.v_elem);
      queries[i * 2] = positions[i];
      queries[i * 2 + 1] = views_a[i].page_base();
      max_pos = std::max(max_pos, positions[i]);
    }
    const auto q = random_floats(size_t(S) * qd, gen, -3.f, 3.f);
    auto qa = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q a");
    auto qb = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q b");
    auto kb = ctx.upload<float>(random_floats(size_t(S) * kvd, gen, -3.f, 3.f), WGPUBufferUsage_Storage, "k");
    auto vb = ctx.upload<float>(random_floats(size_t(S) * kvd, gen, -3.f, 3.f), WGPUBufferUsage_Storage, "v");
    auto qn = ctx.upload<float>(random_floats(hd, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "q_norm");
    auto kn = ctx.upload<float>(random_floats(hd, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "k_norm");
    auto table = kernels::upload_rope_table(ctx, hd, 1e6f);
    auto rows_buf = ctx.upload<uint32_t>(rows, WGPUBufferUsage_Storage, "rows");
    auto queries_buf = ctx.upload<uint32_t>(queries, WGPUBufferUsage_Storage, "queries");
    const std::vector<float> poison(size_t(S) * qd, std::nanf(""));
    auto out_a = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "out a");
    auto out_b = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "out b");
    const kernels::AttentionShape shape{.n_heads = n_head, .n_kv_heads = n_kv, .head_dim = hd, .n_queries = S};
    ASSERT_TRUE(kernels::attention_decode_rows_take_fresh(ctx, shape));
    auto scratch = ctx.create_buffer(
        std::max<uint64_t>(16, kernels::attention_decode_rows_scratch_bytes(shape, views_a[0], max_pos)),
        WGPUBufferUsage_Storage, "scratch");
    const float eps = 1e-6f;
    gpu::ComputeBatch batch(ctx, "rows");
    const kernels::QkNormRopeKvShape qk{.n_head = n_head,
                                        .n_kv = n_kv,
                                        .head_dim = hd,
                                        .rope_dim = hd,
                                        .type = RopeType::Neox,
                                        .eps = eps,
                                        .norm = norm};
    if (cs.append) {
      kernels::encode_qk_norm_rope_kv_rows(batch, ctx, qk, S, table, qa, kb, vb, qn, kn, owner_a, rows_buf);
    } else {
      for (uint32_t i = 0; i < S; ++i) {
        kernels::QkNormRopeKvShape one = qk;
        one.pos = positions[i];
        one.row = i;
        kernels::encode_qk_norm_rope_q(batch, ctx, one, table, qa, qn);
      }
    }
    kernels::encode_attention_decode_rows(batch, ctx, shape, qa, owner_a, views_a[0], queries_buf, max_pos, out_a,
                                          scratch);
    const kernels::FreshToken fresh{.k = &kb,
                                    .v = &vb,
                                    .q_norm = norm ? &qn : nullptr,
                                    .k_norm = norm ? &kn : nullptr,
                                    .table = &table,
                                    .type = RopeType::Neox,
                                    .eps = eps,
                                    .append = cs.append};
    kernels::encode_attention_decode_rows_fresh(batch, ctx, shape, qb, fresh, owner_b, views_b[0], queries_buf, max_pos,
                                                out_b, scratch);
    batch.submit_and_wait();
    const auto ga = ctx.read<float>(out_a), gb = ctx.read<float>(out_b);
    for (float v : gb) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * 4), 0) << "the output is not the two dispatches' bits";
    for (uint32_t i = 0; i < S; ++i) {
      std::vector<float> ka, va, kb2, vb2;
      views_a[i].read(0, positions[i] + 2, ka, va);
      views_b[i].read(0, positions[i] + 2, kb2, vb2);
      EXPECT_EQ(std::memcmp(ka.data(), kb2.data(), ka.size() * 4), 0) << "sequence " << i << ": the caches' K differ";
      EXPECT_EQ(std::memcmp(va.data(), vb2.data(), va.size() * 4), 0) << "sequence " << i << ": the caches' V differ";
      if (!cs.append) {  // q alone writes nothing: the cache as written
        EXPECT_EQ(std::memcmp(kb2.data(), written_k[i].data(), kb2.size() * 4), 0) << "sequence " << i << ": K written";
        EXPECT_EQ(std::memcmp(vb2.data(), written_v[i].data(), vb2.size() * 4), 0) << "sequence " << i << ": V written";
      }
    }
    EXPECT_EQ(std::memcmp(ctx.read<float>(qb).data(), q.data(), q.size() * 4), 0) << "q changed";
  }
}

TEST(AttentionDecodeFreshArgs, RefusedWhereTheFusedKernelCannotRunNamingWhy) {
  gpu::Context& ctx = per_head_context();
  kernels::KvCache kv(ctx, {.kv_dim = 64, .max_seq = 8});
  auto table = kernels::upload_rope_table(ctx, 32, 10000.f);
  auto buf = ctx.create_buffer(4096, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096, WGPUBufferUsage_Storage, "other");
  auto out = ctx.create_buffer(4096, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx, "bad");
  const kernels::AttentionShape ok{.n_heads = 4, .n_kv_heads = 2, .head_dim = 32, .n_queries = 1, .start_pos = 3};
  const kernels::FreshToken fresh{.k = &other, .v = &other, .table = &table};
  auto run = [&](kernels::AttentionShape s, kernels::FreshToken f) {
    kernels::encode_attention_decode_fresh(batch, ctx, s, buf, f, kv, out, nullptr);
  };
  EXPECT_NO_THROW(run(ok, fresh));
  kernels::AttentionShape two = ok;
  two.n_queries = 2;
  EXPECT_FALSE(kernels::attention_decode_takes_fresh(ctx, two));
  expect_throw([&] { run(two, fresh); }, "one query");
  // the suite's own context: on CPU adapters decode takes the grouped kernel from depth 0, which has no fused form
  EXPECT_EQ(kernels::attention_decode_takes_fresh(context(), ok), kernels::decode_gqa_from(context()) > ok.start_pos);
  kernels::FreshToken f = fresh;
  f.table = nullptr;
  expect_throw([&] { run(ok, f); }, "fresh.table");
  f = fresh;
  f.k = &buf;
  expect_throw([&] { run(ok, f); }, "q must be another buffer");
  f = fresh;
  f.q_norm = &other;
  expect_throw([&] { run(ok, f); }, "go together");
  f = fresh;
  f.rope_dim = 34;
  expect_throw([&] { run(ok, f); }, "rope_dim");
  f = fresh;
  f.append = false;
  f.k = f.v = nullptr;
  EXPECT_NO_THROW(run(ok, f));  // q alone reads no k or v
  f.k = f.v = &buf;
  EXPECT_NO_THROW(run(ok, f));
  kernels::AttentionShape past = ok;
  past.start_pos = 8;
  expect_throw([&] { run(past, fresh); }, "max_seq");
}

}  // namespace
}  // namespace wgllm::test

// qwen3's decode step between the q/k/v product and attention (qk_norm_rope_kv.wgsl) vs the CPU reference.
#include <cmath>
#include <cstring>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/kv_cache.h"
#include "kernels/qk_norm_rope_kv.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::RopeScaling;
using kernels::RopeType;

// qwen3's decode step between the q/k/v product and attention: per-head q/k norm, RoPE, the KV append.
struct QkNormCase {
  const char* name;
  uint32_t n_head, n_kv, head_dim, rope_dim;
  bool neox;
  uint32_t pos, max_seq, page_size;
  kernels::KvType kv_type;
  uint32_t row = 0;     // the token's row in q, k, v (the rows before it are poison the kernel must leave alone)
  bool norm = true;     // off: RoPE and the append alone
  bool v_norm = false;  // v's heads RMS-normalised without gain (Gemma 4)
};
const QkNormCase kQkNormCases[] = {
    {"normal_f16cache_d64", 4, 2, 64, 64, false, 9, 32, 0, kernels::KvType::F16},
    {"neox_f32cache_d128_paged", 8, 2, 128, 128, true, 300, 512, 128, kernels::KvType::F32},
    {"neox_partial_f16cache_d256", 2, 1, 256, 128, true, 127, 256, 128, kernels::KvType::F16},
    {"normal_partial_f32cache_d512_two_pairs_a_thread", 2, 1, 512, 256, false, 0, 4, 0, kernels::KvType::F32},
    {"neox_f16cache_d8", 3, 3, 8, 8, true, 40, 64, 0, kernels::KvType::F16},
    {"neox_row3_without_norm", 4, 2, 64, 64, true, 17, 256, 128, kernels::KvType::F32, 3, false},
    {"normal_row1_with_norm_f16cache", 8, 4, 32, 32, false, 5, 16, 0, kernels::KvType::F16, 1, true},
    {"normal_row2_without_norm_partial", 2, 1, 128, 64, false, 0, 8, 0, kernels::KvType::F16, 2, false},
    {"neox_v_norm_d512_f16cache", 8, 1, 512, 512, true, 170, 256, 128, kernels::KvType::F16, 0, true, true},
    {"neox_v_norm_row2_d256_partial_f32cache", 8, 2, 256, 128, true, 3, 16, 0, kernels::KvType::F32, 2, true, true},
    {"normal_v_norm_d6_without_qk_norm", 2, 3, 6, 6, false, 1, 8, 0, kernels::KvType::F32, 1, false, true},
};
std::ostream& operator<<(std::ostream& o, const QkNormCase& c) { return o << c.name; }

class QkNormRopeKvTable : public ::testing::TestWithParam<QkNormCase> {};

TEST_P(QkNormRopeKvTable, MatchesCpuReference) {
  const QkNormCase& c = GetParam();
  auto& ctx = context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_kv * c.head_dim;
  const auto q = random_floats(qd, gen, -3.f, 3.f), k = random_floats(kvd, gen, -3.f, 3.f),
             v = random_floats(kvd, gen, -3.f, 3.f);
  const auto qn = random_floats(c.head_dim, gen, 0.5f, 1.5f), kn = random_floats(c.head_dim, gen, 0.5f, 1.5f);
  // The token at row c.row; the rows before it poison.
  auto at_row = [&](const std::vector<float>& x) {
    std::vector<float> all(x.size() * c.row, std::nanf(""));
    all.insert(all.end(), x.begin(), x.end());
    return all;
  };
  auto qb = ctx.upload<float>(at_row(q), WGPUBufferUsage_Storage, "q");
  auto q_alone = ctx.upload<float>(at_row(q), WGPUBufferUsage_Storage, "q alone");
  auto kb = ctx.upload<float>(at_row(k), WGPUBufferUsage_Storage, "k");
  auto vb = ctx.upload<float>(at_row(v), WGPUBufferUsage_Storage, "v");
  auto qnb = ctx.upload<float>(qn, WGPUBufferUsage_Storage, "q_norm");
  auto knb = ctx.upload<float>(kn, WGPUBufferUsage_Storage, "k_norm");
  const double base = 500000.0;
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, float(base));
  kernels::KvCache kv(ctx,
                      {.kv_dim = kvd,
                       .max_seq = c.max_seq,
                       .page_size = c.page_size,
                       .type = c.kv_type,
                       .page_order = shuffled_pages(c.max_seq, c.page_size, salt)},
                      c.name);
  const AppendedRowCheck row(kv, c.pos, gen);
  const float eps = 1e-6f;
  gpu::ComputeBatch batch(ctx, c.name);
  const kernels::QkNormRopeKvShape shape{.n_head = c.n_head,
                                         .n_kv = c.n_kv,
                                         .head_dim = c.head_dim,
                                         .rope_dim = c.rope_dim,
                                         .type = c.neox ? RopeType::Neox : RopeType::Normal,
                                         .pos = c.pos,
                                         .eps = eps,
                                         .norm = c.norm,
                                         .row = c.row,
                                         .v_norm = c.v_norm};
  kernels::encode_qk_norm_rope_kv(batch, ctx, shape, table, qb, kb, vb, qnb, knb, kv);
  kernels::encode_qk_norm_rope_q(batch, ctx, shape, table, q_alone, qnb);
  batch.submit_and_wait();
  const auto normed_q = c.norm ? cpu::rms_norm(q, qn, c.n_head, c.head_dim, eps) : q;
  const auto normed_k = c.norm ? cpu::rms_norm(k, kn, c.n_kv, c.head_dim, eps) : k;
  const auto want_q = cpu::rope(normed_q, 1, c.n_head, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto want_k = cpu::rope(normed_k, 1, c.n_kv, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto got_q = ctx.read<float>(qb);
  for (size_t i = 0; i < size_t(qd) * c.row; ++i) ASSERT_TRUE(std::isnan(got_q[i])) << "q element " << i << " written";
  const auto rq = compare(std::vector<float>(got_q.begin() + size_t(qd) * c.row, got_q.end()), want_q);
  EXPECT_LE(rq.rel_l2, 1e-5) << "q: " << rq.describe();
  // q alone (encode_qk_norm_rope_q): the very bits of the q heads above, the earlier rows untouched
  const auto got_alone = ctx.read<float>(q_alone);
  EXPECT_EQ(std::memcmp(got_alone.data(), got_q.data(), got_q.size() * 4), 0) << "q alone differs";
  row.expect(kv, want_k, c.v_norm ? cpu::rms_norm(v, std::vector<float>(c.head_dim, 1.f), c.n_kv, c.head_dim, eps) : v);
}

INSTANTIATE_TEST_SUITE_P(Cases, QkNormRopeKvTable, ::testing::ValuesIn(kQkNormCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(QkNormRopeKv, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  kernels::KvCache kv(ctx, {.kv_dim = 32, .max_seq = 8});
  auto table = kernels::upload_rope_table(ctx, 16, 10000.f);
  auto buf = ctx.create_buffer(1024, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(1024, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx, "bad");
  const kernels::QkNormRopeKvShape ok{.n_head = 4, .n_kv = 2, .head_dim = 16, .pos = 3};
  auto run = [&](kernels::QkNormRopeKvShape s, const gpu::Buffer& q, const gpu::Buffer& k) {
    kernels::encode_qk_norm_rope_kv(batch, ctx, s, table, q, k, other, buf, buf, kv);
  };
  EXPECT_NO_THROW(run(ok, buf, other));
  auto with = [&](auto change) {
    kernels::QkNormRopeKvShape s = ok;
    change(s);
    return s;
  };
  expect_throw([&] { run(with([](auto& s) { s.n_kv = 3; }), buf, other); }, "kv_dim");
  expect_throw([&] { run(with([](auto& s) { s.pos = 8; }), buf, other); }, "max_seq");
  expect_throw([&] { run(with([](auto& s) { s.rope_dim = 18; }), buf, other); }, "rope_dim");
  expect_throw([&] { run(with([](auto& s) { s.head_dim = 1024; }), buf, other); }, "head_dim");
  expect_throw([&] { run(with([](auto& s) { s.eps = 0; }), buf, other); }, "eps");
  expect_throw([&] { run(ok, small, other); }, "q holds");
  expect_throw([&] { run(ok, other, other); }, "q must be another buffer");
}

}  // namespace
}  // namespace wgllm::test

// The decode step's fused q/k/v product with RoPE and the KV append (encode_qkv_rope_append) vs the CPU reference.
#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/kv_cache.h"
#include "kernels/matmul.h"
#include "kernels/qkv_rope_append.h"
#include "kernels/rope.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

// The decode epilogue of the stacked q/k/v product: q rotated into y, k rotated and v written
// into the cache at one position (through the page table, into the right pool).
struct RopeKvCase {
  const char* name;
  GgufType type;
  uint32_t n_in, n_head, n_kv, head_dim, rope_dim, pos, max_seq, page_size;
  kernels::KvType kv_type;
  bool bias;
  bool neox = false;
};
const RopeKvCase kRopeKvCases[] = {
    {"neox_f16_f16cache_bias", F16, 128, 4, 2, 32, 32, 7, 64, 0, kernels::KvType::F16, true, true},
    {"neox_q8_0_f32cache_partial_rope_paged", Q8_0, 64, 2, 2, 64, 32, 200, 512, 128, kernels::KvType::F32, false, true},
    {"neox_f32_f16cache_page_edge_bias", F32, 32, 8, 2, 128, 128, 127, 256, 128, kernels::KvType::F16, true, true},
    {"f16_f16cache", F16, 128, 4, 2, 16, 16, 5, 64, 0, kernels::KvType::F16, false},
    {"q8_0_f32cache_partial_rope_bias_paged", Q8_0, 96, 6, 2, 32, 16, 300, 512, 128, kernels::KvType::F32, true},
    {"bf16_f16cache_page_edge_bias", BF16, 64, 4, 4, 64, 64, 255, 512, 128, kernels::KvType::F16, true},
    {"q4_0_f16cache_first_position", Q4_0, 64, 2, 1, 64, 32, 0, 8, 0, kernels::KvType::F16, false},
    // a Q4_K_M layer: q and k in Q4_K, v in Q6_K
    {"q4_k_f16cache_bias_paged", Q4_K, 256, 4, 2, 32, 32, 200, 256, 128, kernels::KvType::F16, true},
    {"neox_q4_k_f32cache_partial_rope", Q4_K, 512, 6, 2, 64, 32, 3, 16, 0, kernels::KvType::F32, false, true},
    {"neox_mxfp4_f32cache_bias", MXFP4, 96, 4, 2, 32, 32, 9, 64, 0, kernels::KvType::F32, true, true},
    // > one binding of K/V on a 128 MiB adapter: the position lives in the second pool.
    {"f32_multi_pool", F32, 32, 8, 8, 128, 128, 16000, 129 * 128, 128, kernels::KvType::F32, false},
};

// How the q, k and v rows come: one weight; two (as a Q4_K_M file's layers whose v is Q6_K), q and k rows in the
// case's type and v rows in another, one dispatch each (the v dispatch must leave its y alone); or two weights of
// block types read by one dispatch (QkvRopeAppend::v).
enum class Split { None, TwoDispatches, OneDispatch };

// v's type beside the case's: a block type for one dispatch (Q6_K as in Q4_K_M where the rows take K-quants).
GgufType v_type_for(const RopeKvCase& c, Split split) {
  if (split == Split::None) return c.type;
  if (split == Split::TwoDispatches) return c.type == GgufType::F16 ? GgufType::Q8_0 : GgufType::F16;
  return c.n_in % 256 == 0 && c.type != GgufType::Q6_K ? GgufType::Q6_K
         : c.type == GgufType::Q8_0                    ? GgufType::Q4_0
                                                       : GgufType::Q8_0;
}

void check_rope_kv(gpu::Context& ctx, const RopeKvCase& c, Split split = Split::None) {
  const uint64_t salt = std::hash<std::string>{}(c.name) + uint64_t(split);
  auto gen = rng(salt);
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_kv * c.head_dim, N = qd + 2 * kvd;
  const GgufType v_type = v_type_for(c, split);
  const uint32_t n_qk = split != Split::None ? qd + kvd : N;  // rows of the first weight
  const auto bytes = random_weight(c.type, c.n_in, n_qk, gen);
  const auto v_bytes = random_weight(v_type, c.n_in, kvd, gen);  // drawn either way: the same x, norm, bias
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, n_qk, bytes, c.name);
  const auto wv = kernels::upload_weight(ctx, v_type, c.n_in, kvd, v_bytes, "wv");
  const auto x = random_floats(c.n_in, gen, -2.f, 2.f);
  auto norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
  std::vector<float> bias;
  if (c.bias) bias = random_floats(N, gen);
  std::vector<float> padded = norm;
  padded.resize((c.n_in + 7) / 8 * 8, 0.f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto nbuf = ctx.upload<float>(padded, WGPUBufferUsage_Storage, "norm");
  std::optional<gpu::Buffer> bbuf, vbbuf;
  if (c.bias) {  // one dispatch: all three
    bbuf = ctx.upload<float>(std::span(bias).first(split == Split::OneDispatch ? N : n_qk), WGPUBufferUsage_Storage,
                             "bias");
    vbbuf = ctx.upload<float>(std::span(bias).last(kvd), WGPUBufferUsage_Storage, "v bias");
  }
  const std::vector<float> poison(qd, std::nanf(""));
  auto y = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "q");
  auto y_unused = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "q unused");
  const double base = 10000.0;
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, float(base));
  kernels::KvCache kv(ctx,
                      {.kv_dim = kvd,
                       .max_seq = c.max_seq,
                       .page_size = c.page_size,
                       .type = c.kv_type,
                       .page_order = shuffled_pages(c.max_seq, c.page_size, salt)},
                      c.name);
  const AppendedRowCheck row(kv, c.pos, gen);
  kernels::QkvRopeAppend a{.table = &table,
                           .head_dim = c.head_dim,
                           .rope_dim = c.rope_dim,
                           .neox = c.neox,
                           .pos = c.pos,
                           .kv = &kv,
                           .bias = c.bias ? &*bbuf : nullptr,
                           .norm = &nbuf,
                           .eps = 1e-5f,
                           .rows = split != Split::None ? kernels::QkvRows::Qk : kernels::QkvRows::Qkv,
                           .v = split == Split::OneDispatch ? &wv : nullptr};
  gpu::ComputeBatch batch(ctx, c.name);
  if (split == Split::OneDispatch && !kernels::detail::matvec_takes_second(ctx, w, wv)) {
    // a float type's q/k, or a CPU adapter's Rows kernel
    EXPECT_FALSE(kernels::qkv_rope_append_supported(ctx, w, a));
    EXPECT_TRUE(block_elems(c.type) == 1 || kernels::rows_kernel_for(ctx, c.type)) << "two block types declined";
    expect_throw([&] { kernels::encode_qkv_rope_append(batch, ctx, w, xbuf, y, a); }, "matvec_takes_second");
    return;
  }
  if (!kernels::qkv_rope_append_supported(ctx, w, a)) {  // neox under a matvec shape of 2 rows per group
    EXPECT_EQ(kernels::matvec_config(ctx, n_qk + (a.v ? kvd : 0), c.n_in).rows % 4, 2u);
    expect_throw([&] { kernels::encode_qkv_rope_append(batch, ctx, w, xbuf, y, a); }, "neox");
    return;
  }
  if (split ==
      Split::TwoDispatches) {  // v first, into a y of its own: the q/k dispatch after it would hide a stray write to y
    kernels::QkvRopeAppend av = a;
    av.rows = kernels::QkvRows::V;
    av.bias = c.bias ? &*vbbuf : nullptr;
    kernels::encode_qkv_rope_append(batch, ctx, wv, xbuf, y_unused, av);
  }
  kernels::encode_qkv_rope_append(batch, ctx, w, xbuf, y, a);
  batch.submit_and_wait();

  const auto xin = cpu::rms_norm(x, norm, 1, c.n_in, 1e-5f);
  auto full = cpu::matmul(c.type, bytes, c.n_in, n_qk, xin, 1, std::span(bias).first(c.bias ? n_qk : 0));
  if (split != Split::None) {
    const auto v = cpu::matmul(v_type, v_bytes, c.n_in, kvd, xin, 1, std::span(bias).last(c.bias ? kvd : 0));
    full.insert(full.end(), v.begin(), v.end());
  }
  const std::vector<float> q(full.begin(), full.begin() + qd), k(full.begin() + qd, full.begin() + qd + kvd),
      v(full.begin() + qd + kvd, full.end());
  const auto want_q = cpu::rope(q, 1, c.n_head, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto want_k = cpu::rope(k, 1, c.n_kv, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto rq = compare(ctx.read<float>(y), want_q);
  EXPECT_LE(rq.rel_l2, 1e-5) << "q: " << rq.describe();
  for (float f : ctx.read<float>(y_unused)) ASSERT_TRUE(std::isnan(f)) << "the v dispatch wrote to y";
  row.expect(kv, want_k, v);
}

std::ostream& operator<<(std::ostream& o, const RopeKvCase& c) { return o << c.name; }

class RopeKvTable : public ::testing::TestWithParam<RopeKvCase> {};

TEST_P(RopeKvTable, MatchesCpuReference) {
  check_rope_kv(context(), GetParam());  // on CPU adapters: the Rows kernel (matmul_rows.wgsl)
  {
    SCOPED_TRACE("q and k, then v in another type");
    check_rope_kv(context(), GetParam(), Split::TwoDispatches);
    SCOPED_TRACE("q and k, and v in another type in the same dispatch");
    check_rope_kv(context(), GetParam(), Split::OneDispatch);
  }
  // and the matvec in the shapes GPUs use (shuffle-only reduction, workgroup memory, units in flight), the last
  // without subgroups
  for (const char* shape : {"32x4x4", "128x4x1", "16x2x2x3", "8x2x8"}) {
    SCOPED_TRACE(shape);
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = shape;
      o.rows_shape = "off";
      o.disable_subgroups = shape[0] == '8';
    }));
    check_rope_kv(ctx, GetParam());
    if (shape[0] == '3') check_rope_kv(ctx, GetParam(), Split::TwoDispatches);
    check_rope_kv(ctx, GetParam(), Split::OneDispatch);
  }
  // and the Rows kernel in another shape (two rows per invocation where the epilogue allows, no subgroups)
  gpu::Context rows(context_options([&](auto& o) {
    o.rows_shape = "8x2x1";
    o.disable_subgroups = true;
  }));
  if (rows.adapter().is_cpu()) check_rope_kv(rows, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeKvTable, ::testing::ValuesIn(kRopeKvCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(QkvRopeAppend, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  const auto bytes = std::vector<uint8_t>(size_t(64) * 128 * 4, 0);
  const auto w = kernels::upload_weight(ctx, GgufType::F32, 64, 128, bytes, "w");  // q 64, k 32, v 32 rows
  const auto narrow = kernels::upload_weight(ctx, GgufType::F32, 64, 64, std::span(bytes).first(64 * 64 * 4), "w");
  auto table = kernels::upload_rope_table(ctx, 16, 10000.f);
  kernels::KvCache kv(ctx, {.kv_dim = 32, .max_seq = 8});
  kernels::KvCache wide(ctx, {.kv_dim = 40, .max_seq = 8});  // q 48 rows, k and v 40: not whole heads of 16
  auto x = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(128 * 4, WGPUBufferUsage_Storage, "y");
  gpu::ComputeBatch batch(ctx, "bad");
  const kernels::QkvRopeAppend ok{.table = &table, .head_dim = 16, .rope_dim = 16, .pos = 3, .kv = &kv};
  auto run = [&](auto edit, const kernels::GpuWeight& weight, const gpu::Buffer& out) {
    kernels::QkvRopeAppend a = ok;
    edit(a);
    kernels::encode_qkv_rope_append(batch, ctx, weight, x, out, a);
  };
  const auto same = [](kernels::QkvRopeAppend&) {};
  EXPECT_NO_THROW(run(same, w, y));
  expect_throw([&] { run(same, narrow, y); }, "k and v rows");
  // q and k alone (96 rows), v alone (32 rows): the row counts must say so
  const auto qk = kernels::upload_weight(ctx, GgufType::F32, 64, 96, std::span(bytes).first(64 * 96 * 4), "wqk");
  const auto v = kernels::upload_weight(ctx, GgufType::F32, 64, 32, std::span(bytes).first(64 * 32 * 4), "wv");
  EXPECT_NO_THROW(run([](auto& a) { a.rows = kernels::QkvRows::Qk; }, qk, y));
  EXPECT_NO_THROW(run([](auto& a) { a.rows = kernels::QkvRows::V; }, v, y));
  expect_throw([&] { run([](auto& a) { a.rows = kernels::QkvRows::Qk; }, v, y); },
               "q rows and the cache's kv_dim 32 k rows");
  expect_throw([&] { run([](auto& a) { a.rows = kernels::QkvRows::V; }, qk, y); }, "kv_dim 32 v rows");
  // v's weight of its own: with rows Qk alone, and block types on the matvec (these are F32)
  expect_throw([&] { run([&](auto& a) { a.v = &v; }, qk, y); }, "takes rows Qk");
  expect_throw([&] { run([&](auto& a) { a.rows = kernels::QkvRows::Qk, a.v = &v; }, qk, y); }, "F32 then F32");
  expect_throw([&] { run([&](auto& a) { a.kv = &wide; }, w, y); }, "divide q's and k's rows");
  expect_throw([&] { run([](auto& a) { a.pos = 8; }, w, y); }, "max_seq");
  expect_throw([&] { run([](auto& a) { a.rope_dim = 18; }, w, y); }, "rope_dim");
  expect_throw([&] { run([](auto& a) { a.head_dim = 24; }, w, y); }, "head_dim");
  expect_throw([&] { run([](auto& a) { a.table = nullptr; }, w, y); }, "table");
  expect_throw([&] { run([](auto& a) { a.kv = nullptr; }, w, y); }, "KV cache");
  expect_throw([&] { run(same, w, x); }, "x and y");
  expect_throw([&] { run(same, kernels::GpuWeight{}, y); }, "weight");
}

}  // namespace
}  // namespace wgllm::test

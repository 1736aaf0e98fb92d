// The two decode attention kernels (per head, per GQA group) vs the CPU reference (float64) on fresh random inputs,
// outputs poisoned first: GQA ratios 1..16, head_dim 64 / 128 / 256, depths on both sides of the 128-key tiles and
// splits, paged caches with their pages shuffled, sliding windows, forced and automatic split counts; then the Auto
// choice by depth (ContextOptions::decode_gqa_from), the packed f16 view and the grouped kernel's own checks.
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <tuple>

#include "cpu/attention.h"
#include "gguf/half.h"
#include "kernels/attention.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

using kernels::AttentionShape;
using kernels::DecodeKernel;
using kernels::KvCache;
using kernels::KvType;

struct DecodeCase {
  const char* name;
  uint32_t n_heads, n_kv_heads, head_dim;
  uint32_t depth;            // the first query's position: keys [0, depth] (or the window's)
  uint32_t page_size = 128;  // 0: one contiguous page; else pages in a shuffled order
  uint32_t n_splits = 0;     // 0: the kernel's own choice
  uint32_t window = 0;
  uint32_t n_queries = 1;  // > 1: consecutive positions, as a decode call may carry
  KvType kv_type = KvType::F16;
  uint32_t row_pad = 0;  // floats between q / out rows beyond n_heads * head_dim
  bool sinks = false;    // per-head attention sinks (gpt-oss)
};

// The GPU output of one decode call and the reference, on inputs drawn from `salt`.
struct DecodeRun {
  std::vector<float> got, want;
  ErrorReport error;
};

DecodeRun run_decode(gpu::Context& ctx, const DecodeCase& c, DecodeKernel kernel, uint64_t salt) {
  auto gen = rng(salt);
  const uint32_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim, stride = q_dim + c.row_pad;
  const uint32_t seq = c.depth + c.n_queries;
  const uint32_t max_seq = c.page_size ? (seq + 5 + c.page_size - 1) / c.page_size * c.page_size : seq + 5;
  KvCache kv(ctx,
             {.kv_dim = kv_dim,
              .max_seq = max_seq,
              .page_size = c.page_size,
              .type = c.kv_type,
              .page_order = shuffled_pages(max_seq, c.page_size, salt)},
             c.name);
  auto k = random_floats(size_t(seq) * kv_dim, gen, -2.f, 2.f);
  auto v = random_floats(size_t(seq) * kv_dim, gen, -1.f, 1.f);
  if (c.kv_type == KvType::F16)  // what the cache holds, so the reference sees the same keys and values
    for (auto* x : {&k, &v})
      for (float& f : *x) f = f16_to_f32(f32_to_f16(f));
  kv.write(0, seq, k, v);
  auto q = random_floats(size_t(c.n_queries) * stride, gen, -2.f, 2.f);
  auto qbuf = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
  auto out = ctx.create_buffer(size_t(c.n_queries) * stride * 4, WGPUBufferUsage_Storage, "out");
  const std::vector<uint32_t> poison(size_t(c.n_queries) * stride, kPoison);
  ctx.write_buffer(out, 0, poison.data(), out.size);

  // sinks from well below to well above the scores (|q.k| * scale <= 16 here): some heads barely notice theirs,
  // some are mostly sink
  const auto sinks = random_floats(c.sinks ? c.n_heads : 0, gen, -4.f, 8.f);
  const gpu::Buffer sink_buf = c.sinks ? ctx.upload<float>(sinks, WGPUBufferUsage_Storage, "sinks") : gpu::Buffer{};
  const AttentionShape shape{.n_heads = c.n_heads,
                             .n_kv_heads = c.n_kv_heads,
                             .head_dim = c.head_dim,
                             .n_queries = c.n_queries,
                             .start_pos = c.depth,
                             .q_stride = stride,
                             .out_stride = stride,
                             .window = c.window,
                             .sinks = c.sinks ? &sink_buf : nullptr};
  const uint32_t splits = c.n_splits ? c.n_splits : kernels::attention_decode_splits(shape, kv, kernel);
  const uint64_t scratch_bytes = std::max(kernels::attention_decode_scratch_bytes(shape, splits),
                                          kernels::attention_decode_scratch_bound(shape, kv));
  auto scratch = ctx.create_buffer(std::max<uint64_t>(scratch_bytes, 16), WGPUBufferUsage_Storage, "partials");
  {
    gpu::ComputeBatch batch(ctx, c.name);
    kernels::encode_attention_decode(batch, ctx, shape, qbuf, kv, out, &scratch, c.n_splits, kernel);
    batch.submit_and_wait();
  }
  const auto got_rows = ctx.read<float>(out);

  DecodeRun r;
  std::vector<float> q_dense(size_t(c.n_queries) * q_dim);
  r.got.resize(q_dense.size());
  for (uint32_t i = 0; i < c.n_queries; ++i) {
    std::copy_n(&q[size_t(i) * stride], q_dim, &q_dense[size_t(i) * q_dim]);
    std::copy_n(&got_rows[size_t(i) * stride], q_dim, &r.got[size_t(i) * q_dim]);
    for (uint32_t f = q_dim; f < stride; ++f)  // the padding between rows stays poisoned
      EXPECT_EQ(std::bit_cast<uint32_t>(got_rows[size_t(i) * stride + f]), kPoison) << c.name << " row " << i;
  }
  const cpu::AttentionRef ref{
      c.n_heads, c.n_kv_heads, c.head_dim, c.n_queries, c.depth, 1.0f / std::sqrt(float(c.head_dim)), c.window, sinks};
  r.want = cpu::attention(ref, q_dense, k, v);
  r.error = compare(r.got, r.want);
  return r;
}

// name, heads, kv heads, head_dim, depth, page, splits, window, queries, kv type, row pad
const DecodeCase kCases[] = {
    // GQA ratios 1, 2, 4, 8 at the Llama-3.2-1B head_dim, across the first 128-key tile and split boundaries
    {"mha_d64_depth0", 4, 4, 64, 0},
    {"gqa2_d64_depth1", 4, 2, 64, 1},
    {"gqa4_d64_depth127", 8, 2, 64, 127},
    {"gqa8_d64_depth128", 8, 1, 64, 128},
    {"gqa4_d64_depth129", 32, 8, 64, 129},
    {"gqa8_d64_depth255", 16, 2, 64, 255},
    {"gqa2_d64_depth256", 4, 2, 64, 256},
    {"mha_d64_depth1000", 4, 4, 64, 1000},
    {"gqa4_d64_depth1500", 32, 8, 64, 1500},
    {"gqa8_d64_depth4100", 8, 1, 64, 4100},
    // head_dim 128 and 256 (workgroup memory grows with the group; the adapter may cap the heads per workgroup)
    {"gqa2_d128_depth129", 16, 8, 128, 129},
    {"gqa4_d128_depth1027", 8, 2, 128, 1027},
    {"gqa8_d128_depth383", 8, 1, 128, 383},
    {"gqa2_d256_depth1000", 4, 2, 256, 1000},
    {"gqa8_d256_depth300", 8, 1, 256, 300},
    {"gqa8_d512_depth300", 8, 1, 512, 300},  // Gemma 4's global heads
    {"gqa2_d512_depth1000_split7", 4, 2, 512, 1000, 128, 7},
    // groups the grouped kernel serves in parts or whole at odd sizes: 7 (Qwen2.5-0.5B), 16 (two blocks of 8), 6
    {"gqa7_d64_depth700", 14, 2, 64, 700},
    {"gqa16_d64_depth200", 16, 1, 64, 200},
    {"gqa6_d128_depth130", 12, 2, 128, 130},
    // head_dim 80 (KS = 6 key slices, 8 threads idle in P.V)
    {"gqa4_d80_depth500", 8, 2, 80, 500},
    // split counts forced: one, seven, more than the keys' tiles, more than the reduce's threads
    {"gqa4_d64_depth1000_nosplit", 8, 2, 64, 1000, 128, 1},
    {"gqa4_d128_depth1000_split7", 8, 2, 128, 1000, 128, 7},
    {"gqa2_d64_depth100_split9", 4, 2, 64, 100, 128, 9},
    {"gqa4_d64_depth9000_split150", 8, 2, 64, 9000, 256, 150},
    // contiguous cache, f32 cache, three queries in one call, strided rows
    {"gqa4_d64_depth600_contiguous", 8, 2, 64, 600, 0},
    {"gqa2_d128_depth500_f32", 4, 2, 128, 500, 128, 0, 0, 1, KvType::F32},
    {"gqa4_d64_depth200_q3", 8, 2, 64, 200, 128, 0, 0, 3},
    {"gqa2_d64_depth300_q3_split5_pad", 4, 2, 64, 300, 128, 5, 0, 3, KvType::F16, 12},
    // sliding windows: inside a tile, on a page edge, 1, covering everything
    {"swa100_gqa4_d64_depth1000", 8, 2, 64, 1000, 128, 0, 100},
    {"swa128_gqa2_d64_depth383_split2", 4, 2, 64, 383, 128, 2, 128},
    {"swa1_gqa8_d128_depth700", 8, 1, 128, 700, 128, 0, 1},
    {"swa512_gqa4_d256_depth700_split3", 4, 1, 256, 700, 128, 3, 512},
    {"swa_all_gqa4_d64_depth300", 8, 2, 64, 300, 128, 3, 301},
    // attention sinks: unsplit (the decode kernel normalises), split (the reduce does), windowed, several queries
    {"sinks_gqa4_d64_depth200_nosplit", 8, 2, 64, 200, 128, 1, 0, 1, KvType::F16, 0, true},
    {"sinks_gqa8_d64_depth1000_split5", 8, 1, 64, 1000, 128, 5, 0, 1, KvType::F16, 0, true},
    {"sinks_swa6_gqa2_d64_depth40", 4, 2, 64, 40, 128, 0, 6, 2, KvType::F16, 0, true},
    {"sinks_mha_d128_depth0", 4, 4, 128, 0, 128, 0, 0, 1, KvType::F32, 0, true},
};

using Param = std::tuple<DecodeCase, DecodeKernel>;

const char* kernel_name(DecodeKernel k) {
  return k == DecodeKernel::Grouped ? "grouped" : k == DecodeKernel::PerHead ? "per_head" : "auto";
}

void PrintTo(const Param& p, std::ostream* os) { *os << std::get<0>(p).name << " " << kernel_name(std::get<1>(p)); }

class AttentionDecodeKernels : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionDecodeKernels, MatchesCpuReference) {
  const auto& [c, kernel] = GetParam();
  const DecodeRun r = run_decode(context(), c, kernel, std::hash<std::string>{}(c.name) + uint64_t(kernel));
  // Keys and values are what the cache holds: only f32 arithmetic separates the kernels from the reference.
  EXPECT_LE(r.error.rel_l2, 2e-5) << kernel_name(kernel) << " " << c.name << ": " << r.error.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionDecodeKernels,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(DecodeKernel::PerHead, DecodeKernel::Grouped)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  kernel_name(std::get<1>(info.param));
                         });

TEST(AttentionDecode, GroupFitsTheAdapter) {
  auto& ctx = context();
  const uint32_t storage = ctx.limits().maxComputeWorkgroupStorageSize;
  for (const auto& [heads, kv_heads, dim] :
       {std::tuple{32u, 8u, 64u}, {14u, 2u, 64u}, {16u, 1u, 256u}, {4u, 4u, 128u}, {24u, 2u, 128u}, {5u, 1u, 256u}}) {
    const AttentionShape s{.n_heads = heads, .n_kv_heads = kv_heads, .head_dim = dim, .n_queries = 1};
    const uint32_t g = kernels::attention_decode_group(ctx, s);
    EXPECT_GE(g, 1u);
    EXPECT_LE(g, 8u);
    EXPECT_EQ((heads / kv_heads) % g, 0u) << heads << "/" << kv_heads;
    // gq, gprob, gmax + gsum, gacc: as attention_decode_gqa.wgsl declares them
    EXPECT_LE(uint64_t(g) * dim / 4 * 16 + g * 128 * 4 + 2 * g * 32 * 4 + 128 * 16, storage) << heads << "," << dim;
  }
  // the largest divisor of the group up to 8, when memory allows (16 KiB, WebGPU's floor, holds 8 heads of 256)
  if (storage >= 16384) {
    EXPECT_EQ(kernels::attention_decode_group(ctx, {.n_heads = 32, .n_kv_heads = 8, .head_dim = 64}), 4u);
    EXPECT_EQ(kernels::attention_decode_group(ctx, {.n_heads = 14, .n_kv_heads = 2, .head_dim = 64}), 7u);
    EXPECT_EQ(kernels::attention_decode_group(ctx, {.n_heads = 24, .n_kv_heads = 2, .head_dim = 128}), 6u);
    EXPECT_EQ(kernels::attention_decode_group(ctx, {.n_heads = 16, .n_kv_heads = 1, .head_dim = 256}), 8u);
    EXPECT_EQ(kernels::attention_decode_group(ctx, {.n_heads = 5, .n_kv_heads = 1, .head_dim = 64}), 5u);
  }
}

// Auto: per head below decode_gqa_from, grouped at or above; the depth is the last query's keys besides itself,
// capped by a sliding window.
TEST(AttentionDecode, AutoPicksTheKernelByDepth) {
  gpu::Context ctx(context_options([](auto& o) { o.decode_gqa_from = 300; }));
  const AttentionShape at{.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .n_queries = 1, .start_pos = 300};
  auto with = [&](uint32_t start_pos, uint32_t n_queries = 1, uint32_t window = 0) {
    AttentionShape s = at;
    s.start_pos = start_pos;
    s.n_queries = n_queries;
    s.window = window;
    return s;
  };
  EXPECT_EQ(kernels::attention_decode_depth(with(299)), 299u);
  EXPECT_EQ(kernels::attention_decode_depth(with(298, 3)), 300u);
  EXPECT_EQ(kernels::attention_decode_depth(with(5000, 1, 256)), 255u);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(299), DecodeKernel::Auto), DecodeKernel::PerHead);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(300), DecodeKernel::Auto), DecodeKernel::Grouped);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(298, 3), DecodeKernel::Auto), DecodeKernel::Grouped);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(5000, 1, 256), DecodeKernel::Auto), DecodeKernel::PerHead);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(0), DecodeKernel::Grouped), DecodeKernel::Grouped);
  EXPECT_EQ(kernels::resolve_decode_kernel(ctx, with(9000), DecodeKernel::PerHead), DecodeKernel::PerHead);
  EXPECT_EQ(kernels::decode_gqa_from(ctx), 300u);
  gpu::Context always(context_options([](auto& o) { o.decode_gqa_from = 0; }));
  EXPECT_EQ(kernels::resolve_decode_kernel(always, with(0), DecodeKernel::Auto), DecodeKernel::Grouped);
  // Unset: the adapter's (measured: the grouped kernel is ahead at every depth on lavapipe, from 8192 on the H200).
  auto& dflt = context();
  ASSERT_FALSE(dflt.options().decode_gqa_from.has_value());
  const uint32_t from = dflt.adapter().is_cpu() ? 0u : 8192u;
  EXPECT_EQ(kernels::decode_gqa_from(dflt), from);
  EXPECT_EQ(kernels::resolve_decode_kernel(dflt, with(from), DecodeKernel::Auto), DecodeKernel::Grouped);
  if (from > 0) {
    EXPECT_EQ(kernels::resolve_decode_kernel(dflt, with(from - 1), DecodeKernel::Auto), DecodeKernel::PerHead);
  }
}

// The dispatch Auto makes is the forced kernel's, bit for bit, on each side of the threshold (same inputs, same
// splits), and the two kernels' outputs differ in their last bits (else this test could not tell them apart).
TEST(AttentionDecode, AutoRunsThePickedKernel) {
  gpu::Context ctx(context_options([](auto& o) { o.decode_gqa_from = 200; }));
  for (const uint32_t depth : {199u, 200u, 600u}) {
    const DecodeCase c{"auto_gqa4_d64", 8, 2, 64, depth, 128, 3};
    const uint64_t salt = 4242 + depth;
    const DecodeRun autod = run_decode(ctx, c, DecodeKernel::Auto, salt);
    const DecodeRun per_head = run_decode(ctx, c, DecodeKernel::PerHead, salt);
    const DecodeRun grouped = run_decode(ctx, c, DecodeKernel::Grouped, salt);
    ASSERT_EQ(per_head.want, grouped.want) << "the same inputs";
    ASSERT_NE(per_head.got, grouped.got) << "the kernels agree to the bit at depth " << depth;
    EXPECT_EQ(autod.got, depth >= 200 ? grouped.got : per_head.got) << "depth " << depth;
    EXPECT_LE(autod.error.rel_l2, 2e-5) << autod.error.describe();
  }
}

// The grouped kernel through the packed-u32 f16 view (adapters without shader-f16).
TEST(AttentionDecode, PackedF16Fallback) {
  gpu::Context ctx(context_options([](auto& o) { o.disable_f16 = true; }));
  ASSERT_EQ(kernels::kv_view(ctx, KvType::F16), kernels::KvView::PackedF16);
  for (const DecodeCase& c : {DecodeCase{"packed_gqa4_d64_depth700_split3", 8, 2, 64, 700, 128, 3},
                              DecodeCase{"packed_swa200_gqa2_d128_depth500", 4, 2, 128, 500, 128, 0, 200}}) {
    const DecodeRun r = run_decode(ctx, c, DecodeKernel::Grouped, std::hash<std::string>{}(c.name));
    EXPECT_LE(r.error.rel_l2, 2e-5) << c.name << ": " << r.error.describe();
  }
}

TEST(AttentionDecode, GroupedNeedsSubgroups) {
  gpu::Context ctx(context_options([](auto& o) { o.disable_subgroups = true; }));
  KvCache kv(ctx, {.kv_dim = 128, .max_seq = 16});
  auto q = ctx.create_buffer(4 * 64 * 4, WGPUBufferUsage_Storage, "q");
  auto out = ctx.create_buffer(4 * 64 * 4, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx);
  const AttentionShape s{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .n_queries = 1, .start_pos = 3};
  try {
    kernels::encode_attention_decode(batch, ctx, s, q, kv, out, nullptr, 1, DecodeKernel::Grouped);
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("subgroups"), std::string::npos) << e.what();
  }
  // Auto and PerHead fall back to the baseline kernel there
  EXPECT_NO_THROW(kernels::encode_attention_decode(batch, ctx, s, q, kv, out, nullptr, 1, DecodeKernel::Auto));
}

// Split-K through the grouped kernel needs scratch of its split count; attention_decode_scratch_bound covers both
// kernels (the grouped one splits finer).
TEST(AttentionDecode, ScratchBoundCoversBothKernels) {
  auto& ctx = context();
  for (const auto& [heads, kv_heads, dim, depth] :
       {std::tuple{32u, 8u, 64u, 16383u}, {14u, 2u, 64u, 4095u}, {16u, 8u, 128u, 300u}, {8u, 1u, 64u, 0u}}) {
    KvCache kv(ctx, {.kv_dim = kv_heads * dim, .max_seq = depth + 1 + 256, .page_size = 256});
    const AttentionShape s{
        .n_heads = heads, .n_kv_heads = kv_heads, .head_dim = dim, .n_queries = 1, .start_pos = depth};
    for (const DecodeKernel k : {DecodeKernel::PerHead, DecodeKernel::Grouped}) {
      const uint32_t splits = kernels::attention_decode_splits(s, kv, k);
      EXPECT_GE(splits, 1u);
      if (splits > 1) {
        EXPECT_GE(kernels::attention_decode_scratch_bound(s, kv), kernels::attention_decode_scratch_bytes(s, splits))
            << kernel_name(k) << " depth " << depth;
      }
    }
  }
}

}  // namespace
}  // namespace wgllm::test

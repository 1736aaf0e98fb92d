// Attention kernels vs the CPU reference (float64): an explicit table of shapes.
#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "cpu/attention.h"
#include "gpu/shader_expand.h"
#include "gpu/shaders.h"
#include "kernels/attention.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

using kernels::AttentionImpl;
using kernels::AttentionShape;
using kernels::KvCache;
using kernels::KvCacheConfig;
using kernels::KvType;

enum class Kind { Prefill, Decode };

struct Case {
  const char* name;
  uint32_t n_heads, n_kv_heads, head_dim, n_queries, start_pos;
  KvType kv_type = KvType::F16;
  uint32_t page_size = 0;  // 0: contiguous (one page)
  AttentionImpl impl = AttentionImpl::Tiled;
  Kind kind = Kind::Prefill;
  uint32_t q_split = 0;            // > 0: issue the batch as dispatches of this many queries via q_base
  uint32_t n_splits = 1;           // decode: 1 = no split-K, 0 = automatic
  uint32_t row_pad = 0;            // extra floats per q/out row (strides != n_heads * head_dim)
  uint32_t rpt = 1;                // tiled prefill: rows per thread group (> 1 overrides the default tiles)
  uint32_t window = 0;             // sliding window (0: none)
  const char* f16_tile = nullptr;  // TiledF16: "BQxBKxCGxf16" (nullptr: the adapter's default tile)
  bool sinks = false;              // per-head attention sinks (gpt-oss)
  uint32_t bq = 0;                 // tiled prefill: rows per workgroup (> 0 overrides the default tiles)
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// Runs one case on `ctx` and returns the comparison with the CPU reference (and the raw output rows in `raw`).
ErrorReport run_case(gpu::Context& ctx, const Case& c, uint64_t salt, std::vector<float>* raw = nullptr) {
  auto gen = rng(salt);
  const uint32_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const uint32_t stride = q_dim + c.row_pad;
  const uint32_t seq = c.start_pos + c.n_queries;
  KvCacheConfig cfg{.kv_dim = kv_dim,
                    .max_seq = seq + 3,
                    .page_size = c.page_size,
                    .type = c.kv_type,
                    .page_order = shuffled_pages(seq + 3, c.page_size, salt)};
  KvCache kv(ctx, cfg, c.name);
  auto k = random_floats(size_t(seq) * kv_dim, gen, -2.f, 2.f);
  auto v = random_floats(size_t(seq) * kv_dim, gen, -1.f, 1.f);
  kv.write(0, seq, k, v);
  auto q = random_floats(size_t(c.n_queries) * stride, gen, -2.f, 2.f);
  auto qbuf = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
  auto out = ctx.create_buffer(size_t(c.n_queries) * stride * 4, WGPUBufferUsage_Storage, "out");
  std::vector<uint32_t> poison(size_t(c.n_queries) * stride, kPoison);
  ctx.write_buffer(out, 0, poison.data(), out.size);

  // sinks from well below to well above the scores: some heads barely notice theirs, some are mostly sink
  const auto sinks = random_floats(c.sinks ? c.n_heads : 0, gen, -4.f, 8.f);
  const gpu::Buffer sink_buf = c.sinks ? ctx.upload<float>(sinks, WGPUBufferUsage_Storage, "sinks") : gpu::Buffer{};
  AttentionShape shape{.n_heads = c.n_heads,
                       .n_kv_heads = c.n_kv_heads,
                       .head_dim = c.head_dim,
                       .n_queries = c.n_queries,
                       .start_pos = c.start_pos,
                       .q_stride = stride,
                       .out_stride = stride,
                       .window = c.window,
                       .sinks = c.sinks ? &sink_buf : nullptr};
  gpu::ComputeBatch batch(ctx, c.name);
  const uint32_t step = c.q_split ? c.q_split : c.n_queries;
  std::vector<gpu::Buffer> scratch;
  for (uint32_t first = 0; first < c.n_queries; first += step) {
    AttentionShape part = shape;
    part.q_base = first;
    part.n_queries = std::min(step, c.n_queries - first);
    if (c.kind == Kind::Prefill) {
      kernels::AttentionTiles tiles = kernels::attention_tiles(c.head_dim, ctx.limits());
      tiles.rpt = c.rpt;
      if (c.bq) tiles.bq = c.bq;
      tiles.wg = tiles.bq / tiles.rpt * tiles.tpr;
      std::optional<kernels::AttentionF16Tiles> f16;
      if (c.f16_tile) f16 = kernels::parse_attention_variant(c.f16_tile).f16_tiles;
      kernels::encode_attention_prefill(batch, ctx, part, qbuf, kv, out, c.impl, c.rpt > 1 || c.bq ? &tiles : nullptr,
                                        f16 ? &*f16 : nullptr);
    } else {
      const uint32_t splits = c.n_splits ? c.n_splits : kernels::attention_decode_splits(part, kv);
      const gpu::Buffer* sp = nullptr;
      if (splits > 1) {
        scratch.push_back(ctx.create_buffer(kernels::attention_decode_scratch_bytes(part, splits),
                                            WGPUBufferUsage_Storage, "partials"));
        sp = &scratch.back();
      }
      kernels::encode_attention_decode(batch, ctx, part, qbuf, kv, out, sp, splits);
    }
  }
  batch.submit_and_wait();
  auto got_padded = ctx.read<float>(out);
  if (raw) *raw = got_padded;

  // Reference on dense rows (strip the padding).
  std::vector<float> q_dense(size_t(c.n_queries) * q_dim), got(size_t(c.n_queries) * q_dim);
  for (uint32_t i = 0; i < c.n_queries; ++i) {
    std::copy_n(&q[size_t(i) * stride], q_dim, &q_dense[size_t(i) * q_dim]);
    std::copy_n(&got_padded[size_t(i) * stride], q_dim, &got[size_t(i) * q_dim]);
    for (uint32_t pad = q_dim; pad < stride; ++pad)  // padding must stay untouched (poison)
      EXPECT_EQ(std::bit_cast<uint32_t>(got_padded[size_t(i) * stride + pad]), kPoison) << "row " << i;
  }
  cpu::AttentionRef ref{c.n_heads,  c.n_kv_heads, c.head_dim, c.n_queries, c.start_pos, 1.0f / std::sqrt(float(c.head_dim)),
                        c.window, sinks};
  auto want = cpu::attention(ref, q_dense, k, v);
  return compare(got, want);
}

// The f16 kernel rounds q and the probabilities to f16 (unit roundoff u = 2^-11 = 4.9e-4) and sums the products of
// a score (16 per f16 lane) and of a tile's P V (BK per lane) in f16 before adding them in f32. A numpy model of
// exactly these roundings gives 1.5e-3 - 2.6e-3 relative L2 against float64 on these inputs (q in [-2, 2]; the
// output is an average of many v, so its norm is small); the f32 kernels 3e-4 (the f16 KV alone). 8e-3 = 16 u.
constexpr double kF16ArithmeticTolerance = 8e-3;

double tolerance(const Case& c) {
  if (c.impl == AttentionImpl::TiledF16) return kF16ArithmeticTolerance;
  return c.kv_type == KvType::F32 ? 1e-5 : 3e-3;
}

constexpr auto F16 = KvType::F16;
constexpr auto F32 = KvType::F32;
constexpr auto Tiled = AttentionImpl::Tiled;
constexpr auto TiledF16 = AttentionImpl::TiledF16;
constexpr auto Baseline = AttentionImpl::Baseline;
constexpr auto Decode = Kind::Decode;

// name, heads, kv heads, head_dim, queries, start_pos, kv type, page, impl, kind, q_split, splits, pad, rpt
const Case kCases[] = {
    {"mha_d64_q75", 4, 4, 64, 75, 0},
    {"gqa2_d32_q3", 4, 2, 32, 3, 0},
    {"gqa4_d128_q256", 8, 2, 128, 256, 0},
    {"gqa8_d64_q75_start40", 8, 1, 64, 75, 40},
    {"gqa4_d80_q75_start7", 4, 1, 80, 75, 7},
    {"gqa2_d96_q33_start100", 4, 2, 96, 33, 100},
    {"gqa2_d256_q20_start13", 2, 1, 256, 20, 13},
    {"gqa4_d512_q20_start13", 4, 1, 512, 20, 13},  // Gemma 4's global heads
    {"mha_d512_q70_start100", 2, 2, 512, 70, 100, F32, 128},
    {"mha_d32_q1000", 2, 2, 32, 1000, 0},
    {"q1_start0", 4, 2, 64, 1, 0},
    {"f32_gqa4_d64_q75", 8, 2, 64, 75, 5, F32},
    {"f32_d128_q100_start60", 4, 4, 128, 100, 60, F32},
    {"paged128_gqa4_d64_q200_start70", 8, 2, 64, 200, 70, F16, 128},
    {"paged256_f32_d128_q90_start300", 4, 1, 128, 90, 300, F32, 256},
    {"split_qbase_gqa2_d64_q75", 4, 2, 64, 75, 10, F16, 128, Tiled, Kind::Prefill, 16},
    {"strided_rows_d64_q40", 4, 2, 64, 40, 9, F16, 0, Tiled, Kind::Prefill, 0, 1, 12},
    {"baseline_gqa4_d64_q75", 8, 2, 64, 75, 3, F16, 0, Baseline},
    {"baseline_f32_d80_q33", 4, 4, 80, 33, 20, F32, 0, Baseline},
    {"baseline_paged_d128_q20", 4, 2, 128, 20, 150, F16, 128, Baseline},
    {"baseline_d6_q5", 2, 1, 6, 5, 3, F16, 0, Baseline},
    {"baseline_gqa2_d512_q9_start300", 4, 2, 512, 9, 300, F16, 128, Baseline},
    {"baseline_split_qbase", 4, 2, 32, 30, 5, F16, 0, Baseline, Kind::Prefill, 7},
    {"rpt2_gqa4_d128_q75_start9", 8, 2, 128, 75, 9, F16, 0, Tiled, Kind::Prefill, 0, 1, 0, 2},
    {"rpt2_paged_gqa8_d64_q130_start200", 8, 1, 64, 130, 200, F16, 128, Tiled, Kind::Prefill, 0, 1, 0, 2},
    {"rpt4_mha_d80_q33", 4, 4, 80, 33, 0, F32, 0, Tiled, Kind::Prefill, 0, 1, 0, 4},
    {"decode_gqa4_d128_start1000", 8, 2, 128, 1, 1000, F16, 0, Tiled, Decode},
    {"decode_split7_gqa4_d128_start1000", 8, 2, 128, 1, 1000, F16, 0, Tiled, Decode, 0, 7},
    {"decode_autosplit_paged_d64_start3000", 8, 1, 64, 1, 3000, F16, 128, Tiled, Decode, 0, 0},
    {"decode_split5_f32_d80_q3_start500", 4, 2, 80, 3, 500, F32, 0, Tiled, Decode, 0, 5},
    {"decode_split3_d256_start300", 2, 2, 256, 1, 300, F16, 128, Tiled, Decode, 0, 3},
    {"decode_split5_gqa4_d512_start600", 4, 1, 512, 1, 600, F16, 128, Tiled, Decode, 0, 5},
    {"decode_split150_d512_start9000", 2, 1, 512, 1, 9000, F16, 0, Tiled, Decode, 0, 150},
    {"decode_start0", 4, 4, 32, 1, 0, F16, 0, Tiled, Decode, 0, 4},
    {"decode_more_splits_than_keys", 4, 4, 32, 1, 100, F16, 0, Tiled, Decode, 0, 9},
    // more splits than the reduce has threads (a strided walk), the last ones empty; head_dim 96: 64 / 24 slices
    {"decode_split150_d96_start9000", 4, 2, 96, 1, 9000, F16, 0, Tiled, Decode, 0, 150},
};

// Sliding windows: query P sees keys (P - W, P]. The same kernels; the window cuts inside key tiles, lands on page
// boundaries, starts above whole tiles and pages (skipped), spans chunked prefill (start_pos, q_base), is 1 (each
// query sees itself alone) or covers everything (= no window).
Case sw(Case c, uint32_t window) {
  c.window = window;
  return c;
}
const Case kWindowCases[] = {
    sw({"swa21_gqa2_d64_q75", 4, 2, 64, 75, 0}, 21),
    sw({"swa33_gqa8_d64_q75_start40", 8, 1, 64, 75, 40}, 33),
    sw({"swa1_gqa2_d32_q40_start5", 4, 2, 32, 40, 5}, 1),
    sw({"swa_covers_all_d64_q75_start40", 8, 2, 64, 75, 40}, 5000),
    sw({"swa_equals_seq_d64_q75_start40", 8, 2, 64, 75, 40}, 115),
    // P = 255: the window (127, 255] starts exactly on page 1; pages 0 and (for later queries) 1 skipped whole
    sw({"swa128_paged128_gqa4_d64_q200_start70", 8, 2, 64, 200, 70, F16, 128}, 128),
    sw({"swa256_paged128_f32_d128_q90_start300", 4, 1, 128, 90, 300, F32, 128}, 256),
    sw({"swa100_chunked_qbase_gqa2_d64_q75_start300", 4, 2, 64, 75, 300, F16, 128, Tiled, Kind::Prefill, 16}, 100),
    sw({"swa512_gqa4_d256_q20_start600", 4, 1, 256, 20, 600, F16, 128}, 512),
    sw({"swa17_rpt2_gqa4_d128_q75_start9", 8, 2, 128, 75, 9, F16, 0, Tiled, Kind::Prefill, 0, 1, 0, 2}, 17),
    sw({"swa30_baseline_paged_gqa2_d64_q40_start150", 4, 2, 64, 40, 150, F16, 128, Baseline}, 30),
    sw({"swa1_baseline_d32_q9", 4, 4, 32, 9, 0, F32, 0, Baseline}, 1),
    sw({"swa512_decode_gqa4_d128_start1000", 8, 2, 128, 1, 1000, F16, 0, Tiled, Decode}, 512),
    sw({"swa300_decode_split7_gqa4_d128_start1000", 8, 2, 128, 1, 1000, F16, 0, Tiled, Decode, 0, 7}, 300),
    sw({"swa512_decode_autosplit_paged_d64_start3000", 8, 1, 64, 1, 3000, F16, 128, Tiled, Decode, 0, 0}, 512),
    sw({"swa128_decode_paged_page_edge", 4, 2, 64, 1, 383, F16, 128, Tiled, Decode, 0, 2}, 128),
    sw({"swa50_decode_split5_f32_d80_q3_start500", 4, 2, 80, 3, 500, F32, 0, Tiled, Decode, 0, 5}, 50),
    sw({"swa1_decode_d64_start700", 4, 2, 64, 1, 700, F16, 0, Tiled, Decode, 0, 0}, 1),
    sw({"swa512_decode_split3_d256_start700", 4, 1, 256, 1, 700, F16, 128, Tiled, Decode, 0, 3}, 512),
    sw({"swa300_gqa2_d512_q40_start500", 4, 2, 512, 40, 500, F16, 128}, 300),
    sw({"swa_covers_all_decode_d64_start300", 4, 2, 64, 1, 300, F16, 0, Tiled, Decode, 0, 3}, 301),
};

// The f16 kernel (attention_f16.wgsl) with the adapter's default tile (on lavapipe, 8-lane subgroups: 32x32x16 at
// head_dim 128, row maxima through workgroup memory; 64x32x8 at 64, through subgroup shuffles) and forced tiles: two
// output chunks per thread (head_dim 128 over 8 threads), GQA groups that do not divide the rows (3) or exceed them
// (40: a group split over workgroups), partial tiles, chunked prefill (start_pos, q_base), paged KV, strided rows and
// sliding windows. Few distinct tiles: lavapipe takes 15-45 s to compile each (its shader cache keeps them after).
Case f16(Case c, const char* tile = nullptr) {
  c.impl = TiledF16;
  c.f16_tile = tile;
  return c;
}
const Case kF16Cases[] = {
    f16({"f16_gqa4_d128_q75_start9", 8, 2, 128, 75, 9}),
    f16({"f16_mha_d64_q75", 4, 4, 64, 75, 0}),
    f16({"f16_gqa8_d64_q75_start40", 8, 1, 64, 75, 40}),
    f16({"f16_gqa2_d64_q3", 4, 2, 64, 3, 0}),
    f16({"f16_q1_start0", 4, 2, 64, 1, 0}),
    f16({"f16_gqa3_d64_q30_start7", 6, 2, 64, 30, 7}),
    f16({"f16_gqa40_d64_q5_start3", 40, 1, 64, 5, 3}, "32x16x8xf16"),
    f16({"f16_paged128_gqa4_d64_q200_start70", 8, 2, 64, 200, 70, F16, 128}),
    f16({"f16_split_qbase_gqa2_d128_q75_start10", 4, 2, 128, 75, 10, F16, 128, Tiled, Kind::Prefill, 16}),
    f16({"f16_strided_rows_d64_q40_start9", 4, 2, 64, 40, 9, F16, 0, Tiled, Kind::Prefill, 0, 1, 12}),
    f16({"f16_tile32x16x8_gqa4_d128_q40_start20", 8, 2, 128, 40, 20, F16, 128}, "32x16x8xf16"),
    f16({"f16_tile32x16x8_mha_d128_q9_start30", 2, 2, 128, 9, 30}, "32x16x8xf16"),
    f16(sw({"f16_swa21_gqa2_d64_q75", 4, 2, 64, 75, 0}, 21)),
    f16(sw({"f16_swa1_gqa2_d64_q40_start5", 4, 2, 64, 40, 5}, 1)),
    f16(sw({"f16_swa_covers_all_gqa4_d64_q75_start40", 8, 2, 64, 75, 40}, 5000)),
    // P = 255: the window (127, 255] starts exactly on page 1; pages 0 and (for later queries) 1 skipped whole
    f16(sw({"f16_swa128_paged128_gqa4_d64_q200_start70", 8, 2, 64, 200, 70, F16, 128}, 128)),
    f16(sw({"f16_swa100_chunked_qbase_gqa2_d128_q75_start300", 4, 2, 128, 75, 300, F16, 128, Tiled, Kind::Prefill, 16},
           100)),
};

// Attention sinks (gpt-oss) in every kernel that normalises a row: the f32 and f16 tiled prefill, the baseline, decode
// whole and split (the reduce adds the sink), with windows and chunked calls.
Case sinks(Case c) {
  c.sinks = true;
  return c;
}
const Case kSinkCases[] = {
    sinks({"sinks_gqa2_d64_q75_start9", 4, 2, 64, 75, 9}),
    sinks(sw({"sinks_swa6_gqa4_d64_q40_start3", 8, 2, 64, 40, 3, F16, 128, Tiled, Kind::Prefill, 16}, 6)),
    sinks({"sinks_f32_mha_d80_q20", 4, 4, 80, 20, 0, F32}),
    sinks({"sinks_baseline_gqa2_d64_q30_start5", 4, 2, 64, 30, 5, F16, 0, Baseline}),
    sinks(f16({"sinks_f16_gqa4_d64_q75_start9", 8, 2, 64, 75, 9})),
    sinks(f16(sw({"sinks_f16_swa5_gqa2_d128_q40", 4, 2, 128, 40, 0}, 5))),
    sinks({"sinks_decode_gqa4_d64_start300", 8, 2, 64, 1, 300, F16, 0, Tiled, Decode, 0, 1}),
    sinks({"sinks_decode_split4_gqa4_d64_start300", 8, 2, 64, 1, 300, F16, 0, Tiled, Decode, 0, 4}),
};

// The f32 tiled kernel with fewer rows per workgroup, as attention_prefill_tiles() gives GPUs for short prompts: 16
// rows a workgroup holding two queries of 8 heads, four of 4, eight of 2, or half of a 32-head group (the other half
// in the next workgroup), at head_dim 256 (Gemma's, Qwen 3.5's); paged KV, chunked prefill, a window. One tile (each
// tile is a pipeline lavapipe takes about a minute to compile).
Case rows(Case c, uint32_t bq) {
  c.bq = bq;
  return c;
}
const Case kRowsCases[] = {
    rows({"bq16_gqa8_d256_q33_start100_paged", 8, 1, 256, 33, 100, F16, 128}, 16),
    rows({"bq16_gqa4_d256_q20_start13", 4, 1, 256, 20, 13}, 16),
    rows({"bq16_gqa32_d256_q9_start5", 32, 1, 256, 9, 5}, 16),
    rows({"bq16_gqa2_d256_q40_start3_split", 8, 4, 256, 40, 3, F16, 128, Tiled, Kind::Prefill, 16}, 16),
    rows(sw({"bq16_swa7_gqa4_d256_q30_start20", 4, 1, 256, 30, 20, F16, 128}, 7), 16),
};

class AttentionTable : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTable, MatchesCpuReference) {
  const Case& c = GetParam();
  auto r = run_case(context(), c, std::hash<std::string>{}(c.name));
  EXPECT_LE(r.rel_l2, tolerance(c)) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTable, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Window, AttentionTable, ::testing::ValuesIn(kWindowCases),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(F16, AttentionTable, ::testing::ValuesIn(kF16Cases),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Sinks, AttentionTable, ::testing::ValuesIn(kSinkCases),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Rows, AttentionTable, ::testing::ValuesIn(kRowsCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A row's arithmetic does not depend on the rows its workgroup holds: the same case at the default tile's rows (64
// where the adapter allows 512 threads a workgroup) and at 16 (the GPU rule's smallest) gives the same bits, so the
// rule changes no model's output.
TEST(Attention, FewerRowsPerWorkgroupSameBits) {
  const uint32_t default_rows = kernels::attention_tiles(256, context().limits()).bq;
  const Case wide = rows({"bits_gqa8_d256_q40_start30_paged", 8, 1, 256, 40, 30, F16, 128}, default_rows);
  const Case narrow = rows(wide, 16);
  ASSERT_GT(default_rows, 16u);
  std::vector<float> a, b;
  EXPECT_LE(run_case(context(), wide, 7, &a).rel_l2, tolerance(wide));
  EXPECT_LE(run_case(context(), narrow, 7, &b).rel_l2, tolerance(narrow));
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  EXPECT_EQ(differ, 0u) << "of " << a.size();
}

// The GPU rule of attention_prefill_tiles(): bq halves while a call has fewer workgroups than
// attention_fill_workgroups() (256, or 128 where its queries see more than 1,536 keys on average), never below
// kAttentionMinRows (or the rows per thread group), the workgroup's threads following; calls with enough workgroups
// keep the default tile. The expected tiles are the fastest of 64, 32, 16 and 8 rows measured on the H100 for the
// shapes PERF.md lists. CPU adapters keep the default tile always.
TEST(Attention, PrefillTilesFillTheGpu) {
  const auto& lim = context().limits();
  struct Want {
    AttentionShape s;
    uint32_t bq;  // the rule's
  };
  const Want wants[] = {
      {{.n_heads = 8, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512}, 16},   // Gemma 4: 64 -> 128 -> 256
      {{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512}, 16},   // Gemma 3 270M: 32 .. 128
      {{.n_heads = 8, .n_kv_heads = 2, .head_dim = 256, .n_queries = 512}, 16},   // Qwen 3.5: 64 .. 256
      {{.n_heads = 8, .n_kv_heads = 1, .head_dim = 512, .n_queries = 4096}, 0},   // 512 workgroups: unchanged
      {{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_queries = 2048}, 32},  // Gemma 3 270M pp2048: 128 -> 256
      {{.n_heads = 8, .n_kv_heads = 1, .head_dim = 256, .n_queries = 3}, 16},     // never below 16 rows
      {{.n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .n_queries = 512}, 0},   // 256 workgroups already
      // a chunk deep in the prompt (1,792 keys a query): 128 workgroups suffice; Gemma 4 64 -> 128, Gemma 3 32 .. 128
      {{.n_heads = 8, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512, .start_pos = 1536}, 32},
      {{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512, .start_pos = 1536}, 16},
      // the same chunk in a 512-key window sees few keys again: 256 workgroups
      {{.n_heads = 8, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512, .start_pos = 1536, .window = 512}, 16},
  };
  for (const Want& w : wants) {
    const kernels::AttentionTiles t0 = kernels::attention_tiles(w.s.head_dim, lim);
    const kernels::AttentionTiles t = kernels::attention_fill_tiles(t0, w.s);
    const std::string at = std::to_string(w.s.n_heads) + "/" + std::to_string(w.s.n_kv_heads) + " d" +
                           std::to_string(w.s.head_dim) + " q" + std::to_string(w.s.n_queries) + " start " +
                           std::to_string(w.s.start_pos) + " window " + std::to_string(w.s.window);
    EXPECT_EQ(t.bq, w.bq ? w.bq : t0.bq) << at;
    EXPECT_EQ(t.wg, t.bq / t.rpt * t.tpr) << at;
    EXPECT_EQ(t.bk, t0.bk) << at;
    EXPECT_EQ(t.rpt, t0.rpt) << at;
    const uint64_t n = kernels::attention_prefill_workgroups(w.s, t.bq, w.s.n_queries);
    const uint64_t want = kernels::attention_fill_workgroups(w.s);
    EXPECT_TRUE(n >= want || t.bq == kernels::kAttentionMinRows) << at << ": " << n;
    if (t.bq != t0.bq) {  // the last halving was needed: twice the rows gave too few workgroups
      EXPECT_LT(kernels::attention_prefill_workgroups(w.s, t.bq * 2, w.s.n_queries), want) << at;
    }
  }
  // Workgroups: 8 heads of one kv head in 16-row tiles are 2 queries a workgroup; a 16-head group in 8-row tiles
  // takes two workgroups a query.
  EXPECT_EQ(kernels::attention_prefill_workgroups({.n_heads = 8, .n_kv_heads = 1, .head_dim = 256}, 16, 75), 38u);
  EXPECT_EQ(kernels::attention_prefill_workgroups({.n_heads = 16, .n_kv_heads = 1, .head_dim = 128}, 8, 9), 18u);
  if (context().adapter().is_cpu()) {
    const AttentionShape s{.n_heads = 8, .n_kv_heads = 1, .head_dim = 256, .n_queries = 512};
    EXPECT_EQ(kernels::attention_prefill_tiles(context(), s).bq, kernels::attention_tiles(256, lim).bq);
  }
}

// The context's attention_prefill option steers AttentionImpl::Auto: "f16" runs the f16 kernel (here on a CPU
// adapter too, where Auto alone keeps f32 arithmetic), a tile with it; "f32" the f32 kernel.
TEST(Attention, PrefillOptionChoosesTheKernel) {
  const AttentionShape s{.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .n_queries = 10};
  {
    gpu::Context ctx(context_options([](auto& o) { o.attention_prefill = "32x16x8xf16"; }));
    EXPECT_EQ(kernels::resolve_attention_prefill(ctx, s, F16), TiledF16);
    EXPECT_EQ(kernels::resolve_attention_prefill(ctx, s, F16, Tiled), Tiled);  // an explicit kernel wins
    auto r = run_case(ctx, {"option_f16_tile_gqa4_d64_q30_start5", 8, 2, 64, 30, 5, F16, 0, AttentionImpl::Auto}, 3);
    EXPECT_LE(r.rel_l2, kF16ArithmeticTolerance) << r.describe();
    EXPECT_NO_THROW(kernels::check_attention_variant(ctx, 64));
    EXPECT_NO_THROW(kernels::check_attention_variant(ctx, 128));  // two 8-dim chunks per thread
    EXPECT_THROW(kernels::check_attention_variant(ctx, 80), InvalidArgument);
  }
  {
    gpu::Context ctx(context_options([](auto& o) { o.attention_prefill = "f32"; }));
    EXPECT_EQ(kernels::resolve_attention_prefill(ctx, s, F16), Tiled);
    EXPECT_NO_THROW(kernels::check_attention_variant(ctx, 80));
  }
  auto& ctx = context();
  // Auto: the f16 kernel on GPUs where it runs at head_dim 64 and 128; CPU adapters keep the f32 kernel; never for an
  // f32 KV cache or another head_dim.
  const AttentionImpl want = ctx.adapter().is_cpu() ? Tiled : TiledF16;
  EXPECT_EQ(kernels::resolve_attention_prefill(ctx, s, F16), want);
  EXPECT_EQ(kernels::resolve_attention_prefill(ctx, s, F32), Tiled);
  for (uint32_t d : {80u, 256u}) {
    AttentionShape other = s;
    other.head_dim = d;
    EXPECT_EQ(kernels::resolve_attention_prefill(ctx, other, F16), Tiled) << d;
  }
}

TEST(Attention, ParseAttentionVariant) {
  EXPECT_EQ(kernels::parse_attention_variant("").impl, AttentionImpl::Auto);
  EXPECT_EQ(kernels::parse_attention_variant("f32").impl, Tiled);
  const auto f = kernels::parse_attention_variant("f16");
  EXPECT_EQ(f.impl, TiledF16);
  EXPECT_FALSE(f.f16_tiles.has_value());
  const auto t = kernels::parse_attention_variant("64x32x16xf16");
  ASSERT_TRUE(t.f16_tiles.has_value());
  EXPECT_EQ(t.f16_tiles->bq, 64u);
  EXPECT_EQ(t.f16_tiles->bk, 32u);
  EXPECT_EQ(t.f16_tiles->cg, 16u);
  for (const char* bad : {"f64", "64x32x16", "64x32xf16", "64x32x16x8xf16", "xf16", "64xx16xf16", "a4x32x16xf16",
                          "64x32x16xf32", "99999x32x16xf16"})
    EXPECT_THROW(kernels::parse_attention_variant(bad), InvalidArgument) << bad;
}

// The f16 kernel's contract checks, each an InvalidArgument before dispatch.
TEST(Attention, F16KernelRefusesWhatItCannotRun) {
  auto& ctx = context();
  auto q = ctx.create_buffer(16 * 512 * 4, WGPUBufferUsage_Storage, "q");
  auto out = ctx.create_buffer(16 * 512 * 4, WGPUBufferUsage_Storage, "out");
  auto expect_refusal = [&](const char* what, const AttentionShape& s, KvType type, const kernels::AttentionF16Tiles* t,
                            uint32_t page = 0) {
    KvCache kv(ctx, {.kv_dim = s.n_kv_heads * s.head_dim, .max_seq = 256, .page_size = page, .type = type});
    gpu::ComputeBatch batch(ctx);
    try {
      kernels::encode_attention_prefill(batch, ctx, s, q, kv, out, TiledF16, nullptr, t);
      ADD_FAILURE() << "no exception: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const AttentionShape s{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .n_queries = 8};
  expect_refusal("f16 KV cache", s, F32, nullptr);
  AttentionShape d80 = s;
  d80.head_dim = 80;
  expect_refusal("no tile for head_dim 80", d80, F16, nullptr);
  const kernels::AttentionF16Tiles too_wide{64, 32, 16};  // 16 threads x 8 dims > head_dim 64
  expect_refusal("multiple of 8 * cg", s, F16, &too_wide);
  const kernels::AttentionF16Tiles odd_rows{30, 32, 8};
  expect_refusal("bq must be", s, F16, &odd_rows);
  const kernels::AttentionF16Tiles bad_keys{32, 24, 8};
  expect_refusal("bk must be", s, F16, &bad_keys);
  const kernels::AttentionF16Tiles huge{1024, 64, 8};
  expect_refusal("f16 tile 1024x64x8", s, F16, &huge);
  gpu::Context no_f16(context_options([](auto& o) { o.disable_f16 = true; }));
  EXPECT_FALSE(no_f16.features().shader_f16);
  EXPECT_EQ(kernels::resolve_attention_prefill(no_f16, s, F16), Tiled);
  {
    KvCache kv(no_f16, {.kv_dim = 128, .max_seq = 64});
    auto q2 = no_f16.create_buffer(16 * 512 * 4, WGPUBufferUsage_Storage, "q");
    gpu::ComputeBatch batch(no_f16);
    EXPECT_THROW(kernels::encode_attention_prefill(batch, no_f16, s, q2, kv, q2, TiledF16), InvalidArgument);
  }
}

// The f16 kernel as GPUs compile it: every //#unroll block unrolled (CPU adapters get loops), which makes each
// workgroup-memory index a constant in its inner dimension. The expanded source replaces the embedded one through
// kernel_dir for one small tile.
TEST(Attention, F16KernelUnrolled) {
  const kernels::AttentionF16Tiles tile{32, 16, 8};
  const std::string prelude = kernels::attention_f16_prelude(context(), tile, 64);
  const auto dir = std::filesystem::temp_directory_path() / ("wgllm_f16_unrolled_" + std::to_string(seed()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "attention_f16.wgsl")
      << gpu::expand_shader(gpu::shader_source("attention_f16.wgsl"), prelude, true);
  {
    gpu::Context ctx(context_options([&](auto& o) { o.kernel_dir = dir.string(); }));
    for (const Case& c : {f16({"unrolled_gqa4_d64_q40_start20", 8, 2, 64, 40, 20, F16, 128}, "32x16x8xf16"),
                          f16(sw({"unrolled_swa9_gqa2_d64_q20", 4, 2, 64, 20, 0}, 9), "32x16x8xf16")}) {
      auto r = run_case(ctx, c, 11);
      EXPECT_LE(r.rel_l2, kF16ArithmeticTolerance) << c.name << ": " << r.describe();
    }
  }
  std::filesystem::remove_all(dir);
}

// The same kernels through the packed-u32 f16 path (as on adapters without shader-f16).
TEST(Attention, PackedF16Fallback) {
  gpu::Context ctx(context_options([](auto& o) { o.disable_f16 = true; }));
  ASSERT_EQ(kernels::kv_view(ctx, F16), kernels::KvView::PackedF16);
  for (const Case& c :
       {Case{"packed_gqa4_d64_q75", 8, 2, 64, 75, 11}, Case{"packed_baseline_d32", 4, 2, 32, 20, 4, F16, 0, Baseline},
        Case{"packed_decode_split", 8, 2, 128, 1, 700, F16, 128, Tiled, Decode, 0, 3},
        sw({"packed_swa_decode_split", 8, 2, 128, 1, 700, F16, 128, Tiled, Decode, 0, 3}, 200)}) {
    auto r = run_case(ctx, c, 99);
    EXPECT_LE(r.rel_l2, 3e-3) << c.name << ": " << r.describe();
  }
}

// Without subgroups the encoders fall back to the baseline kernel and stay correct.
TEST(Attention, NoSubgroupsFallsBackToBaseline) {
  gpu::Context ctx(context_options([](auto& o) { o.disable_subgroups = true; }));
  for (const Case& c : {Case{"nosg_prefill", 4, 2, 64, 30, 5, F16, 0, AttentionImpl::Auto},
                        Case{"nosg_decode", 4, 2, 64, 1, 300, F16, 0, Tiled, Decode, 0, 0},
                        sw({"nosg_swa_prefill", 4, 2, 64, 30, 5, F16, 0, AttentionImpl::Auto}, 9)}) {
    auto r = run_case(ctx, c, 7);
    EXPECT_LE(r.rel_l2, 3e-3) << c.name << ": " << r.describe();
  }
  gpu::ComputeBatch batch(ctx);
  KvCache kv(ctx, {.kv_dim = 64, .max_seq = 8});
  auto q = ctx.create_buffer(4 * 64 * 4, WGPUBufferUsage_Storage, "q");
  EXPECT_THROW(kernels::encode_attention_prefill(
                   batch, ctx, {.n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_queries = 1}, q, kv, q, Tiled),
               InvalidArgument);
}

TEST(Attention, TilesFitTheAdapter) {
  const auto& lim = context().limits();
  for (uint32_t d : {4u, 8u, 32u, 64u, 80u, 96u, 128u, 256u, 36u, 512u}) {
    auto t = kernels::attention_tiles(d, lim);
    EXPECT_EQ(4 * t.dv * t.tpr, d) << d;
    EXPECT_EQ(t.wg, t.bq / t.rpt * t.tpr) << d;
    EXPECT_EQ(t.bq % t.rpt, 0u) << d;
    EXPECT_LE(t.wg, lim.maxComputeInvocationsPerWorkgroup) << d;
    EXPECT_LE(8ull * t.bk * d, lim.maxComputeWorkgroupStorageSize) << d;
    EXPECT_EQ(KvCache::kPageMultiple % t.bk, 0u) << d;
  }
  // The f16 kernel's default tiles: head_dim a multiple of 64, within the limits (either reduction).
  for (uint32_t d : {32u, 64u, 80u, 96u, 128u, 192u, 256u}) {
    const auto t = kernels::attention_f16_tiles(context(), d);
    if (d % 64 != 0) {
      EXPECT_FALSE(t.has_value()) << d;
      continue;
    }
    if (d <= 128 && lim.maxComputeWorkgroupStorageSize >= 32768) {
      EXPECT_TRUE(t.has_value()) << d;
    }
    if (!t) continue;
    EXPECT_EQ(d % (8 * t->cg), 0u) << d;
    EXPECT_EQ(t->bk % t->cg, 0u) << d;
    EXPECT_EQ(KvCache::kPageMultiple % t->bk, 0u) << d;
    EXPECT_LE(t->bq / 4 * t->cg, lim.maxComputeInvocationsPerWorkgroup) << d;
    EXPECT_LE(kernels::attention_f16_storage(*t, d), lim.maxComputeWorkgroupStorageSize) << d;
  }
}

// Every contract violation is an InvalidArgument naming the field, thrown before dispatch.
TEST(Attention, BadParametersThrowNamingTheField) {
  auto& ctx = context();
  KvCache kv(ctx, {.kv_dim = 128, .max_seq = 16});
  auto q = ctx.create_buffer(16 * 256 * 4, WGPUBufferUsage_Storage, "q");
  auto out = ctx.create_buffer(16 * 256 * 4, WGPUBufferUsage_Storage, "out");
  auto tiny = ctx.create_buffer(64, WGPUBufferUsage_Storage, "tiny");
  const AttentionShape good{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .n_queries = 4, .start_pos = 2};
  struct Bad {
    const char* field;
    AttentionShape shape;
    const gpu::Buffer* q;
    const gpu::Buffer* out;
  };
  auto with = [&](auto fn) {
    AttentionShape s = good;
    fn(s);
    return s;
  };
  const Bad bad[] = {
      {"n_heads", with([](auto& s) { s.n_heads = 0; }), &q, &out},
      {"n_kv_heads", with([](auto& s) { s.n_kv_heads = 0; }), &q, &out},
      {"multiple of n_kv_heads", with([](auto& s) { s.n_heads = 3; }), &q, &out},
      {"head_dim", with([](auto& s) {
         s.head_dim = 2 * kernels::kAttentionMaxHeadDim;
         s.n_kv_heads = 1;
         s.n_heads = 1;
       }),
       &q, &out},
      {"head_dim", with([](auto& s) { s.head_dim = 33; }), &q, &out},
      {"n_queries", with([](auto& s) { s.n_queries = 0; }), &q, &out},
      {"max_seq", with([](auto& s) { s.start_pos = 13; }), &q, &out},
      {"max_seq", with([](auto& s) {
         s.q_base = 10;
         s.start_pos = 0;
         s.n_queries = 7;
       }),
       &q, &out},
      {"kv_dim", with([](auto& s) { s.n_kv_heads = 4; }), &q, &out},
      {"q_stride", with([](auto& s) { s.q_stride = 100; }), &q, &out},
      {"q buffer", good, &tiny, &out},
      {"out buffer", good, &q, &tiny},
  };
  for (const auto& b : bad) {
    for (int decode = 0; decode < 2; ++decode) {
      gpu::ComputeBatch batch(ctx);
      try {
        if (decode)
          kernels::encode_attention_decode(batch, ctx, b.shape, *b.q, kv, *b.out, nullptr, 1);
        else
          kernels::encode_attention_prefill(batch, ctx, b.shape, *b.q, kv, *b.out);
        ADD_FAILURE() << "no exception for bad " << b.field;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(b.field), std::string::npos) << e.what();
      }
    }
  }
  // split-K without scratch
  gpu::ComputeBatch batch(ctx);
  EXPECT_THROW(kernels::encode_attention_decode(batch, ctx, good, q, kv, out, nullptr, 4), InvalidArgument);
  // pages that a key tile would straddle
  EXPECT_THROW(KvCache(ctx, {.kv_dim = 64, .max_seq = 100, .page_size = 48}), InvalidArgument);
}

// A context whose K/V exceeds one storage binding (paged KV across several pools):
// 2^17 positions x kv_dim 1024 in f16 = 256 MiB for K and for V. A decode step and a short
// prefill chunk at the end, checked against the CPU reference on a sample of heads.
TEST(Attention, PagedContextBeyondOneBinding) {
  auto& ctx = context();
  const uint32_t n_heads = 32, n_kv_heads = 8, D = 128, kv_dim = n_kv_heads * D;
  const uint32_t seq = 1u << 17, chunk = 16;
  if (2ull * seq * kv_dim * 2 <= ctx.max_binding_size())
    GTEST_LOG_(INFO) << "the adapter's binding holds this cache whole; still testing the paged path";
  KvCache kv(
      ctx,
      {.kv_dim = kv_dim, .max_seq = seq, .page_size = 1024, .type = F16, .page_order = shuffled_pages(seq, 1024, 1)});
  // K/V bytes exceed one binding on lavapipe (128 MiB): several pools must be in use there.
  if (ctx.max_binding_size() < (256ull << 20)) {
    EXPECT_GT(kv.n_pools(), 1u);
  }
  // Cheap deterministic-per-seed fill: a hash of the index, so 2^28 values take seconds.
  const uint64_t s = seed();
  auto value = [s](uint64_t i, uint64_t salt) {
    uint64_t x = (i + salt * 0x9E3779B97F4A7C15ull) ^ s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return float(int64_t(x % 20001) - 10000) / 10000.f;
  };
  const uint32_t rows_per_write = 4096;
  std::vector<float> kb(size_t(rows_per_write) * kv_dim), vb(kb.size());
  for (uint32_t r0 = 0; r0 < seq; r0 += rows_per_write) {
    for (size_t i = 0; i < kb.size(); ++i) {
      kb[i] = value(size_t(r0) * kv_dim + i, 1);
      vb[i] = value(size_t(r0) * kv_dim + i, 2);
    }
    kv.write(r0, rows_per_write, kb, vb);
  }
  auto gen = rng(5);
  const uint32_t q_dim = n_heads * D;
  auto q = random_floats(size_t(chunk) * q_dim, gen, -0.5f, 0.5f);
  auto qbuf = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
  auto out_prefill = ctx.create_buffer(size_t(chunk) * q_dim * 4, WGPUBufferUsage_Storage, "out");
  auto out_decode = ctx.create_buffer(size_t(q_dim) * 4, WGPUBufferUsage_Storage, "out decode");
  std::vector<uint32_t> poison(size_t(chunk) * q_dim, kPoison);
  ctx.write_buffer(out_prefill, 0, poison.data(), out_prefill.size);
  ctx.write_buffer(out_decode, 0, poison.data(), out_decode.size);

  const AttentionShape prefill{
      .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = D, .n_queries = chunk, .start_pos = seq - chunk};
  const AttentionShape decode{
      .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = D, .n_queries = 1, .start_pos = seq - 1};
  const uint32_t splits = kernels::attention_decode_splits(decode, kv);
  auto scratch = ctx.create_buffer(kernels::attention_decode_scratch_bytes(decode, std::max(splits, 1u)),
                                   WGPUBufferUsage_Storage, "partials");
  {
    gpu::ComputeBatch batch(ctx, "paged prefill");
    kernels::encode_attention_prefill(batch, ctx, prefill, qbuf, kv, out_prefill);
    batch.submit_and_wait();
  }
  {
    // decode reads the last query row of the chunk (position seq - 1)
    gpu::ComputeBatch batch(ctx, "paged decode");
    AttentionShape d = decode;
    d.q_base = 0;
    auto qlast = ctx.upload<float>(std::span<const float>(q).subspan(size_t(chunk - 1) * q_dim, q_dim),
                                   WGPUBufferUsage_Storage, "q last");
    kernels::encode_attention_decode(batch, ctx, d, qlast, kv, out_decode, &scratch, splits);
    batch.submit_and_wait();
  }
  // The f16 kernel over the same pools, with a sliding window from the middle of the last page that lies in another
  // pool than the chunk's own page (when there are several): its tiles switch pools.
  const std::vector<uint32_t> order = shuffled_pages(seq, 1024, 1);
  const uint32_t last_page = (seq - 1) / 1024;
  auto pool_of = [&](uint32_t page) { return (order.empty() ? page : order[page]) / kv.pages_per_pool(); };
  uint32_t first_page = last_page;
  while (first_page > 0 && pool_of(first_page) == pool_of(last_page)) --first_page;
  const uint32_t f16_window = seq - chunk - (first_page * 1024 + 512) + 1;
  auto out_f16 = ctx.create_buffer(size_t(chunk) * q_dim * 4, WGPUBufferUsage_Storage, "out f16");
  ctx.write_buffer(out_f16, 0, poison.data(), out_f16.size);
  {
    gpu::ComputeBatch batch(ctx, "paged prefill f16");
    AttentionShape w = prefill;
    w.window = f16_window;
    kernels::encode_attention_prefill(batch, ctx, w, qbuf, kv, out_f16, kernels::AttentionImpl::TiledF16);
    batch.submit_and_wait();
  }
  auto got_prefill = ctx.read<float>(out_prefill);
  auto got_decode = ctx.read<float>(out_decode);
  auto got_f16 = ctx.read<float>(out_f16);

  for (uint32_t h : {0u, 13u, 31u}) {
    const uint32_t kvh = h / (n_heads / n_kv_heads);
    std::vector<float> kh(size_t(seq) * D), vh(size_t(seq) * D);
    for (uint32_t t = 0; t < seq; ++t)
      for (uint32_t d = 0; d < D; ++d) {
        kh[size_t(t) * D + d] = value(size_t(t) * kv_dim + kvh * D + d, 1);
        vh[size_t(t) * D + d] = value(size_t(t) * kv_dim + kvh * D + d, 2);
      }
    std::vector<float> qh(size_t(chunk) * D), got_h(size_t(chunk) * D), got_dec(D), got_w(size_t(chunk) * D);
    for (uint32_t i = 0; i < chunk; ++i) {
      std::copy_n(&q[size_t(i) * q_dim + h * D], D, &qh[size_t(i) * D]);
      std::copy_n(&got_prefill[size_t(i) * q_dim + h * D], D, &got_h[size_t(i) * D]);
      std::copy_n(&got_f16[size_t(i) * q_dim + h * D], D, &got_w[size_t(i) * D]);
    }
    std::copy_n(&got_decode[h * D], D, got_dec.data());
    cpu::AttentionRef ref{1, 1, D, chunk, seq - chunk, 1.0f / std::sqrt(float(D))};
    auto want = cpu::attention(ref, qh, kh, vh);
    auto r = compare(got_h, want);
    EXPECT_LE(r.rel_l2, 3e-3) << "prefill head " << h << ": " << r.describe();
    auto rd = compare(std::span<const float>(got_dec), std::span<const float>(want).subspan(size_t(chunk - 1) * D, D));
    EXPECT_LE(rd.rel_l2, 3e-3) << "decode head " << h << ": " << rd.describe();
    cpu::AttentionRef ref_w{1, 1, D, chunk, seq - chunk, 1.0f / std::sqrt(float(D)), f16_window};
    auto rw = compare(got_w, cpu::attention(ref_w, qh, kh, vh));
    EXPECT_LE(rw.rel_l2, kF16ArithmeticTolerance)
        << "f16 prefill head " << h << ", window " << f16_window << ": " << rw.describe();
  }
}

}  // namespace
}  // namespace wgllm::test

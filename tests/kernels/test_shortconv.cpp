// LFM2's gated short convolution (shortconv.wgsl) and its conv-state ring vs cpu::shortconv (double precision).
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/shortconv.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

struct ConvCase {
  uint32_t n, E, L, pos, R;
  uint32_t row = 0;  // the first token's row in bcx and y (rows before it: poison left alone)
};

// The ring before the call: rows of positions pos-R+1 .. pos-1 hold random B*x rows (the ones before position 0
// and the row the call is about to write hold poison the kernel must not read); y starts poisoned too.
TEST(ShortConv, MatchesCpuReferenceAndUpdatesTheRing) {
  auto& ctx = context();
  const ConvCase cases[] = {
      {1, 64, 3, 0, 4},      {1, 64, 3, 1, 4},    {1, 1024, 3, 777, 515},  // decode, first tokens, a wrapped ring
      {7, 64, 3, 0, 10},     {40, 96, 4, 13, 44}, {37, 200, 3, 90, 41},    // prefill chunks, R = n + L (tight)
      {13, 33, 4, 2, 20},    {1, 300, 2, 5, 3},   {64, 256, 5, 1000, 69},  // E not a multiple of the workgroup
      {1, 64, 3, 40, 20, 5}, {3, 48, 4, 1, 9, 2},                          // rows of a batch of sequences
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " E " + std::to_string(c.E) + " L " + std::to_string(c.L) + " pos " +
                 std::to_string(c.pos) + " R " + std::to_string(c.R) + " row " + std::to_string(c.row));
    auto gen = rng(c.n * 7919 + c.E + c.pos);
    const auto bcx = random_floats(size_t(c.n) * 3 * c.E, gen, -2.f, 2.f);
    const auto taps = random_floats(size_t(c.E) * c.L, gen, -1.f, 1.f);
    std::vector<float> ring(size_t(c.R) * c.E, std::nanf(""));
    std::vector<float> prev(size_t(c.L - 1) * c.E, 0.f);  // the L-1 positions before pos, zeros before 0
    for (int64_t q = int64_t(c.pos) - c.R + 1; q < int64_t(c.pos); ++q) {
      if (q < 0) continue;
      const auto row = random_floats(c.E, gen, -3.f, 3.f);
      std::copy(row.begin(), row.end(), ring.begin() + (q % c.R) * c.E);
      if (const int64_t j = q - (int64_t(c.pos) - (c.L - 1)); j >= 0)
        std::copy(row.begin(), row.end(), prev.begin() + j * c.E);
    }
    const std::vector<float> want_ring_before = ring;
    std::vector<float> next_prev;
    const auto want = cpu::shortconv(bcx, taps, prev, c.n, c.E, c.L, &next_prev);

    std::vector<float> bcx_rows(size_t(c.row) * 3 * c.E, std::nanf(""));
    bcx_rows.insert(bcx_rows.end(), bcx.begin(), bcx.end());
    auto b_bcx = ctx.upload<float>(bcx_rows, WGPUBufferUsage_Storage, "bcx");
    auto b_taps = ctx.upload<float>(taps, WGPUBufferUsage_Storage, "taps");
    auto b_ring = ctx.upload<float>(ring, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "ring");
    auto b_y =
        ctx.upload<float>(std::vector<float>(size_t(c.row + c.n) * c.E, std::nanf("")), WGPUBufferUsage_Storage, "y");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_shortconv(
        batch, ctx, {.n_tokens = c.n, .n_embd = c.E, .taps = c.L, .pos = c.pos, .ring_rows = c.R, .row = c.row}, b_bcx,
        b_taps, b_ring, b_y);
    batch.submit_and_wait();
    const auto y_rows = ctx.read<float>(b_y);
    for (size_t i = 0; i < size_t(c.row) * c.E; ++i) ASSERT_TRUE(std::isnan(y_rows[i])) << "y element " << i;
    const std::vector<float> got(y_rows.begin() + size_t(c.row) * c.E, y_rows.end());
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << r.describe();

    // The ring: each token's B*x in row (pos + t) % R, every other row as it was.
    const auto ring_after = ctx.read<float>(b_ring);
    for (uint32_t row = 0; row < c.R; ++row) {
      const int64_t t = ((int64_t(row) - c.pos) % c.R + c.R) % c.R;  // the token whose position lands in this row
      for (uint32_t ch = 0; ch < c.E; ++ch) {
        const float g = ring_after[size_t(row) * c.E + ch];
        if (t < c.n) {
          const size_t base = size_t(t) * 3 * c.E;
          ASSERT_EQ(g, bcx[base + ch] * bcx[base + 2 * c.E + ch]) << "row " << row << " channel " << ch;
        } else {
          const float w = want_ring_before[size_t(row) * c.E + ch];
          ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << "row " << row << " channel " << ch;
        }
      }
    }
    // The L-1 rows the next call reads are the reference's next state.
    for (uint32_t j = 0; j + 1 < c.L; ++j) {
      const int64_t q = int64_t(c.pos) + c.n - (c.L - 1) + j;
      if (q < 0) continue;
      for (uint32_t ch = 0; ch < c.E; ++ch)
        ASSERT_EQ(ring_after[size_t(q % c.R) * c.E + ch], next_prev[size_t(j) * c.E + ch]) << "position " << q;
    }
  }
}

// A batched decode step over a pool of rings (encode_shortconv_rows): each row one token of its own sequence, at its
// own position (first tokens too) and ring; every row's output and ring row are the bits of encode_shortconv for
// that token alone on its ring at its offset in the same pool, the pool's other rows untouched (poison stays).
TEST(ShortConv, RowsOfAPoolAsIfAlone) {
  auto& ctx = context();
  const uint32_t E = 96, L = 3, R = 6, sequences = 5, n = 4;
  const uint32_t seq_of[n] = {3, 0, 4, 1}, pos_of[n] = {17, 0, 1, 250};  // sequence 2's ring is not touched
  auto gen = rng(41);
  const auto bcx = random_floats(size_t(n) * 3 * E, gen, -2.f, 2.f);
  const auto taps = random_floats(size_t(E) * L, gen, -1.f, 1.f);
  std::vector<float> pool = random_floats(size_t(sequences) * R * E, gen, -3.f, 3.f);
  for (uint32_t i = 0; i < n; ++i)  // the row each token writes: poison before the call
    std::fill_n(pool.begin() + (size_t(seq_of[i]) * R + pos_of[i] % R) * E, E, std::nanf(""));
  auto b_bcx = ctx.upload<float>(bcx, WGPUBufferUsage_Storage, "bcx");
  auto b_taps = ctx.upload<float>(taps, WGPUBufferUsage_Storage, "taps");
  std::vector<uint32_t> table;
  for (uint32_t i = 0; i < n; ++i) table.insert(table.end(), {pos_of[i], seq_of[i] * R * E});
  auto b_seqs = ctx.upload<uint32_t>(table, WGPUBufferUsage_Storage, "seqs");
  auto b_pool = ctx.upload<float>(pool, WGPUBufferUsage_Storage, "pool");
  auto b_y = ctx.upload<float>(std::vector<float>(size_t(n) * E, std::nanf("")), WGPUBufferUsage_Storage, "y");
  gpu::ComputeBatch batch(ctx);
  kernels::encode_shortconv_rows(batch, ctx, {.n_tokens = n, .n_embd = E, .taps = L, .ring_rows = R}, b_bcx, b_taps,
                                 b_pool, b_seqs, b_y);
  // the same tokens one call each, on another copy of the pool
  auto alone_pool = ctx.upload<float>(pool, WGPUBufferUsage_Storage, "alone pool");
  auto alone_y = ctx.upload<float>(std::vector<float>(size_t(n) * E, std::nanf("")), WGPUBufferUsage_Storage, "y'");
  for (uint32_t i = 0; i < n; ++i)
    kernels::encode_shortconv(batch, ctx,
                              {.n_tokens = 1,
                               .n_embd = E,
                               .taps = L,
                               .pos = pos_of[i],
                               .ring_rows = R,
                               .row = i,
                               .ring_offset = uint64_t(seq_of[i]) * R * E * 4},
                              b_bcx, b_taps, alone_pool, alone_y);
  batch.submit_and_wait();
  const auto y = ctx.read<uint32_t>(b_y), want_y = ctx.read<uint32_t>(alone_y);
  const auto got_pool = ctx.read<uint32_t>(b_pool), want_pool = ctx.read<uint32_t>(alone_pool);
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(got_pool, want_pool);
  const auto y_f = ctx.read<float>(b_y);
  for (size_t i = 0; i < y_f.size(); ++i) ASSERT_TRUE(std::isfinite(y_f[i])) << "y element " << i;
  // the written rows hold each token's B*x; sequence 2's ring is as it was
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t c = 0; c < E; ++c) {
      const size_t at = (size_t(seq_of[i]) * R + pos_of[i] % R) * E + c;
      ASSERT_EQ(std::bit_cast<float>(got_pool[at]), bcx[size_t(i) * 3 * E + c] * bcx[size_t(i) * 3 * E + 2 * E + c]);
    }
  for (size_t at = size_t(2) * R * E; at < size_t(3) * R * E; ++at)
    ASSERT_EQ(std::bit_cast<float>(got_pool[at]), pool[at]);
  // the contract: a table too short, a pool smaller than one ring; a ring offset off the f32 grid
  auto short_seqs = ctx.create_buffer(8, WGPUBufferUsage_Storage, "short seqs");
  expect_throw(
      [&] {
        kernels::encode_shortconv_rows(batch, ctx, {.n_tokens = n, .n_embd = E, .taps = L, .ring_rows = R}, b_bcx,
                                       b_taps, b_pool, short_seqs, b_y);
      },
      "seqs holds");
  expect_throw(
      [&] {
        kernels::encode_shortconv_rows(batch, ctx, {.n_tokens = n, .n_embd = E, .taps = L, .ring_rows = 1000}, b_bcx,
                                       b_taps, b_pool, b_seqs, b_y);
      },
      "less than one ring");
  expect_throw(
      [&] {
        kernels::encode_shortconv(batch, ctx, {.n_tokens = 1, .n_embd = E, .taps = L, .ring_rows = R, .ring_offset = 6},
                                  b_bcx, b_taps, b_pool, b_y);
      },
      "multiple of 4");
}

TEST(ShortConv, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "other");
  auto ring = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "ring");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  const kernels::ShortConvShape ok{.n_tokens = 4, .n_embd = 64, .taps = 3, .pos = 9, .ring_rows = 7};
  gpu::ComputeBatch batch(ctx);
  auto with = [&](auto edit) {
    kernels::ShortConvShape s = ok;
    edit(s);
    return s;
  };
  expect_throw(
      [&] { kernels::encode_shortconv(batch, ctx, with([](auto& s) { s.n_tokens = 0; }), buf, other, ring, small); },
      "n_tokens must");
  expect_throw(
      [&] { kernels::encode_shortconv(batch, ctx, with([](auto& s) { s.taps = 1; }), buf, other, ring, other); },
      "taps must");
  expect_throw(
      [&] { kernels::encode_shortconv(batch, ctx, with([](auto& s) { s.ring_rows = 5; }), buf, other, ring, other); },
      "ring_rows 5 < n_tokens + taps - 1 = 6");
  expect_throw([&] { kernels::encode_shortconv(batch, ctx, ok, small, other, ring, other); }, "bcx holds");
  expect_throw([&] { kernels::encode_shortconv(batch, ctx, ok, buf, small, ring, other); }, "taps holds");
  expect_throw([&] { kernels::encode_shortconv(batch, ctx, ok, buf, other, small, other); }, "ring holds");
  expect_throw([&] { kernels::encode_shortconv(batch, ctx, ok, buf, other, ring, small); }, "y holds");
  expect_throw([&] { kernels::encode_shortconv(batch, ctx, ok, buf, other, ring, ring); }, "different buffers");
}

}  // namespace
}  // namespace wgllm::test

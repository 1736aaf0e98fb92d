// RoPE (rope.wgsl, rope_angle.wgsl) vs a float64 reference; llama3 and YaRN frequency factors.
#include <algorithm>
#include <cmath>
#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::RopeScaling;
using kernels::RopeType;

// ------------------------------------------------------------------------------------ RoPE

struct RopeCase {
  const char* name;
  uint32_t n_tokens, n_heads, head_dim, rope_dim, start_pos;
  RopeType type = RopeType::Normal;
  float base = 10000.f;
  bool llama3 = false;
  uint32_t pad = 0, head_offset = 0;  // row_stride = head_offset + n_heads * head_dim + pad
  uint32_t heads2 = 0;                // heads in a second buffer (k beside q), same dispatch
};

constexpr auto Neox = RopeType::Neox;
constexpr auto Normal = RopeType::Normal;

// name, tokens, heads, head_dim, rope_dim, start_pos, type, base, llama3, pad, head_offset
const RopeCase kRopeCases[] = {
    {"normal_t1_h4_d64", 1, 4, 64, 64, 0},
    {"normal_t7_h3_d128_start5", 7, 3, 128, 128, 5},
    {"neox_t75_h2_d64", 75, 2, 64, 64, 0, Neox, 1000000.f},
    {"neox_partial_t3_h4_d128_r64", 3, 4, 128, 64, 17, Neox},
    {"normal_partial_t5_h2_d96_r32", 5, 2, 96, 32, 100, Normal},
    {"normal_d2", 4, 1, 2, 2, 1},
    {"neox_pos8k_t200_h2_d128", 200, 2, 128, 128, 8000, Neox, 1000000.f},
    {"normal_pos8k_t64_h4_d64", 64, 4, 64, 64, 8128},
    {"llama3_pos8k_t64_h2_d128", 64, 2, 128, 128, 8100, Normal, 500000.f, true},
    {"llama3_t75_h8_d64", 75, 8, 64, 64, 0, Normal, 500000.f, true},
    {"strided_k_in_qkv_t9_h2_d64", 9, 2, 64, 64, 30, Neox, 10000.f, false, 64, 256},
    {"pos30k_t8_h2_d64", 8, 2, 64, 64, 30000, Neox, 1000000.f},
    {"pos65k_t3_h2_d128", 3, 2, 128, 128, 65530, Normal, 10000.f},
    {"q_and_k_t5_h8_kv2_d64", 5, 8, 64, 64, 40, Normal, 10000.f, false, 0, 0, 2},
    {"q_and_k_neox_llama3_t70_h4_kv1_d128_r64", 70, 4, 128, 64, 7, Neox, 500000.f, true, 0, 0, 1},
    {"q_and_k_strided_t3_h2_kv3_d32", 3, 2, 32, 32, 900, Neox, 10000.f, false, 32, 64, 3},
};

class RopeTable : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTable, MatchesFloat64Reference) {
  const auto& c = GetParam();
  auto& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const uint32_t heads = c.n_heads * c.head_dim, stride = c.head_offset + heads + c.pad;
  const auto x = random_floats(size_t(c.n_tokens) * stride, gen, -2.f, 2.f);
  const RopeScaling scaling{
      .enabled = c.llama3, .factor = 8.f, .low_freq_factor = 1.f, .high_freq_factor = 4.f, .original_context = 8192};
  const auto factors = kernels::rope_freq_factors(scaling, c.rope_dim, c.base);
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, c.base,
                                          c.llama3 ? std::span<const float>(factors) : std::span<const float>());
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  const auto x2 = random_floats(size_t(c.n_tokens) * c.heads2 * c.head_dim, gen, -2.f, 2.f);
  std::optional<gpu::Buffer> x2buf;
  if (c.heads2) x2buf = ctx.upload<float>(x2, WGPUBufferUsage_Storage, "x2");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_rope(batch, ctx,
                       {.n_tokens = c.n_tokens,
                        .n_heads = c.n_heads,
                        .head_dim = c.head_dim,
                        .rope_dim = c.rope_dim,
                        .start_pos = c.start_pos,
                        .type = c.type,
                        .row_stride = stride,
                        .head_offset = c.head_offset,
                        .n_heads2 = c.heads2},
                       table, xbuf, x2buf ? &*x2buf : nullptr);
  batch.submit_and_wait();
  const auto freq = c.llama3 ? std::span<const float>(factors) : std::span<const float>();
  if (c.heads2) {
    const auto want2 =
        cpu::rope(x2, c.n_tokens, c.heads2, c.head_dim, c.rope_dim, c.start_pos, c.base, c.type == Neox, freq);
    const auto r2 = compare(ctx.read<float>(*x2buf), want2);
    EXPECT_LE(r2.rel_l2, 1e-6) << "x2: " << r2.describe();
  }
  const auto got_rows = ctx.read<float>(xbuf);
  // Dense heads for the reference; everything outside the heads must be untouched.
  std::vector<float> dense(size_t(c.n_tokens) * heads), got(dense.size());
  for (uint32_t t = 0; t < c.n_tokens; ++t) {
    std::copy_n(&x[size_t(t) * stride + c.head_offset], heads, &dense[size_t(t) * heads]);
    std::copy_n(&got_rows[size_t(t) * stride + c.head_offset], heads, &got[size_t(t) * heads]);
    for (uint32_t i = 0; i < stride; ++i)
      if (i < c.head_offset || i >= c.head_offset + heads) {
        ASSERT_EQ(got_rows[size_t(t) * stride + i], x[size_t(t) * stride + i]) << "token " << t << " float " << i;
      }
  }
  const auto want =
      cpu::rope(dense, c.n_tokens, c.n_heads, c.head_dim, c.rope_dim, c.start_pos, c.base, c.type == Neox, freq);
  const auto r = compare(got, want);
  // The reduced-angle path keeps f32 rounding (~1e-7) away from the position: measured ~2.5e-7 up to 2^16.
  EXPECT_LE(r.rel_l2, 1e-6) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeTable, ::testing::ValuesIn(kRopeCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Rope, Llama3FreqFactors) {
  const RopeScaling s{
      .enabled = true, .factor = 8.f, .low_freq_factor = 1.f, .high_freq_factor = 4.f, .original_context = 8192};
  const auto f = kernels::rope_freq_factors(s, 128, 500000.f);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.f);  // wavelength 2pi < 2048: unchanged
  EXPECT_EQ(f.back(), 8.f);   // wavelength > 8192: divided by factor
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]) << i;
  // The blend: i with wavelength between 2048 and 8192 (smooth in (0, 1)).
  for (size_t i = 0; i < f.size(); ++i) {
    const double freq = std::pow(500000.0, -2.0 * double(i) / 128), wl = 2 * M_PI / freq;
    if (wl > 2048 && wl < 8192) {
      const double smooth = (8192 / wl - 1) / 3;
      EXPECT_NEAR(f[i], 1 / ((1 - smooth) / 8 + smooth), 1e-5) << i;
    }
  }
  const auto plain = kernels::rope_freq_factors({}, 64, 10000.f);
  EXPECT_TRUE(std::all_of(plain.begin(), plain.end(), [](float v) { return v == 1.f; }));
}

// YaRN at gpt-oss's shape (head_dim 64, base 150000, factor 32 over 4096 positions, betas 32 and 1): the blend runs
// between dimension pairs 8 (wavelength turning 32 times over 4096 positions: 8.09, floored) and 18 (once: 17.40,
// ceiled); below it the frequencies are kept, above it divided by 32. The magnitude scale is 1 + 0.1 ln 32.
TEST(Rope, YarnFreqFactors) {
  const RopeScaling s{.enabled = true, .kind = kernels::RopeScalingKind::Yarn, .factor = 32.f, .original_context = 4096};
  const auto f = kernels::rope_freq_factors(s, 64, 150000.f);
  ASSERT_EQ(f.size(), 32u);
  for (size_t i = 0; i < f.size(); ++i) {
    const double r = 1 - std::clamp((double(i) - 8) / 10, 0.0, 1.0);  // 1: extrapolate (keep), 0: interpolate
    EXPECT_NEAR(f[i], 1 / ((1 - r) / 32 + r), 1e-5 * f[i]) << i;
  }
  EXPECT_EQ(f[8], 1.f);
  EXPECT_EQ(f[18], 32.f);
  EXPECT_NEAR(kernels::rope_yarn_mscale(s), 1 + 0.1 * std::log(32.0), 1e-6);
  RopeScaling llama3 = s;
  llama3.kind = kernels::RopeScalingKind::Llama3;
  EXPECT_EQ(kernels::rope_yarn_mscale(llama3), 1.f);
  EXPECT_EQ(kernels::rope_yarn_mscale({}), 1.f);
  RopeScaling bad = s;
  bad.beta_slow = 0;
  EXPECT_THROW(kernels::rope_freq_factors(bad, 64, 150000.f), InvalidArgument);
}

TEST(Rope, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  auto table = kernels::upload_rope_table(ctx, 64, 10000.f);
  gpu::ComputeBatch batch(ctx);
  const kernels::RopeShape good{.n_tokens = 4, .n_heads = 2, .head_dim = 64};
  auto rope_with = [&](auto edit, const gpu::Buffer& t, const gpu::Buffer& x) {
    kernels::RopeShape s = good;
    edit(s);
    kernels::encode_rope(batch, ctx, s, t, x);
  };
  expect_throw([&] { rope_with([](auto& s) { s.n_tokens = 0; }, table, buf); }, "n_tokens");
  expect_throw([&] { rope_with([](auto& s) { s.n_heads = 0; }, table, buf); }, "n_heads");
  expect_throw([&] { rope_with([](auto& s) { s.rope_dim = 65; }, table, buf); }, "rope_dim");
  expect_throw([&] { rope_with([](auto& s) { s.n_heads2 = 1; }, table, buf); }, "n_heads2");
  kernels::RopeShape with_k = good;
  with_k.n_heads2 = 1;
  expect_throw([&] { kernels::encode_rope(batch, ctx, with_k, table, buf, &buf); }, "x2 must be another buffer");
  expect_throw([&] { rope_with([](auto& s) { s.rope_dim = 128; }, table, buf); }, "rope_dim");
  expect_throw([&] { rope_with([](auto& s) { s.row_stride = 100; }, table, buf); }, "row_stride");
  expect_throw([&] { rope_with([](auto& s) { s.start_pos = 1u << 24; }, table, buf); }, "start_pos");
  expect_throw([&] { rope_with([](auto&) {}, small, buf); }, "table holds");
  expect_throw([&] { rope_with([](auto&) {}, table, small); }, "x holds");
  expect_throw([&] { kernels::upload_rope_table(ctx, 63, 10000.f); }, "rope_dim");
  expect_throw([&] { kernels::upload_rope_table(ctx, 64, 0.f); }, "base");
  expect_throw([&] { kernels::upload_rope_table(ctx, 64, 1e4f, std::vector<float>(3, 1.f)); }, "freq_factors");
}

}  // namespace
}  // namespace wgllm::test

// RMSNorm (norm.wgsl) vs the CPU reference.
#include <optional>
#include <tuple>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/norm.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

// --------------------------------------------------------------------------------- RMSNorm

struct NormCase {
  const char* name;
  uint32_t n_rows, dim;
  bool in_place = false;
  float eps = 1e-6f;
};

const NormCase kNormCases[] = {
    {"t1_d896", 1, 896},
    {"t3_d4096", 3, 4096, false, 1e-5f},
    {"t75_d33_odd", 75, 33},
    {"t1_d1", 1, 1},
    {"t7_d257_inplace", 7, 257, true},
    {"qk_norm_t7_h16_d128_inplace", 7 * 16, 128, true},
    {"qk_norm_t64_h2_d64", 64 * 2, 64},
    {"eps_zero_t2_d100", 2, 100, false, 0.f},
};

class RmsNormTable : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormTable, MatchesCpuReference) {
  const auto& c = GetParam();
  auto& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const auto x = random_floats(size_t(c.n_rows) * c.dim, gen, -3.f, 3.f);
  const auto w = random_floats(c.dim, gen, 0.5f, 1.5f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto wbuf = ctx.upload<float>(w, WGPUBufferUsage_Storage, "w");
  std::optional<gpu::Buffer> ybuf;
  if (!c.in_place) ybuf = poisoned(ctx, x.size(), "y");
  const gpu::Buffer& y = c.in_place ? xbuf : *ybuf;
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_rms_norm(batch, ctx, xbuf, wbuf, y, c.n_rows, c.dim, c.eps);
  batch.submit_and_wait();
  const auto r = compare(ctx.read<float>(y), cpu::rms_norm(x, w, c.n_rows, c.dim, c.eps));
  EXPECT_LE(r.rel_l2, 1e-6) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, RmsNormTable, ::testing::ValuesIn(kNormCases),
                         [](const auto& info) { return std::string(info.param.name); });

// silu_gate: y = rms_norm(x) * w * silu(gate) (qwen35's DeltaNet output per value head), also in place; a gate of
// -200 gives 0, one of 0 gives 0 (silu(0) = 0).
TEST(Norm, SiluGateMultipliesTheNorm) {
  auto& ctx = context();
  for (auto [rows, dim, in_place] : {std::tuple{1u, 128u, false}, {16u * 7, 128u, false}, {5u, 33u, true}}) {
    auto gen = rng(rows * 977 + dim);
    const auto x = random_floats(size_t(rows) * dim, gen, -3.f, 3.f);
    const auto w = random_floats(dim, gen, 0.5f, 1.5f);
    auto gate = random_floats(size_t(rows) * dim, gen, -6.f, 6.f);
    gate[0] = -200.f;
    gate[1] = 0.f;
    auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
    auto wbuf = ctx.upload<float>(w, WGPUBufferUsage_Storage, "w");
    auto gbuf = ctx.upload<float>(gate, WGPUBufferUsage_Storage, "gate");
    std::optional<gpu::Buffer> ybuf;
    if (!in_place) ybuf = poisoned(ctx, x.size(), "y");
    const gpu::Buffer& y = in_place ? xbuf : *ybuf;
    gpu::ComputeBatch batch(ctx);
    kernels::encode_rms_norm(batch, ctx, xbuf, wbuf, y, rows, dim, 1e-6f, false, &gbuf);
    batch.submit_and_wait();
    const auto normed = cpu::rms_norm(x, w, rows, dim, 1e-6f);
    const auto want = cpu::swiglu(gate, normed);
    const auto got = ctx.read<float>(y);
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << rows << "x" << dim << ": " << r.describe();
    EXPECT_EQ(got[0], 0.f);
    EXPECT_EQ(got[1], 0.f);
  }
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 4, 64, 1e-6f, false, &small); },
               "silu_gate holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 4, 64, 1e-6f, false, &buf); },
               "silu_gate and y must be different buffers");
}

// accumulate: y = (y + rms_norm(x) * w) * out_scale (gemma's post-norms added into the residual stream, Gemma 4's
// layer output scale after the last).
TEST(Norm, AccumulateAddsIntoY) {
  auto& ctx = context();
  for (auto [rows, dim, out_scale] : {std::tuple{1u, 640u, 1.f}, {75u, 64u, 1.f}, {3u, 257u, 1.f}, {2u, 1536u, 0.37f},
                                      {9u, 96u, -2.5f}}) {
    auto gen = rng(rows * 1000 + dim);
    const auto x = random_floats(size_t(rows) * dim, gen, -3.f, 3.f);
    const auto w = random_floats(dim, gen, 0.5f, 1.5f);
    const auto y0 = random_floats(size_t(rows) * dim, gen, -10.f, 10.f);
    auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
    auto wbuf = ctx.upload<float>(w, WGPUBufferUsage_Storage, "w");
    auto ybuf = ctx.upload<float>(y0, WGPUBufferUsage_Storage, "y");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_rms_norm(batch, ctx, xbuf, wbuf, ybuf, rows, dim, 1e-6f, true, nullptr, out_scale);
    batch.submit_and_wait();
    auto want = cpu::rms_norm(x, w, rows, dim, 1e-6f);
    for (size_t i = 0; i < want.size(); ++i) want[i] = float((double(want[i]) + double(y0[i])) * out_scale);
    const auto r = compare(ctx.read<float>(ybuf), want);
    EXPECT_LE(r.rel_l2, 1e-6) << rows << "x" << dim << ": " << r.describe();
  }
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 2, 64, 1e-6f, true); }, "accumulate");
  auto y = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "y");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, y, 2, 64, 1e-6f, false, nullptr, 2.f); },
               "out_scale");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, y, 2, 64, 1e-6f, true, nullptr, INFINITY); },
               "out_scale");
}

TEST(Norm, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, small, other, 2, 64, 1e-6f); }, "w holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, small, buf, other, 2, 64, 1e-6f); }, "x holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, small, 2, 64, 1e-6f); }, "y holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 0, 64, 1e-6f); }, "n_rows");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 2, 0, 1e-6f); }, "dim");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 2, 64, -1.f); }, "eps");
}

}  // namespace
}  // namespace wgllm::test

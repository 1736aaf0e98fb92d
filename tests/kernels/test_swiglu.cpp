// SwiGLU (swiglu.wgsl) vs the CPU reference.
#include <cmath>
#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/swiglu.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

// ---------------------------------------------------------------------------------- SwiGLU

// out = act(gate) * up through swiglu.wgsl (the output poisoned first).
std::vector<float> gated_on_gpu(gpu::Context& ctx, const std::vector<float>& gate, const std::vector<float>& up,
                                kernels::GateAct act) {
  const uint32_t n = uint32_t(gate.size());
  auto g = ctx.upload<float>(gate, WGPUBufferUsage_Storage, "gate");
  auto u = ctx.upload<float>(up, WGPUBufferUsage_Storage, "up");
  auto out = poisoned(ctx, n, "out");
  gpu::ComputeBatch batch(ctx);
  kernels::encode_swiglu(batch, ctx, g, u, out, n, act);
  batch.submit_and_wait();
  return ctx.read<float>(out);
}

TEST(Swiglu, MatchesCpuReference) {
  auto& ctx = context();
  for (uint32_t n : {1u, 255u, 256u * 3 + 7, 4864u * 7, 100000u}) {
    auto gen = rng(n);
    auto gate = random_floats(n, gen, -12.f, 12.f);
    gate[n / 2] = -100.f;  // e^100 overflows f32: silu -> -0 (the reference: a denormal)
    gate[n - 1] = 100.f;
    const auto up = random_floats(n, gen, -2.f, 2.f);
    const auto r = compare(gated_on_gpu(ctx, gate, up, kernels::GateAct::Silu), cpu::swiglu(gate, up));
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << n << ": " << r.describe();
  }
}

// GeGLU: gelu_tanh(gate) * up (gemma), through the same kernel; extreme gates saturate to 0 and to the identity.
TEST(Swiglu, GeluTanhMatchesCpuReference) {
  auto& ctx = context();
  for (uint32_t n : {1u, 257u, 4864u * 3 + 5}) {
    auto gen = rng(n + 17);
    auto gate = random_floats(n, gen, -8.f, 8.f);
    gate[n / 2] = -100.f;
    gate[n - 1] = 1e15f;  // x^3 overflows f32: gelu -> x
    const auto up = random_floats(n, gen, -2.f, 2.f);
    const auto got = gated_on_gpu(ctx, gate, up, kernels::GateAct::GeluTanh);
    const auto want = cpu::geglu(gate, up);
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << n << ": " << r.describe();
    for (uint32_t i : {n / 2, n - 1}) EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i]) + 1e-30) << i;
  }
}

// gpt-oss's clamped SwiGLU through the same kernel: gates above 7 and ups outside [-7, 7] clamped (values well past
// both, and exactly at them), very negative gates to 0.
TEST(Swiglu, OaiMatchesCpuReference) {
  auto& ctx = context();
  for (uint32_t n : {1u, 257u, 2880u * 4 + 3}) {
    auto gen = rng(n + 29);
    auto gate = random_floats(n, gen, -12.f, 12.f);
    auto up = random_floats(n, gen, -12.f, 12.f);
    gate[n / 2] = -100.f;
    gate[n - 1] = 7.f;
    up[n - 1] = -7.f;
    const auto got = gated_on_gpu(ctx, gate, up, kernels::GateAct::SwigluOai);
    const auto want = cpu::swiglu_oai(gate, up);
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << n << ": " << r.describe();
    // a gate clamped to 7 and an up of -7 (u + 1 = -6): 7 sigmoid(11.914) * -6
    EXPECT_NEAR(want[n - 1], 7.0 / (1.0 + std::exp(-1.702 * 7.0)) * -6.0, 1e-5);
  }
}

// qwen35's attention gate, sigmoid(gate) * up: gates far past the sigmoid's saturation both ways (e^-g overflows to
// infinity: 0), and one at 0 (1/2).
TEST(Swiglu, SigmoidGateMatchesCpuReference) {
  auto& ctx = context();
  for (uint32_t n : {1u, 257u, 2048u * 3 + 7}) {
    auto gen = rng(n + 41);
    auto gate = random_floats(n, gen, -10.f, 10.f);
    const auto up = random_floats(n, gen, -3.f, 3.f);
    gate[n - 1] = 0.f;
    if (n > 1) gate[n / 2] = -200.f;
    const auto got = gated_on_gpu(ctx, gate, up, kernels::GateAct::Sigmoid);
    const auto want = cpu::gated(3, gate, up);
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << n << ": " << r.describe();
    if (n > 1) {
      EXPECT_EQ(got[n / 2], 0.f);
    }
    EXPECT_FLOAT_EQ(want[n - 1], up[n - 1] / 2);
  }
}

// up read in rows (UpRows): one slice of width floats out of each row of stride (gemma4's per-layer inputs, a
// layer's slice of every token's row), against the reference on the gathered slices; the rest of up is never read.
TEST(Swiglu, StridedUpMatchesCpuReference) {
  auto& ctx = context();
  struct Case {
    uint32_t rows, width, stride, offset;
  };
  for (const Case& c : {Case{1, 16, 16, 0}, Case{7, 16, 96, 80}, Case{33, 256, 256 * 35, 256 * 17}, Case{5, 3, 11, 4}}) {
    auto gen = rng(c.rows * 131 + c.offset);
    const uint32_t n = c.rows * c.width;
    const auto gate = random_floats(n, gen, -8.f, 8.f);
    const auto up_all = random_floats(size_t(c.rows) * c.stride, gen, -2.f, 2.f);
    std::vector<float> up(n);
    for (uint32_t r = 0; r < c.rows; ++r)
      for (uint32_t i = 0; i < c.width; ++i) up[size_t(r) * c.width + i] = up_all[size_t(r) * c.stride + c.offset + i];
    auto g = ctx.upload<float>(gate, WGPUBufferUsage_Storage, "gate");
    auto u = ctx.upload<float>(up_all, WGPUBufferUsage_Storage, "up");
    auto out = poisoned(ctx, n, "out");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_swiglu(batch, ctx, g, u, out, n, kernels::GateAct::GeluTanh,
                           {.width = c.width, .stride = c.stride, .offset = c.offset});
    batch.submit_and_wait();
    const auto r = compare(ctx.read<float>(out), cpu::geglu(gate, up));
    EXPECT_LE(r.rel_l2, 1e-6) << c.rows << " rows of " << c.width << " at " << c.offset << " of " << c.stride << ": "
                              << r.describe();
  }
}

TEST(Swiglu, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  auto third = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "third");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, buf, 16); }, "out must differ");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, small, other, buf, 16); }, "gate holds");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, small, 16); }, "out holds");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, small, 0); }, "n must");
  const kernels::GateAct gelu = kernels::GateAct::GeluTanh;
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, buf, 16, gelu, {.width = 3, .stride = 8}); },
               "not a multiple of up_rows.width");
  expect_throw(
      [&] { kernels::encode_swiglu(batch, ctx, buf, other, buf, 16, gelu, {.width = 8, .stride = 8, .offset = 1}); },
      "exceeds up_rows.stride");
  // 16 rows of 8 at 1024 apart reach past the 4096 floats of up
  expect_throw(
      [&] { kernels::encode_swiglu(batch, ctx, other, buf, third, 128, gelu, {.width = 8, .stride = 1024}); },
      "up holds");
}

}  // namespace
}  // namespace wgllm::test

// Scale and softcap (scale.wgsl) vs double-precision arithmetic.
#include <cmath>

#include "kernel_test_util.h"
#include "kernels/scale.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

TEST(Scale, ScalesAndSoftcapsInPlace) {
  auto& ctx = context();
  struct Case {
    uint32_t n;
    float scale, softcap;
  };
  for (const Case c : {Case{1, 25.2982f, 0.f}, Case{257, 1.f, 30.f}, Case{70000, 0.5f, 3.f}, Case{1000, -2.f, 0.f}}) {
    auto gen = rng(c.n);
    auto x = random_floats(c.n, gen, -50.f, 50.f);
    if (c.softcap > 0) x[c.n / 2] = 3e38f;  // far past the cap: exactly +-cap, never NaN
    x[c.n - 1] = -1e-30f;
    auto buf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_scale(batch, ctx, buf, c.n, c.scale, c.softcap);
    batch.submit_and_wait();
    const auto got = ctx.read<float>(buf);
    std::vector<float> want(c.n);
    for (uint32_t i = 0; i < c.n; ++i) {
      const double v = double(x[i]) * c.scale;
      want[i] = float(c.softcap > 0 ? c.softcap * std::tanh(v / c.softcap) : v);
    }
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << c.n << ": " << r.describe();
    if (c.softcap > 0) {
      EXPECT_FLOAT_EQ(got[c.n / 2], c.scale > 0 ? c.softcap : -c.softcap);
    }
  }
}

TEST(Scale, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_scale(batch, ctx, small, 5, 1.f); }, "x holds");
  expect_throw([&] { kernels::encode_scale(batch, ctx, small, 0, 1.f); }, "n must");
  expect_throw([&] { kernels::encode_scale(batch, ctx, small, 4, NAN); }, "scale must");
  expect_throw([&] { kernels::encode_scale(batch, ctx, small, 4, 1.f, -1.f); }, "softcap must");
}

}  // namespace
}  // namespace wgllm::test

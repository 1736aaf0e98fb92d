// The matvec's pre-residual prologue (MatmulOptions::pre, a post-norm's residual add before the product) against
// float64.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;

// MatmulOptions::pre: the post-norm's residual add in the matvec's prologue, x' = (x + rms_norm(src) * w) * scale,
// then the product of x' (here with the RMSNorm folded in, and SwiGLU), against double; x' itself into `out`. On a
// CPU adapter the Rows kernel is off for it (rows_shape "off"); with the adapter's own choice there, Auto runs Rows
// and pre is refused. The shapes: one workgroup's worth of rows and many, in a 64-thread workgroup too, and grown to
// 64 rows a workgroup (ContextOptions::pre_rows); the sum of squares through subgroups and, without them, a tree.
TEST(Matmul, PreResidualInTheMatvecPrologue) {
  for (const auto& [shape, no_subgroups, pre_rows] : {std::tuple{"", false, 0u}, std::tuple{"16x2x4", false, 0u},
                                                      std::tuple{"", true, 0u}, std::tuple{"", false, 64u}}) {
    gpu::Context ctx(context_options([&](auto& o) {
      o.rows_shape = "off";
      o.matvec_shape = shape;
      o.disable_subgroups = no_subgroups;
      if (pre_rows) o.pre_rows = pre_rows;
    }));
    if (pre_rows) {  // the grown shape is the one the products below run
      const kernels::MatvecConfig own = kernels::matvec_config(ctx, 130, 512, Q4_K);
      const kernels::MatvecConfig grown = kernels::pre_matvec_config(ctx, 130, 512, Q4_K, 0);
      EXPECT_EQ(grown.threads_per_row, own.threads_per_row);
      EXPECT_GE(grown.rows * grown.groups, std::min(pre_rows, 256 / own.threads_per_row * own.rows));
    }
    for (const auto& [type, n_in, n_out, swiglu] :
         {std::tuple{F16, 640u, 37u, false}, std::tuple{Q4_K, 512u, 130u, true}, std::tuple{Q8_0, 96u, 6u, false},
          std::tuple{F32, 1536u, 64u, true}}) {
      SCOPED_TRACE(std::string("shape '") + shape + (no_subgroups ? "', no subgroups, " : "', ") +
                   (pre_rows ? "pre_rows " + std::to_string(pre_rows) + ", " : std::string()) +
                   std::string(type_name(type)) + " " + std::to_string(n_in) + "x" + std::to_string(n_out));
      auto gen = rng(n_in * 7 + n_out);
      const auto bytes = random_weight(type, n_in, n_out, gen);
      const auto w = kernels::upload_weight(ctx, type, n_in, n_out, bytes, "w");
      ASSERT_TRUE(kernels::matvec_takes_pre(ctx, w));
      const auto x = random_floats(n_in, gen, -3.f, 3.f), src = random_floats(n_in, gen, -50.f, 50.f);
      const auto post = random_floats(n_in, gen, 0.5f, 1.5f), g = random_floats(n_in, gen, 0.5f, 1.5f);
      const float scale = 0.75f, eps = 1e-6f;
      auto xb = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
      auto sb = ctx.upload<float>(src, WGPUBufferUsage_Storage, "src");
      auto pb = ctx.upload<float>(post, WGPUBufferUsage_Storage, "post");
      auto gb = ctx.upload<float>(g, WGPUBufferUsage_Storage, "g");
      auto out = poisoned(ctx, n_in, "x'");
      auto y = poisoned(ctx, swiglu ? n_out / 2 : n_out, "y");
      gpu::ComputeBatch batch(ctx);
      kernels::MatmulOptions o{.norm = &gb, .eps = eps, .swiglu = swiglu};
      o.pre = kernels::MatmulOptions::PreResidual{&sb, &pb, &out, scale};
      kernels::encode_matmul(batch, ctx, w, xb, y, 1, o);
      batch.submit_and_wait();
      // x' and the normed x' * g in double
      double ss = 0;
      for (float v : src) ss += double(v) * v;
      const double inv = 1 / std::sqrt(ss / n_in + eps);
      std::vector<double> xp(n_in);
      double ss2 = 0;
      for (uint32_t i = 0; i < n_in; ++i) {
        xp[i] = (x[i] + src[i] * inv * post[i]) * scale;
        ss2 += xp[i] * xp[i];
      }
      EXPECT_LE(compare(ctx.read<float>(out), xp).rel_l2, 1e-6);
      const double inv2 = 1 / std::sqrt(ss2 / n_in + eps);
      std::vector<double> dots(n_out);
      for (uint32_t r = 0; r < n_out; ++r) {
        const auto row = cpu::dequantize_row(type, bytes, n_in, r);
        for (uint32_t i = 0; i < n_in; ++i) dots[r] += double(row[i]) * xp[i] * inv2 * g[i];
      }
      std::vector<double> want;
      for (uint32_t r = 0; r < n_out; r += swiglu ? 2 : 1)
        want.push_back(swiglu ? dots[r] / (1 + std::exp(-dots[r])) * dots[r + 1] : dots[r]);
      const auto e = compare(ctx.read<float>(y), want);
      EXPECT_LE(e.rel_l2, 1e-5) << e.describe();
    }
  }
  // Where Auto takes the Rows kernel (CPU adapters) or a batch shape, pre is refused
  gpu::Context& ctx = context();
  auto gen = rng(5);
  const auto w = kernels::upload_weight(ctx, F16, 64, 8, random_weight(F16, 64, 8, gen), "w");
  EXPECT_FALSE(kernels::matvec_takes_pre(ctx, w, MatmulImpl::Batch));
  if (ctx.adapter().is_cpu()) {
    EXPECT_FALSE(kernels::matvec_takes_pre(ctx, w));
    auto a = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "a"),
         b = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "b");
    auto c = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "c"),
         y = ctx.create_buffer(64, WGPUBufferUsage_Storage, "y");
    gpu::ComputeBatch batch(ctx);
    kernels::MatmulOptions o;
    o.pre = kernels::MatmulOptions::PreResidual{&b, &b, &c, 1.f};
    expect_throw([&] { kernels::encode_matmul(batch, ctx, w, a, y, 1, o); }, "matvec_takes_pre");
  }
}

}  // namespace
}  // namespace wgllm::test

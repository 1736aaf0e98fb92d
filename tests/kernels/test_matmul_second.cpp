// A second weight's rows read by the same one-token product (MatmulOptions::second, matmul_common.wgsl's TWO_TYPES):
// q and k rows of one block type, v rows of another, into split outputs, with the norm, bias and pre-residual
// prologues, against a float64 reference; poisoned outputs, the GPUs' matvec shapes, with and without subgroups.
// (The RoPE + KV-append epilogue's use of it: test_qkv_rope_append.cpp.)
#include <cmath>
#include <iterator>
#include <optional>
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

struct SecondCase {
  GgufType type, type2;
  uint32_t n_in, n_qk, n_v;
  bool bias, pre;
};

std::string describe(const SecondCase& c) {
  return std::string(type_name(c.type)) + " then " + type_name(c.type2) + ", n_in " + std::to_string(c.n_in) +
         ", rows " + std::to_string(c.n_qk) + " + " + std::to_string(c.n_v) + (c.bias ? ", bias" : "") +
         (c.pre ? ", pre" : "");
}

// y (q rows), y1 (k rows) and y2 (v rows, the second weight's) of rms_norm(x) * g, x the pre-residual's x' where
// c.pre, against float64; throws-check where the shape cannot take the second weight.
void check_second(gpu::Context& ctx, const SecondCase& c) {
  SCOPED_TRACE(describe(c));
  auto gen = rng(std::hash<std::string>{}(describe(c)));
  const uint32_t n_q = c.n_qk * 2 / 3, n_k = c.n_qk - n_q, N = c.n_qk + c.n_v;
  const auto bytes = random_weight(c.type, c.n_in, c.n_qk, gen), bytes2 = random_weight(c.type2, c.n_in, c.n_v, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_qk, bytes, "wqk");
  const auto w2 = kernels::upload_weight(ctx, c.type2, c.n_in, c.n_v, bytes2, "wv");
  const auto x = random_floats(c.n_in, gen, -2.f, 2.f), g = random_floats(c.n_in, gen, 0.5f, 1.5f);
  const auto src = random_floats(c.n_in, gen, -20.f, 20.f), post = random_floats(c.n_in, gen, 0.5f, 1.5f);
  const auto bias = random_floats(N, gen);
  std::vector<float> padded = g;
  padded.resize((c.n_in + 7) / 8 * 8, 0.f);
  auto xb = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto gb = ctx.upload<float>(padded, WGPUBufferUsage_Storage, "norm");
  auto sb = ctx.upload<float>(src, WGPUBufferUsage_Storage, "src");
  auto pb = ctx.upload<float>(post, WGPUBufferUsage_Storage, "post");
  auto bb = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
  auto y = poisoned(ctx, n_q, "q"), y1 = poisoned(ctx, n_k, "k"), y2 = poisoned(ctx, c.n_v, "v");
  auto out = poisoned(ctx, c.n_in, "x'");
  kernels::MatmulOptions o{.bias = c.bias ? &bb : nullptr,
                           .norm = &gb,
                           .eps = 1e-5f,
                           .y1 = &y1,
                           .y2 = &y2,
                           .split1 = n_q,
                           .split2 = c.n_qk,
                           .second = &w2};
  const float scale = 0.5f;
  if (c.pre) o.pre = kernels::MatmulOptions::PreResidual{&sb, &pb, &out, scale};
  gpu::ComputeBatch batch(ctx);
  if (!kernels::detail::matvec_takes_second(ctx, w, w2)) {  // the shape's rows do not divide w's, or a Rows kernel
    EXPECT_TRUE(kernels::rows_kernel_for(ctx, c.type) || kernels::rows_kernel_for(ctx, c.type2) ||
                c.n_qk % (kernels::matvec_config(ctx, N, c.n_in, c.type).rows *
                          kernels::matvec_config(ctx, N, c.n_in, c.type).groups) !=
                    0);
    expect_throw([&] { kernels::encode_matmul(batch, ctx, w, xb, y, 1, o); }, "matvec_takes_second");
    return;
  }
  kernels::encode_matmul(batch, ctx, w, xb, y, 1, o);
  batch.submit_and_wait();

  std::vector<double> xp(x.begin(), x.end());
  if (c.pre) {
    double ss = 0;
    for (float v : src) ss += double(v) * v;
    const double inv = 1 / std::sqrt(ss / c.n_in + 1e-5);
    for (uint32_t i = 0; i < c.n_in; ++i) xp[i] = (x[i] + src[i] * inv * post[i]) * scale;
    EXPECT_LE(compare(ctx.read<float>(out), xp).rel_l2, 1e-6) << "x'";
  }
  double ss = 0;
  for (double v : xp) ss += v * v;
  const double inv = 1 / std::sqrt(ss / c.n_in + 1e-5);
  std::vector<double> rows(N);
  for (uint32_t r = 0; r < N; ++r) {
    const auto row = r < c.n_qk ? cpu::dequantize_row(c.type, bytes, c.n_in, r)
                                : cpu::dequantize_row(c.type2, bytes2, c.n_in, r - c.n_qk);
    for (uint32_t i = 0; i < c.n_in; ++i) rows[r] += double(row[i]) * xp[i] * inv * g[i];
    if (c.bias) rows[r] += bias[r];
  }
  const std::vector<double> q(rows.begin(), rows.begin() + n_q), k(rows.begin() + n_q, rows.begin() + c.n_qk),
      v(rows.begin() + c.n_qk, rows.end());
  for (const auto& [name, buf, want] : {std::tuple{"q", &y, &q}, {"k", &y1, &k}, {"v", &y2, &v}}) {
    const auto e = compare(ctx.read<float>(*buf), *want);
    EXPECT_LE(e.rel_l2, 1e-5) << name << ": " << e.describe();
  }
}

// Q4_K_M's q/k and v (Q4_K, Q6_K), Gemma 3 270M's (Q5_0, Q8_0 over rows of 640), and other block-type pairs; q/k rows
// a multiple of the shapes' rows a workgroup (16 at most here; BadArgumentsThrow has rows that are not).
const SecondCase kCases[] = {
    {GgufType::Q4_K, GgufType::Q6_K, 256, 192, 64, true, false},
    {GgufType::Q4_K, GgufType::Q6_K, 512, 384, 128, false, true},
    {GgufType::Q5_0, GgufType::Q8_0, 640, 192, 64, true, true},
    {GgufType::Q8_0, GgufType::Q4_0, 96, 96, 32, false, false},
    {GgufType::MXFP4, GgufType::Q8_0, 128, 192, 64, true, true},
    {GgufType::Q4_0, GgufType::Q5_K, 256, 48, 16, false, true},
};

// Every case in the adapter's shape, three (each pipeline compiled costs lavapipe seconds) in a GPU's shape and in
// one without subgroups (the RoPE epilogue's table runs the two-type loop in more shapes), and the pre cases with
// workgroups grown to 64 rows (ContextOptions::pre_rows) where the q/k rows allow (not case 5's 48).
TEST(MatmulSecond, SplitOutputsMatchReference) {
  for (const char* shape : {"", "32x4x4", "8x2x8", "pre64"}) {
    SCOPED_TRACE(std::string("matvec shape '") + shape + "'");
    const bool grown = shape[0] == 'p';
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = grown ? "" : shape;
      o.rows_shape = "off";
      o.disable_subgroups = shape[0] == '8';
      if (grown) o.pre_rows = 64;
    }));
    for (size_t i = 0; i < std::size(kCases); ++i)
      if (grown ? kCases[i].pre : shape[0] == 0 || i == 1 || i == 2 || i == 5) check_second(ctx, kCases[i]);
  }
}

TEST(MatmulSecond, BadArgumentsThrow) {
  gpu::Context ctx(context_options([](auto& o) {
    o.matvec_shape = "32x4x4";
    o.rows_shape = "off";
  }));
  auto gen = rng(11);
  const auto w = kernels::upload_weight(ctx, GgufType::Q4_0, 64, 48, random_weight(GgufType::Q4_0, 64, 48, gen), "w");
  const auto w2 = kernels::upload_weight(ctx, GgufType::Q8_0, 64, 16, random_weight(GgufType::Q8_0, 64, 16, gen), "v");
  const auto same = kernels::upload_weight(ctx, GgufType::Q4_0, 64, 16, random_weight(GgufType::Q4_0, 64, 16, gen), "");
  const auto f16 = kernels::upload_weight(ctx, GgufType::F16, 64, 16, random_weight(GgufType::F16, 64, 16, gen), "");
  auto x = ctx.create_buffer(64 * 4 * 2, WGPUBufferUsage_Storage, "x");
  auto y = poisoned(ctx, 64, "y"), y1 = poisoned(ctx, 64, "y1"), y2 = poisoned(ctx, 64, "y2");
  const kernels::MatmulOptions ok{.y1 = &y1, .y2 = &y2, .split1 = 32, .split2 = 48, .second = &w2};
  gpu::ComputeBatch batch(ctx);
  auto run = [&](auto edit, uint32_t n_tokens = 1, const kernels::GpuWeight* weight = nullptr) {
    kernels::MatmulOptions o = ok;
    edit(o);
    kernels::encode_matmul(batch, ctx, weight ? *weight : w, x, y, n_tokens, o);
  };
  const auto unchanged = [](kernels::MatmulOptions&) {};
  ASSERT_TRUE(kernels::detail::matvec_takes_second(ctx, w, w2));
  EXPECT_NO_THROW(run(unchanged));
  expect_throw([&] { run(unchanged, 2); }, "second weight");                            // one token only
  expect_throw([&] { run([](auto& o) { o.split2 = 40; }); }, "second weight");          // w's rows, then w2's
  expect_throw([&] { run([](auto& o) { o.y1 = o.y2 = nullptr; }); }, "second weight");  // split outputs
  expect_throw([&] { run([](auto& o) { o.impl = MatmulImpl::Tiled; }); }, "second weight");
  expect_throw([&] { run([](auto& o) { o.impl = MatmulImpl::Batch; }); }, "second weight");
  expect_throw([&] { run([&](auto& o) { o.second = &same; }); }, "matvec_takes_second");  // the same type
  expect_throw([&] { run([&](auto& o) { o.second = &f16; }); }, "matvec_takes_second");   // a float type
  expect_throw([&] { run([](auto& o) { o.y2 = nullptr; }); }, "y2 exactly when");         // v's rows need y2
  // q/k rows that do not fill whole workgroups (16 rows a workgroup in this shape)
  const auto w40 = kernels::upload_weight(ctx, GgufType::Q4_0, 64, 40, random_weight(GgufType::Q4_0, 64, 40, gen), "");
  ASSERT_FALSE(kernels::detail::matvec_takes_second(ctx, w40, w2));
  expect_throw([&] { run([](auto& o) { o.split1 = 24, o.split2 = 40; }, 1, &w40); }, "matvec_takes_second");
  // its own rows count in the checks of bias and outputs
  auto short_bias = ctx.create_buffer(48 * 4, WGPUBufferUsage_Storage, "bias");
  expect_throw([&] { run([&](auto& o) { o.bias = &short_bias; }); }, "bias");
  auto short_y2 = poisoned(ctx, 8, "y2");
  expect_throw([&] { run([&](auto& o) { o.y2 = &short_y2; }); }, "y2");
}

}  // namespace
}  // namespace wgllm::test

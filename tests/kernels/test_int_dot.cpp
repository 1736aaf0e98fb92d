// Q4_K products on packed int8 dot products (int_dot.wgsl) vs the dequantised weight times x in double, and beside
// the f32 matvec's error on the same inputs.
#include <cmath>
#include <initializer_list>
#include <optional>

#include "kernel_test_util.h"
#include "kernels/int_dot.h"
#include "kernels/matmul.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

struct IntCase {
  uint32_t n_in, n_rows;
};

// encode_x_digits + encode_matvec_int against the dequantised weight times x in double, within the digits' bound per
// row; the f32 matvec on the same inputs alongside for its error. With `norm`: x RMS-normalised with random weights
// g first (the digits of x * g, the product's 1 / rms), against the matvec's FLAG_NORM.
void check_int_products(gpu::Context& ctx, std::initializer_list<IntCase> cases, bool norm = false) {
  constexpr float kEps = 1e-5f;
  for (const IntCase c : cases) {
    SCOPED_TRACE("n_in " + std::to_string(c.n_in) + ", rows " + std::to_string(c.n_rows) + (norm ? ", norm" : ""));
    auto gen = rng(c.n_in * 131 + c.n_rows);
    const auto bytes = random_weight(Q4_K, c.n_in, c.n_rows, gen);
    auto x = random_floats(c.n_in, gen, -2.f, 2.f);
    // Edge blocks: all zeros; one element 1000x the rest (the others keep ~13 bits); values near f32's smallest
    // normals; one element alone in its block.
    for (uint32_t i = 0; i < 32; ++i) x[i] = 0.f;
    if (c.n_in >= 128) {
      x[32 + 5] = 2000.f;
      for (uint32_t i = 64; i < 96; ++i) x[i] *= 1e-36f;
      for (uint32_t i = 96; i < 128; ++i) x[i] = i == 100 ? -3.f : 0.f;
    }
    const auto g = norm ? random_floats(c.n_in, gen, 0.25f, 2.f) : std::vector<float>(c.n_in, 1.f);
    double mean_sq = 0;
    for (float v : x) mean_sq += double(v) * v / c.n_in;
    const double inv_rms = norm ? 1.0 / std::sqrt(mean_sq + kEps) : 1.0;
    auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
    auto gbuf = ctx.upload<float>(g, WGPUBufferUsage_Storage, "g");
    const auto w = kernels::upload_weight(ctx, Q4_K, c.n_in, c.n_rows, bytes);
    const auto xd = kernels::make_x_digits(ctx, c.n_in, 1);
    auto y = poisoned(ctx, c.n_rows, "y");
    auto y32 = poisoned(ctx, c.n_rows, "y f32");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_x_digits(batch, ctx, xbuf, xd, norm ? &gbuf : nullptr);
    kernels::encode_matvec_int(batch, ctx, w, xd, y, norm ? std::optional<float>(kEps) : std::nullopt);
    kernels::encode_matmul(batch, ctx, w, xbuf, y32, 1, {.norm = norm ? &gbuf : nullptr, .eps = kEps});
    batch.submit_and_wait();
    const auto got = ctx.read<float>(y);
    const auto got32 = ctx.read<float>(y32);

    // The bound per row: each element is represented within 2^-23 of its block's largest |x| (half a unit of the
    // digits' last place plus the rounding of x / s), taken as 2^-22; and f32's rounding of the sums.
    const size_t row_bytes = tensor_bytes(Q4_K, c.n_in, 1);
    std::vector<float> wrow(c.n_in);
    std::vector<double> want(c.n_rows);
    for (uint32_t r = 0; r < c.n_rows; ++r) {
      dequantize_row(Q4_K, bytes.data() + r * row_bytes, wrow.data(), c.n_in);
      double sum = 0, mag = 0, digit_err = 0;
      for (uint32_t b = 0; b < c.n_in / 32; ++b) {
        double amax = 0, wabs = 0;
        for (uint32_t i = 32 * b; i < 32 * b + 32; ++i) {
          const double xg = double(x[i]) * g[i];
          amax = std::max(amax, std::fabs(xg));
          wabs += std::fabs(double(wrow[i]));
          sum += double(wrow[i]) * xg;
          mag += std::fabs(double(wrow[i]) * xg);
        }
        digit_err += amax * std::ldexp(1.0, -22) * wabs;
      }
      sum *= inv_rms;
      want[r] = sum;
      const double bound = (digit_err + 4e-6 * mag) * inv_rms;
      ASSERT_FALSE(std::isnan(got[r])) << "row " << r;
      EXPECT_LE(std::fabs(got[r] - sum), bound) << "row " << r << ": got " << got[r] << ", want " << sum;
    }
    const auto r_int = compare(got, want);
    const auto r_f32 = compare(got32, want);
    std::printf("[ int dot ] n_in %u rows %u%s: int8 digits %s; f32 matvec rel L2 %.3g\n", c.n_in, c.n_rows,
                norm ? " norm" : "", r_int.describe().c_str(), r_f32.rel_l2);
  }
}

TEST(IntDot, Q4kProductMatchesDoubleWithinItsDigitsBound) {
  for (const bool norm : {false, true})
    check_int_products(context(), {{256, 1}, {256, 37}, {1280, 9}, {4096, 64}, {4352, 130}}, norm);
}

TEST(IntDot, Q4kProductOtherShapesAndNoSubgroups) {
  for (const char* shape : {"32x4x2", "32x8x1", "64x4x2", "128x2x1", "16x2x4", ""}) {
    SCOPED_TRACE(std::string("shape '") + shape + "'");
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = shape;
      o.disable_subgroups = *shape == 0;
    }));
    check_int_products(ctx, {{256, 37}, {1280, 9}, {512, 3}}, *shape != 0);
  }
}

TEST(IntDot, DigitsOfManyTokens) {
  // x_digits alone, three token rows, without and with norm weights g: the digits recombine to x * g within the
  // bound, the half sums are those of x * g, the sum of squares that of x.
  auto& ctx = context();
  const uint32_t n_in = 96, n_tokens = 3;
  auto gen = rng(7);
  auto x = random_floats(n_in * n_tokens, gen, -5.f, 5.f);
  x[40] = 0.f;
  for (uint32_t i = 128; i < 160; ++i) x[i] = 0.f;  // token 1's block 1: all zeros
  const auto g = random_floats(n_in, gen, 0.25f, 2.f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto gbuf = ctx.upload<float>(g, WGPUBufferUsage_Storage, "g");
  for (const bool with_norm : {false, true}) {
    SCOPED_TRACE(with_norm ? "x * g" : "x");
    const auto xd = kernels::make_x_digits(ctx, n_in, n_tokens);
    gpu::ComputeBatch batch(ctx);
    kernels::encode_x_digits(batch, ctx, xbuf, xd, with_norm ? &gbuf : nullptr);
    batch.submit_and_wait();
    const auto digits = ctx.read<uint32_t>(xd.digits);
    const auto scales = ctx.read<float>(xd.scales);
    for (uint32_t b = 0; b < n_in * n_tokens / 32; ++b) {
      auto xg = [&](uint32_t e) { return double(x[32 * b + e]) * (with_norm ? g[(32 * b + e) % n_in] : 1.0); };
      double amax = 0, sum0 = 0, sum1 = 0, sq = 0;
      for (uint32_t e = 0; e < 32; ++e) {
        amax = std::max(amax, std::fabs(xg(e)));
        (e < 16 ? sum0 : sum1) += xg(e);
        sq += double(x[32 * b + e]) * x[32 * b + e];
      }
      const float s = scales[4 * b];
      EXPECT_NEAR(s, amax / 8323072.0, amax * 1e-13) << "block " << b;
      EXPECT_NEAR(scales[4 * b + 1], sum0, 1e-5 * (1 + std::fabs(sum0))) << "block " << b;
      EXPECT_NEAR(scales[4 * b + 2], sum1, 1e-5 * (1 + std::fabs(sum1))) << "block " << b;
      EXPECT_NEAR(scales[4 * b + 3], sq, 1e-5 * (1 + sq)) << "block " << b;
      for (uint32_t e = 0; e < 32; ++e) {
        const uint32_t h = e / 16, word = (e % 16) / 4, byte = e % 4;
        auto digit = [&](uint32_t k) { return (digits[((b * 3 + k) * 2 + h) * 4 + word] >> (8 * byte)) & 255u; };
        const int d0 = int8_t(digit(0)), d1 = int8_t(digit(1)), d2 = int(digit(2));
        EXPECT_LE(std::abs(d0), 127) << "block " << b << " element " << e;
        const double value = double(s) * (double(d0) * 65536 + double(d1) * 256 + d2);
        EXPECT_LE(std::fabs(value - xg(e)), amax * std::ldexp(1.0, -22) + 1e-30)
            << "block " << b << " element " << e << ": " << value << " vs " << xg(e);
      }
    }
  }
}

TEST(IntDot, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto gen = rng(3);
  const auto q4k = kernels::upload_weight(ctx, Q4_K, 256, 8, random_weight(Q4_K, 256, 8, gen));
  const auto q80 = kernels::upload_weight(ctx, Q8_0, 256, 4, random_weight(Q8_0, 256, 4, gen));
  const auto xd1 = kernels::make_x_digits(ctx, 256, 1);
  const auto xd2 = kernels::make_x_digits(ctx, 256, 2);
  const auto xd512 = kernels::make_x_digits(ctx, 512, 1);
  auto y = ctx.create_buffer(64, WGPUBufferUsage_Storage, "y");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::make_x_digits(ctx, 100, 1); }, "n_in must");
  expect_throw([&] { kernels::make_x_digits(ctx, 256, 0); }, "n_tokens must");
  expect_throw([&] { kernels::encode_x_digits(batch, ctx, small, xd1); }, "x holds");
  auto x256 = ctx.create_buffer(256 * 4, WGPUBufferUsage_Storage, "x");
  expect_throw([&] { kernels::encode_x_digits(batch, ctx, x256, xd1, &small); }, "norm holds");
  expect_throw([&] { kernels::encode_matvec_int(batch, ctx, q80, xd1, y); }, "must be Q4_K");
  expect_throw([&] { kernels::encode_matvec_int(batch, ctx, q4k, xd2, y); }, "one token");
  expect_throw([&] { kernels::encode_matvec_int(batch, ctx, q4k, xd512, y); }, "xd.n_in");
  expect_throw([&] { kernels::encode_matvec_int(batch, ctx, q4k, xd1, small); }, "y holds");
  expect_throw([&] { kernels::encode_matvec_int(batch, ctx, q4k, xd1, y, -1.f); }, "norm_eps");
}

}  // namespace
}  // namespace wgllm::test

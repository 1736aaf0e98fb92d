// Q4_K and Q6_K products on packed int8 dot products (x's digits from int_dot.wgsl, the product matvec.wgsl's MV_INT)
// vs the dequantised weight times x in double, with each epilogue and rows split across bindings, beside the f32
// matvec's error on the same inputs; the prompt products on the digits (ContextOptions::prompt_digits,
// matmul_int.wgsl) on inputs their digits keep exactly, in both workgroup shapes, and which products take them (their
// random-input epilogue table: test_matmul.cpp's Matmul.PromptDigits).
#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/int_dot.h"
#include "kernels/matmul.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;

// What the product does around the sums (MatmulOptions): nothing, the RMSNorm folded in, the norm and SwiGLU over
// (gate, up) row pairs, the residual add, a bias.
enum class Epilogue { None, Norm, SwigluNorm, Accumulate, Bias };
const char* name(Epilogue e) {
  switch (e) {
    case Epilogue::None: return "none";
    case Epilogue::Norm: return "norm";
    case Epilogue::SwigluNorm: return "norm + swiglu";
    case Epilogue::Accumulate: return "accumulate";
    case Epilogue::Bias: return "bias";
  }
  return "?";
}

struct IntCase {
  uint32_t n_in, n_rows;
  uint64_t max_piece_bytes = 0;  // > 0: the weight's rows split into pieces of at most this many bytes
  GgufType type = Q4_K;
};

double silu(double a) { return a / (1 + std::exp(-a)); }

// encode_x_digits + encode_matmul with digits (matvec.wgsl's MV_INT) against the dequantised weight times x in
// double, within the digits' bound per row; the f32 matvec on the same inputs alongside for its error. With the norm
// (Norm, SwigluNorm): x RMS-normalised with random weights g first (the digits of x * g, the product's 1 / rms).
void check_int_products(gpu::Context& ctx, std::initializer_list<IntCase> cases, Epilogue epi = Epilogue::None) {
  constexpr float kEps = 1e-5f;
  const bool norm = epi == Epilogue::Norm || epi == Epilogue::SwigluNorm, swiglu = epi == Epilogue::SwigluNorm;
  for (const IntCase c : cases) {
    SCOPED_TRACE(std::string(type_name(c.type)) + " n_in " + std::to_string(c.n_in) + ", rows " +
                 std::to_string(c.n_rows) + ", " + name(epi) + (c.max_piece_bytes ? ", pieces" : ""));
    auto gen = rng(c.n_in * 131 + c.n_rows + 7 * uint32_t(epi) + uint32_t(c.type));
    const auto bytes = random_weight(c.type, c.n_in, c.n_rows, gen);
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
    const uint32_t n_y = swiglu ? c.n_rows / 2 : c.n_rows;
    const auto y0 = random_floats(n_y, gen, -4.f, 4.f);  // the residual (Accumulate) or the bias (Bias)
    double mean_sq = 0;
    for (float v : x) mean_sq += double(v) * v / c.n_in;
    const double inv_rms = norm ? 1.0 / std::sqrt(mean_sq + kEps) : 1.0;
    auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
    auto gbuf = ctx.upload<float>(g, WGPUBufferUsage_Storage, "g");
    auto extra = ctx.upload<float>(y0, WGPUBufferUsage_Storage, "bias");
    const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_rows, bytes, "w", c.max_piece_bytes);
    if (c.max_piece_bytes) {
      EXPECT_GT(w.pieces.size(), 1u);
    }
    const auto xd = kernels::make_x_digits(ctx, c.n_in, 1);
    auto y = poisoned(ctx, n_y, "y");
    auto y32 = poisoned(ctx, n_y, "y f32");
    if (epi == Epilogue::Accumulate) {
      ctx.write_buffer(y, 0, y0.data(), y0.size() * 4);
      ctx.write_buffer(y32, 0, y0.data(), y0.size() * 4);
    }
    kernels::MatmulOptions o{.norm = norm ? &gbuf : nullptr, .eps = kEps, .swiglu = swiglu};
    o.bias = epi == Epilogue::Bias ? &extra : nullptr;
    o.accumulate = epi == Epilogue::Accumulate;
    gpu::ComputeBatch batch(ctx);
    kernels::encode_x_digits(batch, ctx, xbuf, xd, norm ? &gbuf : nullptr);
    kernels::MatmulOptions oi = o;
    oi.digits = &xd;
    kernels::encode_matmul(batch, ctx, w, xbuf, y, 1, oi);
    kernels::encode_matmul(batch, ctx, w, xbuf, y32, 1, o);
    batch.submit_and_wait();
    const auto got = ctx.read<float>(y);
    const auto got32 = ctx.read<float>(y32);

    // Each row's sum and its bound: each element is represented within 2^-23 of its block's largest |x| (half a unit
    // of the digits' last place plus the rounding of x / s), taken as 2^-22; and f32's rounding of the sums.
    const size_t row_bytes = tensor_bytes(c.type, c.n_in, 1);
    std::vector<float> wrow(c.n_in);
    std::vector<double> dot(c.n_rows), err(c.n_rows);
    for (uint32_t r = 0; r < c.n_rows; ++r) {
      dequantize_row(c.type, bytes.data() + r * row_bytes, wrow.data(), c.n_in);
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
      dot[r] = sum * inv_rms;
      err[r] = (digit_err + 4e-6 * mag) * inv_rms;
    }
    std::vector<double> want(n_y);
    for (uint32_t i = 0; i < n_y; ++i) {
      double bound;
      if (swiglu) {  // silu' lies within [-0.1, 1.1]
        const double a = dot[2 * i], b = dot[2 * i + 1];
        want[i] = silu(a) * b;
        bound = 1.1 * err[2 * i] * (std::fabs(b) + err[2 * i + 1]) + std::fabs(silu(a)) * err[2 * i + 1] +
                1e-6 * std::fabs(want[i]);
      } else {
        want[i] = dot[i] + (epi == Epilogue::Accumulate || epi == Epilogue::Bias ? double(y0[i]) : 0.0);
        bound = err[i] + 1e-6 * (std::fabs(want[i]) + std::fabs(y0[i]));
      }
      ASSERT_FALSE(std::isnan(got[i])) << "output " << i;
      EXPECT_LE(std::fabs(got[i] - want[i]), bound) << "output " << i << ": got " << got[i] << ", want " << want[i];
    }
    const auto r_int = compare(got, want);
    const auto r_f32 = compare(got32, want);
    std::printf("[ int dot ] %s n_in %u rows %u %s%s: int8 digits %s; f32 matvec rel L2 %.3g\n", type_name(c.type),
                c.n_in, c.n_rows, name(epi), c.max_piece_bytes ? " pieces" : "", r_int.describe().c_str(),
                r_f32.rel_l2);
  }
}

TEST(IntDot, Q4kProductMatchesDoubleWithinItsDigitsBound) {
  for (const Epilogue e : {Epilogue::None, Epilogue::Norm})
    check_int_products(context(), {{256, 1}, {256, 37}, {1280, 9}, {4096, 64}, {4352, 130}}, e);
}

TEST(IntDot, Q4kProductEpiloguesAndPieces) {
  check_int_products(context(), {{256, 38}, {1280, 10}}, Epilogue::SwigluNorm);
  check_int_products(context(), {{512, 37}}, Epilogue::Accumulate);
  check_int_products(context(), {{512, 37}}, Epilogue::Bias);
  // rows split across bindings: pieces of 5 rows (and the last of 2)
  check_int_products(context(), {{512, 37, 5 * 288}}, Epilogue::Norm);
  check_int_products(context(), {{512, 38, 6 * 288}}, Epilogue::SwigluNorm);
}

// Q6_K: a unit's low nibbles and high nibbles read x blocks two apart (the outlier's block 1 beside block 3), each
// 16 elements under its own signed scale.
TEST(IntDot, Q6kProductMatchesDoubleWithinItsDigitsBound) {
  for (const Epilogue e : {Epilogue::None, Epilogue::Norm})
    check_int_products(
        context(),
        {{256, 1, 0, Q6_K}, {256, 37, 0, Q6_K}, {1280, 9, 0, Q6_K}, {4096, 64, 0, Q6_K}, {4352, 130, 0, Q6_K}}, e);
}

TEST(IntDot, Q6kProductEpiloguesAndPieces) {
  check_int_products(context(), {{256, 38, 0, Q6_K}, {1280, 10, 0, Q6_K}}, Epilogue::SwigluNorm);
  check_int_products(context(), {{512, 37, 0, Q6_K}}, Epilogue::Accumulate);
  check_int_products(context(), {{512, 37, 0, Q6_K}}, Epilogue::Bias);
  // rows split across bindings
  check_int_products(context(), {{512, 37, 5 * 420, Q6_K}}, Epilogue::Norm);
  check_int_products(context(), {{512, 38, 6 * 420, Q6_K}}, Epilogue::SwigluNorm);
}

TEST(IntDot, ProductsOtherShapesAndNoSubgroups) {
  for (const char* shape : {"32x4x2", "32x8x1", "64x4x2", "128x2x1", "16x2x4", "8x2x8", ""}) {
    SCOPED_TRACE(std::string("shape '") + shape + "'");
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = shape;
      o.disable_subgroups = *shape == 0;
    }));
    check_int_products(ctx, {{256, 37}, {1280, 9}, {512, 3}, {1280, 9, 0, Q6_K}, {512, 3, 0, Q6_K}},
                       *shape ? Epilogue::Norm : Epilogue::None);
    check_int_products(ctx, {{512, 6}, {512, 6, 0, Q6_K}}, Epilogue::SwigluNorm);
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
    const auto digits = ctx.read<uint32_t>(xd.data);
    const auto all = ctx.read<float>(xd.data);
    const std::span<const float> scales = std::span<const float>(all).subspan(xd.scales_vec4() * 4);
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

TEST(IntDot, DigitsOfAWindowOfRows) {
  // The windowed x_digits (the prompt products' call): rows 5..8 of x read through a binding window whose first row
  // is element x_first of it give the same bytes as those rows alone; rows past the window are refused.
  auto& ctx = context();
  const uint32_t n_in = 96, n_rows = 9, first = 5, count = 4;
  auto gen = rng(11);
  const auto x = random_floats(n_in * n_rows, gen, -3.f, 3.f);
  const auto g = random_floats(n_in, gen, 0.5f, 1.5f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto gbuf = ctx.upload<float>(g, WGPUBufferUsage_Storage, "g");
  const std::vector<float> rows(x.begin() + first * n_in, x.begin() + (first + count) * n_in);
  auto rows_buf = ctx.upload<float>(rows, WGPUBufferUsage_Storage, "rows");
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t begin = uint64_t(first) * n_in * 4, offset = begin / align * align;
  const uint32_t x_first = uint32_t((begin - offset) / 4);
  const uint64_t window = begin + uint64_t(count) * n_in * 4 - offset;
  const auto whole = kernels::make_x_digits(ctx, n_in, count), windowed = kernels::make_x_digits(ctx, n_in, count);
  gpu::ComputeBatch batch(ctx);
  kernels::encode_x_digits(batch, ctx, rows_buf, whole, &gbuf);
  kernels::encode_x_digits(batch, ctx, xbuf, offset, window, x_first, windowed.data, n_in, count, &gbuf);
  batch.submit_and_wait();
  EXPECT_EQ(ctx.read<uint32_t>(windowed.data), ctx.read<uint32_t>(whole.data));
  gpu::ComputeBatch bad(ctx);
  EXPECT_THROW(kernels::encode_x_digits(bad, ctx, xbuf, offset, window - 4, x_first, windowed.data, n_in, count, &gbuf),
               InvalidArgument);
}

TEST(IntDot, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto gen = rng(3);
  const auto q4k = kernels::upload_weight(ctx, Q4_K, 256, 8, random_weight(Q4_K, 256, 8, gen));
  const auto q80 = kernels::upload_weight(ctx, Q8_0, 256, 4, random_weight(Q8_0, 256, 4, gen));
  const auto xd1 = kernels::make_x_digits(ctx, 256, 1);
  const auto xd512 = kernels::make_x_digits(ctx, 512, 1);
  auto y = ctx.create_buffer(64, WGPUBufferUsage_Storage, "y");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  auto x256 = ctx.create_buffer(2 * 256 * 4, WGPUBufferUsage_Storage, "x");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::make_x_digits(ctx, 100, 1); }, "n_in must");
  expect_throw([&] { kernels::make_x_digits(ctx, 256, 0); }, "n_tokens must");
  expect_throw([&] { kernels::encode_x_digits(batch, ctx, small, xd1); }, "x holds");
  expect_throw([&] { kernels::encode_x_digits(batch, ctx, x256, xd1, &small); }, "norm holds");
  expect_throw([&] { kernels::encode_x_digits(batch, ctx, x256, kernels::XDigits{}); }, "make_x_digits");
  auto with = [&](kernels::MatmulImpl impl = kernels::MatmulImpl::Auto) {
    return kernels::MatmulOptions{.impl = impl, .digits = &xd1};
  };
  expect_throw([&] { kernels::encode_matmul(batch, ctx, q80, x256, y, 1, with()); }, "Q4_K or Q6_K");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, q4k, x256, y, 2, with()); }, "one token");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, q4k, x256, y, 1, with(kernels::MatmulImpl::Tiled)); },
               "matvec alone");
  kernels::MatmulOptions o512{.digits = &xd512};
  expect_throw([&] { kernels::encode_matmul(batch, ctx, q4k, x256, y, 1, o512); }, "digits of 512");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, q4k, x256, small, 1, with()); }, "y holds");
}

// x on the grid its digits keep: each 32-element block's largest |x| is 127 * 2^-4 (its scale s then 2^-20) and every x
// an integer N times s, N a multiple of 2^16 for one digit (the digits drop nothing) and for two with a third digit of
// 127 or 128 (the mean added back, 127.5 of 256, off by half a step; the block's largest, whose third digit is 0, is
// taken at the value x' the kernel gives it). The kernel takes its minimums (Q4_K) and offsets (Q6_K) times the exact
// sums of x, not of x': with w0 the weight of all-zero quants (-dmin m, -32 d sc, 0), its product is w x' - w0 (x' -
// x), to f32's rounding, so a slip in its scales, minimums, offsets or added-back sums shows: PromptDigits' random
// inputs hide one under the digits' own error.
TEST(Matmul, PromptDigitsOnTheirGrid) {
  auto gen = rng(11);
  const uint32_t n_in = 512, n_out = 70, n_tokens = 70;
  for (uint32_t d = 1; d <= 3; ++d) {
    SCOPED_TRACE("digits " + std::to_string(d));
    gpu::Context ctx(context_options([&](auto& o) {
      o.prompt_digits = d;
      o.rows_shape = "off";  // CPU adapters too take the GPUs' kernels
    }));
    for (const GgufType type : {Q4_K, Q6_K, Q8_0}) {
      SCOPED_TRACE(type_name(type));
      const auto bytes = random_weight(type, n_in, n_out, gen);
      const auto w = kernels::upload_weight(ctx, type, n_in, n_out, bytes, "w");
      if (kernels::prompt_digits(ctx, w, n_tokens) != d)
        continue;  // Q8_0's three digits, Q6_K's in 32 KB: the f32 tiles
      std::vector<float> x(size_t(n_tokens) * n_in), seen(x.size());
      std::uniform_int_distribution<int32_t> top(-126, 126), mid(-128, 127), low(0, 255), near_half(127, 128);
      for (size_t i = 0; i < x.size(); ++i) {
        const bool largest = i % 32 == (i / 32) % 32;
        int32_t n = top(gen) * 65536;
        if (d > 1) n += mid(gen) * 256 + (d == 2 ? near_half(gen) : low(gen));
        if (largest) n = (i % 64 < 32 ? 127 : -127) * 65536;
        x[i] = std::ldexp(float(n), -20);
        seen[i] = d == 2 && largest ? std::ldexp(float(2 * n + 255), -21) : x[i];
      }
      auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
      gpu::Buffer y = poisoned(ctx, size_t(n_tokens) * n_out, "y");
      gpu::ComputeBatch batch(ctx, "grid");
      kernels::encode_matmul(batch, ctx, w, xbuf, y, n_tokens, {.impl = MatmulImpl::Tiled});
      batch.submit_and_wait();
      // w0: each block's quant bytes zero (Q4_K 16..143, Q6_K 0..191, Q8_0 2..33)
      std::vector<uint8_t> zeroed = bytes;
      const size_t block = block_bytes(type);
      const size_t from = type == Q4_K ? 16 : type == Q6_K ? 0 : 2, to = type == Q6_K ? 192 : block;
      for (size_t b = 0; b < zeroed.size(); b += block) std::fill(&zeroed[b + from], &zeroed[b + to], 0);
      std::vector<float> excess(x.size());
      for (size_t i = 0; i < x.size(); ++i) excess[i] = seen[i] - x[i];
      std::vector<float> want = cpu::matmul(type, bytes, n_in, n_out, seen, n_tokens, {});
      const std::vector<float> w0 = cpu::matmul(type, zeroed, n_in, n_out, excess, n_tokens, {});
      for (size_t i = 0; i < want.size(); ++i) want[i] -= w0[i];
      const auto r = compare(ctx.read<float>(y), want);
      EXPECT_LE(r.rel_l2, 2e-6) << r.describe();
    }
  }
}

// The products on digits in workgroups of 32 tokens x 128 rows (ContextOptions::prompt_tile 32): each output the bits
// of the 64 x 64 workgroups' (a thread's sums take the same steps in the same order), nothing written past y. Prompts
// and rows that are whole tiles of neither shape, one to three digits, the norm, biases and SwiGLU, weights in pieces.
TEST(Matmul, PromptDigitsTilesOf32) {
  struct Case {
    GgufType type;
    uint32_t digits, n_in, n_out, n_tokens;
    bool swiglu;
    uint64_t max_piece_bytes;
  };
  const Case cases[] = {{Q4_K, 3, 512, 200, 75, false, 0},
                        {Q6_K, 2, 256, 134, 130, true, 0},
                        {Q8_0, 1, 256, 330, 33, false, 8 * 1024},
                        {Q4_K, 1, 256, 140, 20, true, 16 * 1024}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(type_name(c.type)) + " " + std::to_string(c.n_in) + "x" + std::to_string(c.n_out) + ", " +
                 std::to_string(c.n_tokens) + " tokens, " + std::to_string(c.digits) + " digits");
    auto gen = rng(13 + c.n_out);
    const auto bytes = random_weight(c.type, c.n_in, c.n_out, gen);
    const auto x = random_floats(size_t(c.n_tokens) * c.n_in, gen);
    const auto norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
    const auto bias = random_floats(c.n_out, gen, -1.f, 1.f);
    const uint32_t width = c.swiglu ? c.n_out / 2 : c.n_out;
    std::vector<float> got[2];
    for (const uint32_t tile : {64u, 32u}) {
      gpu::Context ctx(context_options([&](auto& o) {
        o.prompt_digits = c.digits;
        o.prompt_tile = tile;
        o.rows_shape = "off";  // CPU adapters too take the GPUs' kernels
      }));
      const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_out, bytes, "w", c.max_piece_bytes);
      ASSERT_EQ(kernels::prompt_digits(ctx, w, c.n_tokens), c.digits);
      if (c.max_piece_bytes) {
        ASSERT_GT(w.pieces.size(), 1u) << "the case must split the rows across pieces";
      }
      auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
      auto nbuf = ctx.upload<float>(norm, WGPUBufferUsage_Storage, "norm");
      auto bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
      gpu::Buffer y = poisoned(ctx, size_t(c.n_tokens) * width + 64, "y");
      gpu::ComputeBatch batch(ctx, "tiles of 32");
      kernels::encode_matmul(batch, ctx, w, xbuf, y, c.n_tokens,
                             {.bias = c.swiglu ? nullptr : &bbuf,
                              .norm = &nbuf,
                              .eps = 1e-5f,
                              .swiglu = c.swiglu,
                              .impl = MatmulImpl::Tiled});
      batch.submit_and_wait();
      got[tile == 32] = ctx.read<float>(y);
    }
    const size_t n = size_t(c.n_tokens) * width;
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[1][i]), std::bit_cast<uint32_t>(got[0][i]))
          << "output " << i << " (token " << i / width << ") differs from the 64 x 64 workgroups'";
    for (size_t i = n; i < got[1].size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(got[1][i]), kPoison) << "past y";
  }
  gpu::Context bad(context_options([](auto& o) { o.prompt_tile = 48; }));
  EXPECT_THROW(kernels::prompt_tile(bad, 64), InvalidArgument);
}

// Which products take digits: unset, three on GPUs from kDefaultDigitsFromTokens tokens on and none on CPU adapters;
// a value set, that many for every tiled product of a type that takes them (Q8_0: one or two).
TEST(Matmul, PromptDigitsDefault) {
  auto gen = rng(12);
  const auto bytes = random_weight(Q4_K, 256, 64, gen);
  const auto q8_bytes = random_weight(Q8_0, 256, 64, gen);
  const bool cpu = context().adapter().is_cpu();
  {
    gpu::Context ctx(context_options());
    const auto w = kernels::upload_weight(ctx, Q4_K, 256, 64, bytes, "w");
    EXPECT_EQ(kernels::prompt_digits(ctx), cpu ? 0u : 3u);
    EXPECT_EQ(kernels::prompt_digits(ctx, w, kernels::kDefaultDigitsFromTokens), cpu ? 0u : 3u);
    EXPECT_EQ(kernels::prompt_digits(ctx, w, kernels::kDefaultDigitsFromTokens - 1), 0u);
  }
  for (const uint32_t d : {0u, 1u, 2u, 3u}) {
    gpu::Context ctx(context_options([&](auto& o) { o.prompt_digits = d; }));
    const auto w = kernels::upload_weight(ctx, Q4_K, 256, 64, bytes, "w");
    const auto q8 = kernels::upload_weight(ctx, Q8_0, 256, 64, q8_bytes, "q8");
    EXPECT_EQ(kernels::prompt_digits(ctx), d);
    EXPECT_EQ(kernels::prompt_digits(ctx, w, 5), d);
    EXPECT_EQ(kernels::prompt_digits(ctx, q8, 512), d == 3 ? 0u : d);
  }
}

}  // namespace
}  // namespace wgllm::test

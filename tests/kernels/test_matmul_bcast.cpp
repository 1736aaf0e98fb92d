// Batch decode's float products on the x-broadcast kernel (kernels/matmul_bcast.h): every epilogue against the CPU
// product, and every token's outputs the same bits alone, in any run of tokens, in any shape of the kernel and with
// the weight split into pieces. Fresh random inputs, poisoned outputs.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/matmul_bcast.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;

struct Case {
  GgufType type;
  uint32_t n_in, n_out, n_tokens;
  const char* what;
};

// One case's outputs for tokens [first, first + count): y, then y1 and y2 with split outputs, as read back.
struct Runner {
  gpu::Context& ctx;
  const Case& c;
  const kernels::GpuWeight& w;
  const std::vector<float>& x;
  const std::vector<float>& y0;  // accumulate's starting y
  const kernels::MatmulOptions& o;
  uint32_t width, split1, split2;

  std::vector<float> run(uint32_t first, uint32_t count) const {
    const std::string what = c.what;
    gpu::Buffer xb = ctx.upload<float>(std::span(x).subspan(size_t(first) * c.n_in, size_t(count) * c.n_in),
                                       WGPUBufferUsage_Storage, "x part");
    gpu::Buffer y = what == "accumulate"
                        ? ctx.upload<float>(std::span(y0).subspan(size_t(first) * width, size_t(count) * width),
                                            WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "y")
                        : poisoned(ctx, size_t(count) * width, "y");
    gpu::Buffer y1 = poisoned(ctx, size_t(count) * (split2 - split1), "y1");
    gpu::Buffer y2 = poisoned(ctx, size_t(count) * (c.n_out - split2), "y2");
    kernels::MatmulOptions oo = o;
    if (what == "split outputs") oo.y1 = &y1, oo.y2 = &y2, oo.split1 = split1, oo.split2 = split2;
    gpu::ComputeBatch batch(ctx, "bcast");
    kernels::encode_matmul(batch, ctx, w, xb, y, count, oo);
    batch.submit_and_wait();
    std::vector<float> out = ctx.read<float>(y);
    if (what == "split outputs")
      for (const gpu::Buffer* b : {&y1, &y2}) {
        const auto more = ctx.read<float>(*b);
        out.insert(out.end(), more.begin(), more.end());
      }
    return out;
  }
};

// Each case against the CPU (the normed x's product with the epilogue), then tokens alone and a run of tokens in the
// middle against the whole batch, bit for bit, in the default shape, forced shapes of one and four rows a lane, one
// and four words a step and F16 through integer ops (the same bits as the default shape's), and with the weight in
// pieces of a few rows. The cases: every float type and epilogue,
// odd row counts, a pass and a half of tokens, rows of 1 to 64 blocks (1 to 16 slices: the tree).
TEST(MatmulBcast, EveryTokenAsAloneAndAsTheCpu) {
  const std::vector<Case> cases = {
      {GgufType::F16, 512, 37, 21, "norm + bias"},   {GgufType::F16, 1024, 40, 9, "swiglu"},
      {GgufType::BF16, 96, 38, 17, "geglu"},         {GgufType::F32, 256, 64, 16, "split outputs"},
      {GgufType::F16, 2048, 33, 40, "accumulate"},   {GgufType::BF16, 512, 19, 3, "norm + bias"},
      {GgufType::F32, 1024, 70, 20, "swiglu"},       {GgufType::F16, 32, 5, 2, "accumulate"}};
  bool tree = false;
  std::vector<std::vector<float>> by_case(cases.size());  // the default shape's outputs
  // (each pipeline takes lavapipe a while to compile: the forced shapes take two cases)
  for (const char* shape : {"", "1x4x1", "4x1"}) {
    gpu::Context ctx(context_options([&](auto& o) {
      o.batch_bcast = true;
      o.bcast_shape = shape;
    }));
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      if (*shape && ci != 1 && ci != 4) continue;
      const Case& c = cases[ci];
      auto gen = rng(4242 + ci);  // the same inputs in every shape
      const std::string what = c.what;
      SCOPED_TRACE(std::string("shape '") + shape + "' " + type_name(c.type) + " " + what + " " +
                   std::to_string(c.n_in) + "x" + std::to_string(c.n_out) + " x" + std::to_string(c.n_tokens));
      const uint32_t T = c.n_tokens;
      const auto bytes = random_weight(c.type, c.n_in, c.n_out, gen);
      const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_out, bytes);
      // pieces of 8 rows (16 with swiglu's pairs)
      const uint64_t row_bytes = bytes.size() / c.n_out;
      const auto wp = kernels::upload_weight(ctx, c.type, c.n_in, c.n_out, bytes, "pieces", row_bytes * 16);
      ASSERT_GT(wp.pieces.size(), c.n_out > 16 ? 1u : 0u);
      tree |= kernels::bcast_slices(ctx, w) >= 8;
      const auto x = random_floats(size_t(T) * c.n_in, gen);
      auto bias = ctx.upload<float>(random_floats(c.n_out, gen), WGPUBufferUsage_Storage, "bias");
      auto norm = ctx.upload<float>(random_floats(c.n_in, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "norm");
      const bool glu = what == "swiglu" || what == "geglu";
      const uint32_t split1 = c.n_out / 4, split2 = c.n_out / 2;
      const uint32_t width = glu ? c.n_out / 2 : what == "split outputs" ? split1 : c.n_out;
      const std::vector<float> y0 = random_floats(size_t(T) * width, gen);
      kernels::MatmulOptions o{.impl = MatmulImpl::Batch};
      if (what == "norm + bias") o.bias = &bias, o.norm = &norm;
      if (glu) o.swiglu = true, o.norm = &norm, o.bias = &bias;
      if (what == "geglu") o.act = kernels::GateAct::GeluTanh;
      if (what == "accumulate") o.accumulate = true;
      if (what == "split outputs") o.bias = &bias;
      ASSERT_TRUE(kernels::detail::bcast_takes(ctx, w, o, T));
      const Runner runner{ctx, c, w, x, y0, o, width, split1, split2};
      const std::vector<float> all = runner.run(0, T);
      if (*shape)  // the rows a lane, the words a step and the lanes never change a token's bits
        ASSERT_EQ(std::memcmp(all.data(), by_case[ci].data(), all.size() * 4), 0) << "not the default shape's bits";
      else
        by_case[ci] = all;

      std::vector<float> want;
      {
        const auto xin = o.norm ? cpu::rms_norm(x, ctx.read<float>(norm), T, c.n_in, 1e-5f) : x;
        const auto prod =
            cpu::matmul(c.type, bytes, c.n_in, c.n_out, xin, T, o.bias ? ctx.read<float>(bias) : std::vector<float>{});
        std::vector<float> parts[3];
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t r = 0; r < (glu ? width : c.n_out); ++r) {
            const float* p = prod.data() + size_t(t) * c.n_out;
            float v = p[r];
            if (glu) {
              const float g = p[2 * r], u = p[2 * r + 1];
              v = what == "geglu" ? 0.5f * g * (1.f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * u
                                  : g / (1.f + std::exp(-g)) * u;
            }
            if (what == "accumulate") v += y0[size_t(t) * width + r];
            parts[what != "split outputs" || r < split1 ? 0 : r < split2 ? 1 : 2].push_back(v);
          }
        for (auto& part : parts) want.insert(want.end(), part.begin(), part.end());
      }
      ASSERT_EQ(all.size(), want.size());
      const auto r = compare(all, want);
      EXPECT_LE(r.rel_l2, 3e-6) << r.describe();

      // (the outputs are [token][row] per output buffer: a run of count tokens holds n of each buffer's rows a token)
      auto expect_as_in_all = [&](uint32_t first, const std::vector<float>& got, uint32_t count, const char* how) {
        size_t off = 0;
        for (int part = 0; part < (what == "split outputs" ? 3 : 1); ++part) {
          const size_t n = what != "split outputs" ? width
                           : part == 0             ? split1
                           : part == 1             ? split2 - split1
                                                   : c.n_out - split2;
          ASSERT_EQ(std::memcmp(got.data() + off * count, all.data() + off * T + first * n, n * count * 4), 0)
              << "tokens " << first << ".." << first + count - 1 << " output " << part << " are not the same bits "
              << how;
          off += n;
        }
      };
      for (uint32_t t = 0; t < T; t += 1 + t % 3) expect_as_in_all(t, runner.run(t, 1), 1, "alone");
      if (T > 4) expect_as_in_all(2, runner.run(2, T - 3), T - 3, "in a run of other tokens");
      const Runner in_pieces{ctx, c, wp, x, y0, o, width, split1, split2};
      expect_as_in_all(0, in_pieces.run(0, T), T, "with the weight in pieces");
    }
  }
  EXPECT_TRUE(tree) << "no case split its rows into 8 slices or more";
}

// The kernel takes F32, F16 and BF16 weights with n_in a multiple of 32 and the epilogues it has, only where the
// context allows it; its shape knob refuses what the kernel cannot run.
TEST(MatmulBcast, WhatItTakes) {
  auto gen = rng(9);
  gpu::Context ctx(context_options([](auto& o) { o.batch_bcast = true; }));
  auto weight = [&](GgufType t, uint32_t n_in) {
    return kernels::upload_weight(ctx, t, n_in, 8, random_weight(t, n_in, 8, gen));
  };
  const auto f16 = weight(GgufType::F16, 64), q8 = weight(GgufType::Q8_0, 64), f16_odd = weight(GgufType::F16, 72);
  gpu::Buffer b = ctx.create_buffer(1024, WGPUBufferUsage_Storage, "b");
  EXPECT_TRUE(kernels::detail::bcast_takes(ctx, f16, {}, 4));
  EXPECT_FALSE(kernels::detail::bcast_takes(ctx, q8, {}, 4));
  EXPECT_FALSE(kernels::detail::bcast_takes(ctx, f16_odd, {}, 4));
  EXPECT_FALSE(kernels::detail::bcast_takes(ctx, f16, {.times = &b, .times_stride = 8}, 4));
  EXPECT_FALSE(kernels::detail::bcast_takes(ctx, f16, {.swiglu = true, .act = kernels::GateAct::SwigluOai}, 4));
  gpu::Context off(context_options([](auto& o) { o.batch_bcast = false; }));
  const auto f16_off = kernels::upload_weight(off, GgufType::F16, 64, 8, random_weight(GgufType::F16, 64, 8, gen));
  EXPECT_FALSE(kernels::detail::bcast_takes(off, f16_off, {}, 4));
  for (const char* bad : {"3x2", "2x3", "x2", "2x", "2x2x2", "0x1", "22"})
    expect_throw([&] { kernels::parse_bcast_shape(bad); }, "bcast shape");
  const auto s = kernels::parse_bcast_shape("4x1x1");
  EXPECT_EQ(s.rows, 4u);
  EXPECT_EQ(s.units, 1u);
  EXPECT_TRUE(s.int_f16);
  EXPECT_FALSE(kernels::parse_bcast_shape("1x4").int_f16);
}

}  // namespace
}  // namespace wgllm::test

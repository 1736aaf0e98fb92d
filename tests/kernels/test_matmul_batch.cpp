// Batch decode's weight products against each token's lone product: the matvec for many tokens and the tiled kernel
// in the batch matvec's order give every token the same bits as alone (a stream's output does not depend on the
// streams beside it), and the rule that picks the tiled kernel. Fresh random inputs, poisoned outputs.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;
constexpr auto Matvec = MatmulImpl::Matvec;

// The matvec for many tokens (MatmulImpl::Matvec and batch decode's Batch: passes of up to 16 tokens; pipelines of
// 1-4, 8 or 16 tokens whose missing tokens are computed and not stored) gives each token the same bits as a product
// of that token alone, with the norm and bias epilogues, in the adapter's shapes and in one whose group is narrower
// than its values; also when the lone products take other rows, groups and units in flight with the same threads per
// row (matvec.wgsl: a token's arithmetic depends on the threads per row alone).
TEST(Matmul, MatvecTokensAsIfAlone) {
  for (const auto& [shape, alone_shape] : {std::pair{"", ""}, std::pair{"16x2x2", "16x4x1x2"}}) {
    SCOPED_TRACE(std::string(shape) + " / alone " + alone_shape);
    auto make = [](const char* s) {
      return std::make_unique<gpu::Context>(context_options([&](auto& o) {
        o.matvec_shape = s;
        o.rows_shape = "off";
      }));
    };
    const auto ctx_ptr = make(shape);
    const auto alone_ptr = std::string(alone_shape) == shape ? nullptr : make(alone_shape);
    gpu::Context& ctx = *ctx_ptr;
    gpu::Context& actx = alone_ptr ? *alone_ptr : ctx;
    for (const auto& [type, impl] :
         {std::pair{Q4_K, Matvec}, std::pair{F16, MatmulImpl::Batch}, std::pair{Q4_K, MatmulImpl::Batch}}) {
      SCOPED_TRACE(std::string(type_name(type)) + (impl == MatmulImpl::Batch ? " batch" : ""));
      auto gen = rng(321);
      const uint32_t n_in = 512, n_out = 37, T = 21;
      const auto bytes = random_weight(type, n_in, n_out, gen);
      const auto w = kernels::upload_weight(ctx, type, n_in, n_out, bytes);
      const auto x = random_floats(size_t(T) * n_in, gen);
      const auto bias = random_floats(n_out, gen);
      auto norm = random_floats(n_in, gen, 0.5f, 1.5f);
      auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
      auto bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
      auto nbuf = ctx.upload<float>(norm, WGPUBufferUsage_Storage, "norm");
      const kernels::MatmulOptions o{.bias = &bbuf, .norm = &nbuf, .eps = 1e-5f, .impl = impl};
      auto y = poisoned(ctx, size_t(T) * n_out, "y");
      gpu::ComputeBatch batch(ctx, "matvec tokens");
      kernels::encode_matmul(batch, ctx, w, xs, y, T, o);
      batch.submit_and_wait();
      // each token alone (in the context of the lone shape, with its own copies of the inputs)
      const auto aw = kernels::upload_weight(actx, type, n_in, n_out, bytes);
      auto abuf = actx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
      auto anbuf = actx.upload<float>(norm, WGPUBufferUsage_Storage, "norm");
      const kernels::MatmulOptions ao{.bias = &abuf, .norm = &anbuf, .eps = 1e-5f, .impl = impl};
      std::vector<gpu::Buffer> x1, y1;
      for (uint32_t t = 0; t < T; ++t) {
        x1.push_back(actx.upload<float>(std::span(x).subspan(size_t(t) * n_in, n_in), WGPUBufferUsage_Storage, "x1"));
        y1.push_back(poisoned(actx, n_out, "y1"));
      }
      gpu::ComputeBatch alone(actx, "matvec tokens alone");
      for (uint32_t t = 0; t < T; ++t) kernels::encode_matmul(alone, actx, aw, x1[t], y1[t], 1, ao);
      alone.submit_and_wait();
      const auto all = ctx.read<float>(y);
      const auto want = cpu::matmul(type, bytes, n_in, n_out, cpu::rms_norm(x, norm, T, n_in, 1e-5f), T, bias);
      const auto r = compare(all, want);
      EXPECT_LE(r.rel_l2, 2e-5) << r.describe();
      for (uint32_t t = 0; t < T; ++t) {
        const auto one = actx.read<float>(y1[t]);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + size_t(t) * n_out, size_t(n_out) * 4), 0)
            << "token " << t << " is not the same bits as alone";
      }
    }
  }
}

// Batch decode's products from kernels::batch_tile_from tokens on run on the tiled kernel in the batch matvec's order
// (matmul.wgsl's MM_CLASS, and MM_CHUNK for the block types): every token's outputs are the same bits as the matvec
// gives it alone, for each epilogue and every weight type, rows of fewer blocks than the kernel has passes, n_in past
// a multiple of 32, odd row counts, tiles of 16, 32 and 64 tokens and passes of several tiles, lane classes of 4 to
// 32 with their sums as one tree, as a tree and a fold (chunks of the subgroup), and as a fold alone (no subgroups).
TEST(Matmul, BatchTilesAsTheMatvec) {
  struct Shape {
    const char* matvec;  // forced batch matvec shape ("" the adapter's)
    bool no_subgroups;
    uint32_t split = 0;  // groups of lane classes (ContextOptions::batch_split; 0 unset)
  };
  struct Case {
    GgufType type;
    uint32_t n_in, n_out, n_tokens;
    const char* what;
  };
  // the float types, then the block types (MM_CHUNK: every type's runs, with and without offsets)
  const std::vector<Case> all_cases = {
      {F16, 512, 37, 21, "norm + bias"},   {F16, 96, 40, 9, "swiglu"},           {F16, 800, 33, 70, "accumulate"},
      {F16, 256, 64, 16, "split outputs"}, {F16, 200, 19, 33, "times"},          {F32, 512, 37, 21, "norm + bias"},
      {BF16, 96, 40, 9, "swiglu"},         {Q4_K, 512, 37, 21, "norm + bias"},   {Q6_K, 256, 40, 9, "swiglu"},
      {Q8_0, 800, 33, 70, "accumulate"},   {Q5_K, 256, 64, 16, "split outputs"}, {Q4_0, 96, 19, 33, "times"},
      {Q2_K, 256, 22, 40, "norm + bias"},  {Q4_1, 64, 37, 21, "norm + bias"}};
  const size_t first_block = 7;
  // (each shape's pipelines take lavapipe seconds to compile: the other shapes take a float case and a block case,
  // Q8_0 over 25 chunks: classes of several chunks, of one and of none)
  // Split products (MM_SPLIT + matmul_fold.wgsl) with groups of 4 classes (the tree above them 2 lanes a chunk, one
  // chunk or several), of 1 (8 lanes a chunk), of 1 without subgroups (the chunks' sums alone; the float types' whole
  // passes do not split there), the subgroup size measured where the adapter reports none
  // (gpu::Context::subgroup_size).
  const uint32_t sg = context().subgroup_size();
  for (const Shape sh :
       {Shape{"", false}, Shape{"16x2x2", false}, Shape{"32x2x2", false}, Shape{"4x2x8", false}, Shape{"16x2x2", true},
        Shape{"", false, 2}, Shape{"16x2x2", false, 4}, Shape{"32x2x2", false, 8}, Shape{"16x2x2", true, 16}}) {
    SCOPED_TRACE(std::string("matvec shape '") + sh.matvec + (sh.no_subgroups ? "', no subgroups" : "'") +
                 (sh.split ? ", split " + std::to_string(sh.split) : ""));
    if (sh.split && !sh.no_subgroups && sg != 8) continue;  // (the splits are chosen for subgroups of 8)
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = sh.matvec;
      o.disable_subgroups = sh.no_subgroups;
      o.batch_tile_from = 8;  // (and whatever the rows)
      o.batch_split = sh.split ? sh.split : 1;  // (1: unsplit)
    }));
    auto gen = rng(777);
    const std::vector<Case> cases =
        *sh.matvec || sh.split ? std::vector<Case>{all_cases[0], all_cases[first_block + 2]} : all_cases;
    for (const Case& c : cases) {
      const GgufType type = c.type;
      SCOPED_TRACE(std::string(type_name(type)) + " " + c.what + " " + std::to_string(c.n_in) + "x" +
                   std::to_string(c.n_out) + " x" + std::to_string(c.n_tokens));
      const std::string what = c.what;
      const uint32_t T = c.n_tokens;
      const auto bytes = random_weight(type, c.n_in, c.n_out, gen);
      const auto w = kernels::upload_weight(ctx, type, c.n_in, c.n_out, bytes);
      ASSERT_TRUE(kernels::batch_takes_tiles(ctx, w, T) && !kernels::batch_takes_tiles(ctx, w, 1));
      const auto x = random_floats(size_t(T) * c.n_in, gen);
      auto bias = ctx.upload<float>(random_floats(c.n_out, gen), WGPUBufferUsage_Storage, "bias");
      auto norm =
          ctx.upload<float>(random_floats((c.n_in + 7) / 8 * 8, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "norm");
      const uint32_t split1 = c.n_out / 4, split2 = c.n_out / 2;
      const std::vector<float> tv = random_floats(size_t(T) * c.n_out, gen);
      auto times = ctx.upload<float>(tv, WGPUBufferUsage_Storage, "times");
      // y's rows per token, and those of y1 and y2
      const uint32_t width = what == "swiglu" ? c.n_out / 2 : what == "split outputs" ? split1 : c.n_out;
      const std::vector<float> y0 = random_floats(size_t(T) * width, gen);  // accumulate's starting y
      kernels::MatmulOptions o{.impl = MatmulImpl::Batch};
      if (what == "norm + bias") o.bias = &bias, o.norm = &norm;
      if (what == "swiglu") o.swiglu = true, o.norm = &norm;
      if (what == "accumulate") o.accumulate = true;
      if (what == "times") o.times = &times, o.times_stride = c.n_out, o.act = kernels::GateAct::GeluTanh;
      auto run = [&](uint32_t first, uint32_t count) {  // tokens [first, first + count): y, y1, y2 as read back
        gpu::Buffer xb = ctx.upload<float>(std::span(x).subspan(size_t(first) * c.n_in, size_t(count) * c.n_in),
                                           WGPUBufferUsage_Storage, "x part");
        gpu::Buffer y = what == "accumulate"
                            ? ctx.upload<float>(std::span(y0).subspan(size_t(first) * width, size_t(count) * width),
                                                WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "y")
                            : poisoned(ctx, size_t(count) * width, "y");
        gpu::Buffer y1 = poisoned(ctx, size_t(count) * (split2 - split1), "y1");
        gpu::Buffer y2 = poisoned(ctx, size_t(count) * (c.n_out - split2), "y2");
        gpu::Buffer tb = ctx.upload<float>(std::span(tv).subspan(size_t(first) * c.n_out, size_t(count) * c.n_out),
                                           WGPUBufferUsage_Storage, "times part");
        kernels::MatmulOptions oo = o;
        if (what == "split outputs") oo.y1 = &y1, oo.y2 = &y2, oo.split1 = split1, oo.split2 = split2;
        if (oo.times) oo.times = &tb;
        gpu::ComputeBatch batch(ctx, "batch tiles");
        kernels::encode_matmul(batch, ctx, w, xb, y, count, oo);
        batch.submit_and_wait();
        std::vector<float> out = ctx.read<float>(y);
        if (what == "split outputs")
          for (const gpu::Buffer* b : {&y1, &y2}) {
            const auto more = ctx.read<float>(*b);
            out.insert(out.end(), more.begin(), more.end());
          }
        return out;
      };
      const std::vector<float> all = run(0, T);
      // the reference: the CPU product of the normed x, with the epilogue
      std::vector<float> want(size_t(T) * width);
      {
        const auto xin = o.norm ? cpu::rms_norm(x, ctx.read<float>(norm), T, c.n_in, 1e-5f) : x;
        const auto prod =
            cpu::matmul(type, bytes, c.n_in, c.n_out, xin, T, o.bias ? ctx.read<float>(bias) : std::vector<float>{});
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t r = 0; r < width; ++r) {
            const size_t i = size_t(t) * c.n_out + r;
            float v = prod[i];
            if (what == "swiglu") {
              const float g = prod[size_t(t) * c.n_out + 2 * r], u = prod[size_t(t) * c.n_out + 2 * r + 1];
              v = g / (1.f + std::exp(-g)) * u;
            }
            if (what == "accumulate") v += y0[size_t(t) * width + r];
            if (what == "times") {
              const float g = prod[i];
              v = 0.5f * g * (1.f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * tv[i];
            }
            want[size_t(t) * width + r] = v;
          }
      }
      const auto r = compare(std::span<const float>(all).first(want.size()), std::span<const float>(want));
      EXPECT_LE(r.rel_l2, 3e-5) << r.describe();
      for (uint32_t t = 0; t < T; t += (t % 7 == 3 ? 5 : 1)) {  // most tokens alone, through the matvec
        const auto one = run(t, 1);
        ASSERT_EQ(one.size() * T, all.size());
        for (size_t part = 0, off = 0; off < one.size(); ++part) {  // y, then y1 and y2
          const size_t n = what != "split outputs" ? width
                           : part == 0             ? split1
                           : part == 1             ? split2 - split1
                                                   : c.n_out - split2;
          ASSERT_EQ(std::memcmp(one.data() + off, all.data() + off * T + size_t(t) * n, n * 4), 0)
              << "token " << t << " output " << part << " is not the same bits as alone";
          off += n;
        }
      }
    }
  }
}

// Which batch products take the tiled kernel: by default from kBatchTileFrom tokens at kBatchTileRows rows or where
// the product splits, from half the tokens at 8x the rows, float and block types alike, never a step below that; batch_tile_from set: any
// rows from its count; 0: never; never with a forced tile of f16 sums.
TEST(Matmul, BatchTileRule) {
  auto gen = rng(5);
  gpu::Context& ctx = context();
  if (ctx.features().subgroups && ctx.adapter().subgroup_min != ctx.adapter().subgroup_max)
    GTEST_SKIP() << "subgroups of varying size: the batch products keep the matvec";
  const uint32_t from = kernels::kBatchTileFrom, rows = kernels::kBatchTileRows;
  auto weight = [&](GgufType type, uint32_t n_out) {
    return kernels::upload_weight(ctx, type, 256, n_out, random_weight(type, 256, n_out, gen));
  };
  const auto tall = weight(F16, rows), taller = weight(F32, 8 * rows), short_w = weight(BF16, rows - 2),
             block = weight(Q8_0, rows), short_block = weight(Q4_0, rows - 2);
  EXPECT_TRUE(kernels::batch_takes_tiles(ctx, tall, from));
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, tall, from - 1));
  EXPECT_TRUE(kernels::batch_takes_tiles(ctx, taller, from / 2));
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, taller, from / 2 - 1));
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, short_w, 4 * from));
  const auto few = weight(F16, 256);  // 4 tiles of 64 rows: they split (any rows) where the subgroup size is known
  EXPECT_EQ(kernels::batch_takes_tiles(ctx, few, from), ctx.subgroup_size() >= 4);
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, few, from - 1));
  EXPECT_TRUE(kernels::batch_takes_tiles(ctx, block, from));
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, block, from - 1));
  EXPECT_FALSE(kernels::batch_takes_tiles(ctx, short_block, 4 * from));
  {  // a split that is no power of two: refused, one line
    gpu::Context own(context_options([&](auto& o) { o.batch_split = 3; }));
    try {
      kernels::batch_takes_tiles(own, tall, from);
      ADD_FAILURE() << "a split of 3 was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("batch split 3"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  for (const uint32_t forced : {0u, 5u}) {
    gpu::Context own(context_options([&](auto& o) { o.batch_tile_from = forced; }));
    const auto small = kernels::upload_weight(own, F16, 64, 6, random_weight(F16, 64, 6, gen));
    EXPECT_EQ(kernels::batch_takes_tiles(own, small, 5), forced == 5) << forced;
    EXPECT_FALSE(kernels::batch_takes_tiles(own, small, 4)) << forced;
  }
  if (ctx.features().shader_f16) {  // a forced tile of f16 sums (prefill's): the batch products keep the matvec
    gpu::Context own(context_options([&](auto& o) {
      o.batch_tile_from = 5;
      o.matmul_tile = "64x64xf16";
    }));
    const auto small = kernels::upload_weight(own, F16, 64, 6, random_weight(F16, 64, 6, gen));
    EXPECT_FALSE(kernels::batch_takes_tiles(own, small, 5));
  }
}

// Auto's products past the matvec's tokens of fewer than kFewTiles tiles (a MoE router's in a prompt) take batch
// decode's split tiles: the same bits as MatmulImpl::Batch, near the CPU product; not a product of enough tiles, one
// on x's digits, a step of the matvec's tokens, nor with ContextOptions::batch_split 1.
TEST(Matmul, FewTilesTakeTheSplitTiles) {
  auto gen = rng(91);
  // (the CPU adapters' Rows kernel off, so that Auto there takes the tiles as on GPUs)
  gpu::Context ctx(context_options([](auto& o) { o.rows_shape = "off"; }));
  if (ctx.subgroup_size() < 4 || ctx.adapter().subgroup_min != ctx.adapter().subgroup_max)
    GTEST_SKIP() << "no split tiles on this adapter (its subgroup size unknown or varying)";
  // F16: a MoE router's type
  const uint32_t n_in = 320, n_out = 40, T = 70;
  const auto bytes = random_weight(F16, n_in, n_out, gen);
  const auto w = kernels::upload_weight(ctx, F16, n_in, n_out, bytes);
  EXPECT_TRUE(kernels::few_tiles_split(ctx, w, T));
  EXPECT_FALSE(kernels::few_tiles_split(ctx, w, kernels::kMatvecMaxTokens));
  const auto wide = kernels::upload_weight(ctx, F16, 32, 32 * 64, random_weight(F16, 32, 32 * 64, gen));
  EXPECT_FALSE(kernels::few_tiles_split(ctx, wide, 64));  // 32 tiles of 64 x 64
  {
    gpu::Context own(context_options([&](auto& o) {
      o.rows_shape = "off";
      o.batch_split = 1;
    }));
    const auto ow = kernels::upload_weight(own, F16, n_in, n_out, bytes);
    EXPECT_FALSE(kernels::few_tiles_split(own, ow, T));
  }
  {
    gpu::Context own(context_options([&](auto& o) { o.prompt_digits = 2; }));
    const auto q = kernels::upload_weight(own, Q4_K, 256, n_out, random_weight(Q4_K, 256, n_out, gen));
    EXPECT_FALSE(kernels::few_tiles_split(own, q, T));  // x's digits instead
  }
  const auto x = random_floats(size_t(T) * n_in, gen);
  const auto bias = random_floats(n_out, gen);
  const auto norm = random_floats(n_in, gen, 0.5f, 1.5f);
  auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
  auto nbuf = ctx.upload<float>(norm, WGPUBufferUsage_Storage, "norm");
  auto product = [&](MatmulImpl impl) {
    auto y = poisoned(ctx, size_t(T) * n_out, "y");
    gpu::ComputeBatch batch(ctx, "few tiles");
    kernels::encode_matmul(batch, ctx, w, xs, y, T, {.bias = &bbuf, .norm = &nbuf, .eps = 1e-5f, .impl = impl});
    batch.submit_and_wait();
    return ctx.read<float>(y);
  };
  const auto got = product(MatmulImpl::Auto), batch = product(MatmulImpl::Batch);
  const auto want = cpu::matmul(F16, bytes, n_in, n_out, cpu::rms_norm(x, norm, T, n_in, 1e-5f), T, bias);
  const auto r = compare(got, want);
  EXPECT_LE(r.rel_l2, 2e-5) << r.describe();
  ASSERT_EQ(got.size(), batch.size());
  EXPECT_EQ(std::memcmp(got.data(), batch.data(), got.size() * 4), 0) << "Auto is not the split tiles' bits";
}

}  // namespace
}  // namespace wgllm::test

// Forward-pass kernels (matmul.wgsl, norm/rope/swiglu, KV append) vs the CPU references in
// src/cpu/ops.h: an explicit table per op, fresh random inputs, poisoned outputs.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "cpu/ops.h"
#include "kernels/kv_append.h"
#include "kernels/kv_cache.h"
#include "gguf/dequant.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;
using kernels::WeightType;

constexpr auto F32 = WeightType::F32;
constexpr auto F16 = WeightType::F16;
constexpr auto BF16 = WeightType::BF16;
constexpr auto Q8_0 = WeightType::Q8_0;
constexpr auto Q4_0 = WeightType::Q4_0;

// Random GGUF bytes of a [ne1][ne0] tensor: values in [-1, 1] for float types; random quants
// and random normal f16 scales for Q8_0 / Q4_0.
std::vector<uint8_t> random_weight(WeightType t, uint64_t ne0, uint64_t ne1, std::mt19937_64& gen) {
  std::vector<uint8_t> out(kernels::gguf_bytes(t, ne0, ne1));
  std::uniform_real_distribution<float> val(-1.f, 1.f), scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  auto put16 = [&](size_t at, uint16_t h) { out[at] = uint8_t(h); out[at + 1] = uint8_t(h >> 8); };
  switch (t) {
    case WeightType::F32:
      for (size_t i = 0; i < ne0 * ne1; ++i) {
        const float f = val(gen);
        std::memcpy(&out[i * 4], &f, 4);
      }
      break;
    case WeightType::F16:
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, wgllm::f32_to_f16(val(gen)));
      break;
    case WeightType::BF16:
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, uint16_t(std::bit_cast<uint32_t>(val(gen)) >> 16));
      break;
    case WeightType::Q8_0:
    case WeightType::Q4_0: {
      const size_t bb = t == WeightType::Q8_0 ? 34 : 18;
      for (size_t b = 0; b < out.size(); b += bb) {
        put16(b, wgllm::f32_to_f16(byte(gen) & 1 ? scale(gen) : -scale(gen)));
        for (size_t j = 2; j < bb; ++j) out[b + j] = uint8_t(byte(gen));
      }
      break;
    }
  }
  return out;
}

// f() must throw InvalidArgument whose message names `field`.
template <typename F>
void expect_throw(F f, const char* field) {
  try {
    f();
    ADD_FAILURE() << "no throw for " << field;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

gpu::Buffer poisoned(gpu::Context& ctx, size_t floats, const char* label) {
  auto buf = ctx.create_buffer(floats * 4, WGPUBufferUsage_Storage, label);
  std::vector<uint32_t> poison(floats, kPoison);
  ctx.write_buffer(buf, 0, poison.data(), floats * 4);
  return buf;
}

// ---------------------------------------------------------------------------------- matmul

struct MatmulCase {
  const char* name;
  WeightType type;
  uint32_t n_in, n_out, n_tokens;
  bool bias = false;
  MatmulImpl impl = MatmulImpl::Auto;
  uint64_t max_piece_bytes = 0;  // > 0: force the weight into pieces of at most this many bytes
};

ErrorReport run_matmul(gpu::Context& ctx, const MatmulCase& c, uint64_t salt, size_t* pieces = nullptr) {
  auto gen = rng(salt);
  const auto bytes = random_weight(c.type, c.n_in, c.n_out, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_out, bytes, c.name, c.max_piece_bytes);
  if (pieces) *pieces = w.pieces.size();
  const auto x = random_floats(size_t(c.n_tokens) * c.n_in, gen);
  const auto bias = c.bias ? random_floats(c.n_out, gen) : std::vector<float>{};
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto y = poisoned(ctx, size_t(c.n_tokens) * c.n_out, "y");
  std::optional<gpu::Buffer> bbuf;
  if (c.bias) bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_matmul(batch, ctx, w, xbuf, y, c.n_tokens, {.bias = bbuf ? &*bbuf : nullptr, .impl = c.impl});
  batch.submit_and_wait();
  const auto got = ctx.read<float>(y);
  const auto want = cpu::matmul(c.type, bytes, c.n_in, c.n_out, x, c.n_tokens, bias);
  return compare(got, want);
}

constexpr auto Matvec = MatmulImpl::Matvec;
constexpr auto Tiled = MatmulImpl::Tiled;
constexpr auto Auto = MatmulImpl::Auto;

// name, type, n_in, n_out, n_tokens, bias, impl, max piece bytes
const MatmulCase kMatmulCases[] = {
    {"f32_mv_256x64_t1", F32, 256, 64, 1},
    {"f32_mv_odd_in_257x3_t1", F32, 257, 3, 1},
    {"f32_mv_n_out1_t2", F32, 100, 1, 2},
    {"f32_mv_4100x33_t3_bias", F32, 4100, 33, 3, true},
    {"f32_mv_t4", F32, 96, 77, 4},
    {"f32_mv_t7_chunks", F32, 130, 29, 7, false, Matvec},
    {"f32_mm_t7", F32, 130, 29, 7, false, Tiled},
    {"f32_mm_t64", F32, 512, 128, 64},
    {"f32_mm_t75_bias", F32, 300, 131, 75, true},
    {"f32_mm_t1", F32, 45, 70, 1, false, Tiled},
    {"f16_mv_896x131_t1", F16, 896, 131, 1},
    {"f16_mv_odd_in_33x5_t3", F16, 33, 5, 3},
    {"f16_mm_odd_in_1001x67_t75", F16, 1001, 67, 75, true},
    {"f16_mm_t64", F16, 256, 192, 64},
    {"bf16_mv_512x65_t1", BF16, 512, 65, 1, true},
    {"bf16_mv_odd_in_35x3_t2", BF16, 35, 3, 2},
    {"bf16_mm_t75", BF16, 160, 99, 75},
    {"q8_0_mv_896x131_t1", Q8_0, 896, 131, 1},
    {"q8_0_mv_32x1_t1", Q8_0, 32, 1, 1},
    {"q8_0_mv_4096x9_t3_bias", Q8_0, 4096, 9, 3, true},
    {"q8_0_mm_t7", Q8_0, 96, 3, 7},
    {"q8_0_mm_t75", Q8_0, 544, 129, 75, true},
    {"q8_0_mm_t64", Q8_0, 256, 64, 64},
    {"q4_0_mv_896x131_t1", Q4_0, 896, 131, 1},
    {"q4_0_mv_32x1_t4", Q4_0, 32, 1, 4},
    {"q4_0_mv_4864x17_t2_bias", Q4_0, 4864, 17, 2, true},
    {"q4_0_mm_t75", Q4_0, 224, 131, 75},
    {"q4_0_mm_t64_bias", Q4_0, 64, 65, 64, true},
    // Weights split into row pieces (small pieces forced so the split runs fast).
    {"split_f32_mv_t3", F32, 100, 301, 3, true, Auto, 16 * 1024},
    {"split_f16_mm_t75", F16, 200, 257, 75, false, Auto, 20 * 1024},
    {"split_q8_0_mv_t1", Q8_0, 256, 333, 1, true, Auto, 12 * 1024},
    {"split_q4_0_mm_t64", Q4_0, 128, 190, 64, false, Auto, 3 * 1024},
    {"split_bf16_mv_t2", BF16, 64, 97, 2, false, Auto, 1024},
};

class MatmulTable : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTable, MatchesCpuReference) {
  const auto& c = GetParam();
  size_t pieces = 0;
  const auto r = run_matmul(context(), c, std::hash<std::string>{}(c.name), &pieces);
  EXPECT_LE(r.rel_l2, 1e-5) << r.describe();
  if (c.max_piece_bytes) {
    EXPECT_GT(pieces, 1u) << "the weight was meant to be split";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulTable, ::testing::ValuesIn(kMatmulCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A weight larger than one storage binding (40000 x 1024 f32 = 164 MB on an adapter with a
// 128 MiB limit) is split into pieces of rows by upload_weight itself.
TEST(OpsMatmul, WeightLargerThanABinding) {
  auto& ctx = context();
  const uint64_t limit = ctx.max_binding_size();
  const uint32_t n_in = 1024;
  const uint32_t n_out = uint32_t(std::max<uint64_t>(40000, limit / (n_in * 4) + 1000));
  if (uint64_t(n_out) * n_in * 4 > ctx.limits().maxBufferSize * 2 || n_out > 200000)
    GTEST_SKIP() << "binding limit too large for a quick test";
  for (uint32_t t : {1u, 3u}) {
    size_t pieces = 0;
    const MatmulCase c{"huge_f32", F32, n_in, n_out, t, t == 3};
    const auto r = run_matmul(ctx, c, 1234 + t, &pieces);
    EXPECT_GE(pieces, 2u);
    EXPECT_LE(r.rel_l2, 1e-5) << "n_tokens " << t << ": " << r.describe();
  }
}

// ---------------------------------------------------------------------- matmul epilogues
// The fused extras of encode_matmul (norm folded in, residual accumulation, SwiGLU over
// interleaved rows, split outputs) against the CPU reference applied step by step.

enum class Epilogue { Plain, Accumulate, Swiglu, Split };

struct EpilogueCase {
  const char* name;
  WeightType type;
  uint32_t n_in, n_out, n_tokens;
  MatmulImpl impl;
  Epilogue epilogue;
  bool norm = false, bias = false;
  uint64_t max_piece_bytes = 0;
};

const EpilogueCase kEpilogueCases[] = {
    {"norm_f16_mv_t1", F16, 256, 96, 1, Matvec, Epilogue::Plain, true},
    {"norm_q8_0_mv_t3", Q8_0, 512, 40, 3, Matvec, Epilogue::Plain, true, true},
    {"norm_odd_in_f32_mv_t2", F32, 77, 30, 2, Matvec, Epilogue::Plain, true},
    {"norm_bf16_mm_t75", BF16, 160, 70, 75, Tiled, Epilogue::Plain, true, true},
    {"accum_f16_mv_t1", F16, 128, 64, 1, Matvec, Epilogue::Accumulate},
    {"accum_q4_0_mv_t4", Q4_0, 256, 33, 4, Matvec, Epilogue::Accumulate},
    {"accum_f32_mm_t70", F32, 96, 65, 70, Tiled, Epilogue::Accumulate},
    {"swiglu_norm_f16_mv_t1", F16, 256, 128, 1, Matvec, Epilogue::Swiglu, true},
    {"swiglu_q8_0_mv_t2_bias", Q8_0, 128, 70, 2, Matvec, Epilogue::Swiglu, false, true},
    {"swiglu_norm_f16_mm_t75", F16, 192, 134, 75, Tiled, Epilogue::Swiglu, true},
    {"swiglu_split_pieces_f32_mv_t1", F32, 64, 202, 1, Matvec, Epilogue::Swiglu, true, false, 6 * 1024},
    {"split_norm_bias_f16_mv_t1", F16, 256, 160, 1, Matvec, Epilogue::Split, true, true},
    {"split_q8_0_mv_t3", Q8_0, 96, 45, 3, Matvec, Epilogue::Split},
    {"split_norm_f16_mm_t75", F16, 128, 100, 75, Tiled, Epilogue::Split, true, true},
    {"split_pieces_q4_0_mm_t64", Q4_0, 64, 150, 64, Tiled, Epilogue::Split, false, false, 2 * 1024},
};

void check_epilogue(const EpilogueCase& c) {
  auto& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const uint32_t T = c.n_tokens, N = c.n_out;
  const auto bytes = random_weight(c.type, c.n_in, N, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, N, bytes, c.name, c.max_piece_bytes);
  if (c.max_piece_bytes) {
    ASSERT_GT(w.pieces.size(), 1u) << "the weight was meant to be split";
  }
  const auto x = random_floats(size_t(T) * c.n_in, gen, -2.f, 2.f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  kernels::MatmulOptions o{.impl = c.impl};
  std::optional<gpu::Buffer> bias_buf, norm_buf, y1, y2;
  std::vector<float> bias, norm;
  if (c.bias) {
    bias = random_floats(N, gen);
    bias_buf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
    o.bias = &*bias_buf;
  }
  std::vector<float> xin = x;  // what the plain product sees
  if (c.norm) {
    norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
    std::vector<float> padded = norm;
    padded.resize((c.n_in + 7) / 8 * 8, 0.f);
    norm_buf = ctx.upload<float>(padded, WGPUBufferUsage_Storage, "norm");
    o.norm = &*norm_buf;
    o.eps = 1e-5f;
    xin = cpu::rms_norm(x, norm, T, c.n_in, o.eps);
  }
  const auto full = cpu::matmul(c.type, bytes, c.n_in, N, xin, T, bias);  // [T][N]

  std::vector<float> want, y_init;
  size_t y_width = N;
  switch (c.epilogue) {
    case Epilogue::Plain:
      want = full;
      break;
    case Epilogue::Accumulate:
      o.accumulate = true;
      y_init = random_floats(size_t(T) * N, gen);
      for (size_t i = 0; i < full.size(); ++i) want.push_back(y_init[i] + full[i]);
      break;
    case Epilogue::Swiglu:
      o.swiglu = true;
      y_width = N / 2;
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t i = 0; i < N / 2; ++i) {
          const double g = full[size_t(t) * N + 2 * i], u = full[size_t(t) * N + 2 * i + 1];
          want.push_back(float(g / (1 + std::exp(-g)) * u));
        }
      break;
    case Epilogue::Split:
      o.split1 = N / 2;
      o.split2 = N / 2 + N / 5;
      y_width = o.split1;
      break;
  }
  gpu::Buffer y = poisoned(ctx, size_t(T) * y_width, "y");
  if (!y_init.empty()) ctx.write_buffer(y, 0, y_init.data(), y_init.size() * 4);
  if (c.epilogue == Epilogue::Split) {
    y1 = poisoned(ctx, size_t(T) * (o.split2 - o.split1), "y1");
    y2 = poisoned(ctx, size_t(T) * (N - o.split2), "y2");
    o.y1 = &*y1;
    o.y2 = &*y2;
  }
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_matmul(batch, ctx, w, xbuf, y, T, o);
  batch.submit_and_wait();
  const double tol = c.type == F32 ? 1e-5 : 2e-5;
  if (c.epilogue != Epilogue::Split) {
    const auto r = compare(ctx.read<float>(y), want);
    EXPECT_LE(r.rel_l2, tol) << r.describe();
    return;
  }
  // Split: each output holds its range of rows, token-major.
  const std::pair<const gpu::Buffer*, std::pair<uint32_t, uint32_t>> outs[] = {
      {&y, {0, o.split1}}, {&*y1, {o.split1, o.split2}}, {&*y2, {o.split2, N}}};
  for (const auto& [buf, range] : outs) {
    std::vector<float> part;
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t r = range.first; r < range.second; ++r) part.push_back(full[size_t(t) * N + r]);
    const auto r = compare(ctx.read<float>(*buf), part);
    EXPECT_LE(r.rel_l2, tol) << "rows [" << range.first << ", " << range.second << "): " << r.describe();
  }
}

class MatmulEpilogueTable : public ::testing::TestWithParam<EpilogueCase> {};

TEST_P(MatmulEpilogueTable, MatchesCpuReference) { check_epilogue(GetParam()); }

// The matvec shapes other adapters use (a GPU's, and odd ones), run here through the override:
// groups wider than a subgroup reduce through workgroup memory, several units in flight per step.
TEST(OpsMatmul, OtherMatvecShapes) {
  for (const char* shape : {"32x4x4", "32x4x4x2", "128x4x1", "256x4x1", "16x2x2x3", "8x2x4x2x1"}) {
    SCOPED_TRACE(shape);
    kernels::set_matvec_config_override(kernels::parse_matvec_config(shape));
    for (const EpilogueCase& c : kEpilogueCases)
      if (c.impl == Matvec) check_epilogue(c);
    for (const MatmulCase& c : kMatmulCases)
      if (c.impl != Tiled && c.n_tokens <= kernels::kMatvecMaxTokens) {
        const auto r = run_matmul(context(), c, 99);
        EXPECT_LE(r.rel_l2, 1e-5) << c.name << ": " << r.describe();
      }
    kernels::set_matvec_config_override({.threads_per_row = 0});
  }
  EXPECT_THROW(kernels::parse_matvec_config("32x4"), InvalidArgument);
  EXPECT_THROW(kernels::set_matvec_config_override(kernels::parse_matvec_config("32x3x4")), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulEpilogueTable, ::testing::ValuesIn(kEpilogueCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OpsMatmul, FusedWeightLayouts) {
  // Stacked rows: the concatenation of the parts' bytes; interleaved: a0 b0 a1 b1 ...
  const std::vector<uint8_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12};
  const std::span<const uint8_t> parts[] = {a, b};
  EXPECT_EQ(kernels::concat_rows(parts), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(kernels::interleave_rows(a, b, 3), (std::vector<uint8_t>{1, 2, 7, 8, 3, 4, 9, 10, 5, 6, 11, 12}));
  EXPECT_THROW(kernels::interleave_rows(a, std::span(b).first(4), 3), InvalidArgument);
  EXPECT_THROW(kernels::interleave_rows(a, b, 4), InvalidArgument);
}

TEST(OpsMatmul, EpilogueArgumentsAreChecked) {
  auto& ctx = context();
  auto gen = rng(9);
  const auto bytes = random_weight(F16, 64, 10, gen);
  const auto w = kernels::upload_weight(ctx, F16, 64, 10, bytes);
  const auto odd = kernels::upload_weight(ctx, F16, 64, 9, random_weight(F16, 64, 9, gen));
  auto x = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y");
  auto y1 = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y1");
  auto y2 = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y2");
  auto short_norm = ctx.create_buffer(60 * 4, WGPUBufferUsage_Storage, "norm");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_matmul(batch, ctx, odd, x, y, 1, {.swiglu = true}); }, "even n_out");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1}); }, "split outputs");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .y2 = &y2, .split1 = 6, .split2 = 4}); },
               "split1 <= split2");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .y2 = &y1, .split1 = 2, .split2 = 4}); },
               "different buffers");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.norm = &short_norm}); }, "norm holds");
  auto big_y = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "y");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, big_y, 1, {.norm = &big_y, .eps = 1e-5f}); },
               "norm must not");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.accumulate = true, .swiglu = true}); }, "swiglu");
}

// Without subgroups the matvec rows reduce through workgroup memory instead of shuffles.
TEST(OpsMatmul, NoSubgroupsMatvec) {
  gpu::Context ctx({.adapter = std::getenv("WGLLM_ADAPTER") ? std::getenv("WGLLM_ADAPTER") : "",
                    .disable_subgroups = true});
  EXPECT_FALSE(kernels::matvec_config(ctx).shuffle);
  for (const MatmulCase& c : {MatmulCase{"nosg_q4_0_t1", Q4_0, 896, 131, 1, true},
                              MatmulCase{"nosg_f16_t3", F16, 257, 33, 3},
                              MatmulCase{"nosg_q8_0_t4_split", Q8_0, 256, 99, 4, false, Auto, 4096}}) {
    const auto r = run_matmul(ctx, c, 77);
    EXPECT_LE(r.rel_l2, 1e-5) << c.name << ": " << r.describe();
  }
}

TEST(OpsMatmul, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto gen = rng(5);
  const auto bytes = random_weight(Q8_0, 64, 8, gen);
  const auto w = kernels::upload_weight(ctx, Q8_0, 64, 8, bytes);
  auto x = ctx.create_buffer(2 * 64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(2 * 8 * 4, WGPUBufferUsage_Storage, "y");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 0); }, "n_tokens");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, small, y, 2); }, "x holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, small, 2); }, "y holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, x, 1); }, "x and y");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 2, {.bias = &small}); }, "bias");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, kernels::GpuWeight{}, x, y, 2); }, "weight");
  expect_throw([&] { kernels::upload_weight(ctx, Q8_0, 48, 8, bytes); }, "ne0");
  expect_throw([&] { kernels::upload_weight(ctx, Q8_0, 64, 9, bytes); }, "bytes");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 0, 9, bytes); }, "ne0");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 64, 0, bytes); }, "ne1");
  expect_throw([&] { kernels::weight_type_from_ggml(12); }, "GGML type 12");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 4096, 2, std::vector<uint8_t>(4096 * 8), "w", 1024); },
               "one row");
  expect_throw([&] { kernels::encode_embedding(batch, ctx, w, small, y, 5); }, "ids");
  expect_throw([&] { kernels::encode_embedding(batch, ctx, w, x, small, 2); }, "out");
}

// ------------------------------------------------------------------------------- embedding

struct EmbedCase {
  const char* name;
  WeightType type;
  uint32_t n_embd, n_vocab, n_tokens;
  uint64_t max_piece_bytes = 0;
};

const EmbedCase kEmbedCases[] = {
    {"f32_d64", F32, 64, 100, 7},
    {"f32_odd_d37", F32, 37, 50, 3},
    {"f16_d896", F16, 896, 300, 75},
    {"f16_odd_d33", F16, 33, 20, 1},
    {"bf16_d128", BF16, 128, 77, 9},
    {"q8_0_d256", Q8_0, 256, 129, 64},
    {"q4_0_d96", Q4_0, 96, 65, 5},
    {"split_f16_d64", F16, 64, 500, 40, 8 * 1024},
    {"split_q4_0_d128", Q4_0, 128, 333, 75, 4 * 1024},
};

class EmbeddingTable : public ::testing::TestWithParam<EmbedCase> {};

TEST_P(EmbeddingTable, MatchesCpuReference) {
  const auto& c = GetParam();
  auto& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const auto bytes = random_weight(c.type, c.n_embd, c.n_vocab, gen);
  const auto table = kernels::upload_weight(ctx, c.type, c.n_embd, c.n_vocab, bytes, c.name, c.max_piece_bytes);
  if (c.max_piece_bytes) {
    EXPECT_GT(table.pieces.size(), 1u);
  }
  std::uniform_int_distribution<uint32_t> id(0, c.n_vocab - 1);
  std::vector<uint32_t> ids(c.n_tokens);
  for (auto& i : ids) i = id(gen);
  ids[0] = c.n_vocab - 1;
  if (c.n_tokens > 2) ids[2] = c.n_vocab + 5;  // out of range: a zero row
  auto ibuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "ids");
  auto out = poisoned(ctx, size_t(c.n_tokens) * c.n_embd, "out");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_embedding(batch, ctx, table, ibuf, out, c.n_tokens);
  batch.submit_and_wait();
  const auto got = ctx.read<float>(out);
  const auto want = cpu::embedding(c.type, bytes, c.n_embd, c.n_vocab, ids);
  const auto r = compare(got, want);
  EXPECT_EQ(r.rel_l2, 0.0) << r.describe();  // a gather is exact
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbeddingTable, ::testing::ValuesIn(kEmbedCases),
                         [](const auto& info) { return std::string(info.param.name); });

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
  const RopeScaling scaling{.enabled = c.llama3, .factor = 8.f, .low_freq_factor = 1.f, .high_freq_factor = 4.f,
                            .original_context = 8192};
  const auto factors = kernels::rope_freq_factors(scaling, c.rope_dim, c.base);
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, c.base, c.llama3 ? std::span<const float>(factors)
                                                                            : std::span<const float>());
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  const auto x2 = random_floats(size_t(c.n_tokens) * c.heads2 * c.head_dim, gen, -2.f, 2.f);
  std::optional<gpu::Buffer> x2buf;
  if (c.heads2) x2buf = ctx.upload<float>(x2, WGPUBufferUsage_Storage, "x2");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_rope(batch, ctx,
                       {.n_tokens = c.n_tokens, .n_heads = c.n_heads, .head_dim = c.head_dim, .rope_dim = c.rope_dim,
                        .start_pos = c.start_pos, .type = c.type, .row_stride = stride, .head_offset = c.head_offset,
                        .n_heads2 = c.heads2},
                       table, xbuf, x2buf ? &*x2buf : nullptr);
  batch.submit_and_wait();
  const auto freq = c.llama3 ? std::span<const float>(factors) : std::span<const float>();
  if (c.heads2) {
    const auto want2 = cpu::rope(x2, c.n_tokens, c.heads2, c.head_dim, c.rope_dim, c.start_pos, c.base, c.type == Neox, freq);
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
  const auto want = cpu::rope(dense, c.n_tokens, c.n_heads, c.head_dim, c.rope_dim, c.start_pos, c.base,
                              c.type == Neox, freq);
  const auto r = compare(got, want);
  // The reduced-angle path keeps f32 rounding (~1e-7) away from the position: measured ~2.5e-7 up to 2^16.
  EXPECT_LE(r.rel_l2, 1e-6) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeTable, ::testing::ValuesIn(kRopeCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OpsRope, Llama3FreqFactors) {
  const RopeScaling s{.enabled = true, .factor = 8.f, .low_freq_factor = 1.f, .high_freq_factor = 4.f,
                      .original_context = 8192};
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

// ---------------------------------------------------------------------------------- SwiGLU

TEST(OpsSwiglu, MatchesCpuReference) {
  auto& ctx = context();
  for (uint32_t n : {1u, 255u, 256u * 3 + 7, 4864u * 7, 100000u}) {
    auto gen = rng(n);
    auto gate = random_floats(n, gen, -12.f, 12.f);
    gate[n / 2] = -100.f;  // e^100 overflows f32: silu -> -0 (the reference: a denormal)
    gate[n - 1] = 100.f;
    const auto up = random_floats(n, gen, -2.f, 2.f);
    auto g = ctx.upload<float>(gate, WGPUBufferUsage_Storage, "gate");
    auto u = ctx.upload<float>(up, WGPUBufferUsage_Storage, "up");
    auto out = poisoned(ctx, n, "out");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_swiglu(batch, ctx, g, u, out, n);
    batch.submit_and_wait();
    const auto r = compare(ctx.read<float>(out), cpu::swiglu(gate, up));
    EXPECT_LE(r.rel_l2, 1e-6) << "n " << n << ": " << r.describe();
  }
}

// ------------------------------------------------------------------------------- KV append

struct KvAppendCase {
  const char* name;
  uint32_t kv_dim, max_seq, page_size;
  kernels::KvType type;
  uint32_t start_pos, n_tokens;
};

const KvAppendCase kKvAppendCases[] = {
    {"f16_contiguous_decode", 128, 100, 0, kernels::KvType::F16, 37, 1},
    {"f16_contiguous_prefill", 256, 300, 0, kernels::KvType::F16, 0, 75},
    {"f32_paged_across_pages", 64, 1000, 128, kernels::KvType::F32, 50, 200},
    {"f16_paged_decode_page_edge", 128, 512, 128, kernels::KvType::F16, 127, 1},
    {"f16_paged_prefill_odd", 96, 700, 128, kernels::KvType::F16, 3, 333},
    {"f32_paged_kvdim_odd", 33, 384, 128, kernels::KvType::F32, 100, 60},
    // > one binding of K/V (f32, 129 pages of 1 MiB on a 128 MiB adapter): several pools.
    {"f32_multi_pool", 1024, 129 * 128, 128, kernels::KvType::F32, 16000, 450},
};

class KvAppendTable : public ::testing::TestWithParam<KvAppendCase> {};

TEST_P(KvAppendTable, WritesThroughThePageTable) {
  const auto& c = GetParam();
  auto& ctx = context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  kernels::KvCache kv(ctx, {.kv_dim = c.kv_dim, .max_seq = c.max_seq, .page_size = c.page_size, .type = c.type,
                            .shuffle_pages = true, .shuffle_seed = seed() ^ salt}, c.name);
  if (std::string(c.name) == "f32_multi_pool" && ctx.max_binding_size() <= (128ull << 20)) {
    EXPECT_GT(kv.n_pools(), 1u);
  }
  // Neighbour rows written by the host must survive the append.
  const uint32_t lo = c.start_pos ? c.start_pos - 1 : 0;
  const uint32_t hi = std::min(c.max_seq, c.start_pos + c.n_tokens + 1);
  const auto nk = random_floats(size_t(hi - lo) * c.kv_dim, gen), nv = random_floats(size_t(hi - lo) * c.kv_dim, gen);
  kv.write(lo, hi - lo, nk, nv);
  const auto k = random_floats(size_t(c.n_tokens) * c.kv_dim, gen, -4.f, 4.f);
  const auto v = random_floats(size_t(c.n_tokens) * c.kv_dim, gen, -4.f, 4.f);
  auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k");
  auto vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_kv_append(batch, ctx, kv, kb, vb, c.start_pos, c.n_tokens);
  batch.submit_and_wait();
  std::vector<float> gk, gv;
  kv.read(lo, hi - lo, gk, gv);
  // Expected: the neighbours, and the appended rows rounded like the cache's own host writes.
  auto wk = nk, wv = nv;
  const bool f16 = c.type == kernels::KvType::F16;
  auto round = [&](float f) { return f16 ? wgllm::f16_to_f32(wgllm::f32_to_f16(f)) : f; };
  for (size_t i = 0; i < wk.size(); ++i) {
    wk[i] = round(wk[i]);
    wv[i] = round(wv[i]);
  }
  for (size_t i = 0; i < k.size(); ++i) {
    wk[size_t(c.start_pos - lo) * c.kv_dim + i] = round(k[i]);
    wv[size_t(c.start_pos - lo) * c.kv_dim + i] = round(v[i]);
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < wk.size(); ++i) mismatches += (gk[i] != wk[i]) + (gv[i] != wv[i]);
  // pack2x16float may round differently from round-to-nearest-even on a tie: a handful at most.
  EXPECT_LE(mismatches, f16 ? wk.size() / 1000 : 0u);
  const auto rk = compare(gk, wk), rv = compare(gv, wv);
  EXPECT_LE(rk.rel_l2, 1e-6) << "K: " << rk.describe();
  EXPECT_LE(rv.rel_l2, 1e-6) << "V: " << rv.describe();
}

INSTANTIATE_TEST_SUITE_P(Cases, KvAppendTable, ::testing::ValuesIn(kKvAppendCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Rows next to `pos` written by the host before a kernel appends row `pos` of a KV cache: they must survive it, and
// the appended row must match the expected K and V (within the f16 cache's rounding).
struct AppendedRowCheck {
  uint32_t pos, lo, hi, kv_dim;
  std::vector<float> nk, nv;
  AppendedRowCheck(kernels::KvCache& kv, uint32_t pos, std::mt19937_64& gen)
      : pos(pos), lo(pos ? pos - 1 : 0), hi(std::min(kv.config().max_seq, pos + 2)), kv_dim(kv.config().kv_dim) {
    nk = random_floats(size_t(hi - lo) * kv_dim, gen);
    nv = random_floats(size_t(hi - lo) * kv_dim, gen);
    kv.write(lo, hi - lo, nk, nv);
  }
  void expect(const kernels::KvCache& kv, std::span<const float> want_k, std::span<const float> want_v) const {
    std::vector<float> gk, gv;
    kv.read(lo, hi - lo, gk, gv);
    const bool f16 = kv.config().type == kernels::KvType::F16;
    auto round = [&](float f) { return f16 ? wgllm::f16_to_f32(wgllm::f32_to_f16(f)) : f; };
    const size_t at = size_t(pos - lo) * kv_dim;
    for (size_t i = 0; i < gk.size(); ++i) {
      if (i >= at && i < at + kv_dim) continue;
      ASSERT_EQ(gk[i], round(nk[i])) << "K neighbour element " << i << " changed";
      ASSERT_EQ(gv[i], round(nv[i])) << "V neighbour element " << i << " changed";
    }
    const double tol = f16 ? 1e-3 : 1e-5;
    const auto rk = compare(std::span<const float>(gk).subspan(at, kv_dim), want_k);
    const auto rv = compare(std::span<const float>(gv).subspan(at, kv_dim), want_v);
    EXPECT_LE(rk.rel_l2, tol) << "K: " << rk.describe();
    EXPECT_LE(rv.rel_l2, tol) << "V: " << rv.describe();
  }
};

// The decode epilogue of the stacked q/k/v product: q rotated into y, k rotated and v written
// into the cache at one position (through the page table, into the right pool).
struct RopeKvCase {
  const char* name;
  WeightType type;
  uint32_t n_in, n_head, n_kv, head_dim, rope_dim, pos, max_seq, page_size;
  kernels::KvType kv_type;
  bool bias;
  bool neox = false;
};
const RopeKvCase kRopeKvCases[] = {
    {"neox_f16_f16cache_bias", F16, 128, 4, 2, 32, 32, 7, 64, 0, kernels::KvType::F16, true, true},
    {"neox_q8_0_f32cache_partial_rope_paged", Q8_0, 64, 2, 2, 64, 32, 200, 512, 128, kernels::KvType::F32, false, true},
    {"neox_f32_f16cache_page_edge_bias", F32, 32, 8, 2, 128, 128, 127, 256, 128, kernels::KvType::F16, true, true},
    {"f16_f16cache", F16, 128, 4, 2, 16, 16, 5, 64, 0, kernels::KvType::F16, false},
    {"q8_0_f32cache_partial_rope_bias_paged", Q8_0, 96, 6, 2, 32, 16, 300, 512, 128, kernels::KvType::F32, true},
    {"bf16_f16cache_page_edge_bias", BF16, 64, 4, 4, 64, 64, 255, 512, 128, kernels::KvType::F16, true},
    {"q4_0_f16cache_first_position", Q4_0, 64, 2, 1, 64, 32, 0, 8, 0, kernels::KvType::F16, false},
    // > one binding of K/V on a 128 MiB adapter: the position lives in the second pool.
    {"f32_multi_pool", F32, 32, 8, 8, 128, 128, 16000, 129 * 128, 128, kernels::KvType::F32, false},
};

void check_rope_kv(const RopeKvCase& c) {
  auto& ctx = context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_kv * c.head_dim, N = qd + 2 * kvd;
  const auto bytes = random_weight(c.type, c.n_in, N, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, N, bytes, c.name);
  const auto x = random_floats(c.n_in, gen, -2.f, 2.f);
  auto norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
  std::vector<float> bias;
  if (c.bias) bias = random_floats(N, gen);
  std::vector<float> padded = norm;
  padded.resize((c.n_in + 7) / 8 * 8, 0.f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto nbuf = ctx.upload<float>(padded, WGPUBufferUsage_Storage, "norm");
  std::optional<gpu::Buffer> bbuf;
  if (c.bias) bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
  const std::vector<float> poison(qd, std::nanf(""));
  auto y = ctx.upload<float>(poison, WGPUBufferUsage_Storage, "q");
  const double base = 10000.0;
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, float(base));
  kernels::KvCache kv(ctx, {.kv_dim = kvd, .max_seq = c.max_seq, .page_size = c.page_size, .type = c.kv_type,
                            .shuffle_pages = c.page_size > 0, .shuffle_seed = seed() ^ salt}, c.name);
  const AppendedRowCheck row(kv, c.pos, gen);
  const kernels::RopeKvAppend rk{.table = &table, .head_dim = c.head_dim, .rope_dim = c.rope_dim, .neox = c.neox,
                                 .pos = c.pos, .kv = &kv};
  kernels::MatmulOptions o{.bias = c.bias ? &*bbuf : nullptr, .norm = &nbuf, .eps = 1e-5f};
  o.split1 = qd;
  o.split2 = qd + kvd;
  o.rope_kv = &rk;
  gpu::ComputeBatch batch(ctx, c.name);
  if (!kernels::rope_kv_supported(ctx, w, rk)) {  // neox under a matvec shape of 2 rows per group
    EXPECT_EQ(kernels::matvec_config(ctx, N, c.n_in).rows % 4, 2u);
    expect_throw([&] { kernels::encode_matmul(batch, ctx, w, xbuf, y, 1, o); }, "neox");
    return;
  }
  kernels::encode_matmul(batch, ctx, w, xbuf, y, 1, o);
  batch.submit_and_wait();

  const auto xin = cpu::rms_norm(x, norm, 1, c.n_in, 1e-5f);
  const auto full = cpu::matmul(c.type, bytes, c.n_in, N, xin, 1, bias);
  const std::vector<float> q(full.begin(), full.begin() + qd), k(full.begin() + qd, full.begin() + qd + kvd),
      v(full.begin() + qd + kvd, full.end());
  const auto want_q = cpu::rope(q, 1, c.n_head, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto want_k = cpu::rope(k, 1, c.n_kv, c.head_dim, c.rope_dim, c.pos, base, c.neox);
  const auto rq = compare(ctx.read<float>(y), want_q);
  EXPECT_LE(rq.rel_l2, 1e-5) << "q: " << rq.describe();
  row.expect(kv, want_k, v);
}

std::ostream& operator<<(std::ostream& o, const RopeKvCase& c) { return o << c.name; }

class RopeKvTable : public ::testing::TestWithParam<RopeKvCase> {};

TEST_P(RopeKvTable, MatchesCpuReference) {
  check_rope_kv(GetParam());
  // and in the shapes GPUs use (shuffle-only reduction, workgroup memory, units in flight)
  for (const char* shape : {"32x4x4", "128x4x1", "16x2x2x3"}) {
    SCOPED_TRACE(shape);
    kernels::set_matvec_config_override(kernels::parse_matvec_config(shape));
    check_rope_kv(GetParam());
    kernels::set_matvec_config_override({.threads_per_row = 0});
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeKvTable, ::testing::ValuesIn(kRopeKvCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OpsMatmul, RopeKvBadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  const auto bytes = std::vector<uint8_t>(size_t(64) * 128 * 4, 0);
  const auto w = kernels::upload_weight(ctx, WeightType::F32, 64, 128, bytes, "w");  // q 64, k 32, v 32 rows
  auto table = kernels::upload_rope_table(ctx, 16, 10000.f);
  kernels::KvCache kv(ctx, {.kv_dim = 32, .max_seq = 8});
  auto x = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(128 * 4, WGPUBufferUsage_Storage, "y");
  gpu::ComputeBatch batch(ctx, "bad");
  auto run = [&](kernels::RopeKvAppend rk, uint32_t split1, uint32_t split2, uint32_t n_tokens = 1,
                 const gpu::Buffer* y1 = nullptr) {
    kernels::MatmulOptions o;
    o.split1 = split1;
    o.split2 = split2;
    o.rope_kv = &rk;
    o.y1 = y1;
    o.y2 = y1;
    kernels::encode_matmul(batch, ctx, w, x, y, n_tokens, o);
  };
  const kernels::RopeKvAppend ok{.table = &table, .head_dim = 16, .rope_dim = 16, .pos = 3, .kv = &kv};
  EXPECT_NO_THROW(run(ok, 64, 96));
  expect_throw([&] { run(ok, 64, 90); }, "kv_dim");
  expect_throw([&] { run(ok, 64, 96, 2); }, "one-token");
  expect_throw([&] { run({.table = &table, .head_dim = 16, .rope_dim = 16, .pos = 8, .kv = &kv}, 64, 96); }, "max_seq");
  expect_throw([&] { run({.table = &table, .head_dim = 16, .rope_dim = 18, .pos = 0, .kv = &kv}, 64, 96); }, "rope_dim");
  expect_throw([&] { run({.table = &table, .head_dim = 24, .rope_dim = 16, .pos = 0, .kv = &kv}, 64, 96); }, "head_dim");
  expect_throw([&] { run({.table = nullptr, .head_dim = 16, .rope_dim = 16, .pos = 0, .kv = &kv}, 64, 96); }, "table");
  expect_throw([&] { run(ok, 64, 96, 1, &y); }, "no y1");
}

// qwen3's decode step between the q/k/v product and attention: per-head q/k norm, RoPE, the KV append.
struct QkNormCase {
  const char* name;
  uint32_t n_head, n_kv, head_dim, rope_dim;
  bool neox;
  uint32_t pos, max_seq, page_size;
  kernels::KvType kv_type;
};
const QkNormCase kQkNormCases[] = {
    {"normal_f16cache_d64", 4, 2, 64, 64, false, 9, 32, 0, kernels::KvType::F16},
    {"neox_f32cache_d128_paged", 8, 2, 128, 128, true, 300, 512, 128, kernels::KvType::F32},
    {"neox_partial_f16cache_d256", 2, 1, 256, 128, true, 127, 256, 128, kernels::KvType::F16},
    {"normal_partial_f32cache_d512_two_pairs_a_thread", 2, 1, 512, 256, false, 0, 4, 0, kernels::KvType::F32},
    {"neox_f16cache_d8", 3, 3, 8, 8, true, 40, 64, 0, kernels::KvType::F16},
};
std::ostream& operator<<(std::ostream& o, const QkNormCase& c) { return o << c.name; }

class QkNormRopeKvTable : public ::testing::TestWithParam<QkNormCase> {};

TEST_P(QkNormRopeKvTable, MatchesCpuReference) {
  const QkNormCase& c = GetParam();
  auto& ctx = context();
  const uint64_t salt = std::hash<std::string>{}(c.name);
  auto gen = rng(salt);
  const uint32_t qd = c.n_head * c.head_dim, kvd = c.n_kv * c.head_dim;
  const auto q = random_floats(qd, gen, -3.f, 3.f), k = random_floats(kvd, gen, -3.f, 3.f),
             v = random_floats(kvd, gen, -3.f, 3.f);
  const auto qn = random_floats(c.head_dim, gen, 0.5f, 1.5f), kn = random_floats(c.head_dim, gen, 0.5f, 1.5f);
  auto qb = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
  auto kb = ctx.upload<float>(k, WGPUBufferUsage_Storage, "k");
  auto vb = ctx.upload<float>(v, WGPUBufferUsage_Storage, "v");
  auto qnb = ctx.upload<float>(qn, WGPUBufferUsage_Storage, "q_norm");
  auto knb = ctx.upload<float>(kn, WGPUBufferUsage_Storage, "k_norm");
  const double base = 500000.0;
  auto table = kernels::upload_rope_table(ctx, c.rope_dim, float(base));
  kernels::KvCache kv(ctx, {.kv_dim = kvd, .max_seq = c.max_seq, .page_size = c.page_size, .type = c.kv_type,
                            .shuffle_pages = c.page_size > 0, .shuffle_seed = seed() ^ salt}, c.name);
  const AppendedRowCheck row(kv, c.pos, gen);
  const float eps = 1e-6f;
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_qk_norm_rope_kv(batch, ctx,
                                  {.n_head = c.n_head, .n_kv = c.n_kv, .head_dim = c.head_dim, .rope_dim = c.rope_dim,
                                   .type = c.neox ? RopeType::Neox : RopeType::Normal, .pos = c.pos, .eps = eps},
                                  table, qb, kb, vb, qnb, knb, kv);
  batch.submit_and_wait();
  const auto want_q = cpu::rope(cpu::rms_norm(q, qn, c.n_head, c.head_dim, eps), 1, c.n_head, c.head_dim, c.rope_dim,
                                c.pos, base, c.neox);
  const auto want_k = cpu::rope(cpu::rms_norm(k, kn, c.n_kv, c.head_dim, eps), 1, c.n_kv, c.head_dim, c.rope_dim,
                                c.pos, base, c.neox);
  const auto rq = compare(ctx.read<float>(qb), want_q);
  EXPECT_LE(rq.rel_l2, 1e-5) << "q: " << rq.describe();
  row.expect(kv, want_k, v);
}

INSTANTIATE_TEST_SUITE_P(Cases, QkNormRopeKvTable, ::testing::ValuesIn(kQkNormCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OpsQkNormRopeKv, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  kernels::KvCache kv(ctx, {.kv_dim = 32, .max_seq = 8});
  auto table = kernels::upload_rope_table(ctx, 16, 10000.f);
  auto buf = ctx.create_buffer(1024, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(1024, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx, "bad");
  const kernels::QkNormRopeKvShape ok{.n_head = 4, .n_kv = 2, .head_dim = 16, .pos = 3};
  auto run = [&](kernels::QkNormRopeKvShape s, const gpu::Buffer& q, const gpu::Buffer& k) {
    kernels::encode_qk_norm_rope_kv(batch, ctx, s, table, q, k, other, buf, buf, kv);
  };
  EXPECT_NO_THROW(run(ok, buf, other));
  auto with = [&](auto change) {
    kernels::QkNormRopeKvShape s = ok;
    change(s);
    return s;
  };
  expect_throw([&] { run(with([](auto& s) { s.n_kv = 3; }), buf, other); }, "kv_dim");
  expect_throw([&] { run(with([](auto& s) { s.pos = 8; }), buf, other); }, "max_seq");
  expect_throw([&] { run(with([](auto& s) { s.rope_dim = 18; }), buf, other); }, "rope_dim");
  expect_throw([&] { run(with([](auto& s) { s.head_dim = 1024; }), buf, other); }, "head_dim");
  expect_throw([&] { run(with([](auto& s) { s.eps = 0; }), buf, other); }, "eps");
  expect_throw([&] { run(ok, small, other); }, "q holds");
  expect_throw([&] { run(ok, other, other); }, "q must be another buffer");
}

TEST(OpsKvAppend, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  kernels::KvCache odd(ctx, {.kv_dim = 33, .max_seq = 16});
  kernels::KvCache kv(ctx, {.kv_dim = 64, .max_seq = 16});
  auto buf = ctx.create_buffer(16 * 64 * 4, WGPUBufferUsage_Storage, "kv rows");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, odd, buf, buf, 0, 1); }, "kv_dim");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, buf, 10, 7); }, "max_seq");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, buf, 0, 0); }, "n_tokens");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, small, buf, 0, 2); }, "k holds");
  expect_throw([&] { kernels::encode_kv_append(batch, ctx, kv, buf, small, 0, 2); }, "v holds");
}

TEST(OpsNormRopeSwiglu, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(4096 * 4, WGPUBufferUsage_Storage, "other");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  auto table = kernels::upload_rope_table(ctx, 64, 10000.f);
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, small, other, 2, 64, 1e-6f); }, "w holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, small, buf, other, 2, 64, 1e-6f); }, "x holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, small, 2, 64, 1e-6f); }, "y holds");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 0, 64, 1e-6f); }, "n_rows");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 2, 0, 1e-6f); }, "dim");
  expect_throw([&] { kernels::encode_rms_norm(batch, ctx, buf, other, buf, 2, 64, -1.f); }, "eps");
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
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, buf, 16); }, "out must differ");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, small, other, buf, 16); }, "gate holds");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, small, 16); }, "out holds");
  expect_throw([&] { kernels::encode_swiglu(batch, ctx, buf, other, small, 0); }, "n must");
}

}  // namespace
}  // namespace wgllm::test

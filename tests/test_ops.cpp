// Forward-pass kernels (matmul.wgsl, norm/rope/swiglu, KV append) vs the CPU references in
// src/cpu/ops.h: an explicit table per op, fresh random inputs, poisoned outputs.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "cpu/ops.h"
#include "kernels/kv_cache.h"
#include "kernels/matmul.h"
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
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, kernels::f32_to_f16(val(gen)));
      break;
    case WeightType::BF16:
      for (size_t i = 0; i < ne0 * ne1; ++i) put16(i * 2, uint16_t(std::bit_cast<uint32_t>(val(gen)) >> 16));
      break;
    case WeightType::Q8_0:
    case WeightType::Q4_0: {
      const size_t bb = t == WeightType::Q8_0 ? 34 : 18;
      for (size_t b = 0; b < out.size(); b += bb) {
        put16(b, kernels::f32_to_f16(byte(gen) & 1 ? scale(gen) : -scale(gen)));
        for (size_t j = 2; j < bb; ++j) out[b + j] = uint8_t(byte(gen));
      }
      break;
    }
  }
  return out;
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
  kernels::encode_matmul(batch, ctx, w, xbuf, y, c.n_tokens, bbuf ? &*bbuf : nullptr, c.impl);
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

TEST(OpsMatmul, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto gen = rng(5);
  const auto bytes = random_weight(Q8_0, 64, 8, gen);
  const auto w = kernels::upload_weight(ctx, Q8_0, 64, 8, bytes);
  auto x = ctx.create_buffer(2 * 64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(2 * 8 * 4, WGPUBufferUsage_Storage, "y");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  auto expect_throw = [](auto f, const char* field) {
    try {
      f();
      ADD_FAILURE() << "no throw for " << field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 0); }, "n_tokens");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, small, y, 2); }, "x holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, small, 2); }, "y holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, x, 1); }, "x and y");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 2, &small); }, "bias");
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

}  // namespace
}  // namespace wgllm::test

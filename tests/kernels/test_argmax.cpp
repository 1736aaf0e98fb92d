// Greedy sampling on the GPU (argmax.wgsl, kernels::encode_argmax) against std::max_element: fresh random logits
// of every size around the kernel's chunk edges, planted maxima, ties, non-finite values (NaN, +-inf) anywhere, a
// poisoned output word whose neighbours must survive.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/argmax.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

// Runs the kernel on `values` and returns out[out_index]; the words around it are poisoned and must stay so.
uint32_t gpu_argmax(const std::vector<float>& values, uint32_t out_index = 0) {
  auto& ctx = context();
  const uint32_t n = uint32_t(values.size());
  auto v = ctx.upload<float>(values, WGPUBufferUsage_Storage, "values");
  auto scratch = ctx.create_buffer(kernels::argmax_scratch_bytes(n), WGPUBufferUsage_Storage, "scratch");
  std::vector<uint32_t> init(out_index + 2, kPoison);
  auto out = ctx.upload<uint32_t>(init, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx);
  kernels::encode_argmax(batch, ctx, v, n, scratch, out, out_index);
  batch.submit_and_wait();
  const auto got = ctx.read<uint32_t>(out);
  for (uint32_t i = 0; i < got.size(); ++i) {
    if (i != out_index) {
      EXPECT_EQ(got[i], kPoison) << "word " << i << " was overwritten";
    }
  }
  return got[out_index];
}

uint32_t cpu_argmax(const std::vector<float>& v) { return uint32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

TEST(Argmax, MatchesMaxElementAtEverySize) {
  for (uint32_t n : {1u, 2u, 255u, 256u, 257u, 511u, 512u, 513u, 1000u, 1024u * 7 + 3, 32000u, 128256u, 151936u}) {
    auto gen = rng(n);
    const auto values = random_floats(n, gen, -30.f, 30.f);
    EXPECT_EQ(gpu_argmax(values), cpu_argmax(values)) << "n " << n;
  }
}

TEST(Argmax, PlantedMaximumAnywhere) {
  const uint32_t n = 5000;
  auto gen = rng(1);
  std::uniform_int_distribution<uint32_t> pick(0, n - 1);
  for (uint32_t at : {0u, 1u, 511u, 512u, n - 1, pick(gen), pick(gen), pick(gen)}) {
    auto values = random_floats(n, gen, -1.f, 1.f);
    values[at] = 1.5f;
    EXPECT_EQ(gpu_argmax(values), at) << "max planted at " << at;
  }
}

TEST(Argmax, TiesGoToTheLowestIndex) {
  auto gen = rng(2);
  const uint32_t n = 40000;
  std::uniform_int_distribution<uint32_t> pick(0, n - 1);
  for (int trial = 0; trial < 6; ++trial) {
    auto values = random_floats(n, gen, -1.f, 1.f);
    uint32_t a = pick(gen), b = pick(gen), c = pick(gen);
    for (uint32_t i : {a, b, c}) values[i] = 2.f;
    EXPECT_EQ(gpu_argmax(values), std::min({a, b, c})) << "tie at " << a << ", " << b << ", " << c;
  }
  EXPECT_EQ(gpu_argmax(std::vector<float>(3000, 0.25f)), 0u) << "all equal";
  std::vector<float> lowest(1500, -std::numeric_limits<float>::max());
  lowest[1234] = -1e30f;
  EXPECT_EQ(gpu_argmax(lowest), 1234u);
}

// One NaN or infinity anywhere (in any chunk, at its edges) gives kArgmaxNonFinite, not an index.
TEST(Argmax, AnyNonFiniteValueGivesNoIndex) {
  auto gen = rng(3);
  const uint32_t n = 3000;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {nan, -nan, inf, -inf})
    for (uint32_t at : {0u, 7u, 511u, 512u, 600u, n - 1}) {
      auto values = random_floats(n, gen, -1.f, 1.f);
      values[at] = bad;
      EXPECT_EQ(gpu_argmax(values), kernels::kArgmaxNonFinite) << bad << " at " << at;
    }
  EXPECT_EQ(gpu_argmax(std::vector<float>(700, nan)), kernels::kArgmaxNonFinite) << "all NaN";
  EXPECT_EQ(gpu_argmax(std::vector<float>(1, -inf)), kernels::kArgmaxNonFinite) << "one -inf";
  auto values = random_floats(n, gen, -1.f, 1.f);  // and the same buffers still answer finite values
  EXPECT_EQ(gpu_argmax(values), cpu_argmax(values));
}

TEST(Argmax, WritesTheChosenWordOnly) {
  auto gen = rng(4);
  const auto values = random_floats(777, gen);
  EXPECT_EQ(gpu_argmax(values, 5), cpu_argmax(values));
}

// Several rows at once (a batched decode step's logits): each row's own answer at out[out_index + r], a planted
// maximum, a tie and a NaN in rows of their own, the words around the answers untouched.
TEST(Argmax, RowsAtOnce) {
  auto& ctx = context();
  for (uint32_t n : {1u, 513u, 32000u}) {
    const uint32_t rows = 5, out_index = 2;
    auto gen = rng(n + 7);
    auto values = random_floats(size_t(n) * rows, gen, -30.f, 30.f);
    if (n > 1) {
      values[size_t(1) * n + n - 1] = 99.f;  // row 1: its last value
      values[size_t(2) * n + 0] = 98.f;      // row 2: a tie with a later one, the lower index wins
      values[size_t(2) * n + n / 2] = 98.f;
    }
    values[size_t(3) * n + n / 3] = std::numeric_limits<float>::quiet_NaN();  // row 3: no index
    auto v = ctx.upload<float>(values, WGPUBufferUsage_Storage, "values");
    auto scratch = ctx.create_buffer(kernels::argmax_scratch_bytes(n, rows), WGPUBufferUsage_Storage, "scratch");
    std::vector<uint32_t> init(out_index + rows + 2, kPoison);
    auto out = ctx.upload<uint32_t>(init, WGPUBufferUsage_Storage, "out");
    gpu::ComputeBatch batch(ctx);
    kernels::encode_argmax(batch, ctx, v, n, scratch, out, out_index, rows);
    batch.submit_and_wait();
    const auto got = ctx.read<uint32_t>(out);
    for (uint32_t i = 0; i < got.size(); ++i) {
      if (i < out_index || i >= out_index + rows) {
        EXPECT_EQ(got[i], kPoison) << "n " << n << ": word " << i << " was overwritten";
        continue;
      }
      const uint32_t r = i - out_index;
      const std::vector<float> row(values.begin() + size_t(r) * n, values.begin() + size_t(r + 1) * n);
      const uint32_t want = r == 3 ? kernels::kArgmaxNonFinite : cpu_argmax(row);
      EXPECT_EQ(got[i], want) << "n " << n << " row " << r;
    }
  }
}

TEST(Argmax, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto values = ctx.create_buffer(4000, WGPUBufferUsage_Storage, "values");
  auto scratch = ctx.create_buffer(kernels::argmax_scratch_bytes(1000), WGPUBufferUsage_Storage, "scratch");
  auto out = ctx.create_buffer(8, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx);
  auto expect_throw = [&](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << "expected InvalidArgument mentioning '" << what << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 0, scratch, out); }, "n must be > 0");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 10, scratch, out, 0, 0); }, "rows");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 500, scratch, out, 0, 3); }, "values");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 100, scratch, out, 1, 2); }, "out");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 1001, scratch, out); }, "values");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 1000, out, out); }, "scratch");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 1000, scratch, out, 2); }, "out");
  expect_throw([&] { kernels::encode_argmax(batch, ctx, values, 1000, scratch, scratch); }, "different buffers");
}

}  // namespace
}  // namespace wgllm::test

// The GPU timestamp profiler: one row per (kernel, grid) with exact call counts, times ordered inside their
// batches' spans, and dispatch results unchanged with it attached.
#include <map>
#include <utility>

#include "add_kernel.h"
#include "gpu/profiler.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

struct Detach {  // the process-wide context outlives this test: never leave the profiler attached
  gpu::Context& ctx;
  ~Detach() { ctx.set_profiler(nullptr); }
};

// n floats a and b on the GPU, out poisoned; add() encodes out = a + b.
struct AddCase {
  size_t n;
  std::vector<float> a, b;
  gpu::Buffer ba, bb, out;
  AddCase(gpu::Context& ctx, size_t n_, std::mt19937_64& gen)
      : n(n_), a(random_floats(n_, gen)), b(random_floats(n_, gen)) {
    ba = ctx.upload<float>(a, WGPUBufferUsage_Storage, "a");
    bb = ctx.upload<float>(b, WGPUBufferUsage_Storage, "b");
    out = ctx.create_buffer(n * 4, WGPUBufferUsage_Storage, "out");
    const std::vector<uint32_t> poison(n, kPoison);
    ctx.write_buffer(out, 0, poison.data(), n * 4);
  }
  void add(gpu::ComputeBatch& batch, gpu::Context& ctx) const { encode_add(batch, ctx, ba, bb, out, n); }
  void expect_sum(gpu::Context& ctx) const {
    const std::vector<float> got = ctx.read<float>(out);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << "n = " << n << ", at " << i;
  }
};

TEST(Profiler, CountsEachKernelAndGridAndKeepsResults) {
  auto& ctx = context();
  if (!ctx.features().timestamp_query) GTEST_SKIP() << "adapter '" << ctx.adapter().name << "' has no timestamp-query";
  auto gen = rng(11);
  // encode_add runs 256 elements per workgroup: 1, 5 and 17 workgroups.
  const AddCase small(ctx, 200, gen), mid(ctx, 5 * 256, gen), large(ctx, 17 * 256 - 3, gen);
  const std::string add = "elementwise.wgsl:add";

  gpu::Profiler profiler(ctx);
  Detach detach{ctx};
  gpu::ComputeBatch unprofiled(ctx, "before attach");  // made before: stays one pass, never reported
  ctx.set_profiler(&profiler);
  small.add(unprofiled, ctx);
  unprofiled.submit();
  {
    gpu::ComputeBatch batch(ctx, "profiled 1");
    small.add(batch, ctx);
    mid.add(batch, ctx);
    mid.add(batch, ctx);
    large.add(batch, ctx);
    batch.submit();  // not waited for: collect() must wait itself
  }
  {
    gpu::ComputeBatch batch(ctx, "profiled 2");
    mid.add(batch, ctx);
    batch.submit();
  }
  {
    gpu::ComputeBatch dropped(ctx, "never submitted");  // its queries return to the pool unread
    large.add(dropped, ctx);
  }
  profiler.collect();
  profiler.collect();  // nothing pending: no second window
  const gpu::ProfileReport r = profiler.report();

  std::map<std::pair<std::string, uint64_t>, uint64_t> calls;
  for (const gpu::KernelTime& k : r.kernels) {
    calls[{k.name, k.workgroups}] = k.calls;
    EXPECT_GE(k.ns, 0) << k.name << " x" << k.workgroups;
  }
  const std::map<std::pair<std::string, uint64_t>, uint64_t> want = {{{add, 1}, 1}, {{add, 5}, 3}, {{add, 17}, 1}};
  EXPECT_EQ(calls, want);
  EXPECT_EQ(r.dispatches, 5u);
  EXPECT_EQ(r.batches, 2u);
  EXPECT_EQ(r.windows, 1u);
  for (size_t i = 1; i < r.kernels.size(); ++i) EXPECT_GE(r.kernels[i - 1].ns, r.kernels[i].ns) << "most time first";
  double sum = 0;
  for (const gpu::KernelTime& k : r.kernels) sum += k.ns;
  EXPECT_DOUBLE_EQ(sum, r.kernel_ns);
  // Passes of one batch run in order: their times fit in the batch's span, and the batches in the window's.
  EXPECT_LE(r.kernel_ns, r.batch_span_ns);
  EXPECT_LE(r.batch_span_ns, r.window_span_ns);
  // The last end-of-pass tick follows the first beginning-of-pass tick (zero would mean nothing was resolved).
  EXPECT_GT(r.window_span_ns, 0);

  small.expect_sum(ctx);
  mid.expect_sum(ctx);
  large.expect_sum(ctx);

  profiler.reset();
  EXPECT_TRUE(profiler.report().kernels.empty());
  EXPECT_EQ(profiler.report().batches, 0u);
}

// Two variants of one kernel (the same shader and entry point, other preludes) over one grid are two rows when their
// keys' details differ, each with its detail and its own calls; the pipeline without a detail has none.
TEST(Profiler, VariantsOfAKernelAreRowsOfTheirDetail) {
  auto& ctx = context();
  if (!ctx.features().timestamp_query) GTEST_SKIP() << "adapter '" << ctx.adapter().name << "' has no timestamp-query";
  auto gen = rng(13);
  const AddCase c(ctx, 4 * 64, gen);
  gpu::Profiler profiler(ctx);
  Detach detach{ctx};
  ctx.set_profiler(&profiler);
  {
    gpu::ComputeBatch batch(ctx, "variants");
    const ElementwiseParams params{uint32_t(c.n), 4};
    const uint64_t bytes = c.n * 4;
    const gpu::BufferBinding bindings[] = {
        batch.uniform(0, params), {1, &c.ba, 0, bytes}, {2, &c.bb, 0, bytes}, {3, &c.out, 0, bytes}};
    // 64 invocations a workgroup either way; the preludes differ by a comment, the details say which
    const gpu::PipelineKey one{"elementwise.wgsl", "add", {{"WG", 64}}, "// one\n", "variant one"};
    const gpu::PipelineKey two{"elementwise.wgsl", "add", {{"WG", 64}}, "// two\n", "variant two"};
    const gpu::PipelineKey plain{"elementwise.wgsl", "add", {{"WG", 64}}, "// plain\n"};
    for (const auto* key : {&one, &two, &two, &plain}) batch.dispatch(ctx.pipeline(*key), bindings, 4);
    batch.submit_and_wait();
  }
  profiler.collect();
  std::map<std::string, uint64_t> calls;
  for (const gpu::KernelTime& k : profiler.report().kernels) {
    EXPECT_EQ(k.name, "elementwise.wgsl:add");
    EXPECT_EQ(k.workgroups, 4u);
    calls[k.detail] += k.calls;
  }
  const std::map<std::string, uint64_t> want = {{"variant one", 1}, {"variant two", 2}, {"", 1}};
  EXPECT_EQ(calls, want);
  c.expect_sum(ctx);
}

TEST(Profiler, BatchLongerThanOneQuerySet) {
  // More dispatches than one query set holds: the batch takes a second one, and every dispatch is counted.
  auto& ctx = context();
  if (!ctx.features().timestamp_query) GTEST_SKIP() << "adapter '" << ctx.adapter().name << "' has no timestamp-query";
  auto gen = rng(12);
  const AddCase c(ctx, 3 * 256, gen);
  gpu::Profiler profiler(ctx);
  Detach detach{ctx};
  ctx.set_profiler(&profiler);
  constexpr uint64_t kDispatches = 700;      // > 512 (1024 queries per set, two per dispatch)
  for (int round = 0; round < 2; ++round) {  // the second round reuses the pool's query sets
    gpu::ComputeBatch batch(ctx, "long");
    for (uint64_t i = 0; i < kDispatches; ++i) c.add(batch, ctx);
    batch.submit_and_wait();
    profiler.collect();
  }
  ctx.set_profiler(nullptr);
  const gpu::ProfileReport r = profiler.report();
  ASSERT_EQ(r.kernels.size(), 1u);
  EXPECT_EQ(r.kernels[0].name, "elementwise.wgsl:add");
  EXPECT_EQ(r.kernels[0].workgroups, 3u);
  EXPECT_EQ(r.kernels[0].calls, 2 * kDispatches);
  EXPECT_EQ(r.batches, 2u);
  EXPECT_EQ(r.windows, 2u);
  EXPECT_GE(r.kernel_ns, 0);
  EXPECT_LE(r.kernel_ns, r.batch_span_ns);
  EXPECT_GT(r.window_span_ns, 0);
  c.expect_sum(ctx);
}

}  // namespace
}  // namespace wgllm::test

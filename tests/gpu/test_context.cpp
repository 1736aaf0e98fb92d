// The GPU runtime: kernel round trip, odd buffer sizes, large readbacks, shader errors.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "add_kernel.h"
#include "cpu/ops.h"
#include "kernels/rope.h"
#include "test_shaders.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

TEST(GpuContext, HasDeviceAndLimits) {
  auto& ctx = context();
  EXPECT_FALSE(ctx.adapter().name.empty());
  EXPECT_GE(ctx.limits().maxStorageBufferBindingSize, 128ull << 20);
  EXPECT_GE(ctx.limits().maxComputeInvocationsPerWorkgroup, 256u);
}

TEST(GpuContext, AddRoundTripMillionElements) {
  auto& ctx = context();
  auto gen = rng(1);
  const size_t n = 1'000'003;  // not a multiple of the workgroup
  auto a = random_floats(n, gen), b = random_floats(n, gen);
  auto ba = ctx.upload<float>(a, WGPUBufferUsage_Storage, "a");
  auto bb = ctx.upload<float>(b, WGPUBufferUsage_Storage, "b");
  auto out = ctx.create_buffer(n * 4, WGPUBufferUsage_Storage, "out");
  std::vector<uint32_t> poison(n, kPoison);
  ctx.write_buffer(out, 0, poison.data(), n * 4);
  gpu::ComputeBatch batch(ctx, "add");
  encode_add(batch, ctx, ba, bb, out, n);
  batch.submit_and_wait();
  auto got = ctx.read<float>(out);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << "at " << i;
}

TEST(GpuContext, FoldedGridCoversEveryElement) {
  // More workgroups than one grid dimension allows forces the (x, y) fold.
  auto& ctx = context();
  const uint64_t max_dim = ctx.limits().maxComputeWorkgroupsPerDimension;
  const size_t n = (max_dim + 17) * 256 + 5;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = float(i % 1000), b[i] = float(i % 7);
  auto ba = ctx.upload<float>(a, WGPUBufferUsage_Storage, "a");
  auto bb = ctx.upload<float>(b, WGPUBufferUsage_Storage, "b");
  auto out = ctx.create_buffer(n * 4, WGPUBufferUsage_Storage, "out");
  std::vector<uint32_t> poison(n, kPoison);
  ctx.write_buffer(out, 0, poison.data(), n * 4);
  gpu::ComputeBatch batch(ctx, "add");
  encode_add(batch, ctx, ba, bb, out, n);
  batch.submit_and_wait();
  auto got = ctx.read<float>(out);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << "at " << i;
}

TEST(GpuContext, FoldGridShapes) {
  for (uint64_t n : {1ull, 65535ull, 65536ull, 200000ull, 65535ull * 65535ull}) {
    auto g = gpu::fold_grid(n, 65535);
    EXPECT_LE(g.x, 65535u);
    EXPECT_LE(g.y, 65535u);
    EXPECT_GE(uint64_t(g.x) * g.y, n);
    EXPECT_LT(uint64_t(g.x) * (g.y - 1), n) << "a whole row of wasted workgroups";
  }
  EXPECT_THROW(gpu::fold_grid(65535ull * 65535ull + 1, 65535), InvalidArgument);
}

TEST(GpuContext, UnalignedSizesAndOffsets) {
  auto& ctx = context();
  auto gen = rng(2);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint64_t size : {1ull, 3ull, 5ull, 255ull, 257ull, 1023ull, 4097ull}) {
    auto buf = ctx.create_buffer(size, WGPUBufferUsage_Storage, "odd");
    std::vector<uint8_t> data(size);
    for (auto& x : data) x = uint8_t(byte(gen));
    ctx.write_buffer(buf, 0, data.data(), size);
    std::vector<uint8_t> got(size, 0);
    ctx.read_buffer(buf, 0, got.data(), size);
    EXPECT_EQ(got, data) << "size " << size;
    if (size >= 3) {
      // Overwrite an unaligned middle piece; bytes around it must survive.
      const uint64_t off = 1, len = size - 2;
      std::vector<uint8_t> patch(len);
      for (auto& x : patch) x = uint8_t(byte(gen));
      ctx.write_buffer(buf, off, patch.data(), len);
      std::copy(patch.begin(), patch.end(), data.begin() + off);
      std::vector<uint8_t> back(size - 1);
      ctx.read_buffer(buf, 1, back.data(), size - 1);
      EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + 1)) << "size " << size;
    }
  }
}

TEST(GpuContext, ReadbackLargerThan128MiBInPieces) {
  auto& ctx = context();
  const uint64_t size = (160ull << 20) + 12;  // > 128 MiB and > the 64 MiB staging piece
  if (size > ctx.limits().maxBufferSize) GTEST_SKIP() << "adapter's maxBufferSize is below 160 MiB";
  const uint64_t n = size / 4;
  std::vector<uint32_t> data(n);
  const uint32_t salt = uint32_t(seed());
  for (uint64_t i = 0; i < n; ++i) data[i] = uint32_t(i * 2654435761u) ^ salt;
  auto buf = ctx.create_buffer(size, WGPUBufferUsage_Storage, "big");
  ctx.write_buffer(buf, 0, data.data(), size);
  auto got = ctx.read<uint32_t>(buf);
  ASSERT_EQ(got.size(), n);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], data[i]) << "at word " << i;
}

// Bytes of this process's shared memory: a CPU adapter's (lavapipe's) device memory.
uint64_t shared_memory_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("RssShmem:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  return 0;
}

// Uploads (many writes, no work submitted in between, as a model's weights load) are held once in device memory: the
// staging copies of queued writes are flushed every Context::kWriteChunk bytes, not kept until the first submission
// (and then pooled by wgpu's allocator: lavapipe held the weights twice, 480 MiB here for 240). Measured where device
// memory is this process's shared memory (a CPU adapter), after work was submitted: a buffer's pages are only
// allocated once written.
TEST(GpuContext, UploadsAreHeldOnceInDeviceMemory) {
  gpu::Context ctx(context_options());
  if (!ctx.adapter().is_cpu()) GTEST_SKIP() << "device memory is not this process's memory on a GPU";
  const uint64_t piece = 3ull << 20, total = 240ull << 20;  // 80 writes of 3 MiB: each below a chunk
  std::vector<uint8_t> bytes(piece, 0x5A);
  const uint64_t before = shared_memory_bytes();
  std::vector<gpu::Buffer> bufs;
  for (uint64_t done = 0; done < total; done += piece) {
    bufs.push_back(ctx.create_buffer(piece, WGPUBufferUsage_Storage, "weight"));
    ctx.write_buffer(bufs.back(), 0, bytes.data(), piece);
  }
  gpu::ComputeBatch(ctx, "after the uploads").submit_and_wait();  // the first work: every write has landed
  const uint64_t grown = shared_memory_bytes() - before;
  EXPECT_GE(grown, total) << "the buffers themselves";
  EXPECT_LE(grown, total + total / 4 + 2 * gpu::Context::kWriteChunk) << "staging copies kept";
  EXPECT_EQ(ctx.read<uint8_t>(bufs.back(), piece - 16, 16), std::vector<uint8_t>(16, 0x5A));
}

// A mappable buffer filled by a copy in submitted (not awaited) work: read_mapped waits for it and
// returns any byte range, unaligned ones included.
TEST(GpuContext, ReadMappedAfterCopyInTheSameSubmission) {
  auto& ctx = context();
  auto gen = rng(31);
  std::vector<uint8_t> data(4096 + 12);
  for (auto& b : data) b = uint8_t(gen());
  auto src = ctx.create_buffer(data.size(), WGPUBufferUsage_Storage, "src");
  ctx.write_buffer(src, 0, data.data(), data.size());
  auto host = ctx.create_buffer(data.size(), WGPUBufferUsage_MapRead, "host");
  for (auto [offset, size] : {std::pair<uint64_t, uint64_t>{0, data.size()}, {3, 1001}, {4097, 11}, {1, 1}}) {
    gpu::ComputeBatch batch(ctx, "copy");
    batch.copy(src, 0, host, 0, data.size());
    batch.submit();
    std::vector<uint8_t> got(size, 0xAA);
    ctx.read_mapped(host, offset, got.data(), size);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + offset)) << "offset " << offset << " size " << size;
  }
  uint8_t one;
  EXPECT_THROW(ctx.read_mapped(host, data.size(), &one, 1), InvalidArgument);
}

TEST(GpuContext, InvalidShaderNamesFileAndLine) {
  auto& ctx = context();
  try {
    ctx.pipeline({"invalid_for_tests.wgsl", "main", {}, ""});
    FAIL() << "an invalid shader compiled";
  } catch (const ShaderError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("invalid_for_tests.wgsl:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(":6:"), std::string::npos) << "expected line 6 in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message should be one line";
  }
}

TEST(GpuContext, PreludeKeepsLineNumbers) {
  auto& ctx = context();
  try {
    ctx.pipeline({"invalid_for_tests.wgsl", "main", {}, "// prelude line 1\n// prelude line 2\n"});
    FAIL() << "an invalid shader compiled";
  } catch (const ShaderError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid_for_tests.wgsl:6:"), std::string::npos) << e.what();
  }
}

TEST(GpuContext, PipelineCacheReturnsSamePipeline) {
  auto& ctx = context();
  auto p1 = ctx.pipeline({"elementwise.wgsl", "add", {{"WG", 64}}, ""});
  auto p2 = ctx.pipeline({"elementwise.wgsl", "add", {{"WG", 64}}, ""});
  auto p3 = ctx.pipeline({"elementwise.wgsl", "add", {{"WG", 128}}, ""});
  EXPECT_EQ(p1, p2);
  EXPECT_NE(p1, p3);
}

// A pipeline found by its call site and arguments: make() runs once per (site, arguments), and the pipeline is the one
// its key gives; other arguments or another site make their own; too many arguments throw.
TEST(GpuContext, PipelineByArgumentsMakesEachOnce) {
  gpu::Context ctx(context_options([](auto&) {}));
  const char* const site = "test site";  // one pointer: the site is told apart by its address
  int made = 0;
  auto make = [&](double wg) {
    return [&made, wg] {
      ++made;
      return gpu::PipelineKey{"elementwise.wgsl", "add", {{"WG", wg}}, ""};
    };
  };
  const uint32_t a64[] = {64, 1}, a128[] = {128, 1};
  const auto p64 = ctx.pipeline(site, a64, make(64));
  EXPECT_EQ(ctx.pipeline(site, a64, make(64)), p64);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(p64, ctx.pipeline({"elementwise.wgsl", "add", {{"WG", 64}}, ""}));
  const auto p128 = ctx.pipeline(site, a128, make(128));
  EXPECT_NE(p128, p64);
  EXPECT_EQ(made, 2);
  const uint32_t a64_short[] = {64};  // a prefix of other arguments is other arguments
  EXPECT_EQ(ctx.pipeline(site, a64_short, make(64)), p64);
  EXPECT_EQ(made, 3);
  EXPECT_EQ(ctx.pipeline("other site", a64, make(128)), p128);  // a site's own arguments
  EXPECT_EQ(made, 4);
  const std::vector<uint32_t> many(gpu::PipelineCache::kMaxArgs + 1, 1);
  EXPECT_THROW(ctx.pipeline(site, many, make(64)), InvalidArgument);
}

// A batch given a BindCache reuses the previous batch's bind groups and arena, yet each batch's own
// uniform contents reach the GPU (here RoPE's start position, the bindings being the same).
TEST(GpuContext, BindCacheReusesGroupsWithFreshParameters) {
  auto& ctx = context();
  auto gen = rng(11);
  const uint32_t tokens = 3, heads = 2, dim = 64;
  auto table = kernels::upload_rope_table(ctx, dim, 10000.f);
  auto x = ctx.create_buffer(tokens * heads * dim * 4, WGPUBufferUsage_Storage, "x");
  auto k = ctx.create_buffer(tokens * dim * 4, WGPUBufferUsage_Storage, "k");
  gpu::BindCache cache(ctx);
  uint64_t made_first = 0;
  for (uint32_t start : {0u, 17u, 300u}) {
    const auto xs = random_floats(tokens * heads * dim, gen), ks = random_floats(tokens * dim, gen);
    ctx.write_buffer(x, 0, xs.data(), xs.size() * 4);
    ctx.write_buffer(k, 0, ks.data(), ks.size() * 4);
    gpu::ComputeBatch batch(ctx, "cached rope", &cache);
    kernels::encode_rope(batch, ctx, {.n_tokens = tokens, .n_heads = heads, .head_dim = dim, .start_pos = start}, table,
                         x);
    kernels::encode_rope(batch, ctx, {.n_tokens = tokens, .n_heads = 1, .head_dim = dim, .start_pos = start + 1}, table,
                         k);
    batch.submit();
    ctx.wait_idle();
    if (!made_first) made_first = cache.misses();
    EXPECT_EQ(cache.misses(), made_first) << "start " << start << ": a bind group was made again";
    const auto want_x = cpu::rope(xs, tokens, heads, dim, dim, start, 10000.f, false, {});
    const auto want_k = cpu::rope(ks, tokens, 1, dim, dim, start + 1, 10000.f, false, {});
    EXPECT_LE(compare(ctx.read<float>(x), want_x).rel_l2, 1e-6) << "start " << start;
    EXPECT_LE(compare(ctx.read<float>(k), want_k).rel_l2, 1e-6) << "start " << start;
  }
  EXPECT_EQ(made_first, 2u);
  EXPECT_EQ(cache.size(), 2u);
}

// A cache bounded to max_groups never holds more: past it, it drops its groups and starts again (the results still
// right, the dropped groups made again when needed).
TEST(GpuContext, BindCacheKeepsAtMostItsBound) {
  auto& ctx = context();
  auto gen = rng(12);
  const uint32_t dim = 64;
  auto table = kernels::upload_rope_table(ctx, dim, 10000.f);
  std::vector<gpu::Buffer> xs;
  for (int i = 0; i < 5; ++i) xs.push_back(ctx.create_buffer(dim * 4, WGPUBufferUsage_Storage, "x"));
  gpu::BindCache cache(ctx, 3);
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < xs.size(); ++i) {
      const auto v = random_floats(dim, gen);
      ctx.write_buffer(xs[i], 0, v.data(), v.size() * 4);
      gpu::ComputeBatch batch(ctx, "bounded", &cache);
      kernels::encode_rope(batch, ctx, {.n_tokens = 1, .n_heads = 1, .head_dim = dim, .start_pos = 5}, table, xs[i]);
      batch.submit_and_wait();
      EXPECT_LE(cache.size(), 3u);
      const auto want = cpu::rope(v, 1, 1, dim, dim, 5, 10000.f, false, {});
      EXPECT_LE(compare(ctx.read<float>(xs[i]), want).rel_l2, 1e-6) << "buffer " << i << ", round " << round;
    }
  EXPECT_EQ(cache.misses(), 10u) << "five buffers cycled through a cache of three: every group made again";
}

TEST(GpuContext, BadArgumentsThrowBeforeTheGpu) {
  auto& ctx = context();
  EXPECT_THROW(ctx.create_buffer(0, WGPUBufferUsage_Storage, "zero"), InvalidArgument);
  EXPECT_THROW(ctx.create_buffer(ctx.limits().maxBufferSize + 4, WGPUBufferUsage_Storage, "huge"), GpuError);
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  uint8_t bytes[32] = {};
  EXPECT_THROW(ctx.write_buffer(small, 8, bytes, 16), InvalidArgument);
  EXPECT_THROW(ctx.read_buffer(small, 0, bytes, 17), InvalidArgument);
  gpu::ComputeBatch batch(ctx, "add");
  EXPECT_THROW(encode_add(batch, ctx, small, small, small, 5), InvalidArgument);
}

}  // namespace
}  // namespace wgllm::test

namespace wgllm::test {
namespace {

// A fresh temporary directory, removed with the object.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(seed()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string& file, const std::string& text) const { std::ofstream(path / file) << text; }
};

// ContextOptions::kernel_dir (WGLLM_KERNEL_DIR): a file there replaces the shader of that name, the tests' own
// shaders and the library's alike; other shaders stay embedded.
TEST(GpuContext, KernelDirReplacesEmbeddedShaders) {
  const TempDir dir("wgllm_kernel_dir");
  std::string add;
  for (const gpu::EmbeddedShader& sh : test_shaders())
    if (sh.name == "elementwise.wgsl") add = sh.source;
  const std::string body = "out[i] = a[i] + b[i];";
  ASSERT_NE(add.find(body), std::string::npos);
  add.replace(add.find(body), body.size(), "out[i] = a[i] - b[i];");
  dir.write("elementwise.wgsl", add);
  dir.write("norm.wgsl", "this is not WGSL\n");
  gpu::ContextOptions options = context_options();
  options.kernel_dir = dir.path.string();
  gpu::Context ctx(options);

  const std::vector<float> a = {1, 2, 3, 4, 5}, b = {0.5f, 0.25f, 2, 8, -1};
  auto ba = ctx.upload<float>(a, WGPUBufferUsage_Storage, "a");
  auto bb = ctx.upload<float>(b, WGPUBufferUsage_Storage, "b");
  auto out = ctx.create_buffer(a.size() * 4, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx, "sub");
  encode_add(batch, ctx, ba, bb, out, a.size());
  batch.submit_and_wait();
  const auto got = ctx.read<float>(out);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(got[i], a[i] - b[i]) << "at " << i;

  try {
    ctx.pipeline({"norm.wgsl", "rms_norm", {}, ""});
    FAIL() << "the library's norm.wgsl was not replaced";
  } catch (const ShaderError& e) {
    EXPECT_NE(std::string(e.what()).find("norm.wgsl:1:"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ctx.pipeline({"swiglu.wgsl", "swiglu", {}, ""})) << "a shader not in kernel_dir stays embedded";
}

// ContextOptions::dump_shaders_dir (WGLLM_DUMP_SHADERS): every compiled source lands there, prelude included.
TEST(GpuContext, DumpShadersWritesTheCompiledSource) {
  const TempDir dir("wgllm_dump_shaders");
  gpu::ContextOptions options = context_options();
  options.dump_shaders_dir = dir.path.string();
  gpu::Context ctx(options);
  ctx.pipeline({"elementwise.wgsl", "add", {{"WG", 64}}, "// a prelude\n"});
  std::vector<std::filesystem::path> files(std::filesystem::directory_iterator(dir.path), {});
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("elementwise.wgsl:add{WG=64}.", 0), 0u) << files[0];
  std::ifstream in(files[0]);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "// a prelude");
}

TEST(GpuContext, UnknownShaderNamesItself) {
  try {
    context().pipeline({"no_such_kernel.wgsl", "main", {}, ""});
    FAIL() << "a missing shader compiled";
  } catch (const ShaderError& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_kernel.wgsl"), std::string::npos) << e.what();
  }
}

// Context::subgroup_size: the adapter's where it reports one size, else measured (a power of two, at least 4 and at
// most 128 on any adapter we know); 0 with subgroups off.
TEST(GpuContext, SubgroupSize) {
  gpu::Context& ctx = context();
  const uint32_t s = ctx.subgroup_size();
  if (!ctx.features().subgroups) {
    EXPECT_EQ(s, 0u);
  } else {
    EXPECT_TRUE(s >= 4 && s <= 128 && (s & (s - 1)) == 0) << s;
    const auto& a = ctx.adapter();
    if (a.subgroup_max && a.subgroup_min == a.subgroup_max) {
      EXPECT_EQ(s, a.subgroup_max);
    }
    EXPECT_EQ(ctx.subgroup_size(), s);  // (once measured, kept)
  }
  gpu::Context off(context_options([](auto& o) { o.disable_subgroups = true; }));
  EXPECT_EQ(off.subgroup_size(), 0u);
}

}  // namespace
}  // namespace wgllm::test

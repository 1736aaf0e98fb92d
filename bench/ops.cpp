// `wgllm-bench ops`: throughput of the weight kernels (matmul.wgsl). Matrix-vector (decode,
// n_tokens = 1) is reported as weight GB/s (GGUF bytes of W / time), matrix-matrix (prefill) as
// GFLOP/s. Each sample submits several dispatches in one command buffer and waits; the time per
// dispatch is the median over the samples.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "add_kernel.h"
#include "command.h"
#include "common.h"
#include "gguf/dequant.h"
#include "gguf/half.h"
#include "gguf/types.h"
#include "gpu/batch.h"
#include "kernels/int_dot.h"
#include "kernels/kv_cache.h"
#include "kernels/matmul.h"
#include "wgllm/error.h"

namespace wgllm::bench {
namespace {

struct Options {
  std::string adapter;
  std::string types = "F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,MXFP4";
  std::string shapes = "4096x4096,896x4864";  // n_in x n_out
  uint32_t prefill_tokens = 512;
  uint32_t repeats = 5;
  uint32_t matvec_per_submit = 8;
  uint32_t matmul_per_submit = 1;
  bool skip_matmul = false;
  bool skip_floors = false;
  uint64_t rotate_bytes = 256ull << 20;  // weight copies cycled by the matvec runs (beyond any L2)
  std::string matvec;                    // TxRxG override of the matvec shape
  std::string batch_tokens;              // token counts of batch decode's product runs
  int batch_tile_from = -1;              // ContextOptions::batch_tile_from (-1: unset)
  int batch_split = -1;                  // ContextOptions::batch_split (-1: unset)
  int matvec_pass = -1;                  // ContextOptions::matvec_pass (-1: unset)
  int prompt_tile = -1;                  // ContextOptions::prompt_tile (-1: unset)
  std::string matmul_tiles;              // comma-separated matmul tiles to sweep ("" = the chosen one)
  std::string prompt_digits;             // comma-separated ContextOptions::prompt_digits to sweep ("" = unset)
  std::string rows_shapes;               // comma-separated shapes of the CPU adapters' kernel to sweep
  bool skip_matvec = false;
  bool decode_table = false;  // one Markdown table: types x the decode shapes, weight GB/s and % of the read floor
  bool int_dot = false;       // --decode-table: also Q4_K / Q6_K on packed int8 dot products (kernels/int_dot.h)
  std::string lean;           // --decode-table: lean_q4k.wgsl's shapes WARPSxROWS[xKS][s][p], comma-separated
};

// The one-token products of a Llama-3.1-8B decode step, n_in x n_out: attention q / o (4096 x 4096), FFN gate or up
// (4096 x 14336), FFN down (14336 x 4096) and the output (4096 x 128256).
constexpr const char* kDecodeShapes = "4096x4096,4096x14336,14336x4096,4096x128256";

// Median seconds per dispatch of encode_matmul, cycling through the copies of the weight (several
// copies whose total exceeds the GPU's last-level cache make every dispatch read its weight from
// memory, as a model's decode step does).
double time_matmul(gpu::Context& ctx, std::span<const kernels::GpuWeight> copies, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, uint32_t per_submit, uint32_t repeats,
                   kernels::MatmulImpl impl = kernels::MatmulImpl::Auto) {
  return median_time(
      ctx,
      [&](gpu::ComputeBatch& b, uint32_t i) {
        kernels::encode_matmul(b, ctx, copies[i % copies.size()], x, y, n_tokens, {.impl = impl});
      },
      per_submit, repeats);
}

// The fixed cost of one dispatch, three ways: a chain of `n` dependent 1024-element adds (each reads the previous
// output), `n` independent ones (each into a buffer of its own: nothing orders them, so a GPU may run them side by
// side) and `n` that all write one buffer (the same values: what a placeholder bound writable to every dispatch is).
// Reports the CPU time to encode one and the wall time per dispatch from the first encode to the end of the GPU's work.
void print_dispatch_overhead(gpu::Context& ctx, uint32_t n) {
  using clock = std::chrono::steady_clock;
  const uint32_t elems = 1024;
  std::vector<float> ones(elems, 1.f);
  auto y = ctx.upload<float>(ones, WGPUBufferUsage_Storage, "y");
  auto a = ctx.upload<float>(ones, WGPUBufferUsage_Storage, "a");
  auto b = ctx.create_buffer(elems * 4, WGPUBufferUsage_Storage, "b");
  std::vector<gpu::Buffer> outs;
  for (uint32_t i = 0; i < n; ++i) outs.push_back(ctx.create_buffer(elems * 4, WGPUBufferUsage_Storage, "out"));
  // (encode seconds, end-to-end seconds) per dispatch of add i = (in1, in2, out)(i), the last of three runs (the
  // first compiles the pipeline)
  auto time = [&](auto add) {
    double encode_s = 0, total_s = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = clock::now();
      gpu::ComputeBatch batch(ctx, "dispatch overhead");
      for (uint32_t i = 0; i < n; ++i) add(batch, i);
      const auto t1 = clock::now();
      batch.submit_and_wait();
      encode_s = std::chrono::duration<double>(t1 - t0).count() / n;
      total_s = std::chrono::duration<double>(clock::now() - t0).count() / n;
    }
    return std::pair{encode_s, total_s};
  };
  const auto dep = time([&](gpu::ComputeBatch& batch, uint32_t i) {
    test::encode_add(batch, ctx, i % 2 ? b : a, y, i % 2 ? a : b, elems);
  });
  const auto ind =
      time([&](gpu::ComputeBatch& batch, uint32_t i) { test::encode_add(batch, ctx, a, y, outs[i], elems); });
  const auto one = time([&](gpu::ComputeBatch& batch, uint32_t) { test::encode_add(batch, ctx, a, y, b, elems); });
  std::printf("dispatch overhead (%u dependent tiny dispatches): encode %.2f us each (CPU), %.2f us each end to end\n",
              n, dep.first * 1e6, dep.second * 1e6);
  std::printf("dispatch overhead (%u independent tiny dispatches): %.2f us each end to end\n", n, ind.second * 1e6);
  std::printf("dispatch overhead (%u tiny dispatches into one buffer): %.2f us each end to end\n", n, one.second * 1e6);
}

// The floors, over `bytes` of random data, median of 5 runs of 4 each: a buffer-to-buffer copy
// (bytes read + written), a plain WGSL kernel streaming the buffer, the same reads in the matvec's
// pattern (4 KiB rows, 4 rows per 32 threads), those with the matvec's f16 arithmetic, a minimal
// F16 matvec (stream.wgsl), and the matvec kernel itself reading the same buffer as a weight.
// Returns the streaming read's GB/s.
double print_memory_floor(gpu::Context& ctx, uint64_t bytes) {
  const uint32_t units = 256;  // 4 KiB rows, as a 2048-wide F16 weight
  const uint64_t row_bytes = units * 16, max_rows = (ctx.max_binding_size() - 16) / row_bytes & ~uint64_t(1);
  bytes = std::min(bytes / row_bytes, max_rows) * row_bytes;  // even rows: upload_weight's pieces
  // Random contents (zero pages may read faster than real data: memory compression), uploaded as
  // an F16 weight of 2048-wide rows so the matvec kernel can read the very same buffer.
  std::vector<uint8_t> noise(bytes);
  std::mt19937 gen(7);
  for (size_t i = 0; i < bytes; i += 4) {
    const uint32_t v = gen();
    std::memcpy(&noise[i], &v, 4);
  }
  const kernels::GpuWeight weight =
      kernels::upload_weight(ctx, GgufType::F16, units * 8, bytes / (units * 16), noise, "floor src");
  if (weight.pieces.size() != 1) throw InvalidArgument("memory floor: the buffer did not fit one binding");
  const gpu::Buffer& src = weight.pieces[0].buffer;
  auto dst = ctx.create_buffer(bytes, WGPUBufferUsage_Storage, "floor dst");
  auto sink = ctx.create_buffer(16, WGPUBufferUsage_Storage, "floor sink");
  auto median = [&](auto encode) {
    return median_time(
        ctx, [&](gpu::ComputeBatch& b, uint32_t) { encode(b); }, 4, 5);
  };
  const double copy_s = median([&](gpu::ComputeBatch& b) { b.copy(src, 0, dst, 0, bytes); });
  WGPUComputePipeline pipe = ctx.pipeline({"stream.wgsl", "stream_read", {}, ""});
  const uint32_t n_vec4 = uint32_t(bytes / 16);
  const auto grid = gpu::fold_grid((n_vec4 + 1023) / 1024, ctx.limits().maxComputeWorkgroupsPerDimension);
  struct {
    uint32_t n, gx, a, b;
  } params{n_vec4, grid.x, 0, 0};
  const double read_s = median([&](gpu::ComputeBatch& b) {
    const gpu::BufferBinding bind[] = {b.uniform(0, params), {1, &src}, {2, &sink}};
    b.dispatch(pipe, bind, grid.x, grid.y);
  });
  WGPUComputePipeline rows_pipe = ctx.pipeline({"stream.wgsl", "stream_rows", {}, ""});
  const auto rows_grid = gpu::fold_grid((n_vec4 / units + 15) / 16, ctx.limits().maxComputeWorkgroupsPerDimension);
  struct {
    uint32_t n, gx, units, b;
  } rows_params{n_vec4, rows_grid.x, units, 0};
  const double rows_s = median([&](gpu::ComputeBatch& b) {
    const gpu::BufferBinding bind[] = {b.uniform(0, rows_params), {1, &src}, {2, &sink}};
    b.dispatch(rows_pipe, bind, rows_grid.x, rows_grid.y);
  });
  WGPUComputePipeline math_pipe = ctx.pipeline({"stream.wgsl", "stream_rows_math", {}, ""});
  const double math_s = median([&](gpu::ComputeBatch& b) {
    const gpu::BufferBinding bind[] = {b.uniform(0, rows_params), {1, &src}, {2, &sink}};
    b.dispatch(math_pipe, bind, rows_grid.x, rows_grid.y);
  });
  std::vector<float> xs(2 * units * 4, 0.5f);
  auto xbuf = ctx.upload<float>(xs, WGPUBufferUsage_Storage, "floor x");
  auto ybuf = ctx.create_buffer(uint64_t(n_vec4 / units) * 4 + 16, WGPUBufferUsage_Storage, "floor y");
  WGPUComputePipeline mv_pipe = ctx.pipeline({"stream.wgsl", "stream_matvec", {}, ""});
  const double mv_s = median([&](gpu::ComputeBatch& b) {
    const gpu::BufferBinding bind[] = {b.uniform(0, rows_params), {1, &src}, {3, &xbuf}, {4, &ybuf}};
    b.dispatch(mv_pipe, bind, rows_grid.x, rows_grid.y);
  });
  auto ymv = ctx.create_buffer(uint64_t(weight.n_out) * 4, WGPUBufferUsage_Storage, "floor matvec y");
  const double kernel_s = median([&](gpu::ComputeBatch& b) { kernels::encode_matmul(b, ctx, weight, xbuf, ymv, 1); });
  std::printf(
      "memory floor over %.0f MB: copy %.1f GB/s (read + write), WGSL streaming read %.1f GB/s, "
      "read in the matvec's row pattern %.1f GB/s, the same with f16 multiply-adds %.1f GB/s, a minimal F16 "
      "matvec %.1f GB/s, the matvec kernel over the same buffer %.1f GB/s\n",
      bytes / 1e6, 2.0 * bytes / copy_s / 1e9, bytes / read_s / 1e9, bytes / rows_s / 1e9, bytes / math_s / 1e9,
      bytes / mv_s / 1e9, bytes / kernel_s / 1e9);
  return bytes / read_s / 1e9;
}

// Copies of a weight totalling at least `rotate_bytes` (one at least): the matvec runs cycle through them, so that each
// dispatch reads its weight from memory, as a model's decode step does, not from the last-level cache.
std::vector<kernels::GpuWeight> weight_copies(gpu::Context& ctx, GgufType t, uint32_t n_in, uint32_t n_out,
                                              std::span<const uint8_t> bytes, uint64_t rotate_bytes) {
  std::vector<kernels::GpuWeight> copies;
  for (uint64_t total = 0; copies.empty() || total < rotate_bytes; total += bytes.size())
    copies.push_back(kernels::upload_weight(ctx, t, n_in, n_out, bytes, "bench weight"));
  return copies;
}

// --decode-table --int-dot: the one-token products of --types' Q4_K and Q6_K on packed int8 dot products
// (kernels/int_dot.h; the matvec with MatmulOptions::digits), x's digits and the product together and the product
// alone, in weight GB/s as the table's rows. "-" where n_in is not a multiple of 256.
void print_int_dot_rows(gpu::Context& ctx, const Options& o, const std::vector<std::string>& shapes, double floor_gbs) {
  for (const auto& tname : split(o.types, ',')) {
    const GgufType t = parse_type(tname);
    if (!kernels::matvec_takes_digits(t)) continue;
    for (const bool with_digits : {true, false}) {
      std::printf("| %s int8 dot%s |", type_name(t), with_digits ? ", x digits + product" : ", product alone");
      for (const auto& shape : shapes) {
        const auto dims = split(shape, 'x');
        const uint32_t n_in = uint32_t(std::stoul(dims[0])), n_out = uint32_t(std::stoul(dims[1]));
        if (n_in % 256 != 0) {
          std::printf(" - |");
          continue;
        }
        const auto bytes = random_weight(t, n_in, n_out, n_in * 31 + n_out);
        const auto copies = weight_copies(ctx, t, n_in, n_out, bytes, o.rotate_bytes);
        std::vector<float> xs(n_in);
        for (uint32_t i = 0; i < n_in; ++i) xs[i] = float((i * 37) % 101) / 50.f - 1.f;
        auto x = ctx.upload<float>(xs, WGPUBufferUsage_Storage, "x");
        auto y = ctx.create_buffer(uint64_t(n_out) * 4, WGPUBufferUsage_Storage, "y");
        const auto xd = kernels::make_x_digits(ctx, n_in, 1);
        {
          gpu::ComputeBatch b(ctx, "x digits");
          kernels::encode_x_digits(b, ctx, x, xd);
          b.submit_and_wait();
        }
        const double time = median_time(
            ctx,
            [&](gpu::ComputeBatch& b, uint32_t i) {
              if (with_digits) kernels::encode_x_digits(b, ctx, x, xd);
              kernels::encode_matmul(b, ctx, copies[i % copies.size()], x, y, 1, {.digits = &xd});
            },
            std::max<uint32_t>(o.matvec_per_submit, copies.size()), o.repeats);
        const double gbs = double(bytes.size()) / time / 1e9;
        std::printf(" %.0f (%.0f%%) |", gbs, 100 * gbs / floor_gbs);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
}

// --decode-table --lean-q4k: the experiment lean_q4k.wgsl beside the matvec, shape by shape (WARPSxROWS[xKS][s][p]:
// KS warps sharing a row, "s" x in workgroup memory, "p" the next step's words loaded first), x prepared once (its
// preparation not timed); its largest difference from the matvec's y printed relative to the largest |y|, so a wrong
// kernel shows.
struct LeanShape {
  uint32_t warps, rows, ks;
  bool stage, pipe;
};
LeanShape parse_lean(const std::string& variant) {
  std::string v = variant;
  const bool pipe = !v.empty() && v.back() == 'p';
  if (pipe) v.pop_back();
  const bool stage = !v.empty() && v.back() == 's';
  if (stage) v.pop_back();
  const auto wr = split(v, 'x');
  const bool counts = std::all_of(wr.begin(), wr.end(), [](const std::string& n) {
    return n.size() <= 3 && n.find_first_not_of("0123456789") == std::string::npos && std::stoul(n) > 0;
  });
  if ((wr.size() != 2 && wr.size() != 3) || !counts)
    throw InvalidArgument("--lean-q4k: '" + variant + "' is not WARPSxROWS[xKS][s][p] (counts 1 to 999)");
  const LeanShape l{uint32_t(std::stoul(wr[0])), uint32_t(std::stoul(wr[1])),
                    wr.size() > 2 ? uint32_t(std::stoul(wr[2])) : 1u, stage, pipe};
  if (l.warps % l.ks != 0) throw InvalidArgument("--lean-q4k: '" + variant + "': KS must divide WARPS");
  return l;
}

void print_lean_rows(gpu::Context& ctx, const Options& o, const std::vector<std::string>& shapes, double floor_gbs) {
  for (const auto& variant : split(o.lean, ',')) {
    const auto [warps, rows, ks, stage, preload] = parse_lean(variant);
    if (32 * warps > ctx.limits().maxComputeInvocationsPerWorkgroup)
      throw InvalidArgument("--lean-q4k: '" + variant + "': 32 x WARPS exceeds the adapter's workgroup");
    std::printf("| Q4_K lean %s |", variant.c_str());
    for (const auto& shape : shapes) {
      const auto dims = split(shape, 'x');
      const uint32_t n_in = uint32_t(std::stoul(dims[0])), n_out = uint32_t(std::stoul(dims[1]));
      const uint64_t xv4 = n_in / 4 + n_in / 64;
      if (n_in % 256 != 0 || (stage && xv4 * 16 > ctx.limits().maxComputeWorkgroupStorageSize)) {
        std::printf(" - |");
        continue;
      }
      const auto bytes = random_weight(GgufType::Q4_K, n_in, n_out, n_in * 31 + n_out);
      const auto copies = weight_copies(ctx, GgufType::Q4_K, n_in, n_out, bytes, o.rotate_bytes);
      if (copies[0].pieces.size() != 1) {
        std::printf(" (pieces) |");
        continue;
      }
      std::vector<float> xs(n_in);
      std::mt19937 gen(n_in);
      for (auto& e : xs) e = float(gen()) / 4294967296.f * 2.f - 1.f;
      auto x = ctx.upload<float>(xs, WGPUBufferUsage_Storage, "x");
      auto xp = ctx.create_buffer(xv4 * 16, WGPUBufferUsage_Storage, "x prepared");
      auto y = ctx.create_buffer(uint64_t(n_out) * 4, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "y");
      auto y_ref = ctx.create_buffer(uint64_t(n_out) * 4, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "y ref");
      const std::string prelude =
          "const LQ_W: u32 = " + std::to_string(warps) + "u;\nconst LQ_R: u32 = " + std::to_string(rows) +
          "u;\nconst LQ_STAGE: bool = " + (stage ? "true" : "false") + ";\nconst LQ_KS: u32 = " + std::to_string(ks) +
          "u;\nconst LQ_PIPE: bool = " + (preload ? "true" : "false") +
          ";\nconst LQ_XV4: u32 = " + std::to_string(stage ? xv4 : 1) + "u;\n";
      WGPUComputePipeline prep = ctx.pipeline({"lean_q4k.wgsl", "lean_prep", {}, prelude});
      WGPUComputePipeline pipe = ctx.pipeline({"lean_q4k.wgsl", "lean_q4k", {}, prelude});
      const uint32_t per_wg = warps / ks * rows;
      const auto grid = gpu::fold_grid((n_out + per_wg - 1) / per_wg, ctx.limits().maxComputeWorkgroupsPerDimension);
      struct {
        uint32_t n_rows, nsb, grid_x, n_in;
      } params{n_out, n_in / 256, grid.x, n_in};
      auto encode = [&](gpu::ComputeBatch& b, const kernels::GpuWeight& wt, const gpu::Buffer& out) {
        const gpu::BufferBinding bind[] = {b.uniform(0, params), {1, &wt.pieces[0].buffer}, {2, &xp}, {3, &out}};
        b.dispatch(pipe, bind, grid.x, grid.y);
      };
      {
        gpu::ComputeBatch b(ctx, "lean prep");
        const gpu::BufferBinding bind[] = {b.uniform(0, params), {4, &x}, {5, &xp}};
        b.dispatch(prep, bind, (n_in / 16 + 63) / 64, 1);
        encode(b, copies[0], y);
        kernels::encode_matmul(b, ctx, copies[0], x, y_ref, 1);
        b.submit_and_wait();
      }
      const auto got = ctx.read<float>(y), want = ctx.read<float>(y_ref);
      double err = 0, big = 0;
      for (uint32_t r = 0; r < n_out; ++r) {
        err = std::max(err, double(std::fabs(got[r] - want[r])));
        big = std::max(big, double(std::fabs(want[r])));
      }
      const double t = median_time(
          ctx, [&](gpu::ComputeBatch& b, uint32_t i) { encode(b, copies[i % copies.size()], y); },
          std::max<uint32_t>(o.matvec_per_submit, copies.size()), o.repeats);
      const double gbs = double(bytes.size()) / t / 1e9;
      std::printf(" %.0f (%.0f%%, err %.1e) |", gbs, 100 * gbs / floor_gbs, err / std::max(big, 1e-30));
      std::fflush(stdout);
    }
    std::printf("\n");
  }
}

// --decode-table's rows: each type's one-token product at the context's matvec shape (labelled `label` if any).
void print_decode_rows(gpu::Context& ctx, const Options& o, const std::vector<std::string>& shapes, double floor_gbs,
                       const std::string& label) {
  for (const auto& tname : split(o.types, ',')) {
    const GgufType t = parse_type(tname);
    std::printf("| %s%s%s |", tname.c_str(), label.empty() ? "" : " ", label.c_str());
    for (const auto& shape : shapes) {
      const auto dims = split(shape, 'x');
      if (dims.size() != 2) throw InvalidArgument("--shapes: '" + shape + "' is not N_INxN_OUT");
      const uint32_t n_in = uint32_t(std::stoul(dims[0])), n_out = uint32_t(std::stoul(dims[1]));
      if (n_in % block_elems(t) != 0) {
        std::printf(" - |");
        continue;
      }
      std::vector<float> xs(n_in, 0.5f);
      auto x = ctx.upload<float>(xs, WGPUBufferUsage_Storage, "x");
      auto y = ctx.create_buffer(uint64_t(n_out) * 4, WGPUBufferUsage_Storage, "y");
      const auto bytes = random_weight(t, n_in, n_out, n_in * 31 + n_out);
      const auto copies = weight_copies(ctx, t, n_in, n_out, bytes, o.rotate_bytes);
      const double mv =
          time_matmul(ctx, copies, x, y, 1, std::max<uint32_t>(o.matvec_per_submit, copies.size()), o.repeats);
      const double gbs = double(bytes.size()) / mv / 1e9;
      std::printf(" %.0f (%.0f%%) |", gbs, 100 * gbs / floor_gbs);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
}

// --decode-table: each type's one-token product (the matvec, or the Rows kernel on CPU adapters) at each shape, in
// weight GB/s (GGUF bytes / time) and as a share of the streaming-read floor, as one Markdown table.
// With --matvec a comma-separated list of shapes ("default": the adapter's own), a row per type and shape: a matvec
// shape sweep in one table.
int run_decode_table(const Options& o) {
  const std::vector<std::string> matvec_shapes = o.matvec.empty() ? std::vector<std::string>{""} : split(o.matvec, ',');
  const auto shapes = split(o.shapes, ',');
  double floor_gbs = 0;
  for (size_t mi = 0; mi < matvec_shapes.size(); ++mi) {
    gpu::ContextOptions options = context_options(o.adapter);
    if (matvec_shapes[mi] != "default") options.matvec_shape = matvec_shapes[mi];
    gpu::Context ctx(options);
    if (mi == 0) {
      std::printf("adapter %s (%s), subgroups %s\n", ctx.adapter().name.c_str(), ctx.adapter().backend.c_str(),
                  ctx.features().subgroups ? "yes" : "no");
      floor_gbs = print_memory_floor(ctx, 512ull << 20);
      std::printf(
          "\nOne-token weight products, weight GB/s (%% of the %.0f GB/s streaming read), n_in x n_out:\n\n| type |",
          floor_gbs);
      for (const auto& s : shapes) std::printf(" %s |", s.c_str());
      std::printf("\n|---|");
      for (size_t i = 0; i < shapes.size(); ++i) std::printf("---:|");
      std::printf("\n");
    }
    print_decode_rows(ctx, o, shapes, floor_gbs, matvec_shapes.size() > 1 ? matvec_shapes[mi] : std::string());
    if (mi + 1 < matvec_shapes.size()) continue;
    if (o.int_dot) print_int_dot_rows(ctx, o, shapes, floor_gbs);
    if (!o.lean.empty()) print_lean_rows(ctx, o, shapes, floor_gbs);
  }
  return 0;
}

int run_bench_ops(const Options& o) {
  // a malformed --matvec fails before any work; a list sweeps in --decode-table only
  const auto matvec_shapes = split(o.matvec, ',');
  for (const auto& m : matvec_shapes)
    if (m != "default" || !o.decode_table) kernels::parse_matvec_config(m);
  if (matvec_shapes.size() > 1 && !o.decode_table)
    throw InvalidArgument("--matvec: a list of shapes sweeps with --decode-table; alone, one shape");
  if (o.decode_table) return run_decode_table(o);
  std::vector<std::string> tiles = split(o.matmul_tiles, ',');
  for (const auto& t : tiles) kernels::parse_matmul_tile(t);  // likewise --matmul-tiles
  if (tiles.empty()) tiles.push_back("");
  const std::vector<std::string> rows_shapes = split(o.rows_shapes, ',');
  std::vector<uint32_t> batch_tokens;
  for (const auto& n : split(o.batch_tokens, ',')) {
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos || std::stoul(n) == 0)
      throw InvalidArgument("--batch-tokens: '" + n + "' is not a token count (1..9999)");
    batch_tokens.push_back(uint32_t(std::stoul(n)));
  }
  for (const auto& r : rows_shapes)
    if (r != "off") kernels::parse_rows_config(r);  // and --rows-shapes
  const std::vector<std::optional<uint32_t>> digit_runs = parse_digit_runs(o.prompt_digits);
  // (matmul tile, rows shape, prompt digits) per run: each tile with each rows shape (the rows shapes each timed for
  // matvec too), then each with each digits setting
  struct Run {
    std::string tile, rows;
    std::optional<uint32_t> digits;
  };
  std::vector<Run> runs;
  for (const auto& r : rows_shapes.empty() ? std::vector<std::string>{""} : rows_shapes)
    for (const auto& t : tiles)
      for (const auto& d : digit_runs) runs.push_back({t, r, d});
  for (size_t ti = 0; ti < runs.size(); ++ti) {
    gpu::ContextOptions options = context_options(o.adapter);
    options.matvec_shape = o.matvec;
    options.matmul_tile = runs[ti].tile;
    options.rows_shape = runs[ti].rows;
    options.prompt_digits = runs[ti].digits;
    if (o.batch_tile_from >= 0) options.batch_tile_from = uint32_t(o.batch_tile_from);
    if (o.batch_split >= 0) options.batch_split = uint32_t(o.batch_split);
    if (o.matvec_pass >= 0) options.matvec_pass = uint32_t(o.matvec_pass);
    if (o.prompt_tile >= 0) options.prompt_tile = uint32_t(o.prompt_tile);
    gpu::Context ctx(options);
    const bool first = ti == 0;
    if (first) {
      std::printf("adapter %s (%s), f16 %s, subgroups %s\n", ctx.adapter().name.c_str(), ctx.adapter().backend.c_str(),
                  ctx.features().shader_f16 ? "yes" : "no", ctx.features().subgroups ? "yes" : "no");
      if (!o.skip_floors) {
        print_dispatch_overhead(ctx, 500);
        print_memory_floor(ctx, 512ull << 20);
      }
      std::printf("%-7s %-5s %-11s %6s %11s %12s\n", "kernel", "type", "n_in x n_out", "tokens", "ms/call",
                  "throughput");
    }
    const bool matvec = (first || !rows_shapes.empty()) && !o.skip_matvec && runs[ti].digits.value_or(0) == 0;
    // on CPU adapters the Rows kernel does both for the types it reads (kernels::MatmulImpl::Auto)
    const auto rows_shape = kernels::rows_config(ctx).value_or(kernels::RowsConfig{});
    char rows_label[64];
    std::snprintf(rows_label, sizeof rows_label, "(rows shape %ux%ux%u)", rows_shape.workgroup, rows_shape.rows,
                  rows_shape.tokens);
    for (const auto& shape : split(o.shapes, ',')) {
      const auto dims = split(shape, 'x');
      if (dims.size() != 2) throw InvalidArgument("--shapes: '" + shape + "' is not N_INxN_OUT");
      const uint32_t n_in = uint32_t(std::stoul(dims[0])), n_out = uint32_t(std::stoul(dims[1]));
      uint32_t max_t = o.skip_matmul ? 1 : std::max(1u, o.prefill_tokens);
      for (uint32_t n : batch_tokens) max_t = std::max(max_t, n);
      std::vector<float> xs(size_t(max_t) * n_in, 0.5f);
      auto x = ctx.upload<float>(xs, WGPUBufferUsage_Storage, "x");
      auto y = ctx.create_buffer(uint64_t(max_t) * n_out * 4, WGPUBufferUsage_Storage, "y");
      for (const auto& tname : split(o.types, ',')) {
        const GgufType t = parse_type(tname);
        if (n_in % block_elems(t) != 0) {
          std::printf("%-7s %-5s %5ux%-5u  (skipped: n_in is not a multiple of the %u-element block)\n", "-",
                      tname.c_str(), n_in, n_out, block_elems(t));
          continue;
        }
        const auto bytes = random_weight(t, n_in, n_out, n_in * 31 + n_out);
        const auto copies = weight_copies(ctx, t, n_in, n_out, bytes, matvec ? o.rotate_bytes : 1);
        if (matvec) {
          const double mv =
              time_matmul(ctx, copies, x, y, 1, std::max<uint32_t>(o.matvec_per_submit, copies.size()), o.repeats);
          const auto mv_shape = kernels::matvec_config(ctx, n_out, n_in, t);
          char label[64];
          std::snprintf(label, sizeof label, "(matvec shape %ux%ux%ux%u)", mv_shape.threads_per_row, mv_shape.rows,
                        mv_shape.groups, mv_shape.units);
          std::printf("%-7s %-5s %5ux%-5u %6u %11.3f %8.1f GB/s  %s\n", "matvec", tname.c_str(), n_in, n_out, 1u,
                      mv * 1e3, double(bytes.size()) / mv / 1e9, kernels::rows_kernel_for(ctx, t) ? rows_label : label);
        }
        // batch decode's product
        for (uint32_t n : runs[ti].digits.value_or(0) ? std::vector<uint32_t>{} : batch_tokens) {
          const auto impl = kernels::token_independent_impl(ctx);
          const double bt = time_matmul(ctx, copies, x, y, n, std::max<uint32_t>(o.matvec_per_submit, copies.size()),
                                        o.repeats, impl);
          const auto bs = kernels::batch_matvec_config(ctx, n_out, n_in, t, n);
          const uint32_t groups =
              impl == kernels::MatmulImpl::Batch ? kernels::batch_tile_groups(ctx, copies[0], n) : 0;
          const std::string how =
              impl == kernels::MatmulImpl::Rows ? "rows"
              : groups == 0
                  ? "matvec"
                  : "tiled" + (ctx.options().matmul_tile.empty() ? std::string() : " " + ctx.options().matmul_tile) +
                        (groups > 1 ? ", split " + std::to_string(groups) : "");
          std::printf("%-7s %-5s %5ux%-5u %6u %11.3f %8.1f GFLOP/s  %.1f weight GB/s  (%s, matvec shape %ux%ux%ux%u)\n",
                      "batch", tname.c_str(), n_in, n_out, n, bt * 1e3, kernels::matmul_flops(copies[0], n) / bt / 1e9,
                      double(bytes.size()) / bt / 1e9, how.c_str(), bs.threads_per_row, bs.rows, bs.groups, bs.units);
        }
        if (!o.skip_matmul) {
          // products on the digits (--prompt-digits, or unset: the adapter's default), or on the f32 tiles where they
          // do not take them
          const uint32_t d = kernels::prompt_digits(ctx, copies[0], o.prefill_tokens);
          const double mm =
              time_matmul(ctx, std::span(copies).first(1), x, y, o.prefill_tokens, o.matmul_per_submit, o.repeats);
          const auto tile = kernels::matmul_tile(ctx, o.prefill_tokens, n_out);
          const uint32_t tm = kernels::prompt_tile(ctx, 64);
          const std::string label = d ? "(" + std::to_string(tm) + "x" + std::to_string(4096 / tm) + " on " +
                                            std::to_string(d) + "-digit x, its digits included)"
                                    : kernels::prompt_digits(ctx)
                                        ? "(tile " + kernels::to_string(tile) + ", not on the digits)"
                                        : "(tile " + kernels::to_string(tile) + ")";
          std::printf("%-7s %-5s %5ux%-5u %6u %11.3f %8.1f GFLOP/s  %s\n", "matmul", tname.c_str(), n_in, n_out,
                      o.prefill_tokens, mm * 1e3, kernels::matmul_flops(copies[0], o.prefill_tokens) / mm / 1e9,
                      kernels::rows_kernel_for(ctx, t) ? rows_label : label.c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

const Register reg{
    {"ops", "benchmark the weight kernels: matvec GB/s and matmul GFLOP/s per weight type",
     [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<Options>();
       app.add_option("--adapter", o->adapter, "adapter index or name substring");
       app.add_option("--types", o->types, "comma-separated weight types")->capture_default_str();
       app.add_option("--shapes", o->shapes, "comma-separated n_in x n_out")->capture_default_str();
       app.add_option("--tokens", o->prefill_tokens, "tokens of the matmul (prefill) runs")->capture_default_str();
       app.add_option("--repeats", o->repeats, "timed samples (median)")->capture_default_str();
       app.add_option("--matvec-per-submit", o->matvec_per_submit, "dispatches per submit, matvec")
           ->capture_default_str();
       app.add_option("--matmul-per-submit", o->matmul_per_submit, "dispatches per submit, matmul")
           ->capture_default_str();
       app.add_flag("--no-matmul", o->skip_matmul, "only the matrix-vector runs");
       app.add_option(
           "--rows-shapes", o->rows_shapes,
           "CPU adapters' product kernel shapes to sweep, comma-separated WORKGROUPxROWSxTOKENS or off (tuning)");
       app.add_flag("--no-floors", o->skip_floors, "skip the dispatch-overhead and memory-floor runs");
       app.add_option("--rotate-bytes", o->rotate_bytes,
                      "matvec: cycle through copies of the weight totalling this many bytes (1: one copy)")
           ->capture_default_str();
       app.add_option("--matvec", o->matvec,
                      "matvec shape THREADSxROWSxGROUPS[xUNITS] (tuning); with --decode-table a comma-separated list "
                      "to sweep, `default` the adapter's own shape");
       app.add_option(
           "--prompt-digits", o->prompt_digits,
           "Q4_K, Q6_K and Q8_0 matmul runs on packed int8 dot products with x as this many digits, comma-separated 0 "
           "(off) to 3 (ContextOptions::prompt_digits; unset: 3 on GPUs from 16 tokens, 0 on CPU adapters)");
       app.add_option("--matmul-tiles", o->matmul_tiles,
                      "matmul tiles to sweep, comma-separated TOKENSxROWS[/TTxTR][xf16] (e.g. "
                      "64x128,64x128/8x8,128x64xf16; tuning)");
       app.add_flag("--no-matvec", o->skip_matvec, "only the matrix-matrix runs");
       app.add_option("--batch-tokens", o->batch_tokens,
                      "also time batch decode's product (each token's sums independent of the others) at these token "
                      "counts, comma-separated (e.g. 4,16,64)");
       app.add_option("--batch-tile-from", o->batch_tile_from,
                      "batch decode's products from this many tokens on the tiled kernel in the matvec's order "
                      "(0: never; default: the engine's)");
       app.add_option("--batch-split", o->batch_split,
                      "those tiled products split over this many groups of lane classes where the classes allow it "
                      "(1: never; default: the engine's, by the product's tiles)");
       app.add_option("--matvec-pass", o->matvec_pass, "batch decode's matvec: tokens per pass over W, 8 or 16");
       app.add_option("--prompt-tile", o->prompt_tile,
                      "the prompt products on digits: 64 (64 x 64 workgroups) or 32 (32 x 128)");
       auto* shapes = app.get_option("--shapes");
       app.add_flag(
           "--int-dot", o->int_dot,
           "with --decode-table: also --types' Q4_K and Q6_K on packed int8 dot products (x as three 8-bit digits "
           "per element)");
       app.add_option(
           "--lean-q4k", o->lean,
           "with --decode-table: also the experiment lean_q4k.wgsl at these shapes, comma-separated "
           "WARPSxROWS[xKS][s][p] (KS warps a row, s: x in workgroup memory, p: the next step's weights loaded first)");
       app.add_flag("--decode-table", o->decode_table,
                    std::string("one table of every type's one-token product in weight GB/s and % of the memory "
                                "floor (shapes default to ") +
                        kDecodeShapes + ")");
       return [o, shapes] {
         if (o->decode_table && shapes->count() == 0) o->shapes = kDecodeShapes;
         if (!o->decode_table && (o->int_dot || !o->lean.empty()))
           throw InvalidArgument("--int-dot and --lean-q4k add rows to --decode-table's table: pass --decode-table");
         for (const auto& v : split(o->lean, ',')) parse_lean(v);  // a malformed shape fails before any work
         if (o->repeats == 0 || o->matvec_per_submit == 0 || o->matmul_per_submit == 0 || o->prefill_tokens == 0)
           throw InvalidArgument("--repeats, --*-per-submit and --tokens must be > 0");
         return run_bench_ops(*o);
       };
     }}};

}  // namespace
}  // namespace wgllm::bench

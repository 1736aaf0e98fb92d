// `wgllm-bench kernels`: attention kernels on the reference shapes (or --shape), baseline vs the default
// prefill kernel (and each --attention variant: f32, f16, BQxBKxCGxf16), reported against the floor: GFLOP/s
// (4 * n_heads * head_dim * sum of windows) and GB/s (the fewest bytes a kernel must move: q, out and the K/V window
// once). With --decode-depths, the two decode kernels (per head, per GQA group) side by side at each depth instead,
// to place ContextOptions::decode_gqa_from.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>

#include "command.h"
#include "gpu/batch.h"
#include "kernels/attention.h"
#include "wgllm/error.h"

namespace wgllm::bench {
namespace {

using kernels::AttentionImpl;
using kernels::AttentionShape;
using kernels::DecodeKernel;

struct BenchShape {
  uint32_t n_heads, n_kv_heads, head_dim, n_queries, start_pos;
  bool decode;
};

struct Result {
  double ms, gflops, gbps;
};

double min_bytes(const AttentionShape& s, uint32_t kv_bytes) {
  const double window = double(s.start_pos) + s.n_queries;
  return 2.0 * s.n_queries * s.n_heads * s.head_dim * 4 + 2.0 * window * s.n_kv_heads * s.head_dim * kv_bytes;
}

// Median over `repeats` submissions of `inner` dispatches each. Decode runs `kernel` with the splits it picks.
Result time_kernel(gpu::Context& ctx, const AttentionShape& s, const kernels::KvCache& kv, const gpu::Buffer& q,
                   const gpu::Buffer& out, bool decode, AttentionImpl impl, double min_seconds,
                   const kernels::AttentionTiles* tiles = nullptr, DecodeKernel kernel = DecodeKernel::Auto,
                   const kernels::AttentionF16Tiles* f16_tiles = nullptr) {
  gpu::Buffer scratch = ctx.create_buffer(std::max<uint64_t>(kernels::attention_decode_scratch_bound(s, kv), 16),
                                          WGPUBufferUsage_Storage, "partials");
  auto run = [&](uint32_t inner) {
    gpu::ComputeBatch batch(ctx, "bench");
    for (uint32_t i = 0; i < inner; ++i) {
      if (decode)
        kernels::encode_attention_decode(batch, ctx, s, q, kv, out, &scratch, 0, kernel);
      else
        kernels::encode_attention_prefill(batch, ctx, s, q, kv, out, impl, tiles, f16_tiles);
    }
    const auto t0 = std::chrono::steady_clock::now();
    batch.submit_and_wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double first = run(1);  // warm-up (pipeline compile, first touch)
  first = run(1);
  const uint32_t inner = uint32_t(std::clamp(min_seconds / 5 / std::max(first, 1e-6), 1.0, 1000.0));
  std::vector<double> per_call;
  for (int r = 0; r < 5; ++r) per_call.push_back(run(inner) / inner);
  std::sort(per_call.begin(), per_call.end());
  const double sec = per_call[per_call.size() / 2];
  const uint32_t kv_bytes = kernels::kv_type_bytes(kv.config().type);
  return {sec * 1e3, kernels::attention_flops(s) / sec / 1e9, min_bytes(s, kv_bytes) / sec / 1e9};
}

// "BQxBKxTPR[xRPT]" -> tiles for head_dim; nullopt when it does not describe a valid split.
std::optional<kernels::AttentionTiles> parse_tiles(const std::string& spec, uint32_t head_dim) {
  kernels::AttentionTiles t{};
  t.rpt = 1;
  if (std::sscanf(spec.c_str(), "%ux%ux%ux%u", &t.bq, &t.bk, &t.tpr, &t.rpt) < 3 || t.tpr == 0 || t.rpt == 0)
    return std::nullopt;
  if ((head_dim / 4) % t.tpr != 0 || t.bq % t.rpt != 0) return std::nullopt;
  t.dv = head_dim / 4 / t.tpr;
  t.wg = t.bq / t.rpt * t.tpr;
  return t;
}

// The prefill kernel `impl` stands for on shape s, as a row label: "f32", "f16 64x32x16" or "baseline".
std::string kernel_label(const gpu::Context& ctx, const AttentionShape& s, kernels::KvType kv_type, AttentionImpl impl,
                         const kernels::AttentionF16Tiles* f16_tiles) {
  impl = kernels::resolve_attention_prefill(ctx, s, kv_type, impl);
  if (impl == AttentionImpl::Baseline) return "baseline";
  if (impl == AttentionImpl::Tiled) return "f32";
  std::optional<kernels::AttentionF16Tiles> t;
  if (f16_tiles)
    t = *f16_tiles;
  else
    t = kernels::parse_attention_variant(ctx.options().attention_prefill).f16_tiles;
  if (!t) t = kernels::attention_f16_tiles(ctx, s.head_dim);
  if (!t) return "f16";
  return "f16 " + std::to_string(t->bq) + "x" + std::to_string(t->bk) + "x" + std::to_string(t->cg);
}

// "H,KVH,D,NQ,START" -> a prefill shape (NQ = 1: decode); nullopt when malformed.
std::optional<BenchShape> parse_shape(const std::string& text) {
  BenchShape b{};
  char tail = 0;
  if (std::sscanf(text.c_str(), "%u,%u,%u,%u,%u%c", &b.n_heads, &b.n_kv_heads, &b.head_dim, &b.n_queries, &b.start_pos,
                  &tail) != 5 ||
      b.n_heads == 0 || b.n_kv_heads == 0 || b.head_dim == 0 || b.n_queries == 0)
    return std::nullopt;
  b.decode = b.n_queries == 1;
  return b;
}

int run_bench(const std::string& adapter, bool include_slow, bool f32_kv, double min_seconds,
              const std::vector<std::string>& tile_specs, const std::vector<std::string>& shape_specs,
              const std::vector<std::string>& variants) {
  gpu::Context ctx(context_options(adapter));
  const bool cpu = ctx.adapter().is_cpu();
  std::vector<BenchShape> shapes = {{32, 8, 64, 512, 0, false},
                                    {32, 8, 128, 2048, 0, false},
                                    {14, 14, 64, 512, 512, false},
                                    {32, 8, 128, 1, 8191, true}};
  if (!shape_specs.empty()) {
    shapes.clear();
    for (const auto& spec : shape_specs) {
      const auto b = parse_shape(spec);
      if (!b) throw InvalidArgument("--shape '" + spec + "': expected H,KVH,D,NQ,START (e.g. 32,8,128,4096,0)");
      shapes.push_back(*b);
    }
  }
  std::vector<kernels::AttentionVariant> parsed;
  for (const auto& v : variants) {
    parsed.push_back(kernels::parse_attention_variant(v));
    if (parsed.back().impl == AttentionImpl::Auto) throw InvalidArgument("--attention: an empty variant");
  }
  std::printf("adapter: %s (%s), KV %s\n", ctx.adapter().name.c_str(), ctx.adapter().backend.c_str(),
              f32_kv ? "f32" : "f16");
  std::printf("%-28s %-24s %10s %12s %10s %9s\n", "shape (H,KVH,D,Nq,start)", "kernel", "ms", "GFLOP/s", "GB/s",
              "speedup");
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (const auto& b : shapes) {
    const AttentionShape s{.n_heads = b.n_heads,
                           .n_kv_heads = b.n_kv_heads,
                           .head_dim = b.head_dim,
                           .n_queries = b.n_queries,
                           .start_pos = b.start_pos};
    const uint32_t seq = b.start_pos + b.n_queries, kv_dim = b.n_kv_heads * b.head_dim;
    kernels::KvCache kv(ctx, {.kv_dim = kv_dim,
                              .max_seq = seq,
                              .page_size = seq > 256 ? 256u : 0u,
                              .type = f32_kv ? kernels::KvType::F32 : kernels::KvType::F16});
    std::vector<float> k(size_t(seq) * kv_dim), v(k.size()), q(size_t(b.n_queries) * b.n_heads * b.head_dim);
    for (auto* vec : {&k, &v, &q})
      for (auto& x : *vec) x = dist(gen);
    kv.write(0, seq, k, v);
    auto qbuf = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
    auto out = ctx.create_buffer(q.size() * 4, WGPUBufferUsage_Storage, "out");
    std::ostringstream name;
    name << "(" << b.n_heads << "," << b.n_kv_heads << "," << b.head_dim << "," << b.n_queries << "," << b.start_pos
         << ")";
    const double baseline_flop = kernels::attention_flops(s);
    double base_ms = 0;
    // The baseline at (32,8,128,2048) takes about a minute on lavapipe: only with --all there.
    if (include_slow || !cpu || baseline_flop < 2e9) {
      auto r = time_kernel(ctx, s, kv, qbuf, out, false, AttentionImpl::Baseline, min_seconds);
      base_ms = r.ms;
      std::printf("%-28s %-24s %10.3f %12.2f %10.2f %9s\n", name.str().c_str(), "baseline", r.ms, r.gflops, r.gbps,
                  "1.00x");
    }
    auto row = [&](const std::string& label, const Result& r) {
      char speed[32] = "-";
      if (base_ms > 0) std::snprintf(speed, sizeof speed, "%.2fx", base_ms / r.ms);
      std::printf("%-28s %-24s %10.3f %12.2f %10.2f %9s\n", name.str().c_str(), label.c_str(), r.ms, r.gflops, r.gbps,
                  speed);
    };
    if (b.decode) {
      row("decode", time_kernel(ctx, s, kv, qbuf, out, true, AttentionImpl::Auto, min_seconds));
      std::fflush(stdout);
      continue;
    }
    // The default choice first (what a model's prefill runs), then each variant asked for.
    row(kernel_label(ctx, s, kv.config().type, AttentionImpl::Auto, nullptr) + " (default)",
        time_kernel(ctx, s, kv, qbuf, out, false, AttentionImpl::Auto, min_seconds));
    for (size_t i = 0; i < parsed.size(); ++i) {
      const auto& var = parsed[i];
      const kernels::AttentionF16Tiles* ft = var.f16_tiles ? &*var.f16_tiles : nullptr;
      try {
        row(kernel_label(ctx, s, kv.config().type, var.impl, ft),
            time_kernel(ctx, s, kv, qbuf, out, false, var.impl, min_seconds, nullptr, DecodeKernel::Auto, ft));
      } catch (const Error& e) {
        std::printf("%-28s %-24s skipped: %s\n", name.str().c_str(), variants[i].c_str(), e.what());
      }
    }
    for (const auto& spec : tile_specs) {
      const auto tiles = parse_tiles(spec, b.head_dim);
      if (!tiles) continue;
      try {
        row(spec, time_kernel(ctx, s, kv, qbuf, out, false, AttentionImpl::Tiled, min_seconds, &*tiles));
      } catch (const Error& e) {
        std::printf("%-28s %-24s skipped: %s\n", name.str().c_str(), spec.c_str(), e.what());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

// One decode step (one query at position `depth`) per model shape and depth, through each decode kernel: µs per
// call and GB/s of the K/V window read once (the floor: 2 * (depth + 1) * kv_dim elements).
int run_decode_depths(const std::string& adapter, bool f32_kv, double min_seconds,
                      const std::vector<uint32_t>& depths) {
  gpu::Context ctx(context_options(adapter));
  std::printf("adapter: %s (%s), KV %s, decode_gqa_from %u (Auto picks grouped at or above)\n",
              ctx.adapter().name.c_str(), ctx.adapter().backend.c_str(), f32_kv ? "f32" : "f16",
              kernels::decode_gqa_from(ctx));
  struct ModelShape {
    const char* name;
    uint32_t n_heads, n_kv_heads, head_dim;
  };
  const ModelShape shapes[] = {{"llama-3.2-1b", 32, 8, 64}, {"qwen3-0.6b", 16, 8, 128}, {"qwen2.5-0.5b", 14, 2, 64}};
  std::printf("%-14s %-12s %8s %-9s %6s %5s %10s %9s %11s\n", "shape", "(H,KVH,D)", "depth", "kernel", "splits",
              "heads", "us", "KV GB/s", "vs per-head");
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const auto type = f32_kv ? kernels::KvType::F32 : kernels::KvType::F16;
  for (const ModelShape& m : shapes) {
    for (const uint32_t depth : depths) {
      const AttentionShape s{
          .n_heads = m.n_heads, .n_kv_heads = m.n_kv_heads, .head_dim = m.head_dim, .n_queries = 1, .start_pos = depth};
      const uint32_t seq = depth + 1, kv_dim = m.n_kv_heads * m.head_dim;
      const uint32_t page = kernels::KvCache::kPageMultiple * 2;  // as the model's caches: 256-position pages
      kernels::KvCache kv(
          ctx, {.kv_dim = kv_dim, .max_seq = (seq + page - 1) / page * page, .page_size = page, .type = type});
      std::vector<float> k(size_t(seq) * kv_dim), v(k.size()), q(size_t(m.n_heads) * m.head_dim);
      for (auto* vec : {&k, &v, &q})
        for (auto& x : *vec) x = dist(gen);
      kv.write(0, seq, k, v);
      auto qbuf = ctx.upload<float>(q, WGPUBufferUsage_Storage, "q");
      auto out = ctx.create_buffer(q.size() * 4, WGPUBufferUsage_Storage, "out");
      const double kv_bytes = 2.0 * seq * kv_dim * kernels::kv_type_bytes(type);
      std::ostringstream dims;
      dims << "(" << m.n_heads << "," << m.n_kv_heads << "," << m.head_dim << ")";
      double per_head_us = 0;
      for (const DecodeKernel k : {DecodeKernel::PerHead, DecodeKernel::Grouped}) {
        const bool grouped = k == DecodeKernel::Grouped;
        const Result r = time_kernel(ctx, s, kv, qbuf, out, true, AttentionImpl::Auto, min_seconds, nullptr, k);
        const double us = r.ms * 1e3;
        if (!grouped) per_head_us = us;
        char vs[32] = "1.00x";
        if (grouped) std::snprintf(vs, sizeof vs, "%.2fx", per_head_us / us);
        std::printf("%-14s %-12s %8u %-9s %6u %5u %10.2f %9.2f %11s\n", m.name, dims.str().c_str(), depth,
                    grouped ? "grouped" : "per-head", kernels::attention_decode_splits(s, kv, k),
                    grouped ? kernels::attention_decode_group(ctx, s) : 1u, us, kv_bytes / (us * 1e-6) / 1e9, vs);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

const Register reg{{"kernels", "benchmark the attention kernels (baseline vs tiled f32 / f16, decode)",
                    [](CLI::App& app) -> std::function<int()> {
                      auto adapter = std::make_shared<std::string>();
                      auto all = std::make_shared<bool>(false);
                      auto f32 = std::make_shared<bool>(false);
                      auto seconds = std::make_shared<double>(1.0);
                      app.add_option("--adapter", *adapter, "adapter index or name substring");
                      app.add_flag("--all", *all, "also run the slowest baseline shapes on CPU adapters");
                      app.add_flag("--f32-kv", *f32, "f32 KV cache instead of f16");
                      app.add_option("--seconds", *seconds, "target time per measurement")->capture_default_str();
                      auto tiles = std::make_shared<std::vector<std::string>>();
                      app.add_option("--tiles", *tiles, "also time the tiled kernel with these BQxBKxTPR[xRPT] tiles");
                      auto shapes = std::make_shared<std::vector<std::string>>();
                      app.add_option("--shape", *shapes,
                                     "instead of the reference shapes: H,KVH,D,NQ,START (repeatable; NQ 1: decode), "
                                     "e.g. --shape 32,8,128,4096,0");
                      auto variants = std::make_shared<std::vector<std::string>>();
                      app.add_option("--attention", *variants,
                                     "also time these prefill kernels (a list): f32 (attention.wgsl), f16 "
                                     "(attention_f16.wgsl, default tile) or BQxBKxCGxf16, e.g. f32,f16,32x32x16xf16")
                          ->delimiter(',');
                      auto depths = std::make_shared<std::vector<uint32_t>>();
                      app.add_option("--decode-depths", *depths,
                                     "instead: one decode step at each depth (a list: 0,4096,16384) through the "
                                     "per-head and the GQA-grouped decode kernels, Llama-3.2-1B and Qwen shapes")
                          ->delimiter(',');
                      return [=] {
                        if (!depths->empty()) return run_decode_depths(*adapter, *f32, *seconds, *depths);
                        return run_bench(*adapter, *all, *f32, *seconds, *tiles, *shapes, *variants);
                      };
                    }}};

}  // namespace
}  // namespace wgllm::bench

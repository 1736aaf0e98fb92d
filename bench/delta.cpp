// `wgllm-bench delta`: the gated DeltaNet kernels (delta_conv + delta_rule, kernels/delta_net.h) on Qwen 3.5's
// shapes for calls of 1 to 16,384 tokens: µs per call of the convolution and of the rule both ways (token by token,
// in chunks), µs per token and tokens/s of what a model runs (a linear-time scan: µs per token should stay flat as
// the call grows), and the decode step (1 token) beside one full-attention layer's decode at
// depth 4096 (the yardstick), the model's own attention shape, f16 cache; and the decode step with the
// output's gated norm after it (two dispatches) or inside it (delta_step_norm).
#include <chrono>
#include <cstdio>
#include <random>

#include "command.h"
#include "gpu/batch.h"
#include "kernels/attention.h"
#include "kernels/delta_net.h"
#include "kernels/kv_cache.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"

namespace wgllm::bench {
namespace {

struct DeltaModel {
  const char* name;
  uint32_t k_heads, v_heads, dk, dv, taps;
  uint32_t n_head, n_head_kv, head_dim;  // its full-attention layers
};

// Median seconds per call over 5 submissions of `inner` calls each (after a warm-up).
template <typename F>
double time_calls(gpu::Context& ctx, double min_seconds, F encode) {
  auto run = [&](uint32_t inner) {
    gpu::ComputeBatch batch(ctx, "bench");
    for (uint32_t i = 0; i < inner; ++i) encode(batch);
    const auto t0 = std::chrono::steady_clock::now();
    batch.submit_and_wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double first = run(1);
  first = run(1);
  const uint32_t inner = uint32_t(std::clamp(min_seconds / 5 / std::max(first, 1e-6), 1.0, 1000.0));
  std::vector<double> per_call;
  for (int r = 0; r < 5; ++r) per_call.push_back(run(inner) / inner);
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

std::vector<float> random(size_t n, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// The delta rule's inputs and outputs for n tokens of model m: gates, constants, the state before and after, o.
struct RuleBuffers {
  gpu::Buffer ab, consts, s0, s1, o;
};
RuleBuffers rule_buffers(gpu::Context& ctx, const DeltaModel& m, uint32_t n, std::mt19937& gen) {
  constexpr auto kStorage = WGPUBufferUsage_Storage;
  const uint32_t H = m.v_heads;
  std::vector<float> consts = random(H, gen, -1.f, 1.f), a = random(H, gen, -4.f, -0.5f);
  consts.insert(consts.end(), a.begin(), a.end());
  const uint64_t state_bytes = uint64_t(H) * m.dk * m.dv * 4;
  return {ctx.upload<float>(random(size_t(n) * 2 * H, gen, -2.f, 2.f), kStorage, "alpha beta"),
          ctx.upload<float>(consts, kStorage, "consts"),
          ctx.upload<float>(random(state_bytes / 4, gen, -0.1f, 0.1f), kStorage, "state 0"),
          ctx.create_buffer(state_bytes, kStorage, "state 1"),
          ctx.create_buffer(uint64_t(n) * H * m.dv * 4, kStorage, "o")};
}

int run(const std::string& adapter, double min_seconds, const std::vector<uint32_t>& lengths) {
  gpu::Context ctx(context_options(adapter));
  std::printf("adapter: %s (%s)\n", ctx.adapter().name.c_str(), ctx.adapter().backend.c_str());
  const DeltaModel models[] = {{"qwen3.5-0.8b", 16, 16, 128, 128, 4, 8, 2, 256},
                               {"qwen3.5-9b", 16, 32, 128, 128, 4, 16, 4, 256}};
  std::mt19937 gen(4321);
  constexpr auto kStorage = WGPUBufferUsage_Storage;
  for (const DeltaModel& m : models) {
    const kernels::DeltaShape base{.k_heads = m.k_heads, .v_heads = m.v_heads, .dk = m.dk, .dv = m.dv};
    const uint32_t W = base.channels(), H = m.v_heads;
    std::printf("%s: %u key heads, %u value heads of %ux%u, %u taps\n", m.name, m.k_heads, H, m.dk, m.dv, m.taps);
    std::printf("%8s %12s %12s %12s %12s %12s\n", "tokens", "conv us", "rule us", "chunked us", "us/token", "tokens/s");
    double decode_us = 0;
    for (const uint32_t n : lengths) {
      kernels::DeltaShape s = base;
      s.n_tokens = n;
      const uint32_t rows = kernels::conv_ring_rows(n, m.taps);
      auto x = ctx.upload<float>(random(size_t(n) * W, gen, -1.f, 1.f), kStorage, "x");
      auto taps = ctx.upload<float>(random(size_t(W) * m.taps, gen, -0.5f, 0.5f), kStorage, "taps");
      auto ring = ctx.create_buffer(uint64_t(rows) * W * 4, kStorage, "ring");
      auto c = ctx.create_buffer(uint64_t(n) * W * 4, kStorage, "c");
      auto [ab, cbuf, s0, s1, o] = rule_buffers(ctx, m, n, gen);
      auto tm = ctx.create_buffer(kernels::delta_chunk_scratch_bytes(s), kStorage, "chunk scratch");
      const kernels::DeltaGates gates{.alpha = &ab, .beta = &ab, .stride = 2 * H, .beta_offset = H};
      const double conv = time_calls(ctx, min_seconds, [&](gpu::ComputeBatch& b) {
        kernels::encode_delta_conv(b, ctx, s, m.taps, 100, rows, 1e-6f, x, taps, ring, c);
      });
      auto rule_in = [&](kernels::DeltaRuleImpl impl) {
        return time_calls(ctx, min_seconds, [&](gpu::ComputeBatch& b) {
          kernels::encode_delta_rule(b, ctx, s, c, gates, cbuf, s0, s1, o, false, impl, &tm);
        });
      };
      const double rule = rule_in(kernels::DeltaRuleImpl::Sequential);
      const bool chunks = kernels::delta_chunk_supported(ctx, s);
      const double chunked = chunks ? rule_in(kernels::DeltaRuleImpl::Chunked) : 0;
      // what a model's call runs (DeltaRuleImpl::Auto)
      const double us = (conv + (chunks && n >= kernels::delta_chunk_from(ctx) ? chunked : rule)) * 1e6;
      if (n == 1) decode_us = us;
      std::printf("%8u %12.2f %12.2f %12.2f %12.3f %12.0f\n", n, conv * 1e6, rule * 1e6, chunked * 1e6, us / n,
                  n / (us * 1e-6));
      std::fflush(stdout);
    }
    // A model's decode step: delta_step then the gated output norm (two dispatches), against delta_step_norm (one).
    if (kernels::delta_step_supported(ctx)) {
      kernels::DeltaShape s = base;
      s.n_tokens = 1;
      const uint32_t rows = kernels::delta_ring_rows(m.taps);
      auto x = ctx.upload<float>(random(W, gen, -1.f, 1.f), kStorage, "x");
      auto taps = ctx.upload<float>(random(size_t(W) * m.taps, gen, -0.5f, 0.5f), kStorage, "taps");
      auto ring = ctx.upload<float>(random(size_t(rows) * W, gen, -1.f, 1.f), kStorage, "ring");
      auto [ab, cbuf, s0, s1, o] = rule_buffers(ctx, m, 1, gen);
      auto y = ctx.create_buffer(uint64_t(H) * m.dv * 4, kStorage, "y");
      auto z = ctx.upload<float>(random(size_t(H) * m.dv, gen, -2.f, 2.f), kStorage, "z");
      auto w = ctx.upload<float>(random(m.dv, gen, 0.5f, 1.5f), kStorage, "norm");
      const kernels::DeltaGates gates{.alpha = &ab, .beta = &ab, .stride = 2 * H, .beta_offset = H};
      const kernels::DeltaOutputNorm norm{.weight = &w, .z = &z, .eps = 1e-6f};
      const double two = time_calls(ctx, min_seconds, [&](gpu::ComputeBatch& b) {
        kernels::encode_delta_step(b, ctx, s, m.taps, 100, rows, 1e-6f, x, taps, ring, gates, cbuf, s0, s1, o);
        kernels::encode_rms_norm(b, ctx, o, w, y, H, m.dv, 1e-6f, false, &z);
      });
      std::printf("decode step: delta_step + gated rms_norm %.2f us", two * 1e6);
      if (kernels::delta_step_norm_supported(ctx, s)) {
        const double one = time_calls(ctx, min_seconds, [&](gpu::ComputeBatch& b) {
          kernels::encode_delta_step(b, ctx, s, m.taps, 100, rows, 1e-6f, x, taps, ring, gates, cbuf, s0, s1, y, false,
                                     &norm);
        });
        std::printf(", delta_step_norm %.2f us (%.2fx)", one * 1e6, two / one);
      }
      std::printf("\n");
    }
    // One full-attention layer's decode at depth 4096 (f16 cache), the kernel the session picks.
    const kernels::AttentionShape as{
        .n_heads = m.n_head, .n_kv_heads = m.n_head_kv, .head_dim = m.head_dim, .n_queries = 1, .start_pos = 4096};
    const uint32_t kv_dim = m.n_head_kv * m.head_dim, seq = 4097, page = 256;
    kernels::KvCache kv(ctx, {.kv_dim = kv_dim, .max_seq = (seq + page - 1) / page * page, .page_size = page});
    const auto kvals = random(size_t(seq) * kv_dim, gen, -1.f, 1.f);
    kv.write(0, seq, kvals, kvals);
    auto q = ctx.upload<float>(random(size_t(m.n_head) * m.head_dim, gen, -1.f, 1.f), kStorage, "q");
    auto out = ctx.create_buffer(uint64_t(m.n_head) * m.head_dim * 4, kStorage, "out");
    auto scratch = ctx.create_buffer(std::max<uint64_t>(kernels::attention_decode_scratch_bound(as, kv), 16), kStorage,
                                     "partials");
    const double attn = time_calls(ctx, min_seconds, [&](gpu::ComputeBatch& b) {
      kernels::encode_attention_decode(b, ctx, as, q, kv, out, &scratch);
    });
    std::printf("decode: DeltaNet step %.2f us, attention (%u,%u,%u) at depth 4096 %.2f us: %.2fx\n\n", decode_us,
                m.n_head, m.n_head_kv, m.head_dim, attn * 1e6, decode_us / (attn * 1e6));
  }
  return 0;
}

const Register reg{
    {"delta", "benchmark the gated DeltaNet kernels (Qwen 3.5 shapes, 1 to 16,384 tokens)",
     [](CLI::App& app) -> std::function<int()> {
       auto adapter = std::make_shared<std::string>();
       auto seconds = std::make_shared<double>(0.5);
       auto lengths = std::make_shared<std::vector<uint32_t>>(std::vector<uint32_t>{1, 512, 4096, 16384});
       app.add_option("--adapter", *adapter, "adapter index or name substring");
       app.add_option("--seconds", *seconds, "target time per measurement")->capture_default_str();
       app.add_option("--tokens", *lengths, "chunk lengths (a list)")->delimiter(',')->capture_default_str();
       return [=] { return run(*adapter, *seconds, *lengths); };
     }}};

}  // namespace
}  // namespace wgllm::bench

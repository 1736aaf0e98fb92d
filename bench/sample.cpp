// `wgllm-bench sample`: choosing a decode step's tokens for N sampled sequences at a vocabulary's size, the two ways
// BatchEngine can: each row's logits read back and drawn on the host (api/sampling.h's Sampler, one row after another
// on one thread, as the engine's scheduler does), against every row drawn on the GPU in one set of dispatches
// (kernels::encode_sample_rows). Reported: ms a step each way, and the logits' bytes the host way reads back.
#include <chrono>
#include <cstdio>
#include <random>

#include "api/sampling.h"
#include "command.h"
#include "common.h"
#include "kernels/sample.h"

namespace wgllm::bench {
namespace {

int run(const std::string& adapter, const std::string& vocabs, const std::string& row_counts, uint32_t repeats) {
  gpu::Context ctx(context_options(adapter));
  std::printf("adapter: %s (%s)\n", ctx.adapter().name.c_str(), ctx.adapter().backend.c_str());
  // llama.cpp's server defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), and OpenAI's (temperature 1
  // alone: every token a candidate)
  struct Mode {
    const char* name;
    SamplingParams params;
  };
  const Mode modes[] = {{"t0.8 k40 p0.95 m0.05", {}},
                        {"t1", {.temperature = 1.f, .top_k = 0, .top_p = 1.f, .min_p = 0.f}}};
  std::printf("%8s %6s %22s %14s %14s %14s\n", "vocab", "rows", "settings", "host ms/step", "GPU ms/step",
              "logits MB");
  std::mt19937 gen(99);
  std::normal_distribution<float> logit(0.f, 3.f);
  for (const std::string& v : split(vocabs, ',')) {
    const uint32_t V = uint32_t(std::stoul(v));
    for (const std::string& r : split(row_counts, ',')) {
      const uint32_t N = uint32_t(std::stoul(r));
      std::vector<float> logits(size_t(N) * V);
      for (float& x : logits) x = logit(gen);
      auto in = ctx.upload<float>(logits, WGPUBufferUsage_Storage, "logits");
      auto params = ctx.create_buffer(kernels::sample_rows_params_bytes(N), WGPUBufferUsage_Storage, "params");
      auto recent = ctx.create_buffer(4096, WGPUBufferUsage_Storage, "recent ids");
      auto scratch = ctx.create_buffer(kernels::sample_rows_scratch_bytes(N, V), WGPUBufferUsage_Storage, "scratch");
      auto out = ctx.create_buffer(uint64_t(N) * 4, WGPUBufferUsage_Storage, "ids");
      for (const Mode& m : modes) {
        std::vector<Sampler> samplers(N, Sampler(m.params));
        std::vector<double> host;
        for (uint32_t k = 0; k < std::max(repeats, 1u); ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          for (uint32_t i = 0; i < N; ++i) samplers[i].sample(std::span(logits).subspan(size_t(i) * V, V));
          host.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(host.begin(), host.end());
        std::vector<kernels::SampleRow> rows(N);
        for (uint32_t i = 0; i < N; ++i) rows[i] = {.settings = sample_settings(m.params), .u = 0.5f, .recent = {}};
        const double gpu_s = median_time(
            ctx,
            [&](gpu::ComputeBatch& batch, uint32_t) {
              kernels::encode_sample_rows(batch, ctx, rows, in, V, params, recent, scratch, out);
            },
            1, repeats, 0.3);
        std::printf("%8u %6u %22s %14.3f %14.3f %14.1f\n", V, N, m.name, host[host.size() / 2] * 1e3, gpu_s * 1e3,
                    double(N) * V * 4 / 1e6);
        std::fflush(stdout);
      }
    }
  }
  std::printf("host: Sampler::sample on each row in turn (one thread); GPU: encode_sample_rows, all rows, one submit\n"
              "(which on a GPU also waits out a submit's latency); the host way also reads the logits back first\n");
  return 0;
}

const Register reg{{"sample", "choosing N sampled sequences' tokens: on the host from logits, or on the GPU in rows",
                    [](CLI::App& app) -> std::function<int()> {
                      auto adapter = std::make_shared<std::string>();
                      auto vocabs = std::make_shared<std::string>("32000,128256,262144");
                      auto rows = std::make_shared<std::string>("1,16,64");
                      auto repeats = std::make_shared<uint32_t>(5);
                      app.add_option("--adapter", *adapter, "adapter name substring");
                      app.add_option("--vocab", *vocabs, "vocabulary sizes, comma-separated")->capture_default_str();
                      app.add_option("--rows", *rows, "sequences a step, comma-separated")->capture_default_str();
                      app.add_option("--repeats", *repeats, "timed samples (median)")->capture_default_str();
                      return [=] { return run(*adapter, *vocabs, *rows, *repeats); };
                    }}};

}  // namespace
}  // namespace wgllm::bench

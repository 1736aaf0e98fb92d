// Helpers shared by the weight benchmarks (ops.cpp, experts.cpp): lists, weight types, random GGUF weights and the
// timing loop.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/types.h"
#include "gpu/batch.h"

namespace wgllm::bench {

// The non-empty items of s between separators.
std::vector<std::string> split(const std::string& s, char sep);
// --prompt-digits' comma-separated settings, each 0 to 3 (InvalidArgument naming it otherwise); none given: one unset
// (the adapter's default).
std::vector<std::optional<uint32_t>> parse_digit_runs(const std::string& list);
// A weight type by its GGUF name; InvalidArgument naming --types otherwise.
GgufType parse_type(const std::string& s);
// Random GGUF bytes: floats in [-1, 1], or random quants and sub-block scales with f16 scales in [0.001, 0.03]
// (MXFP4: scales 2^-10 .. 2^-5).
std::vector<uint8_t> random_weight(GgufType t, uint32_t n_in, uint32_t n_out, uint64_t seed);

// Median seconds per call of `encode`, run `per_submit` times per command buffer, over `repeats`
// timed command buffers. First the same work runs, untimed, for at least `warm_s` seconds: that
// compiles the pipelines and touches the buffers, and lets the GPU raise its clocks (an H200's
// cores idle at 345 MHz and reach 1,980 only under sustained load: short bursts after a pause,
// e.g. after uploading a weight, measured half the bandwidth; PERF.md).
template <typename Encode>
double median_time(gpu::Context& ctx, Encode encode, uint32_t per_submit, uint32_t repeats, double warm_s = 1.0) {
  using clock = std::chrono::steady_clock;
  auto sample = [&] {
    gpu::ComputeBatch batch(ctx, "bench-ops");
    for (uint32_t i = 0; i < per_submit; ++i) encode(batch, i);
    const auto t0 = clock::now();
    batch.submit_and_wait();
    return std::chrono::duration<double>(clock::now() - t0).count() / per_submit;
  };
  for (const auto w0 = clock::now(); std::chrono::duration<double>(clock::now() - w0).count() < warm_s;) sample();
  std::vector<double> times;
  for (uint32_t r = 0; r < std::max(repeats, 1u); ++r) times.push_back(sample());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace wgllm::bench

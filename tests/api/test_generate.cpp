// Sampled generation on the built-in model: the token choice on the GPU (sample.wgsl, each step queued before the
// last id is back) gives the same tokens as the host path (each step's logits read back, api's Sampler) for the
// same seed, in every sampling mode, through Session::generate and Session::decode.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "wgllm/default_model.h"
#include "wgllm/wgllm.h"

namespace wgllm {
namespace {

// The GPU path forced on (on CPU adapters the default is the host).
const Model& model(uint32_t n_ctx = 256) {
  auto load = [](uint32_t c) {
    LoadOptions o;
    o.n_ctx = c;
    o.choose_on_gpu = true;
    return Model::load(default_model_gguf(), o, "built-in");
  };
  static const Model m256 = load(256);
  static const Model m40 = load(40);
  return n_ctx == 256 ? m256 : m40;
}

SamplingParams host(SamplingParams p) {
  p.host = true;
  return p;
}

const SamplingParams kModes[] = {
    {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f, .seed = 1},
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.f, .min_p = 0.f, .seed = 2},
    {.temperature = 1.3f, .top_k = 0, .top_p = 0.7f, .min_p = 0.f, .seed = 3},
    {.temperature = 0.7f, .top_k = 20, .top_p = 1.f, .min_p = 0.1f, .repeat_penalty = 1.3f, .seed = 4},
    {.temperature = 0.9f,
     .top_k = 0,
     .top_p = 0.95f,
     .min_p = 0.f,
     .repeat_penalty = 1.5f,
     .repeat_last_n = -1,
     .seed = 5},
    {.temperature = 0.f, .repeat_penalty = 1.8f, .repeat_last_n = 8},  // greedy with a penalty: on the GPU too
};

TEST(Generate, GpuSamplingMatchesHostSampling) {
  const Model& m = model();
  const std::vector<int32_t> prompt = m.encode("ROMEO:");
  Session s(m);
  for (const SamplingParams& p : kModes) {
    s.reset();
    const GenerateResult gpu = s.generate(prompt, p, 64);
    s.reset();
    const GenerateResult cpu = s.generate(prompt, host(p), 64);
    EXPECT_EQ(gpu.tokens, cpu.tokens) << "seed " << p.seed << " temperature " << p.temperature;
    EXPECT_EQ(gpu.text, cpu.text);
    EXPECT_EQ(gpu.stop_reason, cpu.stop_reason);
  }
}

// The modes sample: another seed gives other tokens, and the same seed the same ones.
TEST(Generate, SeedsChangeTheTokensAndRepeat) {
  const Model& m = model();
  const std::vector<int32_t> prompt = m.encode("JULIET:");
  Session s(m);
  SamplingParams p = kModes[1];
  const auto a = s.generate(prompt, p, 48).tokens;
  s.reset();
  const auto again = s.generate(prompt, p, 48).tokens;
  s.reset();
  p.seed = 77;
  const auto b = s.generate(prompt, p, 48).tokens;
  EXPECT_EQ(a, again);
  EXPECT_NE(a, b);
}

// Session::decode: the same ids on both paths, after a prompt fed by hand (its tokens in the penalty's window),
// and up to a full context.
TEST(Generate, DecodeMatchesHostUpToAFullContext) {
  const Model& m = model(40);
  Session s(m);
  for (const SamplingParams& p : {kModes[0], kModes[3], kModes[4]}) {
    std::vector<int32_t> ids[2];
    for (int on_host = 0; on_host < 2; ++on_host) {
      s.reset();
      std::vector<int32_t> prompt = m.encode("KING HENRY:");
      const int32_t last = prompt.back();
      prompt.pop_back();
      s.feed(prompt);
      const uint32_t n = s.decode(last, 1000, on_host ? host(p) : p, [&](int32_t id) {
        ids[on_host].push_back(id);
        return true;
      });
      EXPECT_EQ(n, ids[on_host].size());
      EXPECT_EQ(s.n_past(), s.n_ctx());
    }
    EXPECT_EQ(ids[0], ids[1]) << "seed " << p.seed;
    EXPECT_FALSE(ids[0].empty());
  }
}

// decode_host_time counts every step encoded on the GPU path (the one queued ahead of a stop included) with the
// time spent on it, and nothing for steps chosen on the host.
TEST(Generate, DecodeHostTimeCountsTheGpuPathSteps) {
  const Model& m = model();
  Session s(m);
  const int32_t first = m.encode("ROMEO:").back();
  const Session::DecodeHostTime t0 = s.decode_host_time();
  EXPECT_EQ(t0.steps, 0u);
  EXPECT_EQ(s.decode(first, 24, kModes[1]), 24u);
  const Session::DecodeHostTime t1 = s.decode_host_time();
  EXPECT_EQ(t1.steps, 24u);
  EXPECT_GT(t1.seconds, 0.0);
  s.reset();
  uint32_t seen = 0;
  EXPECT_EQ(s.decode_greedy(first, 24, [&](int32_t) { return ++seen < 5; }), 5u);
  const Session::DecodeHostTime t2 = s.decode_host_time();
  EXPECT_EQ(t2.steps, t1.steps + 6) << "5 steps read back and the sixth, queued before the fifth id came back";
  EXPECT_GT(t2.seconds, t1.seconds);
  s.reset();
  EXPECT_EQ(s.decode(first, 8, host(kModes[1])), 8u);
  EXPECT_EQ(s.decode_host_time().steps, t2.steps) << "steps chosen on the host are not the GPU path's";
}

}  // namespace
}  // namespace wgllm

// Token sampling from logits (llama.cpp's filters and order): repetition penalty over the last N tokens, then top-k,
// top-p, min-p and temperature, then an inverse-CDF draw with one uniform per step from std::mt19937_64 (none when
// greedy). The algorithm is cpu::sample_reference (src/cpu/sample.h), which sample.wgsl runs on the GPU: with the
// uniforms this sampler hands out (next_uniform), the GPU chooses the same tokens.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "cpu/sample.h"
#include "kernels/sample.h"
#include "wgllm/wgllm.h"

namespace wgllm {

// A candidate after the filters: token id and its probability.
struct TokenProb {
  int32_t id;
  float p;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token with the step's uniform (next_uniform()); `logits` is [n_vocab]. Remembers the token for
  // the repetition penalty.
  int32_t sample(std::span<const float> logits);
  // The uniform in [0, 1) of the next step (the generator advances once; greedy: 0 and no advance). A caller that
  // samples elsewhere (on the GPU) takes one per step, in step order, and accept()s each token, so it chooses what
  // sample() would.
  float next_uniform();
  const SamplingParams& params() const { return params_; }
  // The recent tokens the penalty looks at, oldest first.
  const std::deque<int32_t>& recent() const { return recent_; }
  // Records prompt tokens (or any token chosen elsewhere) for the repetition penalty.
  void accept(int32_t id);
  // sample() is the argmax of the logits as they come (greedy without a repetition penalty).
  bool argmax_only() const { return params_.temperature <= 0 && params_.repeat_penalty == 1.f; }

  // The distribution sample() draws from (after penalty and filters), sorted by falling probability (ties: rising
  // id). Greedy gives one candidate with p = 1.
  std::vector<TokenProb> distribution(std::span<const float> logits) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;  // the last repeat_last_n tokens
};

// In place: logits of `recent` tokens (each once) multiplied by 1 / penalty (f32) when positive, by penalty otherwise.
// The kernel's settings for these parameters, and the reference's (the same fields).
kernels::SampleSettings sample_settings(const SamplingParams& p);
cpu::SampleSettings reference_settings(const SamplingParams& p);

void apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> recent, float penalty);

}  // namespace wgllm

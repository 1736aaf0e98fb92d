// Token sampling from logits (llama.cpp semantics): repetition penalty over the last N tokens, then top-k, top-p,
// min-p and temperature, then a draw from std::mt19937_64. Temperature <= 0 is greedy.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

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

  // Picks the next token; `logits` is [n_vocab]. Remembers the token for the repetition penalty.
  int32_t sample(std::span<const float> logits);
  // Records prompt tokens (or any token chosen elsewhere) for the repetition penalty.
  void accept(int32_t id);
  // sample() is the argmax of the logits as they come (greedy without a repetition penalty): the GPU can choose.
  bool argmax_only() const { return params_.temperature <= 0 && params_.repeat_penalty == 1.f; }

  // The distribution sample() draws from (after penalty and filters), sorted by falling probability. Greedy gives
  // one candidate with p = 1.
  std::vector<TokenProb> distribution(std::span<const float> logits) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::deque<int32_t> recent_;  // the last repeat_last_n tokens
};

// In place: logits of `recent` tokens (each once) divided by penalty when positive, multiplied when negative.
void apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> recent, float penalty);

}  // namespace wgllm

// The sampling algorithm of wgllm written plainly over a std::vector: the ground truth of sample.wgsl and what
// api's Sampler runs on the host, so the two paths choose the same token for the same uniform u (up to
// floating-point ties: the GPU sums in f32, this in f64).
//   1. penalty   every recent id (each once) in range: logit * (1 / penalty) when > 0, logit * penalty otherwise
//                (1 / penalty rounded to f32 first: llama.cpp divides, which a GPU does not round exactly)
//   2. greedy    temperature <= 0: the largest penalised logit, the lowest id among equals
//   3. top-k     the k first in the order (logit falling, id rising); 0 or >= n: off
//   4. top-p     w = exp(logit - max) over the survivors: keep logit >= T for the largest logit T whose mass
//                sum(w, logit >= T) >= top_p * sum(w) (tokens equal to T are kept together); 1: off
//   5. min-p     keep w >= min_p; 0: off
//   6. draw      q = exp((logit - max) / temperature); with target = u * sum(q), the first survivor in rising id
//                order whose running sum of q exceeds target (the last survivor when rounding leaves none)
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace wgllm::cpu {

// The filters of one sampling mode; the same fields as kernels::SampleSettings (a peer layer, so a twin).
struct SampleSettings {
  float temperature = 1.f;     // <= 0: greedy
  uint32_t top_k = 0;          // 0 or >= n: off
  float top_p = 1.f;           // 1: off
  float min_p = 0.f;           // 0: off
  float repeat_penalty = 1.f;  // 1: off
};

struct SampledProb {
  int32_t id;
  double p;
};

// The penalised logits (step 1).
std::vector<float> penalised_logits(std::span<const float> logits, std::span<const int32_t> recent, float penalty);

// The survivors of steps 1-5 with their probabilities of step 6, in rising id order; greedy: the argmax with p 1.
// Empty when a logit is NaN or infinite.
std::vector<SampledProb> sample_distribution(std::span<const float> logits, std::span<const int32_t> recent,
                                             const SampleSettings& s);

// The id step 6 draws with u in [0, 1) (any u for greedy); -1 when a logit is NaN or infinite.
int32_t sample_reference(std::span<const float> logits, std::span<const int32_t> recent, const SampleSettings& s,
                         float u);

// The uniform of one step from 64 random bits: their top 24 as a float in [0, 1) (exact in f32, what the GPU gets).
inline float uniform_from_bits(uint64_t bits) { return float(bits >> 40) * 0x1p-24f; }

}  // namespace wgllm::cpu

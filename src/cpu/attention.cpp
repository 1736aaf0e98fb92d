#include "cpu/attention.h"

#include <algorithm>
#include <cmath>

namespace wgllm::cpu {

std::vector<float> attention(const AttentionRef& p, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v) {
  const uint32_t D = p.head_dim, group = p.n_heads / p.n_kv_heads;
  const size_t q_dim = size_t(p.n_heads) * D, kv_dim = size_t(p.n_kv_heads) * D;
  std::vector<float> out(p.n_queries * q_dim);
  std::vector<double> scores, acc(D);
  for (uint32_t i = 0; i < p.n_queries; ++i) {
    const size_t pos = size_t(p.start_pos) + i;
    const size_t first = p.window && pos + 1 > p.window ? pos + 1 - p.window : 0;  // keys [first, pos]
    for (uint32_t h = 0; h < p.n_heads; ++h) {
      const float* qh = &q[i * q_dim + h * D];
      const size_t kv_off = size_t(h / group) * D;
      scores.assign(pos + 1, 0.0);
      double max_score = -INFINITY;
      for (size_t t = first; t <= pos; ++t) {
        double dot = 0;
        for (uint32_t d = 0; d < D; ++d) dot += double(qh[d]) * double(k[t * kv_dim + kv_off + d]);
        scores[t] = dot * double(p.scale);
        max_score = std::max(max_score, scores[t]);
      }
      double sum = p.sinks.empty() ? 0.0 : std::exp(double(p.sinks[h]) - max_score);
      for (size_t t = first; t <= pos; ++t) sum += (scores[t] = std::exp(scores[t] - max_score));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t t = first; t <= pos; ++t)
        for (uint32_t d = 0; d < D; ++d) acc[d] += scores[t] * double(v[t * kv_dim + kv_off + d]);
      for (uint32_t d = 0; d < D; ++d) out[i * q_dim + h * D + d] = float(acc[d] / sum);
    }
  }
  return out;
}

}  // namespace wgllm::cpu

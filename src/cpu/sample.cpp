#include "cpu/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace wgllm::cpu {

std::vector<float> penalised_logits(std::span<const float> logits, std::span<const int32_t> recent, float penalty) {
  std::vector<float> l(logits.begin(), logits.end());
  if (penalty == 1.f) return l;
  const float inv = 1.f / penalty;
  for (int32_t id : recent) {
    if (id < 0 || size_t(id) >= l.size()) continue;
    const float v = logits[id];  // from the original: an id that occurs twice is penalised once
    l[id] = v > 0 ? v * inv : v * penalty;
  }
  return l;
}

std::vector<SampledProb> sample_distribution(std::span<const float> logits, std::span<const int32_t> recent,
                                             const SampleSettings& s) {
  for (float v : logits)
    if (!std::isfinite(v)) return {};
  const std::vector<float> l = penalised_logits(logits, recent, s.repeat_penalty);
  const size_t n = l.size();
  const int32_t best = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  if (s.temperature <= 0) return {{best, 1.0}};
  const double m = l[best];
  // 3. top-k: the first k in (logit falling, id rising)
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = s.top_k == 0 || s.top_k >= n ? n : s.top_k;
  auto before = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  if (k < n) {
    std::nth_element(ids.begin(), ids.begin() + k, ids.end(), before);
    ids.resize(k);
  }
  // 4. top-p: walk the groups of equal logits from the top until their mass reaches top_p of the whole
  if (s.top_p < 1.f) {
    std::sort(ids.begin(), ids.end(), before);
    double z = 0;
    for (int32_t i : ids) z += std::exp(double(l[i]) - m);
    const double target = double(s.top_p) * z;
    double cum = 0;
    size_t keep = 0;
    while (keep < ids.size()) {
      const float group = l[ids[keep]];
      while (keep < ids.size() && l[ids[keep]] == group) cum += std::exp(double(l[ids[keep++]]) - m);
      if (cum >= target) break;
    }
    ids.resize(keep);
  }
  // 5. min-p
  if (s.min_p > 0.f) std::erase_if(ids, [&](int32_t i) { return std::exp(double(l[i]) - m) < double(s.min_p); });
  // 6. the probabilities at the temperature, in rising id order
  std::sort(ids.begin(), ids.end());
  std::vector<SampledProb> out;
  double z = 0;
  for (int32_t i : ids) {
    const double q = std::exp((double(l[i]) - m) / s.temperature);
    out.push_back({i, q});
    z += q;
  }
  for (SampledProb& t : out) t.p /= z;
  return out;
}

int32_t sample_reference(std::span<const float> logits, std::span<const int32_t> recent, const SampleSettings& s,
                         float u) {
  const std::vector<SampledProb> d = sample_distribution(logits, recent, s);
  if (d.empty()) return -1;
  // The unnormalised q of step 6 would give the same choice; the probabilities sum to 1 up to rounding.
  double z = 0;
  for (const SampledProb& t : d) z += t.p;
  const double target = double(u) * z;
  double cum = 0;
  for (const SampledProb& t : d) {
    cum += t.p;
    if (target < cum) return t.id;
  }
  return d.back().id;
}

}  // namespace wgllm::cpu

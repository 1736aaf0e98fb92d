#include "api/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_set>

#include "wgllm/error.h"

namespace wgllm {

namespace {
// "2", "-0.5", "nan", "inf": as a user typed it, without trailing zeros.
std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

void apply_repetition_penalty(std::vector<float>& logits, std::span<const int32_t> recent, float penalty) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : recent) {
    if (id < 0 || size_t(id) >= logits.size() || !seen.insert(id).second) continue;
    float& l = logits[id];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

void validate(const SamplingParams& p) {
  auto bad = [](const char* name, double v, const char* range) {
    throw InvalidArgument(std::string("sampling: ") + name + " " + format_number(v) + " is out of range (" + range +
                          ")");
  };
  if (!std::isfinite(p.temperature)) bad("temperature", p.temperature, "finite; <= 0 is greedy");
  if (!(p.top_p >= 0 && p.top_p <= 1)) bad("top_p", p.top_p, "0 to 1; 1 is off");
  if (!(p.min_p >= 0 && p.min_p <= 1)) bad("min_p", p.min_p, "0 to 1; 0 is off");
  if (!std::isfinite(p.repeat_penalty) || !(p.repeat_penalty > 0))
    bad("repeat_penalty", p.repeat_penalty, "finite and > 0; 1 is off");
  if (p.repeat_last_n < -1) bad("repeat_last_n", p.repeat_last_n, ">= -1; -1 is every token, 0 none");
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { validate(params); }

void Sampler::accept(int32_t id) {
  if (params_.repeat_last_n == 0) return;
  recent_.push_back(id);
  if (params_.repeat_last_n > 0 && recent_.size() > size_t(params_.repeat_last_n)) recent_.pop_front();
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits_in) const {
  // A penalised copy only when there is a penalty (a copy of 128k logits costs more than the argmax).
  std::vector<float> penalised;
  if (params_.repeat_penalty != 1.0f) {
    penalised.assign(logits_in.begin(), logits_in.end());
    const std::vector<int32_t> recent(recent_.begin(), recent_.end());
    apply_repetition_penalty(penalised, recent, params_.repeat_penalty);
  }
  const std::span<const float> logits = penalised.empty() ? logits_in : std::span<const float>(penalised);
  if (params_.temperature <= 0) {
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    return {{int32_t(best), 1.0f}};
  }
  // Candidates sorted by falling logit (ties: lower id first), cut to top-k.
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  size_t n = ids.size();
  if (params_.top_k > 0) n = std::min<size_t>(n, size_t(params_.top_k));
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), by_logit);
  ids.resize(n);

  // Softmax at temperature 1 for the top-p / min-p cuts (llama.cpp applies temperature last).
  auto softmax = [&](float temp) {
    std::vector<double> p(ids.size());
    const double top = logits[ids[0]];
    double sum = 0;
    for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((double(logits[ids[i]]) - top) / temp);
    for (double& v : p) v /= sum;
    return p;
  };
  std::vector<double> p = softmax(1.0f);
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < p.size()) {
      cum += p[keep++];
      if (cum >= params_.top_p) break;
    }
    ids.resize(std::max<size_t>(keep, 1));
    p = softmax(1.0f);
  }
  if (params_.min_p > 0.0f) {
    const double cut = params_.min_p * p[0];
    size_t keep = 1;
    while (keep < p.size() && p[keep] >= cut) ++keep;
    ids.resize(keep);
  }
  p = softmax(params_.temperature);
  std::vector<TokenProb> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = {ids[i], float(p[i])};
  return out;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::vector<TokenProb> d = distribution(logits);
  int32_t id = d[0].id;
  if (d.size() > 1) {
    // Inverse CDF with a double in [0, 1) from the 64-bit generator.
    const double u = double(rng_() >> 11) * 0x1.0p-53;
    double cum = 0;
    id = d.back().id;
    for (const TokenProb& t : d) {
      cum += t.p;
      if (u < cum) {
        id = t.id;
        break;
      }
    }
  }
  accept(id);
  return id;
}

}  // namespace wgllm

#include "api/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cpu/sample.h"
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
  logits = cpu::penalised_logits(logits, recent, penalty);
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

kernels::SampleSettings sample_settings(const SamplingParams& p) {
  return {.temperature = p.temperature,
          .top_k = uint32_t(std::max(0, p.top_k)),
          .top_p = p.top_p,
          .min_p = p.min_p,
          .repeat_penalty = p.repeat_penalty};
}

cpu::SampleSettings reference_settings(const SamplingParams& p) {
  const kernels::SampleSettings k = sample_settings(p);
  return {.temperature = k.temperature,
          .top_k = k.top_k,
          .top_p = k.top_p,
          .min_p = k.min_p,
          .repeat_penalty = k.repeat_penalty};
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits) const {
  const std::vector<int32_t> recent(recent_.begin(), recent_.end());
  std::vector<TokenProb> out;
  for (const cpu::SampledProb& t : cpu::sample_distribution(logits, recent, reference_settings(params_)))
    out.push_back({t.id, float(t.p)});
  std::stable_sort(out.begin(), out.end(), [](const TokenProb& a, const TokenProb& b) { return a.p > b.p; });
  return out;
}

float Sampler::next_uniform() { return params_.temperature > 0 ? cpu::uniform_from_bits(rng_()) : 0.f; }

int32_t Sampler::sample(std::span<const float> logits) {
  const float u = next_uniform();
  const std::vector<int32_t> recent(recent_.begin(), recent_.end());
  const int32_t id = cpu::sample_reference(logits, recent, reference_settings(params_), u);
  if (id < 0) throw InvalidArgument("Sampler::sample: the logits are not finite (NaN or infinity)");
  accept(id);
  return id;
}

}  // namespace wgllm

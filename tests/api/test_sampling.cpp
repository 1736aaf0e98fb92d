// Sampling on hand-built logits: each option changes the distribution as llama.cpp does, and draws with a fixed
// seed follow the distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "api/sampling.h"
#include "cpu/sample.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

// logits = log(p) for probabilities 0.4, 0.3, 0.15, 0.1, 0.05.
std::vector<float> five() {
  std::vector<float> l;
  for (double p : {0.4, 0.3, 0.15, 0.1, 0.05}) l.push_back(float(std::log(p)));
  return l;
}

SamplingParams plain() { return {.temperature = 1.f, .top_k = 0, .top_p = 1.f, .min_p = 0.f}; }

std::map<int32_t, double> probs(const SamplingParams& sp, const std::vector<float>& logits) {
  std::map<int32_t, double> m;
  for (const TokenProb& t : Sampler(sp).distribution(logits)) m[t.id] = t.p;
  return m;
}

TEST(Sampling, NoFiltersKeepSoftmax) {
  const auto m = probs(plain(), five());
  ASSERT_EQ(m.size(), 5u);
  EXPECT_NEAR(m.at(0), 0.4, 1e-6);
  EXPECT_NEAR(m.at(4), 0.05, 1e-6);
}

TEST(Sampling, GreedyIsArgmaxAndDeterministic) {
  SamplingParams sp = plain();
  sp.temperature = 0;
  std::vector<float> l = five();
  l[3] = 5;
  Sampler a(sp), b(sp);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(a.sample(l), 3);
    EXPECT_EQ(b.sample(l), 3);
  }
}

TEST(Sampling, TopKKeepsTheKBest) {
  SamplingParams sp = plain();
  sp.top_k = 2;
  const auto m = probs(sp, five());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_NEAR(m.at(0), 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(m.at(1), 0.3 / 0.7, 1e-6);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  SamplingParams sp = plain();
  sp.top_p = 0.8f;  // 0.4 + 0.3 = 0.7 < 0.8, + 0.15 = 0.85 >= 0.8
  const auto m = probs(sp, five());
  ASSERT_EQ(m.size(), 3u);
  EXPECT_NEAR(m.at(2), 0.15 / 0.85, 1e-6);
}

TEST(Sampling, MinPIsRelativeToTheBest) {
  SamplingParams sp = plain();
  sp.min_p = 0.3f;  // keeps p >= 0.12
  const auto m = probs(sp, five());
  ASSERT_EQ(m.size(), 3u);
  EXPECT_NEAR(m.at(0), 0.4 / 0.85, 1e-6);
}

TEST(Sampling, TemperatureSharpensAndFlattens) {
  SamplingParams sp = plain();
  sp.temperature = 0.5f;  // p^2 renormalised
  const double z = 0.16 + 0.09 + 0.0225 + 0.01 + 0.0025;
  EXPECT_NEAR(probs(sp, five()).at(0), 0.16 / z, 1e-6);
  sp.temperature = 100.f;
  EXPECT_NEAR(probs(sp, five()).at(4), 0.2, 0.01);
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  std::vector<float> l{2.f, -2.f, 1.f};
  const std::vector<int32_t> recent{0, 1, 0};
  apply_repetition_penalty(l, recent, 2.f);
  EXPECT_FLOAT_EQ(l[0], 1.f);  // once, although it occurs twice
  EXPECT_FLOAT_EQ(l[1], -4.f);
  EXPECT_FLOAT_EQ(l[2], 1.f);  // not recent
}

TEST(Sampling, RepetitionPenaltyLooksAtTheLastNOnly) {
  SamplingParams sp = plain();
  sp.temperature = 0;
  sp.repeat_penalty = 10.f;
  sp.repeat_last_n = 2;
  Sampler s(sp);
  const std::vector<float> l{3.f, 2.f, 1.f};
  s.accept(0);
  EXPECT_EQ(s.sample(l), 1);  // 0 penalised to 0.3
  s.accept(2);
  s.accept(2);  // 0 and 1 have left the window of 2
  EXPECT_EQ(s.sample(l), 0);
}

TEST(Sampling, DrawsFollowTheDistribution) {
  SamplingParams sp = plain();
  sp.top_k = 4;  // 0.4, 0.3, 0.15, 0.1 renormalised by 0.95
  sp.seed = 1234;
  Sampler s(sp);
  const auto l = five();
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[s.sample(l)];
  EXPECT_EQ(count.count(4), 0u);
  for (auto [id, p] : std::map<int32_t, double>{{0, 0.4}, {1, 0.3}, {2, 0.15}, {3, 0.1}})
    EXPECT_NEAR(count[id] / double(n), p / 0.95, 0.01) << "token " << id;
}

// A step takes exactly one uniform and chooses what cpu::sample_reference chooses with it (the GPU's contract).
TEST(Sampling, OneUniformPerStepAsTheReference) {
  SamplingParams sp = plain();
  sp.top_k = 3;
  sp.seed = 5;
  Sampler a(sp), b(sp);
  const auto l = five();
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    const float u = b.next_uniform();
    const int32_t want = cpu::sample_reference(l, {}, reference_settings(sp), u);
    ASSERT_EQ(a.sample(l), want) << "step " << i;
    ++seen[want];
  }
  EXPECT_EQ(seen.size(), 3u);
  sp.temperature = 0;  // greedy takes none
  Sampler g(sp);
  EXPECT_EQ(g.next_uniform(), 0.f);
}

TEST(Sampling, SameSeedSameTokens) {
  SamplingParams sp = plain();
  sp.seed = 99;
  Sampler a(sp), b(sp);
  const auto l = five();
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.sample(l), b.sample(l));
}

// Every parameter out of its range is refused by name, by the sampler itself and by validate(); the edges are allowed.
TEST(Sampling, ParametersOutOfRangeAreRefusedByName) {
  const float nan = std::nanf(""), inf = INFINITY;
  const std::pair<const char*, std::function<void(SamplingParams&)>> bad[] = {
      {"temperature nan", [&](auto& p) { p.temperature = nan; }},
      {"temperature inf", [&](auto& p) { p.temperature = inf; }},
      {"top_p 2", [](auto& p) { p.top_p = 2; }},
      {"top_p -1", [](auto& p) { p.top_p = -1; }},
      {"top_p nan", [&](auto& p) { p.top_p = nan; }},
      {"min_p 2", [](auto& p) { p.min_p = 2; }},
      {"min_p -0.5", [](auto& p) { p.min_p = -0.5f; }},
      {"repeat_penalty 0", [](auto& p) { p.repeat_penalty = 0; }},
      {"repeat_penalty -1", [](auto& p) { p.repeat_penalty = -1; }},
      {"repeat_penalty inf", [&](auto& p) { p.repeat_penalty = inf; }},
      {"repeat_last_n -2", [](auto& p) { p.repeat_last_n = -2; }},
  };
  for (const auto& [what, edit] : bad) {
    SamplingParams p = plain();
    edit(p);
    for (int via_sampler = 0; via_sampler < 2; ++via_sampler) {
      try {
        if (via_sampler)
          Sampler{p};
        else
          validate(p);
        ADD_FAILURE() << "accepted " << what;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("sampling: ") + what + " is out of range"), std::string::npos)
            << e.what();
      }
    }
  }
  for (auto edit : std::initializer_list<std::function<void(SamplingParams&)>>{
           [](auto& p) { p.temperature = -1; }, [](auto& p) { p.top_p = 0; }, [](auto& p) { p.top_p = 1; },
           [](auto& p) { p.min_p = 1; }, [](auto& p) { p.repeat_last_n = -1; }, [](auto& p) { p.top_k = -5; }}) {
    SamplingParams p = plain();
    edit(p);
    EXPECT_NO_THROW(validate(p));
  }
}

}  // namespace
}  // namespace wgllm

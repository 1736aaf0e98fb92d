// wgllm::perplexity and its pieces: the estimate and its uncertainty against a two-pass computation, token_nll
// against a long-double log-sum-exp, and the whole computation on a test model against the CPU reference forward
// (chunks, the BOS that replaces each chunk's first token, the scored second half) with the formula written out
// here. llama.cpp itself is compared in tests/cli/test_llamacpp.cpp.
#include "wgllm/perplexity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gguf/file.h"
#include "model/reference.h"
#include "model_util.h"
#include "test_util.h"

namespace wgllm {
namespace {

// exp(mean) and exp(mean) * sqrt(population variance / (n - 1)), the variance from the mean (two passes).
std::pair<double, double> two_pass(const std::vector<double>& x) {
  long double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= x.size();
  for (double v : x) var += (v - mean) * (v - mean);
  var /= x.size();
  const double ppl = double(std::exp(mean));
  return {ppl, double(std::sqrt(var / (x.size() - 1)) * ppl)};
}

TEST(PerplexityStats, MatchesTwoPassFormula) {
  auto gen = test::rng(1);
  for (size_t n : {2, 3, 17, 1000}) {
    std::uniform_real_distribution<double> d(0.0, std::uniform_real_distribution<double>(0.5, 12.0)(gen));
    std::vector<double> x(n);
    PerplexityStats s;
    for (double& v : x) s.add(v = d(gen));
    const auto [ppl, err] = two_pass(x);
    EXPECT_EQ(s.count(), n);
    EXPECT_NEAR(s.ppl() / ppl, 1.0, 1e-12) << n;
    EXPECT_NEAR(s.uncertainty() / err, 1.0, 1e-6) << n;
  }
  PerplexityStats empty, one, same;
  EXPECT_TRUE(std::isnan(empty.ppl()));
  one.add(2.0);
  EXPECT_NEAR(one.ppl(), std::exp(2.0), 1e-12);
  EXPECT_TRUE(std::isnan(one.uncertainty()));
  for (int i = 0; i < 5; ++i) same.add(1.5);  // no spread: no uncertainty (llama.cpp prints none either)
  EXPECT_TRUE(std::isnan(same.uncertainty()));
}

TEST(TokenNll, MatchesLongDoubleLogSumExp) {
  auto gen = test::rng(2);
  for (size_t n : {1, 2, 1000, 262144}) {
    for (float offset : {0.f, 80.f, -1000.f}) {  // exp of the raw logits would overflow / underflow
      std::vector<float> l = test::random_floats(n, gen, -20.f, 20.f);
      for (float& v : l) v += offset;
      const int32_t target = std::uniform_int_distribution<int32_t>(0, int32_t(n) - 1)(gen);
      long double m = l[0], sum = 0;
      for (float v : l) m = std::max<long double>(m, v);
      for (float v : l) sum += std::exp((long double)v - m);
      const double want = double(m + std::log(sum) - l[target]);
      EXPECT_NEAR(token_nll(l, target), want, 1e-6 * std::max(1.0, std::abs(want))) << n << " " << offset;
    }
  }
  const std::vector<float> l(4, 0.f);
  EXPECT_NEAR(token_nll(l, 3), std::log(4.0), 1e-12);
  EXPECT_THROW(token_nll(l, 4), InvalidArgument);
  EXPECT_THROW(token_nll(l, -1), InvalidArgument);
}

// A test model, or "default": the built-in tiny Shakespeare model (trained; its vocabulary adds no BOS).
std::string path_of(const std::string& name) {
  return name == "default" ? std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf"
                           : test::model_path(name);
}

Model load(const std::string& name, uint32_t n_ctx, uint32_t ubatch) {
  LoadOptions o;
  o.n_ctx = n_ctx;
  o.ubatch = ubatch;
  return Model::load(path_of(name), o);
}

std::string shakespeare(size_t bytes) {
  std::ifstream in(std::string(WGLLM_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.substr(0, bytes);
}

// The perplexity of `text` written out on the CPU reference: chunks of n_ctx tokens, BOS first when added, the
// logits at positions n_ctx/2 .. n_ctx-2 scored against the next token.
struct Expected {
  std::vector<double> running;
  double ppl, err;
};
Expected cpu_perplexity(const std::string& model_name, const Model& model, const std::string& text, uint32_t n_ctx,
                        uint32_t n_chunks, bool add_bos) {
  const GgufFile f = GgufFile::open(path_of(model_name));
  const cpu::CpuModel cm = cpu::load_cpu_model(f);
  const std::vector<int32_t> tokens = model.encode(text, true, false);
  std::vector<double> nll;
  Expected e;
  for (uint32_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (add_bos) chunk[0] = model.bos();
    cpu::CpuSession cs(cm, n_ctx);
    const auto logits = cs.forward_all(chunk);
    for (uint32_t i = n_ctx / 2; i + 1 < n_ctx; ++i) {
      long double m = logits[i][0], sum = 0;
      for (float v : logits[i]) m = std::max<long double>(m, v);
      for (float v : logits[i]) sum += std::exp((long double)v - m);
      nll.push_back(double(m + std::log(sum) - logits[i][chunk[i + 1]]));
    }
    e.running.push_back(two_pass(nll).first);
  }
  std::tie(e.ppl, e.err) = two_pass(nll);
  return e;
}

struct PplCase {
  std::string model;
  bool add_bos;
  uint32_t n_ctx, n_batch;
  int32_t n_chunks;
  size_t text_bytes;
  uint32_t want_chunks;  // 0: every whole chunk of the text
};

std::ostream& operator<<(std::ostream& o, const PplCase& c) {
  return o << c.model << " n_ctx " << c.n_ctx << " n_batch " << c.n_batch << " chunks " << c.n_chunks;
}

class PerplexityVsCpu : public ::testing::TestWithParam<PplCase> {};

// The GPU's logits go through an f16 KV cache: ~3e-4 relative on the logits, well under 1e-3 on the estimate.
TEST_P(PerplexityVsCpu, MatchesFormulaOnReferenceLogits) {
  const PplCase& tc = GetParam();
  const Model model = load(tc.model, 64, 8);
  const std::string text = shakespeare(tc.text_bytes);
  std::vector<PerplexityChunk> seen;
  const PerplexityResult r =
      perplexity(model, text, {.n_ctx = tc.n_ctx, .n_batch = tc.n_batch, .n_chunks = tc.n_chunks},
                 [&](const PerplexityChunk& c) { seen.push_back(c); });
  ASSERT_EQ(r.n_chunks, tc.want_chunks ? tc.want_chunks : r.n_tokens / tc.n_ctx);
  ASSERT_GE(r.n_chunks, 2u);
  EXPECT_EQ(r.add_bos, tc.add_bos);
  EXPECT_EQ(r.n_batch, tc.n_batch < tc.n_ctx ? tc.n_batch : tc.n_batch / tc.n_ctx * tc.n_ctx);
  EXPECT_EQ(r.n_tokens, model.encode(text, true, false).size());
  EXPECT_EQ(r.n_scored, uint64_t(r.n_chunks) * (tc.n_ctx - tc.n_ctx / 2 - 1));
  const Expected e = cpu_perplexity(tc.model, model, text, tc.n_ctx, r.n_chunks, tc.add_bos);
  ASSERT_EQ(r.chunk_ppl.size(), e.running.size());
  ASSERT_EQ(seen.size(), e.running.size());
  for (size_t c = 0; c < e.running.size(); ++c) {
    EXPECT_NEAR(r.chunk_ppl[c] / e.running[c], 1.0, 1e-3) << "chunk " << c;
    EXPECT_EQ(seen[c].index, c);
    EXPECT_EQ(seen[c].n_chunks, r.n_chunks);
    EXPECT_EQ(seen[c].ppl, r.chunk_ppl[c]);
  }
  EXPECT_NEAR(r.ppl / e.ppl, 1.0, 1e-3);
  EXPECT_NEAR(r.uncertainty / e.err, 1.0, 1e-2);
  EXPECT_GT(r.eval_seconds, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Chunks, PerplexityVsCpu,
    ::testing::Values(PplCase{"llama-spm-f32", true, 16, 5, 4, 3000, 4},     // BOS replaces token 0; pieces of 5
                      PplCase{"llama-spm-f32", true, 24, 2048, -1, 500, 0},  // every chunk of a short text
                      PplCase{"default", false, 20, 45, 3, 3000, 3},         // no BOS; n_batch lowered to 40
                      PplCase{"llama-f32", true, 20, 30, 3, 3000, 3}),       // BOS; pieces of 20
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(Perplexity, BatchSizeDoesNotChangeTheResult) {
  const Model model = load("llama-spm-f32", 32, 32);
  const std::string text = shakespeare(2000);
  const double a = perplexity(model, text, {.n_ctx = 32, .n_batch = 7, .n_chunks = 3}).ppl;
  const double b = perplexity(model, text, {.n_ctx = 32, .n_batch = 64, .n_chunks = 3}).ppl;
  EXPECT_NEAR(a / b, 1.0, 1e-5);
}

TEST(Perplexity, RefusesWhatLlamaPerplexityRefuses) {
  const Model model = load("llama-spm-f32", 32, 512);
  const std::string text = shakespeare(2000);
  auto message = [&](PerplexityOptions o, const std::string& t) {
    try {
      perplexity(model, t, o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.n_ctx = 16, .n_batch = 0}, text).find("at least 1"), std::string::npos);
  EXPECT_NE(message({.n_ctx = 64}, text).find("context of 32"), std::string::npos);
  EXPECT_NE(message({.n_ctx = 2}, text).find("at least 3"), std::string::npos);
  const std::string short_text = shakespeare(30);
  const size_t n = model.encode(short_text, true, false).size();
  ASSERT_LE(n / 2 + 1, 32u);
  const std::string e = message({.n_ctx = uint32_t(std::max<size_t>(3, n / 2 + 1))}, short_text);
  EXPECT_NE(e.find("fewer than"), std::string::npos) << e;
}

}  // namespace
}  // namespace wgllm

// The CPU reference forward pass against transformers fixtures, across storage types, and its KV cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "gguf/file.h"
#include "model/reference.h"
#include "model_util.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

using cpu::CpuModel;
using cpu::CpuSession;

// Each test model loaded once per process.
const CpuModel& model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<CpuModel>> cache;
  auto& m = cache[name];
  if (!m) m = std::make_unique<CpuModel>(cpu::load_cpu_model(GgufFile::open(test::model_path(name))));
  return *m;
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// bos + n-1 random ids below n_vocab.
std::vector<int32_t> random_prompt(const CpuModel& m, size_t n, uint64_t salt) {
  auto gen = test::rng(salt);
  std::uniform_int_distribution<int32_t> d(0, int32_t(m.config.n_vocab) - 1);
  std::vector<int32_t> p{0};
  while (p.size() < n) p.push_back(d(gen));
  return p;
}

// ---- (a) against the transformers reference fixtures

class CpuForwardRef : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuForwardRef, LogitsAndGreedyMatchTransformers) {
  const std::string name = GetParam();
  const test::RefFixture fx = test::read_ref_fixture(test::ref_dir() + "/" + name + ".ref.gguf");
  const GgufFile f = GgufFile::open(test::model_path(name));
  ASSERT_EQ(test::tensor_digest(f), fx.strings.at("reference.tensor_sha256"))
      << test::model_path(name) << " is not the model the fixture was made from (tensor digest differs): the "
      << "tooling changed; regenerate the fixtures as tests/data/models/README.md says";
  const CpuModel m = cpu::load_cpu_model(f);
  ASSERT_EQ(fx.prompts.size(), 3u);
  for (size_t p = 0; p < fx.prompts.size(); ++p) {
    const test::RefPrompt& rp = fx.prompts[p];
    SCOPED_TRACE("prompt " + std::to_string(p) + " (" + std::to_string(rp.tokens.size()) + " tokens)");
    CpuSession s(m);
    const auto logits = s.forward_all(rp.tokens);
    double worst = 0;
    for (size_t r = 0; r < rp.logit_positions.size(); ++r) {
      const int32_t pos = rp.logit_positions[r];
      const auto e = test::compare(logits[pos], rp.logits[r]);
      worst = std::max(worst, e.rel_l2);
      EXPECT_LE(e.rel_l2, 1e-4) << "position " << pos << ": " << e.describe();
    }
    std::vector<int32_t> greedy;
    std::vector<float> last = logits.back();
    while (greedy.size() < rp.greedy.size()) {
      const int32_t t = argmax(last);
      greedy.push_back(t);
      last = s.forward(std::span(&t, 1));
    }
    EXPECT_EQ(greedy, rp.greedy);
    std::printf("%s prompt %zu: worst rel L2 vs transformers %.3g\n", name.c_str(), p, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuForwardRef,
                         ::testing::Values("llama-f32", "qwen2-f32", "qwen3-f32", "llama-rope3-tied-f32",
                                           "qwen2-tied-f32", "gemma3-tiny-f32", "lfm2-tiny-f32", "lfm2-tiny-l4-f32",
                                           "lfm2-tiny-mha-f32", "qwen3moe-tiny-f32", "qwen3moe-tiny-k4-f32",
                                           "qwen3moe-tiny-k1-f32", "lfm2moe-tiny-f32", "lfm2moe-tiny-k4-f32",
                                           "gpt-oss-tiny-f32", "gpt-oss-tiny-k4-f32", "qwen35-tiny-f32",
                                           "qwen35-tiny-k32-f32", "gemma4-tiny-f32", "gemma4-tiny-kv-f32"),
                         test::model_param_name);

// ---- (b) every storage type against its F32 twin, and the KV cache

// Measured over 12 seeds (mean / worst rel L2 over 40 positions): f16 5e-4 / 8e-4, bf16 4e-3 / 9e-3,
// q8_0 1.3e-2 / 2.1e-2, q4_0 0.21 / 0.35; tied models about twice that (the quantised embedding is also the output
// matrix, behind a large final-norm gain). Thresholds leave ~2x margin. Uncorrelated logits (e.g. Q4_0 nibbles in
// the wrong order, a wrong RoPE layout) give ~1.4.
struct QuantCase {
  std::string name, f32_twin;
  double max_mean, max_worst;  // mean over positions, and any one position
};
void PrintTo(const QuantCase& c, std::ostream* os) { *os << c.name << " vs " << c.f32_twin; }

class CpuForwardQuant : public ::testing::TestWithParam<QuantCase> {};

TEST_P(CpuForwardQuant, LogitsCloseToF32Twin) {
  const QuantCase& c = GetParam();
  const CpuModel& q = model(c.name);
  const CpuModel& ref = model(c.f32_twin);
  const auto prompt = random_prompt(ref, 40, 1);
  CpuSession sq(q), sr(ref);
  const auto lq = sq.forward_all(prompt), lr = sr.forward_all(prompt);
  double worst = 0, sum = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const auto e = test::compare(lq[t], lr[t]);
    worst = std::max(worst, e.rel_l2);
    sum += e.rel_l2;
    EXPECT_LE(e.rel_l2, c.max_worst) << "position " << t << ": " << e.describe();
  }
  const double mean = sum / double(prompt.size());
  EXPECT_LE(mean, c.max_mean);
  std::printf("%s vs %s: rel L2 mean %.3g (limit %.3g), worst %.3g (limit %.3g)\n", c.name.c_str(), c.f32_twin.c_str(),
              mean, c.max_mean, worst, c.max_worst);
}

std::vector<QuantCase> quant_cases() {
  const std::map<std::string, std::pair<double, double>> limit = {
      {"f16", {2.5e-3, 5e-3}}, {"bf16", {1.5e-2, 3e-2}}, {"q8_0", {4e-2, 8e-2}}, {"q4_0", {0.35, 0.6}}};
  std::vector<QuantCase> v;
  auto add = [&](const std::string& stem, const std::string& t, double factor) {
    const auto [mean, worst] = limit.at(t);
    v.push_back({stem + "-" + t, stem + "-f32", mean * factor, worst * factor});
  };
  for (const char* arch : {"llama", "qwen2", "qwen3"})
    for (const char* t : {"f16", "bf16", "q8_0", "q4_0"}) add(arch, t, 1);
  add("llama-rope3-tied", "q8_0", 2);
  add("llama-rope3-tied", "q4_0", 2);
  add("qwen2-tied", "q8_0", 2);
  return v;
}

std::string case_name(const std::string& s) {
  std::string r = s;
  std::replace(r.begin(), r.end(), '-', '_');
  return r;
}

INSTANTIATE_TEST_SUITE_P(Models, CpuForwardQuant, ::testing::ValuesIn(quant_cases()),
                         [](const auto& info) { return case_name(info.param.name); });

// What real bugs give, against the limits above: the same model with the wrong RoPE layout (a bug of every storage
// type, caught by F32 vs the fixtures and by the F16 / BF16 / Q8_0 limits, not by the Q4_0 one), and Q4_0 with each
// block's two nibble halves swapped (as a wrong nibble order would read them: far above even the tied Q4_0 limit).
double mean_rel_l2(const CpuModel& a, const CpuModel& b, const std::vector<int32_t>& prompt) {
  CpuSession sa(a), sb(b);
  const auto la = sa.forward_all(prompt), lb = sb.forward_all(prompt);
  double sum = 0;
  for (size_t t = 0; t < prompt.size(); ++t) sum += test::compare(la[t], lb[t]).rel_l2;
  return sum / double(prompt.size());
}

TEST(CpuForward, RealBugsExceedQuantThresholds) {
  const CpuModel& ref = model("llama-f32");
  const auto prompt = random_prompt(ref, 40, 3);
  CpuModel wrong_rope = ref;
  wrong_rope.config.rope_type = RopeType::Neox;
  CpuModel swapped = model("llama-q4_0");
  for (auto& L : swapped.weights.layers)
    for (auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      for (size_t b = 0; b < w->size(); b += 32)
        std::swap_ranges(w->begin() + b, w->begin() + b + 16, w->begin() + b + 16);
  const double rope_err = mean_rel_l2(wrong_rope, ref, prompt), nibble_err = mean_rel_l2(swapped, ref, prompt);
  std::printf("wrong RoPE layout: mean rel L2 %.3g; swapped Q4_0 nibbles: %.3g\n", rope_err, nibble_err);
  EXPECT_GT(rope_err, 0.16);   // 2x the tied Q8_0 mean limit
  EXPECT_GT(nibble_err, 0.7);  // the tied Q4_0 mean limit
}

class CpuForwardCache : public ::testing::TestWithParam<std::string> {};

// One call over the prompt, token by token, and in uneven chunks all give the same logits.
TEST_P(CpuForwardCache, IncrementalEqualsOneCall) {
  const CpuModel& m = model(GetParam());
  const auto prompt = random_prompt(m, 33, 2);
  CpuSession whole(m), step(m), chunked(m);
  const auto all = whole.forward_all(prompt);
  EXPECT_EQ(whole.n_past(), prompt.size());
  double worst = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    const auto e = test::compare(step.forward(std::span(prompt).subspan(t, 1)), all[t]);
    worst = std::max(worst, e.rel_l2);
    EXPECT_LE(e.rel_l2, 1e-5) << "position " << t << ": " << e.describe();
  }
  size_t at = 0;
  for (size_t n : {5u, 1u, 17u, 10u}) {
    const auto part = chunked.forward(std::span(prompt).subspan(at, n));
    at += n;
    const auto e = test::compare(part, all[at - 1]);
    EXPECT_LE(e.rel_l2, 1e-5) << "chunk ending at " << at << ": " << e.describe();
  }
  EXPECT_EQ(step.n_past(), prompt.size());
  EXPECT_EQ(chunked.n_past(), prompt.size());
  std::printf("%s: one call vs token by token, worst rel L2 %.3g\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, CpuForwardCache,
                         ::testing::Values("llama-f32", "llama-f16", "llama-bf16", "llama-q8_0", "llama-q4_0",
                                           "qwen2-f32", "qwen2-f16", "qwen2-bf16", "qwen2-q8_0", "qwen2-q4_0",
                                           "qwen3-f32", "qwen3-f16", "qwen3-bf16", "qwen3-q8_0", "qwen3-q4_0",
                                           "llama-rope3-tied-f32", "llama-rope3-tied-q8_0", "llama-rope3-tied-q4_0",
                                           "qwen2-tied-f32", "qwen2-tied-q8_0", "llama-spm-f32", "gemma3-tiny-f32",
                                           "lfm2-tiny-f32", "lfm2-tiny-l4-f32", "qwen3moe-tiny-k4-f32",
                                           "lfm2moe-tiny-f32", "gpt-oss-tiny-f32", "qwen35-tiny-f32",
                                           "gemma4-tiny-f32", "gemma4-tiny-kv-f32"),
                         [](const auto& info) { return case_name(info.param); });

// truncate(n) leaves what feeding the first n tokens gives: the logits of a continuation match a fresh session's
// (lfm2: the convolution history is cut with the KV cache).
TEST_P(CpuForwardCache, TruncateEqualsFeedingTheKeptTokens) {
  const CpuModel& m = model(GetParam());
  const auto prompt = random_prompt(m, 30, 3), cont = random_prompt(m, 4, 4);
  CpuSession s(m);
  for (uint32_t n : {30u, 29u, 28u, 17u, 1u, 0u}) {
    s.reset();
    s.forward(prompt);
    s.truncate(n);
    EXPECT_EQ(s.n_past(), n);
    const auto got = s.forward_all(cont);
    std::vector<int32_t> all(prompt.begin(), prompt.begin() + n);
    all.insert(all.end(), cont.begin(), cont.end());
    CpuSession fresh(m);
    const auto want = fresh.forward_all(all);
    for (size_t t = 0; t < cont.size(); ++t) {
      const auto e = test::compare(got[t], want[n + t]);
      EXPECT_LE(e.rel_l2, 1e-5) << "kept " << n << ", continuation token " << t << ": " << e.describe();
    }
  }
  EXPECT_THROW(s.truncate(s.n_past() + 1), InvalidArgument);
}

// ---- pieces

// llama-rope3-tied carries llama3 RoPE scaling as llama.cpp's Llama 3.x files do, as rope_freqs.weight alone (no
// rope.scaling.* keys): its frequencies are the llama3 formula's for make_model's parameters (factor 8, low 1,
// high 4, original context 64), and differ from unscaled ones.
TEST(CpuForward, RopeFreqsTensorAloneIsLlama3Scaling) {
  const CpuModel& m = model("llama-rope3-tied-f32");
  ASSERT_TRUE(m.config.has_rope_freqs_tensor);
  EXPECT_FALSE(m.config.rope_scaling.enabled);
  const auto from_tensor = cpu::rope_inv_freq(m.config, m.weights.rope_freqs);
  ModelConfig keyed = m.config;
  keyed.rope_scaling = {
      .enabled = true, .factor = 8.f, .low_freq_factor = 1.f, .high_freq_factor = 4.f, .original_context = 64};
  const auto from_keys = cpu::rope_inv_freq(keyed, {});
  const auto unscaled = cpu::rope_inv_freq(m.config, {});
  ASSERT_EQ(from_tensor.size(), m.config.rope_dim / 2);
  int n_scaled = 0;
  for (size_t i = 0; i < from_tensor.size(); ++i) {
    EXPECT_NEAR(from_tensor[i] / from_keys[i], 1.0, 1e-6) << i;
    n_scaled += std::abs(from_keys[i] / unscaled[i] - 1.0) > 1e-3;
  }
  EXPECT_GT(n_scaled, 0);
}

TEST(CpuForward, RopeNormalRotatesAdjacentPairsNeoxHalves) {
  ModelConfig c;
  c.head_dim = 8;
  c.rope_dim = 4;  // only the first 4 dims rotate
  c.rope_base = 10000.f;
  const auto inv = cpu::rope_inv_freq(c, {});
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 0.01);
  const std::vector<float> x0 = {1, 2, 3, 4, 5, 6, 7, 8};
  for (RopeType type : {RopeType::Normal, RopeType::Neox}) {
    c.rope_type = type;
    std::vector<float> x = x0;
    cpu::apply_rope(x, 1, c, inv, 3);
    // (a, b, frequency index): Normal pairs (0,1) (2,3); Neox pairs (0,2) (1,3) with rope_dim 4.
    const std::array<std::tuple<int, int, int>, 2> pairs = type == RopeType::Normal
                                                               ? std::array{std::tuple{0, 1, 0}, std::tuple{2, 3, 1}}
                                                               : std::array{std::tuple{0, 2, 0}, std::tuple{1, 3, 1}};
    for (auto [a, b, i] : pairs) {
      const double ang = 3 * inv[i];
      EXPECT_NEAR(x[a], x0[a] * std::cos(ang) - x0[b] * std::sin(ang), 1e-6);
      EXPECT_NEAR(x[b], x0[a] * std::sin(ang) + x0[b] * std::cos(ang), 1e-6);
    }
    for (int d = 4; d < 8; ++d) EXPECT_EQ(x[d], x0[d]);
  }
}

TEST(CpuForward, RejectsBadTokensAndFullContext) {
  const CpuModel& m = model("qwen3-f32");
  CpuSession s(m, 4);
  const std::vector<int32_t> bad = {0, int32_t(m.config.n_vocab)}, neg = {-1}, three = {1, 2, 3}, two = {4, 5};
  EXPECT_THROW(s.forward(bad), InvalidArgument);
  EXPECT_THROW(s.forward(neg), InvalidArgument);
  EXPECT_THROW(s.forward(std::span<const int32_t>()), InvalidArgument);
  EXPECT_EQ(s.n_past(), 0u);
  s.forward(three);
  EXPECT_THROW(s.forward(two), InvalidArgument);
  EXPECT_EQ(s.n_past(), 3u);
  s.reset();
  EXPECT_EQ(s.n_past(), 0u);
  EXPECT_EQ(s.forward(two).size(), m.config.n_vocab);
}

TEST(CpuForward, LoadsEveryTensorWithItsShape) {
  const CpuModel& m = model("qwen2-q4_0");
  const ModelConfig& c = m.config;
  EXPECT_EQ(m.weights.token_embd.size(), size_t(c.n_vocab) * c.n_embd);
  EXPECT_EQ(m.weights.output.size(), size_t(c.n_vocab) * c.n_embd);
  ASSERT_EQ(m.weights.layers.size(), c.n_layer);
  const auto& L = m.weights.layers[1];
  EXPECT_EQ(L.wq.size(), size_t(c.q_dim()) * c.n_embd);
  EXPECT_EQ(L.wk.size(), size_t(c.kv_dim()) * c.n_embd);
  EXPECT_EQ(L.bq.size(), c.q_dim());
  EXPECT_EQ(L.bv.size(), c.kv_dim());
  EXPECT_TRUE(L.q_norm.empty());
  EXPECT_EQ(L.w_down.size(), size_t(c.n_ff) * c.n_embd);
  EXPECT_TRUE(model("llama-rope3-tied-q4_0").weights.output.empty());
  EXPECT_EQ(model("qwen3-bf16").weights.layers[0].k_norm.size(), c.head_dim);
}

}  // namespace
}  // namespace wgllm

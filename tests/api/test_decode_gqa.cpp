// LoadOptions::decode_gqa_from: a generation whose decode steps cross the threshold switches from the per-head to
// the GQA-grouped attention kernel mid-way and gives the same greedy tokens (and nearly the same logits) as forcing
// either kernel throughout. The built-in model (4 query heads over 2 KV heads, 4 layers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "wgllm/adapter.h"
#include "wgllm/default_model.h"
#include "wgllm/profile.h"
#include "wgllm/wgllm.h"

namespace wgllm {
namespace {

constexpr uint32_t kSteps = 80;     // decode steps after the 2-token prompt: positions 2 .. 81
constexpr uint32_t kSwitchAt = 40;  // Auto: per head at positions 2 .. 39, grouped from 40 on

Model load(uint32_t decode_gqa_from) {
  LoadOptions o;
  o.n_ctx = 256;
  o.decode_gqa_from = decode_gqa_from;
  return Model::load(default_model_gguf(), o, "built-in");
}

struct Greedy {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // per step
};

// Greedy decoding one token per feed (each a decode step), the argmax taken here.
Greedy generate(const Model& model, Profiler* profiler = nullptr) {
  Session s(model);
  Greedy g;
  std::vector<float> logits = s.feed(std::vector<int32_t>{1450, 28});  // "ROMEO:"
  if (profiler) {                                                      // the prompt's prefill left out
    profiler->collect();
    profiler->reset();
  }
  for (uint32_t i = 0; i < kSteps; ++i) {
    g.ids.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = s.feed(std::vector<int32_t>{g.ids.back()});
    g.logits.push_back(logits);
  }
  if (profiler) profiler->collect();
  return g;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(DecodeGqa, SwitchMidGenerationGivesTheForcedKernelsTokens) {
  const Model per_head = load(std::numeric_limits<uint32_t>::max());
  const Model grouped = load(0);
  const Model crossing = load(kSwitchAt);
  const Greedy want = generate(per_head);
  const Greedy always = generate(grouped);
  std::unique_ptr<Profiler> profiler;
  if (Profiler::supported(crossing)) profiler = std::make_unique<Profiler>(crossing);
  const Greedy got = generate(crossing, profiler.get());

  EXPECT_EQ(always.ids, want.ids) << "grouped throughout vs per head throughout";
  EXPECT_EQ(got.ids, want.ids) << "switching at depth " << kSwitchAt << " vs per head throughout";
  for (uint32_t i = 0; i < kSteps; ++i) {
    EXPECT_LE(rel_l2(always.logits[i], want.logits[i]), 1e-4) << "grouped, step " << i;
    EXPECT_LE(rel_l2(got.logits[i], want.logits[i]), 1e-4) << "switching, step " << i;
  }
  if (!profiler) GTEST_SKIP() << "no timestamp-query: which kernel each step ran is not checked";
  // Which kernel each decode step ran: steps at positions 2 .. 39 per head, 40 .. 81 grouped, in each of 4 layers.
  uint64_t per_head_calls = 0, grouped_calls = 0;
  for (const KernelTime& k : profiler->report().kernels) {
    const std::string entry = k.name.substr(k.name.rfind(':') + 1);
    if (entry == "attention_decode") per_head_calls += k.calls;
    if (entry == "attention_decode_gqa") grouped_calls += k.calls;
  }
  EXPECT_EQ(per_head_calls, 4u * (kSwitchAt - 2));
  EXPECT_EQ(grouped_calls, 4u * (kSteps + 2 - kSwitchAt));
}

// Unset, the depth is the adapter's, and info() says which: 0 on CPU adapters, 8192 on GPUs; a set one is kept.
TEST(DecodeGqa, DefaultIsTheAdapters) {
  EXPECT_FALSE(LoadOptions{}.decode_gqa_from.has_value());
  LoadOptions o;
  o.n_ctx = 64;
  const Model model = Model::load(default_model_gguf(), o, "built-in");
  EXPECT_EQ(model.info().decode_gqa_from, describe_adapter().adapter.is_cpu ? 0u : 8192u);
  EXPECT_EQ(load(40).info().decode_gqa_from, 40u);
}

}  // namespace
}  // namespace wgllm

// Sampling on the GPU (sample.wgsl, kernels::encode_sample) against cpu::sample_reference: for the same uniform u
// the same id on fresh random logits over a table of shapes and settings (vocab 1, sizes around the workgroup, top-k
// 1 and >= vocab, top-p 1 / tiny / 0, min-p, temperatures, penalties, ties, all-equal logits), every word around
// the answer poisoned; non-finite logits; many draws against the reference distribution (chi-square).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "cpu/sample.h"
#include "kernel_test_util.h"
#include "kernels/sample.h"

namespace wgllm::test {
namespace {

using kernels::SampleSettings;

cpu::SampleSettings twin(const SampleSettings& s) {
  return {.temperature = s.temperature,
          .top_k = s.top_k,
          .top_p = s.top_p,
          .min_p = s.min_p,
          .repeat_penalty = s.repeat_penalty};
}

int32_t reference(std::span<const float> l, std::span<const int32_t> recent, const SampleSettings& s, float u) {
  return cpu::sample_reference(l, recent, twin(s), u);
}

// Runs the kernel once per u (one batch) and returns the ids. The ring holds `recent` and one free slot, which each
// draw overwrites with its id (and the penalty does not see); the words around the answers and the scratch are
// poisoned first.
std::vector<uint32_t> gpu_sample(const std::vector<float>& logits, const SampleSettings& s, std::span<const float> us,
                                 const std::vector<int32_t>& recent = {}) {
  auto& ctx = context();
  const uint32_t n = uint32_t(logits.size());
  auto v = ctx.upload<float>(logits, WGPUBufferUsage_Storage, "logits");
  std::vector<uint32_t> ring(recent.begin(), recent.end());
  ring.push_back(kPoison);
  auto ring_buf = ctx.upload<uint32_t>(ring, WGPUBufferUsage_Storage, "recent");
  auto scratch = poisoned(ctx, kernels::sample_scratch_bytes(n) / 4, "scratch");
  const uint32_t n_out = uint32_t(us.size());
  auto out = poisoned(ctx, n_out * 2 + 1, "out");
  const kernels::SampleRecent r{.ids = &ring_buf,
                                .cap = uint32_t(ring.size()),
                                .n_recent = uint32_t(recent.size()),
                                .write_slot = uint32_t(recent.size())};
  gpu::ComputeBatch batch(ctx);
  for (uint32_t i = 0; i < n_out; ++i) kernels::encode_sample(batch, ctx, s, us[i], v, n, r, scratch, out, 2 * i + 1);
  batch.submit_and_wait();
  const auto got = ctx.read<uint32_t>(out);
  std::vector<uint32_t> ids;
  for (uint32_t w = 0; w < got.size(); ++w) {
    if (w % 2 == 1) {
      ids.push_back(got[w]);
    } else {
      EXPECT_EQ(got[w], kPoison) << "out word " << w << " was overwritten";
    }
  }
  const auto ring_after = ctx.read<uint32_t>(ring_buf);
  for (size_t i = 0; i < recent.size(); ++i) EXPECT_EQ(ring_after[i], uint32_t(recent[i])) << "ring slot " << i;
  const uint32_t last = ids.back() == kernels::kSampleNonFinite ? kPoison : ids.back();
  EXPECT_EQ(ring_after[recent.size()], last) << "the ring's free slot does not hold the last drawn id";
  return ids;
}

// A GPU id that differs from the reference's is a floating-point tie when the reference gives it for a slightly
// nudged u, top-p or min-p (the GPU sums and exponentiates in f32, the reference in f64).
bool near_tie(const std::vector<float>& l, const std::vector<int32_t>& recent, const SampleSettings& s, float u,
              int32_t id) {
  for (float du : {-2e-5f, 2e-5f})
    if (reference(l, recent, s, std::clamp(u + du, 0.f, 0.99999994f)) == id) return true;
  for (float f : {1 - 2e-5f, 1 + 2e-5f}) {
    SampleSettings t = s;
    t.top_p = std::min(1.f, s.top_p * f);
    if (s.top_p < 1 && reference(l, recent, t, u) == id) return true;
    t = s;
    t.min_p = std::min(1.f, s.min_p * f);
    if (reference(l, recent, t, u) == id) return true;
  }
  return false;
}

struct Case {
  const char* name;
  uint32_t n;
  SampleSettings s;
  float lo = -8.f, hi = 8.f;  // logits uniform in [lo, hi]
  uint32_t n_recent = 0;      // random recent ids (some repeated, some outside the vocabulary)
};

const SampleSettings kTypical{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f};

// For each case and several u (0, the largest float below 1, random ones), the GPU's id is the reference's, or a
// floating-point tie (at most a few of all draws).
TEST(Sample, MatchesTheReferenceForTheSameUniform) {
  const Case cases[] = {
      {"vocab 1", 1, kTypical},
      {"vocab 3", 3, kTypical},
      {"typical 255", 255, kTypical},
      {"typical 257", 257, kTypical},
      {"typical 1000", 1000, kTypical, -3, 3},
      {"typical 32000", 32000, kTypical, -10, 10},
      {"typical 151936", 151936, kTypical, -12, 12},
      {"no filters", 3001, {.temperature = 1.f}, -4, 4},
      {"top-k 1", 777, {.temperature = 1.f, .top_k = 1}},
      {"top-k = vocab", 300, {.temperature = 1.f, .top_k = 300}, -2, 2},
      {"top-k > vocab", 300, {.temperature = 1.f, .top_k = 100000}, -2, 2},
      {"top-k 2000 of 5000", 5000, {.temperature = 1.2f, .top_k = 2000}, -1, 1},
      {"top-p 0.5, no top-k", 5000, {.temperature = 1.f, .top_p = 0.5f}, -3, 3},
      {"top-p tiny", 5000, {.temperature = 1.f, .top_p = 1e-6f}, -3, 3},
      {"top-p 0", 600, {.temperature = 1.f, .top_k = 50, .top_p = 0.f}},
      {"min-p 0.1", 4000, {.temperature = 1.f, .min_p = 0.1f}, -4, 4},
      {"min-p 1", 4000, {.temperature = 1.f, .min_p = 1.f}, -4, 4},
      {"temperature 0.01", 900, {.temperature = 0.01f, .top_k = 10}, -0.05f, 0.05f},
      {"temperature 50", 900, {.temperature = 50.f, .top_k = 100}},
      {"greedy", 1234, {.temperature = 0.f}},
      {"greedy with penalty", 1234, {.temperature = -1.f, .repeat_penalty = 3.f}, -1, 1, 400},
      {"penalty 1.3", 2000, {.temperature = 0.9f, .top_k = 20, .repeat_penalty = 1.3f}, -2, 2, 64},
      {"penalty 0.5 (a bonus)", 2000, {.temperature = 0.7f, .top_p = 0.8f, .repeat_penalty = 0.5f}, -2, 2, 300},
      {"negative logits", 999, kTypical, -40, -30},
      {"fast path, top-k = chunks", 2000, {.temperature = 1.f, .top_k = 8}, -1, 1},
      {"fast path, narrow logits", 70000, kTypical, -0.01f, 0.01f},
  };
  int ties = 0, draws = 0, fast = 0;
  for (const Case& c : cases) {
    fast += kernels::sample_fast_path(c.n, c.s);
    auto gen = rng(c.n * 31 + c.s.top_k);
    const auto logits = random_floats(c.n, gen, c.lo, c.hi);
    std::vector<int32_t> recent;
    std::uniform_int_distribution<int32_t> pick(0, int32_t(c.n) + 5);
    for (uint32_t i = 0; i < c.n_recent; ++i) recent.push_back(i % 5 == 4 && i ? recent[i - 1] : pick(gen));
    std::vector<float> us = {0.f, 0.99999994f, 0.5f};
    for (int i = 0; i < 13; ++i) us.push_back(cpu::uniform_from_bits(gen()));
    const auto got = gpu_sample(logits, c.s, us, recent);
    for (size_t i = 0; i < us.size(); ++i) {
      ++draws;
      const int32_t want = reference(logits, recent, c.s, us[i]);
      if (int32_t(got[i]) == want) continue;
      const bool tie = near_tie(logits, recent, c.s, us[i], int32_t(got[i]));
      ties += tie;
      EXPECT_TRUE(tie) << c.name << ": u " << us[i] << " GPU id " << got[i] << ", reference " << want;
    }
  }
  EXPECT_LE(ties, draws / 50) << "too many floating-point ties: " << ties << " of " << draws;
  EXPECT_GE(fast, 5) << "cases on encode_sample's fast path";
}

// Equal logits: the lowest ids first (top-k), whole tie groups (top-p), and the draw in rising id order.
TEST(Sample, TiesAndEqualLogits) {
  const std::vector<float> flat(1000, 0.25f);
  const float us[] = {0.f, 0.19f, 0.21f, 0.99f};
  // top-k 5 of equal logits keeps ids 0..4, each 1/5
  EXPECT_EQ(gpu_sample(flat, {.top_k = 5}, us), (std::vector<uint32_t>{0, 0, 1, 4}));
  // the same on the fast path, where every id of equal logits is a candidate
  const std::vector<float> flat5k(5000, 0.25f);
  ASSERT_TRUE(kernels::sample_fast_path(5000, {.top_k = 5}));
  ASSERT_FALSE(kernels::sample_fast_path(1000, {.top_k = 5}));
  EXPECT_EQ(gpu_sample(flat5k, {.top_k = 5}, us), (std::vector<uint32_t>{0, 0, 1, 4}));
  // top-p keeps the whole group: the draw spans the vocabulary
  EXPECT_EQ(gpu_sample(flat, {.top_p = 0.1f}, std::span(us + 3, 1)), (std::vector<uint32_t>{990}));
  // greedy and top-k 1 take the lowest id
  EXPECT_EQ(gpu_sample(flat, {.temperature = 0.f}, std::span(us, 1)), (std::vector<uint32_t>{0}));
  EXPECT_EQ(gpu_sample(flat, {.top_k = 1}, std::span(us + 3, 1)), (std::vector<uint32_t>{0}));
  // a tie at the k-th place: of 7 logits of 1.0 (ids 100, 200, ..., 700) above the rest, top-k 4 keeps 100..400
  std::vector<float> l(1000, 0.f);
  for (int i = 1; i <= 7; ++i) l[100 * i] = 1.f;
  l[950] = 2.f;
  const SampleSettings k5{.temperature = 1.f, .top_k = 5};
  std::vector<float> many;
  for (int i = 0; i < 40; ++i) many.push_back((i + 0.5f) / 40);
  const auto got = gpu_sample(l, k5, many);
  std::map<uint32_t, int> seen;
  for (size_t i = 0; i < got.size(); ++i) {
    ++seen[got[i]];
    EXPECT_EQ(int32_t(got[i]), reference(l, {}, k5, many[i])) << "u " << many[i];
  }
  for (uint32_t id : {100u, 200u, 300u, 400u, 950u}) EXPECT_GT(seen[id], 0) << id;
  EXPECT_EQ(seen.size(), 5u);
  // -0 and +0 are equal logits
  std::vector<float> zeros{-0.f, 0.f, -1.f};
  EXPECT_EQ(gpu_sample(zeros, {.top_k = 1}, std::span(us + 3, 1)), (std::vector<uint32_t>{0}));
  EXPECT_EQ(gpu_sample(zeros, {.top_k = 2}, std::span(us + 3, 1)), (std::vector<uint32_t>{1}));
}

// A NaN or an infinity anywhere gives kSampleNonFinite, in every mode; the ring is left alone.
TEST(Sample, AnyNonFiniteLogitGivesNoId) {
  auto gen = rng(5);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float u[] = {0.3f};
  const SampleSettings fast{.temperature = 0.8f, .top_k = 5};
  ASSERT_TRUE(kernels::sample_fast_path(3000, fast));
  for (const SampleSettings& s : {kTypical, fast, SampleSettings{.temperature = 0.f, .repeat_penalty = 1.5f}})
    for (float bad : {nan, inf, -inf})
      for (uint32_t at : {0u, 300u, 2999u}) {
        auto logits = random_floats(3000, gen);
        logits[at] = bad;
        EXPECT_EQ(gpu_sample(logits, s, u, {1, 2})[0], kernels::kSampleNonFinite) << bad << " at " << at;
        EXPECT_EQ(reference(logits, {}, s, u[0]), -1);
      }
  EXPECT_EQ(gpu_sample({-inf}, kTypical, u)[0], kernels::kSampleNonFinite) << "vocab 1, -inf";
}

// The Wilson-Hilferty upper quantile of chi-square with df degrees of freedom at standard-normal quantile z.
double chi2_quantile(double df, double z) {
  const double a = 2 / (9 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// 9,000 draws with independent uniforms follow the reference distribution: Pearson's chi-square over the tokens
// (expected counts >= 5; rarer ones pooled) stays under its 1 - 1e-6 quantile (z = 4.75): a correct kernel fails
// this about once in a million runs.
TEST(Sample, DrawsFollowTheReferenceDistribution) {
  struct Stat {
    const char* name;
    std::vector<float> logits;
    SampleSettings s;
    std::vector<int32_t> recent;
  };
  auto gen = rng(6);
  const Stat stats[] = {
      {"typical",
       random_floats(1000, gen, -2, 6),
       {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f},
       {}},
      {"flat top-p", random_floats(500, gen, -1, 1), {.temperature = 1.5f, .top_p = 0.3f}, {}},
      {"typical, fast path",
       random_floats(2000, gen, -2, 6),
       {.temperature = 0.8f, .top_k = 8, .top_p = 0.9f, .min_p = 0.05f},
       {}},
      {"penalised",
       random_floats(64, gen, 0, 2),
       {.temperature = 1.f, .top_k = 12, .repeat_penalty = 2.f},
       {0, 1, 2, 3}},
  };
  for (const Stat& st : stats) {
    const auto dist = cpu::sample_distribution(st.logits, st.recent, twin(st.s));
    std::vector<float> us(9000);
    for (float& u : us) u = cpu::uniform_from_bits(gen());
    std::map<int32_t, int> count;
    for (size_t i = 0; i < us.size(); i += 3000) {
      const auto ids = gpu_sample(st.logits, st.s, std::span(us).subspan(i, 3000), st.recent);
      for (uint32_t id : ids) ++count[int32_t(id)];
    }
    double chi2 = 0, pooled_e = 0;
    int pooled_o = 0, cells = 0, outside = int(us.size());
    for (const cpu::SampledProb& t : dist) {
      const double e = t.p * double(us.size());
      const int o = count.count(t.id) ? count[t.id] : 0;
      outside -= o;
      if (e < 5) {
        pooled_e += e, pooled_o += o;
        continue;
      }
      chi2 += (o - e) * (o - e) / e, ++cells;
    }
    if (pooled_e > 0) chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1.0), ++cells;
    EXPECT_EQ(outside, 0) << st.name << ": draws of tokens the reference gives no probability";
    ASSERT_GT(cells, 1) << st.name;
    EXPECT_LT(chi2, chi2_quantile(cells - 1, 4.75)) << st.name << ": chi-square " << chi2 << " over " << cells;
  }
}

TEST(Sample, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto logits = ctx.create_buffer(4000, WGPUBufferUsage_Storage, "logits");
  auto ring = ctx.create_buffer(16, WGPUBufferUsage_Storage, "ring");
  auto scratch = ctx.create_buffer(kernels::sample_scratch_bytes(1000), WGPUBufferUsage_Storage, "scratch");
  auto out = ctx.create_buffer(8, WGPUBufferUsage_Storage, "out");
  gpu::ComputeBatch batch(ctx);
  const kernels::SampleRecent r{.ids = &ring, .cap = 4, .n_recent = 2, .write_slot = 2};
  auto run = [&](SampleSettings s, float u, uint32_t n, kernels::SampleRecent rr, const gpu::Buffer& sc,
                 uint32_t out_index) { kernels::encode_sample(batch, ctx, s, u, logits, n, rr, sc, out, out_index); };
  const SampleSettings ok = kTypical;
  expect_throw([&] { run(ok, 0.5f, 0, r, scratch, 0); }, "n must be > 0");
  expect_throw([&] { run({.temperature = NAN}, 0.5f, 1000, r, scratch, 0); }, "temperature nan");
  expect_throw([&] { run({.top_p = 1.5f}, 0.5f, 1000, r, scratch, 0); }, "top_p 1.5");
  expect_throw([&] { run({.min_p = -0.1f}, 0.5f, 1000, r, scratch, 0); }, "min_p -0.1");
  expect_throw([&] { run({.repeat_penalty = 0}, 0.5f, 1000, r, scratch, 0); }, "repeat_penalty 0");
  expect_throw([&] { run(ok, 1.f, 1000, r, scratch, 0); }, "u 1 must be in [0, 1)");
  expect_throw([&] { run(ok, -0.1f, 1000, r, scratch, 0); }, "u -0.1");
  expect_throw([&] { run(ok, 0.5f, 1001, r, scratch, 0); }, "logits");
  expect_throw([&] { run(ok, 0.5f, 1000, r, out, 0); }, "scratch");
  expect_throw([&] { run(ok, 0.5f, 1000, r, scratch, 2); }, "out");
  expect_throw([&] { run(ok, 0.5f, 1000, {.ids = &ring, .cap = 2, .n_recent = 3}, scratch, 0); }, "n_recent 3");
  expect_throw([&] { run(ok, 0.5f, 1000, {.ids = &ring, .cap = 2, .write_slot = 2}, scratch, 0); }, "write_slot 2");
  expect_throw([&] { run(ok, 0.5f, 1000, {.ids = &ring, .cap = 5}, scratch, 0); }, "recent.ids");
  expect_throw([&] { run(ok, 0.5f, 1000, {}, scratch, 0); }, "recent.ids must be a buffer");
  expect_throw([&] { run(ok, 0.5f, 1000, {.ids = &out, .cap = 1}, scratch, 0); }, "four different buffers");
}

// Several rows at once (encode_sample_rows, continuous batching): row i's id is the one encode_sample draws alone from
// the same logits, settings, uniform and recent ids, whatever the other rows are: rows on the fast path beside rows on
// the general one, a greedy row, penalties, a row with a NaN; the words past the rows stay poisoned.
TEST(Sample, RowsAsIfAlone) {
  auto& ctx = context();
  const uint32_t n = 5000;
  struct Row {
    SampleSettings s;
    uint32_t n_recent = 0;
    bool nan = false;
  };
  const Row rows[] = {
      {kTypical},
      {{.temperature = 1.f, .top_k = 8}},  // the fast path (8 <= its 20 chunks)
      {{.temperature = 0.9f, .top_k = 20, .repeat_penalty = 1.3f}, 64},
      {{.temperature = 0.f}},
      {{.temperature = 1.f, .top_k = 8}, 0, true},
      {{.temperature = 1.f, .top_p = 0.5f}},
      {{.temperature = 0.7f, .top_p = 0.8f, .repeat_penalty = 0.5f}, 300},
      {{.temperature = 1.2f, .top_k = 3}},
  };
  const uint32_t R = uint32_t(std::size(rows));
  ASSERT_TRUE(kernels::sample_fast_path(n, rows[1].s));
  ASSERT_FALSE(kernels::sample_fast_path(n, rows[0].s));
  auto gen = rng(4242);
  std::vector<float> logits;
  std::vector<kernels::SampleRow> table;
  std::uniform_int_distribution<int32_t> pick(0, int32_t(n) - 1);
  for (uint32_t i = 0; i < R; ++i) {
    auto l = random_floats(n, gen, -6.f, 6.f);
    if (rows[i].nan) l[n / 3] = std::nanf("");
    logits.insert(logits.end(), l.begin(), l.end());
    kernels::SampleRow row{.settings = rows[i].s, .u = cpu::uniform_from_bits(gen()), .recent = {}};
    for (uint32_t j = 0; j < rows[i].n_recent; ++j) row.recent.push_back(uint32_t(pick(gen)));
    table.push_back(row);
  }
  // alone: each row through encode_sample, its ring the row's recent ids and a free slot
  std::vector<uint32_t> want;
  for (uint32_t i = 0; i < R; ++i) {
    auto v = ctx.upload<float>(std::vector<float>(logits.begin() + size_t(i) * n, logits.begin() + size_t(i + 1) * n),
                               WGPUBufferUsage_Storage, "row");
    std::vector<uint32_t> ring = table[i].recent;
    ring.push_back(kPoison);
    auto ring_buf = ctx.upload<uint32_t>(ring, WGPUBufferUsage_Storage, "recent");
    auto scratch = poisoned(ctx, kernels::sample_scratch_bytes(n) / 4, "scratch");
    auto out = poisoned(ctx, 1, "out");
    const kernels::SampleRecent r{.ids = &ring_buf,
                                  .cap = uint32_t(ring.size()),
                                  .n_recent = uint32_t(table[i].recent.size()),
                                  .write_slot = uint32_t(table[i].recent.size())};
    gpu::ComputeBatch batch(ctx);
    kernels::encode_sample(batch, ctx, table[i].settings, table[i].u, v, n, r, scratch, out);
    batch.submit_and_wait();
    want.push_back(ctx.read<uint32_t>(out)[0]);
  }
  EXPECT_EQ(want[4], kernels::kSampleNonFinite);
  // together
  auto v = ctx.upload<float>(logits, WGPUBufferUsage_Storage, "rows");
  auto params = ctx.create_buffer(kernels::sample_rows_params_bytes(R),
                                  WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst, "params");
  auto ids = ctx.create_buffer(4 * 1024, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst, "recent ids");
  auto scratch = poisoned(ctx, kernels::sample_rows_scratch_bytes(R, n) / 4, "scratch");
  auto out = poisoned(ctx, R + 3, "out");
  gpu::ComputeBatch batch(ctx);
  kernels::encode_sample_rows(batch, ctx, table, v, n, params, ids, scratch, out);
  batch.submit_and_wait();
  const auto got = ctx.read<uint32_t>(out);
  for (uint32_t i = 0; i < R; ++i) EXPECT_EQ(got[i], want[i]) << "row " << i;
  for (uint32_t i = R; i < R + 3; ++i) EXPECT_EQ(got[i], kPoison) << "out word " << i << " was overwritten";
  // argument checks
  expect_throw([&] { kernels::encode_sample_rows(batch, ctx, {}, v, n, params, ids, scratch, out); }, "rows");
  expect_throw([&] { kernels::encode_sample_rows(batch, ctx, table, v, n, params, ids, v, out); }, "scratch holds");
  std::vector<kernels::SampleRow> bad = table;
  bad[2].u = 1.f;
  expect_throw([&] { kernels::encode_sample_rows(batch, ctx, bad, v, n, params, ids, scratch, out); }, "u 1 must be");
}

}  // namespace
}  // namespace wgllm::test

// GpuBatchDecode: one decode step of several sessions (continuous batching) against each session's own decode step,
// and the same bits whatever runs beside a sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/batch_decode.h"
#include "model/transformer.h"
#include "model_util.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

std::vector<int32_t> random_ids(uint32_t n_vocab, size_t n, std::mt19937_64& gen) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab) - 1);
  std::vector<int32_t> p;
  while (p.size() < n) p.push_back(d(gen));
  return p;
}

struct BatchCase {
  std::string model;
  bool shared;  // the sessions' caches views of one pool per layer: one RoPE + append and one attention dispatch
  // The GPUs' product kernels on any adapter, steps of two sequences or more on the tiled kernel in the batch
  // matvec's order (kernels::batch_tile_from), a sequence alone on the matvec.
  bool tiles = false;
  uint32_t split = 0;  // with tiles: the products split over this many groups of lane classes where they allow it
  // With shared: a pool of this many pages (0: two per session), mapped as the sessions reach them (a prompt of 254
  // tokens whose steps cross into its second page).
  uint32_t pool_pages = 0;
  // ContextOptions::fuse_qk_norm off: with shared, each sequence's q/k norms, RoPE and append in a dispatch before the
  // attention's (qk_norm_rope_kv_rows), not inside it (encode_attention_decode_rows_fresh, the default)
  bool unfused = false;
};
std::ostream& operator<<(std::ostream& o, const BatchCase& c) {
  return o << c.model << (c.shared ? " shared" : "") << (c.tiles ? " tiles" : "")
           << (c.split ? " split " + std::to_string(c.split) : "")
           << (c.pool_pages ? " pool " + std::to_string(c.pool_pages) : "") << (c.unfused ? " unfused" : "");
}

class BatchDecode : public ::testing::TestWithParam<BatchCase> {};

// Six sessions with prompts of different lengths (one long enough for a split-K attention) take seven steps in
// changing company (all six, five, one, one, three, six, six): each step's logits of a sequence equal, bit for bit,
// those of a twin session stepped alone through the same engine, and match (relative L2) a third twin decoding on its
// own with GpuSession::forward. The sessions then go on with forward as if each step had been theirs.
TEST_P(BatchDecode, EachSequenceAsIfAlone) {
  const BatchCase& tc = GetParam();
  const GgufFile f = GgufFile::open(test::model_path(tc.model));
  std::optional<gpu::Context> own_ctx;
  if (tc.tiles)
    own_ctx.emplace(test::context_options([&](auto& o) {
      o.rows_shape = "off";
      o.batch_tile_from = 2;
      o.batch_split = tc.split ? tc.split : 1;  // (1: unsplit)
    }));
  if (tc.unfused) own_ctx.emplace(test::context_options([&](auto& o) { o.fuse_qk_norm = false; }));
  gpu::Context& ctx = own_ctx ? *own_ctx : test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  const GpuSessionOptions so{.n_ctx = 512, .ubatch = 32, .kv_type = kernels::KvType::F32};
  const std::vector<uint32_t> lengths = {3, tc.pool_pages ? 254u : 17u, 40, 1, 300, 9};
  const size_t S = lengths.size();
  auto gen = test::rng(41);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t n : lengths) prompts.push_back(random_ids(V, n, gen));
  // Sessions fed their prompts: with `pool`, views of it (pages of 256 positions, two per session).
  auto sessions = [&](SharedKv* pool) {
    std::vector<std::unique_ptr<GpuSession>> v;
    for (size_t i = 0; i < S; ++i) {
      GpuSessionOptions o = so;
      o.shared_kv = pool;
      o.kv_sequence = uint32_t(i);
      v.push_back(std::make_unique<GpuSession>(ctx, gm, o));
      v.back()->forward(prompts[i]);
    }
    return v;
  };
  std::optional<SharedKv> pool_together, pool_alone;
  if (tc.shared) {
    pool_together.emplace(ctx, gm.config, uint32_t(S), 512, 256, kernels::KvType::F32, tc.pool_pages);
    pool_alone.emplace(ctx, gm.config, uint32_t(S), 512, 256, kernels::KvType::F32);
  }
  SharedKv* together_pool = pool_together ? &*pool_together : nullptr;
  SharedKv* alone_pool = pool_alone ? &*pool_alone : nullptr;
  auto together = sessions(together_pool), alone = sessions(alone_pool), own = sessions(nullptr);
  GpuBatchDecode bd(ctx, gm, uint32_t(S), together_pool);
  GpuBatchDecode bd_alone(ctx, gm, uint32_t(S), alone_pool);
  // A step of the sessions of the step before runs as encoded ahead (GpuBatchDecode::prepared_steps): the 4th and
  // the last.
  const std::vector<std::vector<size_t>> steps = {{0, 1, 2, 3, 4, 5}, {5, 4, 3, 1, 0},   {2}, {2}, {4, 0, 2},
                                                  {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}};
  double worst = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<GpuSession*> group;
    std::vector<int32_t> ids;
    for (size_t i : steps[k]) {
      group.push_back(together[i].get());
      ids.push_back(random_ids(V, 1, gen)[0]);
    }
    const std::vector<float> got = bd.step(group, ids);
    ASSERT_EQ(got.size(), size_t(V) * group.size());
    for (size_t j = 0; j < steps[k].size(); ++j) {
      const size_t i = steps[k][j];
      SCOPED_TRACE("step " + std::to_string(k) + ", sequence " + std::to_string(i));
      GpuSession* one[] = {alone[i].get()};
      const std::vector<float> lone = bd_alone.step(one, std::span(&ids[j], 1));
      ASSERT_EQ(std::memcmp(lone.data(), got.data() + j * V, size_t(V) * 4), 0) << "not the same bits as alone";
      const std::vector<float> ref = own[i]->forward(std::span(&ids[j], 1));
      const auto e = test::compare(std::span<const float>(got).subspan(j * V, V), std::span<const float>(ref));
      worst = std::max(worst, e.rel_l2);
      ASSERT_LE(e.rel_l2, 1e-4) << e.describe();
      ASSERT_EQ(together[i]->n_past(), own[i]->n_past());
      ASSERT_TRUE(std::ranges::equal(together[i]->tokens(), own[i]->tokens()));
    }
  }
  // (gemma4 too: each attention layer in one dispatch, those reading an earlier layer's cache over its pool)
  const bool one_dispatch = tc.shared && ctx.features().subgroups;
  EXPECT_EQ(bd.shared_steps(), one_dispatch ? steps.size() : 0u);
  EXPECT_EQ(bd.prepared_steps(), 2u);
  // Afterwards each session decodes and prefills on its own as its twin does.
  for (size_t i = 0; i < S; ++i) {
    const std::vector<int32_t> more = random_ids(V, 5, gen);
    const auto e = test::compare(together[i]->forward(more), own[i]->forward(more));
    EXPECT_LE(e.rel_l2, 1e-4) << "sequence " << i << " after the batched steps: " << e.describe();
  }
  if (tc.pool_pages) {
    EXPECT_EQ(pool_together->pages_free(), 0u) << "a page for each 256 positions reached";
  }
  std::printf("[ rel L2 ] %-20s %s batched vs own decode: worst %.3g\n", tc.model.c_str(),
              tc.shared ? "shared pool" : "own caches ", worst);
}

std::vector<BatchCase> batch_cases() {
  std::vector<BatchCase> v;
  for (const char* m :
       {"llama-f32", "qwen2-q8_0", "qwen3-f16", "gemma3-tiny-f32", "lfm2-tiny-f32", "lfm2-tiny-l4-f32", "llama-f16",
        "qwen3moe-tiny-k4-f32", "lfm2moe-tiny-k4-f32", "gpt-oss-tiny-f32", "qwen35-tiny-f32", "gemma4-tiny-f32",
        "gemma4-tiny-kv-f32", "gemma4-h512-f32"})
    for (bool shared : {false, true}) v.push_back({m, shared});
  v.push_back({"llama-f16", false, true});
  v.push_back({"llama-q4_k", false, true});
  v.push_back({"llama-q4_k", false, true, 4});
  v.push_back({.model = "llama-f32", .shared = true, .pool_pages = 8});
  v.push_back({.model = "llama-f32", .shared = true, .unfused = true});  // RoPE and the append alone
  v.push_back({.model = "qwen3-f16", .shared = true, .unfused = true});  // with the q/k norms
  return v;
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode, ::testing::ValuesIn(batch_cases()), [](const auto& info) {
  std::string s = info.param.model + (info.param.shared ? "_shared" : "") + (info.param.tiles ? "_tiles" : "") +
                  (info.param.split ? "_split" + std::to_string(info.param.split) : "") +
                  (info.param.pool_pages ? "_pool" + std::to_string(info.param.pool_pages) : "") +
                  (info.param.unfused ? "_unfused" : "");
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
});

// step_argmax queues the next step of its sessions before it reads their ids. Three sessions take steps that use
// it (the same sessions or some of them, fed the ids they chose) and steps that must drop it: an id other than the
// chosen one, a session that was not in it, another order, a session rewound and fed another token back to the same
// position; none is queued for a session out of room or when the caller says so. Every id equals
// the argmax of the logits of a twin session stepped alone, and afterwards each session continues as its twin does.
class BatchDecodeAhead : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchDecodeAhead, QueuedStepsTakenOnlyWhenTheyStand) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  auto gen = test::rng(43);
  const std::vector<uint32_t> ctxs = {64, 64, 16};  // the third runs out of room
  std::vector<std::unique_ptr<GpuSession>> ahead, alone;
  for (uint32_t i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = random_ids(V, 3 + 2 * i, gen);
    for (auto* v : {&ahead, &alone}) {
      v->push_back(std::make_unique<GpuSession>(
          ctx, gm, GpuSessionOptions{.n_ctx = ctxs[i], .ubatch = 8, .kv_type = kernels::KvType::F32}));
      v->back()->forward(prompt);
    }
  }
  GpuBatchDecode bd(ctx, gm, 3), bd_alone(ctx, gm, 3);
  auto host_argmax = [](std::span<const float> row) {
    return int32_t(std::max_element(row.begin(), row.end()) - row.begin());  // the first of equals
  };
  std::vector<int32_t> next(3);  // each session's id for its next step: the one it chose
  for (int32_t& id : next) id = random_ids(V, 1, gen)[0];
  enum Expect { Fresh, Taken, Dropped };  // no step was queued; the queued one is taken; it is dropped
  uint64_t taken = 0, dropped = 0;
  auto step = [&](const std::vector<uint32_t>& group, Expect expect, const std::string& what, bool queue_next = true) {
    SCOPED_TRACE(what);
    std::vector<GpuSession*> s;
    std::vector<int32_t> ids;
    for (uint32_t i : group) {
      s.push_back(ahead[i].get());
      ids.push_back(next[i]);
    }
    const std::vector<int32_t> chosen = bd.step_argmax(s, ids, queue_next);
    taken += expect == Taken;
    dropped += expect == Dropped;
    ASSERT_EQ(bd.ahead_steps(), taken);
    ASSERT_EQ(bd.dropped_steps(), dropped);
    for (size_t j = 0; j < group.size(); ++j) {
      const uint32_t i = group[j];
      GpuSession* one[] = {alone[i].get()};
      const std::vector<float> logits = bd_alone.step(one, std::span(&ids[j], 1));
      ASSERT_EQ(chosen[j], host_argmax(logits)) << "sequence " << i;
      ASSERT_TRUE(std::ranges::equal(ahead[i]->tokens(), alone[i]->tokens()));
      next[i] = chosen[j];
    }
  };
  step({0, 1, 2}, Fresh, "the first step");
  step({0, 1, 2}, Taken, "the same sessions, their ids");
  next[2] = (next[2] + 1) % int32_t(V);
  step({0, 1, 2}, Dropped, "another id than the one chosen");
  step({0, 1, 2}, Taken, "again their own");
  step({0, 2}, Taken, "session 1 left: the others' rows");
  step({0, 2}, Taken, "the two, queued behind the step they left");
  step({0, 1, 2}, Dropped, "session 1 back at the position the step it left ran");
  step({1, 0}, Dropped, "another order");
  step({1, 0}, Taken, "the same two");
  // Session 0 back one position and fed another token there: it stands where the queued step expects it, and the
  // step's input is the id it chose, but the cache behind it has changed.
  for (auto* v : {&ahead, &alone}) {
    GpuSession& s = *(*v)[0];
    const int32_t other = (s.tokens().back() + 1) % int32_t(V);
    s.truncate(s.n_past() - 1);
    s.forward(std::span(&other, 1));
  }
  step({1, 0}, Dropped, "a session changed in place");
  step({1, 0}, Taken, "the same two again");
  step({2}, Dropped, "session 2 was not in it");
  while (ahead[2]->n_past() + 1 < ahead[2]->n_ctx()) step({2}, Taken, "session 2 filling up");
  step({2}, Taken, "session 2's last position: nothing queued behind it");
  EXPECT_EQ(ahead[2]->n_past(), ahead[2]->n_ctx());
  step({0, 1}, Fresh, "nothing was queued for these");
  step({0, 1}, Taken, "queued", false);
  step({0, 1}, Fresh, "not queued when asked not to");
  // The dropped steps left nothing behind: every session continues as its twin.
  for (uint32_t i = 0; i < 2; ++i) {
    const std::vector<int32_t> more = random_ids(V, 5, gen);
    const std::vector<float> a = ahead[i]->forward(more), b = alone[i]->forward(more);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "sequence " << i << " afterwards";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecodeAhead,
                         ::testing::Values("llama-f32", "lfm2-tiny-f32", "qwen35-tiny-f32", "gemma4-tiny-kv-f32"),
                         test::model_param_name);

// A step of the same sessions after the first makes no bind group (gpu::BindCache: the step's buffers and windows are
// the ones before), queued ahead or not: a step's host work stays clear of wgpu's bind group creation.
TEST(BatchDecodeSteps, StepsAfterTheFirstMakeNoBindGroups) {
  const GgufFile f = GgufFile::open(test::model_path("llama-f32"));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab, S = 8;
  auto gen = test::rng(44);
  std::vector<std::unique_ptr<GpuSession>> sessions;
  std::vector<GpuSession*> all;
  for (uint32_t i = 0; i < S; ++i) {
    sessions.push_back(std::make_unique<GpuSession>(ctx, gm, GpuSessionOptions{.n_ctx = 64, .ubatch = 8}));
    sessions.back()->forward(random_ids(V, 3 + i, gen));
    all.push_back(sessions.back().get());
  }
  GpuBatchDecode bd(ctx, gm, S);
  std::vector<int32_t> ids = random_ids(V, S, gen);
  for (int step = 0; step < 6; ++step) {
    const uint64_t before = bd.bind_groups_made();
    ids = bd.step_argmax(all, ids, /*queue_next=*/step % 3 != 2);
    const uint64_t made = bd.bind_groups_made() - before;
    if (step == 0) {
      EXPECT_GT(made, 0u) << "the first step made none (the count is not counting)";
    } else {
      EXPECT_EQ(made, 0u) << "step " << step << " made bind groups";
    }
  }
}

TEST(BatchDecodeErrors, ThrowBeforeAnyWork) {
  const GgufFile f = GgufFile::open(test::model_path("llama-f32"));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  GpuSession a(ctx, gm, {.n_ctx = 8}), b(ctx, gm, {.n_ctx = 8}), full(ctx, gm, {.n_ctx = 2});
  const int32_t two[] = {1, 2};
  full.forward(two);
  GpuBatchDecode bd(ctx, gm, 2);
  auto expect = [&](std::vector<GpuSession*> s, std::vector<int32_t> ids, const std::string& what) {
    try {
      bd.step(s, ids);
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect({&a, &a}, {1, 2}, "appears twice");
  expect({&a, &full}, {1, 2}, "is full");
  expect({&a, &b}, {1, int32_t(gm.config.n_vocab)}, "outside the vocabulary");
  expect({&a, &b, &full}, {1, 2, 3}, "3 sessions (1 to 2)");
  expect({&a}, {1, 2}, "differ in count");
  EXPECT_EQ(a.n_past(), 0u);
  EXPECT_EQ(b.n_past(), 0u);
}

}  // namespace
}  // namespace wgllm

// default_context: the context a model gets when -c is absent (the training context, capped to the KV cache budget
// and the cache's binding limit, in steps of 256), on edge values and on fresh random inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "api/context_size.h"
#include "test_util.h"

namespace wgllm {
namespace {

constexpr uint64_t kNoLimit = UINT64_MAX;

TEST(DefaultContext, FitsExactlyIsNotCapped) {
  const ContextSize c = default_context(4096, 4096 * 1000, 1000, kNoLimit);
  EXPECT_EQ(c.n_ctx, 4096u);
  EXPECT_FALSE(c.capped);
  // max_positions is a limit too: exactly the training context still fits
  EXPECT_FALSE(default_context(4096, kNoLimit, 1000, 4096).capped);
}

TEST(DefaultContext, OneByteShortCapsToTheMultipleOf256Below) {
  const ContextSize c = default_context(4096, 4096 * 1000 - 1, 1000, kNoLimit);  // 4095 positions fit
  EXPECT_EQ(c.n_ctx, 3840u);
  EXPECT_TRUE(c.capped);
}

TEST(DefaultContext, BindingLimitCaps) {
  const ContextSize c = default_context(8192, kNoLimit, 64, 5000);
  EXPECT_EQ(c.n_ctx, 4864u);  // 19 * 256
  EXPECT_TRUE(c.capped);
  // the smaller of the two limits wins
  EXPECT_EQ(default_context(8192, 3000 * 64, 64, 5000).n_ctx, 2816u);
  EXPECT_EQ(default_context(8192, 6000 * 64, 64, 1100).n_ctx, 1024u);
}

TEST(DefaultContext, NoBudgetLeavesTheFloorOf256) {
  // the weights took the whole budget: 256 positions, still reported as capped
  const ContextSize c = default_context(32768, 0, 4096, kNoLimit);
  EXPECT_EQ(c.n_ctx, 256u);
  EXPECT_TRUE(c.capped);
  EXPECT_EQ(default_context(32768, 255 * 4096, 4096, kNoLimit).n_ctx, 256u);
  EXPECT_EQ(default_context(32768, kNoLimit, 4096, 0).n_ctx, 256u);
}

TEST(DefaultContext, NeverAboveTheTrainingContext) {
  // the floor of 256 must not lift a short training context
  const ContextSize c = default_context(100, 0, 4096, kNoLimit);
  EXPECT_EQ(c.n_ctx, 100u);
  EXPECT_FALSE(c.capped);
  const ContextSize d = default_context(300, 299 * 8, 8, kNoLimit);
  EXPECT_EQ(d.n_ctx, 256u);
  EXPECT_TRUE(d.capped);
  EXPECT_EQ(default_context(1, 0, 1, 0).n_ctx, 1u);
}

TEST(DefaultContext, LargeValuesDoNotOverflow) {
  const ContextSize c = default_context(UINT32_MAX, kNoLimit, 1, kNoLimit);
  EXPECT_EQ(c.n_ctx, UINT32_MAX);
  EXPECT_FALSE(c.capped);
  const ContextSize d = default_context(UINT32_MAX, kNoLimit, 1, uint64_t(UINT32_MAX) + 1000);
  EXPECT_EQ(d.n_ctx, UINT32_MAX);
  const ContextSize e = default_context(UINT32_MAX, uint64_t(1) << 40, 1 << 20, kNoLimit);  // 2^20 positions
  EXPECT_EQ(e.n_ctx, 1u << 20);
  EXPECT_TRUE(e.capped);
  // no bytes per position: memory is no limit
  EXPECT_EQ(default_context(5000, 0, 0, kNoLimit).n_ctx, 5000u);
}

// Fresh random inputs against the contract: never above n_ctx_train; uncapped means all of it fits; capped means a
// multiple of 256 (or the training context itself when that is below 256) that fits, unless only the floor is left.
TEST(DefaultContext, RandomInputsKeepTheContract) {
  auto gen = test::rng(41);
  std::uniform_int_distribution<uint32_t> ctx_d(1, 1u << 20);
  std::uniform_int_distribution<uint64_t> bpp_d(1, 1 << 16);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t n_train = ctx_d(gen);
    const uint64_t bpp = bpp_d(gen);
    // budgets and binding limits around n_train positions, so both sides of every edge are hit
    const uint64_t budget = std::uniform_int_distribution<uint64_t>(0, 2ull * n_train * bpp)(gen);
    const uint64_t max_pos = std::uniform_int_distribution<uint64_t>(0, 2ull * n_train)(gen);
    const ContextSize c = default_context(n_train, budget, bpp, max_pos);
    const uint64_t fits = std::min(budget / bpp, max_pos);
    SCOPED_TRACE("n_ctx_train " + std::to_string(n_train) + ", budget " + std::to_string(budget) + ", bytes/position " +
                 std::to_string(bpp) + ", max positions " + std::to_string(max_pos));
    ASSERT_LE(c.n_ctx, n_train);
    ASSERT_EQ(c.capped, c.n_ctx < n_train);
    if (fits >= n_train) {
      ASSERT_EQ(c.n_ctx, n_train);
    } else if (n_train <= 256) {
      ASSERT_EQ(c.n_ctx, n_train);  // the floor reaches the training context
    } else if (fits < 256) {
      ASSERT_EQ(c.n_ctx, 256u);
    } else {
      ASSERT_EQ(c.n_ctx % 256, 0u);
      ASSERT_LE(c.n_ctx, fits);
      ASSERT_GT(c.n_ctx + 256, fits);  // the largest such multiple
    }
  }
}

}  // namespace
}  // namespace wgllm

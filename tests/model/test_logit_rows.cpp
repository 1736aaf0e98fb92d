// GpuSession::forward_rows, the logits of a range of a prompt's tokens a block at a time, against the CPU reference
// forward: every row handed over once, in order, equal to the CPU's logits, whatever the ubatch, the block size and
// where the range starts (inside a chunk, on a chunk boundary, after tokens already cached).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/reference.h"
#include "model/transformer.h"
#include "model_util.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

struct RowsCase {
  std::string model;
  uint32_t ubatch, block_rows;  // block_rows 0: the session's own
  uint32_t cached;              // tokens fed before the call
  uint32_t n, first;            // the call: n tokens, rows from `first` on
  double tol;
};
std::ostream& operator<<(std::ostream& o, const RowsCase& c) {
  return o << c.model << " ubatch " << c.ubatch << " block " << c.block_rows << " cached " << c.cached << " n " << c.n
           << " first " << c.first;
}

class LogitRows : public ::testing::TestWithParam<RowsCase> {};

TEST_P(LogitRows, MatchCpuReference) {
  const RowsCase& tc = GetParam();
  const GgufFile f = GgufFile::open(test::model_path(tc.model));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const cpu::CpuModel cm = cpu::load_cpu_model(f);
  GpuSession gs(
      ctx, gm, {.n_ctx = 128, .ubatch = tc.ubatch, .kv_type = kernels::KvType::F32, .logit_block_rows = tc.block_rows});
  cpu::CpuSession cs(cm, 128);
  auto gen = test::rng(tc.n * 131 + tc.first);
  std::uniform_int_distribution<int32_t> d(0, int32_t(gm.config.n_vocab) - 1);
  std::vector<int32_t> ids(tc.cached + tc.n);
  for (auto& t : ids) t = d(gen);
  if (tc.cached) {
    gs.forward(std::span(ids).first(tc.cached));
    cs.forward(std::span(ids).first(tc.cached));
  }
  const auto prompt = std::span(ids).subspan(tc.cached);
  const auto want = cs.forward_all(prompt);
  const uint32_t V = gm.config.n_vocab;
  uint32_t next = tc.first, calls = 0;
  gs.forward_rows(prompt, tc.first, [&](uint32_t row, std::span<const float> logits) {
    ++calls;
    ASSERT_EQ(row, next) << "rows out of order";
    ASSERT_EQ(logits.size() % V, 0u);
    const uint32_t m = uint32_t(logits.size() / V);
    ASSERT_GE(m, 1u);
    ASSERT_LE(m, gs.logit_rows_per_block());
    ASSERT_LE(row + m, tc.n);
    for (uint32_t t = 0; t < m; ++t) {
      const std::vector<float> got(logits.begin() + size_t(t) * V, logits.begin() + size_t(t + 1) * V);
      const auto e = test::compare(got, want[row + t]);
      EXPECT_LE(e.rel_l2, tc.tol) << "row " << row + t << ": " << e.describe();
    }
    next = row + m;
  });
  EXPECT_EQ(next, tc.n) << "rows from " << tc.first << " not all handed over";
  if (tc.first >= tc.n) {
    EXPECT_EQ(calls, 0u);
  }
  EXPECT_EQ(gs.n_past(), tc.cached + tc.n);
  // the cache holds the prompt: the next token's logits follow it
  const int32_t one = d(gen);
  EXPECT_LE(test::compare(gs.forward(std::span(&one, 1)), cs.forward(std::span(&one, 1))).rel_l2, tc.tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LogitRows,
                         ::testing::Values(RowsCase{"llama-f32", 16, 0, 0, 40, 20, 1e-4},       // first inside chunk 1
                                           RowsCase{"llama-f32", 16, 5, 0, 40, 16, 1e-4},       // on a chunk boundary
                                           RowsCase{"llama-f32", 7, 3, 0, 23, 0, 1e-4},         // every row, uneven
                                           RowsCase{"qwen2-f32", 64, 6, 9, 33, 17, 1e-4},       // after cached tokens
                                           RowsCase{"llama-spm-q8_0", 32, 4, 0, 30, 29, 1e-4},  // the last row alone
                                           RowsCase{"qwen3-q8_0", 8, 1, 0, 12, 12, 1e-4}),      // no row at all
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(LogitRowsApi, Errors) {
  const GgufFile f = GgufFile::open(test::model_path("llama-f32"));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  GpuSession gs(ctx, gm, {.n_ctx = 16, .ubatch = 8});
  auto never = [](uint32_t, std::span<const float>) { FAIL() << "no rows expected"; };
  const std::vector<int32_t> too_long(17, 1), bad{int32_t(gm.config.n_vocab)};
  EXPECT_THROW(gs.forward_rows(too_long, 0, never), InvalidArgument);
  EXPECT_THROW(gs.forward_rows(bad, 0, never), InvalidArgument);
  EXPECT_THROW(gs.forward_rows({}, 0, never), InvalidArgument);
  EXPECT_EQ(gs.n_past(), 0u);
  // a block holds a whole ubatch of a small vocabulary
  EXPECT_EQ(gs.logit_rows_per_block(), 8u);
}

}  // namespace
}  // namespace wgllm

// The embedding gather (embedding.wgsl) vs the CPU reference.
#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/embedding.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

// ------------------------------------------------------------------------------- embedding

struct EmbedCase {
  const char* name;
  GgufType type;
  uint32_t n_embd, n_vocab, n_tokens;
  uint64_t max_piece_bytes = 0;
};

const EmbedCase kEmbedCases[] = {
    {"f32_d64", F32, 64, 100, 7},
    {"f32_odd_d37", F32, 37, 50, 3},
    {"f16_d896", F16, 896, 300, 75},
    {"f16_odd_d33", F16, 33, 20, 1},
    {"bf16_d128", BF16, 128, 77, 9},
    {"q8_0_d256", Q8_0, 256, 129, 64},
    {"q4_0_d96", Q4_0, 96, 65, 5},
    {"q4_1_d64", Q4_1, 64, 50, 6},
    {"q5_0_d96", Q5_0, 96, 40, 7},
    {"q5_1_d160", Q5_1, 160, 33, 3},
    {"q2_k_d256", Q2_K, 256, 20, 4},
    {"q3_k_d512", Q3_K, 512, 19, 5},
    {"q4_k_d768", Q4_K, 768, 65, 9},
    {"q5_k_d256", Q5_K, 256, 31, 3},
    {"q6_k_d512", Q6_K, 512, 33, 5},
    {"mxfp4_d96", MXFP4, 96, 65, 5},
    {"split_f16_d64", F16, 64, 500, 40, 8 * 1024},
    {"split_q6_k_d256", Q6_K, 256, 97, 30, 4 * 1024},
    {"split_q5_0_d64", Q5_0, 64, 101, 20, 1024},
    {"split_q4_0_d128", Q4_0, 128, 333, 75, 4 * 1024},
    {"split_mxfp4_d96", MXFP4, 96, 301, 40, 2 * 1024},
};

class EmbeddingTable : public ::testing::TestWithParam<EmbedCase> {};

TEST_P(EmbeddingTable, MatchesCpuReference) {
  const auto& c = GetParam();
  auto& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const auto bytes = random_weight(c.type, c.n_embd, c.n_vocab, gen);
  const auto table = kernels::upload_weight(ctx, c.type, c.n_embd, c.n_vocab, bytes, c.name, c.max_piece_bytes);
  if (c.max_piece_bytes) {
    EXPECT_GT(table.pieces.size(), 1u);
  }
  std::uniform_int_distribution<uint32_t> id(0, c.n_vocab - 1);
  std::vector<uint32_t> ids(c.n_tokens);
  for (auto& i : ids) i = id(gen);
  ids[0] = c.n_vocab - 1;
  if (c.n_tokens > 2) ids[2] = c.n_vocab + 5;  // out of range: a zero row
  auto ibuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "ids");
  auto out = poisoned(ctx, size_t(c.n_tokens) * c.n_embd, "out");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_embedding(batch, ctx, table, ibuf, out, c.n_tokens);
  batch.submit_and_wait();
  const auto got = ctx.read<float>(out);
  const auto want = cpu::embedding(c.type, bytes, c.n_embd, c.n_vocab, ids);
  const auto r = compare(got, want);
  EXPECT_EQ(r.rel_l2, 0.0) << r.describe();  // a gather is exact
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbeddingTable, ::testing::ValuesIn(kEmbedCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace wgllm::test

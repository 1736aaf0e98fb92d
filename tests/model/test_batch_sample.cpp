// GpuBatchDecode::step_sample: each row's token drawn on the GPU with its own settings, uniform and recent ids is the
// id sample.wgsl draws from that sequence's logits alone, whatever the other rows are.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/sample.h"
#include "gguf/file.h"
#include "kernels/sample.h"
#include "model/batch_decode.h"
#include "model/transformer.h"
#include "model_util.h"
#include "test_util.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

// The id encode_sample draws from `logits` alone (a ring of the recent ids and one free slot).
uint32_t sample_alone(gpu::Context& ctx, const std::vector<float>& logits, const kernels::SampleRow& row) {
  const uint32_t n = uint32_t(logits.size());
  auto v = ctx.upload<float>(logits, WGPUBufferUsage_Storage, "logits");
  std::vector<uint32_t> ring = row.recent;
  ring.push_back(0);
  auto ring_buf = ctx.upload<uint32_t>(ring, WGPUBufferUsage_Storage, "recent");
  auto scratch = ctx.create_buffer(kernels::sample_scratch_bytes(n), WGPUBufferUsage_Storage, "scratch");
  auto out = ctx.create_buffer(4, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "out");
  const kernels::SampleRecent r{.ids = &ring_buf,
                                .cap = uint32_t(ring.size()),
                                .n_recent = uint32_t(row.recent.size()),
                                .write_slot = uint32_t(row.recent.size())};
  gpu::ComputeBatch batch(ctx);
  kernels::encode_sample(batch, ctx, row.settings, row.u, v, n, r, scratch, out);
  batch.submit_and_wait();
  return ctx.read<uint32_t>(out)[0];
}

class BatchSample : public ::testing::TestWithParam<std::string> {};

// Three sessions take steps in changing company (all three, two, one), each row with other settings: the fast path
// (top-k within the vocabulary's chunks), the general one, a penalty over recent ids, greedy. Every id equals the one
// encode_sample draws from the logits of a twin session stepped alone; the logits asked for come back as the twin's.
TEST_P(BatchSample, RowsDrawAsIfAlone) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  gpu::Context& ctx = test::context();
  const GpuModel gm = load_gpu_model(ctx, f);
  const uint32_t V = gm.config.n_vocab;
  auto gen = test::rng(77);
  std::uniform_int_distribution<int32_t> any(0, int32_t(V) - 1);
  std::vector<std::unique_ptr<GpuSession>> together, alone;
  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt;
    for (uint32_t j = 0; j < 4 + 3 * i; ++j) prompt.push_back(any(gen));
    for (auto* v : {&together, &alone}) {
      v->push_back(std::make_unique<GpuSession>(
          ctx, gm, GpuSessionOptions{.n_ctx = 64, .ubatch = 8, .kv_type = kernels::KvType::F32}));
      v->back()->forward(prompt);
    }
  }
  const kernels::SampleSettings settings[] = {
      {.temperature = 1.f, .top_k = 2},
      {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f},
      {.temperature = 1.1f, .top_p = 0.95f, .repeat_penalty = 1.3f},
      {.temperature = 0.f},
  };
  ASSERT_TRUE(kernels::sample_fast_path(V, settings[0])) << "vocabulary " << V;
  GpuBatchDecode bd(ctx, gm, 3), bd_alone(ctx, gm, 3);
  ASSERT_TRUE(bd.samples_rows());
  std::vector<int32_t> next(3);
  for (int32_t& id : next) id = any(gen);
  const std::vector<std::vector<uint32_t>> groups = {{0, 1, 2}, {2, 0}, {1}, {0, 1, 2}, {0, 1, 2}};
  for (size_t k = 0; k < groups.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    std::vector<GpuSession*> s;
    std::vector<int32_t> ids;
    std::vector<kernels::SampleRow> rows;
    for (uint32_t i : groups[k]) {
      s.push_back(together[i].get());
      ids.push_back(next[i]);
      kernels::SampleRow row{.settings = settings[(i + k) % 4], .u = cpu::uniform_from_bits(gen()), .recent = {}};
      if (row.settings.repeat_penalty != 1.f)
        for (int32_t t : together[i]->tokens()) row.recent.push_back(uint32_t(t));
      rows.push_back(row);
    }
    std::vector<float> logits;
    const std::vector<int32_t> chosen = bd.step_sample(s, ids, rows, k % 2 ? &logits : nullptr);
    ASSERT_EQ(chosen.size(), groups[k].size());
    for (size_t j = 0; j < groups[k].size(); ++j) {
      const uint32_t i = groups[k][j];
      GpuSession* one[] = {alone[i].get()};
      const std::vector<float> want = bd_alone.step(one, std::span(&ids[j], 1));
      EXPECT_EQ(uint32_t(chosen[j]), sample_alone(ctx, want, rows[j])) << "sequence " << i;
      if (k % 2) {
        EXPECT_EQ(std::memcmp(logits.data() + j * V, want.data(), size_t(V) * 4), 0) << "sequence " << i << " logits";
      }
      next[i] = chosen[j];
    }
  }
  GpuSession* s[] = {together[0].get()};
  const int32_t id = 0;
  EXPECT_THROW(bd.step_sample(s, std::span(&id, 1), {}), InvalidArgument) << "no row for the session";
}

INSTANTIATE_TEST_SUITE_P(Models, BatchSample, ::testing::Values("llama-f32", "qwen35-tiny-f32"),
                         test::model_param_name);

}  // namespace
}  // namespace wgllm

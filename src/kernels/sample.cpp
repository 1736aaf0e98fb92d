#include "kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

SampleChunks sample_chunks(uint32_t n) {
  const uint64_t wg = kSampleWorkgroup;
  const uint64_t per_lane = std::max<uint64_t>(1, (uint64_t(n) + wg * wg - 1) / (wg * wg));
  return {.n_chunks = uint32_t((n + wg * per_lane - 1) / (wg * per_lane)), .per_lane = uint32_t(per_lane)};
}

bool sample_fast_path(uint32_t n, const SampleSettings& s) {
  return s.temperature > 0 && s.repeat_penalty == 1.f && s.top_k > 0 && s.top_k < n &&
         s.top_k <= sample_chunks(n).n_chunks;
}

void encode_sample(gpu::ComputeBatch& batch, gpu::Context& ctx, const SampleSettings& s, float u,
                   const gpu::Buffer& logits, uint32_t n, const SampleRecent& recent, const gpu::Buffer& scratch,
                   const gpu::Buffer& out, uint32_t out_index) {
  const char* fn = "encode_sample";
  if (n == 0) fail(fn, "n must be > 0");
  if (!std::isfinite(s.temperature)) fail(fn, "temperature " + num(s.temperature) + " must be finite");
  if (!(s.top_p >= 0 && s.top_p <= 1)) fail(fn, "top_p " + num(s.top_p) + " must be in [0, 1]");
  if (!(s.min_p >= 0 && s.min_p <= 1)) fail(fn, "min_p " + num(s.min_p) + " must be in [0, 1]");
  if (!std::isfinite(s.repeat_penalty) || !(s.repeat_penalty > 0))
    fail(fn, "repeat_penalty " + num(s.repeat_penalty) + " must be finite and > 0");
  if (!(u >= 0 && u < 1)) fail(fn, "u " + num(u) + " must be in [0, 1)");
  if (!recent.ids) fail(fn, "recent.ids must be a buffer (at least 4 bytes, also when cap is 0)");
  if (recent.n_recent > recent.cap)
    fail(fn,
         "recent.n_recent " + std::to_string(recent.n_recent) + " exceeds recent.cap " + std::to_string(recent.cap));
  if (recent.cap && recent.write_slot >= recent.cap)
    fail(fn, "recent.write_slot " + std::to_string(recent.write_slot) + " must be < recent.cap " +
                 std::to_string(recent.cap));
  need(fn, "logits", logits, uint64_t(n) * 4, ctx);
  need(fn, "scratch", scratch, sample_scratch_bytes(n), ctx);
  need(fn, "out", out, (uint64_t(out_index) + 1) * 4, ctx);
  const uint64_t recent_bytes = std::max<uint64_t>(4, uint64_t(recent.cap) * 4);
  need(fn, "recent.ids", *recent.ids, recent_bytes, ctx);
  const WGPUBuffer distinct[] = {logits.get(), scratch.get(), out.get(), recent.ids->get()};
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b)
      if (distinct[a] == distinct[b]) fail(fn, "logits, recent.ids, scratch and out must be four different buffers");

  const SampleChunks ch = sample_chunks(n);
  const uint32_t top_k = s.top_k == 0 || s.top_k >= n ? n : s.top_k;
  const bool fast = sample_fast_path(n, s);
  const uint32_t n_chunks = ch.n_chunks, per_lane = ch.per_lane;
  const SampleParams p{.n = n,
                       .top_k = top_k,
                       .top_p = s.top_p,
                       .min_p = s.min_p,
                       .temperature = s.temperature,
                       .penalty = s.repeat_penalty,
                       .inv_penalty = 1.f / s.repeat_penalty,
                       .u = u,
                       .n_recent = recent.n_recent,
                       .recent_slot = recent.write_slot,
                       .recent_cap = recent.cap,
                       .out_index = out_index,
                       .fast = fast ? 1u : 0u,
                       .n_chunks = n_chunks,
                       .per_lane = per_lane,
                       .pad = 0};
  const gpu::BufferBinding params = batch.uniform(0, p);
  const gpu::BufferBinding in = {1, &logits, 0, uint64_t(n) * 4};
  const gpu::BufferBinding ring = {2, recent.ids, 0, recent_bytes};
  const gpu::BufferBinding work = {3, &scratch, 0, sample_scratch_bytes(n)};
  const gpu::BufferBinding answer = {4, &out, 0, (uint64_t(out_index) + 1) * 4};
  const gpu::BufferBinding prepare[] = {params, in, ring, work, answer};
  const gpu::BufferBinding select[] = {params, work};
  const gpu::BufferBinding draw[] = {params, ring, work, answer};
  if (fast) {
    const gpu::BufferBinding scan[] = {params, in, work};
    const gpu::BufferBinding floor[] = {params, ring, work, answer};
    const gpu::BufferBinding gather[] = {params, work};
    batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_chunk_max", {}, ""}), scan, n_chunks);
    batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_floor", {}, ""}), floor, 1);
    batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_chunk_keep", {}, ""}), scan, n_chunks);
    batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_gather", {}, ""}), gather, 1);
  } else {
    batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_prepare", {}, ""}), prepare, 1);
  }
  batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_select", {}, ""}), select, 1);
  batch.dispatch(ctx.pipeline({"sample.wgsl", "sample_draw", {}, ""}), draw, 1);
}

}  // namespace wgllm::kernels

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

namespace {

void check_settings(const char* fn, const SampleSettings& s, float u) {
  if (!std::isfinite(s.temperature)) fail(fn, "temperature " + num(s.temperature) + " must be finite");
  if (!(s.top_p >= 0 && s.top_p <= 1)) fail(fn, "top_p " + num(s.top_p) + " must be in [0, 1]");
  if (!(s.min_p >= 0 && s.min_p <= 1)) fail(fn, "min_p " + num(s.min_p) + " must be in [0, 1]");
  if (!std::isfinite(s.repeat_penalty) || !(s.repeat_penalty > 0))
    fail(fn, "repeat_penalty " + num(s.repeat_penalty) + " must be finite and > 0");
  if (!(u >= 0 && u < 1)) fail(fn, "u " + num(u) + " must be in [0, 1)");
}

// A row's parameters, its recent ids' ring given.
SampleParams params_for(uint32_t n, const SampleSettings& s, float u, uint32_t n_recent, uint32_t write_slot,
                        uint32_t cap, uint32_t out_index) {
  const SampleChunks ch = sample_chunks(n);
  return {.n = n,
          .top_k = s.top_k == 0 || s.top_k >= n ? n : s.top_k,
          .top_p = s.top_p,
          .min_p = s.min_p,
          .temperature = s.temperature,
          .penalty = s.repeat_penalty,
          .inv_penalty = 1.f / s.repeat_penalty,
          .u = u,
          .n_recent = n_recent,
          .recent_slot = write_slot,
          .recent_cap = cap,
          .out_index = out_index,
          .fast = sample_fast_path(n, s) ? 1u : 0u,
          .n_chunks = ch.n_chunks,
          .per_lane = ch.per_lane,
          .logits_base = 0};
}

// The general path's and the fast path's dispatches over `rows` rows (y), with `any_fast` / `any_general` of them.
void dispatch_sample(gpu::ComputeBatch& batch, gpu::Context& ctx, const std::string& prelude,
                     const gpu::BufferBinding& params, const gpu::BufferBinding& in, const gpu::BufferBinding& ring,
                     const gpu::BufferBinding& work, const gpu::BufferBinding& answer, uint32_t n, uint32_t rows,
                     bool any_fast, bool any_general) {
  const uint32_t n_chunks = sample_chunks(n).n_chunks;
  auto pipe = [&](const char* entry) { return ctx.pipeline({"sample.wgsl", entry, {}, prelude}); };
  if (any_fast) {
    const gpu::BufferBinding scan[] = {params, in, work};
    const gpu::BufferBinding floor[] = {params, ring, work, answer};
    const gpu::BufferBinding gather[] = {params, work};
    batch.dispatch(pipe("sample_chunk_max"), scan, n_chunks, rows);
    batch.dispatch(pipe("sample_floor"), floor, 1, rows);
    batch.dispatch(pipe("sample_chunk_keep"), scan, n_chunks, rows);
    batch.dispatch(pipe("sample_gather"), gather, 1, rows);
  }
  if (any_general) {
    const gpu::BufferBinding prepare[] = {params, in, ring, work, answer};
    batch.dispatch(pipe("sample_prepare"), prepare, 1, rows);
  }
  const gpu::BufferBinding select[] = {params, work};
  const gpu::BufferBinding draw[] = {params, ring, work, answer};
  batch.dispatch(pipe("sample_select"), select, 1, rows);
  batch.dispatch(pipe("sample_draw"), draw, 1, rows);
}

const char* kOneRow = "fn params_of(row: u32) -> SampleParams { return one; }\n";
const char* kRows =
    "@group(0) @binding(5) var<storage, read> rows: array<SampleParams>;\n"
    "fn params_of(row: u32) -> SampleParams { return rows[row]; }\n";

}  // namespace

void encode_sample(gpu::ComputeBatch& batch, gpu::Context& ctx, const SampleSettings& s, float u,
                   const gpu::Buffer& logits, uint32_t n, const SampleRecent& recent, const gpu::Buffer& scratch,
                   const gpu::Buffer& out, uint32_t out_index) {
  const char* fn = "encode_sample";
  if (n == 0) fail(fn, "n must be > 0");
  check_settings(fn, s, u);
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

  const SampleParams p = params_for(n, s, u, recent.n_recent, recent.write_slot, recent.cap, out_index);
  dispatch_sample(batch, ctx, kOneRow, batch.uniform(0, p), {1, &logits, 0, uint64_t(n) * 4},
                  {2, recent.ids, 0, recent_bytes}, {3, &scratch, 0, sample_scratch_bytes(n)},
                  {4, &out, 0, (uint64_t(out_index) + 1) * 4}, n, 1, p.fast != 0, p.fast == 0);
}

void encode_sample_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, std::span<const SampleRow> rows,
                        const gpu::Buffer& logits, uint32_t n, const gpu::Buffer& params, const gpu::Buffer& recent_ids,
                        const gpu::Buffer& scratch, const gpu::Buffer& out) {
  const char* fn = "encode_sample_rows";
  const uint32_t R = uint32_t(rows.size());
  if (n == 0) fail(fn, "n must be > 0");
  if (R == 0) fail(fn, "rows must not be empty");
  if (R > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, std::to_string(R) + " rows exceed the workgroups per dimension");
  const uint64_t scratch_words = sample_scratch_bytes(n) / 4;
  if (uint64_t(R) * n > UINT32_MAX || R * scratch_words > UINT32_MAX)
    fail(fn, std::to_string(R) + " rows of " + std::to_string(n) + " exceed 32-bit offsets");
  std::vector<SampleParams> table;
  std::vector<uint32_t> ids;
  bool any_fast = false, any_general = false;
  for (uint32_t i = 0; i < R; ++i) {
    check_settings(fn, rows[i].settings, rows[i].u);
    SampleParams p = params_for(n, rows[i].settings, rows[i].u, uint32_t(rows[i].recent.size()), 0, 0, i);
    p.logits_base = i * n;
    p.scratch_base = uint32_t(i * scratch_words);
    p.recent_base = uint32_t(ids.size());
    ids.insert(ids.end(), rows[i].recent.begin(), rows[i].recent.end());
    (p.fast ? any_fast : any_general) = true;
    table.push_back(p);
  }
  const uint64_t ids_bytes = std::max<uint64_t>(4, ids.size() * 4);
  need(fn, "logits", logits, uint64_t(R) * n * 4, ctx);
  need(fn, "params", params, sample_rows_params_bytes(R), ctx);
  need(fn, "recent_ids", recent_ids, ids_bytes, ctx);
  need(fn, "scratch", scratch, sample_rows_scratch_bytes(R, n), ctx);
  need(fn, "out", out, uint64_t(R) * 4, ctx);
  const WGPUBuffer distinct[] = {logits.get(), params.get(), recent_ids.get(), scratch.get(), out.get()};
  for (int a = 0; a < 5; ++a)
    for (int b = a + 1; b < 5; ++b)
      if (distinct[a] == distinct[b]) fail(fn, "logits, params, recent_ids, scratch and out must be five buffers");
  ctx.write_buffer(params, 0, table.data(), table.size() * sizeof(SampleParams));
  if (!ids.empty()) ctx.write_buffer(recent_ids, 0, ids.data(), ids.size() * 4);
  dispatch_sample(batch, ctx, kRows, {5, &params, 0, sample_rows_params_bytes(R)}, {1, &logits, 0, uint64_t(R) * n * 4},
                  {2, &recent_ids, 0, ids_bytes}, {3, &scratch, 0, sample_rows_scratch_bytes(R, n)},
                  {4, &out, 0, uint64_t(R) * 4}, n, R, any_fast, any_general);
}

}  // namespace wgllm::kernels

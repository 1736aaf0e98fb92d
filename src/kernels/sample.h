// Sampling on the GPU (sample.wgsl): repetition penalty, top-k, top-p, min-p, temperature and an inverse-CDF draw
// with a uniform the host supplies. cpu::sample_reference (src/cpu/sample.h) is the same algorithm on the host.
// Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/batch.h"

namespace wgllm::kernels {

// The filters of one sampling mode (llama.cpp's order: penalty, top-k, top-p, min-p, temperature).
struct SampleSettings {
  float temperature = 1.f;     // <= 0: greedy (the argmax after the penalty)
  uint32_t top_k = 0;          // 0 or >= n: off
  float top_p = 1.f;           // [0, 1]; 1: off
  float min_p = 0.f;           // [0, 1]; 0: off (keeps w >= min_p, w = exp(logit - max logit))
  float repeat_penalty = 1.f;  // > 0; 1: off
};

// sample.wgsl's workgroup size (WG): also the most chunks of its fast path.
inline constexpr uint32_t kSampleWorkgroup = 256;

// Mirrors `SampleParams` in sample.wgsl.
struct SampleParams {
  uint32_t n, top_k;
  float top_p, min_p, temperature, penalty, inv_penalty, u;
  uint32_t n_recent, recent_slot, recent_cap, out_index;
  uint32_t fast, n_chunks, per_lane, logits_base;
  uint32_t scratch_base = 0, recent_base = 0, pad0 = 0, pad1 = 0;  // words; sample_rows: row i's
};
static_assert(sizeof(SampleParams) == 80);

// Scratch bytes encode_sample needs for n logits.
inline uint64_t sample_scratch_bytes(uint32_t n) { return 4ull * (16 + 4ull * n + 3 * kSampleWorkgroup); }

// What encode_sample writes when a logit is NaN or infinite.
inline constexpr uint32_t kSampleNonFinite = 0xffffffffu;

// The fast path's chunks of the vocabulary: at most kSampleWorkgroup of them, each kSampleWorkgroup * per_lane ids.
struct SampleChunks {
  uint32_t n_chunks, per_lane;
};
SampleChunks sample_chunks(uint32_t n);
// Whether encode_sample takes the fast path: no penalty, temperature > 0, 0 < top_k < n and top_k <= n_chunks.
bool sample_fast_path(uint32_t n, const SampleSettings& s);

// The recent ids the penalty looks at: a ring of `cap` u32 slots of which the first n_recent hold ids (their order
// does not matter); the chosen id is written to slot `write_slot` (when cap > 0), so the next step sees it without
// the host. cap 0: no ring (the buffer is still bound, at least 4 bytes).
struct SampleRecent {
  const gpu::Buffer* ids = nullptr;
  uint32_t cap = 0, n_recent = 0, write_slot = 0;
};

// out[out_index] (u32) = the id drawn from logits[0, n) (f32) with uniform u in [0, 1) as cpu::sample_reference
// draws it, or kSampleNonFinite when any logit is NaN or infinite. Three dispatches of one workgroup, or, without a
// penalty and with 0 < top_k <= the chunks of the vocabulary (sample.wgsl), six whose passes over all n logits
// spread over the GPU; scratch: sample_scratch_bytes(n).
void encode_sample(gpu::ComputeBatch& batch, gpu::Context& ctx, const SampleSettings& settings, float u,
                   const gpu::Buffer& logits, uint32_t n, const SampleRecent& recent, const gpu::Buffer& scratch,
                   const gpu::Buffer& out, uint32_t out_index = 0);

// One row of encode_sample_rows: its settings, uniform and recent ids (the penalty's; read, not appended to).
struct SampleRow {
  SampleSettings settings;
  float u = 0;
  std::vector<uint32_t> recent;
};
// Buffers encode_sample_rows writes and reads: the rows' parameters, their recent ids, and the scratch of each row.
inline uint64_t sample_rows_params_bytes(uint32_t rows) { return uint64_t(rows) * sizeof(SampleParams); }
inline uint64_t sample_rows_scratch_bytes(uint32_t rows, uint32_t n) { return rows * sample_scratch_bytes(n); }
// Several rows at once (continuous batching): out[i] (u32) = the id encode_sample would draw from row i of logits
// ([rows.size()][n] f32) with row i's settings, uniform and recent ids, or kSampleNonFinite; each row the same bits
// as alone. Writes the rows' parameters into `params` (sample_rows_params_bytes) and their recent ids into
// `recent_ids` (at least 4 bytes, and their count), then the dispatches: the fast path's for the rows that take it,
// the general path's for the others, each dispatch one workgroup (or chunk) per row.
void encode_sample_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, std::span<const SampleRow> rows,
                        const gpu::Buffer& logits, uint32_t n, const gpu::Buffer& params, const gpu::Buffer& recent_ids,
                        const gpu::Buffer& scratch, const gpu::Buffer& out);

}  // namespace wgllm::kernels

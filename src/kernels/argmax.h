// Greedy sampling on the GPU (argmax.wgsl). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `ArgmaxParams` in argmax.wgsl.
struct ArgmaxParams {
  uint32_t n, chunk, n_partials, out_index;
};
static_assert(sizeof(ArgmaxParams) == 16);

// Scratch bytes encode_argmax needs for `rows` rows of n values (one (value, index) pair per chunk).
uint64_t argmax_scratch_bytes(uint32_t n, uint32_t rows = 1);

// What encode_argmax writes when a value is NaN or infinite.
inline constexpr uint32_t kArgmaxNonFinite = 0xffffffffu;

// out[out_index + r] (u32) = the index of the largest of row r's values[r n, r n + n) (f32), r < rows, the lowest
// index among equals; or kArgmaxNonFinite when any value of the row is NaN or infinite (logits that are mean the
// forward pass broke down). Two dispatches whatever the rows; scratch: argmax_scratch_bytes(n, rows).
void encode_argmax(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& values, uint32_t n,
                   const gpu::Buffer& scratch, const gpu::Buffer& out, uint32_t out_index = 0, uint32_t rows = 1);

}  // namespace wgllm::kernels

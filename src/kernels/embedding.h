// The embedding gather (embedding.wgsl): token ids -> rows of an embedding table kept in its GGUF type
// (weight.h), dequantised to f32. Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"
#include "kernels/weight.h"

namespace wgllm::kernels {

// out[t][0 .. n_in) = row ids[t] of `table` (an embedding stored as ne = [n_embd, n_vocab]),
// dequantised to f32. ids: [n_tokens] u32; ids >= n_vocab give zero rows.
void encode_embedding(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& table, const gpu::Buffer& ids,
                      const gpu::Buffer& out, uint32_t n_tokens);

}  // namespace wgllm::kernels

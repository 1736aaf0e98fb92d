// A kernel for the GPU runtime's own tests (and the dispatch-overhead run of wgllm-bench ops): out = a + b over
// f32 vectors, from tests/gpu/elementwise.wgsl. Not part of the library; the binaries that use it embed the
// shader themselves (test_shaders.h).
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::test {

// Mirrors `ElementwiseParams` in elementwise.wgsl.
struct ElementwiseParams {
  uint32_t n;
  uint32_t grid_x;
  uint32_t pad0 = 0, pad1 = 0;
};
static_assert(sizeof(ElementwiseParams) == 16);

// out[i] = a[i] + b[i] for i < n. All three buffers hold at least n f32. The context must find
// "elementwise.wgsl" (ContextOptions::extra_shaders).
void encode_add(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& a, const gpu::Buffer& b,
                const gpu::Buffer& out, uint64_t n);

}  // namespace wgllm::test

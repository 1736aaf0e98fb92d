// SwiGLU (swiglu.wgsl) on its own, for gate and up weights of different types (the matmul epilogue fuses it
// otherwise). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// The gate's activation: silu (SwiGLU), GELU with the tanh approximation (GeGLU, gemma), or gpt-oss's clamped
// SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7), out = g sigmoid(1.702 g) (u + 1) (llama.cpp's swiglu_oai); or the
// sigmoid alone, out = sigmoid(gate) * up (qwen35's gated attention output; on its own, not as a matmul epilogue).
enum class GateAct : uint32_t { Silu = 0, GeluTanh = 1, SwigluOai = 2, Sigmoid = 3 };

// Mirrors `SwigluParams` in swiglu.wgsl.
struct SwigluParams {
  uint32_t n, grid_x, act = 0, width = 0;
  uint32_t up_stride = 0, up_offset = 0, pad0 = 0, pad1 = 0;
};
static_assert(sizeof(SwigluParams) == 32);

// Where encode_swiglu reads up from: rows of `width` floats, `stride` floats apart, the first at `offset`
// (width 0: up[i], contiguous).
struct UpRows {
  uint32_t width = 0, stride = 0, offset = 0;
};

// out[i] = act(gate[i]) * up[i] for i < n; out must differ from gate and up.
// With up_rows.width > 0: out[i] = act(gate[i]) * up[(i / width) * stride + offset + i % width] (n a multiple of
// width, offset + width <= stride).
void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n, GateAct act = GateAct::Silu, UpRows up_rows = {});

}  // namespace wgllm::kernels

// Host encoders for the small forward-pass kernels: RMSNorm (norm.wgsl), RoPE (rope.wgsl), SwiGLU
// (swiglu.wgsl), qwen3's decode step between the q/k/v product and attention (qk_norm_rope_kv.wgsl) and greedy
// sampling (argmax.wgsl). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"
#include "model/config.h"

namespace wgllm::kernels {

// Mirrors `NormParams` in norm.wgsl.
struct NormParams {
  uint32_t n_rows, dim;
  float eps;
  uint32_t grid_x;
};
static_assert(sizeof(NormParams) == 16);

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for n_rows rows of `dim` f32; w: [dim] f32.
// x and y may be the same buffer (in place). Per-head q/k norm: n_rows = tokens * heads,
// dim = head_dim.
void encode_rms_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w,
                     const gpu::Buffer& y, uint32_t n_rows, uint32_t dim, float eps);

// llama3 frequency scaling: the divisor of each of the rope_dim / 2 frequencies (1 for high
// frequencies, `factor` for low ones, a smooth blend between). All ones when !s.enabled.
std::vector<float> rope_freq_factors(const RopeScaling& s, uint32_t rope_dim, float base);

// The frequency table encode_rope reads: for i < rope_dim / 2, base^(-2i/rope_dim) / factor[i]
// (factors optional, e.g. rope_freq_factors() or a GGUF rope_freqs tensor) in turns per
// position, computed in double and split into three f32 (see rope_angle.wgsl): angles stay accurate
// to ~1e-6 rad for positions < 2^16. 16 bytes per entry.
gpu::Buffer upload_rope_table(gpu::Context& ctx, uint32_t rope_dim, float base,
                              std::span<const float> freq_factors = {});

struct RopeShape {
  uint32_t n_tokens = 0;
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;
  uint32_t rope_dim = 0;     // 0 = head_dim; even, <= head_dim
  uint32_t start_pos = 0;    // token t sits at position start_pos + t (< 2^24)
  RopeType type = RopeType::Normal;
  uint32_t row_stride = 0;   // floats between token rows (0 = n_heads * head_dim)
  uint32_t head_offset = 0;  // floats from a row's start to its first head (e.g. k inside fused qkv)
  uint32_t n_heads2 = 0;     // heads of the second buffer x2 ([n_tokens][n_heads2 * head_dim]), same dispatch
};

// Mirrors `RopeParams` in rope.wgsl.
struct RopeParams {
  uint32_t n_tokens, n_heads, head_dim, rope_dim;
  uint32_t start_pos, neox, row_stride, head_offset;
  uint32_t grid_x, n_heads2, pad1 = 0, pad2 = 0;
};
static_assert(sizeof(RopeParams) == 48);

// RoPE in place on x ([n_tokens][row_stride] f32) with the table from upload_rope_table(rope_dim), and on
// *x2 (another buffer) when shape.n_heads2 > 0: q and k in one dispatch.
void encode_rope(gpu::ComputeBatch& batch, gpu::Context& ctx, const RopeShape& shape, const gpu::Buffer& table,
                 const gpu::Buffer& x, const gpu::Buffer* x2 = nullptr);

// Mirrors `Params` in qk_norm_rope_kv.wgsl.
struct QkNormRopeKvParams {
  uint32_t n_head, n_kv, head_dim, rope_dim;
  uint32_t pos, neox, kv_f16, kv_k_off;
  uint32_t kv_v_off;
  float eps;
  uint32_t pad0 = 0, pad1 = 0;
};
static_assert(sizeof(QkNormRopeKvParams) == 48);

struct QkNormRopeKvShape {
  uint32_t n_head = 0, n_kv = 0;
  uint32_t head_dim = 0;  // even, <= 512
  uint32_t rope_dim = 0;  // 0 = head_dim; even, <= head_dim
  RopeType type = RopeType::Normal;
  uint32_t pos = 0;       // the token's position, < the cache's max_seq
  float eps = 1e-6f;
};

// One decoded token of a model with per-head q/k norm (qwen3), in one dispatch: every q head becomes
// rope(rms_norm(q_h) * q_norm) in place, every k head rope(rms_norm(k_h) * k_norm) written into the cache at
// s.pos, every v head copied there. q: [n_head * head_dim], k, v: [n_kv * head_dim] f32; q_norm, k_norm:
// [head_dim]; table from upload_rope_table(rope_dim).
void encode_qk_norm_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                            const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& q_norm, const gpu::Buffer& k_norm, KvCache& kv);

// Mirrors `SwigluParams` in swiglu.wgsl.
struct SwigluParams {
  uint32_t n, grid_x, pad0 = 0, pad1 = 0;
};
static_assert(sizeof(SwigluParams) == 16);

// out[i] = silu(gate[i]) * up[i] for i < n; out must differ from gate and up.
void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n);

// Mirrors `ArgmaxParams` in argmax.wgsl.
struct ArgmaxParams {
  uint32_t n, chunk, n_partials, out_index;
};
static_assert(sizeof(ArgmaxParams) == 16);

// Scratch bytes encode_argmax needs for n values (one (value, index) pair per chunk).
uint64_t argmax_scratch_bytes(uint32_t n);

// out[out_index] (u32) = the index of the largest of values[0, n) (f32): the lowest index among equals, NaN never
// wins, 0 when nothing beats -inf. Two dispatches; scratch: argmax_scratch_bytes(n).
void encode_argmax(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& values, uint32_t n,
                   const gpu::Buffer& scratch, const gpu::Buffer& out, uint32_t out_index = 0);

}  // namespace wgllm::kernels

// Rotary position embedding (rope.wgsl; the angles in rope_angle.wgsl, shared with the fused decode kernels):
// the RoPE variants, llama3 frequency scaling, the frequency table on the GPU and the RoPE of q and k over a chunk.
// Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Normal: rotate adjacent pairs (x[2i], x[2i+1]) — llama-style GGUFs (Q/K rows permuted at conversion).
// Neox:   rotate halves (x[i], x[i + head_dim/2]) — qwen2 / qwen3.
enum class RopeType { Normal, Neox };

// Frequency scaling for contexts past the trained one ("rope.scaling.type"): llama3's, or YaRN (gpt-oss, Qwen with
// long contexts), as llama.cpp applies them.
enum class RopeScalingKind : uint8_t { Llama3, Yarn };
struct RopeScaling {
  bool enabled = false;
  RopeScalingKind kind = RopeScalingKind::Llama3;
  float factor = 1.f;
  float low_freq_factor = 1.f;   // llama3
  float high_freq_factor = 4.f;  // llama3
  uint32_t original_context = 8192;
  float beta_fast = 32.f, beta_slow = 1.f;  // YaRN: the rotations per original context that bound the blend
  float attn_factor = 1.f;                  // YaRN: rope.scaling.attn_factor, a multiplier of the magnitude scale
};

// The divisor of each of the rope_dim / 2 frequencies base^(-2i/rope_dim). All ones when !s.enabled.
//   llama3: 1 for high frequencies, `factor` for low ones, a smooth blend between.
//   YaRN: the frequency f/factor * (1 - r_i) + f * r_i, r_i = 1 - clamp((i - lo) / max(hi - lo, 0.001), 0, 1) with
//         lo, hi the dimensions (floored, ceiled, clamped to [0, rope_dim - 1]) whose wavelength makes beta_fast and
//         beta_slow turns over original_context positions (ggml_rope_yarn_corr_dims).
std::vector<float> rope_freq_factors(const RopeScaling& s, uint32_t rope_dim, float base);
// YaRN's magnitude scale: every rotated pair is multiplied by it, attn_factor * (1 + 0.1 ln factor) (1 without YaRN or
// for factor <= 1). The RoPE kernels rotate without it; the model folds its square into the q.k scale. (Inline: the
// config, which links without the kernels, uses it.)
inline float rope_yarn_mscale(const RopeScaling& s) {
  if (!s.enabled || s.kind != RopeScalingKind::Yarn) return 1.f;
  const double m = s.factor > 1.f ? 1.0 + 0.1 * std::log(double(s.factor)) : 1.0;
  return float(double(s.attn_factor) * m);
}

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
  uint32_t rope_dim = 0;   // 0 = head_dim; even, <= head_dim
  uint32_t start_pos = 0;  // token t sits at position start_pos + t (< 2^24)
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

}  // namespace wgllm::kernels

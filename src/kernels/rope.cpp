#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {

// v rounded to `bits` significant bits.
double round_bits(double v, int bits) {
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);
  const double q = std::ldexp(1.0, e - bits);
  return std::nearbyint(v / q) * q;
}

}  // namespace

namespace {

// YaRN's divisors (rope_freq_factors).
std::vector<float> yarn_freq_factors(const RopeScaling& s, uint32_t rope_dim, float base) {
  if (!(s.factor > 0) || s.original_context == 0 || !(s.beta_fast > 0) || !(s.beta_slow > 0))
    throw InvalidArgument("rope_freq_factors: YaRN needs factor, original_context, beta_fast and beta_slow > 0");
  // the dimension pair whose wavelength turns n_rot times over the original context
  auto corr_dim = [&](double n_rot) {
    return rope_dim * std::log(double(s.original_context) / (n_rot * 2 * std::numbers::pi)) / (2 * std::log(double(base)));
  };
  const double lo = std::max(0.0, std::floor(corr_dim(s.beta_fast)));
  const double hi = std::min(double(rope_dim - 1), std::ceil(corr_dim(s.beta_slow)));
  std::vector<float> out(rope_dim / 2);
  for (uint32_t i = 0; i < rope_dim / 2; ++i) {
    const double ramp = 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
    out[i] = float(1.0 / ((1 - ramp) / s.factor + ramp));
  }
  return out;
}

}  // namespace

std::vector<float> rope_freq_factors(const RopeScaling& s, uint32_t rope_dim, float base) {
  if (rope_dim == 0 || rope_dim % 2) throw InvalidArgument("rope_freq_factors: rope_dim must be even and > 0");
  std::vector<float> out(rope_dim / 2, 1.f);
  if (!s.enabled) return out;
  if (s.kind == RopeScalingKind::Yarn) return yarn_freq_factors(s, rope_dim, base);
  if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || s.original_context == 0)
    throw InvalidArgument(
        "rope_freq_factors: llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor "
        "and original_context > 0");
  const double old_ctx = s.original_context;
  const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
  for (uint32_t i = 0; i < rope_dim / 2; ++i) {
    const double freq = std::pow(double(base), -2.0 * i / rope_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    double divisor;
    if (wavelen < high_wavelen) {
      divisor = 1;
    } else if (wavelen > low_wavelen) {
      divisor = s.factor;
    } else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      divisor = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    out[i] = float(divisor);
  }
  return out;
}

gpu::Buffer upload_rope_table(gpu::Context& ctx, uint32_t rope_dim, float base, std::span<const float> freq_factors) {
  const char* fn = "upload_rope_table";
  if (rope_dim == 0 || rope_dim % 2) fail(fn, "rope_dim " + std::to_string(rope_dim) + " must be even and > 0");
  if (!(base > 0) || !std::isfinite(base)) fail(fn, "base must be finite and > 0");
  if (!freq_factors.empty() && freq_factors.size() != rope_dim / 2)
    fail(fn, "freq_factors holds " + std::to_string(freq_factors.size()) +
                 " values, needs rope_dim / 2 = " + std::to_string(rope_dim / 2));
  std::vector<float> table(size_t(rope_dim / 2) * 4, 0.f);
  for (uint32_t i = 0; i < rope_dim / 2; ++i) {
    double f = std::pow(double(base), -2.0 * i / rope_dim);
    if (!freq_factors.empty()) {
      if (!(freq_factors[i] > 0)) fail(fn, "freq_factors[" + std::to_string(i) + "] must be > 0");
      f /= double(freq_factors[i]);
    }
    const double turns = f / (2 * std::numbers::pi);
    const double hi = round_bits(turns, 8), mid = round_bits(turns - hi, 8);
    table[i * 4] = float(hi);
    table[i * 4 + 1] = float(mid);
    table[i * 4 + 2] = float(turns - hi - mid);
  }
  return ctx.upload<float>(table, WGPUBufferUsage_Storage, "rope table");
}

void encode_rope(gpu::ComputeBatch& batch, gpu::Context& ctx, const RopeShape& s, const gpu::Buffer& table,
                 const gpu::Buffer& x, const gpu::Buffer* x2) {
  const char* fn = "encode_rope";
  if (s.n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (s.n_heads == 0) fail(fn, "n_heads must be > 0");
  if (s.head_dim == 0) fail(fn, "head_dim must be > 0");
  const uint32_t rope_dim = s.rope_dim ? s.rope_dim : s.head_dim;
  if (rope_dim % 2 || rope_dim > s.head_dim)
    fail(fn, "rope_dim " + std::to_string(rope_dim) + " must be even and <= head_dim " + std::to_string(s.head_dim));
  const uint64_t heads = uint64_t(s.n_heads) * s.head_dim;
  const uint64_t stride = s.row_stride ? s.row_stride : heads;
  if (stride < s.head_offset + heads)
    fail(fn, "row_stride " + std::to_string(stride) + " < head_offset + n_heads * head_dim");
  if (uint64_t(s.start_pos) + s.n_tokens > (1u << 24)) fail(fn, "start_pos + n_tokens must be <= 2^24");
  if ((s.n_heads2 > 0) != (x2 != nullptr)) fail(fn, "n_heads2 > 0 and x2 go together");
  if (x2 && x2->get() == x.get()) fail(fn, "x2 must be another buffer than x");
  const uint64_t threads = uint64_t(s.n_tokens) * (s.n_heads + s.n_heads2) * (rope_dim / 2);
  if (threads > UINT32_MAX) fail(fn, "n_tokens * (n_heads + n_heads2) * rope_dim / 2 exceeds 2^32");
  need(fn, "x", x, ((uint64_t(s.n_tokens) - 1) * stride + s.head_offset + heads) * 4, ctx);
  const uint64_t x2_bytes = uint64_t(s.n_tokens) * s.n_heads2 * s.head_dim * 4;
  if (x2) need(fn, "x2", *x2, x2_bytes, ctx);
  need(fn, "table", table, uint64_t(rope_dim / 2) * 16, ctx);
  constexpr uint32_t kWorkgroup = 64;
  const auto grid =
      gpu::fold_grid((threads + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  RopeParams p{};
  p.n_tokens = s.n_tokens;
  p.n_heads = s.n_heads;
  p.head_dim = s.head_dim;
  p.rope_dim = rope_dim;
  p.start_pos = s.start_pos;
  p.neox = s.type == RopeType::Neox ? 1 : 0;
  p.row_stride = uint32_t(stride);
  p.head_offset = s.head_offset;
  p.grid_x = grid.x;
  p.n_heads2 = s.n_heads2;
  WGPUComputePipeline pipe = ctx.pipeline({"rope_angle.wgsl+rope.wgsl", "rope", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &table, 0, uint64_t(rope_dim / 2) * 16},
                                  {3, &x, 0, ((uint64_t(s.n_tokens) - 1) * stride + s.head_offset + heads) * 4},
                                  {4, x2 ? x2 : &ctx.placeholder_writable(), 0, x2 ? x2_bytes : 16}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

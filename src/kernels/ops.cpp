#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "wgllm/error.h"

namespace wgllm::kernels {

namespace {

[[noreturn]] void fail(const char* fn, const std::string& what) { throw InvalidArgument(std::string(fn) + ": " + what); }

void need(const char* fn, const char* name, const gpu::Buffer& b, uint64_t bytes, const gpu::Context& ctx) {
  if (b.size < bytes)
    fail(fn, std::string(name) + " holds " + std::to_string(b.size) + " bytes, needs " + std::to_string(bytes));
  if (bytes > ctx.max_binding_size())
    fail(fn, std::string(name) + ": " + std::to_string(bytes) + " bytes exceed the storage-binding limit");
}

// v rounded to `bits` significant bits.
double round_bits(double v, int bits) {
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);
  const double q = std::ldexp(1.0, e - bits);
  return std::nearbyint(v / q) * q;
}

}  // namespace

void encode_rms_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const gpu::Buffer& w,
                     const gpu::Buffer& y, uint32_t n_rows, uint32_t dim, float eps) {
  const char* fn = "encode_rms_norm";
  if (n_rows == 0) fail(fn, "n_rows must be > 0");
  if (dim == 0) fail(fn, "dim must be > 0");
  if (!(eps >= 0) || !std::isfinite(eps)) fail(fn, "eps must be finite and >= 0");
  const uint64_t bytes = uint64_t(n_rows) * dim * 4;
  need(fn, "x", x, bytes, ctx);
  need(fn, "y", y, bytes, ctx);
  need(fn, "w", w, uint64_t(dim) * 4, ctx);
  if (w.get() == y.get()) fail(fn, "w and y must be different buffers");
  const bool in_place = x.get() == y.get();
  const auto grid = gpu::fold_grid(n_rows, ctx.limits().maxComputeWorkgroupsPerDimension);
  const NormParams p{n_rows, dim, eps, grid.x};
  WGPUComputePipeline pipe = ctx.pipeline({"norm.wgsl", "rms_norm", {{"IN_PLACE", in_place ? 1.0 : 0.0}}, ""});
  // In place, x and y are one buffer: it may be bound writable only once, so x gets the placeholder.
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  in_place ? gpu::BufferBinding{1, &ctx.placeholder_storage()}
                                           : gpu::BufferBinding{1, &x, 0, bytes},
                                  {2, &w, 0, uint64_t(dim) * 4},
                                  {3, &y, 0, bytes}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

std::vector<float> rope_freq_factors(const RopeScaling& s, uint32_t rope_dim, float base) {
  if (rope_dim == 0 || rope_dim % 2) throw InvalidArgument("rope_freq_factors: rope_dim must be even and > 0");
  std::vector<float> out(rope_dim / 2, 1.f);
  if (!s.enabled) return out;
  if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || s.original_context == 0)
    throw InvalidArgument("rope_freq_factors: llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor "
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
    fail(fn, "freq_factors holds " + std::to_string(freq_factors.size()) + " values, needs rope_dim / 2 = " +
                 std::to_string(rope_dim / 2));
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
  const auto grid = gpu::fold_grid((threads + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
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
  const gpu::BufferBinding b[] = {
      batch.uniform(0, p),
      {1, &table, 0, uint64_t(rope_dim / 2) * 16},
      {3, &x, 0, ((uint64_t(s.n_tokens) - 1) * stride + s.head_offset + heads) * 4},
      {4, x2 ? x2 : &ctx.placeholder_writable(), 0, x2 ? x2_bytes : 16}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

void encode_qk_norm_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                            const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& q_norm, const gpu::Buffer& k_norm, KvCache& kv) {
  const char* fn = "encode_qk_norm_rope_kv";
  constexpr uint32_t kMaxHeadDim = 512;  // MAX_HEAD_DIM in the shader
  if (s.n_head == 0 || s.n_kv == 0) fail(fn, "n_head and n_kv must be > 0");
  if (s.head_dim == 0 || s.head_dim % 2 || s.head_dim > kMaxHeadDim)
    fail(fn, "head_dim " + std::to_string(s.head_dim) + " must be even and <= " + std::to_string(kMaxHeadDim));
  const uint32_t rope_dim = s.rope_dim ? s.rope_dim : s.head_dim;
  if (rope_dim % 2 || rope_dim > s.head_dim)
    fail(fn, "rope_dim " + std::to_string(rope_dim) + " must be even and <= head_dim " + std::to_string(s.head_dim));
  if (!(s.eps > 0)) fail(fn, "eps must be > 0");
  const auto& kc = kv.config();
  const uint64_t kv_dim = uint64_t(s.n_kv) * s.head_dim;
  if (kc.kv_dim != kv_dim)
    fail(fn, "n_kv * head_dim " + std::to_string(kv_dim) + " must equal the cache's kv_dim " + std::to_string(kc.kv_dim));
  if (s.pos >= kc.max_seq)
    fail(fn, "position " + std::to_string(s.pos) + " is past the cache (max_seq " + std::to_string(kc.max_seq) + ")");
  const uint64_t q_bytes = uint64_t(s.n_head) * s.head_dim * 4, kv_bytes = kv_dim * 4;
  need(fn, "q", q, q_bytes, ctx);
  need(fn, "k", k, kv_bytes, ctx);
  need(fn, "v", v, kv_bytes, ctx);
  need(fn, "q_norm", q_norm, uint64_t(s.head_dim) * 4, ctx);
  need(fn, "k_norm", k_norm, uint64_t(s.head_dim) * 4, ctx);
  need(fn, "table", table, uint64_t(rope_dim / 2) * 16, ctx);
  if (q.get() == k.get() || q.get() == v.get()) fail(fn, "q must be another buffer than k and v");
  const KvCache::Location at = kv.locate(s.pos);
  if (at.v_elem + kv_dim > UINT32_MAX) fail(fn, "the cache pool is too large for 32-bit element offsets");
  QkNormRopeKvParams p{};
  p.n_head = s.n_head;
  p.n_kv = s.n_kv;
  p.head_dim = s.head_dim;
  p.rope_dim = rope_dim;
  p.pos = s.pos;
  p.neox = s.type == RopeType::Neox ? 1 : 0;
  p.kv_f16 = kc.type == KvType::F16 ? 1 : 0;
  p.kv_k_off = uint32_t(at.k_elem);
  p.kv_v_off = uint32_t(at.v_elem);
  p.eps = s.eps;
  WGPUComputePipeline pipe = ctx.pipeline({"rope_angle.wgsl+qk_norm_rope_kv.wgsl", "qk_norm_rope_kv", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &table, 0, uint64_t(rope_dim / 2) * 16},
                                  {2, &q, 0, q_bytes},
                                  {3, &k, 0, kv_bytes},
                                  {4, &v, 0, kv_bytes},
                                  {5, &q_norm, 0, uint64_t(s.head_dim) * 4},
                                  {6, &k_norm, 0, uint64_t(s.head_dim) * 4},
                                  {7, &kv.pool(at.pool)}};
  batch.dispatch(pipe, b, s.n_head + 2 * s.n_kv);
}

void encode_swiglu(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& gate, const gpu::Buffer& up,
                   const gpu::Buffer& out, uint64_t n) {
  const char* fn = "encode_swiglu";
  constexpr uint32_t kWorkgroup = 256;
  if (n == 0) fail(fn, "n must be > 0");
  if (n > UINT32_MAX) fail(fn, "n exceeds 2^32-1");
  need(fn, "gate", gate, n * 4, ctx);
  need(fn, "up", up, n * 4, ctx);
  need(fn, "out", out, n * 4, ctx);
  if (out.get() == gate.get() || out.get() == up.get()) fail(fn, "out must differ from gate and up");
  const auto grid = gpu::fold_grid((n + kWorkgroup - 1) / kWorkgroup, ctx.limits().maxComputeWorkgroupsPerDimension);
  const SwigluParams p{uint32_t(n), grid.x};
  WGPUComputePipeline pipe = ctx.pipeline({"swiglu.wgsl", "swiglu", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, p), {1, &gate, 0, n * 4}, {2, &up, 0, n * 4}, {3, &out, 0, n * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

namespace {
constexpr uint32_t kArgmaxWorkgroup = 256;
constexpr uint32_t kArgmaxChunk = 2 * kArgmaxWorkgroup;  // values per partial
}  // namespace

uint64_t argmax_scratch_bytes(uint32_t n) { return 8ull * std::max<uint32_t>(1, (n + kArgmaxChunk - 1) / kArgmaxChunk); }

void encode_argmax(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& values, uint32_t n,
                   const gpu::Buffer& scratch, const gpu::Buffer& out, uint32_t out_index) {
  const char* fn = "encode_argmax";
  if (n == 0) fail(fn, "n must be > 0");
  const uint32_t n_partials = (n + kArgmaxChunk - 1) / kArgmaxChunk;
  if (n_partials > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, "n = " + std::to_string(n) + " needs more workgroups than maxComputeWorkgroupsPerDimension");
  need(fn, "values", values, uint64_t(n) * 4, ctx);
  need(fn, "scratch", scratch, argmax_scratch_bytes(n), ctx);
  need(fn, "out", out, (uint64_t(out_index) + 1) * 4, ctx);
  if (scratch.get() == values.get() || scratch.get() == out.get() || out.get() == values.get())
    fail(fn, "values, scratch and out must be three different buffers");
  const ArgmaxParams p{n, kArgmaxChunk, n_partials, out_index};
  const gpu::BufferBinding params = batch.uniform(0, p);
  const gpu::BufferBinding part = {2, &scratch, 0, argmax_scratch_bytes(n)};
  const gpu::BufferBinding first[] = {params, {1, &values, 0, uint64_t(n) * 4}, part};
  const gpu::BufferBinding second[] = {params, part, {3, &out, 0, (uint64_t(out_index) + 1) * 4}};
  batch.dispatch(ctx.pipeline({"argmax.wgsl", "argmax_partial", {}, ""}), first, n_partials);
  batch.dispatch(ctx.pipeline({"argmax.wgsl", "argmax_final", {}, ""}), second, 1);
}

}  // namespace wgllm::kernels

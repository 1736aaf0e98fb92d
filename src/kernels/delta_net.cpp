#include "kernels/delta_net.h"

#include <algorithm>
#include <bit>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {

// The workgroup shapes of a head size: delta_rule's VB columns x KS invocations per column (KPT rows each),
// delta_conv's CW invocations.
struct Layout {
  uint32_t vb, ks, kpt, cw;
};

// Powers of two (delta_step reduces over the whole workgroup), VB x KS <= 256.
Layout layout(const DeltaShape& s) {
  const uint32_t vb = std::min(std::bit_ceil(s.dv), 32u);
  const uint32_t ks = std::min(256 / vb, std::bit_ceil(s.dk));
  return {vb, ks, (s.dk + ks - 1) / ks, std::bit_ceil(std::max(s.dk, s.dv))};
}

// delta_step_norm's: a value head's columns in one workgroup, as many invocations per column as the device allows
// up to 1024 in all, so that each holds few state rows (16 at Qwen 3.5's 128 x 128 heads: in a workgroup of 256 the
// 64 rows an invocation held took the H200 84 us a step where delta_step and the norm take 15).
Layout step_norm_layout(const gpu::Context& ctx, const DeltaShape& s) {
  uint32_t most = std::bit_floor(std::min({1024u, ctx.limits().maxComputeInvocationsPerWorkgroup,
                                           ctx.limits().maxComputeWorkgroupSizeX}));
  // workgroup memory: part_k and part_q (2 x 2 x the invocations), qk_row (2 dk)
  while (most > 256 && 4ull * (4ull * most + 2ull * s.dk) > ctx.limits().maxComputeWorkgroupStorageSize) most /= 2;
  const uint32_t vb = std::bit_ceil(s.dv), ks = std::max(1u, std::min(most / vb, std::bit_ceil(s.dk)));
  return {vb, ks, (s.dk + ks - 1) / ks, std::bit_ceil(std::max(s.dk, s.dv))};
}

// delta_chunk's: CH x CH = 256 invocations, at most CH x 16 (token, column) elements, VB columns of S0 (DK x VB
// floats) in at most 8 KiB of workgroup memory.
static_assert(kDeltaChunk * kDeltaChunk == 256);
Layout chunk_layout(const DeltaShape& s) {
  const uint32_t vb = std::min({std::bit_ceil(s.dv), 16u, std::max(1u, 2048 / std::bit_ceil(s.dk))});
  const uint32_t ks = 256 / vb;
  return {vb, ks, (s.dk + ks - 1) / ks, std::bit_ceil(std::max(s.dk, s.dv))};
}

// The larger workgroup memory of the two kernels (f32 arrays; DB = 32 as in the shader): delta_chunk's S0 columns,
// staged k and q rows [2][CH][DB + 1], three [CH][VB] and four [CH]; delta_chunk_prep's staged rows, A and T
// [CH][CH], two [CH].
uint64_t chunk_storage(const DeltaShape& s) {
  const uint64_t vb = chunk_layout(s).vb, ch = kDeltaChunk, staged = 2 * ch * 33;
  return 4 * std::max(uint64_t(s.dk) * vb + staged + 3 * ch * vb + 4 * ch, staged + 2 * ch * ch + 2 * ch);
}

std::string prelude(const DeltaShape& s, const Layout& l) {
  auto c = [](const char* name, uint32_t v) {
    return "const " + std::string(name) + ": u32 = " + std::to_string(v) + "u;\n";
  };
  return c("DK", s.dk) + c("DV", s.dv) + c("VB", l.vb) + c("KS", l.ks) + c("KPT", l.kpt) + c("CW", l.cw) +
         c("CH", kDeltaChunk);
}
std::string prelude(const DeltaShape& s) { return prelude(s, layout(s)); }

void check_shape(const char* fn, const DeltaShape& s) {
  if (s.n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (s.k_heads == 0 || s.v_heads == 0 || s.v_heads % s.k_heads != 0)
    fail(fn, "v_heads " + std::to_string(s.v_heads) + " must be a non-zero multiple of k_heads " +
                 std::to_string(s.k_heads));
  if (s.dk == 0 || s.dv == 0 || s.dk > kDeltaMaxHeadDim || s.dv > kDeltaMaxHeadDim)
    fail(fn, "head dimensions dk " + std::to_string(s.dk) + ", dv " + std::to_string(s.dv) + " must be in [1, " +
                 std::to_string(kDeltaMaxHeadDim) + "]");
  if ((uint64_t(s.row) + s.n_tokens) * (uint64_t(s.channels()) + uint64_t(s.v_heads) * s.dv) > UINT32_MAX)
    fail(fn, "index space exceeds 2^32-1");
  for (const auto& [name, at] :
       {std::pair{"ring_at", s.ring_at}, std::pair{"state_at", s.state_at}, std::pair{"state_out_at", s.state_out_at}})
    if (at % 4 || at / 4 > UINT32_MAX / 2)
      fail(fn, std::string(name) + " " + std::to_string(at) + " must be a multiple of 4 below 2^33");
}

// The params' offsets in elements (check_shape bounds them).
void set_offsets(DeltaParams& p, const DeltaShape& s) {
  p.ring_base = uint32_t(s.ring_at / 4);
  p.state_base = uint32_t(s.state_at / 4);
  p.out_base = uint32_t(s.state_out_at / 4);
}

// The delta rule's inputs and outputs for rows row .. row + n_tokens - 1, checked (delta_rule, delta_step; `inputs`
// are the kernel's other read buffers, which state_out and o must not be), and their bindings 6-11 appended to b.
// With `pool` (delta_step_rows) state and state_out are one buffer of every row's states, bound whole.
void rule_io(const char* fn, const gpu::Context& ctx, const DeltaShape& s, const DeltaGates& gates,
             const gpu::Buffer& consts, const gpu::Buffer& state, const gpu::Buffer& state_out, const gpu::Buffer& o,
             std::initializer_list<const gpu::Buffer*> inputs, std::vector<gpu::BufferBinding>& b, bool pool = false) {
  if (!gates.alpha || !gates.beta) fail(fn, "alpha and beta are required");
  const uint64_t H = s.v_heads, rows = uint64_t(s.row) + s.n_tokens;
  if (gates.stride < H || uint64_t(gates.beta_offset) + H > gates.stride)
    fail(fn, "gates: stride " + std::to_string(gates.stride) + " and beta_offset " + std::to_string(gates.beta_offset) +
                 " do not hold " + std::to_string(H) + " heads");
  const uint64_t ab = rows * gates.stride * 4, state_bytes = H * s.dk * s.dv * 4, o_bytes = rows * H * s.dv * 4;
  const uint64_t state_end = pool ? state.size : s.state_at + state_bytes;
  const uint64_t out_end = pool ? state.size : s.state_out_at + state_bytes;
  need(fn, "alpha", *gates.alpha, ab, ctx);
  need(fn, "beta", *gates.beta, ab, ctx);
  need(fn, "consts", consts, 2 * H * 4, ctx);
  need(fn, "state", state, state_end, ctx);
  need(fn, "state_out", state_out, out_end, ctx);
  need(fn, "o", o, o_bytes, ctx);
  // state and state_out: one buffer only where their ranges are apart (a pool's)
  if (!pool && state.get() == state_out.get() && s.state_at < out_end && s.state_out_at < state_end)
    fail(fn, "state_at " + std::to_string(s.state_at) + " and state_out_at " + std::to_string(s.state_out_at) +
                 " overlap in one buffer");
  for (const gpu::Buffer* in : {gates.alpha, gates.beta, &consts})
    if (in->get() == state_out.get() || in->get() == o.get())
      fail(fn, "state_out and o must differ from the inputs (state included)");
  if (state.get() == o.get()) fail(fn, "state_out and o must differ from the inputs (state included)");
  for (const gpu::Buffer* in : inputs)
    if (in && (in->get() == state_out.get() || in->get() == o.get()))
      fail(fn, "state_out and o must differ from the inputs (state included)");
  if (state_out.get() == o.get()) fail(fn, "state_out and o must be different buffers");
  b.insert(b.end(), {{6, gates.alpha, 0, ab},
                     {7, gates.beta, 0, ab},
                     {8, &consts, 0, 2 * H * 4},
                     {9, &state, 0, state_end},
                     {10, &o, 0, o_bytes},
                     {11, &state_out, 0, out_end}});
}

}  // namespace

void encode_delta_conv(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                       uint32_t pos, uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                       const gpu::Buffer& ring, const gpu::Buffer& c) {
  const char* fn = "encode_delta_conv";
  check_shape(fn, s);
  if (taps_count < 2) fail(fn, "taps must be >= 2");
  if (ring_rows < taps_count)
    fail(fn, "ring_rows " + std::to_string(ring_rows) + " < taps " + std::to_string(taps_count));
  if (uint64_t(pos) + s.n_tokens > UINT32_MAX) fail(fn, "pos + n_tokens exceeds 2^32-1");
  if (!(eps > 0.f)) fail(fn, "eps must be > 0");
  if (s.n_tokens > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, "n_tokens " + std::to_string(s.n_tokens) + " exceeds the workgroups per dimension");
  const uint64_t W = s.channels(), end = (uint64_t(s.row) + s.n_tokens) * W;
  if (uint64_t(ring_rows) * W > UINT32_MAX) fail(fn, "ring index space exceeds 2^32-1");
  need(fn, "x", x, end * 4, ctx);
  need(fn, "taps", taps, W * taps_count * 4, ctx);
  const uint64_t ring_end = s.ring_at + uint64_t(ring_rows) * W * 4;
  need(fn, "ring", ring, ring_end, ctx);
  need(fn, "c", c, end * 4, ctx);
  if (c.get() == x.get() || c.get() == ring.get() || ring.get() == x.get())
    fail(fn, "x, ring and c must be different buffers");
  const bool store = uint64_t(s.n_tokens) + taps_count - 1 <= ring_rows;  // else delta_ring after it
  DeltaParams p{s.n_tokens, s.k_heads, s.v_heads, s.row, pos, ring_rows, taps_count, eps, 0, 0, 0, store};
  set_offsets(p, s);
  WGPUComputePipeline pipe = ctx.pipeline({"delta_net.wgsl", "delta_conv", {}, prelude(s)});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &x, 0, end * 4},
                                  {2, &taps, 0, W * taps_count * 4},
                                  {3, &ring, 0, ring_end},
                                  {4, &c, 0, end * 4}};
  batch.dispatch(pipe, b, 2 * s.k_heads + s.v_heads, s.n_tokens);
  if (store) return;
  const uint64_t kept = uint64_t(std::min(s.n_tokens, taps_count - 1)) * W;
  WGPUComputePipeline store_pipe = ctx.pipeline({"delta_net.wgsl", "delta_ring", {}, prelude(s)});
  const gpu::BufferBinding sb[] = {batch.uniform(0, p), {1, &x, 0, end * 4}, {3, &ring, 0, ring_end}};
  batch.dispatch(store_pipe, sb, uint32_t((kept + 255) / 256));
}

bool delta_chunk_supported(const gpu::Context& ctx, const DeltaShape& s) {
  return chunk_storage(s) <= ctx.limits().maxComputeWorkgroupStorageSize;
}

uint64_t delta_chunk_scratch_bytes(const DeltaShape& s) {
  return 4ull * s.v_heads * ((uint64_t(s.n_tokens) + kDeltaChunk - 1) / kDeltaChunk) * 2 * kDeltaChunk * kDeltaChunk;
}

uint32_t delta_chunk_from(const gpu::Context& ctx) {
  return ctx.options().delta_chunk_from.value_or(UINT32_MAX);
}

void encode_delta_rule(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, const gpu::Buffer& c,
                       const DeltaGates& gates, const gpu::Buffer& consts, const gpu::Buffer& state,
                       const gpu::Buffer& state_out, const gpu::Buffer& o, bool fresh, DeltaRuleImpl impl,
                       const gpu::Buffer* scratch) {
  const char* fn = "encode_delta_rule";
  check_shape(fn, s);
  if (impl == DeltaRuleImpl::Chunked) {
    if (!delta_chunk_supported(ctx, s))
      fail(fn, "the chunked rule needs " + std::to_string(chunk_storage(s)) + " bytes of workgroup memory, the " +
                   "adapter allows " + std::to_string(ctx.limits().maxComputeWorkgroupStorageSize));
    if (!scratch) fail(fn, "the chunked rule needs a scratch buffer (delta_chunk_scratch_bytes)");
  }
  const uint64_t scratch_bytes = delta_chunk_scratch_bytes(s);
  const bool chunked = impl == DeltaRuleImpl::Chunked ||
                       (impl == DeltaRuleImpl::Auto && s.n_tokens >= delta_chunk_from(ctx) &&
                        delta_chunk_supported(ctx, s) && scratch && scratch->size >= scratch_bytes);
  const uint32_t chunks = (s.n_tokens + kDeltaChunk - 1) / kDeltaChunk;
  if (chunked) {
    need(fn, "scratch", *scratch, scratch_bytes, ctx);
    if (chunks > ctx.limits().maxComputeWorkgroupsPerDimension)
      fail(fn, std::to_string(chunks) + " chunks exceed the workgroups per dimension");
    for (const gpu::Buffer* other : {&c, gates.alpha, gates.beta, &consts, &state, &state_out, &o})
      if (other && other->get() == scratch->get()) fail(fn, "scratch must differ from every other buffer");
  }
  const uint64_t c_bytes = (uint64_t(s.row) + s.n_tokens) * s.channels() * 4;
  need(fn, "c", c, c_bytes, ctx);
  std::vector<gpu::BufferBinding> b;
  rule_io(fn, ctx, s, gates, consts, state, state_out, o, {&c}, b);
  DeltaParams p{s.n_tokens, s.k_heads,    s.v_heads,         s.row,           0, 0, 0,
                0.f,        gates.stride, gates.beta_offset, fresh ? 1u : 0u, 0};
  set_offsets(p, s);
  b.insert(b.end(), {batch.uniform(0, p), {5, &c, 0, c_bytes}});
  const Layout l = chunked ? chunk_layout(s) : layout(s);
  if (chunked) {
    // T and M of every (head, chunk), then the recurrence reading them; b[0..2]: alpha, beta, consts (rule_io's)
    const gpu::BufferBinding pb[] = {batch.uniform(0, p),      {5, &c, 0, c_bytes},   b[0], b[1], b[2],
                                     {12, scratch, 0, scratch_bytes}};
    batch.dispatch(ctx.pipeline({"delta_net.wgsl", "delta_chunk_prep", {}, prelude(s, l)}), pb, s.v_heads, chunks);
    b.push_back({12, scratch, 0, scratch_bytes});
  }
  WGPUComputePipeline pipe =
      ctx.pipeline({"delta_net.wgsl", chunked ? "delta_chunk" : "delta_rule", {}, prelude(s, l)});
  batch.dispatch(pipe, b, s.v_heads * ((s.dv + l.vb - 1) / l.vb), 1);
}

bool delta_step_supported(const gpu::Context& ctx) { return ctx.limits().maxStorageBuffersPerShaderStage >= 9; }

bool delta_step_norm_supported(const gpu::Context& ctx, const DeltaShape& s) {
  return ctx.limits().maxStorageBuffersPerShaderStage >= 11 && s.dv > 0 && s.dv <= 256 &&
         step_norm_layout(ctx, s).kpt <= 16;
}

namespace {

// encode_delta_step and, with `steps`, encode_delta_step_rows (s.n_tokens rows, ring and state the pools).
void encode_step(const char* fn, gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                 uint32_t pos, uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                 const gpu::Buffer& ring, const DeltaGates& gates, const gpu::Buffer& consts, const gpu::Buffer& state,
                 const gpu::Buffer& state_out, const gpu::Buffer& o, bool fresh, const DeltaOutputNorm* norm,
                 const gpu::Buffer* steps) {
  check_shape(fn, s);
  if (!steps && s.n_tokens != 1) fail(fn, "n_tokens must be 1 (a decode step), not " + std::to_string(s.n_tokens));
  if (!steps && !delta_step_supported(ctx))
    fail(fn, "the adapter allows fewer than 9 storage buffers per shader stage");
  if (steps && !delta_step_rows_supported(ctx, s, norm != nullptr))
    fail(fn, "the adapter allows too few storage buffers per shader stage or workgroups per dimension");
  if (taps_count < 2) fail(fn, "taps must be >= 2");
  if (ring_rows < taps_count)
    fail(fn, "ring_rows " + std::to_string(ring_rows) + " < taps " + std::to_string(taps_count));
  if (!(eps > 0.f)) fail(fn, "eps must be > 0");
  const uint64_t W = s.channels(), rows = uint64_t(s.row) + s.n_tokens, x_bytes = rows * W * 4;
  const uint64_t ring_bytes = steps ? ring.size : s.ring_at + uint64_t(ring_rows) * W * 4;
  if (uint64_t(ring_rows) * W > UINT32_MAX) fail(fn, "ring index space exceeds 2^32-1");
  need(fn, "x", x, x_bytes, ctx);
  need(fn, "taps", taps, W * taps_count * 4, ctx);
  need(fn, "ring", ring, ring_bytes, ctx);
  for (const gpu::Buffer* other : {&x, &taps, gates.alpha, gates.beta, &consts, &state, &state_out, &o,
                                   norm ? norm->weight : nullptr, norm ? norm->z : nullptr, steps})
    if (other && other->get() == ring.get()) fail(fn, "ring must differ from every other buffer");
  std::vector<gpu::BufferBinding> b;
  if (norm) {
    if (!delta_step_norm_supported(ctx, s))
      fail(fn, "norm: the adapter or the head shape (dk " + std::to_string(s.dk) + ", dv " + std::to_string(s.dv) +
                   ") does not take the output norm in the step (delta_step_norm_supported)");
    if (!norm->weight || !norm->z) fail(fn, "norm: weight and z are required");
    if (!(norm->eps > 0.f)) fail(fn, "norm: eps must be > 0");
    const uint64_t z_bytes = rows * s.v_heads * s.dv * 4;
    need(fn, "norm.weight", *norm->weight, uint64_t(s.dv) * 4, ctx);
    need(fn, "norm.z", *norm->z, z_bytes, ctx);
    b.insert(b.end(), {{13, norm->z, 0, z_bytes}, {14, norm->weight, 0, uint64_t(s.dv) * 4}});
  }
  rule_io(fn, ctx, s, gates, consts, state, state_out, o,
          {&x, &taps, norm ? norm->weight : nullptr, norm ? norm->z : nullptr, steps}, b, steps != nullptr);
  if (steps) {
    need(fn, "steps", *steps, rows * 16, ctx);
    b.push_back({15, steps, 0, rows * 16});
  }
  DeltaParams p{uint32_t(rows),
                s.k_heads,
                s.v_heads,
                s.row,
                pos,
                ring_rows,
                taps_count,
                eps,
                gates.stride,
                gates.beta_offset,
                fresh ? 1u : 0u,
                0,
                norm ? norm->eps : 0.f};
  set_offsets(p, s);
  b.insert(b.end(),
           {batch.uniform(0, p), {1, &x, 0, x_bytes}, {2, &taps, 0, W * taps_count * 4}, {3, &ring, 0, ring_bytes}});
  const Layout l = norm ? step_norm_layout(ctx, s) : layout(s);
  const std::string entry = std::string(norm ? "delta_step_norm" : "delta_step") + (steps ? "_rows" : "");
  WGPUComputePipeline pipe = ctx.pipeline({"delta_net.wgsl", entry, {}, prelude(s, l)});
  batch.dispatch(pipe, b, s.v_heads * ((s.dv + l.vb - 1) / l.vb), steps ? s.n_tokens : 1);
}

}  // namespace

void encode_delta_step(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                       uint32_t pos, uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                       const gpu::Buffer& ring, const DeltaGates& gates, const gpu::Buffer& consts,
                       const gpu::Buffer& state, const gpu::Buffer& state_out, const gpu::Buffer& o, bool fresh,
                       const DeltaOutputNorm* norm) {
  encode_step("encode_delta_step", batch, ctx, s, taps_count, pos, ring_rows, eps, x, taps, ring, gates, consts, state,
              state_out, o, fresh, norm, nullptr);
}

bool delta_step_rows_supported(const gpu::Context& ctx, const DeltaShape& s, bool norm) {
  const WGPULimits& lim = ctx.limits();
  return lim.maxStorageBuffersPerShaderStage >= (norm ? 12u : 10u) &&
         s.n_tokens <= lim.maxComputeWorkgroupsPerDimension && (!norm || delta_step_norm_supported(ctx, s));
}

void encode_delta_step_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                            uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                            const gpu::Buffer& rings, const DeltaGates& gates, const gpu::Buffer& consts,
                            const gpu::Buffer& states, const gpu::Buffer& steps, const gpu::Buffer& o,
                            const DeltaOutputNorm* norm) {
  DeltaShape rows = s;
  rows.row = 0;
  rows.ring_at = rows.state_at = rows.state_out_at = 0;
  encode_step("encode_delta_step_rows", batch, ctx, rows, taps_count, 0, ring_rows, eps, x, taps, rings, gates, consts,
              states, states, o, false, norm, &steps);
}

}  // namespace wgllm::kernels

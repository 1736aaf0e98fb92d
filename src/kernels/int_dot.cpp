#include "kernels/int_dot.h"

#include <cmath>
#include <string>

#include "kernels/check.h"
#include "kernels/matmul.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {
constexpr const char* kShader = "int_dot.wgsl";

// Lanes per group (IT), rows per group (IR) and groups per workgroup (IG): 32 x 2 x 4, or a forced matvec shape
// (`--matvec TxRxG`, tuning; T >= R).
struct IntDotShape {
  uint32_t threads = 32, rows = 2, groups = 4;
};
IntDotShape int_dot_shape(const gpu::Context& ctx) {
  if (ctx.options().matvec_shape.empty()) return {};
  const MatvecConfig c = parse_matvec_config(ctx.options().matvec_shape);
  if (c.threads_per_row < c.rows) fail("int_dot", "a forced matvec shape needs at least as many threads as rows");
  return {c.threads_per_row, c.rows, c.groups};
}

// Host constants and the entry point of matvec_int (with the subgroup size where the adapter has subgroups).
std::string prelude(const gpu::Context& ctx) {
  const bool sg = ctx.features().subgroups;
  const IntDotShape shape = int_dot_shape(ctx);
  std::string s = "const IT: u32 = " + std::to_string(shape.threads) +
                  "u;\nconst IR: u32 = " + std::to_string(shape.rows) +
                  "u;\nconst IG: u32 = " + std::to_string(shape.groups) +
                  "u;\nconst SUBGROUPS: bool = " + (sg ? "true" : "false") + ";\n";
  if (sg)
    return s +
           "@compute @workgroup_size(IT * IG)\nfn matvec_int(@builtin(workgroup_id) wid: vec3<u32>, "
           "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) {\n"
           "  matvec_int_main(wid, lid, sg);\n}\nfn sg_shuffle_xor(v: f32, m: u32) -> f32 { return "
           "subgroupShuffleXor(v, m); }\n";
  return s +
         "@compute @workgroup_size(IT * IG)\nfn matvec_int(@builtin(workgroup_id) wid: vec3<u32>, "
         "@builtin(local_invocation_index) lid: u32) { matvec_int_main(wid, lid, 1u); }\n"
         "fn sg_shuffle_xor(v: f32, m: u32) -> f32 { return v; }\n";
}
}  // namespace

XDigits make_x_digits(gpu::Context& ctx, uint32_t n_in, uint32_t n_tokens) {
  if (n_in == 0 || n_in % 32 != 0) fail("make_x_digits", "n_in must be a positive multiple of 32");
  if (n_tokens == 0) fail("make_x_digits", "n_tokens must be > 0");
  const uint64_t blocks = uint64_t(n_in / 32) * n_tokens;
  return {ctx.create_buffer(blocks * 96, WGPUBufferUsage_Storage, "x digits"),
          ctx.create_buffer(blocks * 16, WGPUBufferUsage_Storage, "x digit scales"), n_in, n_tokens};
}

void encode_x_digits(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& x, const XDigits& xd,
                     const gpu::Buffer* norm) {
  const char* fn = "encode_x_digits";
  if (xd.n_in == 0 || xd.n_in % 32 != 0 || xd.n_tokens == 0) fail(fn, "xd is not made by make_x_digits");
  const uint64_t blocks = uint64_t(xd.n_in / 32) * xd.n_tokens;
  need(fn, "x", x, uint64_t(xd.n_in) * xd.n_tokens * 4, ctx);
  need(fn, "xd.digits", xd.digits, blocks * 96, ctx);
  need(fn, "xd.scales", xd.scales, blocks * 16, ctx);
  if (norm) need(fn, "norm", *norm, uint64_t(xd.n_in) * 4, ctx);
  const auto grid = gpu::fold_grid((blocks + 7) / 8, ctx.limits().maxComputeWorkgroupsPerDimension);
  const IntDotParams p{xd.n_in, 0, xd.n_tokens, grid.x, norm ? 1u : 0u, 0.f, 0, 0};
  WGPUComputePipeline pipe = ctx.pipeline({kShader, "x_digits", {}, prelude(ctx)});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {1, &x, 0, uint64_t(xd.n_in) * xd.n_tokens * 4},
                                  {2, &xd.digits, 0, blocks * 96},
                                  {3, &xd.scales, 0, blocks * 16},
                                  {6, norm ? norm : &ctx.placeholder_storage(), 0, norm ? uint64_t(xd.n_in) * 4 : 0}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

void encode_matvec_int(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const XDigits& xd,
                       const gpu::Buffer& y, std::optional<float> norm_eps) {
  const char* fn = "encode_matvec_int";
  if (norm_eps && !(*norm_eps >= 0.f && std::isfinite(*norm_eps))) fail(fn, "norm_eps must be finite and >= 0");
  detail::check_weight(fn, w);
  if (w.type != GgufType::Q4_K) fail(fn, "the weight must be Q4_K");
  if (w.pieces.size() != 1) fail(fn, "the weight must be one piece (rows within one storage binding)");
  if (w.n_experts != 0) fail(fn, "expert stacks are not supported");
  if (xd.n_tokens != 1) fail(fn, "one token only (xd.n_tokens must be 1)");
  if (xd.n_in != w.n_in)
    fail(fn, "xd.n_in " + std::to_string(xd.n_in) + " != the weight's n_in " + std::to_string(w.n_in));
  const uint64_t blocks = w.n_in / 32;
  need(fn, "xd.digits", xd.digits, blocks * 96, ctx);
  need(fn, "xd.scales", xd.scales, blocks * 16, ctx);
  need(fn, "y", y, uint64_t(w.n_out) * 4, ctx);
  const GpuWeightPiece& piece = w.pieces[0];
  const IntDotShape shape = int_dot_shape(ctx);
  const uint32_t rows_per_wg = shape.rows * shape.groups;
  const auto grid = gpu::fold_grid((uint64_t(w.n_out) + rows_per_wg - 1) / rows_per_wg,
                                   ctx.limits().maxComputeWorkgroupsPerDimension);
  const IntDotParams p{w.n_in, w.n_out, 1, grid.x, norm_eps ? 1u : 0u, norm_eps.value_or(0.f), 0, 0};
  WGPUComputePipeline pipe = ctx.pipeline({kShader, "matvec_int", {}, prelude(ctx)});
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {2, &xd.digits, 0, blocks * 96},
                                  {3, &xd.scales, 0, blocks * 16},
                                  {4, &piece.buffer, 0, uint64_t(w.n_out) * (w.n_in / 256) * 144},
                                  {5, &y, 0, uint64_t(w.n_out) * 4}};
  batch.dispatch(pipe, b, grid.x, grid.y);
}

}  // namespace wgllm::kernels

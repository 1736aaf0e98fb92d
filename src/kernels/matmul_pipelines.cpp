// The weight products' pipelines (matmul_pipelines.h): the preludes of matvec.wgsl, matmul_rows.wgsl, matmul.wgsl and
// matmul_fold.wgsl, and their pipelines found by the preludes' arguments.
#include "kernels/matmul_pipelines.h"

#include <algorithm>
#include <string>

#include "kernels/weight.h"

namespace wgllm::kernels::detail {

uint32_t matvec_slots(const gpu::Context& ctx, const MatvecConfig& mv) {
  const uint32_t lanes = mv.shuffle ? std::max(4u, ctx.adapter().subgroup_min) : 1u;
  return mv.threads_per_row / std::min(mv.threads_per_row, lanes);
}

namespace {

// Host constants for matmul_fold.wgsl: the groups of a split product and how many a chunk of its lanes' tree takes.
std::string fold_prelude(GgufType type, const ClassOrder& order) {
  return detail::weight_prelude(type, 1) + "const MM_GROUPS: u32 = " + std::to_string(order.groups) +
         "u;\nconst FOLD_LANES: u32 = " + std::to_string(order.lanes * order.groups / order.classes) + "u;\n";
}

// Host constants for matvec.wgsl (after matmul_common.wgsl's): its shape, the lane sum and the entry point.
std::string matvec_prelude(const gpu::Context& ctx, const MatvecConfig& mv, GgufType t, uint32_t nt, bool xv4,
                           const MatvecMode& m = {}) {
  auto u32 = [](const char* name, uint32_t v) {
    return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
  };
  std::string s =
      detail::weight_prelude(t, nt, mv.int_f16, m.second) + u32("MV_T", mv.threads_per_row) + u32("MV_R", mv.rows) +
      u32("MV_G", mv.groups) + u32("MV_NV", mv.rows * nt + nt) + u32("MV_U", mv.units) +
      u32("MV_SLOTS", matvec_slots(ctx, mv)) + "const XV4: bool = " + (xv4 ? "true" : "false") +
      ";\nconst MV_FMA: bool = " + (mv.fma_order ? "true" : "false") +
      ";\nconst MV_CHUNKS: bool = " + (block_elems(t) == 1 ? "false" : "true") +
      ";\nconst MV_EXPERTS: bool = " + (m.experts ? "true" : "false") +
      ";\nconst MV_COMBINE: bool = " + (m.combine_pairs ? "true" : "false") + ";\n" + u32("MV_CG", m.combine_groups) +
      "const MV_INT: bool = " + (m.int_dot ? "true" : "false") +
      ";\nconst MV_PRE: bool = " + (m.pre_n_in ? "true" : "false") + ";\n" +
      u32("MV_PRE_V4", std::max(m.pre_n_in / 4, 1u)) + "const MV_ROUTE: bool = " + (m.route ? "true" : "false") +
      ";\nconst MV_CHOOSE: bool = " + (m.choose ? "true" : "false") + ";\n" +
      (m.route || m.choose ? ""  // matvec_route.wgsl's; stubs that are never called otherwise
                           : "fn mv_route(pair: u32, lid: u32, writes: bool) -> u32 { return 0u; }\n"
                             "fn mv_choose(lid: u32, sg_size: u32) {}\n");
  if (mv.shuffle)
    return s +
           "fn mv_lane_sum(v: f32, chunk: u32) -> f32 {\n  var s = v;\n"
           "  for (var m = 1u; m < chunk; m <<= 1u) { s += subgroupShuffleXor(s, m); }\n  return s;\n}\n"
           "@compute @workgroup_size(MV_WG)\nfn matvec(@builtin(workgroup_id) wid: vec3<u32>, "
           "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) {\n"
           "  matvec_main(wid, lid, sg);\n}\n";
  return s +
         "fn mv_lane_sum(v: f32, chunk: u32) -> f32 { return v; }\n"
         "@compute @workgroup_size(MV_WG)\nfn matvec(@builtin(workgroup_id) wid: vec3<u32>, "
         "@builtin(local_invocation_index) lid: u32) { matvec_main(wid, lid, 1u); }\n";
}

// A matvec pipeline's detail for profiles (gpu::PipelineKey::detail), made of what its prelude is made of (one
// prelude, one detail): the weight type, the shape, the tokens a pass takes and what else it does.
std::string matvec_detail(const MatvecConfig& mv, GgufType t, uint32_t nt, const MatvecMode& m = {}) {
  std::string s = mv.units > 1 ? detail::shape_detail(t, {mv.threads_per_row, mv.rows, mv.groups, mv.units})
                               : detail::shape_detail(t, {mv.threads_per_row, mv.rows, mv.groups});
  s += ' ';
  s += std::to_string(nt);
  s += nt == 1 ? " token" : " tokens";
  if (mv.fma_order) s += ", batch order";
  if (m.int_dot) s += ", int8";
  if (m.pre_n_in) s += ", pre";
  if (m.experts) s += m.combine_pairs ? ", experts + combine" : m.route ? ", experts + route" : ", experts";
  if (m.choose) s += ", + choose";
  if (m.second) {
    s += ", then ";
    s += type_name(*m.second);
  }
  return s;
}

// Host constants for matmul.wgsl: the tile, the element type of its workgroup tiles, whether it computes expert
// products (tiles of pairs grouped by expert), and the order of its sums.
std::string matmul_prelude(const MatmulTile& t, GgufType type, bool experts = false, ClassOrder order = {}) {
  const char* ss = t.f16 ? "var<workgroup> xss: array<f32, 4u * TM>;\n"
                           "fn ss_put(i: u32, v: f32) { xss[i] = v; }\nfn ss_get(i: u32) -> f32 { return xss[i]; }\n"
                         : "fn ss_put(i: u32, v: f32) { xs[i / 4u][i % 4u] = v; }\n"
                           "fn ss_get(i: u32) -> f32 { return xs[i / 4u][i % 4u]; }\n";
  auto u32 = [](const char* name, uint32_t v) {
    return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
  };
  // the unroll counts of the class orders' functions are 0 where they are not called (their constant indices must
  // stay in bounds): CMI / CNACC the float types' (units), KMI / KNACC / NLV the block types' (chunks)
  const bool chunks = order.classes && order.chunks, units = order.classes && !order.chunks;
  const uint32_t nacc = t.thread_tokens * t.thread_rows / 4;
  const uint32_t group_classes = (chunks ? order.classes : std::max(order.classes, 4u)) / order.groups;
  return std::string(t.f16 ? "enable f16;\nalias MM_T = f16;\n" : "alias MM_T = f32;\n") + ss +
         "const MM_F16: bool = " + (t.f16 ? "true" : "false") +
         ";\nconst MM_EXPERTS: bool = " + (experts ? "true" : "false") +
         ";\nconst MM_CLASS: bool = " + (order.classes ? "true" : "false") +
         ";\nconst MM_CHUNK: bool = " + (chunks ? "true" : "false") + ";\n" +
         u32("MM_CLASSES", chunks ? order.classes : std::max(order.classes, 4u)) +
         u32("MM_CP", chunks ? order.classes : std::max(order.classes / 4, 1u)) + u32("MM_GROUPS", order.groups) +
         "const MM_SPLIT: bool = " + (order.groups > 1 ? "true" : "false") + ";\n" + u32("MM_G", group_classes) +
         u32("MM_PG", chunks ? group_classes : std::max(group_classes / 4, 1u)) + u32("TM", t.tokens) +
         u32("TN", t.rows) + u32("TY", t.tokens / t.thread_tokens) + u32("TX", t.rows / t.thread_rows) +
         u32("MI", t.thread_tokens / 4) + u32("NJ", t.thread_rows / 4) + u32("NACC", nacc) +
         u32("NCACC", nacc * (units ? 4 : 1)) +
         u32("NSTK", units    ? 4 * nacc
                     : chunks ? (order.levels + 1) * nacc
                              : 1) +
         u32("CMI", units ? t.thread_tokens / 4 : 0) + u32("CNACC", units ? nacc : 0) +
         u32("KMI", chunks ? t.thread_tokens / 4 : 0) + u32("KNACC", chunks ? nacc : 0) +
         u32("NLV", chunks ? order.levels : 0) + u32("NLW", t.rows * 4 / t.threads()) +
         u32("NLX", t.tokens * 4 / t.threads()) + detail::weight_prelude(type, 1) +
         (order.shuffle ? "@compute @workgroup_size(MM_WG)\nfn matmul(@builtin(workgroup_id) wid: vec3<u32>, "
                          "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) {\n"
                          "  matmul_main(wid, lid, sg);\n}\n"
                        : "@compute @workgroup_size(MM_WG)\nfn matmul(@builtin(workgroup_id) wid: vec3<u32>, "
                          "@builtin(local_invocation_index) lid: u32) { matmul_main(wid, lid, 1u); }\n");
}

// Host constants for matmul_rows.wgsl: the workgroup, row pairs and tokens per invocation, whether x is shared by
// subgroup broadcasts (XB), and the entry point.
std::string rows_prelude(const gpu::Context& ctx, const RowsConfig& c, GgufType type, uint32_t tokens, uint32_t pairs,
                         bool xv4) {
  auto u32 = [](const char* name, uint32_t v) {
    return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
  };
  const bool xb = ctx.features().subgroups && ctx.adapter().subgroup_min >= 8;
  std::string s = detail::weight_prelude(type, 1) + u32("RW_WG", c.workgroup) + u32("RH", pairs) +
                  u32("RQ", pairs / 2) + u32("TT", tokens) + "const XB: bool = " + (xb ? "true" : "false") +
                  ";\nconst XV4: bool = " + (xv4 ? "true" : "false") + ";\n";
  if (xb)
    return s +
           "fn broadcast8(v: vec4<f32>) -> W32 {\n  return W32(W8(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u)), "
           "W8(subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u)),\n    W8(subgroupBroadcast(v, 4u), "
           "subgroupBroadcast(v, 5u)), W8(subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u)));\n}\n"
           "@compute @workgroup_size(RW_WG)\nfn matmul_rows(@builtin(workgroup_id) wid: vec3<u32>, "
           "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sl: u32) {\n"
           "  rows_main(wid, lid, sl);\n}\n";
  const std::string zero8 = "W8(vec4<f32>(0.0), vec4<f32>(0.0))";
  return s + "fn broadcast8(v: vec4<f32>) -> W32 { return W32(" + zero8 + ", " + zero8 + ", " + zero8 + ", " + zero8 +
         "); }\n@compute @workgroup_size(RW_WG)\nfn matmul_rows(@builtin(workgroup_id) wid: vec3<u32>, "
         "@builtin(local_invocation_index) lid: u32) { rows_main(wid, lid, 0u); }\n";
}

constexpr const char* kMatvecShader = "matmul_common.wgsl+rope_angle.wgsl+rope_kv_epilogue.wgsl+matvec.wgsl";
constexpr const char* kMatvecRouteShader =
    "matmul_common.wgsl+rope_angle.wgsl+rope_kv_epilogue.wgsl+matvec.wgsl+moe_choose.wgsl+matvec_route.wgsl";
constexpr const char* kRowsShader = "matmul_common.wgsl+rope_angle.wgsl+rope_kv_epilogue.wgsl+matmul_rows.wgsl";
constexpr const char* kMatmulShader = "matmul_common.wgsl+matmul.wgsl";
constexpr const char* kFoldShader = "matmul_common.wgsl+matmul_fold.wgsl";
constexpr const char* kIntShader = "matmul_common.wgsl+matmul_int.wgsl";

}  // namespace

// The product pipelines found by their preludes' arguments (gpu::Context::pipeline's compact key): a decode step
// repeats its products, and building a prelude and its key string took 2.5 us of host work each (PERF.md). Each
// argument list holds every value its prelude and detail are made of; the sizes below fail to compile when a config
// gains a field, which must then join its list.
static_assert(sizeof(MatvecConfig) == 20 && sizeof(MatvecMode) == 28 && sizeof(MatmulTile) == 20 &&
              sizeof(ClassOrder) == 20 && sizeof(RowsConfig) == 12);

WGPUComputePipeline matvec_pipeline(gpu::Context& ctx, const MatvecConfig& mv, GgufType t, uint32_t nt, bool xv4,
                                    const MatvecMode& m) {
  const uint32_t args[] = {mv.threads_per_row,
                           mv.rows,
                           mv.groups,
                           mv.units,
                           mv.int_f16,
                           mv.shuffle,
                           mv.fma_order,
                           uint32_t(t),
                           nt,
                           xv4,
                           m.experts,
                           m.combine_pairs,
                           m.combine_groups,
                           m.int_dot,
                           m.route,
                           m.choose,
                           m.pre_n_in,
                           m.second.has_value(),
                           m.second ? uint32_t(*m.second) : 0};
  return ctx.pipeline("matvec", args, [&] {
    return gpu::PipelineKey{m.route || m.choose ? kMatvecRouteShader : kMatvecShader,
                            "matvec",
                            {},
                            matvec_prelude(ctx, mv, t, nt, xv4, m),
                            matvec_detail(mv, t, nt, m)};
  });
}
WGPUComputePipeline rows_pipeline(gpu::Context& ctx, const RowsConfig& rows, GgufType t, uint32_t tokens,
                                  uint32_t pairs, bool xv4) {
  const uint32_t args[] = {rows.workgroup, uint32_t(t), tokens, pairs, xv4};
  return ctx.pipeline("matmul_rows", args, [&] {
    return gpu::PipelineKey{kRowsShader,
                            "matmul_rows",
                            {},
                            rows_prelude(ctx, rows, t, tokens, pairs, xv4),
                            detail::shape_detail(t, {rows.workgroup, 2 * pairs, tokens})};
  });
}
// The tiled kernel; experts: a tile of one expert's pairs (the detail says so).
WGPUComputePipeline tiled_pipeline(gpu::Context& ctx, const MatmulTile& tile, GgufType t, bool experts,
                                   const ClassOrder& order) {
  const uint32_t args[] = {tile.tokens,  tile.rows,    tile.f16,      tile.thread_tokens, tile.thread_rows,
                           uint32_t(t),  experts,      order.classes, order.shuffle,      order.chunks,
                           order.levels, order.groups, order.lanes};
  return ctx.pipeline("matmul", args, [&] {
    return gpu::PipelineKey{
        kMatmulShader,
        "matmul",
        {},
        matmul_prelude(tile, t, experts, order),
        detail::tiled_detail(t, &tile, order.classes ? order.groups : 0) + (experts ? ", experts" : "")};
  });
}

WGPUComputePipeline int_tiled_pipeline(gpu::Context& ctx, GgufType t, uint32_t digits, uint32_t tokens, bool experts) {
  const uint32_t args[] = {uint32_t(t), digits, tokens, experts};
  return ctx.pipeline("matmul_int", args, [&] {
    auto u32 = [](const char* name, uint32_t v) {
      return std::string("const ") + name + ": u32 = " + std::to_string(v) + "u;\n";
    };
    const IntTileSizes z = int_tile_sizes(t, digits, tokens);
    const uint32_t rows = int_tile_rows(tokens);
    return gpu::PipelineKey{kIntShader,
                            "matmul_int",
                            {},
                            detail::weight_prelude(t, 1) + u32("MQ_TM", tokens) + u32("MQ_TN", rows) +
                                u32("MQ_TX", rows / 4) + u32("MQ_TPT", 256 / tokens) + u32("MQ_WR", rows / 64) +
                                u32("MQ_D", digits) + u32("MQ_XV", z.xv) + u32("MQ_XL", z.xv * tokens / 256) +
                                u32("MQ_QV", z.qv) + u32("MQ_SV", z.sv) + u32("MQ_WM", z.wm) +
                                "const MQ_EXPERTS: bool = " + (experts ? "true" : "false") + ";\n",
                            detail::shape_detail(t, {tokens, rows}) + ", " + std::to_string(digits) +
                                (digits == 1 ? " digit" : " digits") + (experts ? ", experts" : "")};
  });
}

WGPUComputePipeline fold_pipeline(gpu::Context& ctx, GgufType t, const ClassOrder& order) {
  const uint32_t args[] = {uint32_t(t), order.classes, order.groups, order.lanes};
  return ctx.pipeline("matmul_fold", args, [&] {
    return gpu::PipelineKey{
        kFoldShader, "matmul_fold", {}, fold_prelude(t, order), detail::tiled_detail(t, nullptr, order.groups)};
  });
}

}  // namespace wgllm::kernels::detail

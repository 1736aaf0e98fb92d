// The weight products' pipelines (matmul.cpp's kernels: matvec.wgsl, matmul_rows.wgsl, matmul.wgsl and
// matmul_fold.wgsl): what each computes beside its products, and its pipeline found by the arguments its host
// constants are made of, so that a dispatch every decode step repeats builds no prelude or key string.
#pragma once
#include <webgpu/webgpu.h>

#include <cstdint>
#include <optional>

#include "gguf/types.h"
#include "gpu/context.h"
#include "kernels/matmul.h"

namespace wgllm::kernels::detail {

// What a matvec pipeline computes besides its products (matvec.wgsl's MV_EXPERTS, MV_COMBINE, MV_INT, MV_PRE).
struct MatvecMode {
  bool experts = false;  // expert products (encode_expert_matmul)
  // With experts: each token's pairs summed, weighted, into y (ExpertOptions::combine), mv.groups = combine_pairs
  // x combine_groups (matvec.wgsl's MV_CG).
  uint32_t combine_pairs = 0, combine_groups = 1;
  bool int_dot = false;   // x as packed digits (MatmulOptions::digits)
  bool route =
      false;  // with experts, one token a pass: each workgroup chooses its pair's expert (ExpertOptions::route)
  bool choose = false;    // one token, one workgroup: a router's rows, then its token's experts (MatmulOptions::choose)
  uint32_t pre_n_in = 0;  // the residual add of a post norm first, over n_in (MatmulOptions::pre)
  // the rows from split2 on in a weight of this type (MatmulOptions::second)
  std::optional<GgufType> second = std::nullopt;
};

// Batch decode's order in the tiled kernel (matmul.wgsl's MM_CLASS): the classes (the batch matvec's threads per
// row), and whether its lane sums take chunks of the subgroup's size as one tree (else one lane: a fold).
struct ClassOrder {
  uint32_t classes = 0;  // 0: the tiled kernel's own order
  bool shuffle = false;  // the matvec's lane sums take subgroup shuffles (chunks of the subgroup's size)
  bool chunks = false;   // a block type's chunks (MM_CHUNK), one class a pass; else 8-element units, 4 a pass
  uint32_t levels = 0;   // MM_CHUNK: the tree's levels in a chunk of lanes (log2 of the most lanes a chunk has)
  // MM_SPLIT: the classes in `groups` groups of classes / groups, each a subtree of a chunk of `lanes` lanes (the
  // subgroup's size, at most classes): a workgroup per tile and group, then matmul_fold.wgsl (1: no split)
  uint32_t groups = 1, lanes = 1;
};

// The partial sums per group and value a matvec keeps after its lane shuffles (matvec.wgsl's MV_SLOTS).
uint32_t matvec_slots(const gpu::Context& ctx, const MatvecConfig& mv);

// The matvec for nt tokens a pass (xv4: x read as vec4 too).
WGPUComputePipeline matvec_pipeline(gpu::Context& ctx, const MatvecConfig& mv, GgufType t, uint32_t nt, bool xv4,
                                    const MatvecMode& m = {});
// The CPU adapters' Rows kernel: `tokens` a workgroup, `pairs` row pairs an invocation.
WGPUComputePipeline rows_pipeline(gpu::Context& ctx, const RowsConfig& rows, GgufType t, uint32_t tokens,
                                  uint32_t pairs, bool xv4);
// The tiled kernel in its own order or batch decode's (order.classes > 0); experts: a tile of one expert's pairs.
WGPUComputePipeline tiled_pipeline(gpu::Context& ctx, const MatmulTile& tile, GgufType t, bool experts,
                                   const ClassOrder& order = {});
// The Q4_K, Q6_K or Q8_0 prompt product on x's leading `digits` digits (matmul_int.wgsl;
// ContextOptions::prompt_digits): a workgroup per `tokens` tokens x int_tile_rows(tokens) rows, kIntTile x kIntTile or
// 32 x 128 (the expert tiles of 32 pairs; callers pass one of the two, prompt_tile's or group_tile's, both checked),
// int_tiled_bytes of workgroup memory; experts: a tile of `tokens` slots of one expert's pairs.
inline constexpr uint32_t kIntTile = 64;
constexpr uint32_t int_tile_rows(uint32_t tokens) { return 4096 / tokens; }  // 256 threads of 4 x 4 outputs
// Its workgroup arrays' sizes (matmul_int.wgsl's constants), in vec4s: quant vec4s per row (Q4_K's nibbles of two
// blocks each, else bytes), scale vec4s per row and per token, x's digit vec4s per token, and mq_wm's in all (Q4_K's
// dmin m per row).
struct IntTileSizes {
  uint32_t qv, sv, xv, wm;
};
constexpr IntTileSizes int_tile_sizes(GgufType t, uint32_t digits, uint32_t tokens = kIntTile) {
  const bool q4_k = t == GgufType::Q4_K;
  return {q4_k ? 4u : 8u, t == GgufType::Q6_K ? 2u : 1u, 8 * digits, q4_k ? int_tile_rows(tokens) : 1};
}
constexpr uint64_t int_tiled_bytes(GgufType t, uint32_t digits, uint32_t tokens = kIntTile) {
  const IntTileSizes z = int_tile_sizes(t, digits, tokens);
  // mq_qw and mq_wd per row; mq_xq, mq_xs and mq_xm per token; mq_wm (64 x 64, Q4_K: 8192 + 8192 a digit; Q6_K
  // 13328 +, Q8_0 11280 +; 32 x 128 never more)
  return 16ull * ((z.qv + z.sv) * int_tile_rows(tokens) + (z.xv + 1 + z.sv) * tokens + z.wm);
}
static_assert(int_tiled_bytes(GgufType::Q6_K, 3, 32) <= int_tiled_bytes(GgufType::Q6_K, 3) &&
              int_tiled_bytes(GgufType::Q4_K, 3, 32) <= int_tiled_bytes(GgufType::Q4_K, 3) &&
              int_tiled_bytes(GgufType::Q8_0, 2, 32) <= int_tiled_bytes(GgufType::Q8_0, 2));
WGPUComputePipeline int_tiled_pipeline(gpu::Context& ctx, GgufType t, uint32_t digits, uint32_t tokens = kIntTile,
                                       bool experts = false);
// A split product's fold (matmul_fold.wgsl): its groups added and the epilogue.
WGPUComputePipeline fold_pipeline(gpu::Context& ctx, GgufType t, const ClassOrder& order);

}  // namespace wgllm::kernels::detail

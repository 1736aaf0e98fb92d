// Mixtures of experts (moe.wgsl): routing a token to its experts and adding their outputs back, on the GPU, so a
// step never waits for the host to learn which experts were chosen. The experts' products are the matvec kernel's
// (encode_expert_matmul in matmul.h), reading the expert ids the router wrote.
// A layer: logits = norm(x) W_router (encode_matmul), encode_moe_route, the experts' gate/up and down products, then
// encode_moe_combine. Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <algorithm>
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

inline constexpr uint32_t kMoeMaxExperts = 512;  // experts a router may choose from
inline constexpr uint32_t kMoeMaxUsed = 32;      // experts chosen per token
inline constexpr uint32_t kMoeTile = 16;         // the most pairs of one expert per pass of the grouped products

// Mirrors `MoeParams` in moe.wgsl.
struct MoeParams {
  uint32_t n_tokens, n_expert, n_used, flags;
  uint32_t width, grid_x, tile, pad1;
};
static_assert(sizeof(MoeParams) == 32);

// For each token t: p = softmax(logits[t]) (f32), the n_used largest logits' experts in order (ties: the lower
// expert first) into experts[t][r] and their p into weights[t][r], divided by their sum when normalize.
// With sigmoid_bias ([n_expert] f32: lfm2moe's selection bias): p = sigmoid(logits[t]), the experts ranked by
// p + sigmoid_bias, their weights p (divided by max(their sum, 2^-14) when normalize, as llama.cpp).
// logits: [n_tokens][n_expert] f32; experts: [n_tokens][n_used] u32; weights: [n_tokens][n_used] f32.
void encode_moe_route(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& logits,
                      const gpu::Buffer& experts, const gpu::Buffer& weights, uint32_t n_tokens, uint32_t n_expert,
                      uint32_t n_used, bool normalize, const gpu::Buffer* sigmoid_bias = nullptr);

// The pairs per pass of the grouped expert products for a step of `pairs` (token, expert) pairs over n_expert
// experts: the mean pairs per expert rounded up to the matvec's token counts (1-4, 8, 16), at most kMoeTile. A pass
// computes all its tile's lanes, so a tile larger than an expert's share wastes arithmetic; 1 means no grouping
// (each pair its own pass: Qwen3-30B-A3B's 128 experts, 8 per token, group from 32 tokens on).
inline uint32_t moe_tile(uint32_t pairs, uint32_t n_expert) {
  const uint32_t mean = (pairs + n_expert - 1) / std::max(n_expert, 1u);
  return mean <= 4 ? std::max(mean, 1u) : mean <= 8 ? 8 : kMoeTile;
}
// Prefill's tiles for the tiled expert products (ExpertOptions::group_tile), from 16 pairs an expert on average (else
// 0, the grouped matvec's moe_tile): on x's digits (`digits`, prompt_digits' for the weight) 32, whose 32 x 128
// workgroups take an expert's remainder of a few pairs at half a 64 x 64 tile's cost (H100, an LFM2-8B-A1B layer:
// 1.13x at 64 pairs an expert over tiles of 64, 1.2x at 16-32 over the f32 tiles); on the f32 tiles 64 where an
// expert's mean share fills one, else 32.
inline uint32_t moe_matmul_tile(uint32_t pairs, uint32_t n_expert, bool digits) {
  const uint32_t mean = pairs / std::max(n_expert, 1u);
  return mean < 16 ? 0 : mean >= 64 && !digits ? 64 : 32;
}
// The grouping of the grouped expert products (encode_expert_matmul with a group): the n_tokens * n_used pairs
// ordered by expert (experts: [n_tokens][n_used] from encode_moe_route), and tiles of up to `tile` pairs of one
// expert (0: moe_tile's). group: moe_group_words(n_tokens * n_used) u32.
void encode_moe_group(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& experts, const gpu::Buffer& group,
                      uint32_t n_tokens, uint32_t n_expert, uint32_t n_used, uint32_t tile = 0);
// The most tiles a grouping of `pairs` pairs over n_expert experts in tiles of `tile` (0: moe_tile's) has: each
// expert's count rounded up to tiles.
inline uint32_t moe_group_tiles(uint32_t pairs, uint32_t n_expert, uint32_t tile = 0) {
  if (tile == 0) tile = moe_tile(pairs, n_expert);
  return std::min(pairs, (pairs + tile - 1) / tile + n_expert);
}
// The group buffer's u32 for up to `pairs` pairs: the order, then 4 per tile (at most one tile per pair).
inline uint64_t moe_group_words(uint32_t pairs) { return 5ull * pairs; }

// x[t][i] += sum over r < n_used, in order, of weights[t][r] * ys[t * n_used + r][i] (the residual add of the
// experts' outputs). x: [n_tokens][width], ys: [n_tokens * n_used][width], weights: [n_tokens][n_used], all f32.
void encode_moe_combine(gpu::ComputeBatch& batch, gpu::Context& ctx, const gpu::Buffer& ys, const gpu::Buffer& weights,
                        const gpu::Buffer& x, uint32_t n_tokens, uint32_t n_used, uint32_t width);

}  // namespace wgllm::kernels

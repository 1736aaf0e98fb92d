// Weights on the GPU in their GGUF type, shared by the kernels that read them: matvec / matmul (matmul.h), the fused
// decode q/k/v product (qkv_rope_append.h) and the embedding gather (embedding.h). Their WGSL shares
// matmul_common.wgsl, which holds the GPU layout of every type and its dequantising loads.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/types.h"
#include "gpu/context.h"

namespace wgllm::kernels {

// One row range of a weight, in one buffer no larger than a storage binding. GPU layout (see
// matmul_common.wgsl): F32/F16/BF16 rows padded to n_blocks blocks of 32 elements (zeros past n_in), keeping their
// element bits; the block types keep each GGUF block's bytes in row order, padded to a multiple of 4 bytes, except
// that Q8_0/Q4_0/Q5_0/Q6_K move their f16 scale d (Q2_K its d and dmin, MXFP4 its scale byte) into a second array
// starting at 16-byte index scale_off4.
struct GpuWeightPiece {
  gpu::Buffer buffer;
  uint32_t row_begin = 0, n_rows = 0;
  uint32_t scale_off4 = 0;
};

// A GGUF weight of dims ne = [n_in, n_out]: row-major [n_out][n_in], one row per output.
struct GpuWeight {
  GgufType type = GgufType::F32;
  uint32_t n_in = 0, n_out = 0;
  uint32_t n_blocks = 0;  // 32-element blocks per row (n_in rounded up; K-quants: 8 per super-block)
  uint32_t n_experts = 0;  // > 0: n_experts matrices of n_out / n_experts rows stacked, no expert split by a piece
  std::vector<GpuWeightPiece> pieces;
  uint64_t gpu_bytes() const;
  bool empty() const { return pieces.empty(); }
};

// Uploads GGUF bytes (tensor_bytes(type, ne0, ne1) of them) as a GpuWeight, repacked as above and
// split into row ranges so no piece exceeds ctx.max_binding_size() (or max_piece_bytes when > 0,
// which tests use to force splits).
// With n_experts > 0, ne1 holds that many experts' rows stacked and pieces split only between experts.
GpuWeight upload_weight(gpu::Context& ctx, GgufType type, uint64_t ne0, uint64_t ne1, std::span<const uint8_t> bytes,
                        std::string_view label = "weight", uint64_t max_piece_bytes = 0, uint32_t n_experts = 0);

// GGUF bytes of [ne1 = rows][ne0] tensors of one type stacked into one (rows in order).
std::vector<uint8_t> concat_rows(std::span<const std::span<const uint8_t>> parts);
// GGUF bytes of two [rows][ne0] tensors a, b interleaved row by row: a0, b0, a1, b1, ...
std::vector<uint8_t> interleave_rows(std::span<const uint8_t> a, std::span<const uint8_t> b, uint64_t rows);

// Mirrors `MatmulParams` in matmul_common.wgsl.
struct MatmulParams {
  uint32_t n_in, n_out, n_tokens, nb;
  uint32_t row_begin, n_rows, scale_off4, flags;
  uint32_t x_off, y_off, grid_x, row_tiles;
  uint32_t split1, split2, y1_off, y2_off;
  float eps;
  uint32_t y_stride, pos, head_dim;
  uint32_t rope_dim, kv_f16, kv_k_off, kv_v_off;
  uint32_t n_used, x_per_pair, expert_first, n_experts;
  uint32_t tiles_off, times_off, times_stride;
  float pre_scale;  // matvec's MV_PRE: the residual's scale
  uint32_t scale2_off4;                       // TWO_TYPES: the second weight's scale array
  uint32_t route_experts, route_flags, pad2;  // MV_ROUTE: the router's experts and moe_choose's flags
};
static_assert(sizeof(MatmulParams) == 144);

// The FLAG_* bits of matmul_common.wgsl.
namespace flags {
inline constexpr uint32_t kBias = 1, kLastPiece = 2, kNorm = 4, kAccum = 8, kSwiglu = 16, kSplit = 32, kRopeKv = 64,
                          kNeox = 128, kGelu = 256, kSwigluOai = 512, kTimes = 1024,
                          kSigmoid = 2048;
}

// Helpers of the weight kernels' host encoders (and check.h's).
namespace detail {

void check_weight(const char* fn, const GpuWeight& w);  // uploaded and not empty

// A contiguous range of rows of `stride` 4-byte words bound with an aligned offset.
struct RowWindow {
  uint64_t offset_bytes, size_bytes;
  uint32_t first_word;  // words from the binding start to the first row
};
RowWindow row_window(const gpu::Context& ctx, uint64_t first_row, uint64_t n_rows, uint64_t stride);
// Tokens per dispatch so that windows of rows with these strides (in words) fit a binding.
uint32_t tokens_per_binding(const char* fn, const gpu::Context& ctx, std::initializer_list<uint64_t> strides);
// Host constants of matmul_common.wgsl: the weight type, tokens per matvec dispatch, integer f16 loads, and the
// weight's words (wvec, wword, scale_off): of one type, or with t2 of a second (TWO_TYPES, WTYPE2: the binding w2, the
// matvec's rows from split2 on; t2 another block type than t).
std::string weight_prelude(GgufType t, uint32_t nt, bool int_f16 = false, std::optional<GgufType> t2 = std::nullopt);
// The parameters every dispatch over one piece of w shares.
MatmulParams piece_params(const GpuWeight& w, const GpuWeightPiece& piece, uint32_t n_tokens);

}  // namespace detail

}  // namespace wgllm::kernels

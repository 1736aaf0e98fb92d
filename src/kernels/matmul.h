// Weights on the GPU in their GGUF type, and the kernels that read them (matmul.wgsl):
// y = x W^T (+ bias) for decode (matrix-vector) and prefill (tiled matrix-matrix), and the
// embedding gather. Contract checks happen here and throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"

namespace wgllm::kernels {

// The GGUF element types a weight may keep on the GPU.
enum class WeightType : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, Q4_0 = 4 };
const char* weight_type_name(WeightType t);
// From a GGML type id (0 F32, 1 F16, 2 Q4_0, 8 Q8_0, 30 BF16); throws InvalidArgument otherwise.
WeightType weight_type_from_ggml(uint32_t ggml_type);
// Bytes of an [ne1][ne0] tensor of this type in GGUF (ne0 a multiple of 32 for Q8_0/Q4_0).
uint64_t gguf_bytes(WeightType t, uint64_t ne0, uint64_t ne1);

// One row range of a weight, in one buffer no larger than a storage binding. GPU layout (see
// matmul.wgsl): rows padded to n_blocks blocks of 32 elements (zeros past n_in); F32/F16/BF16
// keep their element bits; Q8_0/Q4_0 are split into a quant array ([rows][n_blocks] x 32 or 16
// bytes, 16-byte aligned) followed by the f16 scales ([rows][n_blocks], starting at 16-byte
// index scale_off4). The bytes of each block are otherwise GGUF's.
struct GpuWeightPiece {
  gpu::Buffer buffer;
  uint32_t row_begin = 0, n_rows = 0;
  uint32_t scale_off4 = 0;
};

// A GGUF weight of dims ne = [n_in, n_out]: row-major [n_out][n_in], one row per output.
struct GpuWeight {
  WeightType type = WeightType::F32;
  uint32_t n_in = 0, n_out = 0;
  uint32_t n_blocks = 0;  // 32-element blocks per row (n_in rounded up)
  std::vector<GpuWeightPiece> pieces;
  uint64_t gpu_bytes() const;
};

// Uploads GGUF bytes (gguf_bytes(type, ne0, ne1) of them) as a GpuWeight, repacked as above and
// split into row ranges so no piece exceeds ctx.max_binding_size() (or max_piece_bytes when > 0,
// which tests use to force splits).
GpuWeight upload_weight(gpu::Context& ctx, WeightType type, uint64_t ne0, uint64_t ne1,
                        std::span<const uint8_t> bytes, std::string_view label = "weight",
                        uint64_t max_piece_bytes = 0);

enum class MatmulImpl {
  Auto,    // Matvec for n_tokens <= kMatvecMaxTokens, else Tiled
  Matvec,  // one pass over W per kMatvecMaxTokens tokens
  Tiled,   // 64 x 64 output tiles through workgroup memory
};
inline constexpr uint32_t kMatvecMaxTokens = 4;

// The matvec kernel's shape for an adapter and a weight of n_rows rows of n_in: a workgroup is `groups` groups of
// `threads_per_row` threads, each group owning `rows` adjacent rows (even, for SwiGLU pairs;
// rows * kMatvecMaxTokens <= threads_per_row); partial sums are reduced with subgroup shuffles
// when `shuffle`.
struct MatvecConfig {
  uint32_t threads_per_row = 32, rows = 2, groups = 4;
  uint32_t units = 1;    // 8-element units per row loaded per step (loads in flight = rows x units)
  bool int_f16 = false;  // F16 weights converted with integer ops instead of unpack2x16float
  bool shuffle = false;
};
MatvecConfig matvec_config(const gpu::Context& ctx, uint32_t n_rows = 0, uint32_t n_in = 0);
// Benchmarks only: use `c` instead of the adapter's default (threads_per_row = 0 resets).
void set_matvec_config_override(const MatvecConfig& c);
// "THREADSxROWSxGROUPS[xUNITS[xINT_F16]]", e.g. "32x4x4x2x1" (the --matvec option of the benchmarks).
MatvecConfig parse_matvec_config(const std::string& text);

// Mirrors `MatmulParams` in matmul_common.wgsl.
struct MatmulParams {
  uint32_t n_in, n_out, n_tokens, nb;
  uint32_t row_begin, n_rows, scale_off4, flags;
  uint32_t x_off, y_off, grid_x, row_tiles;
  uint32_t split1, split2, y1_off, y2_off;
  float eps;
  uint32_t y_stride, pos, head_dim;
  uint32_t rope_dim, kv_f16, kv_k_off, kv_v_off;
};
static_assert(sizeof(MatmulParams) == 96);

// Decode epilogue of the stacked q/k/v product (one token, matvec): RoPE of the q and k rows and
// the k, v rows written straight into the KV cache, instead of the split outputs y1, y2 and the
// separate rope and kv_append dispatches.
struct RopeKvAppend {
  const gpu::Buffer* table = nullptr;  // upload_rope_table(rope_dim, ...)
  uint32_t head_dim = 0;
  uint32_t rope_dim = 0;  // even, <= head_dim
  bool neox = false;      // pairs (i, i + rope_dim / 2) rotate (else adjacent pairs (2i, 2i + 1))
  uint32_t pos = 0;       // the token's position, < the cache's max_seq
  KvCache* kv = nullptr;  // kv_dim = split2 - split1 = n_out - split2
};
// Whether encode_matmul takes `rk` for the weight w on this adapter: neox needs head_dim and rope_dim
// multiples of 4, w in one piece and a matvec shape of 4k rows per group (GPUs; CPU adapters use 2).
bool rope_kv_supported(const gpu::Context& ctx, const GpuWeight& w, const RopeKvAppend& rk);

// What happens around the product, fused into the same dispatch.
struct MatmulOptions {
  const gpu::Buffer* bias = nullptr;  // [n_out] f32 added to every row
  // RMSNorm of x first: x[t] / sqrt(mean(x[t]^2) + eps) * norm, norm: [n_in] f32 (bound as vec4:
  // the buffer must hold n_in rounded up to 8 floats, zeros past n_in).
  const gpu::Buffer* norm = nullptr;
  float eps = 1e-5f;
  bool accumulate = false;  // y += x W^T (the residual add); y is read and written
  // W's rows are (gate, up) pairs (interleave_rows): y[t][i] = silu(row 2i) * row 2i+1 (after
  // bias); y is [n_tokens][n_out / 2].
  bool swiglu = false;
  // Rows [split1, split2) go to *y1 ([n_tokens][split2 - split1]) and [split2, n_out) to *y2;
  // y then holds rows [0, split1) ([n_tokens][split1]). Both or neither.
  const gpu::Buffer* y1 = nullptr;
  const gpu::Buffer* y2 = nullptr;
  uint32_t split1 = 0, split2 = 0;
  // With split1/split2 and no y1, y2: q (rotated) to y, k (rotated) and v into the cache.
  const RopeKvAppend* rope_kv = nullptr;
  MatmulImpl impl = MatmulImpl::Auto;
};

// y[t][o] = sum_i x[t][i] * W[o][i] (+ bias[o]) for t < n_tokens, o < W.n_out, with the options'
// epilogues. x: [n_tokens][n_in] f32, y: [n_tokens][n_out] f32 (a different buffer).
// Splits by weight piece and, when x or y would exceed a binding, by token range.
void encode_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& options = {});

// GGUF bytes of [ne1 = rows][ne0] tensors of one type stacked into one (rows in order).
std::vector<uint8_t> concat_rows(std::span<const std::span<const uint8_t>> parts);
// GGUF bytes of two [rows][ne0] tensors a, b interleaved row by row: a0, b0, a1, b1, ...
std::vector<uint8_t> interleave_rows(std::span<const uint8_t> a, std::span<const uint8_t> b, uint64_t rows);

// out[t][0 .. n_in) = row ids[t] of `table` (an embedding stored as ne = [n_embd, n_vocab]),
// dequantised to f32. ids: [n_tokens] u32; ids >= n_vocab give zero rows.
void encode_embedding(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& table, const gpu::Buffer& ids,
                      const gpu::Buffer& out, uint32_t n_tokens);

// 2 * n_in * n_out * n_tokens.
double matmul_flops(const GpuWeight& w, uint32_t n_tokens);

}  // namespace wgllm::kernels

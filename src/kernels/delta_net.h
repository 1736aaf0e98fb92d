// Gated DeltaNet (delta_net.wgsl; qwen35's linear-attention layers) for a chunk of tokens of one sequence:
// encode_delta_conv (the causal convolution of q, k, v over a ring of the last rows, silu, q and k L2-normalised),
// then encode_delta_rule (the gated delta rule over the sequence's recurrent state, token by token or in chunks). The
// CPU references are cpu::conv_silu, cpu::delta_rule and cpu::delta_rule_chunked (cpu/delta_net.h). Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// The largest key or value head dimension the kernels take (a state column's rows are held in registers).
inline constexpr uint32_t kDeltaMaxHeadDim = 256;

// Mirrors `DeltaParams` in delta_net.wgsl.
struct DeltaParams {
  uint32_t n, k_heads, v_heads, row;
  uint32_t pos, ring_rows, taps;
  float eps;
  uint32_t ab_stride, beta_offset, fresh, store;
  float norm_eps = 0;  // delta_step_norm
  uint32_t ring_base = 0, state_base = 0, out_base = 0;  // DeltaShape's ring_at, state_at, state_out_at in elements
};
static_assert(sizeof(DeltaParams) == 64);

struct DeltaShape {
  uint32_t n_tokens = 0;    // tokens of this call, at positions pos .. pos + n_tokens - 1
  uint32_t k_heads = 0;     // K: key (and query) heads
  uint32_t v_heads = 0;     // H: value heads, a multiple of K; value head h reads key head h % K
  uint32_t dk = 0, dv = 0;  // head dimensions, each at most kDeltaMaxHeadDim
  uint32_t row = 0;         // the first token's row in every [tokens][...] buffer (a decode step of several sequences)
  // Where the sequence's conv ring, its state before the call and its state after it start in their buffers (bytes,
  // multiples of 4): a pool of several sequences' states (SharedKv) holds each at its own offsets. state and state_out
  // may then be one buffer, their ranges apart.
  uint64_t ring_at = 0, state_at = 0, state_out_at = 0;
  uint32_t channels() const { return 2 * k_heads * dk + v_heads * dv; }  // W: q, k, v
};

// delta_conv: x [row + n][W] (the q/k/v in-projection), taps [W][L] f32, ring [R][W] f32 (row q % R holds x of
// position q < pos; rows before position 0 are never read) -> c [row + n][W]: silu(conv(x)), q and k heads
// L2-normalised (x / sqrt(|x|^2 + eps); q also / sqrt(dk)); the ring then holds the rows of the last L - 1 positions
// (also of those before pos where n < L - 1). Needs taps >= 2 and R >= taps (delta_ring_rows): one row more than
// the next call reads, so a decode step queued ahead of the host, whose token may be dropped, overwrites none of
// those the state at its position needs. With n + L - 1 <= R one dispatch, else a second one stores the rows.
void encode_delta_conv(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                       uint32_t pos, uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                       const gpu::Buffer& ring, const gpu::Buffer& c);
// The rows of a sequence's conv ring for a convolution of `taps`.
inline uint32_t delta_ring_rows(uint32_t taps) { return taps; }

// Where a step's alpha and beta lie: alpha of token r, head h at r * stride + h; beta at r * stride + beta_offset + h
// (one buffer [n][2H] from a stacked product: stride 2H, offset H; or two [n][H]: stride H, offset 0).
struct DeltaGates {
  const gpu::Buffer* alpha = nullptr;
  const gpu::Buffer* beta = nullptr;
  uint32_t stride = 0, beta_offset = 0;
};

// How encode_delta_rule runs the recurrence: one token after another (delta_rule), or kDeltaChunk tokens at a time
// in the WY / UT form (delta_chunk: small matrix products inside a chunk, 13 barriers per chunk at head size 128
// instead of one per token; needs delta_chunk_supported and a scratch buffer of delta_chunk_scratch_bytes, which a
// first dispatch, delta_chunk_prep, fills with every chunk's T and M). Auto: chunked from delta_chunk_from(ctx) tokens where supported and given one.
enum class DeltaRuleImpl { Auto, Sequential, Chunked };
inline constexpr uint32_t kDeltaChunk = 16;
// Whether the adapter's workgroup memory holds delta_chunk's arrays for these head sizes (15.4 KiB at 128 x 128).
bool delta_chunk_supported(const gpu::Context& ctx, const DeltaShape& s);
// The chunked rule's scratch for a call: T and M ([CH][CH] f32 each) of every (value head, chunk).
uint64_t delta_chunk_scratch_bytes(const DeltaShape& s);
// The call length from which Auto runs in chunks: ContextOptions::delta_chunk_from; by default never.
uint32_t delta_chunk_from(const gpu::Context& ctx);

// delta_rule: c [row + n][W] (delta_conv's output), the gates, consts [2H] f32 (dt_bias, then a = -exp(A_log)), the
// state before the call [H][dk][dv] f32 (zeros instead when `fresh`: the state before position 0) -> o [row + n][H][dv]
// and the state after it in state_out, another buffer (the one before stays: a decode step run ahead of the host
// leaves the state it started from; SequenceState keeps two per layer).
void encode_delta_rule(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, const gpu::Buffer& c,
                       const DeltaGates& gates, const gpu::Buffer& consts, const gpu::Buffer& state,
                       const gpu::Buffer& state_out, const gpu::Buffer& o, bool fresh = false,
                       DeltaRuleImpl impl = DeltaRuleImpl::Auto, const gpu::Buffer* scratch = nullptr);

// delta_step: a decode step (n_tokens 1) of delta_conv and delta_rule in one dispatch, with the arguments of both
// (the conv's output stays inside; its ring row stored in place). Needs delta_step_supported: 9 storage buffers.
// With `norm`, the output's gated norm too (qwen35's, as encode_rms_norm with a silu gate over rows of dv): o then
// receives y = o / sqrt(mean(o^2 over the value head) + norm->eps) * norm->weight * silu(z), one workgroup per
// value head; needs delta_step_norm_supported.
struct DeltaOutputNorm {
  const gpu::Buffer* weight = nullptr;  // [dv] f32
  const gpu::Buffer* z = nullptr;       // [row + 1][v_heads][dv] f32, the gate
  float eps = 1e-6f;
};
bool delta_step_supported(const gpu::Context& ctx);
// 11 storage buffers, and a value head's columns in one workgroup of up to 1024 invocations with at most 16 state
// rows per invocation (dv <= 256 and ceil(dk / (1024 / bit_ceil(dv))) <= 16 where the device allows 1024: Qwen 3.5's
// 128 x 128 heads fit).
bool delta_step_norm_supported(const gpu::Context& ctx, const DeltaShape& s);
void encode_delta_step(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                       uint32_t pos, uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                       const gpu::Buffer& ring, const DeltaGates& gates, const gpu::Buffer& consts,
                       const gpu::Buffer& state, const gpu::Buffer& state_out, const gpu::Buffer& o, bool fresh = false,
                       const DeltaOutputNorm* norm = nullptr);

// delta_step for several sequences' tokens at once (continuous batching): row i of x, the gates, z and o is the token
// of sequence i, at the position, ring offset, state offset and state-after offset that `steps` [s.n_tokens] (u32 x 4,
// offsets in elements) gives, all sequences' rings in `rings` and their states in `states` (a pool: each sequence's
// state after the step goes to another range of it). Each row gets the bits of encode_delta_step alone (a row at
// position 0 starts from zeros). s.row, ring_at, state_at and state_out_at are not used; the offsets are not checked
// against each other (the pool's owner lays them out). Needs delta_step_rows_supported.
bool delta_step_rows_supported(const gpu::Context& ctx, const DeltaShape& s, bool norm);
void encode_delta_step_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const DeltaShape& s, uint32_t taps_count,
                            uint32_t ring_rows, float eps, const gpu::Buffer& x, const gpu::Buffer& taps,
                            const gpu::Buffer& rings, const DeltaGates& gates, const gpu::Buffer& consts,
                            const gpu::Buffer& states, const gpu::Buffer& steps, const gpu::Buffer& o,
                            const DeltaOutputNorm* norm = nullptr);

}  // namespace wgllm::kernels

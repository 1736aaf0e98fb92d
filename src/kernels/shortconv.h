// LFM2's gated short convolution (shortconv.wgsl) and its conv state: y = C * conv(B * x) for a chunk of tokens of
// one sequence, reading and updating a ring of the last B*x rows. The CPU reference is cpu::shortconv.
// Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"

namespace wgllm::kernels {

// Mirrors `ConvParams` in shortconv.wgsl.
struct ConvParams {
  uint32_t n, n_embd, taps, pos;
  uint32_t ring_rows, grid_x, row, pad1;
};
static_assert(sizeof(ConvParams) == 32);

struct ShortConvShape {
  uint32_t n_tokens = 0;   // tokens of this call, at positions pos .. pos + n_tokens - 1
  uint32_t n_embd = 0;     // E: channels
  uint32_t taps = 0;       // L (l_cache), >= 2
  uint32_t pos = 0;        // position of the first token
  uint32_t ring_rows = 0;  // R: rows of the conv state; n_tokens + taps - 1 <= R
  uint32_t row = 0;        // the first token's row in bcx and y (a decode step of several sequences)
};

// The rows a sequence's conv state needs so that chunks of up to max_tokens run, plus one for a decode step queued
// ahead of the host (its row must not overwrite one a rewind may still need): max_tokens + taps.
inline uint32_t conv_ring_rows(uint32_t max_tokens, uint32_t taps) { return max_tokens + taps; }

// bcx [row + n][3E] f32 (in_proj's output), taps [E][L] f32, ring [R][E] f32 (row q % R holds B*x of position
// q < pos; rows of positions before 0 are never read), y [row + n][E] f32; rows from s.row on are used.
void encode_shortconv(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                      const gpu::Buffer& taps, const gpu::Buffer& ring, const gpu::Buffer& y);

}  // namespace wgllm::kernels

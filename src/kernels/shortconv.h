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
  uint32_t ring_rows, grid_x, row, ring_base;
};
static_assert(sizeof(ConvParams) == 32);

struct ShortConvShape {
  uint32_t n_tokens = 0;   // tokens of this call, at positions pos .. pos + n_tokens - 1
  uint32_t n_embd = 0;     // E: channels
  uint32_t taps = 0;       // L (l_cache), >= 2
  uint32_t pos = 0;        // position of the first token
  uint32_t ring_rows = 0;  // R: rows of the conv state; n_tokens + taps - 1 <= R
  uint32_t row = 0;        // the first token's row in bcx and y (a decode step of several sequences)
  uint64_t ring_offset = 0;  // bytes: where the sequence's ring starts in `ring` (a pool of several sequences' rings)
};

// The rows a sequence's conv state needs so that chunks of up to max_tokens run, plus one for a decode step queued
// ahead of the host (its row must not overwrite one a rewind may still need): max_tokens + taps.
inline uint32_t conv_ring_rows(uint32_t max_tokens, uint32_t taps) { return max_tokens + taps; }

// bcx [row + n][3E] f32 (in_proj's output), taps [E][L] f32, ring [R][E] f32 from byte s.ring_offset on (row q % R
// holds B*x of position q < pos; rows of positions before 0 are never read), y [row + n][E] f32; rows from s.row on
// are used.
void encode_shortconv(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                      const gpu::Buffer& taps, const gpu::Buffer& ring, const gpu::Buffer& y);

// A decode step of n sequences in one dispatch: row r of bcx and y is one token of its own sequence, at position
// seqs[r].x, its ring of s.ring_rows rows from element seqs[r].y of `rings` (a pool of the sequences' rings, each
// [R][E]). Each row's outputs and ring row are the bits encode_shortconv gives for that token alone. s.n_tokens is
// n; s.pos, s.row and s.ring_offset are unused. seqs: [n] (position, ring base in elements) u32 pairs, every base +
// R * E within `rings` (the host that writes it keeps that; a base past it reads and writes nothing of another
// buffer).
void encode_shortconv_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const ShortConvShape& s, const gpu::Buffer& bcx,
                           const gpu::Buffer& taps, const gpu::Buffer& rings, const gpu::Buffer& seqs,
                           const gpu::Buffer& y);

}  // namespace wgllm::kernels

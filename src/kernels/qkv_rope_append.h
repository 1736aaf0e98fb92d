// The decode step's fused q/k/v product (matvec.wgsl with its RoPE + KV-append epilogue): for one token,
// q, k, v = rms_norm(x) * norm @ Wqkv (+ bias), q and k rotated (RoPE), q written to y, k and v written straight
// into the KV cache — one dispatch instead of the product, a RoPE and a KV append. Contract checks throw
// wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"
#include "kernels/weight.h"

namespace wgllm::kernels {

// Which rows the weight holds: q, k and v stacked (one dispatch for all), or, where v's weight has another type
// than q's and k's (Q4_K_M files keep some layers' v in Q6_K), q and k stacked and v alone (two dispatches).
enum class QkvRows { Qkv, Qk, V };

struct QkvRopeAppend {
  const gpu::Buffer* table = nullptr;  // upload_rope_table(rope_dim, ...)
  uint32_t head_dim = 0;
  uint32_t rope_dim = 0;              // even, <= head_dim
  bool neox = false;                  // pairs (i, i + rope_dim / 2) rotate (else adjacent pairs (2i, 2i + 1))
  uint32_t pos = 0;                   // the token's position, < the cache's max_seq
  KvCache* kv = nullptr;              // its kv_dim: the k rows and the v rows of the weight
  const gpu::Buffer* bias = nullptr;  // [n_out] f32 (optional)
  const gpu::Buffer* norm = nullptr;  // [n_in] f32 padded to 8 (optional): RMSNorm of x folded in
  float eps = 1e-5f;
  QkvRows rows = QkvRows::Qkv;
  // With rows Qk: v's weight ([kv_dim][n_in], another block type than w's), its rows computed in the same dispatch
  // after k's (bias then [q_dim + 2 kv_dim], v's last). Where qkv_rope_append_supported says no, encode q/k and v
  // as two (rows Qk, then V).
  const GpuWeight* v = nullptr;
};

// Whether encode_qkv_rope_append takes weight w (and a.v) on this adapter: neox needs head_dim and rope_dim multiples
// of 4, w in one piece and a matvec shape of 4k rows per group (GPUs; CPU adapters use 2); a.v, the matvec taking
// both weights in one dispatch (matvec_takes_second: block types on a GPU's matvec, w's rows a multiple of a
// workgroup's).
bool qkv_rope_append_supported(const gpu::Context& ctx, const GpuWeight& w, const QkvRopeAppend& a);

// w stacks the q, k and v rows ([q_dim + 2 kv_dim][n_in]; a.rows Qk: [q_dim + kv_dim], V: [kv_dim]); x: [n_in] f32,
// one token. y gets q ([q_dim] f32), rotated (unused with V); k (rotated) and v go into a.kv at position a.pos.
void encode_qkv_rope_append(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                            const gpu::Buffer& y, const QkvRopeAppend& a);

}  // namespace wgllm::kernels

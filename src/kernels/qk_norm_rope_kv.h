// qwen3's decode step between the q/k/v product and attention (qk_norm_rope_kv.wgsl): per-head q/k RMSNorm,
// RoPE and the KV append in one dispatch. Contract checks throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"
#include "kernels/rope.h"

namespace wgllm::kernels {

// Mirrors `Params` in qk_norm_rope_kv.wgsl.
struct QkNormRopeKvParams {
  uint32_t n_head, n_kv, head_dim, rope_dim;
  uint32_t pos, neox, kv_f16, kv_k_off;
  uint32_t kv_v_off;
  float eps;
  uint32_t norm = 1, row = 0;
  uint32_t v_norm = 0, pad[3] = {};
};
static_assert(sizeof(QkNormRopeKvParams) == 64);

struct QkNormRopeKvShape {
  uint32_t n_head = 0, n_kv = 0;
  uint32_t head_dim = 0;  // even, <= 512
  uint32_t rope_dim = 0;  // 0 = head_dim; even, <= head_dim
  RopeType type = RopeType::Normal;
  uint32_t pos = 0;  // the token's position, < the cache's max_seq
  float eps = 1e-6f;
  bool norm = true;     // false: no q/k norm, RoPE and the append alone (q_norm, k_norm are not read)
  uint32_t row = 0;     // the token's row in q, k and v (a decode step of several sequences)
  bool v_norm = false;  // v's heads RMS-normalised (no gain) before they go into the cache (Gemma 4)
};

// One decoded token of a model with per-head q/k norm (qwen3), in one dispatch: every q head becomes
// rope(rms_norm(q_h) * q_norm) in place, every k head rope(rms_norm(k_h) * k_norm) written into the cache at
// s.pos, every v head copied there (with s.v_norm as v_h / rms(v_h); without s.norm: rope(q_h), rope(k_h)).
// q: [s.row + 1][n_head * head_dim], k, v: [s.row + 1][n_kv * head_dim] f32, row s.row used; q_norm, k_norm:
// [head_dim]; table from upload_rope_table(rope_dim).
void encode_qk_norm_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                            const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& q_norm, const gpu::Buffer& k_norm, KvCache& kv);

// The q heads alone (a layer that attends over another layer's cache, gemma4): every q head of row s.row becomes
// rope(rms_norm(q_h) * q_norm) in place, the same bits encode_qk_norm_rope_kv gives it; s.n_kv, s.v_norm are not used.
void encode_qk_norm_rope_q(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                           const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& q_norm);

// The same for n tokens of n sequences in one dispatch (continuous batching): token i (row i of q, k, v) at the
// position rows[i].x, its K and V rows at elements rows[i].y and rows[i].z of `pool` (every sequence's cache a view
// of one single-pool cache; KvCache::locate gives the offsets). s.pos and s.row are not used. rows: [n] vec4<u32>.
void encode_qk_norm_rope_kv_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s, uint32_t n,
                                 const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k,
                                 const gpu::Buffer& v, const gpu::Buffer& q_norm, const gpu::Buffer& k_norm,
                                 const KvCache& cache, const gpu::Buffer& rows);

}  // namespace wgllm::kernels

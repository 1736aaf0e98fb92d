#include "kernels/qk_norm_rope_kv.h"

#include <string>

#include "kernels/check.h"

namespace wgllm::kernels {

using detail::fail;
using detail::need;

namespace {

constexpr const char* kShader = "rope_angle.wgsl+qk_norm_rope.wgsl+qk_norm_rope_kv.wgsl";

// The checks of the q heads' part (every encoder here): returns the rope_dim in force.
uint32_t checked_rope_dim(const char* fn, const QkNormRopeKvShape& s) {
  constexpr uint32_t kMaxHeadDim = 512;  // NR_MAX in the shader
  if (s.n_head == 0) fail(fn, "n_head and n_kv must be > 0");
  if (s.head_dim == 0 || s.head_dim % 2 || s.head_dim > kMaxHeadDim)
    fail(fn, "head_dim " + std::to_string(s.head_dim) + " must be even and <= " + std::to_string(kMaxHeadDim));
  const uint32_t rope_dim = s.rope_dim ? s.rope_dim : s.head_dim;
  if (rope_dim % 2 || rope_dim > s.head_dim)
    fail(fn, "rope_dim " + std::to_string(rope_dim) + " must be even and <= head_dim " + std::to_string(s.head_dim));
  if (!(s.eps > 0)) fail(fn, "eps must be > 0");
  return rope_dim;
}

// The checks both encoders share, for `rows` tokens (rows 0 .. rows - 1 of q, k, v), and the parameters without the
// position and cache offsets. Returns them with the byte sizes of the q, k / v and norm bindings.
struct Checked {
  QkNormRopeKvParams p{};
  uint64_t q_bytes, kv_bytes, norm_bytes, table_bytes;
};
Checked check(const char* fn, gpu::Context& ctx, const QkNormRopeKvShape& s, uint64_t rows, const gpu::Buffer& table,
              const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v, const gpu::Buffer& q_norm,
              const gpu::Buffer& k_norm, const KvCache& kv) {
  if (s.n_kv == 0) fail(fn, "n_head and n_kv must be > 0");
  const uint32_t rope_dim = checked_rope_dim(fn, s);
  const uint64_t kv_dim = uint64_t(s.n_kv) * s.head_dim;
  if (kv.config().kv_dim != kv_dim)
    fail(fn, "n_kv * head_dim " + std::to_string(kv_dim) + " must equal the cache's kv_dim " +
                 std::to_string(kv.config().kv_dim));
  Checked c;
  c.q_bytes = rows * s.n_head * s.head_dim * 4;
  c.kv_bytes = rows * kv_dim * 4;
  if (c.q_bytes / 4 > UINT32_MAX || c.kv_bytes / 4 > UINT32_MAX) fail(fn, "rows exceed 32-bit element offsets");
  need(fn, "q", q, c.q_bytes, ctx);
  need(fn, "k", k, c.kv_bytes, ctx);
  need(fn, "v", v, c.kv_bytes, ctx);
  c.norm_bytes = s.norm ? uint64_t(s.head_dim) * 4 : 16;
  need(fn, "q_norm", q_norm, c.norm_bytes, ctx);
  need(fn, "k_norm", k_norm, c.norm_bytes, ctx);
  c.table_bytes = uint64_t(rope_dim / 2) * 16;
  need(fn, "table", table, c.table_bytes, ctx);
  if (q.get() == k.get() || q.get() == v.get()) fail(fn, "q must be another buffer than k and v");
  c.p.n_head = s.n_head;
  c.p.n_kv = s.n_kv;
  c.p.head_dim = s.head_dim;
  c.p.rope_dim = rope_dim;
  c.p.neox = s.type == RopeType::Neox ? 1 : 0;
  c.p.kv_f16 = kv.config().type == KvType::F16 ? 1 : 0;
  c.p.eps = s.eps;
  c.p.norm = s.norm ? 1 : 0;
  c.p.v_norm = s.v_norm ? 1 : 0;
  return c;
}

}  // namespace

void encode_qk_norm_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                            const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                            const gpu::Buffer& q_norm, const gpu::Buffer& k_norm, KvCache& kv) {
  const char* fn = "encode_qk_norm_rope_kv";
  Checked c = check(fn, ctx, s, uint64_t(s.row) + 1, table, q, k, v, q_norm, k_norm, kv);
  if (s.pos >= kv.config().max_seq)
    fail(fn, "position " + std::to_string(s.pos) + " is past the cache (max_seq " +
                 std::to_string(kv.config().max_seq) + ")");
  const KvCache::Location at = kv.locate(s.pos);
  if (at.v_elem + kv.config().kv_dim > UINT32_MAX) fail(fn, "the cache pool is too large for 32-bit element offsets");
  c.p.pos = s.pos;
  c.p.kv_k_off = uint32_t(at.k_elem);
  c.p.kv_v_off = uint32_t(at.v_elem);
  c.p.row = s.row;
  WGPUComputePipeline pipe = ctx.pipeline({kShader, "qk_norm_rope_kv", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, c.p),          {2, &q, 0, c.q_bytes},
                                  {3, &k, 0, c.kv_bytes},         {4, &v, 0, c.kv_bytes},
                                  {7, &kv.pool(at.pool)},         {13, &table, 0, c.table_bytes},
                                  {14, &q_norm, 0, c.norm_bytes}, {15, &k_norm, 0, c.norm_bytes}};
  batch.dispatch(pipe, b, s.n_head + 2 * s.n_kv);
}

void encode_qk_norm_rope_q(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s,
                           const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& q_norm) {
  const char* fn = "encode_qk_norm_rope_q";
  const uint32_t rope_dim = checked_rope_dim(fn, s);
  const uint64_t q_bytes = (uint64_t(s.row) + 1) * s.n_head * s.head_dim * 4;
  if (q_bytes / 4 > UINT32_MAX) fail(fn, "rows exceed 32-bit element offsets");
  need(fn, "q", q, q_bytes, ctx);
  const uint64_t norm_bytes = s.norm ? uint64_t(s.head_dim) * 4 : 16, table_bytes = uint64_t(rope_dim / 2) * 16;
  need(fn, "q_norm", q_norm, norm_bytes, ctx);
  need(fn, "table", table, table_bytes, ctx);
  // n_kv = 1 keeps the shader's head ranges valid; only the n_head q heads are dispatched (k, v and the cache are
  // placeholders it never touches)
  const QkNormRopeKvParams p{.n_head = s.n_head,
                             .n_kv = 1,
                             .head_dim = s.head_dim,
                             .rope_dim = rope_dim,
                             .pos = s.pos,
                             .neox = s.type == RopeType::Neox ? 1u : 0u,
                             .kv_f16 = 0,
                             .kv_k_off = 0,
                             .kv_v_off = 0,
                             .eps = s.eps,
                             .norm = s.norm ? 1u : 0u,
                             .row = s.row};
  WGPUComputePipeline pipe = ctx.pipeline({kShader, "qk_norm_rope_kv", {}, ""});
  const gpu::Buffer& none = ctx.placeholder_storage();
  const gpu::BufferBinding b[] = {batch.uniform(0, p),
                                  {2, &q, 0, q_bytes},
                                  {3, &none, 0, 16},
                                  {4, &none, 0, 16},
                                  {7, &ctx.placeholder_writable(), 0, 16},
                                  {13, &table, 0, table_bytes},
                                  {14, &q_norm, 0, norm_bytes},
                                  {15, &q_norm, 0, norm_bytes}};
  batch.dispatch(pipe, b, s.n_head);
}

void encode_qk_norm_rope_kv_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const QkNormRopeKvShape& s, uint32_t n,
                                 const gpu::Buffer& table, const gpu::Buffer& q, const gpu::Buffer& k,
                                 const gpu::Buffer& v, const gpu::Buffer& q_norm, const gpu::Buffer& k_norm,
                                 const KvCache& cache, const gpu::Buffer& rows) {
  const char* fn = "encode_qk_norm_rope_kv_rows";
  if (n == 0) fail(fn, "n must be > 0");
  if (n > ctx.limits().maxComputeWorkgroupsPerDimension) fail(fn, "n exceeds maxComputeWorkgroupsPerDimension");
  if (cache.n_pools() != 1) fail(fn, "the cache must be one pool (" + std::to_string(cache.n_pools()) + ")");
  if (cache.pool(0).size / kv_type_bytes(cache.config().type) > UINT32_MAX)
    fail(fn, "the cache pool is too large for 32-bit element offsets");
  need(fn, "rows", rows, uint64_t(n) * 16, ctx);
  const Checked c = check(fn, ctx, s, n, table, q, k, v, q_norm, k_norm, cache);
  WGPUComputePipeline pipe = ctx.pipeline({kShader, "qk_norm_rope_kv_rows", {}, ""});
  const gpu::BufferBinding b[] = {batch.uniform(0, c.p),
                                  {2, &q, 0, c.q_bytes},
                                  {3, &k, 0, c.kv_bytes},
                                  {4, &v, 0, c.kv_bytes},
                                  {7, &cache.pool(0)},
                                  {8, &rows, 0, uint64_t(n) * 16},
                                  {13, &table, 0, c.table_bytes},
                                  {14, &q_norm, 0, c.norm_bytes},
                                  {15, &k_norm, 0, c.norm_bytes}};
  batch.dispatch(pipe, b, s.n_head + 2 * s.n_kv, n);
}

}  // namespace wgllm::kernels

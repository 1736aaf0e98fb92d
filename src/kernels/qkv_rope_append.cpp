#include "kernels/qkv_rope_append.h"

#include <string>

#include "kernels/check.h"
#include "kernels/matmul.h"

namespace wgllm::kernels {

using detail::fail;

bool qkv_rope_append_supported(const gpu::Context& ctx, const GpuWeight& w, const QkvRopeAppend& a) {
  if (a.v && (a.rows != QkvRows::Qk || !detail::matvec_takes_second(ctx, w, *a.v))) return false;
  if (!a.neox) return true;
  const uint32_t n_out = w.n_out + (a.v ? a.v->n_out : 0);
  return a.head_dim % 4 == 0 && a.rope_dim % 4 == 0 && w.pieces.size() == 1 &&
         (rows_kernel_for(ctx, w.type) ||
          matvec_config(ctx, n_out, w.n_in, w.type).rows % 4 == 0);  // Rows takes quads for neox
}

void encode_qkv_rope_append(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                            const gpu::Buffer& y, const QkvRopeAppend& a) {
  const char* fn = "encode_qkv_rope_append";
  detail::check_weight(fn, w);
  if (!a.table || !a.kv) fail(fn, "the RoPE table and the KV cache are required");
  const auto& kc = a.kv->config();
  if (a.v) detail::check_weight(fn, *a.v);
  if (a.v && (a.rows != QkvRows::Qk || !detail::matvec_takes_second(ctx, w, *a.v)))
    fail(fn,
         "v's weight of its own takes rows Qk and a matvec that reads both weights in one dispatch "
         "(matvec_takes_second: " +
             std::string(type_name(w.type)) + " then " + type_name(a.v->type) + ")");
  if (a.v && a.v->n_out != kc.kv_dim)
    fail(fn,
         "v's weight has " + std::to_string(a.v->n_out) + " rows, not the cache's kv_dim " + std::to_string(kc.kv_dim));
  // k and v rows in the weight: both, k alone (after q) or v alone
  const uint32_t kv_sets = a.rows == QkvRows::Qkv ? 2 : 1;
  if (a.rows == QkvRows::V ? w.n_out != kc.kv_dim : uint64_t(kc.kv_dim) * kv_sets >= w.n_out)
    fail(fn, "the weight's " + std::to_string(w.n_out) + " rows must hold " +
                 (a.rows == QkvRows::V ? "the cache's kv_dim " + std::to_string(kc.kv_dim) + " v rows"
                  : a.rows == QkvRows::Qk
                      ? "q rows and the cache's kv_dim " + std::to_string(kc.kv_dim) + " k rows"
                      : "q rows and the cache's kv_dim " + std::to_string(kc.kv_dim) + " k and v rows each"));
  const uint32_t q_dim = w.n_out - kv_sets * kc.kv_dim;
  if (a.head_dim == 0 || a.head_dim % 2 || a.rope_dim % 2 || a.rope_dim > a.head_dim || q_dim % a.head_dim ||
      kc.kv_dim % a.head_dim)
    fail(fn, "head_dim " + std::to_string(a.head_dim) + " must be even and divide q's and k's rows, " + "rope_dim " +
                 std::to_string(a.rope_dim) + " even and <= head_dim");
  if (a.neox && !qkv_rope_append_supported(ctx, w, a))
    fail(fn,
         "neox RoPE needs head_dim and rope_dim multiples of 4, the weight in one piece and a matvec shape of 4k "
         "rows (or the Rows kernel; head_dim " +
             std::to_string(a.head_dim) + ", rope_dim " + std::to_string(a.rope_dim) + ", " +
             std::to_string(w.pieces.size()) + " pieces)");
  if (a.pos >= kc.max_seq)
    fail(fn, "position " + std::to_string(a.pos) + " is past the cache (max_seq " + std::to_string(kc.max_seq) + ")");
  if (a.table->size < uint64_t(a.rope_dim / 2) * 16) fail(fn, "the RoPE table is shorter than rope_dim / 2");
  const KvCache::Location at = a.kv->locate(a.pos);
  if (at.k_elem > UINT32_MAX || at.v_elem + kc.kv_dim > UINT32_MAX)
    fail(fn, "the cache pool is too large for 32-bit element offsets");
  // rows [0, split1) q, [split1, split2) k, the rest v
  const uint32_t split2 = a.rows == QkvRows::V ? 0 : q_dim + kc.kv_dim;
  const MatmulOptions o{.bias = a.bias, .norm = a.norm, .eps = a.eps, .split1 = q_dim, .split2 = split2, .second = a.v};
  const detail::RopeKvEpilogue e{.table = a.table,
                                 .pool = &a.kv->pool(at.pool),
                                 .pos = a.pos,
                                 .head_dim = a.head_dim,
                                 .rope_dim = a.rope_dim,
                                 .k_elem = uint32_t(at.k_elem),
                                 .v_elem = uint32_t(at.v_elem),
                                 .neox = a.neox,
                                 .kv_f16 = kc.type == KvType::F16};
  detail::encode_matvec_rope_kv(batch, ctx, w, x, y, o, e);
}

}  // namespace wgllm::kernels

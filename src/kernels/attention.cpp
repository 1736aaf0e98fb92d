#include "kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/attention_preludes.h"
#include "kernels/check.h"
#include "wgllm/error.h"

namespace wgllm::kernels {

using detail::f16_prelude;
using detail::fail;
using detail::kDecodeWorkgroup;
using detail::kF16Rows;
using detail::kv_prelude_scalar;
using detail::kv_prelude_vec4;
using detail::tile_prelude;

namespace {

constexpr uint32_t kMaxHeadDim = kAttentionMaxHeadDim;
// The pipelines' shaders: each kernel file after the parameters, bindings and page walk they share.
constexpr const char* kAttentionShader = "attention_common.wgsl+attention.wgsl";
constexpr const char* kAttentionF16Shader = "attention_common.wgsl+attention_f16.wgsl";
constexpr const char* kAttentionBaselineShader = "attention_common.wgsl+attention_baseline.wgsl";
constexpr const char* kAttentionDecodeGqaShader = "attention_common.wgsl+attention.wgsl+attention_decode_gqa.wgsl";
constexpr const char* kAttentionDecodeFreshShader =
    "attention_common.wgsl+attention.wgsl+rope_angle.wgsl+qk_norm_rope.wgsl+attention_decode_fresh.wgsl";

// The decode kernels' pipelines (entry: "attention_decode", "attention_decode_reduce" or "attention_decode_gqa", the
// latter with `group` query heads a workgroup), found by what their preludes are made of (gpu::Context::pipeline's
// compact key): every decode step dispatches them again.
WGPUComputePipeline decode_pipeline(gpu::Context& ctx, const char* entry, KvView view, const AttentionTiles& t,
                                    uint32_t group = 0) {
  static_assert(sizeof(AttentionTiles) == 28, "a new field: add it to the arguments below");
  const uint32_t args[] = {uint32_t(view), t.bq, t.bk, t.tpr, t.dv, t.wg, t.rpt, t.dec_tpk, group};
  return ctx.pipeline(entry, args, [&] {  // called on a miss only
    const bool fresh = std::string_view(entry) == "attention_decode_fresh";
    std::string prelude = kv_prelude_vec4(view, fresh) + tile_prelude(t);
    if (group) prelude += "const GQ: u32 = " + std::to_string(group) + "u;\n";
    const char* shader = fresh ? kAttentionDecodeFreshShader : group ? kAttentionDecodeGqaShader : kAttentionShader;
    return gpu::PipelineKey{shader, entry, {}, prelude};
  });
}

// Resolved strides/scale plus every check shared by prefill and decode.
AttentionShape validate(const char* fn, const gpu::Context& ctx, AttentionShape s, const gpu::Buffer& q,
                        const KvCache& kv, const gpu::Buffer& out) {
  if (s.n_heads == 0) fail(fn, "n_heads must be > 0");
  if (s.n_kv_heads == 0) fail(fn, "n_kv_heads must be > 0");
  if (s.n_heads % s.n_kv_heads != 0)
    fail(fn, "n_heads (" + std::to_string(s.n_heads) + ") must be a multiple of n_kv_heads (" +
                 std::to_string(s.n_kv_heads) + ")");
  if (s.head_dim == 0 || s.head_dim > kMaxHeadDim || s.head_dim % 2 != 0)
    fail(fn, "head_dim " + std::to_string(s.head_dim) + " must be even and in [2, " + std::to_string(kMaxHeadDim) + "]");
  if (s.n_queries == 0) fail(fn, "n_queries must be > 0");
  const uint32_t q_dim = s.n_heads * s.head_dim;
  if (s.q_stride == 0) s.q_stride = q_dim;
  if (s.out_stride == 0) s.out_stride = q_dim;
  if (s.q_stride < q_dim) fail(fn, "q_stride " + std::to_string(s.q_stride) + " < n_heads * head_dim");
  if (s.out_stride < q_dim) fail(fn, "out_stride " + std::to_string(s.out_stride) + " < n_heads * head_dim");
  if (s.scale == 0) s.scale = 1.0f / std::sqrt(float(s.head_dim));
  if (!std::isfinite(s.scale)) fail(fn, "scale must be finite");
  if (kv.config().kv_dim != s.n_kv_heads * s.head_dim)
    fail(fn, "KV cache kv_dim " + std::to_string(kv.config().kv_dim) + " != n_kv_heads * head_dim (" +
                 std::to_string(s.n_kv_heads * s.head_dim) + ")");
  const uint64_t end = uint64_t(s.start_pos) + s.q_base + s.n_queries;
  if (kv.config().max_seq < end)
    fail(fn, "max_seq " + std::to_string(kv.config().max_seq) + " < start_pos + q_base + n_queries (" +
                 std::to_string(end) + ")");
  const uint64_t rows = uint64_t(s.row) + s.q_base + s.n_queries;
  if (q.size < ((rows - 1) * s.q_stride + q_dim) * 4)
    fail(fn, "q buffer holds " + std::to_string(q.size) + " bytes, needs " +
                 std::to_string(((rows - 1) * s.q_stride + q_dim) * 4));
  if (out.size < ((rows - 1) * s.out_stride + q_dim) * 4)
    fail(fn, "out buffer holds " + std::to_string(out.size) + " bytes, needs " +
                 std::to_string(((rows - 1) * s.out_stride + q_dim) * 4));
  if (s.sinks && s.sinks->size < uint64_t(s.n_heads) * 4)
    fail(fn, "sinks buffer holds " + std::to_string(s.sinks->size) + " bytes, needs n_heads * 4 = " +
                 std::to_string(uint64_t(s.n_heads) * 4));
  (void)ctx;
  return s;
}

bool tiled_possible(const gpu::Context& ctx, const AttentionShape& s) {
  return ctx.features().subgroups && s.head_dim % 4 == 0 && s.q_stride % 4 == 0 && s.out_stride % 4 == 0;
}

// Why tile t cannot run heads of head_dim on ctx; "" when it can.
std::string f16_tile_problem(const gpu::Context& ctx, const AttentionF16Tiles& t, uint32_t head_dim) {
  const std::string name = std::to_string(t.bq) + "x" + std::to_string(t.bk) + "x" + std::to_string(t.cg);
  if (t.cg == 0 || head_dim % (8 * t.cg) != 0)
    return "f16 tile " + name + ": head_dim " + std::to_string(head_dim) + " is not a multiple of 8 * cg";
  if (t.bq == 0 || t.bq % kF16Rows != 0) return "f16 tile " + name + ": bq must be a positive multiple of 4";
  if (t.bk == 0 || t.bk % t.cg != 0 || 128 % t.bk != 0)
    return "f16 tile " + name + ": bk must be a multiple of cg that divides 128";
  const uint64_t threads = uint64_t(t.bq / kF16Rows) * t.cg;
  if (threads > ctx.limits().maxComputeInvocationsPerWorkgroup)
    return "f16 tile " + name + " needs " + std::to_string(threads) + " threads per workgroup; the adapter allows " +
           std::to_string(ctx.limits().maxComputeInvocationsPerWorkgroup);
  const uint64_t bytes = attention_f16_storage(t, head_dim);
  if (bytes > ctx.limits().maxComputeWorkgroupStorageSize)
    return "f16 tile " + name + " needs " + std::to_string(bytes) + " bytes of workgroup memory at head_dim " +
           std::to_string(head_dim) + "; the adapter allows " +
           std::to_string(ctx.limits().maxComputeWorkgroupStorageSize);
  return {};
}

// Auto picks the f16 kernel for this call (on a GPU): it runs with its default tile, and head_dim is 64 or 128,
// where that tile gives each thread one 8-dim output chunk (32 f32 outputs). Larger heads need two or more chunks per
// thread and, within 48 KiB, one key per thread (256: 32x16x16): unmeasured, they keep the f32 kernel unless forced.
bool f16_default(const gpu::Context& ctx, const AttentionShape& s, KvType kv_type) {
  return ctx.features().shader_f16 && ctx.features().subgroups && kv_type == KvType::F16 && s.q_stride % 4 == 0 &&
         s.out_stride % 4 == 0 && s.head_dim <= 128 && attention_f16_tiles(ctx, s.head_dim).has_value();
}

// A contiguous range of rows bound with an offset aligned to the adapter's requirement.
struct RowWindow {
  uint64_t offset_bytes, size_bytes;
  uint32_t first_float;  // floats from the binding start to the first row
};
RowWindow row_window(const gpu::Context& ctx, uint64_t first_row, uint64_t n_rows, uint32_t stride,
                     uint32_t row_floats) {
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t begin = first_row * stride * 4;
  const uint64_t offset = begin / align * align;
  const uint64_t end = ((first_row + n_rows - 1) * stride + row_floats) * 4;
  return {offset, end - offset, uint32_t((begin - offset) / 4)};
}

// Rows per dispatch so q and out bindings stay within the storage-binding limit.
uint32_t max_rows_per_binding(const gpu::Context& ctx, const AttentionShape& s) {
  const uint64_t room = ctx.max_binding_size() - ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t stride_bytes = uint64_t(std::max(s.q_stride, s.out_stride)) * 4;
  const uint64_t rows = room / stride_bytes;
  if (rows == 0) throw InvalidArgument("attention: one q/out row exceeds the storage-binding limit");
  return uint32_t(std::min<uint64_t>(rows, UINT32_MAX));
}

AttentionParams base_params(const AttentionShape& s, const KvCache& kv) {
  AttentionParams p{};
  p.n_heads = s.n_heads;
  p.n_kv_heads = s.n_kv_heads;
  p.head_dim = s.head_dim;
  p.kv_dim = kv.config().kv_dim;
  p.max_seq = kv.config().max_seq;
  p.start_pos = s.start_pos;
  p.q_stride = s.q_stride;
  p.out_stride = s.out_stride;
  p.page_size = kv.page_size();
  p.pages_per_pool = kv.pages_per_pool();
  p.n_pages = kv.n_pages();
  p.n_pools = kv.n_pools();
  p.scale = s.scale;
  p.n_splits = 1;
  p.split_len = kv.config().max_seq;
  p.grid_x = 1;
  p.window = s.window;
  p.sinks = s.sinks ? 1 : 0;
  return p;
}

// Parameters of the dispatch covering queries [first, first + count) of the call.
AttentionParams chunk_params(const AttentionShape& s, const KvCache& kv, uint32_t first, uint32_t count,
                             const RowWindow& qw, const RowWindow& ow) {
  AttentionParams p = base_params(s, kv);
  p.q_base = s.q_base + first;
  p.n_queries = count;
  p.q_offset = qw.first_float;
  p.out_offset = ow.first_float;
  return p;
}

// Binding 10 of every attention kernel: the per-head sinks, or a placeholder the kernels never read (p.sinks = 0).
gpu::BufferBinding sinks_binding(gpu::Context& ctx, const AttentionShape& s) {
  return s.sinks ? gpu::BufferBinding{10, s.sinks, 0, uint64_t(s.n_heads) * 4}
                 : gpu::BufferBinding{10, &ctx.placeholder_storage(), 0, 16};
}

// Bindings 0..7 of the attention kernels (params, q, out, page table, the 4 KV pools) and 10 (sinks); decode adds
// 8 (partials) and, per-query, 9.
std::vector<gpu::BufferBinding> kernel_bindings(gpu::Context& ctx, const AttentionShape& s,
                                                const gpu::BufferBinding& params, const gpu::Buffer& q,
                                                const RowWindow& qw, const gpu::Buffer& out, const RowWindow& ow,
                                                const KvCache& kv) {
  return {params,
          gpu::BufferBinding{1, &q, qw.offset_bytes, qw.size_bytes},
          gpu::BufferBinding{2, &out, ow.offset_bytes, ow.size_bytes},
          gpu::BufferBinding{3, &kv.page_table()},
          gpu::BufferBinding{4, &kv.pool(0)},
          gpu::BufferBinding{5, &kv.pool(1)},
          gpu::BufferBinding{6, &kv.pool(2)},
          gpu::BufferBinding{7, &kv.pool(3)},
          sinks_binding(ctx, s)};
}

// Calls fn(first, count) over [0, n) in pieces of at most `step`.
template <typename Fn>
void in_chunks(uint32_t n, uint32_t step, Fn fn) {
  for (uint32_t first = 0; first < n; first += step) fn(first, std::min(step, n - first));
}

}  // namespace

AttentionTiles attention_tiles(uint32_t head_dim, const WGPULimits& limits) {
  AttentionTiles t{};
  const uint32_t hd4 = head_dim / 4;
  // Threads per row: the fewest (power of two, <= 8) that keep each thread at <= 4 vec4 columns.
  t.tpr = 1;
  while (t.tpr < 8 && hd4 % (t.tpr * 2) == 0 && hd4 / t.tpr > 4) t.tpr *= 2;
  t.dv = hd4 / t.tpr;
  // Two rows per thread group when the columns are few enough to keep 2 rows of q and o in
  // registers; 16-key tiles then (the scores of both rows stay in registers too). Measured on the
  // H200 (PERF.md): head_dim 128 64x16x8x2 16.7 TFLOP/s vs 12.0 for the one-row 64x32x4 tiles.
  t.rpt = t.dv <= 4 ? 2 : 1;
  t.bq = 64;
  while (t.bq / t.rpt * t.tpr > limits.maxComputeInvocationsPerWorkgroup && t.bq > t.rpt) t.bq /= 2;
  t.wg = t.bq / t.rpt * t.tpr;
  // K and V tiles in f32: 2 * bk * head_dim * 4 bytes within a 32 KiB budget (or the limit).
  // More keys per tile spill the score registers (64 keys: 3x slower at head_dim 64).
  const uint32_t budget = std::min<uint32_t>(limits.maxComputeWorkgroupStorageSize, 32768);
  t.bk = t.rpt > 1 ? 16 : 32;
  while (t.bk > 4 && 8ull * t.bk * head_dim > budget) t.bk /= 2;
  while (t.dec_tpk < 4 && hd4 / (2 * t.dec_tpk) >= 16 &&
         2 * t.dec_tpk * kDecodeWorkgroup <= limits.maxComputeInvocationsPerWorkgroup)
    t.dec_tpk *= 2;
  return t;
}

uint64_t attention_prefill_workgroups(const AttentionShape& s, uint32_t bq, uint32_t n_queries) {
  const uint32_t group = s.n_heads / s.n_kv_heads;
  const uint32_t hpw = std::min(group, bq);  // heads per workgroup; bq / hpw queries
  const uint64_t q_blocks = (uint64_t(n_queries) + bq / hpw - 1) / (bq / hpw);
  return q_blocks * ((group + hpw - 1) / hpw) * s.n_kv_heads;
}

uint64_t attention_fill_workgroups(const AttentionShape& s) {
  uint64_t keys = uint64_t(s.start_pos) + (uint64_t(s.n_queries) + 1) / 2;  // a query's keys, on average
  if (s.window) keys = std::min<uint64_t>(keys, s.window);
  return keys > kAttentionLongKeys ? kAttentionFillWorkgroups / 2 : kAttentionFillWorkgroups;
}

AttentionTiles attention_fill_tiles(AttentionTiles t, const AttentionShape& s) {
  const uint64_t want = attention_fill_workgroups(s);
  while (attention_prefill_workgroups(s, t.bq, s.n_queries) < want && t.bq / 2 >= std::max(kAttentionMinRows, t.rpt)) {
    t.bq /= 2;
    t.wg = t.bq / t.rpt * t.tpr;
  }
  return t;
}

AttentionTiles attention_prefill_tiles(const gpu::Context& ctx, const AttentionShape& s) {
  const AttentionTiles t = attention_tiles(s.head_dim, ctx.limits());
  return ctx.adapter().is_cpu() ? t : attention_fill_tiles(t, s);  // a few cores: the fewest, largest workgroups
}

uint64_t attention_f16_storage(const AttentionF16Tiles& t, uint32_t head_dim) {
  const uint64_t hd8 = head_dim / 8;
  return uint64_t(t.bq) * (hd8 + 1) * 16 +         // Q, rows padded by one 16-byte chunk
         uint64_t(t.bk) * (hd8 + 1) * 16 +         // K, likewise
         uint64_t(t.bk) * hd8 * 16 +               // V
         uint64_t(t.bk) * (t.bq / kF16Rows) * 8 +  // P: 4 rows of f16 per key and row group
         uint64_t(t.bq / kF16Rows) * t.cg * 16;    // row maxima / sums exchanged (without subgroup shuffles)
}

std::string attention_f16_prelude(const gpu::Context& ctx, const AttentionF16Tiles& t, uint32_t head_dim) {
  (void)ctx;
  return f16_prelude(t, head_dim);
}

std::optional<AttentionF16Tiles> attention_f16_tiles(const gpu::Context& ctx, uint32_t head_dim) {
  if (head_dim == 0 || head_dim % 64 != 0) return std::nullopt;
  const uint32_t cg = (head_dim / 8) % 16 == 0 ? 16 : 8;
  // 64 rows reuse each K/V tile most; 32 keys give each thread 2 (cg 16) or 4 (cg 8) keys of the score tile.
  for (const auto& [bq, bk] : {std::pair{64u, 32u}, {32u, 32u}, {64u, 16u}, {32u, 16u}}) {
    const AttentionF16Tiles t{bq, bk, cg};
    if (f16_tile_problem(ctx, t, head_dim).empty()) return t;
  }
  return std::nullopt;
}

AttentionVariant parse_attention_variant(const std::string& text) {
  AttentionVariant v;
  if (text.empty()) return v;
  if (text == "f32") {
    v.impl = AttentionImpl::Tiled;
    return v;
  }
  v.impl = AttentionImpl::TiledF16;
  if (text == "f16") return v;
  const std::string expected =
      "attention variant '" + text + "': expected f32, f16 or BQxBKxCGxf16 (e.g. 64x32x16xf16)";
  if (text.size() < 5 || text.compare(text.size() - 4, 4, "xf16") != 0) throw InvalidArgument(expected);
  uint32_t n[3];
  size_t pos = 0;
  const std::string dims = text.substr(0, text.size() - 4);
  for (int i = 0; i < 3; ++i) {
    const size_t x = i < 2 ? dims.find('x', pos) : dims.size();
    if (x == std::string::npos) throw InvalidArgument(expected);
    const std::string part = dims.substr(pos, x - pos);
    if (part.empty() || part.size() > 4 || part.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgument(expected);
    n[i] = uint32_t(std::stoul(part));
    pos = x + 1;
  }
  v.f16_tiles = AttentionF16Tiles{n[0], n[1], n[2]};
  return v;
}

AttentionImpl resolve_attention_prefill(const gpu::Context& ctx, const AttentionShape& s, KvType kv_type,
                                        AttentionImpl impl) {
  if (impl != AttentionImpl::Auto) return impl;
  impl = parse_attention_variant(ctx.options().attention_prefill).impl;
  if (impl == AttentionImpl::TiledF16) return impl;
  // GPUs: the f16 kernel where it runs. CPU adapters keep f32 arithmetic: x86 has no f16 arithmetic, and lavapipe
  // (2 cores, `wgllm-bench kernels --attention f32,f16`) measured the f16 kernel 1.1x the f32 one at
  // (32,8,64,512,0) but 0.7x at (32,8,128,512,0).
  if (impl == AttentionImpl::Auto && !ctx.adapter().is_cpu() && f16_default(ctx, s, kv_type))
    return AttentionImpl::TiledF16;
  return tiled_possible(ctx, s) ? AttentionImpl::Tiled : AttentionImpl::Baseline;
}

void check_attention_variant(const gpu::Context& ctx, uint32_t head_dim) {
  const AttentionVariant v = parse_attention_variant(ctx.options().attention_prefill);
  if (v.impl != AttentionImpl::TiledF16) return;
  const std::string name = "attention variant '" + ctx.options().attention_prefill + "'";
  if (!ctx.features().shader_f16 || !ctx.features().subgroups)
    throw InvalidArgument(name + " needs the adapter's shader-f16 and subgroups features");
  if (v.f16_tiles) {
    if (std::string problem = f16_tile_problem(ctx, *v.f16_tiles, head_dim); !problem.empty())
      throw InvalidArgument(name + ": " + problem);
  } else if (!attention_f16_tiles(ctx, head_dim)) {
    throw InvalidArgument(name + ": the f16 kernel has no tile for head_dim " + std::to_string(head_dim) +
                          " on this adapter (head_dim must be a multiple of 64; the tile must fit the workgroup "
                          "memory)");
  }
}

KvView kv_view(const gpu::Context& ctx, KvType type) {
  if (type == KvType::F32) return KvView::F32;
  return ctx.features().shader_f16 ? KvView::F16 : KvView::PackedF16;
}

double attention_flops(const AttentionShape& s) {
  double windows = 0;
  for (uint32_t i = 0; i < s.n_queries; ++i) {
    const uint32_t pos = s.start_pos + s.q_base + i;
    windows += double(pos) + 1 - attention_first_key(pos, s.window);
  }
  return 4.0 * s.n_heads * s.head_dim * windows;
}

void encode_attention_prefill(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape_in,
                              const gpu::Buffer& q, const KvCache& kv, const gpu::Buffer& out, AttentionImpl impl,
                              const AttentionTiles* tiles_override, const AttentionF16Tiles* f16_override) {
  const char* fn = "encode_attention_prefill";
  const AttentionShape s = validate(fn, ctx, shape_in, q, kv, out);
  impl = resolve_attention_prefill(ctx, s, kv.config().type, impl);
  if (impl == AttentionImpl::Tiled && !tiled_possible(ctx, s))
    fail(fn, "the tiled kernel needs subgroups and head_dim / strides that are multiples of 4");
  const KvView view = kv_view(ctx, kv.config().type);
  const uint32_t q_dim = s.n_heads * s.head_dim;
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;

  WGPUComputePipeline pipe;
  uint32_t bq = 0, bk = 0;  // the tiled kernels' rows per workgroup and keys per tile
  if (impl == AttentionImpl::TiledF16) {
    if (!ctx.features().shader_f16 || !ctx.features().subgroups)
      fail(fn, "the f16 kernel needs the adapter's shader-f16 and subgroups features");
    if (kv.config().type != KvType::F16) fail(fn, "the f16 kernel needs an f16 KV cache");
    if (s.q_stride % 4 != 0 || s.out_stride % 4 != 0) fail(fn, "the f16 kernel needs strides that are multiples of 4");
    std::optional<AttentionF16Tiles> t;
    if (f16_override)
      t = *f16_override;
    else
      t = parse_attention_variant(ctx.options().attention_prefill).f16_tiles;
    if (!t) t = attention_f16_tiles(ctx, s.head_dim);
    if (!t)
      fail(fn, "the f16 kernel has no tile for head_dim " + std::to_string(s.head_dim) +
                   " on this adapter (a multiple of 64 whose tile fits the workgroup memory)");
    if (std::string problem = f16_tile_problem(ctx, *t, s.head_dim); !problem.empty()) fail(fn, problem);
    bq = t->bq;
    bk = t->bk;
    pipe = ctx.pipeline({kAttentionF16Shader, "attention_prefill_f16", {}, attention_f16_prelude(ctx, *t, s.head_dim)});
  } else if (impl == AttentionImpl::Tiled) {
    AttentionTiles tiles = attention_prefill_tiles(ctx, s);
    if (tiles_override) {
      const AttentionTiles& t = *tiles_override;
      if (t.tpr == 0 || t.dv == 0 || t.rpt == 0 || t.bq % t.rpt != 0 || 4 * t.dv * t.tpr != s.head_dim ||
          t.wg != t.bq / t.rpt * t.tpr || t.bk == 0 || t.wg > ctx.limits().maxComputeInvocationsPerWorkgroup ||
          8ull * t.bk * s.head_dim > ctx.limits().maxComputeWorkgroupStorageSize || 128 % t.bk != 0)
        fail(fn, "tile override does not fit head_dim " + std::to_string(s.head_dim) + " or the adapter's limits");
      tiles = t;
    }
    bq = tiles.bq;
    bk = tiles.bk;
    pipe = ctx.pipeline({kAttentionShader, "attention_prefill", {}, kv_prelude_vec4(view) + tile_prelude(tiles)});
  } else {
    pipe = ctx.pipeline({kAttentionBaselineShader, "attention_prefill_baseline", {}, kv_prelude_scalar(view)});
  }
  if (bk && kv.n_pages() > 1 && kv.page_size() % bk != 0)
    fail(fn, "KV page_size " + std::to_string(kv.page_size()) + " must be a multiple of the key tile " +
                 std::to_string(bk));
  uint32_t step = max_rows_per_binding(ctx, s);
  if (impl == AttentionImpl::Baseline) step = std::min(step, max_grid);  // grid y = queries

  in_chunks(s.n_queries, step, [&](uint32_t first, uint32_t count) {
    const RowWindow qw = row_window(ctx, uint64_t(s.row) + s.q_base + first, count, s.q_stride, q_dim);
    const RowWindow ow = row_window(ctx, uint64_t(s.row) + s.q_base + first, count, s.out_stride, q_dim);
    AttentionParams p = chunk_params(s, kv, first, count, qw, ow);
    uint32_t gx, gy;
    if (bq) {  // the tiled kernels: a workgroup per bq rows of one kv head
      const auto grid = gpu::fold_grid(attention_prefill_workgroups(s, bq, count), max_grid);
      gx = grid.x;
      gy = grid.y;
    } else {
      if (s.n_heads > max_grid) fail(fn, "n_heads exceeds maxComputeWorkgroupsPerDimension");
      gx = s.n_heads;
      gy = count;
    }
    p.grid_x = gx;
    const auto bindings = kernel_bindings(ctx, s, batch.uniform(0, p), q, qw, out, ow, kv);
    batch.dispatch(pipe, bindings, gx, gy);
  });
}

namespace {
// Keys the decode kernel walks for queries [first, first + count) of the call: from the first query's first key,
// rounded down to a 128-key tile (tiles never straddle a page), to the last query's position.
uint64_t decode_span(const AttentionShape& s, const KvCache& kv, uint32_t first, uint32_t count) {
  const uint64_t end = std::min<uint64_t>(uint64_t(s.start_pos) + s.q_base + first + count, kv.config().max_seq);
  const uint64_t lo =
      attention_first_key(s.start_pos + s.q_base + first, s.window) / kDecodeWorkgroup * kDecodeWorkgroup;
  return end > lo ? end - lo : 0;
}
}  // namespace

uint32_t attention_decode_depth(const AttentionShape& s) {
  const uint32_t last = s.start_pos + s.q_base + (s.n_queries ? s.n_queries - 1 : 0);
  return last - attention_first_key(last, s.window);
}

uint32_t decode_gqa_from(const gpu::Context& ctx) {
  using O = gpu::ContextOptions;
  return ctx.options().decode_gqa_from.value_or(ctx.adapter().is_cpu() ? O::kCpuDecodeGqaFrom
                                                                       : O::kDefaultDecodeGqaFrom);
}

DecodeKernel resolve_decode_kernel(const gpu::Context& ctx, const AttentionShape& s, DecodeKernel kernel) {
  if (kernel != DecodeKernel::Auto) return kernel;
  return attention_decode_depth(s) >= decode_gqa_from(ctx) ? DecodeKernel::Grouped : DecodeKernel::PerHead;
}

namespace {
constexpr uint32_t kMaxDecodeGroup = 8;  // heads per Grouped workgroup: registers hold GQ outputs per thread

// The largest divisor of the GQA group n_heads / n_kv_heads that is <= kMaxDecodeGroup.
uint32_t group_divisor(const AttentionShape& s) {
  const uint32_t group = s.n_kv_heads ? s.n_heads / s.n_kv_heads : 1;
  uint32_t g = std::min(std::max(group, 1u), kMaxDecodeGroup);
  while (group % g != 0) --g;
  return g;
}

// Workgroup memory of attention_decode_gqa serving g heads: gq, gprob, gmax + gsum, gacc.
uint64_t decode_gqa_storage(uint32_t g, uint32_t head_dim) {
  return uint64_t(g) * (head_dim / 4) * 16 + uint64_t(g) * kDecodeWorkgroup * 4 +
         2ull * g * (kDecodeWorkgroup / 4) * 4 + uint64_t(kDecodeWorkgroup) * 16;
}
}  // namespace

uint32_t attention_decode_group(const gpu::Context& ctx, const AttentionShape& s) {
  const uint32_t group = s.n_kv_heads ? s.n_heads / s.n_kv_heads : 1;
  for (uint32_t g = group_divisor(s); g > 1; --g)
    if (group % g == 0 && decode_gqa_storage(g, s.head_dim) <= ctx.limits().maxComputeWorkgroupStorageSize) return g;
  return 1;
}

uint32_t attention_decode_splits(const AttentionShape& s, const KvCache& kv, DecodeKernel kernel) {
  const uint64_t window = decode_span(s, kv, 0, s.n_queries);
  const bool grouped = kernel == DecodeKernel::Grouped;
  const uint64_t rows = uint64_t(s.n_heads / (grouped ? group_divisor(s) : 1)) * s.n_queries;
  // Enough workgroups to fill a large GPU (~2048), but no split shorter than two 128-key tiles (one for Grouped,
  // whose workgroups each do several heads' work).
  const uint64_t key_len = grouped ? kDecodeWorkgroup : 2 * kDecodeWorkgroup;
  const uint64_t by_length = (window + key_len - 1) / key_len;
  const uint64_t by_occupancy = std::max<uint64_t>(1, 2048 / std::max<uint64_t>(rows, 1));
  return uint32_t(std::clamp<uint64_t>(std::min(by_length, by_occupancy), 1, 256));
}

uint64_t attention_decode_scratch_bound(const AttentionShape& s, const KvCache& kv) {
  uint64_t bytes = 0;
  for (DecodeKernel k : {DecodeKernel::PerHead, DecodeKernel::Grouped}) {
    const uint32_t splits = attention_decode_splits(s, kv, k);
    if (splits > 1) bytes = std::max(bytes, attention_decode_scratch_bytes(s, splits));
  }
  return bytes;
}

uint64_t attention_decode_scratch_bytes(const AttentionShape& s, uint32_t n_splits) {
  return uint64_t(s.n_queries) * s.n_heads * n_splits * (s.head_dim / 4 + 1) * 16;
}

namespace {

// The FreshParams of attention_decode_fresh.wgsl.
struct FreshParams {
  uint32_t rope_dim, neox, norm, v_norm;
  float eps;
  uint32_t kv_base, append, pad;
};
static_assert(sizeof(FreshParams) == 32);

// Workgroup memory of attention_decode_fresh: attention_decode's (dq, dprob, dred, dacc) and qk_norm_rope.wgsl's
// three head slots and its tree.
uint64_t decode_fresh_storage(const AttentionTiles& t, uint32_t head_dim) {
  const uint64_t threads = 128ull * t.dec_tpk;
  return head_dim * 4ull + 128 * 4 + threads + threads * 16 + 3ull * head_dim * 4 + 128 * 16;
}

// The fresh kernel's own limits, whatever the query count: subgroups and strides (unset: n_heads * head_dim), head_dim,
// the new K and V rows waiting in dacc (128 * DEC_TPK vec4), its workgroup memory.
bool fresh_fits(const gpu::Context& ctx, AttentionShape s) {
  const uint32_t q_dim = s.n_heads * s.head_dim;
  if (s.q_stride == 0) s.q_stride = q_dim;
  if (s.out_stride == 0) s.out_stride = q_dim;
  if (!tiled_possible(ctx, s) || s.head_dim > kMaxHeadDim) return false;
  const AttentionTiles t = attention_tiles(s.head_dim, ctx.limits());
  return s.head_dim / 2 <= 128 * t.dec_tpk &&
         decode_fresh_storage(t, s.head_dim) <= ctx.limits().maxComputeWorkgroupStorageSize;
}

// attention_decode_fresh.wgsl's own bindings: the tokens' k and v rows (rows [0, kv_rows) of fresh's, the first at
// row kv_base / kv_dim), the norms, the RoPE table (qk_norm_rope.wgsl's bindings 13-15) and FreshParams.
void push_fresh_bindings(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& s, const FreshToken& fresh,
                         uint32_t kv_base, uint32_t kv_rows, std::vector<gpu::BufferBinding>& bindings) {
  const uint32_t kv_dim = s.n_kv_heads * s.head_dim, rope_dim = fresh.rope_dim ? fresh.rope_dim : s.head_dim;
  const uint64_t kv_bytes = uint64_t(kv_rows) * kv_dim * 4, norm_bytes = fresh.q_norm ? s.head_dim * 4ull : 16;
  const FreshParams fp{.rope_dim = rope_dim,
                       .neox = fresh.type == RopeType::Neox ? 1u : 0u,
                       .norm = fresh.q_norm ? 1u : 0u,
                       .v_norm = fresh.v_norm ? 1u : 0u,
                       .eps = fresh.eps,
                       .kv_base = kv_base,
                       .append = fresh.append ? 1u : 0u,
                       .pad = 0};
  const gpu::Buffer& none = ctx.placeholder_storage();
  const gpu::Buffer* q_norm = fresh.q_norm ? fresh.q_norm : &none;
  if (fresh.append) {
    bindings.push_back({11, fresh.k, 0, kv_bytes});
    bindings.push_back({12, fresh.v, 0, kv_bytes});
  } else {
    bindings.push_back({11, &none, 0, 16});
    bindings.push_back({12, &none, 0, 16});
  }
  bindings.push_back({13, fresh.table, 0, uint64_t(rope_dim / 2) * 16});
  bindings.push_back({14, q_norm, 0, norm_bytes});
  bindings.push_back({15, fresh.append && fresh.k_norm ? fresh.k_norm : q_norm, 0, norm_bytes});
  bindings.push_back(batch.uniform(16, fp));
}

// encode_attention_decode, and with `fresh` (one query, PerHead) encode_attention_decode_fresh.
void encode_decode(const char* fn, gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape_in,
                   const gpu::Buffer& q, const KvCache& kv, const gpu::Buffer& out, const gpu::Buffer* scratch,
                   uint32_t n_splits, DecodeKernel kernel, const FreshToken* fresh) {
  const AttentionShape s = validate(fn, ctx, shape_in, q, kv, out);
  if (kernel == DecodeKernel::Grouped && !tiled_possible(ctx, s))
    fail(fn, "the grouped decode kernel needs subgroups and head_dim / strides that are multiples of 4");
  if (!tiled_possible(ctx, s)) {
    // No subgroups (or head_dim not a multiple of 4): the baseline kernel serves decode too.
    encode_attention_prefill(batch, ctx, s, q, kv, out, AttentionImpl::Baseline);
    return;
  }
  const bool grouped = resolve_decode_kernel(ctx, s, kernel) == DecodeKernel::Grouped;
  if (n_splits == 0) n_splits = attention_decode_splits(s, kv, grouped ? DecodeKernel::Grouped : DecodeKernel::PerHead);
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  if (n_splits > max_grid) fail(fn, "n_splits exceeds maxComputeWorkgroupsPerDimension");
  if (s.n_heads > max_grid) fail(fn, "n_heads exceeds maxComputeWorkgroupsPerDimension");
  if (n_splits > 1) {
    if (!scratch) fail(fn, "split-K decode needs a scratch buffer (attention_decode_scratch_bytes)");
    if (scratch->size < attention_decode_scratch_bytes(s, n_splits))
      fail(fn, "scratch holds " + std::to_string(scratch->size) + " bytes, needs " +
                   std::to_string(attention_decode_scratch_bytes(s, n_splits)));
    if (attention_decode_scratch_bytes(s, n_splits) > ctx.max_binding_size())
      fail(fn, "split-K scratch exceeds the storage-binding limit: use fewer splits");
  }
  const KvView view = kv_view(ctx, kv.config().type);
  const AttentionTiles tiles = attention_tiles(s.head_dim, ctx.limits());
  // Grouped: a workgroup per `group` query heads of one kv head (attention_decode_gqa.wgsl)
  const uint32_t group = grouped ? attention_decode_group(ctx, s) : 1;
  WGPUComputePipeline decode = fresh     ? decode_pipeline(ctx, "attention_decode_fresh", view, tiles)
                               : grouped ? decode_pipeline(ctx, "attention_decode_gqa", view, tiles, group)
                                         : decode_pipeline(ctx, "attention_decode", view, tiles);
  WGPUComputePipeline reduce = decode_pipeline(ctx, "attention_decode_reduce", view, tiles);
  const uint32_t q_dim = s.n_heads * s.head_dim;
  // Without a split the partials binding is unused; a small placeholder keeps it valid.
  const gpu::Buffer& partials = n_splits > 1 ? *scratch : ctx.placeholder_writable();

  uint32_t step = std::min(max_rows_per_binding(ctx, s), max_grid);
  in_chunks(s.n_queries, step, [&](uint32_t first, uint32_t count) {
    const RowWindow qw = row_window(ctx, uint64_t(s.row) + s.q_base + first, count, s.q_stride, q_dim);
    const RowWindow ow = row_window(ctx, uint64_t(s.row) + s.q_base + first, count, s.out_stride, q_dim);
    AttentionParams p = chunk_params(s, kv, first, count, qw, ow);
    p.n_splits = n_splits;
    const uint64_t window = decode_span(s, kv, first, count);
    const uint64_t split_len = (window + n_splits - 1) / n_splits;
    p.split_len = uint32_t((split_len + kDecodeWorkgroup - 1) / kDecodeWorkgroup * kDecodeWorkgroup);
    const gpu::BufferBinding params = batch.uniform(0, p);
    auto bindings = kernel_bindings(ctx, s, params, q, qw, out, ow, kv);
    bindings.push_back({8, &partials});
    if (fresh) push_fresh_bindings(batch, ctx, s, *fresh, s.row * s.n_kv_heads * s.head_dim, s.row + 1, bindings);
    if (!grouped)
      bindings.push_back({9, &ctx.placeholder_storage(), 0, 16});  // the grouped kernel reads no per-query table
    batch.dispatch(decode, bindings, n_splits, s.n_heads / group, count);
    if (n_splits > 1) {
      const gpu::BufferBinding reduce_bindings[] = {
          params, {2, &out, ow.offset_bytes, ow.size_bytes}, {8, &partials}, sinks_binding(ctx, s)};
      batch.dispatch(reduce, reduce_bindings, s.n_heads, count);
    }
  });
}

}  // namespace

void encode_attention_decode(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                             const gpu::Buffer& q, const KvCache& kv, const gpu::Buffer& out,
                             const gpu::Buffer* scratch, uint32_t n_splits, DecodeKernel kernel) {
  encode_decode("encode_attention_decode", batch, ctx, shape, q, kv, out, scratch, n_splits, kernel, nullptr);
}

bool attention_decode_takes_fresh(const gpu::Context& ctx, const AttentionShape& shape) {
  if (shape.n_queries != 1 || !fresh_fits(ctx, shape)) return false;
  return resolve_decode_kernel(ctx, shape, DecodeKernel::Auto) == DecodeKernel::PerHead;
}

namespace {

// The checks of `fresh` for a call whose tokens' k and v are rows [0, kv_rows) of fresh.k and fresh.v.
void check_fresh(const char* fn, gpu::Context& ctx, const AttentionShape& shape, const gpu::Buffer& q,
                 const FreshToken& fresh, uint64_t kv_rows) {
  if (!fresh.table) fail(fn, "fresh.table is required");
  if (fresh.append) {
    if (!fresh.k || !fresh.v) fail(fn, "fresh.k and fresh.v are required to append");
    if ((fresh.q_norm == nullptr) != (fresh.k_norm == nullptr)) fail(fn, "fresh.q_norm and fresh.k_norm go together");
    if (fresh.k->get() == q.get() || fresh.v->get() == q.get()) fail(fn, "q must be another buffer than k and v");
  }
  if (!(fresh.eps > 0)) fail(fn, "eps must be > 0");
  const uint32_t rope_dim = fresh.rope_dim ? fresh.rope_dim : shape.head_dim;
  if (rope_dim % 2 || rope_dim > shape.head_dim)
    fail(fn,
         "rope_dim " + std::to_string(rope_dim) + " must be even and <= head_dim " + std::to_string(shape.head_dim));
  const uint64_t kv_bytes = kv_rows * shape.n_kv_heads * shape.head_dim * 4;
  if (kv_bytes / 4 > UINT32_MAX) fail(fn, "rows exceed 32-bit element offsets");
  if (fresh.append) {
    detail::need(fn, "k", *fresh.k, kv_bytes, ctx);
    detail::need(fn, "v", *fresh.v, kv_bytes, ctx);
    if (fresh.k_norm) detail::need(fn, "k_norm", *fresh.k_norm, uint64_t(shape.head_dim) * 4, ctx);
  }
  detail::need(fn, "table", *fresh.table, uint64_t(rope_dim / 2) * 16, ctx);
  if (fresh.q_norm) detail::need(fn, "q_norm", *fresh.q_norm, uint64_t(shape.head_dim) * 4, ctx);
}

}  // namespace

void encode_attention_decode_fresh(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                   const gpu::Buffer& q, const FreshToken& fresh, KvCache& kv, const gpu::Buffer& out,
                                   const gpu::Buffer* scratch) {
  const char* fn = "encode_attention_decode_fresh";
  if (!attention_decode_takes_fresh(ctx, shape))
    fail(fn, "needs one query, the per-head decode kernel at this depth, subgroups and head_dim % 4 == 0");
  check_fresh(fn, ctx, shape, q, fresh, uint64_t(shape.row) + 1);
  encode_decode(fn, batch, ctx, shape, q, kv, out, scratch, 0, DecodeKernel::PerHead, &fresh);
}

namespace {
// The split-K of encode_attention_decode_rows: splits of 256 keys from key 0 (1024 splits at most; past 262,144 keys
// longer ones), whatever the other sequences' lengths: a sequence's keys fall into the same splits alone or beside
// longer ones (whose extra splits are empty for it and add exact zeros), so its output is the same bits.
struct RowSplits {
  uint32_t n_splits, split_len;
};
RowSplits row_splits(uint32_t max_position) {
  constexpr uint64_t kLen = 256, kMaxSplits = 1024;
  const uint64_t keys = uint64_t(max_position) + 1;
  if (keys <= kLen * kMaxSplits) return {uint32_t((keys + kLen - 1) / kLen), uint32_t(kLen)};
  const uint64_t len =
      ((keys + kMaxSplits - 1) / kMaxSplits + kDecodeWorkgroup - 1) / kDecodeWorkgroup * kDecodeWorkgroup;
  return {uint32_t((keys + len - 1) / len), uint32_t(len)};
}
}  // namespace

uint64_t attention_decode_rows_scratch_bytes(const AttentionShape& shape, const KvCache& view, uint32_t max_position) {
  (void)view;
  const RowSplits rs = row_splits(max_position);
  return rs.n_splits > 1 ? attention_decode_scratch_bytes(shape, rs.n_splits) : 0;
}

namespace {

// encode_attention_decode_rows, and with `fresh` encode_attention_decode_rows_fresh.
void encode_rows(const char* fn, gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape_in,
                 const gpu::Buffer& q, const KvCache& owner, const KvCache& view, const gpu::Buffer& queries,
                 uint32_t max_position, const gpu::Buffer& out, const gpu::Buffer& scratch, const FreshToken* fresh) {
  AttentionShape s = shape_in;
  s.start_pos = max_position;  // checks the largest position against the views' max_seq
  s.q_base = 0;
  s.row = 0;
  const uint32_t n = s.n_queries;
  s.n_queries = 1;
  s = validate(fn, ctx, s, q, view, out);
  s.n_queries = n;
  if (!view.same_pools(owner)) fail(fn, "the view is not of the owner's pools");
  if (!tiled_possible(ctx, s)) fail(fn, "needs subgroups and head_dim % 4 == 0 (the tiled decode kernel)");
  const uint32_t q_dim = s.n_heads * s.head_dim;
  if (q.size < (uint64_t(n - 1) * s.q_stride + q_dim) * 4) fail(fn, "q holds fewer than n_queries rows");
  if (out.size < (uint64_t(n - 1) * s.out_stride + q_dim) * 4) fail(fn, "out holds fewer than n_queries rows");
  if (queries.size < uint64_t(n) * 8) fail(fn, "queries holds fewer than n_queries (position, page_base) pairs");
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  if (n > max_grid || s.n_heads > max_grid) fail(fn, "n_queries or n_heads exceeds maxComputeWorkgroupsPerDimension");
  const RowSplits rs = row_splits(max_position);
  const uint32_t n_splits = rs.n_splits;
  if (n_splits > max_grid) fail(fn, "n_splits exceeds maxComputeWorkgroupsPerDimension");
  if (n_splits > 1 && scratch.size < attention_decode_scratch_bytes(s, n_splits))
    fail(fn, "scratch holds " + std::to_string(scratch.size) + " bytes, needs " +
                 std::to_string(attention_decode_scratch_bytes(s, n_splits)));
  const KvView kview = kv_view(ctx, view.config().type);
  const AttentionTiles tiles = attention_tiles(s.head_dim, ctx.limits());
  WGPUComputePipeline decode =
      decode_pipeline(ctx, fresh ? "attention_decode_fresh" : "attention_decode", kview, tiles);
  WGPUComputePipeline reduce = decode_pipeline(ctx, "attention_decode_reduce", kview, tiles);
  const RowWindow qw = row_window(ctx, 0, n, s.q_stride, q_dim);
  const RowWindow ow = row_window(ctx, 0, n, s.out_stride, q_dim);
  AttentionParams p = chunk_params(s, view, 0, n, qw, ow);
  p.per_query = 1;
  p.n_splits = n_splits;
  p.split_len = rs.split_len;
  const gpu::Buffer& partials = n_splits > 1 ? scratch : ctx.placeholder_writable();
  const gpu::BufferBinding params = batch.uniform(0, p);
  auto bindings = kernel_bindings(ctx, s, params, q, qw, out, ow, owner);
  bindings.push_back({8, &partials});
  bindings.push_back({9, &queries, 0, uint64_t(n) * 8});
  if (fresh) push_fresh_bindings(batch, ctx, s, *fresh, 0, n, bindings);
  batch.dispatch(decode, bindings, n_splits, s.n_heads, n);
  if (n_splits > 1) {
    const gpu::BufferBinding reduce_bindings[] = {
        params, {2, &out, ow.offset_bytes, ow.size_bytes}, {8, &partials}, sinks_binding(ctx, s)};
    batch.dispatch(reduce, reduce_bindings, s.n_heads, n);
  }
}

}  // namespace

void encode_attention_decode_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                  const gpu::Buffer& q, const KvCache& owner, const KvCache& view,
                                  const gpu::Buffer& queries, uint32_t max_position, const gpu::Buffer& out,
                                  const gpu::Buffer& scratch) {
  encode_rows("encode_attention_decode_rows", batch, ctx, shape, q, owner, view, queries, max_position, out, scratch,
              nullptr);
}

bool attention_decode_rows_take_fresh(const gpu::Context& ctx, const AttentionShape& shape) {
  return fresh_fits(ctx, shape);
}

void encode_attention_decode_rows_fresh(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                        const gpu::Buffer& q, const FreshToken& fresh, const KvCache& owner,
                                        const KvCache& view, const gpu::Buffer& queries, uint32_t max_position,
                                        const gpu::Buffer& out, const gpu::Buffer& scratch) {
  const char* fn = "encode_attention_decode_rows_fresh";
  if (!attention_decode_rows_take_fresh(ctx, shape))
    fail(fn, "needs subgroups, head_dim % 4 == 0 and the workgroup memory of the fresh decode kernel");
  check_fresh(fn, ctx, shape, q, fresh, shape.n_queries);
  encode_rows(fn, batch, ctx, shape, q, owner, view, queries, max_position, out, scratch, &fresh);
}

}  // namespace wgllm::kernels

// Host encoders for the attention kernels (attention.wgsl, attention_f16.wgsl, attention_baseline.wgsl).
// Every contract check happens here, before anything is dispatched; violations throw
// wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"
#include "kernels/rope.h"

namespace wgllm::kernels {

// The widest heads the attention kernels take (Gemma 4's global layers: 512).
constexpr uint32_t kAttentionMaxHeadDim = 512;

// One batch of queries attending over a KvCache.
struct AttentionShape {
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (GQA)
  uint32_t head_dim = 0;    // <= 512; multiple of 4 for the tiled kernels, even for the baseline
  uint32_t n_queries = 0;   // queries in this call
  uint32_t start_pos = 0;   // positions already in the cache before the batch
  uint32_t q_base = 0;      // index of the first query of this call within the batch
  uint32_t q_stride = 0;    // floats between query rows (0 = n_heads * head_dim)
  uint32_t out_stride = 0;  // floats between output rows (0 = n_heads * head_dim)
  float scale = 0;          // 0 = 1 / sqrt(head_dim)
  uint32_t window = 0;      // sliding window: keys a query sees, itself included (0 = all before it)
  uint32_t row = 0;         // q / out rows before the call's row 0, not positions (a decode step of several
                            // sequences: this sequence's row)
  // Attention sinks (gpt-oss): [n_heads] f32 logits, one per query head, each joining its head's softmax as a key
  // without a value (out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^(sink))); none when null.
  const gpu::Buffer* sinks = nullptr;
};
// Query i of the call sits at position P = start_pos + q_base + i, attends keys [0, P] (with a window W > 0:
// keys (P - W, P], as llama.cpp's LLAMA_SWA_TYPE_STANDARD masks key p0 when P - p0 >= W), reads q row
// row + q_base + i and writes out row row + q_base + i.

enum class AttentionImpl {
  Auto,      // the context's attention_prefill option; unset: TiledF16 on GPUs where it runs and head_dim is 64 or
             // 128, else Tiled when possible, else Baseline
  Tiled,     // attention.wgsl: f32 arithmetic; needs subgroups and head_dim % 4 == 0
  TiledF16,  // attention_f16.wgsl: f16 arithmetic, register tiles; needs shader-f16, subgroups, an f16 KV cache
             // and head_dim % 64 == 0 (attention_f16_tiles)
  Baseline,  // attention_baseline.wgsl: the seed's one-workgroup-per-(query, head) design
};

// Mirrors `AttentionParams` in both attention WGSL files.
struct AttentionParams {
  uint32_t n_heads, n_kv_heads, head_dim, kv_dim;
  uint32_t max_seq, start_pos, n_queries, q_base;
  uint32_t q_stride, out_stride, page_size, pages_per_pool;
  uint32_t n_pages, n_pools;
  float scale;
  uint32_t n_splits;
  uint32_t split_len, grid_x;
  uint32_t q_offset, out_offset;  // floats from the start of the q / out binding to this call's row 0
  uint32_t window, per_query = 0, sinks = 0, pad2 = 0;
};
static_assert(sizeof(AttentionParams) == 96 && offsetof(AttentionParams, scale) == 56 &&
              offsetof(AttentionParams, window) == 80);

// The first key a query at position `pos` sees: 0 without a window, else max(0, pos + 1 - window).
constexpr uint32_t attention_first_key(uint32_t pos, uint32_t window) {
  return window == 0 || pos + 1 <= window ? 0 : pos + 1 - window;
}

// Tile sizes for the tiled kernels, derived from head_dim and the adapter's limits.
struct AttentionTiles {
  uint32_t bq;       // rows (query, head) per workgroup
  uint32_t bk;       // keys per K/V tile
  uint32_t tpr;      // threads per row
  uint32_t dv;       // vec4 columns per thread (head_dim = 4 * dv * tpr)
  uint32_t wg;       // threads per workgroup = bq / rpt * tpr
  uint32_t rpt = 1;  // rows per thread group (each K/V value read from workgroup memory feeds rpt rows)
  // The per-head decode kernel's threads per key (DEC_TPK): 1, 2 or 4, at least 16 vec4 columns each, within the
  // adapter's workgroup size (128 keys a tile)
  uint32_t dec_tpk = 1;
};
AttentionTiles attention_tiles(uint32_t head_dim, const WGPULimits& limits);
// Workgroups of one tiled prefill dispatch of n_queries queries in tiles of bq rows (a workgroup takes the rows of
// min(group, bq) heads of one kv head).
uint64_t attention_prefill_workgroups(const AttentionShape& shape, uint32_t bq, uint32_t n_queries);
// The f32 tiled kernel's tile for a prefill call: attention_tiles(), and on GPUs fewer rows per workgroup while the
// call would run fewer workgroups than attention_fill_workgroups() (bq halved, down to kAttentionMinRows). A
// 512-token chunk of 4-8 heads per kv head (Gemma 3 and 4, Qwen 3.5, whose heads of 256 and 512 take this kernel) is
// 32-64 workgroups of 64 rows, a fraction of a large GPU; K and V are read once per workgroup, so fewer rows read them
// more often, which 16 rows still repay and 8 do not, and which a call whose queries see many keys each repays only
// down to half as many workgroups (PERF.md "Prefill attention that fills the GPU").
AttentionTiles attention_prefill_tiles(const gpu::Context& ctx, const AttentionShape& shape);
inline constexpr uint64_t kAttentionFillWorkgroups = 256;
inline constexpr uint32_t kAttentionMinRows = 16;
inline constexpr uint64_t kAttentionLongKeys = 1536;
// The workgroups the rule asks of a call: kAttentionFillWorkgroups, half as many where its queries see more than
// kAttentionLongKeys keys on average (a chunk deep in the prompt).
uint64_t attention_fill_workgroups(const AttentionShape& shape);
// The GPU rule alone: t with bq halved while the call has too few workgroups.
AttentionTiles attention_fill_tiles(AttentionTiles t, const AttentionShape& shape);

// The f16 kernel's tile: a workgroup of bq / 4 * cg threads computes bq rows (query, head) over bk-key tiles; a
// thread owns 4 rows x bk / cg keys of the scores and 4 rows x head_dim / cg dims of the output. head_dim % (8 cg),
// bq % 4 and bk % cg are 0, and bk divides 128.
struct AttentionF16Tiles {
  uint32_t bq = 64, bk = 32, cg = 16;
};
// The default tile for head_dim on the adapter: the first of 64x32, 32x32, 64x16, 32x16 (cg 16, or 8 where
// head_dim / 8 is not a multiple of 16) that fits its workgroup limits; nullopt when none does or head_dim % 64 != 0.
std::optional<AttentionF16Tiles> attention_f16_tiles(const gpu::Context& ctx, uint32_t head_dim);
// Workgroup memory of the f16 kernel with tile t at head_dim.
uint64_t attention_f16_storage(const AttentionF16Tiles& t, uint32_t head_dim);
// The host constants the f16 kernel is compiled with for tile t at head_dim on ctx (tests expand the shader with it).
std::string attention_f16_prelude(const gpu::Context& ctx, const AttentionF16Tiles& t, uint32_t head_dim);

// The prefill kernel a context asks for (ContextOptions::attention_prefill): "" (Auto), "f32" (Tiled), "f16"
// (TiledF16, its default tile) or "BQxBKxCGxf16" (TiledF16 with that tile, e.g. "64x32x16xf16").
struct AttentionVariant {
  AttentionImpl impl = AttentionImpl::Auto;
  std::optional<AttentionF16Tiles> f16_tiles;
};
// InvalidArgument when malformed.
AttentionVariant parse_attention_variant(const std::string& text);
// The kernel encode_attention_prefill runs for `impl` on this call (Auto resolved; Tiled or TiledF16 as given).
AttentionImpl resolve_attention_prefill(const gpu::Context& ctx, const AttentionShape& shape, KvType kv_type,
                                        AttentionImpl impl = AttentionImpl::Auto);
// Throws InvalidArgument when the context's attention_prefill option asks for a kernel that cannot run heads of
// head_dim with an f16 KV cache on this adapter (a forced f16 kernel without shader-f16, a tile that does not fit).
void check_attention_variant(const gpu::Context& ctx, uint32_t head_dim);

// Which KV view the shaders use: f16 arithmetic types, f16 packed in u32, or f32.
enum class KvView { F16, PackedF16, F32 };
KvView kv_view(const gpu::Context& ctx, KvType type);

// Batched causal prefill: out = softmax(q k^T * scale + causal mask) v, per head.
// q, out: [q_base + n_queries][stride] f32. Splits the call across dispatches when q/out
// would exceed the storage-binding limit.
// `tiles` overrides attention_tiles() for the Tiled kernel, `f16_tiles` the f16 kernel's tile (from the context's
// option, else attention_f16_tiles()) (tuning; checked against the limits).
void encode_attention_prefill(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                              const gpu::Buffer& q, const KvCache& kv, const gpu::Buffer& out,
                              AttentionImpl impl = AttentionImpl::Auto, const AttentionTiles* tiles = nullptr,
                              const AttentionF16Tiles* f16_tiles = nullptr);

// The decode kernels. Both need subgroups and head_dim % 4 == 0 (else decode runs the baseline prefill kernel).
enum class DecodeKernel {
  Auto,     // PerHead while the call's depth (attention_decode_depth) is below decode_gqa_from(ctx), Grouped at or
            // above it
  PerHead,  // attention_decode (attention.wgsl): a workgroup per (split, query head, query); splits of >= 256 keys
  Grouped,  // attention_decode_gqa.wgsl: a workgroup per (split, up to 8 query heads of one kv head, query), each K/V
            // row read once for them; splits of >= 128 keys. Fewer, heavier workgroups: ahead only on long windows
};
// Keys the last query of a decode call attends besides itself: its position without a sliding window (the tokens
// cached before it, llama-bench's depth), else at most window - 1.
uint32_t attention_decode_depth(const AttentionShape& shape);
// The depth from which Auto picks Grouped: ContextOptions::decode_gqa_from, or the adapter's default when unset.
uint32_t decode_gqa_from(const gpu::Context& ctx);
// The kernel `kernel` stands for on this call (Auto resolved by depth; PerHead or Grouped as given).
DecodeKernel resolve_decode_kernel(const gpu::Context& ctx, const AttentionShape& shape, DecodeKernel kernel);
// Query heads one Grouped workgroup serves: the largest divisor of n_heads / n_kv_heads that is <= 8 and whose
// workgroup memory fits the adapter.
uint32_t attention_decode_group(const gpu::Context& ctx, const AttentionShape& shape);

// Decode: like prefill but built for few queries over a long cache. n_splits = 0 chooses the
// split-K factor for the kernel run (1 = no split); `scratch` must then hold attention_decode_scratch_bytes() of it,
// which attention_decode_scratch_bound() covers for every kernel. Any n_splits works with either kernel.
void encode_attention_decode(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                             const gpu::Buffer& q, const KvCache& kv, const gpu::Buffer& out,
                             const gpu::Buffer* scratch, uint32_t n_splits = 0,
                             DecodeKernel kernel = DecodeKernel::Auto);
// The new token of a decode step as the q/k/v products wrote it, for the decode attention to normalise, rotate and
// append itself (attention_decode_fresh.wgsl): encode_qk_norm_rope_kv's work inside the attention dispatch, with the
// same bits. Buffers as encode_qk_norm_rope_kv takes them, the token in row shape.row of q, k and v.
struct FreshToken {
  const gpu::Buffer* k = nullptr;       // [row + 1][n_kv_heads * head_dim] f32
  const gpu::Buffer* v = nullptr;       // likewise
  const gpu::Buffer* q_norm = nullptr;  // [head_dim] f32; with k_norm, nullptr for RoPE alone
  const gpu::Buffer* k_norm = nullptr;
  const gpu::Buffer* table = nullptr;  // upload_rope_table(rope_dim)
  uint32_t rope_dim = 0;               // 0 = head_dim
  RopeType type = RopeType::Normal;
  float eps = 1e-6f;
  bool v_norm = false;  // v's heads RMS-normalised (no gain) before they go into the cache
  // false: q alone, k and v not read (a layer attending over another layer's cache, which already holds the token:
  // gemma4); the bits of encode_qk_norm_rope_q then encode_attention_decode
  bool append = true;
};
// Whether encode_attention_decode_fresh runs this call on ctx: one query, the per-head kernel (Auto resolved by
// depth; Grouped calls keep the separate dispatch), subgroups, and the workgroup memory the adapter allows.
bool attention_decode_takes_fresh(const gpu::Context& ctx, const AttentionShape& shape);
// encode_attention_decode for one query (shape.n_queries == 1) that first makes the token's q, K and V from `fresh`
// (the per-head norms, RoPE, v's norm) and writes its K and V rows into `kv` at its position: what
// encode_qk_norm_rope_kv followed by encode_attention_decode do, in one dispatch and with the same bits. q holds the
// products' q, unchanged by the call. Throws InvalidArgument where attention_decode_takes_fresh is false.
void encode_attention_decode_fresh(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                   const gpu::Buffer& q, const FreshToken& fresh, KvCache& kv, const gpu::Buffer& out,
                                   const gpu::Buffer* scratch);
// The split-K factor n_splits = 0 picks for `kernel` (PerHead or Grouped; Auto counts as PerHead).
uint32_t attention_decode_splits(const AttentionShape& shape, const KvCache& kv,
                                 DecodeKernel kernel = DecodeKernel::PerHead);
// Scratch enough for encode_attention_decode with n_splits = 0 and any kernel, for calls whose last query is at
// most at shape's (the split count only grows with the window).
uint64_t attention_decode_scratch_bound(const AttentionShape& shape, const KvCache& kv);

// Decode of several sequences in one dispatch (continuous batching): query i (q row i, out row i; shape.n_queries of
// them) is one token of sequence i at position positions_i, attending over that sequence's cache, a view of
// `owner`'s pools whose pages start at page_base_i in owner's page table (KvCache's view constructor). `queries`
// holds the n_queries (position, page_base) u32 pairs; every view has `view`'s layout (n_pages, max_seq);
// max_position is the largest position (it sizes the split-K). shape.start_pos, q_base and row are not used.
// Always the PerHead kernel: its splits of 256 keys from key 0 keep a sequence's output the same bits alone or beside
// others; the Grouped kernel does not serve batched rows yet (a long sequence beside short ones decodes as PerHead).
void encode_attention_decode_rows(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                  const gpu::Buffer& q, const KvCache& owner, const KvCache& view,
                                  const gpu::Buffer& queries, uint32_t max_position, const gpu::Buffer& out,
                                  const gpu::Buffer& scratch);
// Whether encode_attention_decode_rows_fresh runs this shape on ctx (subgroups, head_dim, the fresh kernel's workgroup
// memory).
bool attention_decode_rows_take_fresh(const gpu::Context& ctx, const AttentionShape& shape);
// encode_attention_decode_rows that first makes each query's token from `fresh` (its k and v rows are rows [0,
// n_queries) of fresh.k and fresh.v) and writes its K and V rows into the owner's pools at the query's position:
// encode_qk_norm_rope_kv_rows (over the same positions and pages) followed by encode_attention_decode_rows, in one
// dispatch and with the same bits. Without fresh.append, each query's q alone over caches that already hold its token
// (gemma4's layers reading an earlier layer's cache): encode_qk_norm_rope_q's bits, then the attention. q is read, not
// changed.
void encode_attention_decode_rows_fresh(gpu::ComputeBatch& batch, gpu::Context& ctx, const AttentionShape& shape,
                                        const gpu::Buffer& q, const FreshToken& fresh, const KvCache& owner,
                                        const KvCache& view, const gpu::Buffer& queries, uint32_t max_position,
                                        const gpu::Buffer& out, const gpu::Buffer& scratch);
// The scratch encode_attention_decode_rows needs for n_queries sequences whose largest position is max_position.
uint64_t attention_decode_rows_scratch_bytes(const AttentionShape& shape, const KvCache& view, uint32_t max_position);
uint64_t attention_decode_scratch_bytes(const AttentionShape& shape, uint32_t n_splits);

// 4 * n_heads * head_dim * sum of the keys each query sees: the FLOPs of one call.
double attention_flops(const AttentionShape& shape);

}  // namespace wgllm::kernels

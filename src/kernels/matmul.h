// y = x W^T for a weight in its GGUF type (weight.h): on GPUs matrix-vector for decode (matvec.wgsl) and tiled
// matrix-matrix for prefill (matmul.wgsl); on CPU adapters one kernel for both (matmul_rows.wgsl); all after
// matmul_common.wgsl, with fused epilogues. Contract checks
// happen here and throw wgllm::InvalidArgument naming the field.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "gpu/batch.h"
#include "kernels/swiglu.h"
#include "kernels/weight.h"

namespace wgllm::kernels {

struct XDigits;  // kernels/int_dot.h

enum class MatmulImpl {
  // CPU adapters: Rows; GPUs: Matvec for n_tokens <= kMatvecMaxTokens, else Tiled (Batch's split tiles where the
  // tiled product would have few workgroups: few_tiles_split)
  Auto,
  Matvec,  // one pass over W per kMatvecPassTokens tokens (fewer where workgroup memory is short)
  // Matvec in batch decode's shape (batch_matvec_config): a token's sums are the same bits whatever the tokens beside
  // it, from 1 to any number
  Batch,
  // register-tiled: output tiles through workgroup memory (MatmulTile); with ContextOptions::prompt_digits a Q4_K,
  // Q6_K or Q8_0 weight's product instead takes x's digits (int_dot.h, written by the same call into the context's
  // scratch buffer) on packed int8 dot products (matmul_int.wgsl), 64 x 64 tiles
  Tiled,
  // An invocation per 2 or 4 rows, all of their columns, RowsConfig::tokens tokens per pass over W (CPU adapters);
  // weight types it has no block loader for (rows_kernel_reads) take Matvec instead.
  Rows,
};
inline constexpr uint32_t kMatvecMaxTokens = 4;    // Auto's matvec: up to this many tokens
inline constexpr uint32_t kMatvecPassTokens = 16;  // Matvec's tokens per pass over W (batch decode)

// The matvec kernel's shape for an adapter and a weight of n_rows rows of n_in: a workgroup is `groups` groups of
// `threads_per_row` threads, each group owning `rows` adjacent rows (even, for SwiGLU pairs); partial sums are
// reduced with subgroup shuffles when `shuffle`. A token's sums depend on threads_per_row alone.
struct MatvecConfig {
  uint32_t threads_per_row = 32, rows = 2, groups = 4;
  // Per row and step: chunks of 32 weights (the block types) or units of 8 (the float types); loads in flight: rows x
  // units.
  uint32_t units = 1;
  bool int_f16 = false;  // F16 weights converted with integer ops instead of unpack2x16float
  bool shuffle = false;
  // Batch decode's order, which the tiled kernel reproduces where batch_takes_tiles: each unit's products (float types)
  // or each run's (block types: then times the run's scale and plus its offset times sum(x)) chained through fma in
  // element order (matvec.wgsl's MV_FMA).
  bool fma_order = false;
};
// The adapter's shape for a weight of this type (the block types share theirs, the float types theirs), or the
// context's matvec_shape option when set (benchmarks and tests tune with it).
MatvecConfig matvec_config(const gpu::Context& ctx, uint32_t n_rows = 0, uint32_t n_in = 0,
                           GgufType type = GgufType::Q4_K);
// The shape of a one-token product with MatmulOptions::pre, whose every workgroup first reads three vectors of n_in:
// matvec_config's, its workgroups grown by doubling the groups to ContextOptions::pre_rows rows or 256 threads (the
// threads per row, so the sums' order, unchanged); `split`: a second weight's first row, which a workgroup's rows must
// not straddle (0 without one).
MatvecConfig pre_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in, GgufType type,
                               uint32_t split);
// MatmulImpl::Batch's shape: on GPUs 32 threads per row for the float types (their one-token shape reduces many
// tokens slowly), the one-token shape otherwise; always in batch decode's fma order. The threads per row depend on
// the weight alone, never on the token count (so a token's bits do not depend on its company); rows, groups and units
// in flight may (one token: 2 rows x 8 groups x 2 units for the float types).
MatvecConfig batch_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in, GgufType type,
                                 uint32_t n_tokens);
// The expert products' matvec shape (w stacks experts; n_pairs of them at once): the context's expert_shape option
// when set, else batch_matvec_config's for one expert's rows; always in batch decode's fma order.
MatvecConfig expert_matvec_config(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_pairs);
// MatmulImpl::Batch's products of this many tokens or more and at least kBatchTileRows rows or that split (below; or
// of half as many tokens and 8 x kBatchTileRows rows: an LM head) run on the tiled kernel in the batch matvec's order (the same bits for every
// token as the matvec would give it: each thread a 4 x 4 tile of outputs, a chain per lane class of the matvec, the
// classes' tree as its lane sums take it; the block types' runs as the matvec's run_acc takes them). Adapters of one
// subgroup size, batch matvec shapes of 4 to 32 threads per row for the float types and up to 256 for the block types,
// f32 tiles, no expert products. ContextOptions::batch_tile_from (then whatever the rows), else kBatchTileFrom; 0:
// never. (H200, PERF.md "Batch decode's float products on the tiled kernel": unsplit, a workgroup walks the whole
// row, so products of few rows or tokens have too few workgroups and lose to the matvec; H100, "split over groups of
// lane classes": Q4_K's tiles 1.25-1.6x its matvec on the big products at 32-64 tokens.)
inline constexpr uint32_t kBatchTileFrom = 32;
inline constexpr uint32_t kBatchTileRows = 8192;
// Those tiled products with fewer tiles than this split over groups of lane classes (ContextOptions::batch_split):
// a workgroup per tile and group, then one dispatch adding the groups as the lanes' tree does; by default then on
// products of any row count (H100: 1.1-2.2x the matvec from 32 tokens; 2048 x 16384 at 256 tiles was as fast unsplit).
inline constexpr uint32_t kSplitWorkgroups = 256;
uint32_t batch_tile_from(const gpu::Context& ctx);
// Whether MatmulImpl::Batch runs w's product of n_tokens on the tiled kernel.
bool batch_takes_tiles(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens);
// The groups of lane classes that tiled product is split over (1: none; 0: not tiled).
uint32_t batch_tile_groups(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens);
// Auto's products past the matvec's tokens that the tiled kernel would give fewer workgroups than this (a MoE router's
// 32-128 rows: 8-16 tiles at 512 tokens, each walking the whole row) take batch decode's tiles split over lane classes
// where they split (few_tiles_split) and take no digits: more workgroups, each a part of the row, then the adding pass.
// (H100, PERF.md "A prompt's few-tile products on the split tiles": a router of 32 rows at 512 tokens 2x, LFM2-8B-A1B
// and Qwen3-30B-A3B Q4_K_M pp512 +3.5 % and +4 %.)
inline constexpr uint32_t kFewTiles = 32;
bool few_tiles_split(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens);
// Whether the one-token product of a weight of this type reads x's packed digits (MatmulOptions::digits): Q4_K, Q6_K.
inline bool matvec_takes_digits(GgufType t) { return t == GgufType::Q4_K || t == GgufType::Q6_K; }
// The one-token Q4_K / Q6_K product on x's packed digits (MatmulOptions::digits): 32 threads per row and 8 rows (tall
// products) or 4 (long rows) a workgroup, 2 x 4 groups otherwise; CPU adapters the matvec's own; or the context's
// matvec_shape option.
MatvecConfig int_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in);
// "THREADSxROWSxGROUPS[xUNITS[xINT_F16]]", e.g. "32x4x4x2x1" (ContextOptions::matvec_shape); InvalidArgument
// when malformed or outside the kernel's constraints.
MatvecConfig parse_matvec_config(const std::string& text);

// The tiled kernel's shape: a workgroup computes `tokens` x `rows` of y (32, 64 or 128 each; a thread 4 or 8 of each),
// with f16 tiles and f16 sums of each 32-element block (added into f32) when `f16` (shader-f16).
struct MatmulTile {
  uint32_t tokens = 64, rows = 64;  // the workgroup's tile of y
  bool f16 = false;                 // f16 workgroup tiles and block sums (shader-f16)
  // Each thread's part: thread_tokens x thread_rows outputs (4 or 8 each); the workgroup has
  // (tokens / thread_tokens) x (rows / thread_rows) threads.
  uint32_t thread_tokens = 4, thread_rows = 4;
  uint32_t threads() const { return (tokens / thread_tokens) * (rows / thread_rows); }
};
// The context's matmul_tile option when set, else the adapter's shape for n_tokens x n_rows outputs.
MatmulTile matmul_tile(const gpu::Context& ctx, uint32_t n_tokens, uint32_t n_rows);
// "TOKENSxROWS[/TTxTR][xf16]", e.g. "128x128", "64x128xf16" or "64x128/8x8" (ContextOptions::matmul_tile): TOKENS
// and ROWS 16, 32, 64 or 128; TT x TR each thread's outputs, 4 or 8 each (default TOKENS / 16 x ROWS / 16); 32 to 256
// threads, a quarter of which divides TOKENS and ROWS. InvalidArgument when malformed.
MatmulTile parse_matmul_tile(const std::string& text);
// The tile as parse_matmul_tile reads it.
std::string to_string(const MatmulTile& t);

// The Rows kernel's shape: `workgroup` invocations, each `rows` adjacent rows (2 or 4; 4 for the neox RoPE
// epilogue) for `tokens` tokens (1..8; one for a one-token product).
struct RowsConfig {
  uint32_t workgroup = 16, rows = 4, tokens = 4;
};
// The context's rows_shape option when set, else the default; nullopt when it is "off" or the adapter is a GPU.
std::optional<RowsConfig> rows_config(const gpu::Context& ctx);
// "WORKGROUPxROWSxTOKENS", e.g. "16x4x4" (ContextOptions::rows_shape); InvalidArgument when malformed or out of range.
RowsConfig parse_rows_config(const std::string& text);
// Whether the Rows kernel reads this weight type a block at a time (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
// MXFP4). The others (Q2_K, Q3_K, Q4_1, Q5_0, Q5_1) it would read through the 8-element loader with each block's
// header loaded again per unit: on lavapipe that measured slower than the matvec, so Auto keeps them on the GPUs'
// kernels.
bool rows_kernel_reads(GgufType type);
// Auto's choice: the Rows kernel on a CPU adapter (rows_config) for the types it reads.
bool rows_kernel_for(const gpu::Context& ctx, GgufType type);
// Batch decode's product: one whose result for a token does not depend on the tokens beside it (Batch on GPUs,
// Rows on CPU adapters, itself Matvec for the types Rows does not read).
MatmulImpl token_independent_impl(const gpu::Context& ctx);

// What happens around the product, fused into the same dispatch.
struct MatmulOptions {
  const gpu::Buffer* bias = nullptr;  // [n_out] f32 added to every row
  // RMSNorm of x first: x[t] / sqrt(mean(x[t]^2) + eps) * norm, norm: [n_in] f32 (bound as vec4:
  // the buffer must hold n_in rounded up to 8 floats, zeros past n_in).
  const gpu::Buffer* norm = nullptr;
  float eps = 1e-5f;
  bool accumulate = false;  // y += x W^T (the residual add); y is read and written
  // W's rows are (gate, up) pairs (interleave_rows): y[t][i] = act(row 2i) * row 2i+1 (after bias; gpt-oss's act
  // clamps both, kernels/swiglu.h); y is [n_tokens][n_out / 2].
  bool swiglu = false;
  GateAct act = GateAct::Silu;  // with swiglu: the gate's activation
  // Rows [split1, split2) go to *y1 ([n_tokens][split2 - split1]) and [split2, n_out) to *y2;
  // y then holds rows [0, split1) ([n_tokens][split1]). y1 with y2, or y1 alone with split2 == n_out.
  const gpu::Buffer* y1 = nullptr;
  const gpu::Buffer* y2 = nullptr;
  uint32_t split1 = 0, split2 = 0;
  // Each row activated and multiplied by another input: y[t][o] = act(row o) * times[t * times_stride + times_offset
  // + o] (act Silu, GeluTanh or Sigmoid; gemma4's per-layer gate times the layer's slice of its per-layer inputs,
  // qwen35's attention output times the sigmoid of its gate). Not with bias, swiglu, accumulate or split outputs.
  const gpu::Buffer* times = nullptr;
  uint32_t times_stride = 0, times_offset = 0;
  MatmulImpl impl = MatmulImpl::Auto;
  // One token, Q4_K or Q6_K (matvec_takes_digits): x read as its packed 8-bit digits (encode_x_digits of x, or of x *
  // norm when norm is set: the same norm buffer) by the matvec's packed integer dot products (matvec.wgsl's MV_INT); x
  // itself is not read. Within about 2^-23 of each 32-element block's largest |x| (int_dot.h); any epilogue but the
  // RoPE one.
  const XDigits* digits = nullptr;
  // One token on the matvec (matvec_takes_pre): the residual add of a post-norm first, x' = (x + rms_norm(src) *
  // weight) * scale with eps (the norm kernel's ACCUMULATE, kernels/norm.h), in every workgroup; the product then
  // reads x' as its x, and x' goes to `out` (the residual's next buffer; not x). n_in a multiple of 32, src and
  // weight n_in floats.
  struct PreResidual {
    const gpu::Buffer* src = nullptr;
    const gpu::Buffer* weight = nullptr;
    const gpu::Buffer* out = nullptr;
    float scale = 1.f;
  };
  std::optional<PreResidual> pre = std::nullopt;
  // One token on the matvec (detail::matvec_takes_second): the product's rows [split2, split2 + second->n_out) are
  // another weight's, of another block type, read in the same dispatch (a Q4_K_M layer's Q6_K v after its Q4_K q and
  // k rows; matmul_common.wgsl's TWO_TYPES). w holds rows [0, split2): split2 == w.n_out; bias holds both weights'
  // rows. With split outputs or the RoPE epilogue; pre and norm apply to both.
  const GpuWeight* second = nullptr;
  // A mixture's router, one token (decode): the product also chooses the token's experts from its own outputs, as
  // encode_moe_route does with normalize (softmax, or sigmoid with this selection bias; the top n_used renormalised),
  // in the same dispatch: one workgroup walks every row in the matvec's shape (matvec_config's threads per row, so y
  // holds the same bits as the product alone) and then ranks them (matvec_route.wgsl's mv_choose). experts: [n_used]
  // u32, weights: [n_used] f32. On the matvec, one piece, n_out <= kMoeMaxExperts; not with digits, pre, second,
  // swiglu, split outputs or times (matvec_takes_choose).
  struct Choose {
    const gpu::Buffer* experts = nullptr;
    const gpu::Buffer* weights = nullptr;
    const gpu::Buffer* sigmoid_bias = nullptr;  // [n_out] f32
    uint32_t n_used = 0;
  };
  std::optional<Choose> choose = std::nullopt;
};

// ContextOptions::prompt_digits resolved: unset, 3 on GPUs (as exact as the f32 tiles: PERF.md measures perplexity
// within 0.002 % and 6-10 % faster pp512 of Q4_K_M files) and 0 on CPU adapters. InvalidArgument past 3.
uint32_t prompt_digits(const gpu::Context& ctx);
// Unset, the default's digits take products of this many tokens or more: measured faster end to end from 16 tokens
// (Llama-3.2-1B Q4_K_M pp16 +7.5 %, pp64 +18 %, pp512 +7 % on the H100; PERF.md), not below. A value set applies to
// every tiled product.
inline constexpr uint32_t kDefaultDigitsFromTokens = 16;
// The digits a tiled (prompt) product of w over n_tokens takes x as, on packed int8 dot products (matmul_int.wgsl),
// from prompt_digits(ctx): 0 where it stays on the f32 tiles (another type than Q4_K, Q6_K or Q8_0, rows not a whole
// number of the kernel's 128-element steps, Q8_0 with three digits, the adapter's workgroup memory short of the
// kernel's, the default under kDefaultDigitsFromTokens). Expert weights take them in their tiles of 32 or 64 pairs
// (encode_expert_matmul, ExpertOptions::group_tile), n_tokens then the step's pairs.
uint32_t prompt_digits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens);
// The tokens of a workgroup of the products on digits (matmul_int.wgsl: 64 x 64 or 32 x 128): ContextOptions::
// prompt_tile where set, else `otherwise` (64 for the dense products, the expert tiles' moe_matmul_tile).
uint32_t prompt_tile(const gpu::Context& ctx, uint32_t otherwise);

// Whether a one-token product of w with these options' impl runs on the matvec and can take MatmulOptions::pre
// (GPUs, or a CPU adapter whose Rows kernel is off or does not read w's type; n_in a multiple of 32 up to the
// workgroup memory's share).
bool matvec_takes_pre(const gpu::Context& ctx, const GpuWeight& w, MatmulImpl impl = MatmulImpl::Auto);
// Whether a one-token product of w can take MatmulOptions::choose with n_used experts a token: one piece (not an
// expert stack) of at most kMoeMaxExperts rows, n_used at most the matvec's threads a row.
bool matvec_takes_choose(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_used);

// y[t][o] = sum_i x[t][i] * W[o][i] (+ bias[o]) for t < n_tokens, o < W.n_out, with the options'
// epilogues. x: [n_tokens][n_in] f32, y: [n_tokens][n_out] f32 (a different buffer).
// Splits by weight piece and, when x or y would exceed a binding, by token range.
void encode_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& options = {});

// 2 * n_in * n_out * n_tokens.
double matmul_flops(const GpuWeight& w, uint32_t n_tokens);

// The routing taken into the expert products (ExpertOptions::route): the router's logits ([n_tokens][W.n_experts] f32),
// where the weights go ([n_tokens * n_used] f32), and encode_moe_route's sigmoid selection bias, if any; the choice is
// always renormalised over the chosen experts (encode_moe_route's normalize).
struct ExpertRoute {
  const gpu::Buffer* logits = nullptr;
  const gpu::Buffer* weights = nullptr;
  const gpu::Buffer* sigmoid_bias = nullptr;  // [W.n_experts] f32
};

// Expert products (mixtures of experts, kernels/moe.h): W stacks W.n_experts matrices of R = n_out / n_experts rows
// (upload_weight with n_experts). For each pair i = token * n_used + slot, y[i] = x[i / n_used] W_e^T over expert
// e = experts[i]'s rows, with x[i] instead when x_per_pair (x: [n_tokens (* n_used)][n_in], y: [n_tokens * n_used][R,
// halved with swiglu], experts: [n_tokens * n_used] u32, written on the GPU by the router). The matvec kernel in
// batch decode's shape, one dispatch per piece; each pair reads its expert's rows alone, so its sums are the same
// bits whatever the other pairs are.
struct ExpertOptions {
  const gpu::Buffer* norm = nullptr;  // RMSNorm of x first, as MatmulOptions::norm
  float eps = 1e-5f;
  // [n_experts][R] f32: each expert's bias, laid out as its rows (gpt-oss), added before the SwiGLU
  const gpu::Buffer* bias = nullptr;
  bool swiglu = false;  // each expert's rows are (gate, up) pairs, as MatmulOptions::swiglu
  GateAct act = GateAct::Silu;
  bool x_per_pair = false;
  // The pairs grouped by expert (encode_moe_group over the same experts): each expert's rows read once per
  // moe_tile of its pairs instead of once per pair (prefill and large batched steps). Ignored where moe_tile is 1
  // or the adapter's workgroup memory holds no pass of moe_tile tokens.
  const gpu::Buffer* group = nullptr;
  // The tile the group was made with (encode_moe_group's `tile`): 0, moe_tile's (the grouped matvec above); 32 or 64
  // (moe_matmul_tile, prefill): the tiled matmul, one workgroup per tile of pairs and 64 rows of their expert, each
  // expert's rows read once per tile. A pair's sums then do not depend on the other pairs, but are not the matvec's
  // bits. The tiles take x's digits where prompt_digits says so (matmul_int.wgsl; tiles of 32 pairs then take 128 rows
  // of the expert), a pair's outputs then the bits of its expert's own prompt product of its x row.
  uint32_t group_tile = 0;
  // [n_tokens * n_used] f32, the router's weight of each pair (encode_moe_route's): y is then [n_tokens][rows], and
  // each token's pairs' outputs, weighted, are added to it in pair order (encode_moe_combine's arithmetic, the same
  // bits) in the same dispatch, a workgroup row per token. Where expert_combine_fits says so; not with swiglu, norm or
  // group.
  const gpu::Buffer* combine = nullptr;
  // Decode's routing in the same dispatch: each workgroup chooses its pair's expert from route->logits as
  // encode_moe_route does (the same function, the same bits), and `experts` is written, not read: each token's
  // experts, with their weights into route->weights, for the products after (the down products). Where
  // expert_route_fits says so; not with group or combine.
  const ExpertRoute* route = nullptr;
};
// Whether encode_expert_matmul can choose the experts itself (ExpertOptions::route) for a step of n_tokens: one pass
// a pair (no group), at most kMoeMaxExperts experts and kMoeMaxUsed a token, and room in the adapter's workgroup.
bool expert_route_fits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens, uint32_t n_used);
// Whether encode_expert_matmul can add the weighted pairs itself (ExpertOptions::combine): the experts in one piece,
// and room in the adapter's workgroup for a group per pair (the product's groups shared out between the pairs).
bool expert_combine_fits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens, uint32_t n_used);
void encode_expert_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                          const gpu::Buffer& y, const gpu::Buffer& experts, uint32_t n_tokens, uint32_t n_used,
                          const ExpertOptions& options = {});

namespace detail {
// Product pipelines' details for profiles (gpu::PipelineKey::detail), each made of what the pipeline's prelude is made
// of: "Q4_K 64x4x2", a weight type and a shape's numbers; "F16 64x64/4x4, batch order, split 8", the tiled kernel's
// tile (none: a split product's fold), batch decode's order where groups > 0, split where groups > 1.
std::string shape_detail(GgufType t, std::initializer_list<uint32_t> dims);
std::string tiled_detail(GgufType t, const MatmulTile* tile, uint32_t groups);

// The one-token RoPE + KV-append epilogue of the matvec kernel (FLAG_ROPE_KV), as encode_qkv_rope_append
// (qkv_rope_append.h) checks and passes it: q and k rows rotated, k and v written at element offsets of a cache pool.
struct RopeKvEpilogue {
  const gpu::Buffer* table = nullptr;  // upload_rope_table
  const gpu::Buffer* pool = nullptr;   // the KV cache pool holding the position
  uint32_t pos = 0, head_dim = 0, rope_dim = 0;
  uint32_t k_elem = 0, v_elem = 0;  // K and V rows of `pos` in the pool
  bool neox = false, kv_f16 = true;
};
// Whether the one-token matvec takes w's rows followed by w2's in one dispatch (matmul_common.wgsl's TWO_TYPES): both
// block types, different ones, in one piece each, of the same n_in, on the matvec (not a CPU adapter's Rows kernel),
// w's rows a multiple of its shape's rows per workgroup.
bool matvec_takes_second(const gpu::Context& ctx, const GpuWeight& w, const GpuWeight& w2);
// encode_matmul for one token with the epilogue above instead of split outputs; o holds split1, split2, and
// optionally bias, norm and second (checked by the caller).
void encode_matvec_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                           const gpu::Buffer& y, const MatmulOptions& o, const RopeKvEpilogue& e);
}  // namespace detail

}  // namespace wgllm::kernels

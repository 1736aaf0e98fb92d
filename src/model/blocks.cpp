#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/attention.h"
#include "kernels/delta_net.h"
#include "kernels/embedding.h"
#include "kernels/kv_append.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/qk_norm_rope_kv.h"
#include "kernels/qkv_rope_append.h"
#include "kernels/rope.h"
#include "kernels/scale.h"
#include "kernels/shortconv.h"
#include "kernels/swiglu.h"

namespace wgllm {

namespace {

const gpu::Buffer* optional(const gpu::Buffer& b) { return b.size ? &b : nullptr; }

// A storage buffer of `floats` f32 (at least 4: a placeholder where a model has none of them).
gpu::Buffer activations(gpu::Context& ctx, uint64_t floats, const char* label) {
  return ctx.create_buffer(std::max<uint64_t>(floats, 4) * 4, WGPUBufferUsage_Storage, label);
}

// The products' kernel: Auto for one sequence's step, a token-independent one for a batched step.
kernels::MatmulImpl product_impl(const LayerStep& s) {
  return s.rows ? kernels::token_independent_impl(s.ctx) : kernels::MatmulImpl::Auto;
}

// Before a block that reads or writes x other than through encode_x_product.
void flush_pending_norm(const LayerStep& s) { flush_pending_norm(s.batch, s.ctx, s.model.config, s.b); }

// A product of the residual stream x (encode_x_product).
void x_product(const LayerStep& s, const kernels::GpuWeight& w, const gpu::Buffer& y, const kernels::MatmulOptions& o) {
  encode_x_product(s.batch, s.ctx, s.model.config, s.b, w, y, s.n, o);
}

// The layer's tokens as the attention that takes them itself reads them: k and v rows as the products wrote them, the
// q/k norms where the model has them, the RoPE table, v's norm.
kernels::FreshToken fresh_token(const LayerStep& s, const gpu::Buffer& table, uint32_t rope_dim, bool append) {
  const ModelConfig& c = s.model.config;
  return {.k = &s.b.k,
          .v = &s.b.v,
          .q_norm = c.qk_norm ? &s.L.q_norm : nullptr,
          .k_norm = c.qk_norm ? &s.L.k_norm : nullptr,
          .table = &table,
          .rope_dim = rope_dim,
          .type = c.rope_type,
          .eps = c.rms_eps,
          .v_norm = c.v_norm,
          .append = append};
}

// Decoding one token of a model with q/k norms, the attention that takes the token's norms, RoPE, v's norm and append
// (`append`; else q alone) itself, where ContextOptions::fuse_qk_norm and the kernel at this depth allow: encoded, true.
bool encode_fresh_attention(const LayerStep& s, const kernels::AttentionShape& shape, const gpu::Buffer& table,
                            uint32_t rope_dim, kernels::KvCache& kv, bool append) {
  if (!fuse_qk_norm_on(s.ctx, s.model.config) || !kernels::attention_decode_takes_fresh(s.ctx, shape)) return false;
  kernels::encode_attention_decode_fresh(s.batch, s.ctx, shape, s.b.q, fresh_token(s, table, rope_dim, append), kv,
                                         s.b.attn, &s.b.decode_scratch);
  return true;
}

// A batched decode step's attention: the q/k/v products for every sequence's token, then per sequence the q/k norm
// (where the model has it), RoPE and the append into its own cache, and attention over that cache. When the caches
// share one pool, one dispatch for all of them, the norms, RoPE and append inside it (fuse_rows_rope_on; else one
// dispatch before it).
void encode_attention_rows(const LayerStep& s) {
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  const StepRows& r = *s.rows;
  const uint32_t l = s.layer;
  encode_qkv_products(s.batch, s.ctx, c, L, b.x, b.q, b.k, b.v, s.n, product_impl(s));
  const gpu::Buffer& none = s.ctx.placeholder_storage();
  const gpu::Buffer& rope_table = s.model.weights.layer_rope_table(c, l);
  const gpu::Buffer& q_norm = c.qk_norm ? L.q_norm : none;
  const gpu::Buffer& k_norm = c.qk_norm ? L.k_norm : none;
  kernels::QkNormRopeKvShape rope{.n_head = c.n_head,
                                  .n_kv = c.n_head_kv,
                                  .head_dim = c.head_dim,
                                  .rope_dim = c.rope_dim,
                                  .type = c.rope_type,
                                  .eps = c.rms_eps,
                                  .norm = c.qk_norm};
  kernels::AttentionShape shape{.n_heads = c.n_head,
                                .n_kv_heads = c.n_head_kv,
                                .head_dim = c.head_dim,
                                .n_queries = 1,
                                .scale = c.attention_scale(),
                                .window = c.layer_window(l),
                                .sinks = optional(L.attn_sinks)};
  if (r.shared) {
    const kernels::KvCache& owner = *r.shared->layer(l);
    const kernels::KvCache& view = *r.states[0]->kv[l];
    // the per-head kernel whatever the depths (bit-identical outputs whatever the batch; attention.h)
    shape.n_queries = s.n;
    if (fuse_rows_rope_on(s.ctx) && kernels::attention_decode_rows_take_fresh(s.ctx, shape)) {
      kernels::encode_attention_decode_rows_fresh(s.batch, s.ctx, shape, b.q,
                                                  fresh_token(s, rope_table, c.rope_dim, true), owner, view, *r.queries,
                                                  r.max_pos, b.attn, b.decode_scratch);
      return;
    }
    kernels::encode_qk_norm_rope_kv_rows(s.batch, s.ctx, rope, s.n, rope_table, b.q, b.k, b.v, q_norm, k_norm, owner,
                                         *r.rows);
    kernels::encode_attention_decode_rows(s.batch, s.ctx, shape, b.q, owner, view, *r.queries, r.max_pos, b.attn,
                                          b.decode_scratch);
    return;
  }
  for (uint32_t i = 0; i < s.n; ++i) {
    kernels::KvCache& kv = *r.states[i]->kv[l];
    rope.pos = r.positions[i];
    rope.row = i;
    kernels::encode_qk_norm_rope_kv(s.batch, s.ctx, rope, rope_table, b.q, b.k, b.v, q_norm, k_norm, kv);
    shape.start_pos = r.positions[i];
    shape.row = i;
    // the kernel the session's own decode picks at this depth (DecodeKernel::Auto), so the same bits
    kernels::encode_attention_decode(s.batch, s.ctx, shape, b.q, kv, b.attn, &b.decode_scratch);
  }
}

}  // namespace

void encode_qkv_products(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, const GpuLayer& L,
                         const gpu::Buffer& x, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                         uint32_t n, kernels::MatmulImpl impl, SessionBuffers* b, bool two_types) {
  const kernels::MatmulOptions normed{.norm = &L.attn_norm, .eps = c.rms_eps, .impl = impl};
  auto product = [&](const kernels::GpuWeight& w, const gpu::Buffer& y, const kernels::MatmulOptions& o) {
    if (b) return encode_x_product(batch, ctx, c, *b, w, y, n, o);
    kernels::encode_matmul(batch, ctx, w, x, y, n, o);
  };
  if (!L.wqkv.empty() || !L.wqk.empty()) {  // stacked: rows [0, q_dim) to q, then k (then v)
    const bool all = !L.wqkv.empty(), second = !all && two_types;  // second: wv's rows read after wqk's
    kernels::MatmulOptions o = normed;
    o.bias = optional(all || second ? L.bqkv : L.bqk);
    o.y1 = &k;
    o.y2 = all || second ? &v : nullptr;
    o.split1 = c.q_dim();
    o.split2 = c.q_dim() + c.kv_dim();
    o.second = second ? &L.wv : nullptr;
    product(all ? L.wqkv : L.wqk, q, o);
    if (all || second) return;
  }
  for (auto [w, bias, y] : {std::tuple{&L.wq, &L.bq, &q}, {&L.wk, &L.bk, &k}, {&L.wv, &L.bv, &v}}) {
    if (w->empty()) continue;  // in wqk
    kernels::MatmulOptions o = normed;
    o.bias = optional(*bias);
    product(*w, *y, o);
  }
}

void flush_pending_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b) {
  if (!b.pending_norm) return;
  const SessionBuffers::PendingNorm p = *b.pending_norm;
  b.pending_norm.reset();
  kernels::encode_rms_norm(batch, ctx, *p.src, *p.weight, b.x, 1, c.n_embd, c.rms_eps, /*accumulate=*/true, nullptr,
                           p.scale);
}

void encode_x_product(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b,
                      const kernels::GpuWeight& w, const gpu::Buffer& y, uint32_t n, kernels::MatmulOptions o) {
  // An LM head's tens of thousands of workgroups would each read the two vectors more: there the norm's own
  // dispatch costs less (PERF.md)
  constexpr uint32_t kPreMaxRows = 65536;
  if (b.pending_norm && (n != 1 || o.digits || w.n_out > kPreMaxRows || !kernels::matvec_takes_pre(ctx, w, o.impl)))
    flush_pending_norm(batch, ctx, c, b);
  if (!b.pending_norm) return kernels::encode_matmul(batch, ctx, w, b.x, y, n, o);
  const SessionBuffers::PendingNorm p = *b.pending_norm;
  b.pending_norm.reset();
  o.pre = kernels::MatmulOptions::PreResidual{p.src, p.weight, &b.x2, p.scale};
  kernels::encode_matmul(batch, ctx, w, b.x, y, n, o);
  std::swap(b.x, b.x2);
}

DecodeQkv decode_qkv_for(const gpu::Context& ctx, const ModelConfig& c, const GpuLayer& L) {
  const bool narrow = c.n_embd <= kTwoTypesMaxWidth;
  if (c.qk_norm)
    return narrow && L.wqkv.empty() && !L.wqk.empty() && kernels::detail::matvec_takes_second(ctx, L.wqk, L.wv)
               ? DecodeQkv::QkNormTwoTypes
               : DecodeQkv::QkNormRopeAppend;
  const kernels::QkvRopeAppend shape{
      .head_dim = c.head_dim, .rope_dim = c.rope_dim, .neox = c.rope_type == kernels::RopeType::Neox};
  if (narrow && L.wqkv.empty() && !L.wqk.empty()) {
    kernels::QkvRopeAppend both = shape;
    both.rows = kernels::QkvRows::Qk;
    both.v = &L.wv;
    if (kernels::qkv_rope_append_supported(ctx, L.wqk, both)) return DecodeQkv::FusedTwoTypes;
  }
  const bool fused = !L.wqkv.empty() ? kernels::qkv_rope_append_supported(ctx, L.wqkv, shape)
                                     : !L.wqk.empty() && kernels::qkv_rope_append_supported(ctx, L.wqk, shape) &&
                                           kernels::qkv_rope_append_supported(ctx, L.wv, shape);
  return fused ? DecodeQkv::FusedRopeAppend : DecodeQkv::Separate;
}

void encode_attention(const LayerStep& s) {
  if (s.rows) return encode_attention_rows(s);
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  gpu::ComputeBatch& batch = s.batch;
  const uint32_t n = s.n, pos = s.pos;
  kernels::KvCache& kv = *s.state->kv[s.layer];
  const gpu::Buffer& rope_table = s.model.weights.layer_rope_table(c, s.layer);
  const kernels::QkvRopeAppend qkv_rope{.table = &rope_table,
                                        .head_dim = c.head_dim,
                                        .rope_dim = c.rope_dim,
                                        .neox = c.rope_type == kernels::RopeType::Neox,
                                        .pos = pos,
                                        .kv = &kv,
                                        .bias = optional(L.bqkv),
                                        .norm = &L.attn_norm,
                                        .eps = c.rms_eps};
  const kernels::AttentionShape shape{.n_heads = c.n_head,
                                      .n_kv_heads = c.n_head_kv,
                                      .head_dim = c.head_dim,
                                      .n_queries = n,
                                      .start_pos = pos,
                                      .scale = c.attention_scale(),
                                      .window = c.layer_window(s.layer),
                                      .sinks = optional(L.attn_sinks)};
  if (n == 1 && (s.decode_qkv == DecodeQkv::FusedRopeAppend || s.decode_qkv == DecodeQkv::FusedTwoTypes)) {
    flush_pending_norm(s);
    // q = rope(rms_norm(x) @ wq), k = rope(rms_norm(x) @ wk) and v = rms_norm(x) @ wv (+ biases), k and v written
    // into the cache: one dispatch, where v's weight has another type (Q4_K_M's Q6_K v) one dispatch reading both
    // weights, or else one for q and k and one for v
    if (!L.wqkv.empty()) {
      kernels::encode_qkv_rope_append(batch, s.ctx, L.wqkv, b.x, b.q, qkv_rope);
    } else if (s.decode_qkv == DecodeQkv::FusedTwoTypes) {
      kernels::QkvRopeAppend both = qkv_rope;
      both.rows = kernels::QkvRows::Qk;
      both.v = &L.wv;
      kernels::encode_qkv_rope_append(batch, s.ctx, L.wqk, b.x, b.q, both);
    } else {
      kernels::QkvRopeAppend qk = qkv_rope, v = qkv_rope;
      qk.rows = kernels::QkvRows::Qk;
      qk.bias = optional(L.bqk);
      v.rows = kernels::QkvRows::V;
      v.bias = optional(L.bv);
      kernels::encode_qkv_rope_append(batch, s.ctx, L.wqk, b.x, b.q, qk);
      kernels::encode_qkv_rope_append(batch, s.ctx, L.wv, b.x, b.q, v);
    }
  } else {
    // q, k, v = rms_norm(x) * attn_norm @ (wq, wk, wv) (+ bias on qwen2): one product when stacked, else two or three
    const bool qk_norm_fused = s.decode_qkv == DecodeQkv::QkNormRopeAppend || s.decode_qkv == DecodeQkv::QkNormTwoTypes;
    encode_qkv_products(batch, s.ctx, c, L, b.x, b.q, b.k, b.v, n, kernels::MatmulImpl::Auto, &b,
                        n == 1 && s.decode_qkv == DecodeQkv::QkNormTwoTypes);
    // qwen3 and gemma3 decoding: the q/k norms, RoPE, the KV append and attention in one dispatch
    if (n == 1 && qk_norm_fused && encode_fresh_attention(s, shape, rope_table, c.rope_dim, kv, true)) return;
    if (n == 1 && qk_norm_fused) {
      // qwen3 decoding: the per-head q/k norm, RoPE and the KV append in one dispatch
      const kernels::QkNormRopeKvShape qk{.n_head = c.n_head,
                                          .n_kv = c.n_head_kv,
                                          .head_dim = c.head_dim,
                                          .rope_dim = c.rope_dim,
                                          .type = c.rope_type,
                                          .pos = pos,
                                          .eps = c.rms_eps};
      kernels::encode_qk_norm_rope_kv(batch, s.ctx, qk, rope_table, b.q, b.k, b.v, L.q_norm, L.k_norm, kv);
    } else {
      if (c.qk_norm) {  // qwen3: RMSNorm of every q and k head, in place
        kernels::encode_rms_norm(batch, s.ctx, b.q, L.q_norm, b.q, n * c.n_head, c.head_dim, c.rms_eps);
        kernels::encode_rms_norm(batch, s.ctx, b.k, L.k_norm, b.k, n * c.n_head_kv, c.head_dim, c.rms_eps);
      }
      // RoPE on q and k (one dispatch) at positions pos ..
      const kernels::RopeShape rope{.n_tokens = n,
                                    .n_heads = c.n_head,
                                    .head_dim = c.head_dim,
                                    .rope_dim = c.rope_dim,
                                    .start_pos = pos,
                                    .type = c.rope_type,
                                    .n_heads2 = c.n_head_kv};
      kernels::encode_rope(batch, s.ctx, rope, rope_table, b.q, &b.k);
      // k, v rows into the cache
      kernels::encode_kv_append(batch, s.ctx, kv, b.k, b.v, pos, n);
    }
  }
  // causal attention over the cache (local layers: the last sliding_window positions): the batched kernel for a
  // chunk, split-K decode for one token (per head, or per GQA group from the context's decode_gqa_from depth on)
  if (n == 1)
    kernels::encode_attention_decode(batch, s.ctx, shape, b.q, kv, b.attn, &b.decode_scratch);
  else
    kernels::encode_attention_prefill(batch, s.ctx, shape, b.q, kv, b.attn);
}

void encode_ffn(const LayerStep& s) {
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  // act = silu(h @ w_gate) * (h @ w_up) (gemma: gelu_tanh), h = rms_norm(x) * ffn_norm
  const kernels::MatmulImpl impl = product_impl(s);
  // One sequence's decoded token with int_dot on: h's digits once for the Q4_K products among gate and up
  const bool fused = !L.w_gate_up.empty();
  auto q4k = [](const kernels::GpuWeight& w) { return w.type == GgufType::Q4_K; };
  const kernels::XDigits* digits = nullptr;
  if (s.n == 1 && !s.rows && b.ffn_digits && (fused ? q4k(L.w_gate_up) : q4k(L.w_gate) || q4k(L.w_up))) {
    flush_pending_norm(s);
    digits = &*b.ffn_digits;
    kernels::encode_x_digits(s.batch, s.ctx, b.x, *digits, &L.ffn_norm);
  }
  auto with_digits = [&](const kernels::GpuWeight& w, kernels::MatmulOptions o) {
    if (digits && q4k(w)) o.digits = digits;
    return o;
  };
  if (fused) {
    x_product(s, L.w_gate_up, b.act,
              with_digits(L.w_gate_up,
                          {.norm = &L.ffn_norm, .eps = c.rms_eps, .swiglu = true, .act = c.ffn_act, .impl = impl}));
  } else {
    const kernels::MatmulOptions normed{.norm = &L.ffn_norm, .eps = c.rms_eps, .impl = impl};
    x_product(s, L.w_gate, b.gate, with_digits(L.w_gate, normed));
    x_product(s, L.w_up, b.up, with_digits(L.w_up, normed));
    kernels::encode_swiglu(s.batch, s.ctx, b.gate, b.up, b.act, uint64_t(s.n) * c.n_ff_at(s.layer), c.ffn_act);
  }
}

void make_moe_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens) {
  const uint64_t n = c.is_moe() ? tokens : 0, pairs = n * c.n_expert_used;
  auto make = [&](uint64_t floats, const char* label) { return activations(ctx, floats, label); };
  b.router_logits = make(n * c.n_expert, "router logits");
  b.moe_experts = make(pairs, "chosen experts");
  b.moe_weights = make(pairs, "expert weights");
  b.moe_group = make(c.is_moe() ? kernels::moe_group_words(uint32_t(pairs)) : 0, "expert groups");
  b.moe_act = make(pairs * c.n_ff_exp, "expert act");
  b.moe_out = make(pairs * c.n_embd, "expert out");
  const bool split = c.is_moe();  // sized when any layer might not fuse gate and up; small next to the rest
  b.moe_gate = make(split ? pairs * c.n_ff_exp : 0, "expert gate");
  b.moe_up = make(split ? pairs * c.n_ff_exp : 0, "expert up");
}

void make_delta_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens) {
  const uint64_t n = c.delta_layers.empty() ? 0 : tokens, H = c.ssm_v_heads, VD = H * c.ssm_dv;
  auto make = [&](uint64_t floats, const char* label) { return activations(ctx, floats, label); };
  b.delta_x = make(n * c.delta_conv_dim(), "delta x");
  b.delta_c = make(n * c.delta_conv_dim(), "delta conv");
  b.delta_z = make(n * VD, "delta z");
  b.delta_ab = make(n * 2 * H, "delta alpha beta");
  b.delta_b = make(n * H, "delta beta");
  b.delta_o = make(n * VD, "delta o");
  b.delta_y = make(n * VD, "delta y");
  b.delta_tm = make(kernels::delta_chunk_scratch_bytes({.n_tokens = uint32_t(n), .v_heads = uint32_t(H)}) / 4,
                    "delta chunk scratch");
}

void encode_moe_ffn(const LayerStep& s) {
  flush_pending_norm(s);
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  const uint32_t k = c.n_expert_used;
  // router logits of h = rms_norm(x) * ffn_norm (+ bias), then each token's experts and weights; one sequence's decode
  // step: in the router's own dispatch (fuse_router_on)
  const gpu::Buffer* sigmoid_bias = c.moe_sigmoid ? &L.exp_probs_b : nullptr;
  const bool choose =
      s.n == 1 && !s.rows && fuse_router_on(s.ctx, c) && kernels::matvec_takes_choose(s.ctx, L.router, k);
  kernels::encode_matmul(
      s.batch, s.ctx, L.router, b.x, b.router_logits, s.n,
      {.bias = optional(L.router_b),
       .norm = &L.ffn_norm,
       .eps = c.rms_eps,
       .impl = choose ? kernels::MatmulImpl::Matvec : product_impl(s),
       .choose =
           choose
               ? std::optional(kernels::MatmulOptions::Choose{
                     .experts = &b.moe_experts, .weights = &b.moe_weights, .sigmoid_bias = sigmoid_bias, .n_used = k})
               : std::nullopt});
  // Enough tokens for several per expert: the pairs grouped by expert, so an expert's weights are read once per
  // moe_tile of its pairs; in a prompt with 16 or more per expert, once per tile of 32 or 64 pairs through the tiled
  // matmul (H200: pp512 3.5x; lavapipe 1.3-1.9x). Batched decode keeps the matvec: a stream's bits must not depend on
  // its company.
  const kernels::GpuWeight& first = L.exps_gate_up.empty() ? L.exps_gate : L.exps_gate_up;
  uint32_t mm_tile =
      s.rows ? 0 : kernels::moe_matmul_tile(s.n * k, c.n_expert, kernels::prompt_digits(s.ctx, first, s.n * k) > 0);
  if (mm_tile) mm_tile = kernels::prompt_tile(s.ctx, mm_tile);  // (ContextOptions::prompt_tile, a benchmarks' knob)
  const bool grouped = mm_tile || kernels::moe_tile(s.n * k, c.n_expert) > 1;
  // Pairs one at a time (decode): the first gate/up product chooses the experts itself (fuse_moe_route_on)
  const kernels::ExpertRoute route{.logits = &b.router_logits, .weights = &b.moe_weights, .sigmoid_bias = sigmoid_bias};
  const bool fused_route =
      !choose && !grouped && fuse_moe_route_on(s.ctx, c) && kernels::expert_route_fits(s.ctx, first, s.n, k);
  if (!fused_route && !choose)
    kernels::encode_moe_route(s.batch, s.ctx, b.router_logits, b.moe_experts, b.moe_weights, s.n, c.n_expert, k,
                              /*normalize=*/true, route.sigmoid_bias);
  const gpu::Buffer* group = nullptr;
  if (grouped) {
    kernels::encode_moe_group(s.batch, s.ctx, b.moe_experts, b.moe_group, s.n, c.n_expert, k, mm_tile);
    group = &b.moe_group;
  }
  // each chosen expert's act(h gate_e + bias) * (h up_e + bias), then its down product (+ bias)
  if (!L.exps_gate_up.empty()) {
    kernels::encode_expert_matmul(s.batch, s.ctx, L.exps_gate_up, b.x, b.moe_act, b.moe_experts, s.n, k,
                                  {.norm = &L.ffn_norm,
                                   .eps = c.rms_eps,
                                   .bias = optional(L.exps_gate_up_b),
                                   .swiglu = true,
                                   .act = c.ffn_act,
                                   .group = group,
                                   .group_tile = mm_tile,
                                   .route = fused_route ? &route : nullptr});
  } else {
    kernels::ExpertOptions normed{.norm = &L.ffn_norm, .eps = c.rms_eps, .group = group, .group_tile = mm_tile};
    normed.bias = optional(L.exps_gate_b);
    normed.route = fused_route ? &route : nullptr;
    kernels::encode_expert_matmul(s.batch, s.ctx, L.exps_gate, b.x, b.moe_gate, b.moe_experts, s.n, k, normed);
    normed.bias = optional(L.exps_up_b);
    normed.route = nullptr;
    kernels::encode_expert_matmul(s.batch, s.ctx, L.exps_up, b.x, b.moe_up, b.moe_experts, s.n, k, normed);
    kernels::encode_swiglu(s.batch, s.ctx, b.moe_gate, b.moe_up, b.moe_act, uint64_t(s.n) * k * c.n_ff_exp,
                           c.ffn_act);
  }
  // the down products, weighted into x: in one dispatch where the pairs are not grouped (decode), the same bits
  kernels::ExpertOptions down{
      .bias = optional(L.exps_down_b), .x_per_pair = true, .group = group, .group_tile = mm_tile};
  if (!group && kernels::expert_combine_fits(s.ctx, L.exps_down, s.n, k)) {
    down.combine = &b.moe_weights;
    kernels::encode_expert_matmul(s.batch, s.ctx, L.exps_down, b.moe_act, b.x, b.moe_experts, s.n, k, down);
    return;
  }
  kernels::encode_expert_matmul(s.batch, s.ctx, L.exps_down, b.moe_act, b.moe_out, b.moe_experts, s.n, k, down);
  kernels::encode_moe_combine(s.batch, s.ctx, b.moe_out, b.moe_weights, b.x, s.n, k, c.n_embd);
}

void encode_layer_ffn(const LayerStep& s) {
  if (s.model.config.is_moe_layer(s.layer)) {
    encode_moe_ffn(s);
    return;
  }
  encode_ffn(s);
  encode_residual(s, s.L.w_down, s.b.act);
}

void encode_conv(const LayerStep& s) {
  flush_pending_norm(s);
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  // B, C, x = rms_norm(x) * attn_norm @ in_proj
  kernels::encode_matmul(s.batch, s.ctx, L.in_proj, b.x, b.bcx, s.n,
                         {.norm = &L.attn_norm, .eps = c.rms_eps, .impl = product_impl(s)});
  // conv_y = C * conv(B * x) over the conv state, which takes this chunk's B * x rows; in a batched step each
  // sequence's row over its own state
  if (!s.rows) {
    const kernels::ShortConvShape shape{.n_tokens = s.n,
                                        .n_embd = c.n_embd,
                                        .taps = c.l_cache,
                                        .pos = s.pos,
                                        .ring_rows = s.state->conv_rows,
                                        .ring_offset = s.state->conv_at[s.layer]};
    kernels::encode_shortconv(s.batch, s.ctx, shape, b.bcx, L.conv, s.state->conv[s.layer], b.conv_y);
    s.state->save_marks(s.batch, s.layer, s.pos, s.n);
    return;
  }
  const StepRows& r = *s.rows;
  const SequenceState& first = *r.states[0];
  const bool pooled = r.conv_seqs != nullptr;
  if (pooled) {
    const kernels::ShortConvShape shape{
        .n_tokens = s.n, .n_embd = c.n_embd, .taps = c.l_cache, .ring_rows = first.conv_rows};
    kernels::encode_shortconv_rows(s.batch, s.ctx, shape, b.bcx, L.conv, first.conv[s.layer], *r.conv_seqs, b.conv_y);
  }
  for (uint32_t i = 0; i < s.n; ++i) {
    const SequenceState& state = *r.states[i];
    if (!pooled) {
      const kernels::ShortConvShape shape{.n_tokens = 1,
                                          .n_embd = c.n_embd,
                                          .taps = c.l_cache,
                                          .pos = r.positions[i],
                                          .ring_rows = state.conv_rows,
                                          .row = i,
                                          .ring_offset = state.conv_at[s.layer]};
      kernels::encode_shortconv(s.batch, s.ctx, shape, b.bcx, L.conv, state.conv[s.layer], b.conv_y);
    }
    state.save_marks(s.batch, s.layer, r.positions[i], 1);
  }
}

void encode_attention_gate(const LayerStep& s) {
  flush_pending_norm(s);
  const ModelConfig& c = s.model.config;
  // act = sigmoid(norm(x) Wgate) * attn, in the product's epilogue
  kernels::encode_matmul(s.batch, s.ctx, s.L.wgate, s.b.x, s.b.act, s.n,
                         {.norm = &s.L.attn_norm,
                          .eps = c.rms_eps,
                          .act = kernels::GateAct::Sigmoid,
                          .times = &s.b.attn,
                          .times_stride = c.q_dim(),
                          .impl = product_impl(s)});
}

void encode_delta_net(const LayerStep& s) {
  flush_pending_norm(s);
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  const uint32_t W = c.delta_conv_dim(), H = c.ssm_v_heads, VD = H * c.ssm_dv;
  // q/k/v, z, alpha, beta = rms_norm(x) * attn_norm @ (attn_qkv, attn_gate, ssm_alpha, ssm_beta): one product when
  // stacked, two with the last three stacked, else four
  const kernels::MatmulOptions normed{.norm = &L.attn_norm, .eps = c.rms_eps, .impl = product_impl(s)};
  kernels::DeltaGates gates;
  if (!L.ssm_in.empty()) {
    kernels::MatmulOptions o = normed;
    o.y1 = &b.delta_z;
    o.y2 = &b.delta_ab;
    o.split1 = W;
    o.split2 = W + VD;
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_in, b.x, b.delta_x, s.n, o);
    gates = {.alpha = &b.delta_ab, .beta = &b.delta_ab, .stride = 2 * H, .beta_offset = H};
  } else if (!L.ssm_zab.empty()) {
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_qkv, b.x, b.delta_x, s.n, normed);
    kernels::MatmulOptions o = normed;
    o.y1 = &b.delta_ab;
    o.y2 = &b.delta_b;
    o.split1 = VD;
    o.split2 = VD + H;
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_zab, b.x, b.delta_z, s.n, o);
    gates = {.alpha = &b.delta_ab, .beta = &b.delta_b, .stride = H, .beta_offset = 0};
  } else {
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_qkv, b.x, b.delta_x, s.n, normed);
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_z, b.x, b.delta_z, s.n, normed);
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_alpha, b.x, b.delta_ab, s.n, normed);
    kernels::encode_matmul(s.batch, s.ctx, L.ssm_beta, b.x, b.delta_b, s.n, normed);
    gates = {.alpha = &b.delta_ab, .beta = &b.delta_b, .stride = H, .beta_offset = 0};
  }
  // the convolution over the conv state and the delta rule over the recurrent state, from the buffer of the state at
  // pos to the other one: a chunk of an even number of tokens runs as two, all but the last, then the last (each
  // dispatch reads one buffer and writes the other). In a batched step each sequence's row over its own states.
  kernels::DeltaShape shape{.n_tokens = s.n, .k_heads = c.ssm_k_heads, .v_heads = H, .dk = c.ssm_dk, .dv = c.ssm_dv};
  // A decode step (each sequence's one token) runs the conv, the rule and, where a value head fits a workgroup, the
  // output's gated norm in one dispatch.
  const bool step = (s.rows || s.n == 1) && kernels::delta_step_supported(s.ctx);
  const kernels::DeltaOutputNorm out_norm{.weight = &L.ssm_norm, .z = &b.delta_z, .eps = c.rms_eps};
  const bool step_norm = step && kernels::delta_step_norm_supported(s.ctx, shape);
  auto run = [&](const SequenceState& state, uint32_t pos, uint32_t n, uint32_t row) {
    shape.n_tokens = n;
    shape.row = row;
    shape.ring_at = state.conv_at[s.layer];
    const auto& states = state.delta[s.layer];
    const auto& at = state.delta_at[s.layer];
    if (step) {
      shape.state_at = at[pos % 2];
      shape.state_out_at = at[(pos + 1) % 2];
      kernels::encode_delta_step(s.batch, s.ctx, shape, c.ssm_conv, pos, state.conv_rows, c.rms_eps, b.delta_x,
                                 L.ssm_conv, state.conv[s.layer], gates, L.ssm_consts, states[pos % 2],
                                 states[(pos + 1) % 2], step_norm ? b.delta_y : b.delta_o, /*fresh=*/pos == 0,
                                 step_norm ? &out_norm : nullptr);
      return;
    }
    kernels::encode_delta_conv(s.batch, s.ctx, shape, c.ssm_conv, pos, state.conv_rows, c.rms_eps, b.delta_x,
                               L.ssm_conv, state.conv[s.layer], b.delta_c);
    for (uint32_t done = 0; done < n;) {
      const uint32_t part = n % 2 == 0 && done == 0 ? n - 1 : n - done, p = pos + done;
      shape.n_tokens = part;
      shape.row = row + done;
      shape.state_at = at[p % 2];
      shape.state_out_at = at[(p + part) % 2];
      kernels::encode_delta_rule(s.batch, s.ctx, shape, b.delta_c, gates, L.ssm_consts, states[p % 2],
                                 states[(p + part) % 2], b.delta_o, /*fresh=*/p == 0, kernels::DeltaRuleImpl::Auto,
                                 &b.delta_tm);
      done += part;
    }
  };
  const kernels::DeltaShape all{
      .n_tokens = s.n, .k_heads = c.ssm_k_heads, .v_heads = H, .dk = c.ssm_dk, .dv = c.ssm_dv};
  if (!s.rows) {
    run(*s.state, s.pos, s.n, 0);
  } else if (s.rows->delta_seqs && step && kernels::delta_step_rows_supported(s.ctx, all, step_norm)) {
    // every sequence's step in one dispatch over the pools (GpuBatchDecode made the table)
    const SequenceState& first = *s.rows->states[0];
    kernels::encode_delta_step_rows(s.batch, s.ctx, all, c.ssm_conv, first.conv_rows, c.rms_eps, b.delta_x, L.ssm_conv,
                                    first.conv[s.layer], gates, L.ssm_consts, first.delta[s.layer][0],
                                    *s.rows->delta_seqs, step_norm ? b.delta_y : b.delta_o,
                                    step_norm ? &out_norm : nullptr);
  } else {
    for (uint32_t i = 0; i < s.n; ++i) run(*s.rows->states[i], s.rows->positions[i], 1, i);
  }
  // the per-head norm times silu(z)
  if (!step_norm)
    kernels::encode_rms_norm(s.batch, s.ctx, b.delta_o, L.ssm_norm, b.delta_y, s.n * H, c.ssm_dv, c.rms_eps, false,
                             &b.delta_z);
}

void encode_residual(const LayerStep& s, const kernels::GpuWeight& w, const gpu::Buffer& in, const gpu::Buffer* bias) {
  flush_pending_norm(s);
  kernels::encode_matmul(s.batch, s.ctx, w, in, s.b.x, s.n, {.bias = bias, .accumulate = true, .impl = product_impl(s)});
}

void encode_post_norm_residual(const LayerStep& s, const kernels::GpuWeight& w, const gpu::Buffer& in,
                               const gpu::Buffer& norm, float out_scale) {
  const ModelConfig& c = s.model.config;
  flush_pending_norm(s);  // an earlier one no product took (it reads proj)
  kernels::encode_matmul(s.batch, s.ctx, w, in, s.b.proj, s.n, {.impl = product_impl(s)});
  // One sequence's decoded token: the add waits for the next product of x (encode_x_product)
  if (fuse_post_norms_on(s.ctx, c) && s.n == 1 && !s.rows && s.b.x2.size >= s.b.x.size) {
    s.b.pending_norm = SessionBuffers::PendingNorm{&s.b.proj, &norm, out_scale};
    return;
  }
  kernels::encode_rms_norm(s.batch, s.ctx, s.b.proj, norm, s.b.x, s.n, c.n_embd, c.rms_eps, true, nullptr,
                           out_scale);
}

void make_ple_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens) {
  const uint64_t P = c.n_embd_per_layer, n = P ? tokens : 0;
  auto make = [&](uint64_t floats, const char* label) { return activations(ctx, floats, label); };
  b.ple = make(n * c.n_layer * P, "per-layer inputs");
  b.ple_proj = make(n * c.n_layer * P, "per-layer projection");
  b.ple_act = make(n * P, "per-layer act");
}

void encode_attention_gemma4(const LayerStep& s) {
  const ModelConfig& c = s.model.config;
  const GpuLayer& L = s.L;
  SessionBuffers& b = s.b;
  gpu::ComputeBatch& batch = s.batch;
  const uint32_t l = s.layer, n = s.n, D = c.head_dim_at(l), n_kv = c.n_head_kv_at(l), Q = c.q_dim_at(l);
  const bool own = c.owns_kv(l);
  const gpu::Buffer& rope_table = s.model.weights.layer_rope_table(c, l);
  // q (and k, v) = rms_norm(x) * attn_norm @ (wq, wk, wv): stacked (wk twice where v is k), or one by one
  const kernels::MatmulOptions normed{.norm = &L.attn_norm, .eps = c.rms_eps, .impl = product_impl(s)};
  if (!L.wqkv.empty()) {
    kernels::MatmulOptions o = normed;
    o.y1 = &b.k;
    o.y2 = &b.v;
    o.split1 = Q;
    o.split2 = Q + c.kv_dim_at(l);
    x_product(s, L.wqkv, b.q, o);
  } else {
    x_product(s, L.wq, b.q, normed);
    if (own) x_product(s, L.wk, b.k, normed);
    if (own) x_product(s, c.v_from_k(l) ? L.wk : L.wv, b.v, normed);
  }
  // v's heads RMS-normed without gain: by qk_norm_rope_kv in a decode step, in place before the append otherwise
  const bool one_token = n == 1 || s.rows;
  if (own && c.v_norm && !one_token)
    kernels::encode_rms_norm(batch, s.ctx, b.v, L.v_norm, b.v, n * n_kv, D, c.rms_eps);
  kernels::QkNormRopeKvShape qk{.n_head = c.n_head,
                                .n_kv = n_kv,
                                .head_dim = D,
                                .rope_dim = c.rope_dim_at(l),
                                .type = c.rope_type,
                                .eps = c.rms_eps,
                                .v_norm = c.v_norm};
  kernels::AttentionShape shape{.n_heads = c.n_head,
                                .n_kv_heads = n_kv,
                                .head_dim = D,
                                .n_queries = n,
                                .start_pos = s.pos,
                                .scale = c.attention_scale(),
                                .window = c.layer_window(l)};
  const uint32_t src = c.kv_source(l);
  // A layer attending over another's cache normalises and rotates its q alone: in a prompt by rms_norm and rope, in a
  // decode step with qk_norm_rope_kv's arithmetic (encode_qk_norm_rope_q, or inside the attention's dispatch): the same
  // bits alone, batched or fused
  if (!own && !one_token) kernels::encode_rms_norm(batch, s.ctx, b.q, L.q_norm, b.q, n * c.n_head, D, c.rms_eps);
  if (s.rows) {  // a batched decode step: per sequence its RoPE (+ append) and attention over its own cache
    const StepRows& r = *s.rows;
    // when the caches share one pool: all of them in one dispatch, the norms, RoPE and append (a layer with a cache of
    // its own; q alone otherwise) inside it (as encode_attention_rows)
    kernels::AttentionShape all = shape;
    all.n_queries = n;
    all.start_pos = 0;
    if (r.shared && fuse_rows_rope_on(s.ctx) && kernels::attention_decode_rows_take_fresh(s.ctx, all)) {
      kernels::encode_attention_decode_rows_fresh(batch, s.ctx, all, b.q, fresh_token(s, rope_table, qk.rope_dim, own),
                                                  *r.shared->layer(src), *r.states[0]->kv[src], *r.queries, r.max_pos,
                                                  b.attn, b.decode_scratch);
      return;
    }
    shape.n_queries = 1;
    for (uint32_t i = 0; i < n; ++i) {
      kernels::KvCache& kv = *r.states[i]->kv[src];
      if (own) {
        qk.pos = r.positions[i];
        qk.row = i;
        kernels::encode_qk_norm_rope_kv(batch, s.ctx, qk, rope_table, b.q, b.k, b.v, L.q_norm, L.k_norm, kv);
      } else {
        qk.pos = r.positions[i];
        qk.row = i;
        kernels::encode_qk_norm_rope_q(batch, s.ctx, qk, rope_table, b.q, L.q_norm);
      }
      shape.start_pos = r.positions[i];
      shape.row = i;
      kernels::encode_attention_decode(batch, s.ctx, shape, b.q, kv, b.attn, &b.decode_scratch);
    }
    return;
  }
  kernels::KvCache& kv = *s.state->kv[src];
  // decoding: the per-head q/k norms, RoPE, v's norm, the KV append (a layer with its own cache) and attention in one
  // dispatch
  if (n == 1 && encode_fresh_attention(s, shape, rope_table, qk.rope_dim, kv, own)) return;
  if (n == 1) {  // decoding: the per-head q/k norm, RoPE and the KV append in one dispatch (q alone: another's cache)
    qk.pos = s.pos;
    if (own)
      kernels::encode_qk_norm_rope_kv(batch, s.ctx, qk, rope_table, b.q, b.k, b.v, L.q_norm, L.k_norm, kv);
    else
      kernels::encode_qk_norm_rope_q(batch, s.ctx, qk, rope_table, b.q, L.q_norm);
  } else {
    if (own) {
      kernels::encode_rms_norm(batch, s.ctx, b.q, L.q_norm, b.q, n * c.n_head, D, c.rms_eps);
      kernels::encode_rms_norm(batch, s.ctx, b.k, L.k_norm, b.k, n * n_kv, D, c.rms_eps);
    }
    const kernels::RopeShape rope{.n_tokens = n,
                                  .n_heads = c.n_head,
                                  .head_dim = D,
                                  .rope_dim = c.rope_dim_at(l),
                                  .start_pos = s.pos,
                                  .type = c.rope_type,
                                  .n_heads2 = own ? n_kv : 0};
    kernels::encode_rope(batch, s.ctx, rope, rope_table, b.q, own ? &b.k : nullptr);
    if (own) kernels::encode_kv_append(batch, s.ctx, kv, b.k, b.v, s.pos, n);
  }
  if (n == 1)
    kernels::encode_attention_decode(batch, s.ctx, shape, b.q, kv, b.attn, &b.decode_scratch);
  else
    kernels::encode_attention_prefill(batch, s.ctx, shape, b.q, kv, b.attn);
}

void encode_per_layer_inputs(const LayerStep& s) {
  const ModelConfig& c = s.model.config;
  const GpuWeights& w = s.model.weights;
  SessionBuffers& b = s.b;
  const uint32_t P = c.n_embd_per_layer, NP = c.n_layer * P, n = s.n;
  flush_pending_norm(s);
  // the token's rows of per_layer_token_embd, times sqrt(P)
  kernels::encode_embedding(s.batch, s.ctx, w.per_layer_token_embd, b.ids, b.ple, n);
  kernels::encode_scale(s.batch, s.ctx, b.ple, uint64_t(n) * NP, std::sqrt(float(P)));
  // + rms_norm(x per_layer_model_proj / sqrt(n_embd)) per layer, then / sqrt(2)
  kernels::encode_matmul(s.batch, s.ctx, w.per_layer_model_proj, b.x, b.ple_proj, n, {.impl = product_impl(s)});
  kernels::encode_scale(s.batch, s.ctx, b.ple_proj, uint64_t(n) * NP, 1.f / std::sqrt(float(c.n_embd)));
  kernels::encode_rms_norm(s.batch, s.ctx, b.ple_proj, w.per_layer_proj_norm, b.ple, n * c.n_layer, P, c.rms_eps,
                           /*accumulate=*/true);
  kernels::encode_scale(s.batch, s.ctx, b.ple, uint64_t(n) * NP, 1.f / std::sqrt(2.f));
}

void encode_per_layer_embedding(const LayerStep& s, float out_scale) {
  const ModelConfig& c = s.model.config;
  SessionBuffers& b = s.b;
  const uint32_t P = c.n_embd_per_layer;
  // act = gelu_tanh(x Wple_gate) * this layer's slice of the per-layer inputs, in the product's epilogue
  x_product(s, s.L.ple_gate, b.ple_act,
            {.act = kernels::GateAct::GeluTanh,
             .times = &b.ple,
             .times_stride = c.n_layer * P,
             .times_offset = s.layer * P,
             .impl = product_impl(s)});
  encode_post_norm_residual(s, s.L.ple_proj, b.ple_act, s.L.ple_post_norm, out_scale);
}

}  // namespace wgllm

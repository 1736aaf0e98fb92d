// The blocks a layer is made of (blocks.cpp), shared by the architectures' layer programs (model/arch/): each
// encodes its dispatches for one step of n tokens at position pos of one sequence, reading the residual stream x and
// writing its output to an activation buffer; encode_residual / encode_post_norm_residual add a block's output,
// projected, back into x.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "gpu/batch.h"
#include "kernels/int_dot.h"
#include "kernels/matmul.h"
#include "model/state.h"
#include "model/transformer.h"

namespace wgllm {

// A session's activations for up to ubatch tokens. Row-major [tokens][width] f32.
struct SessionBuffers {
  gpu::Buffer ids;                         // [ubatch] u32 token ids
  gpu::Buffer x;                           // [ubatch][n_embd] residual stream (the output projections add into it)
  gpu::Buffer q;                           // [ubatch][q_dim]
  gpu::Buffer k, v;                        // [ubatch][kv_dim]
  gpu::Buffer attn;                        // [ubatch][q_dim] attention output
  gpu::Buffer gate, up;                    // [ubatch][n_ff] (gate and up not fused); qwen35: gate at least q_dim
  gpu::Buffer act;                         // [ubatch][n_ff] SwiGLU output; qwen35: at least q_dim (the gated attention)
  gpu::Buffer proj;                        // [ubatch][n_embd] an output projection before its post-norm (gemma3)
  gpu::Buffer bcx;                         // [ubatch][3 n_embd] in_proj's B, C, x (lfm2 convolution layers)
  gpu::Buffer conv_y;                      // [ubatch][n_embd] C * conv(B * x), out_proj's input
  // qwen35's DeltaNet layers (size 4 otherwise): W = config.delta_conv_dim(), VD = v_heads dv, H = v_heads
  gpu::Buffer delta_x;   // [ubatch][W] the q/k/v in-projection
  gpu::Buffer delta_c;   // [ubatch][W] after the convolution (q, k normalised)
  gpu::Buffer delta_z;   // [ubatch][VD] the output gate's projection
  gpu::Buffer delta_ab;  // [ubatch][2H] alpha then beta (stacked product), or [ubatch][H] alpha alone
  gpu::Buffer delta_b;   // [ubatch][H] beta (separate products)
  gpu::Buffer delta_o;   // [ubatch][VD] the delta rule's output
  gpu::Buffer delta_y;   // [ubatch][VD] its per-head RMS norm * silu(z), ssm_out's input
  gpu::Buffer delta_tm;  // the chunked delta rule's scratch for ubatch tokens (kernels::delta_chunk_scratch_bytes)
  gpu::Buffer last;                        // [n_embd] the last token's residual row
  gpu::Buffer logits;                      // [n_vocab] logits of the last token
  gpu::Buffer logits_host;                 // [n_vocab] mappable copy of logits, read back once per step
  gpu::Buffer logits_all;                  // [ubatch][n_vocab], made on first use by forward_all
  gpu::Buffer block_x;                     // [logit_rows_per_block][n_embd], made on first use by forward_rows
  gpu::Buffer block_logits;                // [logit_rows_per_block][n_vocab], likewise
  gpu::Buffer argmax_scratch;              // encode_argmax's partials
  gpu::Buffer sample_scratch;              // encode_sample's scratch, made on first use by decode_sampled
  gpu::Buffer recent_ids;                  // [window] u32 ring of recent ids for decode_sampled's penalty
  std::array<gpu::Buffer, 2> id_readback;  // mappable copies of the chosen id of two greedy steps in flight
  gpu::Buffer decode_scratch;              // split-K partials of the decode attention
  // mixtures of experts (make_moe_buffers; size 4 otherwise)
  gpu::Buffer router_logits;  // [ubatch][n_expert]
  gpu::Buffer moe_experts;    // [ubatch][n_expert_used] u32: the chosen experts, best first
  gpu::Buffer moe_weights;    // [ubatch][n_expert_used]: their weights
  gpu::Buffer moe_group;      // the pairs grouped by expert (kernels::encode_moe_group), for steps of several tokens
  gpu::Buffer moe_gate, moe_up;  // [ubatch][n_expert_used][n_ff_exp]: gate and up not fused
  gpu::Buffer moe_act;        // [ubatch][n_expert_used][n_ff_exp]: each chosen expert's SwiGLU
  gpu::Buffer moe_out;        // [ubatch][n_expert_used][n_embd]: each chosen expert's output
  // gemma4's per-layer embeddings (make_ple_buffers; size 4 otherwise)
  gpu::Buffer ple;            // [ubatch][n_layer P]: every layer's input, computed at layer 0
  gpu::Buffer ple_proj;       // [ubatch][n_layer P]: the projection of the scaled embedding
  gpu::Buffer ple_act;        // [ubatch][P]
  // A decoded token's FFN input as packed 8-bit digits (ContextOptions::int_dot; kernels/int_dot.h), for its Q4_K
  // gate/up products, then its normed final x for a Q4_K or Q6_K LM head; absent when off or n_embd is not a multiple
  // of 32.
  std::optional<kernels::XDigits> ffn_digits;
  // A post-norm's residual add that encode_post_norm_residual left to the next product of x (one token): x = (x +
  // rms_norm(*src) * *weight) * scale, in that product's prologue where the matvec takes it (the sum then goes to x2,
  // which becomes x: the two buffers trade places), else as its own norm dispatch first (flush_pending_norm).
  struct PendingNorm {
    const gpu::Buffer* src;
    const gpu::Buffer* weight;
    float scale;
  };
  std::optional<PendingNorm> pending_norm;
  gpu::Buffer x2;  // [ubatch][n_embd] the residual's other buffer (post-norm models fusing them; size 4 otherwise)
};

// y = x W with o's epilogues, x = b.x, the residual stream: a pending post-norm's add (b.pending_norm) rides in its
// prologue where the product can take it (the residual then moves to b.x2, swapped into b.x at once), else runs first
// as its own dispatch. Every product of x in a step of one sequence goes through here.
void encode_x_product(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b,
                      const kernels::GpuWeight& w, const gpu::Buffer& y, uint32_t n, kernels::MatmulOptions o);
// The pending post-norm's add (if any) as its own dispatch: before anything but a product reads or writes x.
void flush_pending_norm(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b);

// The mixture-of-experts buffers of b for `tokens` tokens (placeholders of 16 bytes for dense models).
void make_moe_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens);
// The DeltaNet buffers of b for `tokens` tokens (placeholders of 16 bytes without DeltaNet layers).
void make_delta_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens);
// The width of b.gate and b.act per token: the widest FFN, or q_dim where larger on models with a gated attention
// output.
inline uint64_t gate_act_width(const ModelConfig& c) {
  return c.attn_gated && c.max_q_dim() > c.max_n_ff() ? c.max_q_dim() : c.max_n_ff();
}
// The per-layer embedding buffers of b for `tokens` tokens (placeholders of 16 bytes without them; gemma4).
void make_ple_buffers(gpu::Context& ctx, const ModelConfig& c, SessionBuffers& b, uint64_t tokens);

// q, k, v = rms_norm(x) * attn_norm @ (wq, wk, wv) (+ biases) for n tokens into q, k, v ([n][q_dim], [n][kv_dim] x 2):
// one product when the layer stacks all three, or with wqk and wv where `two_types` (one token, decode_qkv_for's
// QkNormTwoTypes: the matvec reads both weights), two with wqk and wv otherwise, else three.
// (x is b.x when `b` is given: the products then take a pending post-norm, encode_x_product.)
void encode_qkv_products(gpu::ComputeBatch& batch, gpu::Context& ctx, const ModelConfig& c, const GpuLayer& L,
                         const gpu::Buffer& x, const gpu::Buffer& q, const gpu::Buffer& k, const gpu::Buffer& v,
                         uint32_t n, kernels::MatmulImpl impl = kernels::MatmulImpl::Auto, SessionBuffers* b = nullptr,
                         bool two_types = false);

// How an attention layer's decode step gets q into place and k, v into the cache.
enum class DecodeQkv : uint8_t {
  FusedRopeAppend,   // one dispatch (two with wqk and wv): the stacked q/k/v product also applies RoPE and appends
                     // k, v
  FusedTwoTypes,     // as FusedRopeAppend, wqk and wv (two block types) read by one dispatch (QkvRopeAppend::v)
  QkNormRopeAppend,  // the q/k/v product(s), then the per-head q/k norm + RoPE + append in one (qk_norm)
  QkNormTwoTypes,    // as QkNormRopeAppend, wqk and wv (two block types) read by one product (MatmulOptions::second)
  Separate,          // the product(s), RoPE, the KV append
};
// The choice for a layer on this adapter (the session makes it once per layer). Two block types share a dispatch
// only in models up to kTwoTypesMaxWidth wide: the v rows then run in q/k's matvec shape, which on the H100 gained
// at 640 and 2,048 columns (Gemma 3 270M +2.4 %, Llama-3.2-1B +0.7 %) and lost at 4,096 (Llama-3.1-8B Q4_K_M -2.8 %,
// 77 us a step; PERF.md), where two dispatches in their own shapes do better.
constexpr uint32_t kTwoTypesMaxWidth = 2048;
DecodeQkv decode_qkv_for(const gpu::Context& ctx, const ModelConfig& c, const GpuLayer& L);

// The sequences of a batched decode step (GpuBatchDecode): the step's token i is the next of sequence i, at
// positions[i]. Its products take a kernel whose sums for a token do not depend on the tokens beside it
// (kernels::token_independent_impl), so a sequence's outputs are the same bits whatever company it has.
struct StepRows {
  std::vector<SequenceState*> states;
  std::vector<uint32_t> positions;
  // When every sequence's caches are views of one pool per layer (`shared`, the owners): the RoPE + append and the
  // attention of all of them in one dispatch each, from the step's tables.
  const SharedKv* shared = nullptr;
  const gpu::Buffer* rows = nullptr;     // [n] (position, K offset, V offset, 0)
  const gpu::Buffer* queries = nullptr;  // [n] (position, first page)
  uint32_t max_pos = 0;                  // the step's last position
  // lfm2: when every sequence's conv rings are views of one pool per layer, each at the same offset in every conv
  // layer (GpuBatchDecode checks): the short convolution of all of them in one dispatch, from this table.
  const gpu::Buffer* conv_seqs = nullptr;  // [n] (position, ring base in elements)
  // qwen35: when every sequence's DeltaNet rings and states are views of one pool per layer, each at the same offsets
  // in every DeltaNet layer (GpuBatchDecode checks): the DeltaNet step of all of them in one dispatch, from this table.
  const gpu::Buffer* delta_seqs = nullptr;  // [n] (position, ring, state, state after), in elements
};

// One layer of one step: n tokens at positions pos.. of one sequence (state), or one token of each of n sequences
// (rows).
struct LayerStep {
  gpu::ComputeBatch& batch;
  gpu::Context& ctx;
  const GpuModel& model;
  const GpuLayer& L;  // model.weights.layers[layer]
  SessionBuffers& b;
  SequenceState* state = nullptr;  // one sequence's step
  uint32_t layer = 0, n = 0, pos = 0;
  DecodeQkv decode_qkv = DecodeQkv::Separate;  // this layer's, for n == 1
  const StepRows* rows = nullptr;              // a batched decode step
};

// attn = causal attention over the layer's KV cache of q, k, v = rms_norm(x) * attn_norm (wq, wk, wv) (+ biases),
// with the per-head q/k norm (qk_norm) and RoPE, k and v appended to the cache; decoding, the fused paths of
// s.decode_qkv. Local (sliding-window) layers see the last sliding_window positions.
void encode_attention(const LayerStep& s);
// act = act(h w_gate) * (h w_up), h = rms_norm(x) * ffn_norm (silu, gelu_tanh or gpt-oss's by ffn_act).
void encode_ffn(const LayerStep& s);
// x += the mixture of experts' output for h = rms_norm(x) * ffn_norm: the router's choice of n_expert_used experts
// and weights (kernels/moe.h), each chosen expert's SwiGLU FFN of h, their weighted sum. Every expert id stays on
// the GPU.
void encode_moe_ffn(const LayerStep& s);
// The layer's FFN added to x: encode_moe_ffn on a mixture-of-experts layer (config.is_moe_layer), else encode_ffn and
// its down projection's residual add.
void encode_layer_ffn(const LayerStep& s);
// conv_y = C * conv(B * x'), B, C, x' = rms_norm(x) * attn_norm in_proj, over the layer's conv state, which takes the
// step's B * x' rows (lfm2).
void encode_conv(const LayerStep& s);
// act = attn * sigmoid(rms_norm(x) * attn_norm @ wgate) (qwen35's gated attention output; wo's input).
void encode_attention_gate(const LayerStep& s);
// delta_y = rms_norm(o) * ssm_norm * silu(z) per value head, o the gated delta rule (kernels/delta_net.h) of q, k, v
// = conv(rms_norm(x) * attn_norm @ attn_qkv) over the layer's conv state, its recurrent state updated; z, alpha, beta
// the other in-projections (qwen35's DeltaNet layers; ssm_out's input).
void encode_delta_net(const LayerStep& s);
// gemma4's attention, the layer's own shapes (config.*_at): q, k, v as encode_attention's with v's heads RMS-normed
// (no gain) before the append; a layer sharing an earlier layer's KV cache (config.kv_source) computes q alone and
// attends over that cache.
void encode_attention_gemma4(const LayerStep& s);
// gemma4, at layer 0 (x holds the scaled embeddings): every layer's per-layer input into b.ple, (rms_norm(x
// per_layer_model_proj / sqrt(n_embd)) per_layer_proj_norm + per_layer_token_embd[id] sqrt(P)) / sqrt(2).
void encode_per_layer_inputs(const LayerStep& s);
// gemma4, after the FFN: x += rms_norm((gelu_tanh(x ple_gate) * this layer's input) ple_proj) ple_post_norm.
void encode_per_layer_embedding(const LayerStep& s, float out_scale = 1.f);
// x += in w (+ bias).
void encode_residual(const LayerStep& s, const kernels::GpuWeight& w, const gpu::Buffer& in,
                     const gpu::Buffer* bias = nullptr);
// x = (x + rms_norm(in w) * norm) * out_scale (gemma's post norms; Gemma 4's layer output scale after its last).
void encode_post_norm_residual(const LayerStep& s, const kernels::GpuWeight& w, const gpu::Buffer& in,
                               const gpu::Buffer& norm, float out_scale = 1.f);

}  // namespace wgllm

// gemma4: gemma3's layer (post norms, gelu_tanh, per-head q/k norms) with its own attention block
// (encode_attention_gemma4: the layer's own head width and KV heads, v's heads RMS-normed, the last layers attending
// over an earlier layer's KV cache) and, with per-layer embeddings, a third residual add after the FFN; a scalar may
// scale the layer's output. What else sets Gemma 4 apart is in its config (read_gemma4 in model/config.cpp), applied
// by the shared code: the embedding scale, the sliding-window layers and their RoPE (rope_table_swa over the local
// heads' dims; the global layers' proportional RoPE is rope_freqs.weight, folded into rope_table), q.k unscaled and
// the final logit softcap.
#include <array>
#include <span>

#include "gguf/file.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  const std::string b = layer_prefix(layer);
  GpuLayer L;
  L.attn_norm = up.norm(b + "attn_norm.weight");
  const std::string q = b + "attn_q.weight", k = b + "attn_k.weight", v = b + "attn_v.weight";
  if (!c.owns_kv(layer)) {
    L.wq = up.matrix(q);
  } else if (c.v_from_k(layer) && up.fusable({q, k})) {  // q, k and k again as v: one product
    const GgufTensor& tq = up.f.tensor(q);
    const GgufTensor& tk = up.f.tensor(k);
    const std::array<std::span<const uint8_t>, 3> parts{up.data(tq), up.data(tk), up.data(tk)};
    L.wqkv = kernels::upload_weight(up.ctx, tq.type, tq.ne[0], tq.ne[1] + 2 * tk.ne[1], kernels::concat_rows(parts),
                                    b + "attn_qkk");
    up.advance(tq);
    up.advance(tk);
  } else if (!c.v_from_k(layer) && up.fusable({q, k, v})) {
    L.wqkv = up.stacked({q, k, v}, b + "attn_qkv");
  } else {
    L.wq = up.matrix(q);
    L.wk = up.matrix(k);
    if (!c.v_from_k(layer)) L.wv = up.matrix(v);
  }
  L.q_norm = up.vector(b + "attn_q_norm.weight");
  if (c.owns_kv(layer)) {
    L.k_norm = up.vector(b + "attn_k_norm.weight");
    const std::vector<float> ones(c.head_dim_at(layer), 1.f);
    L.v_norm = up.ctx.upload(std::span<const float>(ones), WGPUBufferUsage_Storage, b + "v_norm");
  }
  L.wo = up.matrix(b + "attn_output.weight");
  upload_ffn(up, c, L, b);
  L.post_attn_norm = up.vector(b + "post_attention_norm.weight");
  L.post_ffn_norm = up.vector(b + "post_ffw_norm.weight");
  if (c.n_embd_per_layer > 0) {
    L.ple_gate = up.matrix(b + "inp_gate.weight");
    L.ple_proj = up.matrix(b + "proj.weight");
    L.ple_post_norm = up.vector(b + "post_norm.weight");
  }
  if (c.layer_out_scale) L.out_scale = up.floats(b + "layer_output_scale.weight").at(0);
  return L;
}

// A decode step (n = 1) of a gemma4 layer with its own KV cache and per-layer embeddings runs 7 dispatches on GPUs
// with ContextOptions::fuse_post_norms (q/k/v stacked, gate/up fused; a layer sharing another's cache: q alone, its
// norm and RoPE in the attention's dispatch too, no append: 6). Each post norm's residual add rides in the prologue of the next product of x
// (encode_post_norm_residual, encode_x_product; without the option, or on CPU adapters' Rows kernel, it runs as an
// rms_norm of its own: 10 dispatches):
//   (layer 0: embedding, scale, matmul, scale, rms_norm (adding), scale   every layer's per-layer input)
//   matmul (q, k, v)                     x = (x + norm(proj) ple_post_norm) * output scale of the layer before;
//                                        q, k, v = norm(x) (Wq, Wk, Wv)
//   attention_decode_fresh               per-head norms of q and k (and of v, without gain), RoPE, k and v into the
//                                        KV cache, then attn over the cache (local layers: the last sliding_window
//                                        positions); without ContextOptions::fuse_qk_norm qk_norm_rope_kv, then
//                                        attention_decode (one dispatch more)
//   matmul                               proj = attn Wo
//   matmul (its epilogue the gelu)       x += norm(proj) post_attn_norm; act = gelu_tanh(norm(x) Wgate) * (norm(x) Wup)
//   matmul                               proj = act Wdown
//   matmul (its epilogue the gelu)       x += norm(proj) post_ffn_norm; g = gelu_tanh(x Wple_gate) * this layer's
//                                        per-layer input
//   matmul                               proj = g Wple_proj (its norm, and the output scale, to the next product)
void encode(const LayerStep& s) {
  const ModelConfig& c = s.model.config;
  if (s.layer == 0 && c.n_embd_per_layer > 0) encode_per_layer_inputs(s);
  encode_attention_gemma4(s);
  encode_post_norm_residual(s, s.L.wo, s.b.attn, s.L.post_attn_norm);
  encode_ffn(s);
  // the layer's output scale in its last residual add
  const float out_scale = c.layer_out_scale ? s.L.out_scale : 1.f;
  const bool ple = c.n_embd_per_layer > 0;
  encode_post_norm_residual(s, s.L.w_down, s.b.act, s.L.post_ffn_norm, ple ? 1.f : out_scale);
  if (ple) encode_per_layer_embedding(s, out_scale);
}

}  // namespace

const LayerProgram kGemma4Layers{.upload = upload, .encode = encode};

}  // namespace wgllm

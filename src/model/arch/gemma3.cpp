// gemma3: the llama layer with the attention and FFN outputs RMS-normed before each residual add (the post norms),
// gelu_tanh in the FFN and per-head q/k norms. What else sets Gemma 3 apart is in its config (read_gemma3 in
// model/config.cpp), applied by the shared code: the embedding scale (sqrt(n_embd), in GpuSession::encode_step),
// the sliding-window layers (their window in encode_attention, their own RoPE base in the model's rope_table_swa),
// the q.k scale and the final logit softcap (GpuSession::encode_logits).
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  GpuLayer L = upload_attention_layer(up, c, layer);
  const std::string b = layer_prefix(layer);
  L.post_attn_norm = up.vector(b + "post_attention_norm.weight");
  L.post_ffn_norm = up.vector(b + "post_ffw_norm.weight");
  return L;
}

// A decode step (n = 1) of a gemma3 layer with ContextOptions::fuse_post_norms and fuse_qk_norm runs 5 dispatches
// on GPUs (q/k/v stacked, gate/up fused):
//   matmul (q, k, v)                    x += norm(proj) post_ffn_norm of the layer before (the product's prologue);
//                                       q, k, v = norm(x) (Wq, Wk, Wv)
//   attention_decode_fresh              per-head norms of q and k, RoPE, k and v into the KV cache, then attn over
//                                       the cache (local layers: the last sliding_window positions; + a split-K
//                                       reduce past 256 keys; without fuse_qk_norm qk_norm_rope_kv, then
//                                       attention_decode: 6)
//   matmul                              proj = attn Wo
//   matmul (its epilogue the gelu)      x += norm(proj) post_attn_norm (the prologue);
//                                       act = gelu_tanh(norm(x) Wgate) * (norm(x) Wup)
//   matmul                              proj = act Wdown, its post norm left to the next product of x
// (encode_post_norm_residual leaves each post norm's add to the next product of x, encode_x_product. Without the
// option, or where that product cannot take it (CPU adapters' Rows kernel), each runs as an rms_norm of its own: 8
// dispatches.)
void encode(const LayerStep& s) {
  encode_attention(s);
  encode_post_norm_residual(s, s.L.wo, s.b.attn, s.L.post_attn_norm);
  encode_ffn(s);
  encode_post_norm_residual(s, s.L.w_down, s.b.act, s.L.post_ffn_norm);
}

}  // namespace

const LayerProgram kGemma3Layers{.upload = upload, .encode = encode};

}  // namespace wgllm

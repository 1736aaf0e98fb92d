// llama, qwen2 and qwen3: attention and a gated FFN, each added to the residual stream. They differ by config flags
// that the shared blocks read: qwen2's q/k/v biases (attn_bias), qwen3's per-head q/k norm (qk_norm), NeoX RoPE on
// the qwens, llama3's RoPE scaling (the rope table).
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

// A decode step (n = 1) of a llama / qwen2 layer runs 5 dispatches:
//   qkv_rope_append           q = rope(norm(x) Wq); k = rope(norm(x) Wk), v = norm(x) Wv into the KV cache
//   attention_decode          attn = softmax(q K^T / sqrt(d)) V over the cache (+ a split-K reduce past 256 keys)
//   matmul, accumulate        x += attn Wo
//   matmul, swiglu            act = silu(norm(x) Wgate) * (norm(x) Wup)
//   matmul, accumulate        x += act Wdown
// qwen3 decodes with matmul (q, k, v) and attention_decode_fresh (the q/k norms, RoPE and the append inside the
// attention's dispatch: 5; without ContextOptions::fuse_qk_norm qk_norm_rope_kv before attention_decode, 6) instead
// of qkv_rope_append and attention_decode. A layer whose v weight alone differs in type (Q4_K_M) runs
// qkv_rope_append twice, q and k stacked, then v; one whose q/k/v or gate/up weights differ otherwise runs them as
// separate products (+ rope, kv_append or swiglu). A prefill chunk runs the same steps
// over n tokens with the tiled matmul, rope + kv_append and the batched attention_prefill.
void encode(const LayerStep& s) {
  encode_attention(s);
  encode_residual(s, s.L.wo, s.b.attn);
  encode_ffn(s);
  encode_residual(s, s.L.w_down, s.b.act);
}

}  // namespace

const LayerProgram kLlamaLayers{.upload = upload_attention_layer, .encode = encode};

}  // namespace wgllm

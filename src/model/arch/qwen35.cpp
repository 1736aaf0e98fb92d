// qwen35 (Qwen 3.5): gated DeltaNet linear-attention layers (config.is_delta; a recurrent state per value head,
// SequenceState::delta) among full-attention layers whose output is gated per element by sigmoid(norm(x) wgate),
// with per-head q/k norms and NeoX RoPE on part of each head; each followed by the dense SwiGLU FFN, whose norm is
// named post_attention_norm.
#include "gguf/file.h"
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

// attn_q holds, per head, the q rows then the gate rows: the q halves go where upload_attention puts attn_q (stacked
// with k and v when the three share a type), the gate halves into wgate.
void upload_gated_attention(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& b) {
  L.attn_norm = up.norm(b + "attn_norm.weight");
  const GgufTensor& tq = up.f.tensor(b + "attn_q.weight");
  const std::vector<uint8_t> q = up.alternate_runs(tq, c.head_dim, 0), gate = up.alternate_runs(tq, c.head_dim, 1);
  const std::string k = b + "attn_k.weight", v = b + "attn_v.weight";
  const GgufTensor &tk = up.f.tensor(k), &tv = up.f.tensor(v);
  if (tk.type == tq.type && tv.type == tq.type) {
    const std::span<const uint8_t> parts[] = {q, up.data(tk), up.data(tv)};
    L.wqkv = kernels::upload_weight(up.ctx, tq.type, c.n_embd, c.q_dim() + 2 * uint64_t(c.kv_dim()),
                                    kernels::concat_rows(parts), b + "attn_qkv");
    up.advance(tk);
    up.advance(tv);
  } else {
    L.wq = kernels::upload_weight(up.ctx, tq.type, c.n_embd, c.q_dim(), q, b + "attn_q");
    L.wk = up.matrix(k);
    L.wv = up.matrix(v);
  }
  L.wgate = kernels::upload_weight(up.ctx, tq.type, c.n_embd, c.q_dim(), gate, b + "attn_gate");
  up.advance(tq);
  L.q_norm = up.vector(b + "attn_q_norm.weight");
  L.k_norm = up.vector(b + "attn_k_norm.weight");
  L.wo = up.matrix(b + "attn_output.weight");
}

void upload_delta(Uploader& up, GpuLayer& L, const std::string& b) {
  L.attn_norm = up.norm(b + "attn_norm.weight");
  const std::string qkv = b + "attn_qkv.weight", z = b + "attn_gate.weight", alpha = b + "ssm_alpha.weight",
                    beta = b + "ssm_beta.weight";
  if (up.fusable({qkv, z, alpha, beta})) {
    L.ssm_in = up.stacked({qkv, z, alpha, beta}, b + "ssm_in");
  } else if (up.fusable({z, alpha, beta})) {
    L.ssm_qkv = up.matrix(qkv);
    L.ssm_zab = up.stacked({z, alpha, beta}, b + "ssm_zab");
  } else {
    L.ssm_qkv = up.matrix(qkv);
    L.ssm_z = up.matrix(z);
    L.ssm_alpha = up.matrix(alpha);
    L.ssm_beta = up.matrix(beta);
  }
  L.ssm_conv = up.vector(b + "ssm_conv1d.weight");
  L.ssm_consts = up.stacked_vector({b + "ssm_dt.bias", b + "ssm_a"}, b + "ssm_consts");
  L.ssm_norm = up.norm(b + "ssm_norm.weight");
  L.ssm_out = up.matrix(b + "ssm_out.weight");
}

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  const std::string b = layer_prefix(layer);
  GpuLayer L;
  if (c.is_delta(layer))
    upload_delta(up, L, b);
  else
    upload_gated_attention(up, c, L, b);
  upload_ffn(up, c, L, b);
  return L;
}

// A decode step (n = 1) of a DeltaNet layer runs 3 dispatches:
//   matmul, 3 outputs         q/k/v, z, alpha|beta = norm(x) (attn_qkv, attn_gate, ssm_alpha|ssm_beta) stacked
//   delta_step_norm           q, k, v = silu(conv(q/k/v)) over the conv ring, q and k L2-normalised; o = the gated
//                             delta rule over the recurrent state (read one buffer, write the other); y = norm(o) *
//                             ssm_norm * silu(z) per value head (one workgroup per head; where a head does not fit
//                             one, delta_step and a gated rms_norm: 4 dispatches)
//   matmul, accumulate        x += y ssm_out
// (Where attn_qkv's type differs from the others', as in Q4_K_M's Q6_K layers: two products, attn_qkv and the other
// three stacked; four where those differ too. A prefill chunk runs delta_conv, then delta_rule, over its tokens, then
// the gated rms_norm.) An attention layer runs qwen3's 5
// (products, attention_decode_fresh, x += attn Wo) plus the gate's product, the sigmoid in its epilogue (6). Then the
// FFN's 2.
void encode(const LayerStep& s) {
  if (s.model.config.is_delta(s.layer)) {
    encode_delta_net(s);
    encode_residual(s, s.L.ssm_out, s.b.delta_y);
  } else {
    encode_attention(s);
    encode_attention_gate(s);
    encode_residual(s, s.L.wo, s.b.act);
  }
  encode_ffn(s);
  encode_residual(s, s.L.w_down, s.b.act);
}

}  // namespace

const LayerProgram kQwen35Layers{.upload = upload, .encode = encode};

}  // namespace wgllm

// lfm2 and lfm2moe: gated short-convolution layers (config.is_conv) among attention layers with per-head q/k norms,
// each followed by the FFN: dense, or from layer n_dense_lead on lfm2moe's mixture of experts (sigmoid gating with a
// selection bias, config.is_moe_layer). A convolution layer's state is its ring of conv rows (SequenceState::conv);
// the operator norm is attn_norm, folded into in_proj.
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  const std::string b = layer_prefix(layer);
  GpuLayer L;
  if (c.is_conv(layer))
    upload_conv(up, L, b);
  else
    upload_attention(up, c, L, b);
  upload_layer_ffn(up, c, L, layer);
  return L;
}

// A decode step (n = 1) of a convolution layer runs in_proj (the norm folded in), the short convolution over the
// conv state and out_proj added to x (3 dispatches), then the FFN's 2; an attention layer runs the q/k/v product,
// the attention with the q/k norms, RoPE and append (attention_decode_fresh) and Wo, then the FFN (5); a mixture of
// experts' FFN runs 5 (blocks.h encode_moe_ffn).
void encode(const LayerStep& s) {
  if (s.model.config.is_conv(s.layer)) {
    encode_conv(s);
    encode_residual(s, s.L.out_proj, s.b.conv_y);
  } else {
    encode_attention(s);
    encode_residual(s, s.L.wo, s.b.attn);
  }
  encode_layer_ffn(s);
}

}  // namespace

const LayerProgram kLfm2Layers{.upload = upload, .encode = encode};

}  // namespace wgllm

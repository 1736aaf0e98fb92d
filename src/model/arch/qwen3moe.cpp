// qwen3moe: qwen3's attention (per-head q/k norm, NeoX RoPE) and, in every layer, a mixture of experts in place of
// the FFN (blocks.h encode_moe_ffn: the router's softmax, its top n_expert_used renormalised, the chosen experts'
// SwiGLU FFNs added with those weights), as llama.cpp's src/models/qwen3moe.cpp.
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  const std::string b = layer_prefix(layer);
  GpuLayer L;
  upload_attention(up, c, L, b);
  upload_layer_ffn(up, c, L, layer);  // dense below leading_dense_block_count (0 in the released files)
  return L;
}

// A decode step (n = 1) runs qwen3's attention (the q/k/v product, the attention with the q/k norms, RoPE and
// append, Wo: 3 dispatches), then the router product, the routing, the experts' gate/up and down products and their weighted sum
// added to x (5).
void encode(const LayerStep& s) {
  encode_attention(s);
  encode_residual(s, s.L.wo, s.b.attn);
  encode_layer_ffn(s);
}

}  // namespace

const LayerProgram kQwen3MoeLayers{.upload = upload, .encode = encode};

}  // namespace wgllm

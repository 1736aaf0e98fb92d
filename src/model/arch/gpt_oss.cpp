// gpt-oss (OpenAI's open-weight mixtures of experts), as llama.cpp's src/models/openai-moe.cpp: attention with
// biases on q, k, v and the output, a learned sink logit per head in every softmax, sliding-window layers every
// other one (from layer 0); every FFN a mixture of experts whose router and expert products carry biases, the
// softmax taken over the top k logits (equal to the renormalised top k of the full softmax), the experts' gate
// activation the clamped SwiGLU (FfnAct::SwigluOai); YaRN RoPE on every layer. All of it is in the config
// (read_gpt_oss in model/config.cpp) and the shared blocks; this program adds the output projection's bias.
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/load.h"

namespace wgllm {

namespace {

GpuLayer upload(Uploader& up, const ModelConfig& c, uint32_t layer) {
  GpuLayer L;
  upload_attention(up, c, L, layer_prefix(layer));  // with attn_output.bias and attn_sinks.weight
  upload_layer_ffn(up, c, L, layer);                // the FFN's norm is post_attention_norm
  return L;
}

// A decode step (n = 1): the q/k/v product with RoPE and the KV append (1 dispatch), the attention with the sinks,
// Wo + bias into x (1), then the mixture of experts: the router product, the routing, the experts' gate/up and down
// products and their weighted sum into x (5).
void encode(const LayerStep& s) {
  encode_attention(s);
  encode_residual(s, s.L.wo, s.b.attn, &s.L.bo);
  encode_layer_ffn(s);
}

}  // namespace

const LayerProgram kGptOssLayers{.upload = upload, .encode = encode};

}  // namespace wgllm

// Hyper-parameters of a decoder-only transformer, read from GGUF metadata (config.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace wgllm {

class GgufFile;

// The RoPE variants and llama3 scaling are the RoPE kernel's (kernels/rope.h).
using kernels::RopeScaling;
using kernels::RopeType;

enum class Arch { Llama, Qwen2, Qwen3, Qwen3Moe, Gemma3, Lfm2, Lfm2Moe, GptOss, Qwen35, Gemma4 };
// The feed-forward gate's activation, act(x Wgate) * (x Wup): silu, gelu_tanh or gpt-oss's clamped SwiGLU
// (kernels/swiglu.h).
using FfnAct = kernels::GateAct;
struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // as in general.architecture
  uint32_t n_vocab = 0;
  uint32_t n_embd = 0;  // model width
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;     // attention.key_length, default n_embd / n_head
  uint32_t n_ff = 0;         // feed-forward hidden size
  uint32_t n_ctx_train = 0;  // context_length
  float rms_eps = 1e-5f;
  float rope_base = 10000.f;
  uint32_t rope_dim = 0;  // rope.dimension_count (default head_dim)
  RopeType rope_type = RopeType::Normal;
  RopeScaling rope_scaling;
  RopeScaling rope_scaling_swa;  // the local (sliding-window) layers': none (gemma3), or rope_scaling (gpt-oss)
  bool qk_norm = false;                // qwen3, gemma3: RMSNorm on each q/k head before RoPE
  bool attn_bias = false;              // qwen2, gpt-oss: biases on q/k/v projections
  bool attn_out_bias = false;          // gpt-oss: a bias on the output projection (attn_output.bias)
  // gpt-oss: a learned logit per query head (attn_sinks.weight, [n_head]) in every row's softmax, a key with no value
  bool attn_sinks = false;
  bool tied_embeddings = false;        // no output.weight: logits use token_embd.weight
  bool has_rope_freqs_tensor = false;  // rope_freqs.weight present (llama.cpp's Llama 3.x: per-pair freq divisors)
  // gemma3
  FfnAct ffn_act = FfnAct::Silu;
  float embd_scale = 1.f;           // the embedding rows are multiplied by it (gemma: sqrt(n_embd), in f32)
  bool post_norms = false;          // RMSNorm of the attention and FFN outputs before each residual add
  float attn_scale = 0.f;           // q.k scale (0: 1 / sqrt(head_dim))
  float final_logit_softcap = 0.f;  // > 0: logits = cap * tanh(logits / cap)
  // Sliding-window attention: local layers see the last `sliding_window` positions (themselves included) and
  // rotate with rope_base_swa; the others are global. swa_layers is empty when no layer is local.
  uint32_t sliding_window = 0;
  float rope_base_swa = 10000.f;
  std::vector<bool> swa_layers;  // [n_layer] or empty
  bool is_swa(uint32_t layer) const { return layer < swa_layers.size() && swa_layers[layer]; }
  uint32_t layer_window(uint32_t layer) const { return is_swa(layer) ? sliding_window : 0; }
  // lfm2: layers whose attention.head_count_kv entry is 0 are gated short convolutions (no attention, no KV cache):
  // in_proj to B, C, x; a causal depthwise convolution of B*x over the last l_cache positions; C times it; out_proj.
  // The output norm is token_embd_norm.weight. conv_layers is empty when no layer is a convolution.
  uint32_t l_cache = 0;           // shortconv.l_cache: the convolution's taps (positions it sees, itself included)
  std::vector<bool> conv_layers;  // [n_layer] or empty
  bool is_conv(uint32_t layer) const { return layer < conv_layers.size() && conv_layers[layer]; }
  // qwen35: most layers are gated DeltaNet linear attention (kernels/delta_net.h), a recurrent state per value head
  // instead of a KV cache: in-projections to q, k, v (attn_qkv, `conv_dim` channels), the gate z (attn_gate) and the
  // per-head decay and update rates (ssm_alpha, ssm_beta); a causal depthwise convolution of q, k, v over the last
  // ssm_conv taps (ssm_conv1d) and silu; the delta rule with q, k L2-normalised; the output RMS-normed per head
  // (ssm_norm) times silu(z); ssm_out. Value head h reads key head h % ssm_k_heads (llama.cpp's converter stores
  // the value heads in that order). The other layers are full attention whose q projection also gives a gate per
  // head: attn_gated. delta_layers is empty when no layer is recurrent.
  std::vector<bool> delta_layers;  // [n_layer] or empty
  uint32_t ssm_conv = 0;           // ssm.conv_kernel: the convolution's taps
  uint32_t ssm_k_heads = 0;        // ssm.group_count: key (and query) heads
  uint32_t ssm_v_heads = 0;        // ssm.time_step_rank: value heads, each with its own state
  uint32_t ssm_dk = 0;             // ssm.state_size: the key head dimension
  uint32_t ssm_dv = 0;             // ssm.inner_size / time_step_rank: the value head dimension
  bool attn_gated = false;         // qwen35: attention output * sigmoid(gate), the gate in attn_q's odd head halves
  bool is_delta(uint32_t layer) const { return layer < delta_layers.size() && delta_layers[layer]; }
  uint32_t delta_conv_dim() const { return 2 * ssm_k_heads * ssm_dk + ssm_v_heads * ssm_dv; }  // q, k, v channels
  // A layer with a KV cache (neither a short convolution nor a recurrent layer).
  bool is_attention(uint32_t layer) const { return !is_conv(layer) && !is_delta(layer); }
  uint32_t n_attention_layers() const;
  // Mixtures of experts (qwen3moe, lfm2moe): the FFN of every layer from n_dense_lead on is n_expert SwiGLU experts
  // of width n_ff_exp (ffn_{gate,up,down}_exps, [n_expert][rows][in]), of which a router (ffn_gate_inp,
  // [n_expert][n_embd]) picks n_expert_used per token: p = softmax (qwen3moe) or sigmoid (lfm2moe) of the router's
  // logits, the n_expert_used largest p (lfm2moe: p + exp_probs_b.bias, the selection bias) kept and their p divided
  // by their sum, the chosen experts' outputs added with those weights. n_expert 0: dense FFNs (n_ff) throughout.
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  uint32_t n_dense_lead = 0;  // leading layers with a dense FFN (lfm2moe: leading_dense_block_count)
  bool moe_sigmoid = false;   // sigmoid gating with a selection bias (expert_gating_func 2)
  // gpt-oss: biases on the router's logits (ffn_gate_inp.bias, [n_expert]) and the experts' products
  // (ffn_{gate,up,down}_exps.bias, [n_expert][rows]). Its router's softmax over the top k equals this renormalisation.
  bool moe_bias = false;
  bool is_moe() const { return n_expert > 0; }
  bool is_moe_layer(uint32_t layer) const { return is_moe() && layer >= n_dense_lead; }
  // gemma4 (read_gemma4): the local layers' heads have their own width and RoPE dims (head_dim and rope_dim are the
  // global layers'), the KV heads and FFN widths may differ per layer, the last layers may attend over an earlier
  // layer's KV cache instead of their own, v heads are RMS-normed without gain (v = k before its norm where a layer
  // has no attn_v), a scalar may scale each layer's output, and per-layer embeddings (PLE) feed every layer a
  // vector of n_embd_per_layer. The *_at(layer) accessors give every architecture's per-layer shapes.
  uint32_t head_dim_swa = 0;               // attention.key_length_swa (0: head_dim)
  uint32_t rope_dim_swa = 0;               // rope.dimension_count_swa (0: rope_dim)
  std::vector<uint32_t> layer_n_head_kv;   // [n_layer] or empty (n_head_kv throughout)
  std::vector<uint32_t> layer_n_ff;        // [n_layer] or empty (n_ff throughout)
  std::vector<uint32_t> layer_kv_source;   // [n_layer] or empty: the layer whose KV cache each layer attends over
  std::vector<bool> layer_v_from_k;        // [n_layer] or empty: no attn_v, v is k (before the k norm and RoPE)
  bool v_norm = false;                     // RMSNorm without gain on each v head
  bool layer_out_scale = false;            // blk.<i>.layer_output_scale.weight ([1]) multiplies the layer's output
  uint32_t n_embd_per_layer = 0;           // embedding_length_per_layer_input (0: no per-layer embeddings)
  uint32_t head_dim_at(uint32_t layer) const { return is_swa(layer) && head_dim_swa ? head_dim_swa : head_dim; }
  uint32_t rope_dim_at(uint32_t layer) const { return is_swa(layer) && rope_dim_swa ? rope_dim_swa : rope_dim; }
  uint32_t n_head_kv_at(uint32_t layer) const {
    return layer < layer_n_head_kv.size() ? layer_n_head_kv[layer] : n_head_kv;
  }
  uint32_t n_ff_at(uint32_t layer) const { return layer < layer_n_ff.size() ? layer_n_ff[layer] : n_ff; }
  uint32_t q_dim_at(uint32_t layer) const { return n_head * head_dim_at(layer); }
  uint32_t kv_dim_at(uint32_t layer) const { return n_head_kv_at(layer) * head_dim_at(layer); }
  uint32_t kv_source(uint32_t layer) const {
    return layer < layer_kv_source.size() ? layer_kv_source[layer] : layer;
  }
  bool owns_kv(uint32_t layer) const { return kv_source(layer) == layer; }
  bool v_from_k(uint32_t layer) const { return layer < layer_v_from_k.size() && layer_v_from_k[layer]; }
  // The widest of the layers' (activation buffers).
  uint32_t max_q_dim() const;
  uint32_t max_kv_dim() const;
  uint32_t max_n_ff() const;
  std::string output_norm_name = "output_norm.weight";
  std::string ffn_norm_name = "ffn_norm.weight";  // the FFN's input norm (gpt-oss: post_attention_norm.weight)
  // One letter per layer: A attention, L local (sliding-window) attention, C short convolution, D gated DeltaNet.
  std::string layer_pattern() const;

  uint32_t q_dim() const { return n_head * head_dim; }
  // The q.k scale of the GPU's attention: attn_scale (0: 1 / sqrt(head_dim)) times the square of YaRN's magnitude
  // scale, which the RoPE tables leave out (q and k are both rotated by it; config_from_gguf refuses YaRN on part
  // of a head). The CPU reference scales the rotation instead.
  float attention_scale() const;
  uint32_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and validates the hyper-parameters of `f` (architectures llama, qwen2, qwen3, qwen3moe, gemma3, lfm2, lfm2moe,
// gpt-oss, qwen35, gemma4) and checks that
// every tensor the forward pass uses is present with the shape the config implies. Throws ModelError naming the key or
// tensor.
ModelConfig config_from_gguf(const GgufFile& f);

const char* arch_name(Arch a);

}  // namespace wgllm

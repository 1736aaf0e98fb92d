// CPU reference forward pass of the decoder (llama / qwen2 / qwen3 / gemma3 / lfm2 / MoE / gpt-oss / qwen35), on the CPU reference ops
// (src/cpu/): the ground truth for the GPU forward (transformer.h). Weights are dequantised to f32; dot products,
// norms, RoPE angles and the softmax are computed in double. Written for clarity, not speed (matrix-vector rows in a
// plain loop, at most two threads).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace wgllm {
class GgufFile;
}

namespace wgllm::cpu {

// Every matrix is row-major [out][in] (GGUF ne = [in, out]): row o holds the weights of output o.
struct CpuLayer {
  std::vector<float> attn_norm;       // [n_embd]
  std::vector<float> wq;              // [q_dim][n_embd]   (llama: rows permuted for adjacent-pair RoPE, as in the file)
  std::vector<float> wk;              // [kv_dim][n_embd]
  std::vector<float> wv;              // [kv_dim][n_embd]
  std::vector<float> bq;              // [q_dim]   qwen2 and gpt-oss (attn_bias); empty otherwise
  std::vector<float> bk;              // [kv_dim]  likewise
  std::vector<float> bv;              // [kv_dim]  likewise
  std::vector<float> q_norm;          // [head_dim] qwen3 / gemma3 (qk_norm), shared by every q head; empty otherwise
  std::vector<float> k_norm;          // [head_dim] qwen3 / gemma3, shared by every k head; empty otherwise
  std::vector<float> wo;              // [n_embd][q_dim]
  std::vector<float> bo;              // [n_embd]  gpt-oss only (attn_out_bias); empty otherwise
  std::vector<float> sinks;           // [n_head]  gpt-oss only (attn_sinks); empty otherwise
  std::vector<float> ffn_norm;        // [n_embd]
  std::vector<float> w_gate;          // [n_ff][n_embd]
  std::vector<float> w_up;            // [n_ff][n_embd]
  std::vector<float> w_down;          // [n_embd][n_ff]
  std::vector<float> post_attn_norm;  // [n_embd] gemma3 (post_norms): the attention output's norm; empty otherwise
  std::vector<float> post_ffn_norm;   // [n_embd] gemma3: the FFN output's norm; empty otherwise
  // gemma4: per-layer embeddings (n_embd_per_layer P > 0) and the output scale (layer_out_scale); empty otherwise.
  // Its shapes are the layer's own (config.*_at); a layer sharing another's KV cache has no wk, wv or k_norm, one
  // whose v is k no wv.
  std::vector<float> inp_gate;        // [P][n_embd]
  std::vector<float> ple_proj;        // [n_embd][P]
  std::vector<float> ple_post_norm;   // [n_embd]
  float out_scale = 1.f;
  // lfm2 short-convolution layers (config.is_conv) have these instead of the attention weights:
  std::vector<float> in_proj;   // [3 n_embd][n_embd]: B, C, x
  std::vector<float> conv;      // [n_embd][l_cache] taps, tap 0 on the oldest position
  std::vector<float> out_proj;  // [n_embd][n_embd]
  // qwen35's attention layers: wq holds the q half of each head of attn_q, wgate the gate half:
  std::vector<float> wgate;  // [q_dim][n_embd]
  // qwen35's DeltaNet layers (config.is_delta) have these instead of the attention weights (W = delta_conv_dim(),
  // VD = v_heads dv, H = v_heads):
  std::vector<float> ssm_qkv;    // [W][n_embd]
  std::vector<float> ssm_z;      // [VD][n_embd]
  std::vector<float> ssm_alpha;  // [H][n_embd]
  std::vector<float> ssm_beta;   // [H][n_embd]
  std::vector<float> ssm_conv;   // [W][ssm_conv] taps, tap 0 on the oldest position
  std::vector<float> ssm_dt;     // [H] dt bias
  std::vector<float> ssm_a;      // [H] -exp(A_log)
  std::vector<float> ssm_norm;   // [dv]
  std::vector<float> ssm_out;    // [n_embd][VD]
  // mixtures of experts (config.is_moe()) have these instead of w_gate, w_up, w_down:
  std::vector<float> router;     // [n_expert][n_embd]
  std::vector<float> exps_gate;  // [n_expert][n_ff_exp][n_embd]
  std::vector<float> exps_up;    // [n_expert][n_ff_exp][n_embd]
  std::vector<float> exps_down;  // [n_expert][n_embd][n_ff_exp]
  std::vector<float> exp_probs_b;  // [n_expert] selection bias (sigmoid gating); empty otherwise
  // gpt-oss (moe_bias): [n_expert], [n_expert][n_ff_exp] x 2, [n_expert][n_embd]; empty otherwise
  std::vector<float> router_b, exps_gate_b, exps_up_b, exps_down_b;
};

struct CpuWeights {
  std::vector<float> token_embd;   // [n_vocab][n_embd]: row t is the embedding of token t
  std::vector<CpuLayer> layers;    // [n_layer]
  std::vector<float> output_norm;  // [n_embd]
  std::vector<float> output;       // [n_vocab][n_embd]; empty when tied (logits use token_embd)
  std::vector<float> rope_freqs;   // [rope_dim / 2] frequency divisors (rope_freqs.weight); empty when absent
  // gemma4 per-layer embeddings (P = n_embd_per_layer > 0; empty otherwise)
  std::vector<float> per_layer_token_embd;  // [n_vocab][n_layer P]
  std::vector<float> per_layer_model_proj;  // [n_layer P][n_embd]
  std::vector<float> per_layer_proj_norm;   // [P]
};

struct CpuModel {
  ModelConfig config;
  CpuWeights weights;
};

// Reads the config and dequantises every weight of `f` (any type wgllm runs: dequantize_row) to f32.
// Throws ModelError for a file config_from_gguf rejects.
CpuModel load_cpu_model(const GgufFile& f);

// RoPE inverse frequencies [rope_dim / 2] in double: base^(-2i / rope_dim), divided by rope_freqs[i] when the model
// has that tensor (llama.cpp's llama3 factors), else with the config's llama3 or YaRN scaling when enabled.
std::vector<double> rope_inv_freq(const ModelConfig& c, std::span<const float> rope_freqs);

// Rotates `x` ([n_heads][head_dim], one token at position `pos`) in place: the first rope_dim dims of each head,
// adjacent pairs (Normal) or pairs (i, i + rope_dim/2) (Neox); with YaRN, scaled by its magnitude factor
// attn_factor * (1 + 0.1 ln factor) as llama.cpp's rope does.
void apply_rope(std::span<float> x, uint32_t n_heads, const ModelConfig& c, std::span<const double> inv_freq,
                uint32_t pos);

// One sequence with its own KV cache. The model must outlive the session.
class CpuSession {
 public:
  // n_ctx: the most tokens the cache holds (0: the model's training context).
  explicit CpuSession(const CpuModel& model, uint32_t n_ctx = 0);

  // Runs `tokens` after the ones already in the cache (appending theirs) and returns the logits [n_vocab] of the
  // last one. Throws InvalidArgument for no tokens, an id outside the vocabulary or a full context.
  std::vector<float> forward(std::span<const int32_t> tokens);
  // As forward, but returns the logits of every token: [tokens.size()][n_vocab].
  std::vector<std::vector<float>> forward_all(std::span<const int32_t> tokens);

  uint32_t n_past() const { return n_past_; }
  uint32_t n_ctx() const { return n_ctx_; }
  // Empties the KV cache (and the convolution history).
  void reset();
  // Keeps the first n positions (n <= n_past): the state is what feeding those n tokens gives.
  void truncate(uint32_t n);

 private:
  std::vector<std::vector<float>> run(std::span<const int32_t> tokens, bool all_logits);

  const CpuModel* model_;
  uint32_t n_ctx_;
  uint32_t n_past_ = 0;
  std::vector<double> inv_freq_;             // [rope_dim / 2]
  ModelConfig swa_config_;                   // the config with the local layers' RoPE base and scaling
  std::vector<double> inv_freq_swa_;         // [rope_dim / 2] local (sliding-window) layers: rope_base_swa
  std::vector<std::vector<float>> k_cache_;  // [n_layer] of [n_past][kv_dim] (after RoPE; empty where shared)
  std::vector<std::vector<float>> v_cache_;  // [n_layer] of [n_past][kv_dim]
  std::vector<std::vector<float>> bx_;       // [n_layer] of [n_past][n_embd]: B*x of the convolution layers
                                             // (qwen35: [n_past][W], the DeltaNet layers' in-projection rows)
  std::vector<std::vector<double>> delta_;   // [n_layer] of [v_heads][dk][dv]: the DeltaNet layers' states
  std::vector<int32_t> tokens_;              // the tokens fed (a recurrent state rewinds by feeding them again)
};

}  // namespace wgllm::cpu

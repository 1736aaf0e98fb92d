// CPU ground truth for the forward-pass kernels (float64 accumulation). Weights are GGUF bytes,
// dequantised here independently of the GPU repacking.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gguf/types.h"

namespace wgllm::cpu {

// Row `row` of a GGUF [ne1][ne0] tensor of type t, as f32.
std::vector<float> dequantize_row(GgufType t, std::span<const uint8_t> bytes, uint64_t ne0, uint64_t row);

// y[t][o] = sum_i x[t][i] * W[o][i] (+ bias[o]); x: [n_tokens][ne0], W: GGUF [ne1][ne0].
std::vector<float> matmul(GgufType t, std::span<const uint8_t> w, uint64_t ne0, uint64_t ne1, std::span<const float> x,
                          uint32_t n_tokens, std::span<const float> bias = {});

// out[t] = row ids[t] of the table (zeros for ids >= ne1).
std::vector<float> embedding(GgufType t, std::span<const uint8_t> table, uint64_t ne0, uint64_t ne1,
                             std::span<const uint32_t> ids);

// y = x / sqrt(mean(x^2) + eps) * w over rows of `dim`.
std::vector<float> rms_norm(std::span<const float> x, std::span<const float> w, uint32_t n_rows, uint32_t dim,
                            float eps);

// RoPE in double: x is [n_tokens][n_heads][head_dim]; position start_pos + t; the first
// rope_dim dims of each head rotate, pairs (2i, 2i+1) or (i, i + rope_dim/2) when neox, by
// angle pos * base^(-2i/rope_dim) / freq_factors[i] (factors optional).
std::vector<float> rope(std::span<const float> x, uint32_t n_tokens, uint32_t n_heads, uint32_t head_dim,
                        uint32_t rope_dim, uint32_t start_pos, double base, bool neox,
                        std::span<const float> freq_factors = {});

// silu(gate) * up.
std::vector<float> swiglu(std::span<const float> gate, std::span<const float> up);
// gelu_tanh(gate) * up, gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3))) (GeGLU, gemma).
std::vector<float> geglu(std::span<const float> gate, std::span<const float> up);
// gpt-oss's clamped SwiGLU: g = min(gate, 7), g sigmoid(1.702 g) (clamp(up, -7, 7) + 1) (llama.cpp's swiglu_oai).
std::vector<float> swiglu_oai(std::span<const float> gate, std::span<const float> up);
// The gated activation by kind (kernels::GateAct as its value: 0 silu, 1 gelu_tanh, 2 gpt-oss's, 3 sigmoid(gate) * up).
std::vector<float> gated(uint32_t act, std::span<const float> gate, std::span<const float> up);

// A mixture of experts' routing of one token (kernels/moe.h): p = softmax(logits) in double, the n_used largest
// logits' experts in order (ties: the lower expert first) and their p, divided by their sum when normalize. With
// sigmoid_bias (non-empty: lfm2moe), p = sigmoid(logits), ranked by p + sigmoid_bias, the sum clamped to >= 2^-14.
struct MoeRoute {
  std::vector<uint32_t> experts;
  std::vector<double> weights;
};
MoeRoute moe_route(std::span<const float> logits, uint32_t n_used, bool normalize,
                   std::span<const float> sigmoid_bias = {});

// The gated short convolution of LFM2 between its two projections, for n tokens of width E with L taps:
// bcx [n][3E] is the in_proj output (B, C and x, E each), taps [E][L] (GGUF ne = [L, E]), prev [L-1][E] the B*x rows of
// the L-1 positions before the first token, oldest first (zeros before position 0). With bx(t) = B(t) * x(t):
//   y[t][c] = C(t)[c] * sum_k taps[c][k] * bx(t - (L-1) + k)[c]     (tap 0 meets the oldest position)
// in double. Returns y [n][E]; *next_prev (optional) receives the L-1 rows the next token needs.
std::vector<float> shortconv(std::span<const float> bcx, std::span<const float> taps, std::span<const float> prev,
                             uint32_t n, uint32_t E, uint32_t L, std::vector<float>* next_prev = nullptr);

}  // namespace wgllm::cpu

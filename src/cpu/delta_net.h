// CPU ground truth, in double, of the gated DeltaNet layer's kernels (kernels/delta_net.h; qwen35): the causal
// convolution of q, k, v with silu, and the gated delta rule over one sequence's recurrent state.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace wgllm::cpu {

// y[t][c] = silu(sum_k taps[c][k] * x(t - (L-1) + k)[c]) for n tokens of C channels with L taps; x [n][C], taps
// [C][L] (tap 0 meets the oldest position), prev [L-1][C] the rows of the L-1 positions before the first token,
// oldest first (zeros before position 0). Returns y [n][C].
std::vector<float> conv_silu(std::span<const float> x, std::span<const float> taps, std::span<const float> prev,
                             uint32_t n, uint32_t C, uint32_t L);

// In place on qkv [n][width] (q then k heads at the start of each row, k_heads of dk each): every q and k head
// divided by sqrt(|x|^2 + eps), q also by sqrt(dk) (Qwen 3.5's L2 norm of q and k and its q scale), in double.
void normalize_qk(std::span<float> qkv, uint32_t n, uint32_t width, uint32_t k_heads, uint32_t dk, float eps);

// The gated delta rule (Qwen 3.5's linear attention) for n tokens, value head h reading key head h % k_heads.
// qkv [n][2 k_heads dk + v_heads dv]: q, k (normalised: normalize_qk), v. alpha, beta [n][v_heads]: the raw
// projections; dt_bias, a [v_heads] (a = -exp(A_log), as the GGUF stores it). Per token and value head:
//   g = exp(a softplus(alpha + dt_bias)),  b = sigmoid(beta)
//   S = g S;  S += k (b (v - S^T k))^T;  o = S^T q          (S [dk][dv], the head's state)
// state [v_heads][dk][dv] is read and left updated. Returns o [n][v_heads][dv].
struct DeltaRuleRef {
  uint32_t n_tokens = 0, k_heads = 0, v_heads = 0, dk = 0, dv = 0;
};
std::vector<float> delta_rule(const DeltaRuleRef& s, std::span<const float> qkv, std::span<const float> alpha,
                              std::span<const float> beta, std::span<const float> dt_bias, std::span<const float> a,
                              std::span<double> state);

// The same rule a chunk of `chunk` tokens at a time in the WY / UT form, the recurrence inside a chunk turned into
// small matrix products (what a chunked prefill kernel computes; delta_rule gives the same up to rounding). Per value
// head, with S0 the state before the chunk, G_i = sum_{m <= i} log g_m over the chunk's tokens so far:
//   A_ij = b_i e^(G_i - G_j) k_i.k_j (j < i),  U = (I + A)^-1 (b (V - e^G (K S0)))     [rows u_i: C x dv]
//   o_i = e^(G_i) S0^T q_i + sum_{j <= i} e^(G_i - G_j) (q_i.k_j) u_j
//   S = e^(G_last) S0 + sum_j e^(G_last - G_j) k_j u_j^T
// Every factor e^(G_i - G_j), j <= i, is at most 1, so no 1 / g is formed. (I + A)^-1 is unit lower triangular, here
// solved by forward substitution.
std::vector<float> delta_rule_chunked(const DeltaRuleRef& s, std::span<const float> qkv, std::span<const float> alpha,
                                      std::span<const float> beta, std::span<const float> dt_bias,
                                      std::span<const float> a, std::span<double> state, uint32_t chunk);

}  // namespace wgllm::cpu

#include "cpu/delta_net.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "wgllm/error.h"

namespace wgllm::cpu {

std::vector<float> conv_silu(std::span<const float> x, std::span<const float> taps, std::span<const float> prev,
                             uint32_t n, uint32_t C, uint32_t L) {
  if (L < 1 || x.size() != size_t(n) * C || taps.size() != size_t(C) * L || prev.size() != size_t(L - 1) * C)
    throw InvalidArgument("cpu::conv_silu: sizes disagree with n, C, L");
  std::vector<float> y(size_t(n) * C);
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t c = 0; c < C; ++c) {
      double acc = 0;
      for (uint32_t k = 0; k < L; ++k) {
        const int64_t r = int64_t(t) + k - (L - 1);  // row of this call (>= 0) or of prev
        const double v = r >= 0 ? x[size_t(r) * C + c] : prev[size_t(int64_t(L - 1) + r) * C + c];
        acc += double(taps[size_t(c) * L + k]) * v;
      }
      y[size_t(t) * C + c] = float(acc / (1 + std::exp(-acc)));
    }
  return y;
}

void normalize_qk(std::span<float> qkv, uint32_t n, uint32_t width, uint32_t k_heads, uint32_t dk, float eps) {
  if (qkv.size() != size_t(n) * width || 2ull * k_heads * dk > width)
    throw InvalidArgument("cpu::normalize_qk: sizes disagree with n, width, k_heads, dk");
  for (size_t t = 0; t < n; ++t)
    for (size_t head = 0; head < 2 * k_heads; ++head) {
      float* x = qkv.data() + t * width + head * dk;
      double ss = 0;
      for (size_t j = 0; j < dk; ++j) ss += double(x[j]) * x[j];
      const double scale = 1 / std::sqrt(ss + eps) / (head < k_heads ? std::sqrt(double(dk)) : 1.0);
      for (size_t j = 0; j < dk; ++j) x[j] = float(x[j] * scale);
    }
}

std::vector<float> delta_rule(const DeltaRuleRef& s, std::span<const float> qkv, std::span<const float> alpha,
                              std::span<const float> beta, std::span<const float> dt_bias, std::span<const float> a,
                              std::span<double> state) {
  const size_t K = s.k_heads, H = s.v_heads, DK = s.dk, DV = s.dv, W = 2 * K * DK + H * DV;
  if (K == 0 || H % K != 0 || qkv.size() != s.n_tokens * W || alpha.size() != s.n_tokens * H ||
      beta.size() != s.n_tokens * H || dt_bias.size() != H || a.size() != H || state.size() != H * DK * DV)
    throw InvalidArgument("cpu::delta_rule: sizes disagree with the shape");
  std::vector<float> o(s.n_tokens * H * DV);
  std::vector<double> q(DK), k(DK), kv(DV);
  for (size_t t = 0; t < s.n_tokens; ++t) {
    const float* row = qkv.data() + t * W;
    for (size_t h = 0; h < H; ++h) {
      const size_t kh = h % K;
      for (size_t j = 0; j < DK; ++j) {
        q[j] = row[kh * DK + j];
        k[j] = row[K * DK + kh * DK + j];
      }
      const double x = double(alpha[t * H + h]) + dt_bias[h];
      const double softplus = x > 20 ? x : std::log1p(std::exp(x));
      const double g = std::exp(double(a[h]) * softplus), b = 1 / (1 + std::exp(-double(beta[t * H + h])));
      double* S = state.data() + h * DK * DV;  // S[j][v]
      for (size_t v = 0; v < DV; ++v) {
        double acc = 0;
        for (size_t j = 0; j < DK; ++j) acc += S[j * DV + v] * k[j];
        kv[v] = g * acc;
      }
      const float* vv = row + 2 * K * DK + h * DV;
      for (size_t v = 0; v < DV; ++v) {
        const double delta = b * (double(vv[v]) - kv[v]);
        double acc = 0;
        for (size_t j = 0; j < DK; ++j) {
          double& e = S[j * DV + v];
          e = g * e + k[j] * delta;
          acc += e * q[j];
        }
        o[(t * H + h) * DV + v] = float(acc);
      }
    }
  }
  return o;
}

std::vector<float> delta_rule_chunked(const DeltaRuleRef& s, std::span<const float> qkv, std::span<const float> alpha,
                                      std::span<const float> beta, std::span<const float> dt_bias,
                                      std::span<const float> a, std::span<double> state, uint32_t chunk) {
  const size_t K = s.k_heads, H = s.v_heads, DK = s.dk, DV = s.dv, W = 2 * K * DK + H * DV;
  if (K == 0 || H % K != 0 || qkv.size() != s.n_tokens * W || alpha.size() != s.n_tokens * H ||
      beta.size() != s.n_tokens * H || dt_bias.size() != H || a.size() != H || state.size() != H * DK * DV)
    throw InvalidArgument("cpu::delta_rule_chunked: sizes disagree with the shape");
  if (chunk == 0) throw InvalidArgument("cpu::delta_rule_chunked: chunk must be >= 1");
  std::vector<float> o(s.n_tokens * H * DV);
  for (size_t t0 = 0; t0 < s.n_tokens; t0 += chunk) {
    const size_t C = std::min<size_t>(chunk, s.n_tokens - t0);
    for (size_t h = 0; h < H; ++h) {
      const size_t kh = h % K;
      // The chunk's q, k [C][DK], v [C][DV], b and G [C].
      std::vector<double> q(C * DK), k(C * DK), v(C * DV), b(C), G(C);
      double g_sum = 0;
      for (size_t i = 0; i < C; ++i) {
        const size_t t = t0 + i;
        const float* row = qkv.data() + t * W;
        for (size_t j = 0; j < DK; ++j) {
          q[i * DK + j] = row[kh * DK + j];
          k[i * DK + j] = row[K * DK + kh * DK + j];
        }
        for (size_t c = 0; c < DV; ++c) v[i * DV + c] = row[2 * K * DK + h * DV + c];
        const double x = double(alpha[t * H + h]) + dt_bias[h];
        const double softplus = x > 20 ? x : std::log1p(std::exp(x));
        g_sum += double(a[h]) * softplus;
        G[i] = g_sum;
        b[i] = 1 / (1 + std::exp(-double(beta[t * H + h])));
      }
      auto dot_k = [&](const std::vector<double>& x, size_t i, size_t j) {
        double acc = 0;
        for (size_t d = 0; d < DK; ++d) acc += x[i * DK + d] * k[j * DK + d];
        return acc;
      };
      double* S0 = state.data() + h * DK * DV;  // S0[d][c]
      // u_i = b_i (v_i - e^(G_i) S0^T k_i) - sum_{j < i} A_ij u_j
      std::vector<double> u(C * DV);
      for (size_t i = 0; i < C; ++i)
        for (size_t c = 0; c < DV; ++c) {
          double sk = 0;
          for (size_t d = 0; d < DK; ++d) sk += S0[d * DV + c] * k[i * DK + d];
          double r = b[i] * (v[i * DV + c] - std::exp(G[i]) * sk);
          for (size_t j = 0; j < i; ++j) r -= b[i] * std::exp(G[i] - G[j]) * dot_k(k, i, j) * u[j * DV + c];
          u[i * DV + c] = r;
        }
      for (size_t i = 0; i < C; ++i)
        for (size_t c = 0; c < DV; ++c) {
          double sq = 0;
          for (size_t d = 0; d < DK; ++d) sq += S0[d * DV + c] * q[i * DK + d];
          double acc = std::exp(G[i]) * sq;
          for (size_t j = 0; j <= i; ++j) acc += std::exp(G[i] - G[j]) * dot_k(q, i, j) * u[j * DV + c];
          o[((t0 + i) * H + h) * DV + c] = float(acc);
        }
      const double last = G[C - 1];
      for (size_t d = 0; d < DK; ++d)
        for (size_t c = 0; c < DV; ++c) {
          double e = std::exp(last) * S0[d * DV + c];
          for (size_t j = 0; j < C; ++j) e += std::exp(last - G[j]) * k[j * DK + d] * u[j * DV + c];
          S0[d * DV + c] = e;
        }
    }
  }
  return o;
}

}  // namespace wgllm::cpu

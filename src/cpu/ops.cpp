#include "cpu/ops.h"

#include <algorithm>

#include <cmath>
#include <cstring>

#include "gguf/dequant.h"
#include "wgllm/error.h"

namespace wgllm::cpu {

std::vector<float> dequantize_row(GgufType t, std::span<const uint8_t> bytes, uint64_t ne0, uint64_t row) {
  std::vector<float> out(ne0);
  const uint64_t row_bytes = tensor_bytes(t, ne0);
  wgllm::dequantize_row(t, bytes.data() + row * row_bytes, out.data(), ne0);
  return out;
}

std::vector<float> matmul(GgufType t, std::span<const uint8_t> w, uint64_t ne0, uint64_t ne1, std::span<const float> x,
                          uint32_t n_tokens, std::span<const float> bias) {
  std::vector<float> y(size_t(n_tokens) * ne1);
  for (uint64_t o = 0; o < ne1; ++o) {
    const auto row = dequantize_row(t, w, ne0, o);
    for (uint32_t tk = 0; tk < n_tokens; ++tk) {
      double acc = bias.empty() ? 0.0 : double(bias[o]);
      const float* xr = &x[size_t(tk) * ne0];
      for (uint64_t i = 0; i < ne0; ++i) acc += double(xr[i]) * double(row[i]);
      y[size_t(tk) * ne1 + o] = float(acc);
    }
  }
  return y;
}

std::vector<float> embedding(GgufType t, std::span<const uint8_t> table, uint64_t ne0, uint64_t ne1,
                             std::span<const uint32_t> ids) {
  std::vector<float> out(ids.size() * ne0, 0.f);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= ne1) continue;
    const auto row = dequantize_row(t, table, ne0, ids[i]);
    std::copy(row.begin(), row.end(), out.begin() + i * ne0);
  }
  return out;
}

std::vector<float> rms_norm(std::span<const float> x, std::span<const float> w, uint32_t n_rows, uint32_t dim,
                            float eps) {
  std::vector<float> y(size_t(n_rows) * dim);
  for (uint32_t r = 0; r < n_rows; ++r) {
    const float* xr = &x[size_t(r) * dim];
    double ss = 0;
    for (uint32_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / dim + double(eps));
    for (uint32_t i = 0; i < dim; ++i) y[size_t(r) * dim + i] = float(double(xr[i]) * inv * double(w[i]));
  }
  return y;
}

std::vector<float> rope(std::span<const float> x, uint32_t n_tokens, uint32_t n_heads, uint32_t head_dim,
                        uint32_t rope_dim, uint32_t start_pos, double base, bool neox,
                        std::span<const float> freq_factors) {
  std::vector<float> y(x.begin(), x.end());
  const uint32_t half = rope_dim / 2;
  for (uint32_t t = 0; t < n_tokens; ++t) {
    const double pos = double(start_pos) + t;
    for (uint32_t h = 0; h < n_heads; ++h) {
      const size_t b = (size_t(t) * n_heads + h) * head_dim;
      for (uint32_t i = 0; i < half; ++i) {
        double freq = std::pow(base, -2.0 * i / rope_dim);
        if (!freq_factors.empty()) freq /= double(freq_factors[i]);
        const double a = pos * freq, c = std::cos(a), s = std::sin(a);
        const size_t i0 = neox ? b + i : b + 2 * i, i1 = neox ? b + i + half : b + 2 * i + 1;
        const double x0 = x[i0], x1 = x[i1];
        y[i0] = float(x0 * c - x1 * s);
        y[i1] = float(x0 * s + x1 * c);
      }
    }
  }
  return y;
}

std::vector<float> swiglu(std::span<const float> gate, std::span<const float> up) {
  std::vector<float> y(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    y[i] = float(g / (1.0 + std::exp(-g)) * double(up[i]));
  }
  return y;
}

MoeRoute moe_route(std::span<const float> logits, uint32_t n_used, bool normalize,
                   std::span<const float> sigmoid_bias) {
  const bool sigmoid = !sigmoid_bias.empty();
  std::vector<double> p(logits.size()), rank_by(logits.size());
  double mx = -INFINITY, sum = 0;
  for (float z : logits) mx = std::max(mx, double(z));
  for (float z : logits) sum += std::exp(double(z) - mx);
  for (size_t e = 0; e < logits.size(); ++e) {
    p[e] = sigmoid ? 1.0 / (1.0 + std::exp(-double(logits[e]))) : std::exp(double(logits[e]) - mx) / sum;
    rank_by[e] = sigmoid ? p[e] + double(sigmoid_bias[e]) : double(logits[e]);
  }
  std::vector<uint32_t> order(logits.size());
  for (uint32_t e = 0; e < order.size(); ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return rank_by[a] > rank_by[b]; });
  MoeRoute r;
  double top = 0;
  for (uint32_t i = 0; i < n_used && i < order.size(); ++i) {
    r.experts.push_back(order[i]);
    r.weights.push_back(p[order[i]]);
    top += r.weights.back();
  }
  if (normalize)
    for (double& w : r.weights) w /= sigmoid ? std::max(top, 6.103515625e-5) : top;
  return r;
}

std::vector<float> geglu(std::span<const float> gate, std::span<const float> up) {
  std::vector<float> y(gate.size());
  const double c = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    y[i] = float(0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * double(up[i]));
  }
  return y;
}

std::vector<float> swiglu_oai(std::span<const float> gate, std::span<const float> up) {
  std::vector<float> y(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = std::min(double(gate[i]), 7.0), u = std::clamp(double(up[i]), -7.0, 7.0);
    y[i] = float(g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0));
  }
  return y;
}

std::vector<float> gated(uint32_t act, std::span<const float> gate, std::span<const float> up) {
  switch (act) {
    case 0: return swiglu(gate, up);
    case 1: return geglu(gate, up);
    case 2: return swiglu_oai(gate, up);
    case 3: {
      std::vector<float> y(gate.size());
      for (size_t i = 0; i < gate.size(); ++i) y[i] = float(double(up[i]) / (1.0 + std::exp(-double(gate[i]))));
      return y;
    }
  }
  throw InvalidArgument("cpu::gated: unknown activation " + std::to_string(act));
}

std::vector<float> shortconv(std::span<const float> bcx, std::span<const float> taps, std::span<const float> prev,
                             uint32_t n, uint32_t E, uint32_t L, std::vector<float>* next_prev) {
  if (L < 1 || bcx.size() != size_t(n) * 3 * E || taps.size() != size_t(E) * L || prev.size() != size_t(L - 1) * E)
    throw InvalidArgument("cpu::shortconv: sizes disagree with n, E, L");
  // Rows of B*x: the L-1 before the tokens, then the tokens'.
  std::vector<double> bx(size_t(L - 1 + n) * E);
  for (size_t i = 0; i < prev.size(); ++i) bx[i] = prev[i];
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t c = 0; c < E; ++c)
      bx[size_t(L - 1 + t) * E + c] = double(bcx[size_t(t) * 3 * E + c]) * double(bcx[size_t(t) * 3 * E + 2 * E + c]);
  std::vector<float> y(size_t(n) * E);
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t c = 0; c < E; ++c) {
      double acc = 0;
      for (uint32_t k = 0; k < L; ++k) acc += double(taps[size_t(c) * L + k]) * bx[size_t(t + k) * E + c];
      y[size_t(t) * E + c] = float(double(bcx[size_t(t) * 3 * E + E + c]) * acc);
    }
  if (next_prev) {
    next_prev->resize(size_t(L - 1) * E);
    for (size_t i = 0; i < next_prev->size(); ++i) (*next_prev)[i] = float(bx[size_t(n) * E + i]);
  }
  return y;
}

}  // namespace wgllm::cpu

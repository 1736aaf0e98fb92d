#include "model/reference.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <thread>

#include "cpu/attention.h"
#include "cpu/delta_net.h"
#include "cpu/ops.h"
#include "gguf/dequant.h"
#include "gguf/file.h"
#include "wgllm/error.h"

namespace wgllm::cpu {

namespace {

std::vector<float> load_tensor(const GgufFile& f, const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  std::vector<float> out(t.n_elements);
  dequantize_row(t.type, f.tensor_data(t).data(), out.data(), out.size());
  return out;
}

// y[t][o] = sum_i x[t][i] * w[o][i] (+ bias[o]), accumulated in double. x: [T][in], w: [out][in], y: [T][out].
// Output rows are split over two threads when there is enough work.
void matmul(const float* x, size_t T, size_t in, const std::vector<float>& w, size_t out,
            const std::vector<float>& bias, float* y) {
  auto rows = [&](size_t o0, size_t o1) {
    for (size_t o = o0; o < o1; ++o) {  // one weight row against every token: the row stays in cache
      const float* wo = w.data() + o * in;
      for (size_t t = 0; t < T; ++t) {
        const float* xt = x + t * in;
        // Four partial sums (independent chains the CPU can overlap), then combined.
        double part[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= in; i += 4)
          for (size_t j = 0; j < 4; ++j) part[j] += double(xt[i + j]) * double(wo[i + j]);
        for (; i < in; ++i) part[0] += double(xt[i]) * double(wo[i]);
        double acc = (part[0] + part[1]) + (part[2] + part[3]);
        if (!bias.empty()) acc += double(bias[o]);
        y[t * out + o] = float(acc);
      }
    }
  };
  if (T * in * out < (size_t{1} << 18) || out < 2) {
    rows(0, out);
    return;
  }
  std::thread helper(rows, out / 2, out);
  rows(0, out / 2);
  helper.join();
}

// RMSNorm of each of the n vectors of length dim in x (in place): x / sqrt(mean(x^2) + eps) * w (w empty: no gain).
void rms_norm(float* x, size_t n, size_t dim, const std::vector<float>& w, float eps) {
  for (size_t r = 0; r < n; ++r) {
    float* v = x + r * dim;
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += double(v[i]) * double(v[i]);
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (size_t i = 0; i < dim; ++i) v[i] = float(double(v[i]) * inv * (w.empty() ? 1.0 : double(w[i])));
  }
}

// The local layers' RoPE: base rope_base_swa, their own scaling (gemma3: none, llama.cpp's
// rope_freq_scale_train_swa = 1; gpt-oss: the global one).
ModelConfig swa_rope_config(ModelConfig c) {
  c.rope_base = c.rope_base_swa;
  c.rope_scaling = c.rope_scaling_swa;
  if (c.head_dim_swa) c.head_dim = c.head_dim_swa;  // gemma4: the local layers' heads and RoPE dims
  if (c.rope_dim_swa) c.rope_dim = c.rope_dim_swa;
  return c;
}

// gemma4's per-layer inputs [T][n_layer][P]: (rms_norm(x_emb W_proj / sqrt(n_embd)) per layer + the token's
// per_layer_token_embd row * sqrt(P)) / sqrt(2), x_emb the scaled embeddings [T][n_embd].
std::vector<float> per_layer_inputs(const ModelConfig& c, const CpuWeights& w, std::span<const int32_t> tokens,
                                    const std::vector<float>& x_emb) {
  const size_t T = tokens.size(), E = c.n_embd, P = c.n_embd_per_layer, NP = size_t(c.n_layer) * P;
  std::vector<float> proj(T * NP);
  matmul(x_emb.data(), T, E, w.per_layer_model_proj, NP, {}, proj.data());
  for (float& v : proj) v = float(double(v) / std::sqrt(double(E)));
  rms_norm(proj.data(), T * c.n_layer, P, w.per_layer_proj_norm, c.rms_eps);
  const double tok_scale = std::sqrt(double(P)), mix = 1.0 / std::sqrt(2.0);
  for (size_t t = 0; t < T; ++t) {
    const float* row = w.per_layer_token_embd.data() + size_t(tokens[t]) * NP;
    for (size_t i = 0; i < NP; ++i)
      proj[t * NP + i] = float((double(proj[t * NP + i]) + double(float(double(row[i]) * tok_scale))) * mix);
  }
  return proj;
}

// x += the mixture of experts' output for the normed rows h (config.is_moe_layer): per token the router's softmax or
// sigmoid, its top n_expert_used renormalised (cpu::moe_route), each chosen expert's act(h gate_e) * (h up_e) down_e added with
// its weight, in double.
void moe_ffn(const ModelConfig& c, const CpuLayer& L, const std::vector<float>& h, std::vector<float>& x) {
  const size_t E = c.n_embd, FX = c.n_ff_exp, X = c.n_expert, T = h.size() / E;
  std::vector<float> logits(T * X);
  matmul(h.data(), T, E, L.router, X, L.router_b, logits.data());
  auto bias = [](const std::vector<float>& b, size_t i) { return b.empty() ? 0.0 : double(b[i]); };
  auto dot = [](const float* a, const float* b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
    return s;
  };
  std::vector<float> gate(FX), up(FX);
  for (size_t t = 0; t < T; ++t) {
    const float* ht = h.data() + t * E;
    const MoeRoute route =
        moe_route(std::span(logits).subspan(t * X, X), c.n_expert_used, /*normalize=*/true, L.exp_probs_b);
    std::vector<double> acc(E, 0.0);
    for (size_t r = 0; r < route.experts.size(); ++r) {
      const size_t e = route.experts[r];
      for (size_t o = 0; o < FX; ++o) {
        gate[o] = float(dot(ht, L.exps_gate.data() + (e * FX + o) * E, E) + bias(L.exps_gate_b, e * FX + o));
        up[o] = float(dot(ht, L.exps_up.data() + (e * FX + o) * E, E) + bias(L.exps_up_b, e * FX + o));
      }
      const std::vector<float> act = gated(uint32_t(c.ffn_act), gate, up);
      for (size_t i = 0; i < E; ++i)
        acc[i] += route.weights[r] * double(float(dot(act.data(), L.exps_down.data() + (e * E + i) * FX, FX) +
                                                  bias(L.exps_down_b, e * E + i)));
    }
    for (size_t i = 0; i < E; ++i) x[t * E + i] = float(double(x[t * E + i]) + acc[i]);
  }
}

}  // namespace

CpuModel load_cpu_model(const GgufFile& f) {
  CpuModel m;
  m.config = config_from_gguf(f);
  const ModelConfig& c = m.config;
  CpuWeights& w = m.weights;
  w.token_embd = load_tensor(f, "token_embd.weight");
  w.output_norm = load_tensor(f, c.output_norm_name);
  if (!c.tied_embeddings) w.output = load_tensor(f, "output.weight");
  if (c.has_rope_freqs_tensor) w.rope_freqs = load_tensor(f, "rope_freqs.weight");
  if (c.n_embd_per_layer > 0) {
    w.per_layer_token_embd = load_tensor(f, "per_layer_token_embd.weight");
    w.per_layer_model_proj = load_tensor(f, "per_layer_model_proj.weight");
    w.per_layer_proj_norm = load_tensor(f, "per_layer_proj_norm.weight");
  }
  w.layers.resize(c.n_layer);
  for (uint32_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    CpuLayer& L = w.layers[i];
    L.attn_norm = load_tensor(f, b + "attn_norm.weight");
    L.ffn_norm = load_tensor(f, b + c.ffn_norm_name);
    if (c.n_embd_per_layer > 0) {
      L.inp_gate = load_tensor(f, b + "inp_gate.weight");
      L.ple_proj = load_tensor(f, b + "proj.weight");
      L.ple_post_norm = load_tensor(f, b + "post_norm.weight");
    }
    if (c.layer_out_scale) L.out_scale = load_tensor(f, b + "layer_output_scale.weight")[0];
    if (c.is_moe_layer(i)) {
      if (c.moe_sigmoid) L.exp_probs_b = load_tensor(f, b + "exp_probs_b.bias");
      if (c.moe_bias) {
        L.router_b = load_tensor(f, b + "ffn_gate_inp.bias");
        L.exps_gate_b = load_tensor(f, b + "ffn_gate_exps.bias");
        L.exps_up_b = load_tensor(f, b + "ffn_up_exps.bias");
        L.exps_down_b = load_tensor(f, b + "ffn_down_exps.bias");
      }
      L.router = load_tensor(f, b + "ffn_gate_inp.weight");
      L.exps_gate = load_tensor(f, b + "ffn_gate_exps.weight");
      L.exps_up = load_tensor(f, b + "ffn_up_exps.weight");
      L.exps_down = load_tensor(f, b + "ffn_down_exps.weight");
    } else {
      L.w_gate = load_tensor(f, b + "ffn_gate.weight");
      L.w_up = load_tensor(f, b + "ffn_up.weight");
      L.w_down = load_tensor(f, b + "ffn_down.weight");
    }
    if (c.is_conv(i)) {
      L.in_proj = load_tensor(f, b + "shortconv.in_proj.weight");
      L.conv = load_tensor(f, b + "shortconv.conv.weight");
      L.out_proj = load_tensor(f, b + "shortconv.out_proj.weight");
      continue;
    }
    if (c.is_delta(i)) {
      L.ssm_qkv = load_tensor(f, b + "attn_qkv.weight");
      L.ssm_z = load_tensor(f, b + "attn_gate.weight");
      L.ssm_alpha = load_tensor(f, b + "ssm_alpha.weight");
      L.ssm_beta = load_tensor(f, b + "ssm_beta.weight");
      L.ssm_conv = load_tensor(f, b + "ssm_conv1d.weight");
      L.ssm_dt = load_tensor(f, b + "ssm_dt.bias");
      L.ssm_a = load_tensor(f, b + "ssm_a");
      L.ssm_norm = load_tensor(f, b + "ssm_norm.weight");
      L.ssm_out = load_tensor(f, b + "ssm_out.weight");
      continue;
    }
    L.wq = load_tensor(f, b + "attn_q.weight");
    if (c.attn_gated) {  // per head: head_dim q rows, then head_dim gate rows
      const size_t run = size_t(c.head_dim) * c.n_embd;
      std::vector<float> q, gate;
      for (size_t h = 0; h < c.n_head; ++h) {
        q.insert(q.end(), L.wq.begin() + 2 * h * run, L.wq.begin() + (2 * h + 1) * run);
        gate.insert(gate.end(), L.wq.begin() + (2 * h + 1) * run, L.wq.begin() + (2 * h + 2) * run);
      }
      L.wq = std::move(q);
      L.wgate = std::move(gate);
    }
    if (c.owns_kv(i)) L.wk = load_tensor(f, b + "attn_k.weight");
    if (c.owns_kv(i) && !c.v_from_k(i)) L.wv = load_tensor(f, b + "attn_v.weight");
    if (c.attn_bias) {
      L.bq = load_tensor(f, b + "attn_q.bias");
      L.bk = load_tensor(f, b + "attn_k.bias");
      L.bv = load_tensor(f, b + "attn_v.bias");
    }
    if (c.qk_norm) {
      L.q_norm = load_tensor(f, b + "attn_q_norm.weight");
      if (c.owns_kv(i)) L.k_norm = load_tensor(f, b + "attn_k_norm.weight");
    }
    L.wo = load_tensor(f, b + "attn_output.weight");
    if (c.attn_out_bias) L.bo = load_tensor(f, b + "attn_output.bias");
    if (c.attn_sinks) L.sinks = load_tensor(f, b + "attn_sinks.weight");
    if (c.post_norms) {
      L.post_attn_norm = load_tensor(f, b + "post_attention_norm.weight");
      L.post_ffn_norm = load_tensor(f, b + "post_ffw_norm.weight");
    }
  }
  return m;
}

std::vector<double> rope_inv_freq(const ModelConfig& c, std::span<const float> rope_freqs) {
  const uint32_t half = c.rope_dim / 2;
  if (!rope_freqs.empty() && rope_freqs.size() != half)
    throw InvalidArgument("rope_freqs has " + std::to_string(rope_freqs.size()) +
                          " entries, expected rope_dim/2 = " + std::to_string(half));
  std::vector<double> inv(half);
  for (uint32_t i = 0; i < half; ++i) inv[i] = std::pow(double(c.rope_base), -2.0 * i / double(c.rope_dim));
  if (!rope_freqs.empty()) {
    for (uint32_t i = 0; i < half; ++i) inv[i] /= double(rope_freqs[i]);
  } else if (c.rope_scaling.enabled && c.rope_scaling.kind == kernels::RopeScalingKind::Yarn) {
    // YaRN: each frequency blended between itself (extrapolation, high frequencies) and itself / factor
    // (interpolation, low ones) by a ramp over the dimensions whose wavelengths turn between beta_fast and beta_slow
    // times over the original context (ggml_rope_yarn_corr_dims: floored and ceiled, clamped to [0, rope_dim - 1])
    const RopeScaling& s = c.rope_scaling;
    const double dims = c.rope_dim, base = c.rope_base, n0 = s.original_context;
    auto dim_of = [&](double turns) { return dims * std::log(n0 / (turns * 2 * std::numbers::pi)) / (2 * std::log(base)); };
    const double lo = std::max(0.0, std::floor(dim_of(s.beta_fast)));
    const double hi = std::min(dims - 1, std::ceil(dim_of(s.beta_slow)));
    for (uint32_t i = 0; i < half; ++i) {
      const double extrapolate = 1 - std::clamp((double(i) - lo) / std::max(hi - lo, 0.001), 0.0, 1.0);
      inv[i] = inv[i] / s.factor * (1 - extrapolate) + inv[i] * extrapolate;
    }
  } else if (c.rope_scaling.enabled) {
    // llama3: long wavelengths slowed down by `factor`, short ones kept, a smooth blend between.
    const RopeScaling& s = c.rope_scaling;
    const double factor = s.factor, lo = s.low_freq_factor, hi = s.high_freq_factor, n0 = s.original_context;
    for (auto& f : inv) {
      const double wavelength = 2 * std::numbers::pi / f;
      if (wavelength > n0 / lo) {
        f /= factor;
      } else if (wavelength >= n0 / hi) {
        const double smooth = (n0 / wavelength - lo) / (hi - lo);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

void apply_rope(std::span<float> x, uint32_t n_heads, const ModelConfig& c, std::span<const double> inv_freq,
                uint32_t pos) {
  const uint32_t half = c.rope_dim / 2;
  const RopeScaling& s = c.rope_scaling;
  const double mscale = s.enabled && s.kind == kernels::RopeScalingKind::Yarn
                            ? double(s.attn_factor) * (s.factor > 1 ? 1 + 0.1 * std::log(double(s.factor)) : 1.0)
                            : 1.0;
  for (uint32_t h = 0; h < n_heads; ++h) {
    float* v = x.data() + size_t(h) * c.head_dim;
    for (uint32_t i = 0; i < half; ++i) {
      const double angle = double(pos) * inv_freq[i];
      const double cs = mscale * std::cos(angle), sn = mscale * std::sin(angle);
      // Normal: (2i, 2i+1); Neox: (i, i + rope_dim/2).
      const uint32_t a = c.rope_type == RopeType::Normal ? 2 * i : i;
      const uint32_t b = c.rope_type == RopeType::Normal ? 2 * i + 1 : i + half;
      const double x0 = v[a], x1 = v[b];
      v[a] = float(x0 * cs - x1 * sn);
      v[b] = float(x0 * sn + x1 * cs);
    }
  }
}

CpuSession::CpuSession(const CpuModel& model, uint32_t n_ctx)
    : model_(&model),
      n_ctx_(n_ctx ? n_ctx : model.config.n_ctx_train),
      inv_freq_(rope_inv_freq(model.config, model.weights.rope_freqs)),
      swa_config_(swa_rope_config(model.config)),
      inv_freq_swa_(rope_inv_freq(swa_config_, {})),
      k_cache_(model.config.n_layer),
      v_cache_(model.config.n_layer),
      bx_(model.config.n_layer),
      delta_(model.config.n_layer) {}

void CpuSession::reset() { truncate(0); }

void CpuSession::truncate(uint32_t n) {
  if (n > n_past_)
    throw InvalidArgument("CpuSession::truncate: " + std::to_string(n) + " positions to keep, " +
                          std::to_string(n_past_) + " cached");
  const ModelConfig& c = model_->config;
  if (!c.delta_layers.empty()) {  // a recurrent state: from zeros, the first n tokens fed again
    if (n == n_past_) return;
    const std::vector<int32_t> keep(tokens_.begin(), tokens_.begin() + n);
    for (auto& k : k_cache_) k.clear();
    for (auto& v : v_cache_) v.clear();
    for (auto& r : bx_) r.clear();
    for (auto& d : delta_) d.clear();
    tokens_.clear();
    n_past_ = 0;
    if (n > 0) run(keep, false);
    return;
  }
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    k_cache_[l].resize(std::min(k_cache_[l].size(), size_t(n) * c.kv_dim_at(l)));
    v_cache_[l].resize(std::min(v_cache_[l].size(), size_t(n) * c.kv_dim_at(l)));
  }
  for (auto& r : bx_) r.resize(std::min(r.size(), size_t(n) * c.n_embd));
  tokens_.resize(n);
  n_past_ = n;
}

std::vector<float> CpuSession::forward(std::span<const int32_t> tokens) { return std::move(run(tokens, false).back()); }

std::vector<std::vector<float>> CpuSession::forward_all(std::span<const int32_t> tokens) { return run(tokens, true); }

std::vector<std::vector<float>> CpuSession::run(std::span<const int32_t> tokens, bool all_logits) {
  const ModelConfig& c = model_->config;
  const CpuWeights& w = model_->weights;
  const size_t T = tokens.size(), E = c.n_embd;
  if (T == 0) throw InvalidArgument("CpuSession::forward: no tokens");
  if (uint64_t(n_past_) + T > n_ctx_)
    throw InvalidArgument("CpuSession::forward: " + std::to_string(n_past_) + " cached + " + std::to_string(T) +
                          " new tokens exceed the context of " + std::to_string(n_ctx_));
  for (int32_t t : tokens)
    if (t < 0 || uint32_t(t) >= c.n_vocab)
      throw InvalidArgument("CpuSession::forward: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            std::to_string(c.n_vocab) + ")");

  // Residual stream x [T][E].
  std::vector<float> x(T * E);
  for (size_t t = 0; t < T; ++t) std::copy_n(w.token_embd.begin() + size_t(tokens[t]) * E, E, x.begin() + t * E);
  if (c.embd_scale != 1.f)  // gemma: in f32, as llama.cpp scales the gathered rows
    for (float& e : x) e *= c.embd_scale;
  const std::vector<float> ple = c.n_embd_per_layer ? per_layer_inputs(c, w, tokens, x) : std::vector<float>{};

  std::vector<float> h(T * E), q, k, v, attn, gate, up, proj(T * E);
  // x += proj, or (gemma) x += rms_norm(proj) * post_norm.
  auto add_residual = [&](const std::vector<float>& post_norm) {
    if (!post_norm.empty()) rms_norm(proj.data(), T, E, post_norm, c.rms_eps);
    for (size_t i = 0; i < T * E; ++i) x[i] = float(double(x[i]) + double(proj[i]));
  };
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const CpuLayer& L = w.layers[l];
    // the layer's shapes (gemma4: local and global layers differ)
    const size_t Q = c.q_dim_at(l), KV = c.kv_dim_at(l), F = c.n_ff_at(l), D = c.head_dim_at(l);
    const uint32_t n_kv = c.n_head_kv_at(l);
    q.resize(T * Q);
    k.resize(T * KV);
    v.resize(T * KV);
    gate.resize(T * F);
    up.resize(T * F);
    const AttentionRef ap{.n_heads = c.n_head,
                          .n_kv_heads = n_kv,
                          .head_dim = uint32_t(D),
                          .n_queries = uint32_t(T),
                          .start_pos = n_past_,
                          .scale = c.attn_scale > 0 ? c.attn_scale : float(1.0 / std::sqrt(double(D))),
                          .window = c.layer_window(l),
                          .sinks = L.sinks};
    const std::vector<double>& inv_freq = c.is_swa(l) ? inv_freq_swa_ : inv_freq_;
    const ModelConfig& rope_config = c.is_swa(l) ? swa_config_ : c;  // the local layers' own scaling
    h = x;
    rms_norm(h.data(), T, E, L.attn_norm, c.rms_eps);
    if (c.is_conv(l)) {
      // Short-convolution block (lfm2): out_proj(C * conv(B * x)) over this layer's B*x history.
      const uint32_t taps = c.l_cache;
      std::vector<float> bcx(T * 3 * E), prev(size_t(taps - 1) * E, 0.f), next;
      matmul(h.data(), T, E, L.in_proj, 3 * E, {}, bcx.data());
      std::vector<float>& hist = bx_[l];
      for (uint32_t j = 0; j + 1 < taps; ++j)  // positions n_past - (taps - 1) + j; zeros before 0
        if (const int64_t p = int64_t(n_past_) - (taps - 1) + j; p >= 0)
          std::copy_n(hist.begin() + p * E, E, prev.begin() + size_t(j) * E);
      const std::vector<float> y = shortconv(bcx, L.conv, prev, uint32_t(T), uint32_t(E), taps);
      for (size_t t = 0; t < T; ++t)
        for (size_t i = 0; i < E; ++i) hist.push_back(bcx[t * 3 * E + i] * bcx[t * 3 * E + 2 * E + i]);
      matmul(y.data(), T, E, L.out_proj, E, {}, proj.data());
      add_residual({});
    } else if (c.is_delta(l)) {
      // Gated DeltaNet block (qwen35): ssm_out(rms_norm(rule(conv(q, k, v))) * ssm_norm * silu(z)).
      const size_t W = c.delta_conv_dim(), H = c.ssm_v_heads, DV = c.ssm_dv, VD = H * DV, taps = c.ssm_conv;
      std::vector<float> xq(T * W), z(T * VD), alpha(T * H), beta(T * H), prev((taps - 1) * W, 0.f);
      matmul(h.data(), T, E, L.ssm_qkv, W, {}, xq.data());
      matmul(h.data(), T, E, L.ssm_z, VD, {}, z.data());
      matmul(h.data(), T, E, L.ssm_alpha, H, {}, alpha.data());
      matmul(h.data(), T, E, L.ssm_beta, H, {}, beta.data());
      std::vector<float>& hist = bx_[l];
      for (size_t j = 0; j + 1 < taps; ++j)  // positions n_past - (taps - 1) + j; zeros before 0
        if (const int64_t p = int64_t(n_past_) - int64_t(taps - 1) + int64_t(j); p >= 0)
          std::copy_n(hist.begin() + p * W, W, prev.begin() + j * W);
      hist.insert(hist.end(), xq.begin(), xq.end());
      std::vector<float> qkv = conv_silu(xq, L.ssm_conv, prev, uint32_t(T), uint32_t(W), uint32_t(taps));
      normalize_qk(qkv, uint32_t(T), uint32_t(W), c.ssm_k_heads, c.ssm_dk, c.rms_eps);
      std::vector<double>& state = delta_[l];
      state.resize(H * c.ssm_dk * DV, 0.0);
      const DeltaRuleRef ref{
          .n_tokens = uint32_t(T), .k_heads = c.ssm_k_heads, .v_heads = c.ssm_v_heads, .dk = c.ssm_dk, .dv = c.ssm_dv};
      std::vector<float> o = delta_rule(ref, qkv, alpha, beta, L.ssm_dt, L.ssm_a, state);
      rms_norm(o.data(), T * H, DV, L.ssm_norm, c.rms_eps);
      o = gated(0, z, o);  // silu(z) * norm
      matmul(o.data(), T, VD, L.ssm_out, E, {}, proj.data());
      add_residual({});
    } else {
      // Attention block (gemma4: a layer sharing an earlier layer's cache computes only q).
      const bool own_kv = c.owns_kv(l);
      matmul(h.data(), T, E, L.wq, Q, L.bq, q.data());
      if (own_kv) {
        matmul(h.data(), T, E, L.wk, KV, L.bk, k.data());
        if (c.v_from_k(l)) {
          v = k;  // gemma4's global layers without attn_v: v is k before its norm and RoPE
        } else {
          matmul(h.data(), T, E, L.wv, KV, L.bv, v.data());
        }
      }
      if (c.qk_norm) rms_norm(q.data(), T * c.n_head, D, L.q_norm, c.rms_eps);
      if (c.qk_norm && own_kv) rms_norm(k.data(), T * n_kv, D, L.k_norm, c.rms_eps);
      if (c.v_norm && own_kv) rms_norm(v.data(), T * n_kv, D, {}, c.rms_eps);
      for (size_t t = 0; t < T; ++t) {
        const uint32_t pos = n_past_ + uint32_t(t);
        apply_rope(std::span(q).subspan(t * Q, Q), c.n_head, rope_config, inv_freq, pos);
        if (own_kv) apply_rope(std::span(k).subspan(t * KV, KV), n_kv, rope_config, inv_freq, pos);
      }
      if (own_kv) {
        k_cache_[l].insert(k_cache_[l].end(), k.begin(), k.end());
        v_cache_[l].insert(v_cache_[l].end(), v.begin(), v.end());
      }
      const uint32_t src = c.kv_source(l);
      attn = attention(ap, q, k_cache_[src], v_cache_[src]);
      if (c.attn_gated) {  // qwen35: attn * sigmoid(h wgate)
        std::vector<float> g(T * Q);
        matmul(h.data(), T, E, L.wgate, Q, {}, g.data());
        attn = gated(3, g, attn);
      }
      matmul(attn.data(), T, Q, L.wo, E, L.bo, proj.data());
      add_residual(L.post_attn_norm);
    }

    // Feed-forward block: down(act(gate(h)) * up(h)), act = silu (or gemma's gelu_tanh).
    h = x;
    rms_norm(h.data(), T, E, L.ffn_norm, c.rms_eps);
    if (c.is_moe_layer(l)) {
      moe_ffn(c, L, h, x);
      continue;
    }
    matmul(h.data(), T, E, L.w_gate, F, {}, gate.data());
    matmul(h.data(), T, E, L.w_up, F, {}, up.data());
    gate = gated(uint32_t(c.ffn_act), gate, up);
    matmul(gate.data(), T, F, L.w_down, E, {}, proj.data());
    add_residual(L.post_ffn_norm);
    if (c.n_embd_per_layer) {
      // gemma4's per-layer embedding: x += rms_norm((gelu_tanh(x inp_gate) * this layer's input) proj) post_norm
      const size_t P = c.n_embd_per_layer;
      std::vector<float> g(T * P), in(T * P);
      matmul(x.data(), T, E, L.inp_gate, P, {}, g.data());
      for (size_t t = 0; t < T; ++t) std::copy_n(ple.begin() + (t * c.n_layer + l) * P, P, in.begin() + t * P);
      g = gated(uint32_t(FfnAct::GeluTanh), g, in);
      matmul(g.data(), T, P, L.ple_proj, E, {}, proj.data());
      add_residual(L.ple_post_norm);
    }
    if (c.layer_out_scale)
      for (float& e : x) e = float(double(e) * double(L.out_scale));
  }
  n_past_ += uint32_t(T);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());

  // Final norm and logits, for every token or only the last.
  const size_t first = all_logits ? 0 : T - 1, n_out = T - first;
  std::vector<float> xo(x.begin() + first * E, x.end());
  rms_norm(xo.data(), n_out, E, w.output_norm, c.rms_eps);
  std::vector<float> logits(n_out * c.n_vocab);
  matmul(xo.data(), n_out, E, c.tied_embeddings ? w.token_embd : w.output, c.n_vocab, {}, logits.data());
  if (const double cap = c.final_logit_softcap; cap > 0)
    for (float& z : logits) z = float(cap * std::tanh(double(z) / cap));
  std::vector<std::vector<float>> out(n_out);
  for (size_t t = 0; t < n_out; ++t)
    out[t].assign(logits.begin() + t * c.n_vocab, logits.begin() + (t + 1) * c.n_vocab);
  return out;
}

}  // namespace wgllm::cpu

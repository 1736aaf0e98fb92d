#include "model/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include "gguf/file.h"
#include "kernels/delta_net.h"
#include "kernels/moe.h"
#include "wgllm/error.h"

namespace wgllm {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen3Moe: return "qwen3moe";
    case Arch::Gemma3: return "gemma3";
    case Arch::Lfm2: return "lfm2";
    case Arch::Lfm2Moe: return "lfm2moe";
    case Arch::GptOss: return "gpt-oss";
    case Arch::Qwen35: return "qwen35";
    case Arch::Gemma4: return "gemma4";
  }
  return "?";
}

float ModelConfig::attention_scale() const {
  const float m = kernels::rope_yarn_mscale(rope_scaling);
  return (attn_scale > 0 ? attn_scale : 1.f / std::sqrt(float(head_dim))) * m * m;
}

uint32_t ModelConfig::n_attention_layers() const {
  uint32_t n = 0;
  for (uint32_t l = 0; l < n_layer; ++l) n += is_attention(l) ? 1 : 0;
  return n;
}

uint32_t ModelConfig::max_q_dim() const {
  uint32_t m = q_dim();
  for (uint32_t l = 0; l < n_layer; ++l) m = std::max(m, q_dim_at(l));
  return m;
}

uint32_t ModelConfig::max_kv_dim() const {
  uint32_t m = kv_dim();
  for (uint32_t l = 0; l < n_layer; ++l) m = std::max(m, kv_dim_at(l));
  return m;
}

uint32_t ModelConfig::max_n_ff() const {
  uint32_t m = n_ff;
  for (uint32_t l = 0; l < n_layer; ++l) m = std::max(m, n_ff_at(l));
  return m;
}

std::string ModelConfig::layer_pattern() const {
  std::string s;
  for (uint32_t l = 0; l < n_layer; ++l) s += is_conv(l) ? 'C' : is_delta(l) ? 'D' : is_swa(l) ? 'L' : 'A';
  return s;
}

namespace {

[[noreturn]] void fail(const GgufFile& f, const std::string& what) { throw ModelError(f.label() + ": " + what); }

// Upper bound for widths, counts and head sizes: far above any real model, low enough that products fit.
constexpr uint32_t kMaxDim = 1u << 20;
// The most taps a short convolution may have (released LFM2 models have 3).
constexpr uint32_t kMaxConvTaps = 64;

uint32_t require_dim(const GgufFile& f, const std::string& key, uint32_t v) {
  if (v == 0) fail(f, "key '" + key + "' is 0");
  if (v > kMaxDim) fail(f, "key '" + key + "' = " + std::to_string(v) + " is larger than " + std::to_string(kMaxDim));
  return v;
}

void check_shape(const GgufFile& f, const std::string& name, std::vector<uint64_t> want) {
  const GgufTensor& t = f.tensor(name);
  const std::vector<uint64_t> got(t.dims().begin(), t.dims().end());
  if (got != want) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    w += "]";
    fail(f, "byte " + std::to_string(t.info_offset) + ": tensor '" + name + "': shape " + t.shape_string() +
                " does not match the config (expected " + w + ")");
  }
}

void read_swa_layers(const GgufFile& f, ModelConfig& c, float default_base, uint32_t default_period);
void read_experts(const GgufFile& f, ModelConfig& c);

// A key holding one positive count for every layer, or an array of one per layer (gemma4's head_count_kv and
// feed_forward_length).
std::vector<uint32_t> read_per_layer_dims(const GgufFile& f, const std::string& key, uint32_t n_layer) {
  const GgufValue* v = f.find(key);
  if (!v) fail(f, "key '" + key + "' is missing");
  std::vector<uint32_t> out(n_layer);
  if (!std::holds_alternative<GgufArray>(v->v)) {
    out.assign(n_layer, require_dim(f, key, f.get_u32(key)));
    return out;
  }
  const GgufArray& a = std::get<GgufArray>(v->v);
  const GgufValueType t = a.elem_type();
  const bool is_signed = t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32;
  const bool integer = is_signed || t == GgufValueType::U8 || t == GgufValueType::U16 || t == GgufValueType::U32;
  if (!integer || a.size() != n_layer)
    fail(f, "byte " + std::to_string(v->offset) + ": key '" + key + "': expected an array of " +
                std::to_string(n_layer) + " integers (one per layer), found " + std::to_string(a.size()) + " of " +
                value_type_name(t));
  for (uint32_t l = 0; l < n_layer; ++l) {
    const int64_t n = is_signed ? a.i64(l) : int64_t(a.u64(l));
    if (n <= 0 || n > int64_t(kMaxDim))
      fail(f, "key '" + key + "': layer " + std::to_string(l) + " has " + std::to_string(n) + " (not in [1, " +
                  std::to_string(kMaxDim) + "])");
    out[l] = uint32_t(n);
  }
  return out;
}

// Gemma 4 as llama.cpp reads it (src/models/gemma4.cpp): Gemma 3's embedding scale, post norms, per-head q/k norms
// and gelu_tanh, with q.k unscaled (1); every layer local or global by attention.sliding_window_pattern (a bool per
// layer), the local ones with heads of attention.key_length_swa rotating rope.dimension_count_swa dims at
// rope.freq_base_swa, the global ones with heads of attention.key_length and rope_freqs.weight (the "proportional"
// RoPE: the unrotated pairs have factor 1e30); KV heads and FFN widths per layer; the last
// attention.shared_kv_layers layers attend over the cache of the last earlier layer of their kind (transformers'
// rule; llama.cpp's, the last two unshared layers being local then global, picks the same ones); per-layer
// embeddings of embedding_length_per_layer_input. The mixture-of-experts variant is not supported.
void read_gemma4(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  c.embd_scale = std::sqrt(float(c.n_embd));
  c.attn_scale = 1.f;
  c.v_norm = true;
  if (const auto n = f.find_u32(a + "expert_count"); n && *n > 0)
    fail(f, "key '" + a + "expert_count' = " + std::to_string(*n) +
                ": Gemma 4's mixture-of-experts layers are not supported");
  if (f.find_tensor("blk.0.attn_qkv.weight"))
    fail(f, "tensor 'blk.0.attn_qkv.weight': fused q/k/v projections are not supported for gemma4");
  if (const auto cap = f.find_f32(a + "final_logit_softcapping")) {
    if (!(*cap >= 0.f) || !std::isfinite(*cap))
      fail(f, "key '" + a + "final_logit_softcapping' = " + std::to_string(*cap) + " is not a finite value >= 0");
    c.final_logit_softcap = *cap;
  }
  c.sliding_window = f.get_u32(a + "attention.sliding_window");
  if (c.sliding_window == 0) fail(f, "key '" + a + "attention.sliding_window' is 0");
  read_swa_layers(f, c, 10000.f, 6);
  c.head_dim_swa = require_dim(f, a + "attention.key_length_swa", f.get_u32(a + "attention.key_length_swa"));
  if (const auto vl = f.find_u32(a + "attention.value_length_swa"); vl && *vl != c.head_dim_swa)
    fail(f, "attention.value_length_swa " + std::to_string(*vl) + " differs from attention.key_length_swa " +
                std::to_string(c.head_dim_swa) + " (not supported)");
  c.rope_dim_swa = f.find_u32(a + "rope.dimension_count_swa").value_or(c.head_dim_swa);
  if (c.head_dim_swa % 2 != 0 || c.rope_dim_swa == 0 || c.rope_dim_swa % 2 != 0 || c.rope_dim_swa > c.head_dim_swa)
    fail(f, "key '" + a + "rope.dimension_count_swa' = " + std::to_string(c.rope_dim_swa) +
                " must be even, non-zero and at most the local head dimension " + std::to_string(c.head_dim_swa));
  if (c.rope_scaling.enabled) fail(f, "gemma4 with rope scaling is not supported");
  if (!f.find_tensor("rope_freqs.weight"))  // as llama.cpp, which requires it
    fail(f, "tensor 'rope_freqs.weight' is missing (gemma4's global layers rotate through its factors)");
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (c.n_head % c.n_head_kv_at(l) != 0)
      fail(f, "layer " + std::to_string(l) + ": attention.head_count " + std::to_string(c.n_head) +
                  " is not a multiple of its attention.head_count_kv " + std::to_string(c.n_head_kv_at(l)));
  const uint32_t shared = f.find_u32(a + "attention.shared_kv_layers").value_or(0);
  if (shared >= c.n_layer)
    fail(f, "key '" + a + "attention.shared_kv_layers' = " + std::to_string(shared) + " leaves no layer of the " +
                std::to_string(c.n_layer) + " its own KV cache");
  if (shared > 0) {
    const uint32_t first = c.n_layer - shared;
    c.layer_kv_source.resize(c.n_layer);
    for (uint32_t l = 0; l < c.n_layer; ++l) {
      c.layer_kv_source[l] = l;
      if (l < first) continue;
      uint32_t src = first;
      for (uint32_t j = first; j-- > 0;)
        if (c.is_swa(j) == c.is_swa(l)) {
          src = j;
          break;
        }
      if (src == first)
        fail(f, "key '" + a + "attention.shared_kv_layers' = " + std::to_string(shared) + ": layer " +
                    std::to_string(l) + " (" + (c.is_swa(l) ? "local" : "global") +
                    ") has no earlier layer of its kind to share the KV cache of");
      c.layer_kv_source[l] = src;
    }
  }
  c.n_embd_per_layer = f.find_u32(a + "embedding_length_per_layer_input").value_or(0);
  if (c.n_embd_per_layer > kMaxDim || uint64_t(c.n_embd_per_layer) * c.n_layer > kMaxDim)
    fail(f, "key '" + a + "embedding_length_per_layer_input' = " + std::to_string(c.n_embd_per_layer) +
                " x block_count is larger than " + std::to_string(kMaxDim));
  c.layer_v_from_k.resize(c.n_layer);
  for (uint32_t l = 0; l < c.n_layer; ++l)
    c.layer_v_from_k[l] = c.owns_kv(l) && !f.find_tensor("blk." + std::to_string(l) + ".attn_v.weight");
  c.layer_out_scale = f.find_tensor("blk.0.layer_output_scale.weight") != nullptr;
}

// Gemma 3 as llama.cpp reads it (src/models/gemma3.cpp): the embedding scaled by sqrt(n_embd); q.k scaled by
// 1 / sqrt(head_dim), except for the 62-layer 27B (1 / sqrt(n_embd / n_head), as Google's reference); with
// attention.sliding_window > 0, local layers are given by attention.sliding_window_pattern (a bool per layer, or
// a period n: layer i is local unless i % n == n - 1; default 6) and rotate with rope.freq_base_swa (default
// 10000); final_logit_softcapping when present.
void read_gemma3(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  c.embd_scale = std::sqrt(float(c.n_embd));
  c.attn_scale = c.n_layer == 62 ? 1.f / std::sqrt(float(c.n_embd / c.n_head)) : 1.f / std::sqrt(float(c.head_dim));
  if (const auto cap = f.find_f32(a + "final_logit_softcapping")) {
    if (!(*cap >= 0.f) || !std::isfinite(*cap))
      fail(f, "key '" + a + "final_logit_softcapping' = " + std::to_string(*cap) + " is not a finite value >= 0");
    c.final_logit_softcap = *cap;
  }
  c.sliding_window = f.find_u32(a + "attention.sliding_window").value_or(0);
  if (c.sliding_window == 0) return;
  read_swa_layers(f, c, 10000.f, 6);
}

// The local (sliding-window) layers as llama.cpp's load_swa_pattern reads them: attention.sliding_window_pattern is
// a bool per layer, or a period n (layer i is local unless i % n == n - 1; absent: default_period); they rotate with
// rope.freq_base_swa (absent: default_base).
void read_swa_layers(const GgufFile& f, ModelConfig& c, float default_base, uint32_t default_period) {
  const std::string a = c.arch_name + ".";
  c.rope_base_swa = f.find_f32(a + "rope.freq_base_swa").value_or(default_base);
  if (!(c.rope_base_swa > 1.f) || !std::isfinite(c.rope_base_swa))
    fail(f, "key '" + a + "rope.freq_base_swa' = " + std::to_string(c.rope_base_swa) + " is not > 1");
  const std::string pattern_key = a + "attention.sliding_window_pattern";
  c.swa_layers.assign(c.n_layer, false);
  if (const GgufValue* v = f.find(pattern_key); v && std::holds_alternative<GgufArray>(v->v)) {
    const GgufArray& p = std::get<GgufArray>(v->v);
    if (p.elem_type() != GgufValueType::Bool || p.size() != c.n_layer)
      fail(f, "byte " + std::to_string(v->offset) + ": key '" + pattern_key + "': expected an array of " +
                  std::to_string(c.n_layer) + " bools (one per layer), found " + std::to_string(p.size()) + " of " +
                  value_type_name(p.elem_type()));
    for (uint32_t i = 0; i < c.n_layer; ++i) c.swa_layers[i] = p.boolean(i);
    return;
  }
  const uint32_t n = f.find_u32(pattern_key).value_or(default_period);
  for (uint32_t i = 0; i < c.n_layer; ++i) c.swa_layers[i] = n == 0 || i % n < n - 1;
}

// gpt-oss as llama.cpp reads it (src/models/openai-moe.cpp): every FFN a mixture of experts (softmax over the top
// k of the router's biased logits, the clamped SwiGLU, biases on every product); attention with q/k/v/o biases and
// a sink per head; local layers every other one from layer 0 (sliding_window_pattern 2), rotating as the global
// ones (the same base and scaling); the FFN's norm is named post_attention_norm.
void read_gpt_oss(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  read_experts(f, c);
  c.ffn_act = FfnAct::SwigluOai;
  c.attn_out_bias = true;
  c.attn_sinks = true;
  c.moe_bias = true;
  c.ffn_norm_name = "post_attention_norm.weight";
  c.sliding_window = f.get_u32(a + "attention.sliding_window");
  if (c.sliding_window == 0) fail(f, "key '" + a + "attention.sliding_window' is 0");
  read_swa_layers(f, c, c.rope_base, 2);
  c.rope_scaling_swa = c.rope_scaling;
}

// Qwen 3.5 as llama.cpp reads it (src/models/qwen35.cpp): attention.recurrent_layers (a bool per layer) marks the
// gated DeltaNet layers, or else every full_attention_interval-th layer (default 4) is full attention; the ssm.*
// keys give the DeltaNet's shape; the FFN's norm is named post_attention_norm. Its multi-axis RoPE
// (rope.dimension_sections) rotates every section by the same text position, which is NeoX RoPE over
// rope.dimension_count dims. Layers past block_count - nextn_predict_layers (a multi-token-prediction head) are
// not run.
void read_qwen35(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  c.attn_gated = true;
  c.ffn_norm_name = "post_attention_norm.weight";
  const uint32_t total = c.n_layer;
  const uint32_t nextn = f.find_u32(a + "nextn_predict_layers").value_or(0);
  if (nextn >= total)
    fail(f, "key '" + a + "nextn_predict_layers' = " + std::to_string(nextn) + " leaves no layer of block_count " +
                std::to_string(total));
  c.n_layer = total - nextn;
  auto ssm = [&](const char* key) { return require_dim(f, a + key, f.get_u32(a + key)); };
  c.ssm_conv = ssm("ssm.conv_kernel");
  if (c.ssm_conv < 2 || c.ssm_conv > kMaxConvTaps)
    fail(f, "key '" + a + "ssm.conv_kernel' = " + std::to_string(c.ssm_conv) + " is outside [2, " +
                std::to_string(kMaxConvTaps) + "]");
  c.ssm_dk = ssm("ssm.state_size");
  c.ssm_k_heads = ssm("ssm.group_count");
  c.ssm_v_heads = ssm("ssm.time_step_rank");
  const uint32_t inner = ssm("ssm.inner_size");
  if (inner % c.ssm_v_heads != 0 || c.ssm_v_heads % c.ssm_k_heads != 0)
    fail(f, "keys '" + a + "ssm.*': inner_size " + std::to_string(inner) + " over time_step_rank " +
                std::to_string(c.ssm_v_heads) + " value heads and group_count " + std::to_string(c.ssm_k_heads) +
                " key heads: value heads must divide inner_size and be a multiple of the key heads");
  c.ssm_dv = inner / c.ssm_v_heads;
  if (c.ssm_dk > kernels::kDeltaMaxHeadDim || c.ssm_dv > kernels::kDeltaMaxHeadDim)
    fail(f, "keys '" + a + "ssm.*': head dimensions " + std::to_string(c.ssm_dk) + " (keys) and " +
                std::to_string(c.ssm_dv) + " (values) must be at most " + std::to_string(kernels::kDeltaMaxHeadDim));
  c.delta_layers.assign(c.n_layer, false);
  const std::string key = a + "attention.recurrent_layers";
  if (const GgufValue* v = f.find(key); v && std::holds_alternative<GgufArray>(v->v)) {
    const GgufArray& p = std::get<GgufArray>(v->v);
    if (p.elem_type() != GgufValueType::Bool || p.size() != total)
      fail(f, "byte " + std::to_string(v->offset) + ": key '" + key + "': expected an array of " +
                  std::to_string(total) + " bools (one per block), found " + std::to_string(p.size()) + " of " +
                  value_type_name(p.elem_type()));
    for (uint32_t i = 0; i < c.n_layer; ++i) c.delta_layers[i] = p.boolean(i);
  } else {
    const uint32_t interval = f.find_u32(a + "full_attention_interval").value_or(4);
    if (interval == 0) fail(f, "key '" + a + "full_attention_interval' is 0");
    for (uint32_t i = 0; i < c.n_layer; ++i) c.delta_layers[i] = (i + 1) % interval != 0;
  }
}

// LFM2 as llama.cpp reads it (src/models/lfm2.cpp): attention.head_count_kv is a per-layer array (or one number for
// every layer) whose 0 entries mark the short-convolution layers; the attention layers must agree on their count.
// shortconv.l_cache gives the convolution's taps.
void read_lfm2_layers(const GgufFile& f, ModelConfig& c) {
  const std::string key = c.arch_name + ".attention.head_count_kv";
  c.conv_layers.assign(c.n_layer, false);
  const GgufValue* v = f.find(key);
  if (v && std::holds_alternative<GgufArray>(v->v)) {
    const GgufArray& kv = std::get<GgufArray>(v->v);
    const GgufValueType t = kv.elem_type();
    const bool integer = t == GgufValueType::U8 || t == GgufValueType::U16 || t == GgufValueType::U32 ||
                         t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32;
    if (!integer || kv.size() != c.n_layer)
      fail(f, "byte " + std::to_string(v->offset) + ": key '" + key + "': expected an array of " +
                  std::to_string(c.n_layer) + " integers (one per layer), found " + std::to_string(kv.size()) + " of " +
                  value_type_name(t));
    for (uint32_t l = 0; l < c.n_layer; ++l) {
      const bool is_signed = t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32;
      const int64_t n = is_signed ? kv.i64(l) : int64_t(kv.u64(l));
      if (n < 0 || n > int64_t(kMaxDim))
        fail(f, "key '" + key + "': layer " + std::to_string(l) + " has " + std::to_string(n) + " KV heads");
      if (n == 0) {
        c.conv_layers[l] = true;
      } else if (c.n_head_kv == 0) {
        c.n_head_kv = uint32_t(n);
      } else if (uint32_t(n) != c.n_head_kv) {
        fail(f, "key '" + key + "': the attention layers differ in KV heads (" + std::to_string(c.n_head_kv) + " and " +
                    std::to_string(n) + " at layer " + std::to_string(l) + "; not supported)");
      }
    }
  } else {
    c.n_head_kv = require_dim(f, key, f.find_u32(key).value_or(c.n_head));
  }
  if (c.n_head_kv == 0) c.n_head_kv = c.n_head;  // no attention layer: the count is never used
  if (c.n_attention_layers() == c.n_layer) {
    c.conv_layers.clear();
    return;
  }
  const std::string lkey = c.arch_name + ".shortconv.l_cache";
  c.l_cache = f.get_u32(lkey);
  if (c.l_cache < 2 || c.l_cache > kMaxConvTaps)
    fail(f,
         "key '" + lkey + "' = " + std::to_string(c.l_cache) + " is outside [2, " + std::to_string(kMaxConvTaps) + "]");
}

// A mixture of experts' counts, gating and dense leading layers (qwen3moe and lfm2moe as llama.cpp reads them; both
// renormalise the top k).
void read_experts(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch_name + ".";
  c.n_expert = require_dim(f, a + "expert_count", f.get_u32(a + "expert_count"));
  c.n_expert_used = require_dim(f, a + "expert_used_count", f.get_u32(a + "expert_used_count"));
  c.n_ff_exp = require_dim(f, a + "expert_feed_forward_length", f.get_u32(a + "expert_feed_forward_length"));
  if (c.n_expert_used > c.n_expert || c.n_expert_used > kernels::kMoeMaxUsed || c.n_expert > kernels::kMoeMaxExperts)
    fail(f, "key '" + a + "expert_used_count' = " + std::to_string(c.n_expert_used) + " of expert_count " +
                std::to_string(c.n_expert) + ": needs 1 <= used <= count, used <= " + std::to_string(kernels::kMoeMaxUsed) +
                ", count <= " + std::to_string(kernels::kMoeMaxExperts));
  // llama.cpp: 1 softmax, 2 sigmoid, 3 softmax over the top k (gpt-oss; with the renormalisation, the same weights as
  // 1); absent: the architecture's (qwen3moe and gpt-oss softmax, lfm2moe sigmoid)
  const uint32_t gating = f.find_u32(a + "expert_gating_func").value_or(c.arch == Arch::Lfm2Moe ? 2 : 1);
  if (gating < 1 || gating > 3)
    fail(f, "key '" + a + "expert_gating_func' = " + std::to_string(gating) +
                " is not supported (1 softmax, 2 sigmoid, 3 softmax of the top k)");
  c.moe_sigmoid = gating == 2;
  c.n_dense_lead = f.find_u32(a + "leading_dense_block_count").value_or(0);
  if (c.n_dense_lead > c.n_layer)
    fail(f, "key '" + a + "leading_dense_block_count' = " + std::to_string(c.n_dense_lead) + " exceeds block_count " +
                std::to_string(c.n_layer));
}

}  // namespace

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama") {
    c.arch = Arch::Llama;
    c.rope_type = RopeType::Normal;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_type = RopeType::Neox;
  } else if (c.arch_name == "qwen3") {
    c.arch = Arch::Qwen3;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
  } else if (c.arch_name == "qwen3moe") {
    c.arch = Arch::Qwen3Moe;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
  } else if (c.arch_name == "gemma3") {
    c.arch = Arch::Gemma3;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
    c.ffn_act = FfnAct::GeluTanh;
    c.post_norms = true;
  } else if (c.arch_name == "lfm2" || c.arch_name == "lfm2moe") {
    c.arch = c.arch_name == "lfm2" ? Arch::Lfm2 : Arch::Lfm2Moe;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
    c.output_norm_name = "token_embd_norm.weight";  // llama.cpp's name for LFM2's final norm
  } else if (c.arch_name == "gpt-oss") {
    c.arch = Arch::GptOss;
    c.rope_type = RopeType::Neox;
  } else if (c.arch_name == "qwen35") {
    c.arch = Arch::Qwen35;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
  } else if (c.arch_name == "gemma4") {
    c.arch = Arch::Gemma4;
    c.rope_type = RopeType::Neox;
    c.qk_norm = true;
    c.ffn_act = FfnAct::GeluTanh;
    c.post_norms = true;
  } else {
    fail(f, "architecture '" + c.arch_name +
                "' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma3, lfm2, lfm2moe, gpt-oss, "
                "qwen35, gemma4)");
  }
  // The parser accepts every ggml type (inspect shows any file); running needs types wgllm dequantises.
  for (const GgufTensor& t : f.tensors())
    if (!is_supported_type(static_cast<uint32_t>(t.type)))
      fail(f, "byte " + std::to_string(t.info_offset) + ": tensor '" + t.name + "' has type " + type_name(t.type) +
                  ", which wgllm cannot run (it runs " + supported_type_names() + ")");
  const std::string a = c.arch_name + ".";
  auto dim = [&](const std::string& key) { return require_dim(f, a + key, f.get_u32(a + key)); };

  c.n_embd = dim("embedding_length");
  c.n_layer = dim("block_count");
  c.n_head = dim("attention.head_count");
  if (c.arch == Arch::Qwen35) read_qwen35(f, c);
  if (c.arch == Arch::Lfm2 || c.arch == Arch::Lfm2Moe) {
    read_lfm2_layers(f, c);
  } else if (c.arch == Arch::Gemma4) {  // one count per layer, or one for all; the global layers' as n_head_kv
    c.layer_n_head_kv = read_per_layer_dims(f, a + "attention.head_count_kv", c.n_layer);
    c.n_head_kv = c.layer_n_head_kv.back();
  } else {
    c.n_head_kv =
        require_dim(f, a + "attention.head_count_kv", f.find_u32(a + "attention.head_count_kv").value_or(c.n_head));
  }
  if (c.arch == Arch::Gemma4) {  // double-wide FFNs in the KV-sharing layers
    c.layer_n_ff = read_per_layer_dims(f, a + "feed_forward_length", c.n_layer);
    c.n_ff = c.layer_n_ff.front();
  } else {
    c.n_ff = dim("feed_forward_length");
  }
  if (c.arch == Arch::Qwen3Moe || c.arch == Arch::Lfm2Moe) read_experts(f, c);  // gpt-oss: read_gpt_oss
  c.n_ctx_train = f.get_u32(a + "context_length");  // long-context models go past kMaxDim; only 0 is wrong
  if (c.n_ctx_train == 0) fail(f, "key '" + a + "context_length' is 0");
  if (c.arch != Arch::Gemma4 && c.n_head % c.n_head_kv != 0)  // gemma4: per layer in read_gemma4
    fail(f, "attention.head_count " + std::to_string(c.n_head) + " is not a multiple of attention.head_count_kv " +
                std::to_string(c.n_head_kv));
  if (const auto kl = f.find_u32(a + "attention.key_length")) {
    c.head_dim = require_dim(f, a + "attention.key_length", *kl);
  } else {
    if (c.n_embd % c.n_head != 0)
      fail(f, "embedding_length " + std::to_string(c.n_embd) + " is not a multiple of attention.head_count " +
                  std::to_string(c.n_head) + " (and attention.key_length is absent)");
    c.head_dim = c.n_embd / c.n_head;
  }
  if (const auto vl = f.find_u32(a + "attention.value_length"); vl && *vl != c.head_dim)
    fail(f, "attention.value_length " + std::to_string(*vl) + " differs from attention.key_length " +
                std::to_string(c.head_dim) + " (not supported)");
  if (c.head_dim % 2 != 0) fail(f, "head dimension " + std::to_string(c.head_dim) + " is odd");
  if (uint64_t(c.n_head) * c.head_dim > kMaxDim)
    fail(f, "attention.head_count x head dimension = " + std::to_string(uint64_t(c.n_head) * c.head_dim) +
                " is larger than " + std::to_string(kMaxDim));

  c.rms_eps = f.get_f32(a + "attention.layer_norm_rms_epsilon");
  if (!(c.rms_eps > 0.f) || !std::isfinite(c.rms_eps))
    fail(f, "key '" + a + "attention.layer_norm_rms_epsilon' = " + std::to_string(c.rms_eps) + " is not positive");
  c.rope_base = f.find_f32(a + "rope.freq_base").value_or(10000.f);
  if (!(c.rope_base > 1.f) || !std::isfinite(c.rope_base))
    fail(f, "key '" + a + "rope.freq_base' = " + std::to_string(c.rope_base) + " is not > 1");
  c.rope_dim = f.find_u32(a + "rope.dimension_count").value_or(c.head_dim);
  if (c.rope_dim == 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
    fail(f, "key '" + a + "rope.dimension_count' = " + std::to_string(c.rope_dim) +
                " must be even, non-zero and at most the head dimension " + std::to_string(c.head_dim));

  const std::string scaling = f.find_string(a + "rope.scaling.type").value_or("none");
  if (scaling == "llama3") {
    auto& s = c.rope_scaling;
    s.enabled = true;
    s.factor = f.get_f32(a + "rope.scaling.factor");
    s.low_freq_factor = f.find_f32(a + "rope.scaling.low_freq_factor").value_or(s.low_freq_factor);
    s.high_freq_factor = f.find_f32(a + "rope.scaling.high_freq_factor").value_or(s.high_freq_factor);
    s.original_context = f.find_u32(a + "rope.scaling.original_context_length").value_or(s.original_context);
    if (!(s.factor >= 1.f) || !(s.low_freq_factor > 0.f) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_context == 0 || !std::isfinite(s.factor) || !std::isfinite(s.high_freq_factor))
      fail(f, "llama3 rope scaling parameters are inconsistent (factor " + std::to_string(s.factor) +
                  ", low_freq_factor " + std::to_string(s.low_freq_factor) + ", high_freq_factor " +
                  std::to_string(s.high_freq_factor) + ", original_context_length " +
                  std::to_string(s.original_context) + ")");
  } else if (scaling == "yarn") {
    auto& s = c.rope_scaling;
    s.enabled = true;
    s.kind = kernels::RopeScalingKind::Yarn;
    s.factor = f.get_f32(a + "rope.scaling.factor");
    s.original_context = f.find_u32(a + "rope.scaling.original_context_length").value_or(c.n_ctx_train);
    s.beta_fast = f.find_f32(a + "rope.scaling.yarn_beta_fast").value_or(s.beta_fast);
    s.beta_slow = f.find_f32(a + "rope.scaling.yarn_beta_slow").value_or(s.beta_slow);
    s.attn_factor = f.find_f32(a + "rope.scaling.attn_factor").value_or(s.attn_factor);
    if (!(s.factor >= 1.f) || !std::isfinite(s.factor) || s.original_context == 0 || !(s.beta_fast > 0.f) ||
        !(s.beta_slow > 0.f) || !std::isfinite(s.beta_fast) || !std::isfinite(s.beta_slow) || !(s.attn_factor > 0.f) ||
        !std::isfinite(s.attn_factor))
      fail(f, "yarn rope scaling parameters are inconsistent (factor " + std::to_string(s.factor) +
                  ", original_context_length " + std::to_string(s.original_context) + ", yarn_beta_fast " +
                  std::to_string(s.beta_fast) + ", yarn_beta_slow " + std::to_string(s.beta_slow) + ", attn_factor " +
                  std::to_string(s.attn_factor) + ")");
    if (c.rope_dim != c.head_dim)
      fail(f, "yarn rope scaling on " + std::to_string(c.rope_dim) + " of " + std::to_string(c.head_dim) +
                  " head dimensions is not supported (its magnitude scale is folded into the q.k scale)");
  } else if (scaling != "none") {
    fail(f, "key '" + a + "rope.scaling.type': '" + scaling + "' is not supported (supported: none, llama3, yarn)");
  }

  if (c.arch == Arch::Gemma3) read_gemma3(f, c);
  if (c.arch == Arch::GptOss) read_gpt_oss(f, c);
  if (c.arch == Arch::Gemma4) read_gemma4(f, c);

  // ---- vocabulary and tensors
  const GgufTensor& embd = f.tensor("token_embd.weight");
  if (f.has("tokenizer.ggml.tokens")) {
    const size_t n = f.get_string_array("tokenizer.ggml.tokens").size();
    if (n == 0 || n > (1u << 24)) fail(f, "tokenizer.ggml.tokens has " + std::to_string(n) + " entries");
    c.n_vocab = static_cast<uint32_t>(n);
  } else {
    if (embd.n_dims != 2 || embd.ne[1] > (1u << 24))
      fail(f, "tensor 'token_embd.weight': shape " + embd.shape_string() + " is not [n_embd, n_vocab]");
    c.n_vocab = static_cast<uint32_t>(embd.ne[1]);
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.has_rope_freqs_tensor = f.find_tensor("rope_freqs.weight") != nullptr;
  for (uint32_t i = 0; i < c.n_layer; ++i)  // the first attention layer tells
    if (c.is_attention(i)) {
      c.attn_bias = f.find_tensor("blk." + std::to_string(i) + ".attn_q.bias") != nullptr;
      break;
    }

  const uint64_t E = c.n_embd, V = c.n_vocab;
  check_shape(f, "token_embd.weight", {E, V});
  if (!c.tied_embeddings) check_shape(f, "output.weight", {E, V});
  check_shape(f, c.output_norm_name, {E});
  if (c.has_rope_freqs_tensor) check_shape(f, "rope_freqs.weight", {c.rope_dim / 2});
  if (const uint64_t P = c.n_embd_per_layer, NL = c.n_layer; P > 0) {
    check_shape(f, "per_layer_token_embd.weight", {P * NL, V});
    check_shape(f, "per_layer_model_proj.weight", {E, P * NL});
    check_shape(f, "per_layer_proj_norm.weight", {P});
  }
  for (uint32_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const uint64_t Q = c.q_dim_at(i), KV = c.kv_dim_at(i), F = c.n_ff_at(i);
    check_shape(f, b + "attn_norm.weight", {E});
    check_shape(f, b + c.ffn_norm_name, {E});
    if (c.is_moe_layer(i)) {
      const uint64_t X = c.n_expert, FX = c.n_ff_exp;
      if (c.moe_sigmoid) check_shape(f, b + "exp_probs_b.bias", {X});
      check_shape(f, b + "ffn_gate_inp.weight", {E, X});
      check_shape(f, b + "ffn_gate_exps.weight", {E, FX, X});
      check_shape(f, b + "ffn_up_exps.weight", {E, FX, X});
      check_shape(f, b + "ffn_down_exps.weight", {FX, E, X});
      if (c.moe_bias) {
        check_shape(f, b + "ffn_gate_inp.bias", {X});
        check_shape(f, b + "ffn_gate_exps.bias", {FX, X});
        check_shape(f, b + "ffn_up_exps.bias", {FX, X});
        check_shape(f, b + "ffn_down_exps.bias", {E, X});
      }
    } else {
      check_shape(f, b + "ffn_gate.weight", {E, F});
      check_shape(f, b + "ffn_up.weight", {E, F});
      check_shape(f, b + "ffn_down.weight", {F, E});
    }
    if (c.is_conv(i)) {
      check_shape(f, b + "shortconv.conv.weight", {c.l_cache, E});
      check_shape(f, b + "shortconv.in_proj.weight", {E, 3 * E});
      check_shape(f, b + "shortconv.out_proj.weight", {E, E});
      continue;
    }
    if (c.is_delta(i)) {
      const uint64_t VH = c.ssm_v_heads, VD = uint64_t(c.ssm_v_heads) * c.ssm_dv;
      check_shape(f, b + "attn_qkv.weight", {E, c.delta_conv_dim()});
      check_shape(f, b + "attn_gate.weight", {E, VD});
      check_shape(f, b + "ssm_conv1d.weight", {c.ssm_conv, c.delta_conv_dim()});
      check_shape(f, b + "ssm_dt.bias", {VH});
      check_shape(f, b + "ssm_a", {VH});
      check_shape(f, b + "ssm_beta.weight", {E, VH});
      check_shape(f, b + "ssm_alpha.weight", {E, VH});
      check_shape(f, b + "ssm_norm.weight", {c.ssm_dv});
      check_shape(f, b + "ssm_out.weight", {VD, E});
      continue;
    }
    check_shape(f, b + "attn_q.weight", {E, c.attn_gated ? 2 * Q : Q});
    if (c.owns_kv(i)) check_shape(f, b + "attn_k.weight", {E, KV});
    if (c.owns_kv(i) && !c.v_from_k(i)) check_shape(f, b + "attn_v.weight", {E, KV});
    check_shape(f, b + "attn_output.weight", {Q, E});
    if (c.attn_out_bias) check_shape(f, b + "attn_output.bias", {E});
    if (c.attn_sinks) check_shape(f, b + "attn_sinks.weight", {c.n_head});
    if (c.attn_bias) {
      check_shape(f, b + "attn_q.bias", {Q});
      check_shape(f, b + "attn_k.bias", {KV});
      check_shape(f, b + "attn_v.bias", {KV});
    }
    if (c.qk_norm) {
      check_shape(f, b + "attn_q_norm.weight", {c.head_dim_at(i)});
      if (c.owns_kv(i)) check_shape(f, b + "attn_k_norm.weight", {c.head_dim_at(i)});
    }
    if (c.post_norms) {
      check_shape(f, b + "post_attention_norm.weight", {E});
      check_shape(f, b + "post_ffw_norm.weight", {E});
    }
    if (c.layer_out_scale) check_shape(f, b + "layer_output_scale.weight", {1});
    if (const uint64_t P = c.n_embd_per_layer; P > 0) {
      check_shape(f, b + "inp_gate.weight", {E, P});
      check_shape(f, b + "proj.weight", {P, E});
      check_shape(f, b + "post_norm.weight", {E});
    }
  }
  return c;
}

}  // namespace wgllm

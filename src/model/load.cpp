#include "model/load.h"

#include <string>

#include "gguf/dequant.h"
#include "gguf/file.h"
#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/arch/arch.h"
#include "wgllm/error.h"

namespace wgllm {

using kernels::GpuWeight;

namespace {
constexpr auto kStorage = WGPUBufferUsage_Storage;
}  // namespace

std::span<const uint8_t> Uploader::data(const GgufTensor& t) const {
  const std::span<const uint8_t> bytes = f.tensor_data(t);
  if (check_finite)
    if (const auto at = find_non_finite(t.type, bytes.data(), t.n_elements))
      throw ModelError(f.label() + ": tensor '" + t.name + "' (" + type_name(t.type) + " " + t.shape_string() +
                       "): element " + std::to_string(*at) + (scale_fields(t.type).empty() ? "" : "'s block scale") +
                       " is NaN or infinite: the file is corrupt (the model would compute NaN)");
  return bytes;
}

void Uploader::advance(const GgufTensor& t) {
  done += t.n_bytes;
  if (progress) progress(done, total);
}

GpuWeight Uploader::matrix(const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  GpuWeight w = kernels::upload_weight(ctx, t.type, t.ne[0], t.ne[1], data(t), name);
  advance(t);
  return w;
}

bool Uploader::fusable(std::initializer_list<std::string> names) const {
  const GgufTensor& first = f.tensor(*names.begin());
  for (const auto& n : names) {
    const GgufTensor& t = f.tensor(n);
    if (t.type != first.type || t.ne[0] != first.ne[0]) return false;
  }
  return true;
}

GpuWeight Uploader::stacked(std::initializer_list<std::string> names, const std::string& label) {
  std::vector<std::span<const uint8_t>> parts;
  uint64_t rows = 0;
  for (const auto& n : names) {
    parts.push_back(data(f.tensor(n)));
    rows += f.tensor(n).ne[1];
  }
  const GgufTensor& t = f.tensor(*names.begin());
  GpuWeight w = kernels::upload_weight(ctx, t.type, t.ne[0], rows, kernels::concat_rows(parts), label);
  for (const auto& n : names) advance(f.tensor(n));
  return w;
}

GpuWeight Uploader::interleaved(const std::string& a, const std::string& b, const std::string& label) {
  const GgufTensor& ta = f.tensor(a);
  const GgufTensor& tb = f.tensor(b);
  if (ta.ne[1] != tb.ne[1]) throw ModelError(a + " and " + b + " differ in rows");
  GpuWeight w = kernels::upload_weight(ctx, ta.type, ta.ne[0], 2 * ta.ne[1],
                                       kernels::interleave_rows(data(ta), data(tb), ta.ne[1]), label);
  advance(ta);
  advance(tb);
  return w;
}

GpuWeight Uploader::experts(const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  GpuWeight w = kernels::upload_weight(ctx, t.type, t.ne[0], t.ne[1] * t.ne[2], data(t), name, 0, uint32_t(t.ne[2]));
  advance(t);
  return w;
}

GpuWeight Uploader::interleaved_experts(const std::string& a, const std::string& b, const std::string& label) {
  const GgufTensor& ta = f.tensor(a);
  const GgufTensor& tb = f.tensor(b);
  if (ta.ne[1] != tb.ne[1] || ta.ne[2] != tb.ne[2]) throw ModelError(a + " and " + b + " differ in shape");
  // Expert e's rows are rows [e * ne1, (e + 1) * ne1) of both: interleaving all rows pairs them within experts.
  const uint64_t rows = ta.ne[1] * ta.ne[2];
  GpuWeight w = kernels::upload_weight(ctx, ta.type, ta.ne[0], 2 * rows, kernels::interleave_rows(data(ta), data(tb), rows),
                                       label, 0, uint32_t(ta.ne[2]));
  advance(ta);
  advance(tb);
  return w;
}

std::vector<uint8_t> Uploader::alternate_runs(const GgufTensor& t, uint64_t run, uint32_t first) {
  const uint64_t row_bytes = tensor_bytes(t.type, t.ne[0]);
  if (run == 0 || t.ne[1] % (2 * run) != 0)
    throw ModelError(f.label() + ": tensor '" + t.name + "': " + std::to_string(t.ne[1]) +
                     " rows are not whole pairs of runs of " + std::to_string(run));
  const std::span<const uint8_t> all = data(t);
  std::vector<uint8_t> out;
  out.reserve(all.size() / 2);
  for (uint64_t r = first * run; r < t.ne[1]; r += 2 * run)
    out.insert(out.end(), all.begin() + r * row_bytes, all.begin() + (r + run) * row_bytes);
  return out;
}

std::vector<float> Uploader::floats(const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  std::vector<float> v(t.n_elements);
  dequantize_row(t.type, data(t).data(), v.data(), v.size());
  advance(t);
  return v;
}

gpu::Buffer Uploader::vector(const std::string& name) {
  const std::vector<float> v = floats(name);
  return ctx.upload(std::span<const float>(v), kStorage, name);
}

gpu::Buffer Uploader::norm(const std::string& name) {
  std::vector<float> v = floats(name);
  v.resize((v.size() + 7) / 8 * 8, 0.f);
  return ctx.upload(std::span<const float>(v), kStorage, name);
}

gpu::Buffer Uploader::stacked_vector(std::initializer_list<std::string> names, const std::string& label) {
  std::vector<float> all;
  for (const auto& n : names) {
    const std::vector<float> v = floats(n);
    all.insert(all.end(), v.begin(), v.end());
  }
  return ctx.upload(std::span<const float>(all), kStorage, label);
}

gpu::Buffer Uploader::interleaved_vector(const std::string& a, const std::string& b, const std::string& label) {
  const std::vector<float> va = floats(a), vb = floats(b);
  if (va.size() != vb.size()) throw ModelError(a + " and " + b + " differ in length");
  std::vector<float> all(2 * va.size());
  for (size_t i = 0; i < va.size(); ++i) {
    all[2 * i] = va[i];
    all[2 * i + 1] = vb[i];
  }
  return ctx.upload(std::span<const float>(all), kStorage, label);
}

std::string layer_prefix(uint32_t layer) { return "blk." + std::to_string(layer) + "."; }

GpuLayer upload_attention_layer(Uploader& up, const ModelConfig& c, uint32_t layer) {
  const std::string b = layer_prefix(layer);
  GpuLayer L;
  upload_attention(up, c, L, b);
  upload_ffn(up, c, L, b);
  return L;
}

void upload_attention(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& b) {
  L.attn_norm = up.norm(b + "attn_norm.weight");
  if (up.fusable({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"})) {
    L.wqkv = up.stacked({b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"}, b + "attn_qkv");
    if (c.attn_bias) L.bqkv = up.stacked_vector({b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}, b + "bqkv");
  } else if (up.fusable({b + "attn_q.weight", b + "attn_k.weight"})) {
    L.wqk = up.stacked({b + "attn_q.weight", b + "attn_k.weight"}, b + "attn_qk");
    L.wv = up.matrix(b + "attn_v.weight");
    if (c.attn_bias) {
      L.bqk = up.stacked_vector({b + "attn_q.bias", b + "attn_k.bias"}, b + "bqk");
      L.bv = up.vector(b + "attn_v.bias");
      // all three for the decode step's q/k + v product in one dispatch (encode_qkv_rope_append with v)
      L.bqkv = up.stacked_vector({b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}, b + "bqkv");
    }
  } else {
    L.wq = up.matrix(b + "attn_q.weight");
    L.wk = up.matrix(b + "attn_k.weight");
    L.wv = up.matrix(b + "attn_v.weight");
    if (c.attn_bias) {
      L.bq = up.vector(b + "attn_q.bias");
      L.bk = up.vector(b + "attn_k.bias");
      L.bv = up.vector(b + "attn_v.bias");
    }
  }
  if (c.qk_norm) {
    L.q_norm = up.vector(b + "attn_q_norm.weight");
    L.k_norm = up.vector(b + "attn_k_norm.weight");
  }
  L.wo = up.matrix(b + "attn_output.weight");
  if (c.attn_out_bias) L.bo = up.vector(b + "attn_output.bias");
  if (c.attn_sinks) L.attn_sinks = up.vector(b + "attn_sinks.weight");
}

void upload_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& b) {
  L.ffn_norm = up.norm(b + c.ffn_norm_name);
  if (up.fusable({b + "ffn_gate.weight", b + "ffn_up.weight"})) {
    L.w_gate_up = up.interleaved(b + "ffn_gate.weight", b + "ffn_up.weight", b + "ffn_gate_up");
  } else {
    L.w_gate = up.matrix(b + "ffn_gate.weight");
    L.w_up = up.matrix(b + "ffn_up.weight");
  }
  L.w_down = up.matrix(b + "ffn_down.weight");
}

void upload_moe_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& b) {
  L.ffn_norm = up.norm(b + c.ffn_norm_name);
  L.router = up.matrix(b + "ffn_gate_inp.weight");
  if (c.moe_bias) L.router_b = up.vector(b + "ffn_gate_inp.bias");
  const std::string gate = b + "ffn_gate_exps.", up_ = b + "ffn_up_exps.";
  if (up.fusable({gate + "weight", up_ + "weight"})) {
    L.exps_gate_up = up.interleaved_experts(gate + "weight", up_ + "weight", b + "ffn_gate_up_exps");
    if (c.moe_bias) L.exps_gate_up_b = up.interleaved_vector(gate + "bias", up_ + "bias", b + "ffn_gate_up_exps.bias");
  } else {
    L.exps_gate = up.experts(gate + "weight");
    L.exps_up = up.experts(up_ + "weight");
    if (c.moe_bias) {
      L.exps_gate_b = up.vector(gate + "bias");
      L.exps_up_b = up.vector(up_ + "bias");
    }
  }
  L.exps_down = up.experts(b + "ffn_down_exps.weight");
  if (c.moe_bias) L.exps_down_b = up.vector(b + "ffn_down_exps.bias");
  if (up.f.find_tensor(b + "exp_probs_b.bias")) L.exp_probs_b = up.vector(b + "exp_probs_b.bias");
}

void upload_layer_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, uint32_t layer) {
  if (c.is_moe_layer(layer))
    upload_moe_ffn(up, c, L, layer_prefix(layer));
  else  // dense: every layer of the dense architectures, the leading ones of a mixture (leading_dense_block_count)
    upload_ffn(up, c, L, layer_prefix(layer));
}

void upload_conv(Uploader& up, GpuLayer& L, const std::string& b) {
  L.attn_norm = up.norm(b + "attn_norm.weight");
  L.in_proj = up.matrix(b + "shortconv.in_proj.weight");
  L.conv = up.vector(b + "shortconv.conv.weight");
  L.out_proj = up.matrix(b + "shortconv.out_proj.weight");
}

GpuModel load_gpu_model(gpu::Context& ctx, const GgufFile& f) { return load_gpu_model(ctx, f, config_from_gguf(f)); }

GpuModel load_gpu_model(gpu::Context& ctx, const GgufFile& f, const ModelConfig& config, const LoadProgress& progress,
                        bool check_finite) {
  GpuModel m;
  m.config = config;
  const ModelConfig& c = m.config;
  for (uint32_t l = 0; l < c.n_layer; ++l)  // before any upload
    if (c.is_attention(l) && c.head_dim_at(l) > kernels::kAttentionMaxHeadDim)
      throw ModelError(f.label() + ": layer " + std::to_string(l) + " has heads of " +
                       std::to_string(c.head_dim_at(l)) + " dims; the GPU attention takes at most " +
                       std::to_string(kernels::kAttentionMaxHeadDim) + " (the CPU reference runs it)");
  Uploader up{ctx, f, progress, check_finite};
  for (const GgufTensor& t : f.tensors()) up.total += t.n_bytes;

  GpuWeights& w = m.weights;
  w.token_embd = up.matrix("token_embd.weight");
  const LayerProgram& program = layer_program(c.arch);
  w.layers.reserve(c.n_layer);
  for (uint32_t i = 0; i < c.n_layer; ++i) w.layers.push_back(program.upload(up, c, i));
  w.output_norm = up.norm(c.output_norm_name);
  if (c.n_embd_per_layer > 0) {  // gemma4's per-layer embeddings
    w.per_layer_token_embd = up.matrix("per_layer_token_embd.weight");
    w.per_layer_model_proj = up.matrix("per_layer_model_proj.weight");
    w.per_layer_proj_norm = up.vector("per_layer_proj_norm.weight");
  }
  if (!c.tied_embeddings) w.output = up.matrix("output.weight");
  const std::vector<float> factors = c.has_rope_freqs_tensor
                                         ? up.floats("rope_freqs.weight")
                                         : kernels::rope_freq_factors(c.rope_scaling, c.rope_dim, c.rope_base);
  w.rope_table = kernels::upload_rope_table(ctx, c.rope_dim, c.rope_base, factors);
  if (!c.swa_layers.empty())  // local layers: their own base and scaling (gemma3: none; gpt-oss: the global one)
    w.rope_table_swa = kernels::upload_rope_table(  // gemma4: over the local heads' own RoPE dims
        ctx, c.rope_dim_swa ? c.rope_dim_swa : c.rope_dim, c.rope_base_swa,
        kernels::rope_freq_factors(c.rope_scaling_swa, c.rope_dim_swa ? c.rope_dim_swa : c.rope_dim, c.rope_base_swa));
  ctx.check_errors();  // out of memory shows up here

  // A token reads the router and n_expert_used of the n_expert experts.
  auto expert_bytes = [](const GpuLayer& L) {
    return L.exps_gate_up.gpu_bytes() + L.exps_gate.gpu_bytes() + L.exps_up.gpu_bytes() + L.exps_down.gpu_bytes() +
           L.exps_gate_up_b.size + L.exps_gate_b.size + L.exps_up_b.size + L.exps_down_b.size;
  };
  auto layer_bytes = [](const GpuLayer& L) {
    return L.router.gpu_bytes() + L.wqkv.gpu_bytes() + L.wqk.gpu_bytes() + L.wq.gpu_bytes() + L.wk.gpu_bytes() + L.wv.gpu_bytes() +
           L.wo.gpu_bytes() + L.bo.size + L.attn_sinks.size + L.router_b.size + L.w_gate_up.gpu_bytes() + L.w_gate.gpu_bytes() + L.w_up.gpu_bytes() +
           L.w_down.gpu_bytes() + L.attn_norm.size + L.ffn_norm.size + L.bqkv.size + L.bqk.size + L.bq.size +
           L.bk.size + L.bv.size + L.q_norm.size + L.k_norm.size + L.post_attn_norm.size + L.post_ffn_norm.size +
           L.in_proj.gpu_bytes() + L.conv.size + L.out_proj.gpu_bytes() + L.wgate.gpu_bytes() + L.ssm_in.gpu_bytes() +
           L.ssm_zab.gpu_bytes() + L.ssm_qkv.gpu_bytes() + L.ssm_z.gpu_bytes() + L.ssm_alpha.gpu_bytes() + L.ssm_beta.gpu_bytes() +
           L.ssm_conv.size + L.ssm_consts.size + L.ssm_norm.size + L.ssm_out.gpu_bytes();
  };
  uint64_t all_experts = 0;
  for (const GpuLayer& L : w.layers) {
    m.bytes_per_token += layer_bytes(L) + (c.is_moe() ? expert_bytes(L) * c.n_expert_used / c.n_expert : 0);
    all_experts += expert_bytes(L);
  }
  m.bytes_per_token += m.logits_weight().gpu_bytes() + w.output_norm.size + w.per_layer_model_proj.gpu_bytes();
  for (const GpuLayer& L : w.layers) m.bytes_per_token += L.ple_gate.gpu_bytes() + L.ple_proj.gpu_bytes();
  uint64_t read_experts = 0;
  for (const GpuLayer& L : w.layers) read_experts += c.is_moe() ? expert_bytes(L) * c.n_expert_used / c.n_expert : 0;
  m.weight_bytes = m.bytes_per_token - read_experts + all_experts + w.rope_table.size + w.rope_table_swa.size +
                   (c.tied_embeddings ? 0 : w.token_embd.gpu_bytes()) + w.per_layer_token_embd.gpu_bytes();
  return m;
}

}  // namespace wgllm

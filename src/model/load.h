// Uploading a GGUF's weights (load.cpp): the Uploader, and the weights of the blocks every architecture shares
// (attention, FFN, short convolution), which an architecture's layer program (model/arch/) uploads in its order.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "gpu/context.h"
#include "kernels/weight.h"
#include "model/transformer.h"

namespace wgllm {

class GgufFile;
struct GgufTensor;

// Uploads GGUF tensors, counting the bytes for the progress callback; with check_finite, a tensor holding a NaN or
// an infinity is refused by name before it is uploaded.
struct Uploader {
  gpu::Context& ctx;
  const GgufFile& f;
  const LoadProgress& progress;
  bool check_finite = true;
  uint64_t done = 0, total = 0;

  std::span<const uint8_t> data(const GgufTensor& t) const;
  void advance(const GgufTensor& t);
  kernels::GpuWeight matrix(const std::string& name);
  // True when the tensors share a type and an input width (so one fused weight can hold them).
  bool fusable(std::initializer_list<std::string> names) const;
  // the tensors' rows stacked into one weight (q, k, v; or q and k).
  kernels::GpuWeight stacked(std::initializer_list<std::string> names, const std::string& label);
  // gate and up interleaved row by row.
  kernels::GpuWeight interleaved(const std::string& a, const std::string& b, const std::string& label);
  // A [n_expert][rows][in] tensor as stacked experts (GpuWeight::n_experts); two of them (gate and up) interleaved
  // row by row, so each expert's rows are (gate, up) pairs.
  kernels::GpuWeight experts(const std::string& name);
  kernels::GpuWeight interleaved_experts(const std::string& a, const std::string& b, const std::string& label);
  // The rows of t taken in runs of `run`, every other run from run `first` (0 or 1): one half of each head of a
  // tensor stored [head][2][run] rows (qwen35's attn_q: each head's q rows, then its gate rows). Not counted as
  // uploaded (advance when done).
  std::vector<uint8_t> alternate_runs(const GgufTensor& t, uint64_t run, uint32_t first);
  std::vector<float> floats(const std::string& name);
  gpu::Buffer vector(const std::string& name);
  // A norm weight, zero-padded to a multiple of 8 floats (read as vec4 by the fused norm).
  gpu::Buffer norm(const std::string& name);
  gpu::Buffer stacked_vector(std::initializer_list<std::string> names, const std::string& label);
  // Two vectors of one length interleaved element by element (the biases of interleaved gate and up rows).
  gpu::Buffer interleaved_vector(const std::string& a, const std::string& b, const std::string& label);
};

// "blk.<layer>.", the prefix of a layer's tensor names.
std::string layer_prefix(uint32_t layer);
// An attention layer's weights: attn_norm, q/k/v (stacked when they share a type; biases with attn_bias), the per-head
// q/k norms (qk_norm), the output projection wo (its bias with attn_out_bias) and the sinks (attn_sinks).
void upload_attention(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& prefix);
// A layer of attention then the FFN (upload_attention, upload_ffn): llama's, and the start of gemma3's.
GpuLayer upload_attention_layer(Uploader& up, const ModelConfig& c, uint32_t layer);
// The FFN of every architecture: its norm (config.ffn_norm_name), gate/up interleaved when they share a type, and down.
void upload_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& prefix);
// A mixture of experts' weights (config.is_moe_layer): its norm, the router, the experts' gate/up (interleaved when
// they share a type) and down, the selection bias where the file has one (lfm2moe) and the biases (moe_bias).
void upload_moe_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, const std::string& prefix);
// upload_moe_ffn on a mixture-of-experts layer (config.is_moe_layer), else upload_ffn.
void upload_layer_ffn(Uploader& up, const ModelConfig& c, GpuLayer& L, uint32_t layer);
// A short-convolution layer's weights (lfm2): attn_norm (the operator norm), in_proj, the conv taps and out_proj.
void upload_conv(Uploader& up, GpuLayer& L, const std::string& prefix);

}  // namespace wgllm

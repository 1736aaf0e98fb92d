// What a GGUF file holds, read without a GPU: what `wgllm inspect` shows.
//
//   const wgllm::GgufSummary s = wgllm::inspect_gguf("model.gguf");
//   for (const auto& t : s.tensors) std::printf("%s %s\n", t.name.c_str(), t.type.c_str());
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "wgllm/error.h"

namespace wgllm {

// One metadata key as `wgllm inspect --metadata` lists it.
struct GgufMetadataRow {
  std::string key = {};
  std::string type = {};  // "u32", "f32", "string", "bool", ... or "array" (the value names the element type)
  std::string value =
      {};  // for display: strings quoted and cut at 60 characters, arrays summarised by their first items
};

struct GgufTensorRow {
  std::string name = {};
  std::string type = {};             // "F32", "Q8_0", "Q4_K", "IQ2_XXS", ...
  bool runnable = true;              // a type wgllm runs (the parser accepts every type ggml defines)
  std::vector<uint64_t> shape = {};  // innermost (row length) first, as GGUF stores it
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t offset = 0;  // from the start of the data section
};

// The hyper-parameters wgllm reads from the metadata (a model it can run).
struct GgufHyperParameters {
  uint32_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  uint32_t n_ctx_train = 0;
  float rms_eps = 0;
  std::string rope_type = {};  // "normal" (adjacent pairs) or "neox" (halves)
  float rope_base = 0;
  uint32_t rope_dim = 0;
  bool rope_freqs_tensor = false;  // rope_freqs.weight present
  bool rope_scaling = false;         // frequency scaling; the fields below apply when set
  std::string rope_scaling_type = {};  // "llama3" or "yarn"
  float rope_scaling_factor = 1, rope_scaling_low_freq_factor = 1, rope_scaling_high_freq_factor = 1;  // low/high: llama3
  float rope_scaling_beta_fast = 0, rope_scaling_beta_slow = 0;  // yarn
  uint32_t rope_scaling_original_context = 0;
  bool qk_norm = false, attn_bias = false, tied_embeddings = false;
  bool attn_sinks = false;  // a learned sink logit per attention head (gpt-oss)
  // One letter per layer: A attention, L local (sliding-window) attention, C short convolution (lfm2), D gated
  // DeltaNet (qwen35).
  std::string layer_pattern = {};
  uint32_t sliding_window = 0;  // local layers' window (gemma3); 0 without
  uint32_t conv_taps = 0;       // shortconv.l_cache of the convolution layers (lfm2); 0 without
  // qwen35's DeltaNet layers (0 without): key and value heads, their dimensions, the convolution's taps
  uint32_t delta_k_heads = 0, delta_v_heads = 0, delta_dk = 0, delta_dv = 0, delta_taps = 0;
  bool attn_gated = false;  // the attention output times sigmoid of a gate from the q projection (qwen35)
  // Mixtures of experts (qwen3moe, lfm2moe, gpt-oss): the FFN of every layer from n_dense_lead on is n_expert experts of
  // n_ff_exp, n_expert_used per token, chosen by a softmax router or (moe_sigmoid) a sigmoid one with a selection bias.
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_dense_lead = 0;
  bool moe_sigmoid = false;
  // gemma4 (0 / empty otherwise): the local layers' head width and RoPE dims (head_dim, rope_dim and n_head_kv are
  // the global layers'), each layer's KV heads and FFN width, the layer whose KV cache each layer attends over
  // (itself but in the sharing layers), the per-layer embedding width.
  uint32_t head_dim_swa = 0, rope_dim_swa = 0, n_embd_per_layer = 0;
  std::vector<uint32_t> layer_n_head_kv = {}, layer_n_ff = {}, layer_kv_source = {};
};

struct GgufTokenizerSummary {
  std::optional<std::string> model = {};    // tokenizer.ggml.model
  std::optional<std::string> pre = {};      // tokenizer.ggml.pre
  std::optional<uint64_t> vocab_size = {};  // entries of tokenizer.ggml.tokens
  std::optional<uint64_t> merges = {};      // entries of tokenizer.ggml.merges
  std::optional<uint32_t> bos_id, eos_id, unknown_id, padding_id;
  std::optional<uint32_t> cls_id, sep_id;  // BERT vocabularies' [CLS] and [SEP] (tokenizer.ggml.cls_token_id, ...)
  std::optional<bool> add_bos = {};
  bool chat_template = false;  // tokenizer.chat_template present
};

struct GgufSummary {
  std::string path = {};
  uint64_t file_size = 0;
  uint32_t version = 0, alignment = 0;
  uint64_t data_offset = 0;                      // start of the tensor data section
  std::optional<std::string> architecture = {};  // general.architecture
  std::optional<std::string> name = {};          // general.name
  // The hyper-parameters, or why wgllm cannot run the file (config_error, one line; config is then empty).
  std::optional<GgufHyperParameters> config = {};
  std::string config_error = {};
  GgufTokenizerSummary tokenizer;
  std::vector<GgufMetadataRow> metadata = {};  // sorted by key
  std::vector<GgufTensorRow> tensors = {};     // in file order
};

// Reads the file's header, metadata and tensor infos (the data is mapped, not read). ModelError (one line, naming
// the field and byte offset) when the file cannot be opened or is malformed, or a well-known key has the wrong type.
GgufSummary inspect_gguf(const std::string& path);

}  // namespace wgllm

// Writes GGUF files in memory for the tests and the fuzz seeds: metadata of every type, tensors, alignment, and
// the byte offsets of each section so that tests can truncate or patch a file at a chosen place.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace wgllm::test {

// One encoded metadata value: its type id and payload bytes (as they follow the type in a KV).
struct GVal {
  uint32_t type = 0;
  std::vector<uint8_t> bytes;

  template <typename T>
  static GVal scalar(uint32_t type, T v) {
    GVal g{type, std::vector<uint8_t>(sizeof(T))};
    std::memcpy(g.bytes.data(), &v, sizeof(T));
    return g;
  }
  static GVal u8(uint8_t v) { return scalar(0, v); }
  static GVal i8(int8_t v) { return scalar(1, v); }
  static GVal u16(uint16_t v) { return scalar(2, v); }
  static GVal i16(int16_t v) { return scalar(3, v); }
  static GVal u32(uint32_t v) { return scalar(4, v); }
  static GVal i32(int32_t v) { return scalar(5, v); }
  static GVal f32(float v) { return scalar(6, v); }
  static GVal boolean(bool v) { return scalar(7, uint8_t{v}); }
  static GVal u64(uint64_t v) { return scalar(10, v); }
  static GVal i64(int64_t v) { return scalar(11, v); }
  static GVal f64(double v) { return scalar(12, v); }
  static GVal str(const std::string& s) {
    GVal g{8, std::vector<uint8_t>(8 + s.size())};
    const uint64_t n = s.size();
    std::memcpy(g.bytes.data(), &n, 8);
    if (n) std::memcpy(g.bytes.data() + 8, s.data(), s.size());
    return g;
  }
  // An array of `elem_type` whose elements are `elems` (each of that type); `length` overrides the count.
  static GVal array(uint32_t elem_type, const std::vector<GVal>& elems, std::optional<uint64_t> length = {}) {
    GVal g = scalar(9, elem_type);
    const uint64_t n = length.value_or(elems.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&n);
    g.bytes.insert(g.bytes.end(), p, p + 8);
    for (const auto& e : elems) g.bytes.insert(g.bytes.end(), e.bytes.begin(), e.bytes.end());
    return g;
  }
  static GVal strings(const std::vector<std::string>& v) {
    std::vector<GVal> e;
    for (const auto& s : v) e.push_back(str(s));
    return array(8, e);
  }
  static GVal f32s(const std::vector<float>& v) {
    std::vector<GVal> e;
    for (float x : v) e.push_back(f32(x));
    return array(6, e);
  }
  static GVal i32s(const std::vector<int32_t>& v) {
    std::vector<GVal> e;
    for (int32_t x : v) e.push_back(i32(x));
    return array(5, e);
  }
};

struct GTensor {
  std::string name;
  std::vector<uint64_t> dims;      // GGUF order: dims[0] = row length
  uint32_t type = 0;               // ggml type id
  std::vector<uint8_t> data;       // empty: zeros of the size the type implies
  std::optional<uint64_t> offset;  // override the data offset (relative to the data section)
  std::optional<uint32_t> n_dims;  // override the written n_dims
};

inline uint64_t gguf_nbytes(uint32_t type, const std::vector<uint64_t>& dims) {
  uint64_t n = 1;
  for (auto d : dims) n *= d;
  switch (type) {
    case 0: return n * 4;
    case 1:
    case 30: return n * 2;
    case 8: return n / 32 * 34;
    case 2: return n / 32 * 18;
    case 6: return n / 32 * 22;     // Q5_0
    case 12: return n / 256 * 144;  // Q4_K
    case 14: return n / 256 * 210;  // Q6_K
    case 16: return n / 256 * 66;   // IQ2_XXS
    default: return 0;
  }
}

class GgufBuilder {
 public:
  uint32_t version = 3;
  uint32_t alignment = 32;  // used for padding; add a general.alignment KV yourself to declare another one
  std::optional<uint64_t> n_tensors_override, n_kv_override;

  // Section boundaries of the last build().
  struct Layout {
    size_t header_end = 0;         // after magic, version, counts (24)
    std::vector<size_t> kv_start;  // each KV's first byte
    size_t kv_end = 0;             // end of metadata = first tensor info
    std::vector<size_t> tensor_info_start;
    size_t infos_end = 0;
    size_t data_start = 0;
    std::vector<size_t> tensor_data_start;
    size_t end = 0;
  } layout;

  GgufBuilder& kv(const std::string& key, const GVal& v) {
    kvs_.push_back({key, v});
    return *this;
  }
  // Replaces the value of `key` (keeping its place) or appends it.
  GgufBuilder& set(const std::string& key, const GVal& v) {
    for (auto& kv : kvs_)
      if (kv.first == key) {
        kv.second = v;
        return *this;
      }
    return kv(key, v);
  }
  GgufBuilder& without(const std::string& key) {
    std::erase_if(kvs_, [&](const auto& kv) { return kv.first == key; });
    return *this;
  }
  GgufBuilder& without_tensor(const std::string& name) {
    std::erase_if(tensors_, [&](const GTensor& t) { return t.name == name; });
    return *this;
  }
  GgufBuilder& tensor(GTensor t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  // A zero-filled tensor.
  GgufBuilder& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type = 0) {
    return tensor(GTensor{name, std::move(dims), type, {}, {}, {}});
  }

  std::vector<uint8_t> build() {
    std::vector<uint8_t> b;
    layout = {};
    put(b, "GGUF", 4);
    put_v(b, version);
    put_v(b, n_tensors_override.value_or(tensors_.size()));
    put_v(b, n_kv_override.value_or(kvs_.size()));
    layout.header_end = b.size();
    for (const auto& [key, v] : kvs_) {
      layout.kv_start.push_back(b.size());
      put_v(b, uint64_t{key.size()});
      put(b, key.data(), key.size());
      put_v(b, v.type);
      put(b, v.bytes.data(), v.bytes.size());
    }
    layout.kv_end = b.size();
    // Data offsets: consecutive, each aligned, unless overridden.
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t size = t.data.empty() ? gguf_nbytes(t.type, t.dims) : t.data.size();
      offsets.push_back(t.offset.value_or(next));
      next = align(next + size);
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      layout.tensor_info_start.push_back(b.size());
      put_v(b, uint64_t{t.name.size()});
      put(b, t.name.data(), t.name.size());
      put_v(b, t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      for (auto d : t.dims) put_v(b, d);
      put_v(b, t.type);
      put_v(b, offsets[i]);
    }
    layout.infos_end = b.size();
    if (tensors_.empty()) {
      layout.data_start = layout.end = b.size();
      return b;
    }
    b.resize(align(b.size()), 0);
    layout.data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      layout.tensor_data_start.push_back(layout.data_start + offsets[i]);
      if (t.offset) continue;  // overridden offsets point wherever the test wants; no data written
      b.resize(layout.data_start + offsets[i], 0);
      if (t.data.empty())
        b.resize(b.size() + gguf_nbytes(t.type, t.dims), 0);
      else
        b.insert(b.end(), t.data.begin(), t.data.end());
    }
    layout.end = b.size();  // no padding after the last tensor: every shorter prefix is truncated
    return b;
  }

 private:
  uint64_t align(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }
  static void put(std::vector<uint8_t>& b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  template <typename T>
  static void put_v(std::vector<uint8_t>& b, T v) {
    put(b, &v, sizeof v);
  }

  std::vector<std::pair<std::string, GVal>> kvs_;
  std::vector<GTensor> tensors_;
};

// A small, complete model of `arch` ("llama", "qwen2", "qwen3") that config_from_gguf accepts:
// n_embd 16, 2 layers, 4 heads, 2 KV heads (head_dim 4), n_ff 32, vocab 10.
inline GgufBuilder tiny_model(const std::string& arch, uint32_t wtype = 0) {  // wtype: F32, F16 or BF16
  GgufBuilder g;
  const std::string a = arch + ".";
  const uint64_t E = 16, L = 2, H = 4, HKV = 2, D = 4, F = 32, V = 10;
  g.kv("general.architecture", GVal::str(arch))
      .kv(a + "embedding_length", GVal::u32(E))
      .kv(a + "block_count", GVal::u32(L))
      .kv(a + "attention.head_count", GVal::u32(H))
      .kv(a + "attention.head_count_kv", GVal::u32(HKV))
      .kv(a + "feed_forward_length", GVal::u32(F))
      .kv(a + "context_length", GVal::u32(256))
      .kv(a + "attention.layer_norm_rms_epsilon", GVal::f32(1e-6f))
      .kv(a + "rope.freq_base", GVal::f32(arch == "llama" ? 10000.f : 1000000.f));
  std::vector<std::string> toks;
  for (uint64_t i = 0; i < V; ++i) toks.push_back(std::string(1, static_cast<char>('a' + i)));
  g.kv("tokenizer.ggml.model", GVal::str(arch == "llama" ? "llama" : "gpt2"))
      .kv("tokenizer.ggml.tokens", GVal::strings(toks))
      .kv("tokenizer.ggml.bos_token_id", GVal::u32(1))
      .kv("tokenizer.ggml.eos_token_id", GVal::u32(2));
  g.tensor("token_embd.weight", {E, V}, wtype).tensor("output_norm.weight", {E});
  for (uint64_t i = 0; i < L; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    g.tensor(b + "attn_norm.weight", {E})
        .tensor(b + "attn_q.weight", {E, H * D}, wtype)
        .tensor(b + "attn_k.weight", {E, HKV * D}, wtype)
        .tensor(b + "attn_v.weight", {E, HKV * D}, wtype)
        .tensor(b + "attn_output.weight", {H * D, E}, wtype);
    if (arch == "qwen2")
      g.tensor(b + "attn_q.bias", {H * D}).tensor(b + "attn_k.bias", {HKV * D}).tensor(b + "attn_v.bias", {HKV * D});
    if (arch == "qwen3") g.tensor(b + "attn_q_norm.weight", {D}).tensor(b + "attn_k_norm.weight", {D});
    g.tensor(b + "ffn_norm.weight", {E})
        .tensor(b + "ffn_gate.weight", {E, F}, wtype)
        .tensor(b + "ffn_up.weight", {E, F}, wtype)
        .tensor(b + "ffn_down.weight", {F, E}, wtype);
  }
  return g;
}

// A gemma4 file as llama.cpp's converter writes it: 4 layers local, global, local, global, the last 2 sharing the KV
// caches of layers 0 and 1; local heads of 4 (RoPE on all 4 dims), global heads of global_head_dim with 1 KV head and
// no attn_v (v = k; their RoPE through rope_freqs); double-wide FFNs in the sharing layers; per-layer embeddings of 4.
inline GgufBuilder tiny_gemma4(uint64_t global_head_dim = 8) {
  auto g = tiny_model("gemma4");
  for (const char* t : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                        "ffn_down"})
    for (int i = 0; i < 2; ++i) g.without_tensor("blk." + std::to_string(i) + "." + t + ".weight");
  std::vector<GVal> swa, kv, ff;
  for (uint32_t i = 0; i < 4; ++i) {
    swa.push_back(GVal::boolean(i % 2 == 0));
    kv.push_back(GVal::u32(i % 2 == 0 ? 2 : 1));
    ff.push_back(GVal::u32(i < 2 ? 32 : 64));
  }
  g.set("gemma4.block_count", GVal::u32(4))
      .set("gemma4.attention.head_count_kv", GVal::array(4, kv))
      .set("gemma4.feed_forward_length", GVal::array(4, ff))
      .set("gemma4.attention.key_length", GVal::u32(uint32_t(global_head_dim)))
      .set("gemma4.attention.value_length", GVal::u32(uint32_t(global_head_dim)))
      .set("gemma4.attention.key_length_swa", GVal::u32(4))
      .set("gemma4.attention.value_length_swa", GVal::u32(4))
      .set("gemma4.rope.dimension_count", GVal::u32(uint32_t(global_head_dim)))
      .set("gemma4.rope.dimension_count_swa", GVal::u32(4))
      .set("gemma4.rope.freq_base_swa", GVal::f32(10000.f))
      .set("gemma4.attention.sliding_window", GVal::u32(5))
      .set("gemma4.attention.sliding_window_pattern", GVal::array(7, swa))
      .set("gemma4.attention.shared_kv_layers", GVal::u32(2))
      .set("gemma4.embedding_length_per_layer_input", GVal::u32(4))
      .set("gemma4.final_logit_softcapping", GVal::f32(30.f));
  std::vector<uint8_t> ones(global_head_dim / 2 * 4);  // the RoPE factors: 1.0f each
  for (size_t i = 0; i < ones.size(); i += 4) {
    const float one = 1.f;
    std::memcpy(&ones[i], &one, 4);
  }
  g.tensor(GTensor{"rope_freqs.weight", {global_head_dim / 2}, 0, ones, {}, {}});
  g
      .tensor("per_layer_token_embd.weight", {16, 10})
      .tensor("per_layer_model_proj.weight", {16, 16})
      .tensor("per_layer_proj_norm.weight", {4});
  for (uint64_t i = 0; i < 4; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const uint64_t D = i % 2 == 0 ? 4 : global_head_dim, KV = i % 2 == 0 ? 2 * D : D, F = i < 2 ? 32 : 64;
    g.tensor(b + "attn_norm.weight", {16})
        .tensor(b + "attn_q.weight", {16, 4 * D})
        .tensor(b + "attn_output.weight", {4 * D, 16})
        .tensor(b + "attn_q_norm.weight", {D})
        .tensor(b + "post_attention_norm.weight", {16})
        .tensor(b + "ffn_norm.weight", {16})
        .tensor(b + "ffn_gate.weight", {16, F})
        .tensor(b + "ffn_up.weight", {16, F})
        .tensor(b + "ffn_down.weight", {F, 16})
        .tensor(b + "post_ffw_norm.weight", {16})
        .tensor(b + "layer_output_scale.weight", {1})
        .tensor(b + "inp_gate.weight", {16, 4})
        .tensor(b + "proj.weight", {4, 16})
        .tensor(b + "post_norm.weight", {16});
    if (i >= 2) continue;  // the sharing layers have no k, v or k norm
    g.tensor(b + "attn_k.weight", {16, KV}).tensor(b + "attn_k_norm.weight", {D});
    if (i == 0) g.tensor(b + "attn_v.weight", {16, KV});
  }
  return g;
}

}  // namespace wgllm::test

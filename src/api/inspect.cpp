// wgllm/inspect.h: a GGUF file's header, metadata, tensors and the config wgllm reads from it, as display rows.
#include "wgllm/inspect.h"

#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

#include "gguf/file.h"
#include "model/config.h"

namespace wgllm {

namespace {

std::string shorten(std::string_view s, size_t n = 60) {
  std::string out;
  for (const char c : s.substr(0, n)) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return s.size() > n ? out + "..." : out;
}

std::string summarise(const GgufArray& a, size_t first = 5) {
  std::ostringstream s;
  s << "array of " << value_type_name(a.elem_type()) << " [" << a.size() << "]";
  if (a.size() == 0) return s.str();
  s << ": ";
  for (size_t i = 0; i < a.size() && i < first; ++i) {
    if (i) s << ", ";
    switch (a.elem_type()) {
      case GgufValueType::String: s << "'" << shorten(a.string(i), 30) << "'"; break;
      case GgufValueType::Array: s << "(" << summarise(a.array(i), 2) << ")"; break;
      case GgufValueType::Bool: s << (a.boolean(i) ? "true" : "false"); break;
      case GgufValueType::F32:
      case GgufValueType::F64: s << a.f64(i); break;
      case GgufValueType::I8:
      case GgufValueType::I16:
      case GgufValueType::I32:
      case GgufValueType::I64: s << a.i64(i); break;
      case GgufValueType::U8:
      case GgufValueType::U16:
      case GgufValueType::U32:
      case GgufValueType::U64: s << a.u64(i); break;
    }
  }
  if (a.size() > first) s << ", ...";
  return s.str();
}

std::string value_string(const GgufValue& v) {
  std::ostringstream s;
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, GgufArray>)
          s << summarise(x);
        else if constexpr (std::is_same_v<X, std::string>)
          s << "'" << shorten(x) << "'";
        else if constexpr (std::is_same_v<X, bool>)
          s << (x ? "true" : "false");
        else
          s << x;
      },
      v.v);
  return s.str();
}

GgufHyperParameters hyper_parameters(const ModelConfig& c) {
  GgufHyperParameters h;
  h.n_vocab = c.n_vocab, h.n_embd = c.n_embd, h.n_layer = c.n_layer;
  h.n_head = c.n_head, h.n_head_kv = c.n_head_kv, h.head_dim = c.head_dim, h.n_ff = c.n_ff;
  h.n_ctx_train = c.n_ctx_train;
  h.rms_eps = c.rms_eps;
  h.rope_type = c.rope_type == RopeType::Neox ? "neox" : "normal";
  h.rope_base = c.rope_base;
  h.rope_dim = c.rope_dim;
  h.rope_freqs_tensor = c.has_rope_freqs_tensor;
  h.rope_scaling = c.rope_scaling.enabled;
  h.rope_scaling_type = c.rope_scaling.kind == kernels::RopeScalingKind::Yarn ? "yarn" : "llama3";
  h.rope_scaling_beta_fast = c.rope_scaling.beta_fast;
  h.rope_scaling_beta_slow = c.rope_scaling.beta_slow;
  h.rope_scaling_factor = c.rope_scaling.factor;
  h.rope_scaling_low_freq_factor = c.rope_scaling.low_freq_factor;
  h.rope_scaling_high_freq_factor = c.rope_scaling.high_freq_factor;
  h.rope_scaling_original_context = c.rope_scaling.original_context;
  h.qk_norm = c.qk_norm, h.attn_bias = c.attn_bias, h.tied_embeddings = c.tied_embeddings;
  h.attn_sinks = c.attn_sinks;
  h.layer_pattern = c.layer_pattern();
  h.sliding_window = c.swa_layers.empty() ? 0 : c.sliding_window;
  h.conv_taps = c.conv_layers.empty() ? 0 : c.l_cache;
  if (!c.delta_layers.empty()) {
    h.delta_k_heads = c.ssm_k_heads, h.delta_v_heads = c.ssm_v_heads, h.delta_dk = c.ssm_dk, h.delta_dv = c.ssm_dv;
    h.delta_taps = c.ssm_conv;
  }
  h.attn_gated = c.attn_gated;
  h.n_expert = c.n_expert, h.n_expert_used = c.n_expert_used, h.n_ff_exp = c.n_ff_exp;
  h.n_dense_lead = c.n_dense_lead, h.moe_sigmoid = c.moe_sigmoid;
  h.head_dim_swa = c.head_dim_swa, h.rope_dim_swa = c.rope_dim_swa, h.n_embd_per_layer = c.n_embd_per_layer;
  h.layer_n_head_kv = c.layer_n_head_kv, h.layer_n_ff = c.layer_n_ff, h.layer_kv_source = c.layer_kv_source;
  return h;
}

std::optional<uint64_t> array_size(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v || v->type != GgufValueType::Array) return std::nullopt;
  return std::get<GgufArray>(v->v).size();
}

}  // namespace

GgufSummary inspect_gguf(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  GgufSummary s;
  s.path = path;
  s.file_size = f.file_size();
  s.version = f.version();
  s.alignment = f.alignment();
  s.data_offset = f.data_offset();
  s.architecture = f.find_string("general.architecture");
  s.name = f.find_string("general.name");
  try {
    s.config = hyper_parameters(config_from_gguf(f));
  } catch (const ModelError& e) {
    s.config_error = e.what();
  }
  GgufTokenizerSummary& t = s.tokenizer;
  t.model = f.find_string("tokenizer.ggml.model");
  t.pre = f.find_string("tokenizer.ggml.pre");
  t.vocab_size = array_size(f, "tokenizer.ggml.tokens");
  t.merges = array_size(f, "tokenizer.ggml.merges");
  t.bos_id = f.find_u32("tokenizer.ggml.bos_token_id");
  t.eos_id = f.find_u32("tokenizer.ggml.eos_token_id");
  t.unknown_id = f.find_u32("tokenizer.ggml.unknown_token_id");
  t.padding_id = f.find_u32("tokenizer.ggml.padding_token_id");
  t.cls_id = f.find_u32("tokenizer.ggml.cls_token_id");
  t.sep_id = f.find_u32("tokenizer.ggml.seperator_token_id");  // llama.cpp's spelling
  t.add_bos = f.find_bool("tokenizer.ggml.add_bos_token");
  t.chat_template = f.has("tokenizer.chat_template");
  for (const auto& [key, v] : f.metadata())
    s.metadata.push_back({key, v.type == GgufValueType::Array ? "array" : v.type_string(), value_string(v)});
  for (const GgufTensor& x : f.tensors())
    s.tensors.push_back({.name = x.name,
                         .type = type_name(x.type),
                         .runnable = is_supported_type(static_cast<uint32_t>(x.type)),
                         .shape = std::vector<uint64_t>(x.dims().begin(), x.dims().end()),
                         .n_elements = x.n_elements,
                         .n_bytes = x.n_bytes,
                         .offset = x.offset});
  return s;
}

}  // namespace wgllm

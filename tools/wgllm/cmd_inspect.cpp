// `wgllm inspect FILE.gguf`: what a GGUF file holds — version, architecture, hyper-parameters, tokenizer,
// tensor types and sizes; --tensors lists every tensor, --metadata every key.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "command.h"
#include "wgllm/error.h"
#include "wgllm/inspect.h"

namespace wgllm::cli {
namespace {

double mib(uint64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

std::string shorten(const std::string& s, size_t n = 60) {
  std::string out;
  for (const char c : s.substr(0, n)) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return s.size() > n ? out + "..." : out;
}

void print_config(const GgufHyperParameters& c) {
  std::printf("hyper-parameters\n");
  std::printf("  n_vocab        %u\n", c.n_vocab);
  std::printf("  n_embd         %u\n", c.n_embd);
  std::printf("  n_layer        %u\n", c.n_layer);
  std::printf("  n_head         %u (kv %u, head_dim %u)\n", c.n_head, c.n_head_kv, c.head_dim);
  if (!c.n_expert || c.n_dense_lead) std::printf("  n_ff           %u%s\n", c.n_ff, c.n_expert ? " (dense layers)" : "");
  if (c.n_expert) {
    const std::string layers =
        c.n_dense_lead ? "layers " + std::to_string(c.n_dense_lead) + ".." + std::to_string(c.n_layer - 1) : "every layer";
    std::printf("  experts        %u per layer, %u per token (%s router, top %u renormalised), expert FFN %u; %s\n",
                c.n_expert, c.n_expert_used, c.moe_sigmoid ? "sigmoid + selection bias" : "softmax", c.n_expert_used,
                c.n_ff_exp, layers.c_str());
  }
  std::printf("  n_ctx_train    %u\n", c.n_ctx_train);
  std::printf("  rms_eps        %g\n", static_cast<double>(c.rms_eps));
  std::printf("  rope           %s, base %g, dims %u%s\n", c.rope_type.c_str(), static_cast<double>(c.rope_base),
              c.rope_dim, c.rope_freqs_tensor ? ", rope_freqs tensor" : "");
  if (c.rope_scaling && c.rope_scaling_type == "yarn")
    std::printf("  rope scaling   yarn, factor %g, original context %u, beta fast %g, slow %g\n",
                static_cast<double>(c.rope_scaling_factor), c.rope_scaling_original_context,
                static_cast<double>(c.rope_scaling_beta_fast), static_cast<double>(c.rope_scaling_beta_slow));
  else if (c.rope_scaling)
    std::printf("  rope scaling   llama3, factor %g, low %g, high %g, original context %u\n",
                static_cast<double>(c.rope_scaling_factor), static_cast<double>(c.rope_scaling_low_freq_factor),
                static_cast<double>(c.rope_scaling_high_freq_factor), c.rope_scaling_original_context);
  std::printf("  qk_norm        %s\n", c.qk_norm ? "yes" : "no");
  std::printf("  attn_bias      %s\n", c.attn_bias ? "yes" : "no");
  if (c.attn_sinks) std::printf("  attn sinks     yes (a logit per head in every softmax)\n");
  if (c.attn_gated) std::printf("  attn gate      yes (the attention output times sigmoid(gate), per element)\n");
  std::printf("  tied embedding %s\n", c.tied_embeddings ? "yes" : "no");
  if (c.layer_pattern.find_first_not_of('A') != std::string::npos)
    std::printf("  layers         %s (A attention, L local attention, C short convolution, D gated DeltaNet)\n",
                c.layer_pattern.c_str());
  if (c.sliding_window) std::printf("  sliding window %u\n", c.sliding_window);
  if (c.conv_taps)
    std::printf("  conv taps      %u (short convolution over the last %u positions)\n", c.conv_taps, c.conv_taps);
  if (c.delta_v_heads)
    std::printf("  deltanet       %u key heads x %u, %u value heads x %u (a %ux%u state each), conv taps %u\n",
                c.delta_k_heads, c.delta_dk, c.delta_v_heads, c.delta_dv, c.delta_dk, c.delta_dv, c.delta_taps);
  if (c.head_dim_swa)
    std::printf("  local heads    head_dim %u, rope dims %u (the global layers': above)\n", c.head_dim_swa,
                c.rope_dim_swa);
  auto per_layer = [](const std::vector<uint32_t>& v) {
    std::string s;
    for (size_t l = 0; l < v.size(); ++l) s += (l ? "," : "") + std::to_string(v[l]);
    return s;
  };
  if (!c.layer_n_head_kv.empty()) std::printf("  kv heads       %s (per layer)\n", per_layer(c.layer_n_head_kv).c_str());
  if (!c.layer_n_ff.empty()) std::printf("  ffn            %s (per layer)\n", per_layer(c.layer_n_ff).c_str());
  std::string shared;
  for (size_t l = 0; l < c.layer_kv_source.size(); ++l)
    if (c.layer_kv_source[l] != l)
      shared += (shared.empty() ? "" : ", ") + std::to_string(l) + " <- " + std::to_string(c.layer_kv_source[l]);
  if (!shared.empty()) std::printf("  shared kv      %s (layer <- the layer whose KV cache it reads)\n", shared.c_str());
  if (c.n_embd_per_layer) std::printf("  per-layer emb  %u per token and layer\n", c.n_embd_per_layer);
}

void print_tokenizer(const GgufTokenizerSummary& t) {
  std::printf("tokenizer\n");
  std::printf("  model          %s\n", t.model.value_or("(none)").c_str());
  if (t.pre) std::printf("  pre            %s\n", t.pre->c_str());
  if (t.vocab_size) std::printf("  vocab size     %llu\n", static_cast<unsigned long long>(*t.vocab_size));
  if (t.merges) std::printf("  merges         %llu\n", static_cast<unsigned long long>(*t.merges));
  for (const auto& [k, id] :
       {std::pair{"bos", t.bos_id}, std::pair{"eos", t.eos_id}, std::pair{"cls", t.cls_id}, std::pair{"sep", t.sep_id},
        std::pair{"unknown", t.unknown_id}, std::pair{"padding", t.padding_id}})
    if (id) std::printf("  %-14s %u\n", (std::string(k) + " id").c_str(), *id);
  if (t.add_bos) std::printf("  add bos        %s\n", *t.add_bos ? "yes" : "no");
  std::printf("  chat template  %s\n", t.chat_template ? "yes" : "no");
}

// "[4096, 32000]"
std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int run_inspect(const std::string& path, bool tensors, bool metadata) {
  const GgufSummary f = inspect_gguf(path);
  std::printf("file           %s (%.1f MiB)\n", path.c_str(), mib(f.file_size));
  std::printf("GGUF version   %u, alignment %u, data at byte %llu\n", f.version, f.alignment,
              static_cast<unsigned long long>(f.data_offset));
  std::printf("architecture   %s\n", f.architecture.value_or("(none)").c_str());
  if (f.name) std::printf("name           %s\n", shorten(*f.name).c_str());
  if (f.config) print_config(*f.config);
  print_tokenizer(f.tokenizer);

  std::map<std::string, std::pair<size_t, uint64_t>> per_type;
  std::map<std::string, bool> runnable;
  uint64_t total = 0, params = 0;
  for (const auto& t : f.tensors) {
    runnable[t.type] = t.runnable;
    auto& [count, bytes] = per_type[t.type];
    ++count;
    bytes += t.n_bytes;
    total += t.n_bytes;
    params += t.n_elements;
  }
  const double p = static_cast<double>(params);
  std::printf("tensors        %zu (%.2f%s parameters)\n", f.tensors.size(), p >= 1e9 ? p / 1e9 : p / 1e6,
              p >= 1e9 ? "B" : "M");
  std::printf("  %-7s %6s %12s\n", "type", "count", "MiB");
  for (const auto& [name, cb] : per_type)
    std::printf("  %-7s %6zu %12.2f%s\n", name.c_str(), cb.first, mib(cb.second),
                runnable[name] ? "" : "  (a type wgllm cannot run)");
  std::printf("  %-7s %6zu %12.2f\n", "total", f.tensors.size(), mib(total));

  if (tensors) {
    std::printf("\n%-40s %-7s %-28s %12s\n", "tensor", "type", "dims", "bytes");
    for (const auto& t : f.tensors)
      std::printf("%-40s %-7s %-28s %12llu\n", t.name.c_str(), t.type.c_str(), shape_string(t.shape).c_str(),
                  static_cast<unsigned long long>(t.n_bytes));
  }
  if (metadata) {
    std::printf("\nmetadata (%zu keys)\n", f.metadata.size());
    for (const GgufMetadataRow& m : f.metadata)
      std::printf("  %-44s %-6s %s\n", m.key.c_str(), m.type.c_str(), m.value.c_str());
  }
  // The file is shown whole either way; what keeps `run` from it is a note, not a failure of inspect.
  if (!f.config_error.empty()) std::printf("\nnote: wgllm cannot run this file: %s\n", f.config_error.c_str());
  return 0;
}

const Register reg{{"inspect", "show what a GGUF model file holds", [](CLI::App& app) -> std::function<int()> {
                      auto path = std::make_shared<std::string>();
                      auto model = std::make_shared<std::string>();
                      auto tensors = std::make_shared<bool>(false);
                      auto metadata = std::make_shared<bool>(false);
                      auto* file = app.add_option("file", *path, "the .gguf file");
                      auto* m = app.add_option("-m,--model", *model, "the .gguf file (as the other commands take it)");
                      file->excludes(m);
                      app.add_flag("--tensors", *tensors, "list every tensor (name, type, dims, bytes)");
                      app.add_flag("--metadata", *metadata, "list every metadata key (arrays summarised)");
                      return [=] {
                        try {
                          if (path->empty() && model->empty()) throw InvalidArgument("no file: pass -m FILE (or FILE)");
                          return run_inspect(model->empty() ? *path : *model, *tensors, *metadata);
                        } catch (const Error& e) {
                          std::fprintf(stderr, "wgllm: error: %s\n", e.what());
                          return 1;
                        }
                      };
                    }}};

}  // namespace
}  // namespace wgllm::cli

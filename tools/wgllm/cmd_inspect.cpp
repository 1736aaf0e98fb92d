// `wgllm inspect FILE.gguf`: what a GGUF file holds — version, architecture, hyper-parameters, tokenizer,
// tensor types and sizes; --tensors lists every tensor, --metadata every key.
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <variant>

#include "command.h"
#include "model/config.h"
#include "gguf/file.h"
#include "wgllm/error.h"

namespace wgllm::cli {
namespace {

double mib(uint64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

std::string shorten(const std::string& s, size_t n = 60) {
  std::string out;
  for (const char c : s.substr(0, n)) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return s.size() > n ? out + "..." : out;
}

std::string summarise(const GgufArray& a, size_t first = 5) {
  std::ostringstream s;
  s << "array of " << value_type_name(a.elem_type) << " [" << a.size() << "]";
  if (a.size() == 0) return s.str();
  s << ": ";
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        for (size_t i = 0; i < v.size() && i < first; ++i) {
          if (i) s << ", ";
          if constexpr (std::is_same_v<V, std::vector<std::string>>)
            s << "'" << shorten(v[i], 30) << "'";
          else if constexpr (std::is_same_v<V, std::vector<GgufArray>>)
            s << "(" << summarise(v[i], 2) << ")";
          else if constexpr (std::is_same_v<V, std::vector<uint8_t>>)
            s << (v[i] ? "true" : "false");
          else
            s << v[i];
        }
        if (v.size() > first) s << ", ...";
      },
      a.elems);
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

void print_config(const ModelConfig& c) {
  std::printf("hyper-parameters\n");
  std::printf("  n_vocab        %u\n", c.n_vocab);
  std::printf("  n_embd         %u\n", c.n_embd);
  std::printf("  n_layer        %u\n", c.n_layer);
  std::printf("  n_head         %u (kv %u, head_dim %u)\n", c.n_head, c.n_head_kv, c.head_dim);
  std::printf("  n_ff           %u\n", c.n_ff);
  std::printf("  n_ctx_train    %u\n", c.n_ctx_train);
  std::printf("  rms_eps        %g\n", static_cast<double>(c.rms_eps));
  std::printf("  rope           %s, base %g, dims %u%s\n", c.rope_type == RopeType::Neox ? "neox" : "normal",
              static_cast<double>(c.rope_base), c.rope_dim, c.has_rope_freqs_tensor ? ", rope_freqs tensor" : "");
  if (c.rope_scaling.enabled)
    std::printf("  rope scaling   llama3, factor %g, low %g, high %g, original context %u\n",
                static_cast<double>(c.rope_scaling.factor), static_cast<double>(c.rope_scaling.low_freq_factor),
                static_cast<double>(c.rope_scaling.high_freq_factor), c.rope_scaling.original_context);
  std::printf("  qk_norm        %s\n", c.qk_norm ? "yes" : "no");
  std::printf("  attn_bias      %s\n", c.attn_bias ? "yes" : "no");
  std::printf("  tied embedding %s\n", c.tied_embeddings ? "yes" : "no");
}

void print_tokenizer(const GgufFile& f) {
  std::printf("tokenizer\n");
  std::printf("  model          %s\n", f.find_string("tokenizer.ggml.model").value_or("(none)").c_str());
  if (const auto pre = f.find_string("tokenizer.ggml.pre")) std::printf("  pre            %s\n", pre->c_str());
  if (const GgufValue* t = f.find("tokenizer.ggml.tokens"); t && t->type == GgufValueType::Array)
    std::printf("  vocab size     %zu\n", std::get<GgufArray>(t->v).size());
  if (const GgufValue* m = f.find("tokenizer.ggml.merges"); m && m->type == GgufValueType::Array)
    std::printf("  merges         %zu\n", std::get<GgufArray>(m->v).size());
  for (const char* k : {"bos", "eos", "unknown", "padding"}) {
    const std::string key = std::string("tokenizer.ggml.") + k + "_token_id";
    if (const auto id = f.find_u32(key)) std::printf("  %-14s %u\n", (std::string(k) + " id").c_str(), *id);
  }
  if (const auto add = f.find_bool("tokenizer.ggml.add_bos_token"))
    std::printf("  add bos        %s\n", *add ? "yes" : "no");
  std::printf("  chat template  %s\n", f.has("tokenizer.chat_template") ? "yes" : "no");
}

int run_inspect(const std::string& path, bool tensors, bool metadata) {
  const GgufFile f = GgufFile::open(path);
  std::printf("file           %s (%.1f MiB)\n", path.c_str(), mib(f.file_size()));
  std::printf("GGUF version   %u, alignment %u, data at byte %llu\n", f.version(), f.alignment(),
              static_cast<unsigned long long>(f.data_offset()));
  std::printf("architecture   %s\n", f.find_string("general.architecture").value_or("(none)").c_str());
  if (const auto name = f.find_string("general.name")) std::printf("name           %s\n", shorten(*name).c_str());
  std::string config_error;
  try {
    print_config(config_from_gguf(f));
  } catch (const ModelError& e) {
    config_error = e.what();
  }
  print_tokenizer(f);

  std::map<std::string, std::pair<size_t, uint64_t>> per_type;
  uint64_t total = 0, params = 0;
  for (const auto& t : f.tensors()) {
    auto& [count, bytes] = per_type[type_name(t.type)];
    ++count;
    bytes += t.n_bytes;
    total += t.n_bytes;
    params += t.n_elements;
  }
  const double p = static_cast<double>(params);
  std::printf("tensors        %zu (%.2f%s parameters)\n", f.tensors().size(), p >= 1e9 ? p / 1e9 : p / 1e6,
              p >= 1e9 ? "B" : "M");
  std::printf("  %-6s %6s %12s\n", "type", "count", "MiB");
  for (const auto& [name, cb] : per_type)
    std::printf("  %-6s %6zu %12.2f\n", name.c_str(), cb.first, mib(cb.second));
  std::printf("  %-6s %6zu %12.2f\n", "total", f.tensors().size(), mib(total));

  if (tensors) {
    std::printf("\n%-40s %-5s %-28s %12s\n", "tensor", "type", "dims", "bytes");
    for (const auto& t : f.tensors())
      std::printf("%-40s %-5s %-28s %12llu\n", t.name.c_str(), type_name(t.type), t.shape_string().c_str(),
                  static_cast<unsigned long long>(t.n_bytes));
  }
  if (metadata) {
    std::printf("\nmetadata (%zu keys)\n", f.metadata().size());
    for (const auto& [key, v] : f.metadata())
      std::printf("  %-44s %-6s %s\n", key.c_str(), v.type == GgufValueType::Array ? "array" : v.type_string().c_str(),
                  value_string(v).c_str());
  }
  if (!config_error.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "wgllm: error: %s\n", config_error.c_str());
    return 1;
  }
  return 0;
}

const Register reg{{"inspect", "show what a GGUF model file holds",
                    [](CLI::App& app) -> std::function<int()> {
                      auto path = std::make_shared<std::string>();
                      auto tensors = std::make_shared<bool>(false);
                      auto metadata = std::make_shared<bool>(false);
                      app.add_option("file", *path, "the .gguf file")->required();
                      app.add_flag("--tensors", *tensors, "list every tensor (name, type, dims, bytes)");
                      app.add_flag("--metadata", *metadata, "list every metadata key (arrays summarised)");
                      return [=] {
                        try {
                          return run_inspect(*path, *tensors, *metadata);
                        } catch (const Error& e) {
                          std::fprintf(stderr, "wgllm: error: %s\n", e.what());
                          return 1;
                        }
                      };
                    }}};

}  // namespace
}  // namespace wgllm::cli

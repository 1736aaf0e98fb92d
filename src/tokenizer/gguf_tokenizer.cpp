#include "tokenizer/gguf_tokenizer.h"

#include <string>

#include "gguf/file.h"
#include "wgllm/error.h"

namespace wgllm {

TokenizerData tokenizer_data_from_gguf(const GgufFile& f) {
  auto fail = [&](const std::string& what) -> void { throw ModelError(f.label() + ": " + what); };
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.tokens"})
    if (!f.has(key)) fail(std::string("key '") + key + "' is missing (the file holds no tokenizer)");

  TokenizerData d;
  d.model = f.get_string("tokenizer.ggml.model");
  d.pre = f.find_string("tokenizer.ggml.pre").value_or("");
  d.tokens = f.get_string_array("tokenizer.ggml.tokens").strings();
  const size_t n = d.tokens.size();
  if (n == 0) fail("key 'tokenizer.ggml.tokens' is empty");

  if (f.has("tokenizer.ggml.scores")) {
    d.scores = f.get_f32_array("tokenizer.ggml.scores");
    if (d.scores.size() != n)
      fail("key 'tokenizer.ggml.scores' has " + std::to_string(d.scores.size()) + " entries for " + std::to_string(n) +
           " tokens");
  }
  if (f.has("tokenizer.ggml.token_type")) {
    d.token_types = f.get_i32_array("tokenizer.ggml.token_type");
    if (d.token_types.size() != n)
      fail("key 'tokenizer.ggml.token_type' has " + std::to_string(d.token_types.size()) + " entries for " +
           std::to_string(n) + " tokens");
  }
  if (f.has("tokenizer.ggml.merges")) d.merges = f.get_string_array("tokenizer.ggml.merges").strings();

  auto id = [&](const char* key, int32_t& dst) {
    const auto v = f.find_i32(key);
    if (!v) return;
    if (*v < -1 || *v >= static_cast<int64_t>(n))
      fail(std::string("key '") + key + "' = " + std::to_string(*v) + " is outside the vocabulary of " +
           std::to_string(n) + " tokens");
    dst = *v;
  };
  id("tokenizer.ggml.bos_token_id", d.bos);
  id("tokenizer.ggml.eos_token_id", d.eos);
  id("tokenizer.ggml.unknown_token_id", d.unk);
  id("tokenizer.ggml.padding_token_id", d.pad);
  id("tokenizer.ggml.cls_token_id", d.cls);
  id("tokenizer.ggml.seperator_token_id", d.sep);  // sic: the key as llama.cpp's converter writes it
  d.add_bos = f.find_bool("tokenizer.ggml.add_bos_token");
  d.add_eos = f.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  d.add_space_prefix = f.find_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  d.lowercase = f.find_bool("tokenizer.ggml.normalizer.lowercase").value_or(true);
  d.strip_accents = f.find_bool("tokenizer.ggml.normalizer.strip_accents");
  d.chat_template = f.find_string("tokenizer.chat_template").value_or("");
  return d;
}

}  // namespace wgllm

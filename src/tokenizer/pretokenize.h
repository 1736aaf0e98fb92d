// Byte-level BPE pre-tokenization: the text split into words by the regexes of tokenizer.ggml.pre (PCRE2, UTF+UCP),
// with llama.cpp's names for them.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wgllm {

class PreTokenizer {
 public:
  // Throws ModelError listing the supported names when `pre` is unknown.
  explicit PreTokenizer(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` (views into it, in order, covering it exactly). Each regex in turn splits every
  // piece into its matches and the gaps between them (HF tokenizers' "isolated" split). Bytes that are not valid
  // UTF-8 become one-byte words; the regexes run on the valid stretches between them.
  void split(std::string_view text, std::vector<std::string_view>& words) const;

  // Whether a word that is itself a token skips the merges (HF BPE ignore_merges; llama3).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether BOS is added when the file does not say (llama.cpp's default for this pre-tokenizer).
  bool add_bos() const { return add_bos_; }
  // The supported tokenizer.ggml.pre values, comma separated.
  static std::string supported();

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
};

}  // namespace wgllm

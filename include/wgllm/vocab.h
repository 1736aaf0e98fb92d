// A GGUF file's vocabulary on its own: tokenize and detokenize without loading the weights or opening an adapter.
// It reads the file's header and metadata only, so it works on vocabulary-only files (no tensors) and on files whose
// architecture or tensor types wgllm cannot run. What `wgllm tokenize` uses.
//
//   const wgllm::Vocab vocab = wgllm::Vocab::load("model.gguf");
//   for (int32_t id : vocab.encode("Hello world")) std::printf("%d '%s'\n", id, vocab.token_to_piece(id).c_str());
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wgllm/chat.h"
#include "wgllm/error.h"

namespace wgllm {

class Vocab {
 public:
  // Throws ModelError for a file that is not a GGUF, holds no tokenizer (tokenizer.ggml.*), or one wgllm does not
  // support (the message names the key and lists what is supported).
  static Vocab load(const std::string& path);
  // A GGUF held in memory (`label` names it in errors).
  static Vocab load(std::span<const uint8_t> gguf, const std::string& label = "<memory>");
  ~Vocab();
  Vocab(Vocab&&) noexcept;
  Vocab& operator=(Vocab&&) noexcept;

  // As Model::encode: add_special puts BOS in front when the vocabulary wants it (add_bos()), and EOS at the end when
  // it says so; parse_special turns control tokens written in the text into their ids.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (part of a UTF-8 character for a byte token; a control token's own text).
  std::string token_to_piece(int32_t id) const;
  int32_t n_vocab() const;
  int32_t bos() const;  // -1: none
  int32_t eos() const;  // -1: none
  bool add_bos() const;
  // general.architecture ("" when absent).
  const std::string& architecture() const;
  // The prompt of one user message (and a system message when not empty) in the file's chat template, ending with
  // the assistant's turn opener, and its ids (the template's markers as control tokens, the messages as text). A
  // gemma3 file without a template gets Gemma's. Throws Error when the file has no template wgllm knows.
  std::string apply_chat_template(std::string_view user, std::string_view system = "") const;
  std::vector<int32_t> encode_chat(std::string_view user, std::string_view system = "") const;
  // Any request (wgllm/chat.h) in the file's template, or in `jinja` where not empty; Error where there is no
  // template (and no built-in one), or where it fails or raises.
  std::string render_chat(const ChatRequest& request, std::string_view jinja = "") const;

 private:
  struct Impl;
  explicit Vocab(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wgllm

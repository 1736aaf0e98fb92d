// Exact tokenizers built from GGUF-style vocabulary metadata: SentencePiece BPE ("llama"), byte-level BPE ("gpt2"),
// Gemma 4's BPE over UTF-8 characters with ▁ for spaces ("gemma4") and BERT's WordPiece ("bert"), plus a streaming
// decoder that only ever hands out whole UTF-8 characters.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wgllm {

// GGUF token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

// Everything a tokenizer is built from; mirrors the GGUF tokenizer.ggml.* keys one field each.
struct TokenizerData {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece BPE), "gpt2" (byte-level BPE), "gemma4", "bert"
  std::string pre;                  // tokenizer.ggml.pre (byte-level BPE): llama.cpp's names, "gpt-2", "llama-bpe", ...
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens
  std::vector<float> scores;        // tokenizer.ggml.scores (SentencePiece; may be empty for gpt2)
  std::vector<int32_t> token_types;                // tokenizer.ggml.token_type (TokenType; empty: all normal)
  std::vector<std::string> merges;                 // tokenizer.ggml.merges, "left right", highest priority first (gpt2, gemma4)
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;  // tokenizer.ggml.{bos,eos,unknown,padding}_token_id
  // tokenizer.ggml.cls_token_id and tokenizer.ggml.seperator_token_id (sic): BERT's [CLS] and [SEP]. A bert tokenizer
  // takes [CLS] as its BOS where bos is absent, and the tokens [CLS], [SEP], [UNK] where their ids are.
  int32_t cls = -1, sep = -1;
  std::optional<bool> add_bos;   // tokenizer.ggml.add_bos_token; absent: true for llama and bert, gpt2 as its pre says
  bool add_eos = false;          // tokenizer.ggml.add_eos_token
  bool add_space_prefix = true;  // tokenizer.ggml.add_space_prefix (SentencePiece only)
  bool lowercase = true;         // tokenizer.ggml.normalizer.lowercase (bert only)
  std::optional<bool> strip_accents;  // tokenizer.ggml.normalizer.strip_accents (bert only); absent: as lowercase
  std::string chat_template;     // tokenizer.chat_template
};

// The TokenizerData of a JSON object holding the fields above by name (as tests/data/tokenizers/*.json do).
// Throws ModelError naming a missing or mistyped field.
TokenizerData tokenizer_data_from_json(std::string_view json_text);

// Bytes [begin, end) of a text.
struct TextRange {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  // Throws ModelError for an unsupported model or pre-tokenizer (the message lists the supported ones) or for
  // inconsistent data (naming the field).
  explicit Tokenizer(TokenizerData data);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text to ids. add_special: BOS in front when add_bos (and EOS at the end when add_eos); bert: [CLS] in front and
  // [SEP] at the end when add_bos, as llama.cpp does. parse_special: control
  // tokens written in the text (`<|im_start|>`, `<s>`) become their ids, except inside the `plain` ranges (a chat
  // message's content: what a user typed is text, whatever it holds); otherwise they are tokenized as text.
  // User-defined tokens are always recognised. Bytes that are not valid UTF-8 are kept (as byte tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                              std::span<const TextRange> plain = {}) const;

  // Ids to bytes. Control tokens appear as their text unless skip_special. SentencePiece: the space that
  // add_space_prefix put in front is removed again from the first piece. bert: every word keeps the space in front of
  // it, and llama.cpp's clean-up of spaces around punctuation follows (bert_clean_spaces in wordpiece.h).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (may be part of a UTF-8 character); control tokens give their text.
  std::string token_to_piece(int32_t id) const;

  int32_t n_vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  bool add_bos() const;
  // Token id of exactly this token text, or -1.
  int32_t token_id(std::string_view text) const;
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Control or unknown: a token that is not text.
  bool is_special(int32_t id) const;
  const TokenizerData& data() const;

 private:
  friend class StreamDecoder;
  // Appends what `id` decodes to; `at_start` is true until the first text token (SentencePiece's leading space).
  void append_piece(std::string& out, int32_t id, bool& at_start, bool skip_special) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Incremental decoding for streaming output: every returned chunk is valid UTF-8. Bytes of a character split
// across tokens are held back until it is complete; an invalid sequence becomes U+FFFD as soon as it is known to be
// invalid, an incomplete one at flush(). For ids whose full decode is valid UTF-8, the chunks concatenate to it
// (bert: to it before its clean-up of spaces, as llama.cpp's pieces do).
// The tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  // keep: control tokens whose text is written even with skip_special (a chat format's markers, e.g. [TOOL_CALLS]).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false, std::vector<int32_t> keep = {});
  std::string push(int32_t id);
  // Emits what is held back and starts a new stream.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> keep_;
  bool at_start_ = true;
  std::string pending_;
};

// UTF-8 helpers (also used by the tests).
// True when `s` is entirely valid UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace wgllm

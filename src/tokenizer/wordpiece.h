// BERT's WordPiece front end ("bert" vocabularies): the normalisation and word split of HF's BertNormalizer and
// BertPreTokenizer, as llama.cpp applies them before its greedy longest-match (which lives with the vocabulary in
// tokenizer.cpp). The Unicode properties come from utf8proc.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace wgllm {

struct BertNormalization {
  bool lowercase = true;      // tokenizer.ggml.normalizer.lowercase
  bool strip_accents = true;  // tokenizer.ggml.normalizer.strip_accents: NFD, then every mark (\p{M}) dropped
};

// Appends the words of `text`, each non-empty: whitespace separates words; NUL, U+FFFD, control and format characters
// and bytes that are not valid UTF-8 vanish; punctuation, ASCII symbols and CJK ideographs are words of their own.
void bert_words(std::string_view text, const BertNormalization& norm, std::vector<std::string>& words);

// llama.cpp's clean-up of a decoded BERT text (HF's clean_up_tokenization_spaces): no space before ? ! . , or 's 'm
// 're 've, and none around an apostrophe standing alone between spaces.
std::string bert_clean_spaces(std::string_view text);

}  // namespace wgllm

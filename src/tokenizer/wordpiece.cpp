// BERT's normalisation, word split and decoding clean-up (see wordpiece.h).
#include "tokenizer/wordpiece.h"

#include <utf8proc.h>

#include <cstdint>
#include <iterator>

#include "tokenizer/utf8.h"

namespace wgllm {

namespace {

// HF's BertPreTokenizer test for CJK ideographs (its Extension C-F block starts at U+2B920 where Unicode's starts at
// U+2B820; llama.cpp keeps that, and so do we, since the vocabularies were made with HF's). Korean and Japanese kana
// are not in it: they form words like Latin letters.
bool is_cjk_ideograph(uint32_t cp) {
  struct Range {
    uint32_t first, last;
  };
  static constexpr Range kRanges[] = {{0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFAFF},   {0x20000, 0x2A6DF},
                                      {0x2A700, 0x2B73F}, {0x2B740, 0x2B81F}, {0x2B920, 0x2CEAF}, {0x2F800, 0x2FA1F}};
  for (const Range& r : kRanges)
    if (cp >= r.first && cp <= r.last) return true;
  return false;
}

// Unicode's White_Space: the space separators, line and paragraph separators, and the controls TAB to CR and NEL.
bool is_space(uint32_t cp, utf8proc_category_t cat) {
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP ||
         (cp >= 0x09 && cp <= 0x0D) || cp == 0x85;
}

// \p{C} without the unassigned code points (Cn), which BERT keeps as letters.
bool is_other(utf8proc_category_t cat) {
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
         cat == UTF8PROC_CATEGORY_CO;
}

bool is_mark(utf8proc_category_t cat) {
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool is_punctuation(utf8proc_category_t cat) { return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO; }

bool is_symbol(utf8proc_category_t cat) { return cat >= UTF8PROC_CATEGORY_SM && cat <= UTF8PROC_CATEGORY_SO; }

}  // namespace

void bert_words(std::string_view text, const BertNormalization& norm, std::vector<std::string>& words) {
  std::string word;
  auto end_word = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  auto add = [&](uint32_t cp) {
    const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (is_space(cp, cat)) {
      end_word();
      return;
    }
    if (cp == 0 || cp == 0xFFFD || is_other(cat)) return;
    if (norm.strip_accents && is_mark(cat)) return;
    const uint32_t out =
        norm.lowercase ? static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))) : cp;
    // HF counts every ASCII symbol ($ + < = > ^ ` | ~) as punctuation, but no symbol beyond ASCII.
    if (is_punctuation(cat) || (cp < 0x7F && is_symbol(cat)) || is_cjk_ideograph(cp)) {
      end_word();
      words.push_back(utf8::encode(out));
    } else {
      word += utf8::encode(out);
    }
  };

  utf8proc_int32_t parts[8];
  for (size_t k = 0; k < text.size();) {
    const utf8::Char c = utf8::next(text, k);
    k += c.len;
    if (c.status != utf8::Status::Ok) continue;  // what is not UTF-8 goes, as U+FFFD would
    if (!norm.strip_accents) {
      add(c.cp);
      continue;
    }
    // Canonical decomposition one character at a time: its marks are dropped, so their order never matters.
    const utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c.cp), parts, std::size(parts),
                                                       UTF8PROC_DECOMPOSE, nullptr);
    if (n < 1 || n > static_cast<utf8proc_ssize_t>(std::size(parts))) {
      add(c.cp);
      continue;
    }
    for (utf8proc_ssize_t i = 0; i < n; ++i) add(static_cast<uint32_t>(parts[i]));
  }
  end_word();
}

std::string bert_clean_spaces(std::string_view text) {
  // " ?", " !", " .", " ,": the space goes.
  std::string a;
  a.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (i > 0 && text[i - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ',')) a.pop_back();
    a += c;
  }
  // " ' ": both spaces go. The character after such an apostrophe no longer counts as following a space.
  std::string b;
  b.reserve(a.size());
  bool space_dropped = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool after_space = i > 0 && a[i - 1] == ' ' && !space_dropped;
    space_dropped = false;
    if (a[i] == '\'' && after_space && i + 1 < a.size() && a[i + 1] == ' ') {
      b.back() = '\'';
      ++i;
      space_dropped = true;
      continue;
    }
    b += a[i];
  }
  // " 's", " 'm", " 're", " 've": the space goes (not before 't, 'd or 'll).
  std::string c;
  c.reserve(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    if (i > 0 && b[i - 1] == ' ' && b[i] == '\'' && i + 1 < b.size()) {
      const char n1 = b[i + 1], n2 = i + 2 < b.size() ? b[i + 2] : '\0';
      if (n1 == 's' || n1 == 'm' || ((n1 == 'r' || n1 == 'v') && n2 == 'e')) c.pop_back();
    }
    c += b[i];
  }
  return c;
}

}  // namespace wgllm

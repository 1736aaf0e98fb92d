// SentencePiece BPE, byte-level BPE, Gemma 4's BPE and WordPiece tokenization (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"
#include "tokenizer/wordpiece.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes stand for themselves, the others
// (controls, space, 0x7F-0xA0, soft hyphen) become U+0100 onwards in byte order.
std::array<uint32_t, 256> gpt2_byte_to_cp() {
  std::array<uint32_t, 256> m{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[b] = printable ? b : next++;
  }
  return m;
}

// A token text with each ▁ written as the space it stands for.
std::string unescape_spaces(std::string_view s) {
  std::string p;
  p.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    if (s.compare(k, 3, "\xE2\x96\x81") == 0) {
      p += ' ';
      k += 3;
    } else {
      p += s[k++];
    }
  }
  return p;
}

// One symbol of a word being merged: a byte range of the word, linked to its neighbours.
struct Symbol {
  uint32_t start, len;
  int32_t prev, next;
  int32_t id;  // byte-level BPE: the token id of the range
};

// A candidate merge of symbols[left] with its right neighbour. Stale once either side has changed length.
template <typename Priority>
struct Candidate {
  Priority priority;
  int32_t left, right;
  uint32_t left_len, right_len;
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerData data;
  bool spm = false;
  // Gemma 4 ("gemma4"): BPE merges over the text's UTF-8 characters (not GPT-2's byte map), spaces written as ▁,
  // pre-split only into runs of newlines and of the rest; a piece without a token falls back to <0xXX> byte tokens.
  bool gemma4 = false;
  // BERT ("bert"): normalised words (wordpiece.h), each matched greedily longest-first from the left, its first piece
  // with a ▁ in front (llama.cpp's conversion writes word-initial pieces as ▁piece and drops HF's ## from the rest).
  bool bert = false;
  BertNormalization bert_norm;
  size_t max_token_bytes = 0;
  bool add_bos = false;
  bool ignore_merges = false;
  std::vector<TokenType> types;
  TokenMap token_ids;               // every token text -> first id with it
  std::vector<std::string> pieces;  // what each id decodes to

  // Tokens split out of the text before anything else: control/unknown ones only when parse_special.
  struct Special {
    std::string text;
    int32_t id;
    bool always;
  };
  std::array<std::vector<Special>, 256> specials_by_first_byte;  // longest first

  // SentencePiece (and gemma4's byte tokens).
  TokenMap spm_pieces;  // normal, user-defined and unused pieces: what merges may produce
  std::array<int32_t, 256> byte_tokens{};
  bool byte_fallback = false;
  bool spm_merges_cross_spaces = false;  // some piece holds ▁ after its first character

  // Byte-level BPE.
  std::array<std::string, 256> byte_chars;                           // byte -> UTF-8 of the code point standing for it
  std::array<int32_t, 256> byte_symbol{};                            // byte -> id of its one-character token (-1: none)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  std::unique_ptr<PreTokenizer> pre;

  void split_specials(std::string_view text, bool parse_special, std::span<const TextRange> plain,
                      std::vector<std::pair<std::string_view, int32_t>>& fragments) const;
  void encode_spm(std::string_view fragment, bool space_prefix, std::vector<int32_t>& out) const;
  void encode_spm_word(std::string_view word, std::vector<int32_t>& out, bool& prev_unk) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_gemma4(std::string_view fragment, std::vector<int32_t>& out) const;
  void encode_gemma4_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_wordpiece(std::string_view fragment, std::vector<int32_t>& out) const;
  void merge_bpe(std::vector<Symbol>& sym) const;
  void read_merges();
};

namespace {

[[noreturn]] void bad(const std::string& what) { throw ModelError("tokenizer: " + what); }

}  // namespace

Tokenizer::Tokenizer(TokenizerData data) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.data = std::move(data);
  const TokenizerData& d = m.data;
  const auto n = static_cast<int32_t>(d.tokens.size());
  if (d.model == "llama") {
    m.spm = true;
  } else if (d.model == "gemma4") {
    m.gemma4 = true;
  } else if (d.model == "bert") {
    m.bert = true;
  } else if (d.model != "gpt2") {
    bad("tokenizer.ggml.model '" + d.model + "' is not supported (supported: llama, gpt2, gemma4, bert)");
  }
  if (n == 0) bad("tokenizer.ggml.tokens is empty");
  if (!d.token_types.empty() && d.token_types.size() != d.tokens.size())
    bad("tokenizer.ggml.token_type has " + std::to_string(d.token_types.size()) + " entries for " + std::to_string(n) +
        " tokens");
  if (m.spm && d.scores.size() != d.tokens.size())
    bad("tokenizer.ggml.scores has " + std::to_string(d.scores.size()) + " entries for " + std::to_string(n) +
        " tokens");
  for (auto [name, id] : {std::pair{"bos", d.bos},
                          {"eos", d.eos},
                          {"unknown", d.unk},
                          {"padding", d.pad},
                          {"cls", d.cls},
                          {"seperator", d.sep}})
    if (id < -1 || id >= n)
      bad(std::string("tokenizer.ggml.") + name + "_token_id " + std::to_string(id) + " is outside the vocabulary of " +
          std::to_string(n));
  if (m.bert) {
    // BERT files name [CLS] and [SEP] rather than BOS and EOS, and some name neither: llama.cpp then takes ids 101,
    // 102 and 100, where BERT's own vocabulary has [CLS], [SEP] and [UNK]; looking the texts up agrees with that
    // there and holds for other vocabularies too.
    auto by_text = [&](int32_t id, const char* text) {
      if (id >= 0) return id;
      auto it = std::find(d.tokens.begin(), d.tokens.end(), text);
      return it == d.tokens.end() ? -1 : static_cast<int32_t>(it - d.tokens.begin());
    };
    m.data.bos = by_text(d.bos >= 0 ? d.bos : d.cls, "[CLS]");
    m.data.sep = by_text(d.sep, "[SEP]");
    m.data.unk = by_text(d.unk, "[UNK]");
    if (d.unk < 0) bad("bert vocabulary has no unknown token (tokenizer.ggml.unknown_token_id or [UNK])");
    m.bert_norm = {d.lowercase, d.strip_accents.value_or(d.lowercase)};
    for (const std::string& t : d.tokens) m.max_token_bytes = std::max(m.max_token_bytes, t.size());
  }
  if (d.add_bos && *d.add_bos && d.bos < 0) bad("tokenizer.ggml.add_bos_token is set but there is no bos_token_id");
  m.add_bos = d.add_bos.value_or(m.spm || m.bert) && d.bos >= 0;  // byte-level BPE: its pre-tokenizer's default, below
  if (d.add_eos && d.eos < 0) bad("tokenizer.ggml.add_eos_token is set but there is no eos_token_id");

  m.types.resize(n, kTokenNormal);
  for (int32_t i = 0; i < n && !d.token_types.empty(); ++i) {
    const int32_t t = d.token_types[i];
    if (t < kTokenNormal || t > kTokenByte) bad("token " + std::to_string(i) + " has type " + std::to_string(t));
    m.types[i] = static_cast<TokenType>(t);
  }
  for (int32_t i = 0; i < n; ++i) m.token_ids.emplace(d.tokens[i], i);
  // End-of-turn markers are control tokens whatever type the file gives them (llama.cpp overrides the type of these
  // texts at load, e.g. Gemma 3's user-defined "</s>"): typed into a text they are text unless parse_special.
  for (const char* eog : {"<|eot_id|>",
                          "<|im_end|>",
                          "<|end|>",
                          "<|return|>",
                          "<|call|>",
                          "<|flush|>",
                          "<|calls|>",
                          "<end_of_turn>",
                          "<|endoftext|>",
                          "</s>",
                          "<|eom_id|>",
                          "<EOT>",
                          "_<EOT>",
                          "[EOT]",
                          "[EOS]",
                          "<|end_of_text|>",
                          "<end_of_utterance>",
                          "<eos>",
                          "<turn|>",
                          "<|tool_response>",
                          "<\xEF\xBD\x9C"
                          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
                          "[e~["}) {
    auto it = m.token_ids.find(std::string_view(eog));
    if (it != m.token_ids.end() && m.types[it->second] != kTokenControl) m.types[it->second] = kTokenControl;
  }

  // Split-out tokens, longest first within each first byte.
  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = m.types[i];
    if ((t == kTokenControl || t == kTokenUnknown || t == kTokenUserDefined) && !d.tokens[i].empty())
      m.specials_by_first_byte[static_cast<uint8_t>(d.tokens[i][0])].push_back(
          {d.tokens[i], i, t == kTokenUserDefined});
  }
  for (auto& v : m.specials_by_first_byte)
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });

  m.pieces.resize(n);
  if (m.spm || m.gemma4) {
    m.byte_tokens.fill(-1);
    int bytes = 0;
    for (int32_t i = 0; i < n; ++i) {
      const std::string& s = d.tokens[i];
      const TokenType t = m.types[i];
      if (t == kTokenNormal || t == kTokenUserDefined || t == kTokenUnused) {
        m.spm_pieces.emplace(s, i);
        if (s.size() > 1 && s.find("\xE2\x96\x81", 1) != std::string::npos) m.spm_merges_cross_spaces = true;
      }
      if (t == kTokenByte) {
        unsigned v = 0;
        if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>' || std::sscanf(s.c_str() + 3, "%2x", &v) != 1)
          bad("byte token " + std::to_string(i) + " '" + s + "' is not of the form <0xXX>");
        if (m.byte_tokens[v] < 0) ++bytes;
        m.byte_tokens[v] = i;
        m.pieces[i] = std::string(1, static_cast<char>(v));
      } else if (t == kTokenNormal || t == kTokenUserDefined || t == kTokenUnused) {
        m.pieces[i] = unescape_spaces(s);
      } else {
        m.pieces[i] = s;
      }
    }
    m.byte_fallback = bytes == 256;
    if (m.gemma4) {
      if (!m.byte_fallback) bad("gemma4 vocabulary has " + std::to_string(bytes) + " of the 256 byte tokens <0xXX>");
      m.read_merges();
      m.add_bos = d.bos >= 0;  // llama.cpp adds BOS for gemma4 whatever add_bos_token says
      return;
    }
    if (!m.byte_fallback && d.unk < 0) bad("SentencePiece vocabulary has neither byte tokens nor an unknown token");
    return;
  }

  if (m.bert) {
    // As llama.cpp: ▁ is a space in every text token; control and unknown tokens are their text. No byte tokens.
    for (int32_t i = 0; i < n; ++i) {
      const TokenType t = m.types[i];
      m.pieces[i] = t == kTokenControl || t == kTokenUnknown ? d.tokens[i] : unescape_spaces(d.tokens[i]);
    }
    return;
  }

  // Byte-level BPE.
  const auto byte_to_cp = gpt2_byte_to_cp();
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
  for (int b = 0; b < 256; ++b) {
    m.byte_chars[b] = utf8::encode(byte_to_cp[b]);
    auto it = m.token_ids.find(m.byte_chars[b]);
    m.byte_symbol[b] = it == m.token_ids.end() ? -1 : it->second;
  }
  for (int32_t i = 0; i < n; ++i) {
    const std::string& s = d.tokens[i];
    if (m.types[i] != kTokenNormal && m.types[i] != kTokenUnused) {
      m.pieces[i] = s;  // added tokens are stored as plain text
      continue;
    }
    std::string& p = m.pieces[i];
    for (size_t k = 0; k < s.size();) {
      const utf8::Char c = utf8::next(s, k);
      auto it = c.status == utf8::Status::Ok ? cp_to_byte.find(c.cp) : cp_to_byte.end();
      if (it != cp_to_byte.end()) {
        p += static_cast<char>(it->second);
      } else {
        p.append(s, k, c.len);
      }
      k += c.len;
    }
  }
  m.read_merges();
  m.pre = std::make_unique<PreTokenizer>(d.pre);
  m.ignore_merges = m.pre->ignore_merges();
  if (!d.add_bos) m.add_bos = m.pre->add_bos() && d.bos >= 0;
}

// tokenizer.ggml.merges ("left right", by rank) as (left id, right id) -> (rank, merged id); merges whose parts or
// result are not tokens can never apply and are left out.
void Tokenizer::Impl::read_merges() {
  for (size_t r = 0; r < data.merges.size(); ++r) {
    const std::string& mg = data.merges[r];
    const size_t sp = mg.find(' ', 1);
    if (sp == std::string::npos) bad("merge " + std::to_string(r) + " '" + mg + "' has no space");
    auto a = token_ids.find(std::string_view(mg).substr(0, sp));
    auto b = token_ids.find(std::string_view(mg).substr(sp + 1));
    auto ab = token_ids.find(mg.substr(0, sp) + mg.substr(sp + 1));
    if (a == token_ids.end() || b == token_ids.end() || ab == token_ids.end()) continue;
    const uint64_t key =
        static_cast<uint64_t>(static_cast<uint32_t>(a->second)) << 32 | static_cast<uint32_t>(b->second);
    merges.emplace(key, std::pair{static_cast<int32_t>(r), ab->second});
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->data.tokens.size()); }
int32_t Tokenizer::bos() const { return impl_->data.bos; }
int32_t Tokenizer::eos() const { return impl_->data.eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const TokenizerData& Tokenizer::data() const { return impl_->data; }

int32_t Tokenizer::token_id(std::string_view text) const {
  auto it = impl_->token_ids.find(text);
  return it == impl_->token_ids.end() ? -1 : it->second;
}

namespace {
void check_id(int32_t id, int32_t n) {
  if (id < 0 || id >= n)
    throw InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n));
}
}  // namespace

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id, n_vocab());
  return impl_->data.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id, n_vocab());
  return impl_->types[id];
}

bool Tokenizer::is_special(int32_t id) const {
  const TokenType t = token_type(id);
  return t == kTokenControl || t == kTokenUnknown;
}

// ---- encoding ------------------------------------------------------------------------------------------------

// Splits `text` into plain-text fragments (id -1) and split-out tokens, leftmost-longest. Control tokens only where
// parse_special and not overlapping a `plain` range.
void Tokenizer::Impl::split_specials(std::string_view text, bool parse_special, std::span<const TextRange> plain,
                                     std::vector<std::pair<std::string_view, int32_t>>& fragments) const {
  auto in_plain = [&](size_t begin, size_t end) {
    for (const TextRange& r : plain)
      if (begin < r.end && r.begin < end) return true;
    return false;
  };
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const Special* hit = nullptr;
    for (const Special& s : specials_by_first_byte[static_cast<uint8_t>(text[i])]) {
      if ((s.always || (parse_special && !in_plain(i, i + s.text.size()))) &&
          text.compare(i, s.text.size(), s.text) == 0) {
        hit = &s;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) fragments.emplace_back(text.substr(start, i - start), -1);
    fragments.emplace_back(text.substr(i, hit->text.size()), hit->id);
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) fragments.emplace_back(text.substr(start), -1);
}

// SentencePiece BPE over the whole fragment: repeatedly merge the adjacent pair whose concatenation is the
// highest-scoring piece (ties: leftmost), then map pieces to ids with byte fallback.
void Tokenizer::Impl::encode_spm(std::string_view fragment, bool space_prefix, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(fragment.size() * 2 + 3);
  if (space_prefix) text += "\xE2\x96\x81";
  for (char c : fragment) {
    if (c == ' ') {
      text += "\xE2\x96\x81";
    } else {
      text += c;
    }
  }

  const std::string_view tv(text);
  bool prev_unk = false;  // a run of unknown pieces is one unknown token
  if (!spm_merges_cross_spaces) {
    // No piece has ▁ after its start, so no merge crosses the boundary before a ▁: each such word is merged on
    // its own (same result as merging the whole text, with small queues).
    size_t start = 0;
    for (size_t k = 1; k + 3 <= tv.size(); ++k) {
      if (tv.compare(k, 3, "\xE2\x96\x81") == 0 && k > start) {
        encode_spm_word(tv.substr(start, k - start), out, prev_unk);
        start = k;
      }
    }
    if (start < tv.size()) encode_spm_word(tv.substr(start), out, prev_unk);
  } else {
    encode_spm_word(tv, out, prev_unk);
  }
}

void Tokenizer::Impl::encode_spm_word(std::string_view tv, std::vector<int32_t>& out, bool& prev_unk) const {
  std::vector<Symbol> sym;
  for (size_t k = 0; k < tv.size();) {
    const uint32_t len = utf8::next(tv, k).len;
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(k), len, idx - 1, idx + 1, -1});
    k += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  using Cand = Candidate<float>;
  auto worse = [](const Cand& a, const Cand& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.left > b.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
  // Pieces made from unused tokens are split back into the pair they came from.
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view piece = tv.substr(sym[l].start, sym[l].len + sym[r].len);
    auto it = spm_pieces.find(piece);
    if (it == spm_pieces.end()) return;
    queue.push({data.scores[it->second], l, r, sym[l].len, sym[r].len});
    if (types[it->second] == kTokenUnused)
      rev_merge[piece] = {tv.substr(sym[l].start, sym[l].len), tv.substr(sym[r].start, sym[r].len)};
  };
  for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    if (l.len != c.left_len || r.len != c.right_len || l.next != c.right) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  auto emit = [&](auto&& self, std::string_view piece) -> void {
    auto it = spm_pieces.find(piece);
    if (it != spm_pieces.end()) {
      auto rm = rev_merge.find(piece);
      if (types[it->second] == kTokenUnused && rm != rev_merge.end()) {
        self(self, rm->second.first);
        self(self, rm->second.second);
        return;
      }
      out.push_back(it->second);
      prev_unk = false;
    } else if (byte_fallback) {
      for (char ch : piece) out.push_back(byte_tokens[static_cast<uint8_t>(ch)]);
      prev_unk = false;
    } else {
      if (!prev_unk) out.push_back(data.unk);  // a run of unknown pieces is one unknown token
      prev_unk = true;
    }
  };
  for (int32_t i = 0; i >= 0; i = sym[i].next) emit(emit, tv.substr(sym[i].start, sym[i].len));
}

// Byte-level BPE of one pre-token: bytes to their one-character tokens, then repeatedly apply the
// lowest-ranked merge among adjacent pairs (ties: leftmost).
void Tokenizer::Impl::encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string mapped;
    for (char c : word) mapped += byte_chars[static_cast<uint8_t>(c)];
    auto it = token_ids.find(mapped);
    if (it != token_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t k = 0; k < word.size(); ++k) {
    const int32_t id = byte_symbol[static_cast<uint8_t>(word[k])];
    if (id < 0) continue;  // a byte the vocabulary lacks is dropped, as in HF tokenizers without unk
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(k), 1, idx - 1, idx + 1, id});
  }
  if (sym.empty()) return;
  merge_bpe(sym);
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

// Applies the lowest-ranked merge among adjacent symbols (ties: leftmost) until none applies; symbols with id -1
// (gemma4: a character without a token) never merge. The result is the chain from sym[0] along `next`.
void Tokenizer::Impl::merge_bpe(std::vector<Symbol>& sym) const {
  sym.back().next = -1;
  if (sym.size() == 1) return;

  struct Cand {
    int32_t rank, left, right, merged, left_id, right_id;
  };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    const uint64_t key =
        static_cast<uint64_t>(static_cast<uint32_t>(sym[l].id)) << 32 | static_cast<uint32_t>(sym[r].id);
    auto it = merges.find(key);
    if (it != merges.end()) queue.push({it->second.first, l, r, it->second.second, sym[l].id, sym[r].id});
  };
  for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
    l.len += r.len;
    l.id = c.merged;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
}

// Gemma 4 (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4): spaces become ▁, the text splits into runs of newlines and runs
// of everything else, a run of newlines that is a token is that token, and every run is merged from its UTF-8
// characters.
void Tokenizer::Impl::encode_gemma4(std::string_view fragment, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(fragment.size() * 2);
  for (char c : fragment) {
    if (c == ' ') {
      text += "\xE2\x96\x81";
    } else {
      text += c;
    }
  }
  const std::string_view tv(text);
  for (size_t start = 0; start < tv.size();) {
    const bool newlines = tv[start] == '\n';
    size_t end = start;
    while (end < tv.size() && (tv[end] == '\n') == newlines) ++end;
    const std::string_view word = tv.substr(start, end - start);
    auto it = newlines ? token_ids.find(word) : token_ids.end();
    if (it != token_ids.end()) {
      out.push_back(it->second);
    } else {
      encode_gemma4_word(word, out);
    }
    start = end;
  }
}

void Tokenizer::Impl::encode_gemma4_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t k = 0; k < word.size();) {
    const uint32_t len = utf8::next(word, k).len;
    const auto idx = static_cast<int32_t>(sym.size());
    auto it = token_ids.find(word.substr(k, len));
    const int32_t id = it != token_ids.end() ? it->second : -1;
    sym.push_back({static_cast<uint32_t>(k), len, idx - 1, idx + 1, id});
    k += len;
  }
  if (sym.empty()) return;
  merge_bpe(sym);
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out.push_back(sym[i].id);
    } else {
      for (size_t k = 0; k < sym[i].len; ++k) out.push_back(byte_tokens[static_cast<uint8_t>(word[sym[i].start + k])]);
    }
  }
}

// WordPiece over BERT's words: from the start of ▁word, the longest token that the rest begins with, again and again;
// a word with a place where no token fits is one unknown token.
void Tokenizer::Impl::encode_wordpiece(std::string_view fragment, std::vector<int32_t>& out) const {
  std::vector<std::string> words;
  bert_words(fragment, bert_norm, words);
  std::string w;
  for (const std::string& word : words) {
    w = "\xE2\x96\x81" + word;
    const size_t first = out.size();
    for (size_t pos = 0; pos < w.size();) {
      int32_t id = -1;
      size_t len = std::min(max_token_bytes, w.size() - pos);
      for (; len > 0; --len) {
        auto it = token_ids.find(std::string_view(w).substr(pos, len));
        if (it != token_ids.end()) {
          id = it->second;
          break;
        }
      }
      if (id < 0) {
        out.resize(first);
        out.push_back(data.unk);
        break;
      }
      out.push_back(id);
      pos += len;
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special,
                                       std::span<const TextRange> plain) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && m.add_bos) out.push_back(m.data.bos);
  std::vector<std::pair<std::string_view, int32_t>> fragments;
  m.split_specials(text, parse_special, plain, fragments);
  bool after_special = true;  // SentencePiece: a space prefix at the start and after every split-out token
  std::vector<std::string_view> words;
  for (const auto& [frag, id] : fragments) {
    if (id >= 0) {
      out.push_back(id);
      after_special = true;
      continue;
    }
    if (m.spm) {
      m.encode_spm(frag, m.data.add_space_prefix && after_special, out);
    } else if (m.gemma4) {
      m.encode_gemma4(frag, out);
    } else if (m.bert) {
      m.encode_wordpiece(frag, out);
    } else {
      words.clear();
      m.pre->split(frag, words);
      for (std::string_view w : words) m.encode_bpe_word(w, out);
    }
    after_special = false;
  }
  if (add_special && m.bert && m.add_bos && m.data.sep >= 0) out.push_back(m.data.sep);
  if (add_special && m.data.add_eos) out.push_back(m.data.eos);
  return out;
}

// ---- decoding ------------------------------------------------------------------------------------------------

void Tokenizer::append_piece(std::string& out, int32_t id, bool& at_start, bool skip_special) const {
  const Impl& m = *impl_;
  check_id(id, n_vocab());
  const TokenType t = m.types[id];
  if (t == kTokenControl || t == kTokenUnknown) {
    if (!skip_special) out += m.pieces[id];
    return;
  }
  const std::string& p = m.pieces[id];
  if (at_start && m.spm && m.data.add_space_prefix && t != kTokenByte && !p.empty() && p[0] == ' ') {
    out.append(p, 1);
  } else {
    out += p;
  }
  at_start = false;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool at_start = true;
  for (int32_t id : ids) append_piece(out, id, at_start, skip_special);
  return impl_->bert ? bert_clean_spaces(out) : out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  check_id(id, n_vocab());
  return impl_->pieces[id];
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special, std::vector<int32_t> keep)
    : tok_(&tokenizer), skip_special_(skip_special), keep_(std::move(keep)) {}

std::string StreamDecoder::push(int32_t id) {
  const bool kept = std::find(keep_.begin(), keep_.end(), id) != keep_.end();
  tok_->append_piece(pending_, id, at_start_, skip_special_ && !kept);
  std::string out;
  size_t k = 0;
  while (k < pending_.size()) {
    const utf8::Char c = utf8::next(pending_, k);
    if (c.status == utf8::Status::Incomplete) break;
    if (c.status == utf8::Status::Ok) {
      out.append(pending_, k, c.len);
    } else {
      out += utf8::kReplacement;
    }
    k += c.len;
  }
  pending_.erase(0, k);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  for (size_t k = 0; k < pending_.size();) {
    const utf8::Char c = utf8::next(pending_, k);
    if (c.status == utf8::Status::Ok) {
      out.append(pending_, k, c.len);
    } else {
      out += utf8::kReplacement;  // an invalid or truncated sequence
    }
    k += c.len;
  }
  pending_.clear();
  at_start_ = true;
  return out;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t k = 0; k < s.size();) {
    const utf8::Char c = utf8::next(s, k);
    if (c.status != utf8::Status::Ok) return false;
    k += c.len;
  }
  return true;
}

// ---- JSON ----------------------------------------------------------------------------------------------------

TokenizerData tokenizer_data_from_json(std::string_view json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(std::string("tokenizer JSON: ") + e.what());
  }
  TokenizerData d;
  auto field = [&](const char* name, auto& dst, bool required) {
    if (!j.contains(name)) {
      if (required) throw ModelError(std::string("tokenizer JSON: missing field '") + name + "'");
      return;
    }
    try {
      j.at(name).get_to(dst);
    } catch (const nlohmann::json::exception& e) {
      throw ModelError(std::string("tokenizer JSON: field '") + name + "': " + e.what());
    }
  };
  field("model", d.model, true);
  field("pre", d.pre, false);
  field("tokens", d.tokens, true);
  field("scores", d.scores, false);
  field("token_types", d.token_types, false);
  field("merges", d.merges, false);
  field("bos", d.bos, false);
  field("eos", d.eos, false);
  field("unk", d.unk, false);
  field("pad", d.pad, false);
  field("cls", d.cls, false);
  field("sep", d.sep, false);
  if (j.contains("add_bos")) {
    bool b = false;
    field("add_bos", b, true);
    d.add_bos = b;
  }
  field("add_eos", d.add_eos, false);
  field("add_space_prefix", d.add_space_prefix, false);
  field("lowercase", d.lowercase, false);
  if (j.contains("strip_accents")) {
    bool b = false;
    field("strip_accents", b, true);
    d.strip_accents = b;
  }
  field("chat_template", d.chat_template, false);
  return d;
}

}  // namespace wgllm

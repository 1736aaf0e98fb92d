// Pre-tokenizer regexes of byte-level BPE vocabularies (see pretokenize.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenize.h"

#include <pcre2.h>

#include <algorithm>

#include "tokenizer/utf8.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

// The regexes are llama.cpp's (src/llama-vocab.cpp), which follow each model's tokenizer.json; where llama.cpp
// spells a case-insensitive group as character classes, so do we (PCRE2's caseless 's' would also take U+017F).
// Unmatched stretches between matches are words too, so a trailing `|\s+` alternative changes nothing. Characters
// beyond ASCII are written as \x{...} escapes (their literal forms do not survive every editor's normalisation).

// GPT-2 (HF ByteLevel's own regex): contractions, letters, digits, other symbols, each optionally after one space;
// whitespace runs leave their last space to the next word.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: contractions in any case, letters after at most one non-letter/digit/newline, digits in runs of at most
// three, symbols with trailing newlines, newline runs.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with every digit on its own.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 3.5: Qwen2's with combining marks part of words.
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (GPT-4o, gpt-oss, Llama 4): words split where the case changes (upper-case letters, then lower-case ones),
// each taking one leading non-letter/digit and a trailing contraction; digits in runs of at most three; symbols with
// trailing newlines or slashes. The tokenizer.json regex itself (llama.cpp runs an ASCII-case approximation of it).
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Splits applied before or after a main regex: single digits (SmolLM, StarCoder, ...), digit runs, groups of three
// ASCII digits, punctuation runs, line breaks, CJK runs.
constexpr const char* kDigit = R"(\p{N})";
constexpr const char* kDigits = R"(\p{N}+)";
constexpr const char* kThreeDigits = R"([0-9][0-9][0-9])";
constexpr const char* kPunctuationRun = R"([\p{P}\$\+<=>\^~\|`]+)";
constexpr const char* kNewline = R"([\r\n])";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM: letters of the cased scripts (the ranges of its tokenizer.json), ASCII and full-width symbols,
// trailing whitespace, CJK, digits.
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-)"
    R"(\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-)"
    R"(\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-)"
    R"(\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77})"
    R"(\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-)"
    R"(\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE})"
    R"(\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-)"
    R"(\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149})"
    R"(\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3})"
    R"(\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-)"
    R"(\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekSymbols =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
constexpr const char* kTrailingSpace = R"(\s+$)";

struct PreKind {
  std::vector<std::string_view> names;  // tokenizer.ggml.pre values (llama.cpp's; "" is an absent key)
  std::vector<const char*> patterns;    // applied in turn, each splitting the words of the one before
  bool ignore_merges = false;
  bool add_bos = false;  // BOS by default when tokenizer.ggml.add_bos_token is absent
};

const std::vector<PreKind>& kinds() {
  static const std::vector<PreKind> k = {
      // llama.cpp's fallback for a byte-level BPE file without a known pre-tokenizer.
      {{"default", ""}, {kPunctuationRun, kGpt2, kDigits, kThreeDigits}},
      {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"}, {kGpt2}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3},
       true,
       true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"gpt-4o", "llama4"}, {kGpt4o}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {kDigit, kGpt2}},
      {{"falcon"}, {kPunctuationRun, kGpt2, kThreeDigits}},
      {{"deepseek-llm"}, {kNewline, kDeepseekLetters, kDeepseekSymbols, kTrailingSpace, kCjk, kDigits}},
      {{"deepseek-coder"}, {kNewline, R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, kDigit}},
  };
  return k;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const char* pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // DOLLAR_ENDONLY: `$` is the end of the word, not also before a final newline.
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(std::string("pre-tokenizer regex: ") + reinterpret_cast<const char*>(msg) + " at offset " +
                  std::to_string(err_off));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
};

std::string PreTokenizer::supported() {
  std::string out;
  for (const PreKind& k : kinds())
    for (std::string_view n : k.names)
      if (!n.empty()) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

PreTokenizer::PreTokenizer(std::string_view pre) {
  for (const PreKind& k : kinds()) {
    if (std::find(k.names.begin(), k.names.end(), pre) == k.names.end()) continue;
    for (const char* p : k.patterns) regexes_.push_back(std::make_unique<Regex>(p));
    ignore_merges_ = k.ignore_merges;
    add_bos_ = k.add_bos;
    return;
  }
  throw ModelError("tokenizer.ggml.pre '" + std::string(pre) + "' is not supported (supported: " + supported() + ")");
}

PreTokenizer::~PreTokenizer() = default;

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!md) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

// Matches and gaps of `re` over `piece`, appended to `out`.
void split_one(const pcre2_code* re, pcre2_match_data* md, std::string_view piece, std::vector<std::string_view>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t off = 0, last = 0;
  while (off < piece.size()) {
    int rc = pcre2_match(re, subject, piece.size(), off, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(re, subject, piece.size(), off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(std::string("pre-tokenizer regex match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // an empty match splits nothing: step over one character
      off = s + utf8::next(piece, s).len;
      continue;
    }
    if (s > last) out.push_back(piece.substr(last, s - last));
    out.push_back(piece.substr(s, e - s));
    last = off = e;
  }
  if (last < piece.size()) out.push_back(piece.substr(last));
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  // Valid UTF-8 stretches and lone invalid bytes.
  std::vector<std::string_view> pieces, next;
  std::vector<bool> valid;
  size_t run = 0;
  for (size_t k = 0; k < text.size();) {
    const utf8::Char c = utf8::next(text, k);
    if (c.status == utf8::Status::Ok) {
      k += c.len;
      continue;
    }
    if (k > run) pieces.push_back(text.substr(run, k - run)), valid.push_back(true);
    pieces.push_back(text.substr(k, 1)), valid.push_back(false);
    run = ++k;
  }
  if (run < text.size()) pieces.push_back(text.substr(run)), valid.push_back(true);

  std::vector<std::unique_ptr<MatchData>> mds;
  for (const auto& re : regexes_) mds.push_back(std::make_unique<MatchData>(re->code));
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!valid[i]) {
      words.push_back(pieces[i]);
      continue;
    }
    std::vector<std::string_view> cur{pieces[i]};
    for (size_t r = 0; r < regexes_.size(); ++r) {
      next.clear();
      for (std::string_view p : cur) split_one(regexes_[r]->code, mds[r]->md, p, next);
      cur.swap(next);
    }
    words.insert(words.end(), cur.begin(), cur.end());
  }
}

}  // namespace wgllm

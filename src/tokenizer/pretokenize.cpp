// Pre-tokenizer regexes of byte-level BPE vocabularies (see pretokenize.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenize.h"

#include <pcre2.h>

#include "tokenizer/utf8.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

// GPT-2 (HF ByteLevel's own regex): contractions, letters, digits, other symbols, each optionally after one space;
// whitespace runs leave their last space to the next word.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3: case-insensitive contractions, letters after at most one non-letter/digit/newline, digits in runs of at
// most three, symbols with trailing newlines, newline runs.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with every digit on its own.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// SmolLM (HF Digits(individual_digits) then ByteLevel): every digit on its own, then GPT-2's.
constexpr const char* kDigit = R"(\p{N})";

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const char* pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                         &err_off, nullptr);
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

std::string PreTokenizer::supported() { return "default, gpt2, llama-bpe (llama3), qwen2, smollm"; }

PreTokenizer::PreTokenizer(std::string_view pre) {
  std::vector<const char*> patterns;
  if (pre == "default" || pre == "gpt2" || pre.empty()) {
    patterns = {kGpt2};
  } else if (pre == "llama-bpe" || pre == "llama3") {
    patterns = {kLlama3};
    ignore_merges_ = true;
  } else if (pre == "qwen2") {
    patterns = {kQwen2};
  } else if (pre == "smollm") {
    patterns = {kDigit, kGpt2};
  } else {
    throw ModelError("tokenizer.ggml.pre '" + std::string(pre) + "' is not supported (supported: " + supported() + ")");
  }
  for (const char* p : patterns) regexes_.push_back(std::make_unique<Regex>(p));
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

// libFuzzer target: every tokenizer on any bytes. The first byte picks the tokenizer and flags, the rest is text
// (or, with bit 6, token ids, two bytes each). Checked: ids lie in the vocabulary; decode(encode(text)) == text
// where the tokenizer promises it; every piece a StreamDecoder hands out is valid UTF-8, and for ids whose decode
// is valid UTF-8 the pieces concatenate to it (BERT's WordPiece: the pieces, not decode's clean-up of spaces; its
// normalisation loses text, so no round trip).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "wgllm/error.h"

namespace {

using wgllm::Tokenizer;

struct Fixture {
  std::string name;
  Tokenizer tok;
  bool spm;
  bool bert = false;
};

std::vector<Fixture>* g_fixtures = nullptr;

Tokenizer load(const std::string& name, bool add_space_prefix) {
  const std::string path = std::string(WGLLM_SOURCE_DIR) + "/tests/data/tokenizers/" + name + ".json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_tokenizer: cannot read %s\n", path.c_str());
    std::abort();
  }
  std::ostringstream s;
  s << in.rdbuf();
  wgllm::TokenizerData d = wgllm::tokenizer_data_from_json(s.str());
  d.add_space_prefix = add_space_prefix;
  return Tokenizer(std::move(d));
}

[[noreturn]] void fail(const Fixture& f, const char* what, std::string_view text) {
  std::fprintf(stderr, "fuzz_tokenizer: %s: %s (text of %zu bytes)\n", f.name.c_str(), what, text.size());
  std::abort();
}

// Streams `ids` through a StreamDecoder: every piece valid UTF-8; their concatenation equals decode(ids) when
// that is valid UTF-8.
void check_stream(const Fixture& f, const std::vector<int32_t>& ids, bool skip_special, std::string_view text) {
  wgllm::StreamDecoder dec(f.tok, skip_special);
  std::string all;
  for (const int32_t id : ids) {
    const std::string piece = dec.push(id);
    if (!wgllm::is_valid_utf8(piece)) fail(f, "a streamed piece is not valid UTF-8", text);
    all += piece;
  }
  const std::string rest = dec.flush();
  if (!wgllm::is_valid_utf8(rest)) fail(f, "the flushed piece is not valid UTF-8", text);
  all += rest;
  if (f.bert) return;  // decode() cleans up spaces around punctuation, the stream does not (tokenizer.h)
  const std::string whole = f.tok.decode(ids, skip_special);
  if (wgllm::is_valid_utf8(whole) && all != whole) fail(f, "the streamed pieces differ from decode()", text);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_fixtures = new std::vector<Fixture>;
  g_fixtures->push_back({"spm", load("spm", true), true});
  g_fixtures->push_back({"spm (no space prefix)", load("spm", false), true});
  for (const char* name : {"bpe_gpt2", "bpe_llama3", "bpe_qwen2", "bpe_smollm"})
    g_fixtures->push_back({name, load(name, false), false});
  g_fixtures->push_back({"bert", load("bert", false), false, true});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const Fixture& f = (*g_fixtures)[(flags & 7u) % g_fixtures->size()];
  const bool add_special = flags & 8u, parse_special = flags & 16u, skip_special = flags & 32u;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int32_t n_vocab = f.tok.n_vocab();

  if (flags & 64u) {  // arbitrary ids, including the bytes of split and invalid characters
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < text.size(); i += 2)
      ids.push_back(static_cast<int32_t>((uint8_t(text[i]) | uint8_t(text[i + 1]) << 8) % n_vocab));
    check_stream(f, ids, skip_special, text);
    return 0;
  }

  const std::vector<int32_t> ids = f.tok.encode(text, add_special, parse_special);
  for (const int32_t id : ids)
    if (id < 0 || id >= n_vocab) fail(f, "an id outside the vocabulary", text);
  check_stream(f, ids, skip_special, text);

  // Round trip. Byte-level BPE keeps every byte, and special tokens decode to their text. SentencePiece turns a
  // U+2581 in the text into a space, and puts a space prefix after each split-out token, which decode keeps.
  if (add_special || f.bert) return 0;
  const std::string back = f.tok.decode(ids);
  if (f.spm) {
    if (text.find("\xE2\x96\x81") != std::string_view::npos) return 0;
    for (const int32_t id : ids) {
      const auto t = f.tok.token_type(id);
      if (t == wgllm::kTokenControl || t == wgllm::kTokenUserDefined || t == wgllm::kTokenUnknown) return 0;
    }
  }
  if (back != text) fail(f, "decode(encode(text)) differs from the text", text);
  return 0;
}

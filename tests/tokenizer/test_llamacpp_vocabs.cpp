// The real vocabularies of llama.cpp's tokenizer test set (models/ggml-vocab-*.gguf in its source, each with .inp
// test strings and the .out ids HF tokenizers give them): every SentencePiece, byte-level BPE, gemma4 and bert one
// loads through the public Vocab (metadata only: these files hold no tensors) and tokenizes every string to the same
// ids, read as llama.cpp's test-tokenizer-0 reads them (no special tokens added, none parsed).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "external.h"
#include "test_util.h"
#include "wgllm/vocab.h"

namespace wgllm {
namespace {

using test::show;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// The .inp strings (separated by "\n__ggml_vocab_test__\n") with the .out lines (ids separated by spaces).
std::vector<VocabCase> read_cases(const std::string& base) {
  const std::string inp = slurp(base + ".inp"), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    texts.push_back(inp.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::istringstream out(slurp(base + ".out"));
  std::vector<VocabCase> cases;
  for (std::string line; std::getline(out, line);) {
    VocabCase c;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  if (cases.size() != texts.size())
    throw std::runtime_error(base + ": " + std::to_string(texts.size()) + " strings but " +
                             std::to_string(cases.size()) + " id lines");
  for (size_t i = 0; i < cases.size(); ++i) cases[i].text = texts[i];
  return cases;
}

class LlamaCppVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocab, TokenizesEveryTestStringAsHfTokenizers) {
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string base = *src + "/models/ggml-vocab-" + GetParam() + ".gguf";
  const Vocab vocab = Vocab::load(base);
  const std::vector<VocabCase> cases = read_cases(base);
  ASSERT_GE(cases.size(), 20u);
  size_t mismatches = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> got = vocab.encode(c.text, false, false);
    if (got == c.ids) continue;
    if (++mismatches <= 5)
      ADD_FAILURE() << GetParam() << ": '" << show(c.text) << "'\n  want " << show(c.ids) << "\n  got  " << show(got);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << cases.size() << " strings";
}

// Gemma 4's ids decode back to every test string (▁ to spaces, <0xXX> byte tokens to their bytes), and with BOS
// (llama.cpp adds it for gemma4 whatever the file says) encode(add_special) is BOS then the same ids.
TEST(LlamaCppVocabGemma4, DecodesEveryTestStringBack) {
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string base = *src + "/models/ggml-vocab-gemma-4.gguf";
  const Vocab vocab = Vocab::load(base);
  ASSERT_TRUE(vocab.add_bos());
  size_t checked = 0;
  for (const VocabCase& c : read_cases(base)) {
    EXPECT_EQ(vocab.decode(c.ids), c.text) << "'" << show(c.text) << "'";
    std::vector<int32_t> with_bos{vocab.bos()};
    with_bos.insert(with_bos.end(), c.ids.begin(), c.ids.end());
    EXPECT_EQ(vocab.encode(c.text, true, false), with_bos) << "'" << show(c.text) << "'";
    ++checked;
  }
  EXPECT_GE(checked, 20u);
}

// BERT's WordPiece: encode(add_special) wraps the ids in [CLS] and [SEP] (101 and 102, the file's cls_token_id and
// seperator_token_id) as llama.cpp does, and decode gives what llama.cpp's detokenizer gives: the pieces llama-tokenize
// lists for these ids (a space in front of every word, none in front of a word's later pieces, [UNK] as its text),
// with its clean-up of the spaces around punctuation worked out by hand.
TEST(LlamaCppVocabBert, WrapsInClsSepAndDecodesAsLlamaCpp) {
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string base = *src + "/models/ggml-vocab-bert-bge.gguf";
  const Vocab vocab = Vocab::load(base);
  ASSERT_TRUE(vocab.add_bos());
  EXPECT_EQ(vocab.bos(), 101);
  const std::vector<VocabCase> cases = read_cases(base);
  for (const VocabCase& c : cases) {
    std::vector<int32_t> wrapped{101};
    wrapped.insert(wrapped.end(), c.ids.begin(), c.ids.end());
    wrapped.push_back(102);
    EXPECT_EQ(vocab.encode(c.text, true, false), wrapped) << "'" << show(c.text) << "'";
  }
  auto ids_of = [&](const std::string& text) {
    for (const VocabCase& c : cases)
      if (c.text == text) return c.ids;
    ADD_FAILURE() << "no test string '" << show(text) << "'";
    return std::vector<int32_t>{};
  };
  const std::pair<std::string, std::string> decoded[] = {
      {"Hello, world!", " hello, world!"},
      {" this is 🦙.cpp", " this is[UNK]. cpp"},
      {"' era", "'era"},  // an apostrophe between spaces loses both
      {"Cửa Việt", " cua viet"},
      {"Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
       " hello, y'all! how are you[UNK]? 我[UNK][UNK] apple[UNK][UNK] 1314151 天 ～"},
  };
  for (const auto& [text, want] : decoded) EXPECT_EQ(vocab.decode(ids_of(text)), want) << "'" << show(text) << "'";
  EXPECT_EQ(vocab.decode(ids_of(" this is 🦙.cpp"), true), " this is. cpp");
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVocab,
                         ::testing::Values("llama-spm", "llama-bpe", "phi-3", "qwen2", "qwen35", "gpt-2", "mpt",
                                           "starcoder", "refact", "command-r", "deepseek-llm", "deepseek-coder",
                                           "falcon", "gemma-4", "bert-bge"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace wgllm

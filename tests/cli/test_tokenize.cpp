// `wgllm tokenize`: llama-tokenize's output formats on vocabulary-only files (the ids HF tokenizers give, from
// llama.cpp's tokenizer test set), llama-tokenize's own output byte for byte where it is built, and clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>

#include "cli/cli_util.h"
#include "external.h"

namespace wgllm {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "wgllm_tok_" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(TokenizeCli, VocabOnlyFilesGiveHfIds) {
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string models = *src + "/models/ggml-vocab-";
  // A string of gpt-2's test set, from a file verbatim (its trailing newline is a token), and its .out ids.
  const std::string text = write_temp("gpt2.txt", "Hello world\n");
  CliResult r = run_cli("tokenize -m " + models + "gpt-2.gguf -f " + text + " --ids");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[15496, 995, 198]\n");
  // The per-token listing; llama-spm adds BOS (and a space prefix), --no-bos drops it.
  r = run_cli("tokenize -m " + models + "llama-spm.gguf -p 'Hello world'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n");
  r = run_cli("tokenize -m " + models + "llama-spm.gguf -p 'Hello world' --no-bos --ids --show-count");
  EXPECT_EQ(r.out, "[15043, 3186]\nTotal number of tokens: 2\n");
  // Escapes are processed unless --no-escape.
  r = run_cli("tokenize -m " + models + "gpt-2.gguf -p 'a\\nb' --ids");
  EXPECT_EQ(r.out, "[64, 198, 65]\n");
  r = run_cli("tokenize -m " + models + "gpt-2.gguf -p 'a\\nb' --ids --no-escape");
  EXPECT_NE(r.out, "[64, 198, 65]\n");
  // BERT's WordPiece: the .out ids of "Hello world"; by default in [CLS] and [SEP], as llama-tokenize lists them.
  r = run_cli("tokenize -m " + models + "bert-bge.gguf -p 'Hello world' --no-bos --ids");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[7592, 2088]\n");
  r = run_cli("tokenize -m " + models + "bert-bge.gguf -p 'Hello world'");
  EXPECT_EQ(r.out, "   101 -> '[CLS]'\n  7592 -> ' hello'\n  2088 -> ' world'\n   102 -> '[SEP]'\n");
  std::remove(text.c_str());
}

// `wgllm tokenize` and llama.cpp's `llama-tokenize` (in bin) on the same model and text file, with each set of flags:
// the same output, byte for byte.
void expect_as_llama_tokenize(const std::string& bin, const std::string& model, const std::string& text,
                              std::initializer_list<const char*> flag_sets) {
  for (const std::string flags : flag_sets) {
    const CliResult ours = run_cli("tokenize -m " + model + " -f " + text + flags);
    FILE* p = popen(
        (bin + "/llama-tokenize --log-disable -m " + model + " -f " + text + flags + " 2>/dev/null").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string theirs;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) theirs.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << flags;
    EXPECT_EQ(ours.status, 0) << ours.err;
    EXPECT_EQ(ours.out, theirs) << "flags:" << flags;
  }
}

// BERT's WordPiece on what its test set lacks (accents, controls, symbols, CJK, apostrophes, [SEP] written in the
// text), byte for byte as llama-tokenize prints it. Hangul is left out on purpose: llama.cpp keeps only the first
// letter of a syllable's NFD, where HF's BertNormalizer, which made the vocabulary, and wgllm keep all three.
TEST(TokenizeCli, BertSameOutputAsLlamaTokenize) {
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string model = *src + "/models/ggml-vocab-bert-bge.gguf";
  const std::string text = write_temp(
      "bert.txt",
      "Na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x86r\xC3\xB8 a\xE2\x80\x8D"
      "b\x01"
      "c \xE2\x82\xAC"
      "5 $100+<x>^`|~ "
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E I'm [SEP] \xCE\xA3\xCE\xAF\xCF\x83\xCF\x85\xCF\x86\xCE\xBF\xCF\x82 "
      "\xEF\xAC\x81ne \xC4\xB0stanbul\t\xE3\x80\x80wide");
  expect_as_llama_tokenize(*bin, model, text, {"", " --ids", " --no-bos --no-parse-special"});
  std::remove(text.c_str());
}

TEST(TokenizeCli, SameOutputAsLlamaTokenize) {
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  const auto gemma = test::gemma_file();
  WGLLM_REQUIRE_EXTERNAL(gemma, "the Gemma 3 270M file");
  const std::string text = write_temp("gemma.txt", "<start_of_turn>user\n  caf\xC3\xA9\t\xF0\x9D\x84\x9E 42\\n end");
  expect_as_llama_tokenize(*bin, *gemma, text, {"", " --ids", " --no-bos --no-parse-special", " --no-escape --ids"});
  std::remove(text.c_str());
}

TEST(TokenizeCli, ErrorsAreOneLine) {
  CliResult r = run_cli("tokenize -m /nonexistent.gguf -p x");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "wgllm: error: /nonexistent.gguf: cannot open: No such file or directory\n");
  r = run_cli("tokenize");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "wgllm: error: no text: pass -p TEXT, -f FILE or --stdin\n");
  r = run_cli("tokenize -f /");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
  // Without -m: the built-in model's vocabulary; from standard input.
  r = run_cli("tokenize --stdin --ids", "printf 'ROMEO:' |");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.front(), '[');
  const auto src = test::llamacpp_src();
  if (!src) return;
  r = run_cli("tokenize -m " + *src + "/models/ggml-vocab-nomic-bert-moe.gguf -p x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("tokenizer.ggml.model 't5' is not supported (supported: llama, gpt2, gemma4, bert)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace wgllm

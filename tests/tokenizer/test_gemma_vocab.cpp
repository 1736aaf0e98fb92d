// Gemma 3's vocabulary (SentencePiece, 262,144 tokens, byte fallback, no space prefix, whitespace and newline runs as
// user-defined tokens) read from the real Gemma 3 270M file through the public Vocab, against llama.cpp's
// llama-tokenize on the same file: a fixed list of nasty strings and seeded random ones, with control tokens parsed
// and not. Also its chat template (the file carries none: the gemma3 architecture's).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "external.h"
#include "test_util.h"
#include "wgllm/vocab.h"

namespace wgllm {
namespace {

using test::show;

// Strings joined by this user-defined token (id 5), which always splits the text before SentencePiece runs, as it
// does in llama.cpp: each string is tokenized on its own, and one llama-tokenize call covers them all.
constexpr const char* kSeparator = "[multimodal]";

std::vector<std::string> nasty_strings() {
  return {
      "",
      " ",
      "  ",
      "\t",
      "\n",
      "\n\n\n",
      " \n \n",
      "\r\n",
      "Hello world",
      " Hello world",
      "Hello  world",
      "   leading and trailing   ",
      std::string(40, ' ') + "x",
      std::string(35, '\n'),
      "tab\tseparated\tvalues\t\t\t",
      "int main() {\n    return 0;\n}\n",
      "def f(x):\n\tif x:\n\t\treturn [i**2 for i in range(x)]  # squares\n",
      "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
      "SELECT * FROM users WHERE id = 42;",
      "x = {\"key\": [1, 2.5e-3, null, true]}",
      "3.14159265358979 1234567890 0x1F 1e10",
      "caf\xC3\xA9 na\xC3\xAFve \xC3\x85ngstr\xC3\xB6m Stra\xC3\x9F"
      "e",
      "e\xCC\x81 a\xCC\x8A n\xCC\x83",  // combining accents
      "\xE4\xB8\xAD\xE6\x96\x87\xE5\xAD\x97\xE7\xAC\xA6 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC "
      "\xD1\x80\xD1\x83\xD1\x81\xD1\x81\xD0\xBA\xD0\xB8\xD0\xB9",
      "\xD7\xA2\xD7\x91\xD7\xA8\xD7\x99\xD7\xAA \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9 "
      "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80",
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F"
      "\x91\xA7 \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 \xE2\x9D\xA4\xEF\xB8\x8F",
      "\xF0\x9D\x84\x9E \xF0\x90\x80\x80 \xEE\x80\x80 \xF3\xB0\x80\x80 \xF4\x8F\xBF\xBF",  // rare: byte fallback
      "\x01\x02\x7F control \x1B[0m",
      "zero\xE2\x80\x8Bwidth \xEF\xBB\xBF"
      "bom \xC2\xA0nbsp \xE3\x80\x80ideographic",
      "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
      "<bos><eos><pad><unk><mask>",
      "<start_of_turn",
      "start_of_turn>",
      "<unused0> <unused99>",
      "<start_of_image> <end_of_image>",
      "<|im_start|>system</s><s>[INST]",
      std::string(300, 'a'),
      "supercalifragilisticexpialidocious"
      "supercalifragilisticexpialidocious"
      "supercalifragilisticexpialidocious",
      std::string(120, '7'),
      "Pneumonoultramicroscopicsilicovolcanoconiosis",
      "https://example.com/path?query=1&b=two#frag",
      "email@example.org, @handle, #hashtag",
      "....!!!??"
      "?---___===",
      "\xE2\x80\x9Cquoted\xE2\x80\x9D \xE2\x80\x98single\xE2\x80\x99 \xE2\x80\x94 dash \xE2\x80\xA6",
      "\xE2\x96\x81 already a space piece \xE2\x96\x81\xE2\x96\x81",
      "A\nB\n\nC\n\n\nD",
      "trailing newline\n",
      "  \t \n\t  mixed\t \n",
  };
}

// Random strings built from pieces of many kinds.
std::vector<std::string> random_strings(size_t n, std::mt19937_64& gen) {
  const std::vector<std::vector<std::string>> kinds = {
      {" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\t\t", std::string(9, ' '), "\xC2\xA0", "\xE3\x80\x80"},
      {"the",  "The",   "quick",        "brown",   "fox",   "jumps", "over",   "lazy",    "dog",    "I",    "don't",
       "it's", "HELLO", "tokenization", "Ünïcödé", "naïve", "café",  "résumé", "München", "Zürich", "señor"},
      {"{", "}", "()", "=>",     "::",    "->", "i++", "==", "!=",  "//", "/*", "*/", "\"", "'",  "`",  "$",
       "@", "<", ">",  "</div>", "<br/>", ";",  ",",   ".",  "...", "#",  "%",  "&&", "||", "\\", "\\n"},
      {"0", "7", "42", "2024", "3.14", "1e-9", "0xFF", "1,000,000", "12345678901234567890"},
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\xF0\x9F\xA4\x96", "\xE2\x9C\xA8",
       "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7", "\xE2\x9D\xA4\xEF\xB8\x8F"},
      {"\xE4\xB8\xAD\xE6\x96\x87", "\xE6\xBC\xA2\xE5\xAD\x97", "\xE3\x81\xB2\xE3\x82\x89\xE3\x81\x8C\xE3\x81\xAA",
       "\xE3\x82\xAB\xE3\x82\xBF\xE3\x82\xAB\xE3\x83\x8A", "\xED\x95\x9C\xEA\xB8\x80",
       "\xE0\xB9\x84\xE0\xB8\x97\xE0\xB8\xA2"},
      {"\xF0\x9D\x84\x9E", "\xF0\x90\x80\x80", "\xEE\x80\x81", "\xF0\xAA\x9A\xB2", "\xE1\x9A\xA0", "\x01", "\x7F",
       "\xE2\x80\x8B", "\xCD\xB8"},
      {"<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<unused7>", "<s>", "</s>",
       "<|im_end|>"},
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    const int parts = 1 + int(gen() % 10);
    for (int p = 0; p < parts; ++p) {
      const auto& kind = kinds[gen() % kinds.size()];
      s += kind[gen() % kind.size()];
      if (gen() % 50 == 0) s += std::string(20 + gen() % 200, char('a' + gen() % 26));  // a very long word
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Runs a shell command; its stdout, or a failure naming it.
std::string capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[65536];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0) throw std::runtime_error("failed: " + cmd);
  return out;
}

// llama-tokenize's --ids output: "[1, 2, 3]".
std::vector<int32_t> parse_ids(const std::string& s) {
  const size_t open = s.find('['), close = s.rfind(']');
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw std::runtime_error("no id list in: " + s.substr(0, 200));
  std::string list = s.substr(open + 1, close - open - 1);
  for (char& c : list)
    if (c == ',') c = ' ';
  std::istringstream in(list);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// The ids between separators.
std::vector<std::vector<int32_t>> split_at(const std::vector<int32_t>& ids, int32_t sep) {
  std::vector<std::vector<int32_t>> parts(1);
  for (int32_t id : ids) {
    if (id == sep) {
      parts.emplace_back();
    } else {
      parts.back().push_back(id);
    }
  }
  return parts;
}

TEST(GemmaVocab, TokenizesLikeLlamaTokenize) {
  const auto file = test::gemma_file();
  WGLLM_REQUIRE_EXTERNAL(file, "the Gemma 3 270M file");
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  const Vocab vocab = Vocab::load(*file);
  ASSERT_EQ(vocab.n_vocab(), 262144);
  ASSERT_TRUE(vocab.add_bos());
  const std::vector<int32_t> sep_ids = vocab.encode(kSeparator, false, false);
  ASSERT_EQ(sep_ids.size(), 1u) << "the separator must be one user-defined token";

  std::mt19937_64 gen = test::rng(12);
  std::vector<std::string> strings = nasty_strings();
  for (std::string& s : random_strings(220, gen)) strings.push_back(std::move(s));
  ASSERT_GE(strings.size(), 250u);
  std::string joined;
  for (size_t i = 0; i < strings.size(); ++i) {
    if (i) joined += kSeparator;
    joined += strings[i];
  }
  const std::string path = ::testing::TempDir() + "wgllm_gemma_strings_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path, std::ios::binary) << joined;

  for (const bool parse_special : {true, false}) {
    SCOPED_TRACE(parse_special ? "control tokens parsed" : "control tokens as text");
    const std::string cmd = *bin + "/llama-tokenize -m " + *file + " -f " + path + " --ids --log-disable --no-escape" +
                            (parse_special ? "" : " --no-parse-special") + " 2>/dev/null";
    const std::vector<int32_t> want = parse_ids(capture(cmd));
    const std::vector<int32_t> got = vocab.encode(joined, true, parse_special);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(want.front(), vocab.bos());
    if (got == want) continue;
    const auto want_parts = split_at({want.begin() + 1, want.end()}, sep_ids[0]);
    const auto got_parts = split_at({got.begin() + (got.empty() ? 0 : 1), got.end()}, sep_ids[0]);
    ASSERT_EQ(want_parts.size(), strings.size());
    ASSERT_EQ(got_parts.size(), strings.size());
    size_t bad = 0;
    for (size_t i = 0; i < strings.size(); ++i)
      if (want_parts[i] != got_parts[i] && ++bad <= 5)
        ADD_FAILURE() << "'" << show(strings[i]) << "'\n  llama.cpp " << show(want_parts[i]) << "\n  wgllm     "
                      << show(got_parts[i]);
    EXPECT_EQ(bad, 0u) << "strings tokenized differently, of " << strings.size();
  }
  std::remove(path.c_str());
}

// The file carries no chat template: the gemma3 architecture's is used, rendered as llama.cpp's gemma template
// (with the BOS its Jinja template starts with), the system message folded into the user turn.
TEST(GemmaVocab, ChatTemplateOfTheArchitecture) {
  const auto file = test::gemma_file();
  WGLLM_REQUIRE_EXTERNAL(file, "the Gemma 3 270M file");
  const Vocab vocab = Vocab::load(*file);
  EXPECT_EQ(vocab.architecture(), "gemma3");
  EXPECT_EQ(vocab.apply_chat_template(" Hi there \n"),
            "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(vocab.apply_chat_template("Hi", " Be brief. "),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
  // The markers are control tokens; what the user typed stays text, a typed <end_of_turn> included.
  const std::vector<int32_t> ids = vocab.encode_chat("a <end_of_turn> b");
  const int32_t start = vocab.encode("<start_of_turn>", false, true).at(0);
  const int32_t end = vocab.encode("<end_of_turn>", false, true).at(0);
  int n_end = 0;
  for (int32_t id : ids) n_end += id == end;
  EXPECT_EQ(ids.front(), vocab.bos());
  EXPECT_EQ(ids.at(1), start);
  EXPECT_EQ(n_end, 1);
  EXPECT_EQ(vocab.decode(ids), "<bos><start_of_turn>user\na <end_of_turn> b<end_of_turn>\n<start_of_turn>model\n");
}

}  // namespace
}  // namespace wgllm

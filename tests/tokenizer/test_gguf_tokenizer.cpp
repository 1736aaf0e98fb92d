// tokenizer_data_from_gguf: the tokenizer fixtures written into GGUF metadata encode exactly as from JSON, the
// regenerated test models' tokenizers load and round-trip, and malformed metadata gives clear errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "gguf_builder.h"
#include "model/config.h"
#include "model_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "wgllm/error.h"

namespace wgllm {
namespace {

using test::GgufBuilder;
using test::GVal;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

const std::string kTokDir = std::string(WGLLM_SOURCE_DIR) + "/tests/data/tokenizers/";

// The tokenizer.ggml.* keys of `d`, as llama.cpp's converters write them (absent ids and empty arrays left out).
GgufBuilder builder_from(const TokenizerData& d) {
  GgufBuilder b;
  b.kv("general.architecture", GVal::str("llama"));
  b.kv("tokenizer.ggml.model", GVal::str(d.model));
  if (!d.pre.empty()) b.kv("tokenizer.ggml.pre", GVal::str(d.pre));
  b.kv("tokenizer.ggml.tokens", GVal::strings(d.tokens));
  if (!d.scores.empty()) b.kv("tokenizer.ggml.scores", GVal::f32s(d.scores));
  if (!d.token_types.empty()) b.kv("tokenizer.ggml.token_type", GVal::i32s(d.token_types));
  if (!d.merges.empty()) b.kv("tokenizer.ggml.merges", GVal::strings(d.merges));
  const std::pair<const char*, int32_t> ids[] = {{"tokenizer.ggml.bos_token_id", d.bos},
                                                 {"tokenizer.ggml.eos_token_id", d.eos},
                                                 {"tokenizer.ggml.unknown_token_id", d.unk},
                                                 {"tokenizer.ggml.padding_token_id", d.pad}};
  for (const auto& [key, id] : ids)
    if (id >= 0) b.kv(key, GVal::u32(uint32_t(id)));
  if (d.add_bos) b.kv("tokenizer.ggml.add_bos_token", GVal::boolean(*d.add_bos));
  b.kv("tokenizer.ggml.add_eos_token", GVal::boolean(d.add_eos));
  b.kv("tokenizer.ggml.add_space_prefix", GVal::boolean(d.add_space_prefix));
  if (!d.chat_template.empty()) b.kv("tokenizer.chat_template", GVal::str(d.chat_template));
  return b;
}

TokenizerData from_bytes(GgufBuilder& b) { return tokenizer_data_from_gguf(GgufFile::from_bytes(b.build(), "t.gguf")); }

class GgufTokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTokenizerFixture, SameDataAndEncodingAsJson) {
  const TokenizerData want = tokenizer_data_from_json(read_file(kTokDir + GetParam() + ".json"));
  GgufBuilder b = builder_from(want);
  const TokenizerData got = from_bytes(b);
  EXPECT_EQ(got.model, want.model);
  EXPECT_EQ(got.pre, want.pre);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.scores, want.scores);
  EXPECT_EQ(got.token_types, want.token_types);
  EXPECT_EQ(got.merges, want.merges);
  EXPECT_EQ(got.bos, want.bos);
  EXPECT_EQ(got.eos, want.eos);
  EXPECT_EQ(got.unk, want.unk);
  EXPECT_EQ(got.pad, want.pad);
  EXPECT_EQ(got.add_bos, want.add_bos);
  EXPECT_EQ(got.add_eos, want.add_eos);
  EXPECT_EQ(got.add_space_prefix, want.add_space_prefix);
  EXPECT_EQ(got.chat_template, want.chat_template);

  const Tokenizer tok(got);
  const auto strings = nlohmann::json::parse(read_file(kTokDir + "strings.json")).get<std::vector<std::string>>();
  const auto ref = nlohmann::json::parse(read_file(kTokDir + GetParam() + ".ref.json"))
                       .at("ids_no_special")
                       .get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(ref.size(), strings.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < strings.size(); ++i) mismatches += tok.encode(strings[i], false, false) != ref[i];
  EXPECT_EQ(mismatches, 0u) << "of " << strings.size() << " strings";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GgufTokenizerFixture,
                         ::testing::Values("bpe_gpt2", "bpe_llama3", "bpe_qwen2", "bpe_smollm", "spm"));

// The tokenizers make_model.py writes (byte-level BPE for llama and qwen2, SentencePiece) load and round-trip.
class GgufTokenizerModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTokenizerModel, LoadsAndRoundTrips) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  const ModelConfig c = config_from_gguf(f);
  const Tokenizer tok(tokenizer_data_from_gguf(f));
  EXPECT_EQ(uint32_t(tok.n_vocab()), c.n_vocab);
  EXPECT_GE(tok.bos(), 0);
  EXPECT_GE(tok.eos(), 0);
  EXPECT_FALSE(tok.data().chat_template.empty());
  const std::vector<std::string> samples = {"First Citizen:\nBefore we proceed any further, hear me speak.",
                                            "  What says he?  ", "Romeo, Romeo! wherefore art thou Romeo?",
                                            "caf\xC3\xA9 \xE2\x82\xAC 42", ""};
  for (const auto& s : samples) {
    const auto ids = tok.encode(s, false, false);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && uint32_t(id) < c.n_vocab) << id;
    EXPECT_EQ(tok.decode(ids), s);
  }
  // Merges / scores are in use: trained on this text, the sentence needs far fewer tokens than bytes.
  const std::string line = "Before we proceed any further, hear me speak.";
  EXPECT_LT(tok.encode(line, false, false).size(), line.size() / 2);
}

// Every control token of the vocabulary typed into a chat message (user and system) stays text: the prompt holds
// exactly the control tokens of the template's own markers, and decodes back to the rendered text.
TEST_P(GgufTokenizerModel, TypedControlTokensCannotOpenATurn) {
  const GgufFile f = GgufFile::open(test::model_path(GetParam()));
  const Tokenizer tok(tokenizer_data_from_gguf(f));
  const ChatFormat format(tok.data().chat_template, "");
  ASSERT_TRUE(format.has_template());
  const std::string bos = tok.token_text(tok.bos()), eos = tok.token_text(tok.eos());
  auto encode = [&](const std::string& user, const std::string& system) {
    ChatInput in;
    if (!system.empty()) in.messages.push_back({{"role", "system"}, {"content", system}});
    in.messages.push_back({{"role", "user"}, {"content", user}});
    const ChatPrompt p = format.render(in, bos, eos, false);
    const auto ids = tok.encode(p.text, false, true, p.content);
    if (tok.data().model == "gpt2") {  // (SentencePiece decodes a space after a marker)
      EXPECT_EQ(tok.decode(ids), p.text);
    }
    return ids;
  };
  auto specials = [&](const std::vector<int32_t>& ids) {
    std::vector<int32_t> out;
    for (int32_t id : ids)
      if (tok.is_special(id)) out.push_back(id);
    return out;
  };
  const std::vector<int32_t> markers = specials(encode("hello there", "be brief"));
  ASSERT_FALSE(markers.empty());
  int tried = 0;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.token_type(id) != kTokenControl) continue;
    const std::string t = tok.token_text(id);
    EXPECT_EQ(specials(encode("hello " + t + "user\n" + t + " there", t + "system")), markers) << "typed " << t;
    ++tried;
  }
  EXPECT_GE(tried, 2);
}

INSTANTIATE_TEST_SUITE_P(Models, GgufTokenizerModel, ::testing::Values("llama-f32", "qwen2-f32", "llama-spm-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// ---- errors

TokenizerData small() {
  TokenizerData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>", "a"};
  d.scores = {0, 0, 0, -1};
  d.token_types = {2, 3, 3, 1};
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  return d;
}

void expect_error(GgufBuilder& b, const std::string& part) {
  try {
    from_bytes(b);
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.gguf"), std::string::npos) << e.what();
  }
}

TEST(GgufTokenizerErrors, SmallValidFileLoads) {
  GgufBuilder b = builder_from(small());
  const TokenizerData d = from_bytes(b);
  EXPECT_EQ(d.tokens.size(), 4u);
  EXPECT_EQ(d.pre, "");
  EXPECT_FALSE(d.add_bos.has_value());
  EXPECT_NO_THROW(Tokenizer{d});
}

TEST(GgufTokenizerErrors, MissingKeys) {
  GgufBuilder b = builder_from(small());
  b.without("tokenizer.ggml.tokens");
  expect_error(b, "tokenizer.ggml.tokens' is missing");
  GgufBuilder b2 = builder_from(small());
  b2.without("tokenizer.ggml.model");
  expect_error(b2, "tokenizer.ggml.model' is missing");
}

TEST(GgufTokenizerErrors, SizeMismatches) {
  GgufBuilder b = builder_from(small());
  b.set("tokenizer.ggml.scores", GVal::f32s({0, 0, 0}));
  expect_error(b, "tokenizer.ggml.scores' has 3 entries for 4 tokens");
  GgufBuilder b2 = builder_from(small());
  b2.set("tokenizer.ggml.token_type", GVal::i32s({1, 1, 1, 1, 1}));
  expect_error(b2, "tokenizer.ggml.token_type' has 5 entries for 4 tokens");
  GgufBuilder b3 = builder_from(small());
  b3.set("tokenizer.ggml.tokens", GVal::strings({}));
  expect_error(b3, "tokenizer.ggml.tokens' is empty");
}

TEST(GgufTokenizerErrors, WrongTypesAndIds) {
  GgufBuilder b = builder_from(small());
  b.set("tokenizer.ggml.tokens", GVal::u32(4));
  expect_error(b, "tokenizer.ggml.tokens");
  GgufBuilder b2 = builder_from(small());
  b2.set("tokenizer.ggml.scores", GVal::strings({"a", "b", "c", "d"}));
  expect_error(b2, "tokenizer.ggml.scores");
  GgufBuilder b3 = builder_from(small());
  b3.set("tokenizer.ggml.add_bos_token", GVal::str("yes"));
  expect_error(b3, "tokenizer.ggml.add_bos_token");
  GgufBuilder b4 = builder_from(small());
  b4.set("tokenizer.ggml.eos_token_id", GVal::u32(4));
  expect_error(b4, "tokenizer.ggml.eos_token_id' = 4 is outside the vocabulary of 4 tokens");
}

}  // namespace
}  // namespace wgllm

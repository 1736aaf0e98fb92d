// `wgllm run` through the built binary: --chat renders the model's chat template, a prompt longer than an explicit
// -c fails before the weights upload, and the context line says when -c goes past the training context. The
// expected token ids come from the tokenizer read straight from the GGUF, on text built here by hand.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "gguf/file.h"
#include "model_util.h"
#include "test_util.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "wgllm/wgllm.h"

namespace wgllm {
namespace {

std::string write_prompt_file(const std::string& text) {
  const std::string path = ::testing::TempDir() + "wgllm_cli_prompt_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// n random words (letters only: safe inside single quotes on a shell command line).
std::string random_words(std::mt19937_64& gen, size_t n) {
  static const char* words[] = {"thou",   "art",  "the",  "king",  "of",    "Verona", "night", "my",    "lord",
                                "sweet",  "rose", "and",  "love",  "doth",  "speak",  "what",  "light", "shall",
                                "yonder", "fair", "hath", "death", "heart", "gentle", "noble", "ROMEO", "Juliet"};
  std::uniform_int_distribution<size_t> d(0, std::size(words) - 1);
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += words[d(gen)];
  }
  return s;
}

Tokenizer tokenizer_of(const std::string& model) {
  return Tokenizer(tokenizer_data_from_gguf(GgufFile::open(test::model_path(model))));
}

// Jinja's `trim`.
std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r\v\f");
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(" \t\n\r\v\f") - b + 1);
}

// ---- --chat

struct ChatCase {
  std::string model;
  bool system;
};
std::ostream& operator<<(std::ostream& o, const ChatCase& c) { return o << c.model << (c.system ? "+system" : ""); }

// The prompt as the model's template renders it (tools/make_model.py: llama models carry the Llama 3 template,
// qwen2 ChatML), written out by hand rather than through the library's chat code.
std::string rendered_by_hand(const std::string& model, const std::string& system, const std::string& user) {
  if (model.starts_with("llama")) {
    std::string s = "<|begin_of_text|>";
    if (!system.empty()) s += "<|start_header_id|>system<|end_header_id|>\n\n" + trim(system) + "<|eot_id|>";
    return s + "<|start_header_id|>user<|end_header_id|>\n\n" + trim(user) +
           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  std::string s;
  if (!system.empty()) s += "<|im_start|>system\n" + system + "<|im_end|>\n";
  return s + "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

class CliChat : public ::testing::TestWithParam<ChatCase> {};

// The user message keeps surrounding whitespace in the file: Llama 3 trims it, ChatML keeps it.
TEST_P(CliChat, PromptIdsAreTheRenderedTemplate) {
  const ChatCase& tc = GetParam();
  auto gen = test::rng(tc.system ? 11 : 12);
  const std::string user = "  " + random_words(gen, 3 + gen() % 12) + "\n";
  const std::string system = tc.system ? random_words(gen, 2 + gen() % 6) : "";
  const std::string prompt_file = write_prompt_file(user);
  const CliResult r = run_cli("run -m " + test::model_path(tc.model) + " --chat -f " + prompt_file +
                              (tc.system ? " --system '" + system + "'" : "") + " --temp 0 -n 1 --json");
  std::remove(prompt_file.c_str());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<int32_t> want =
      tokenizer_of(tc.model).encode(rendered_by_hand(tc.model, system, user), false, true);
  EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_ids").get<std::vector<int32_t>>(), want)
      << "user " << nlohmann::json(user) << ", system " << nlohmann::json(system);
}

INSTANTIATE_TEST_SUITE_P(Templates, CliChat,
                         ::testing::Values(ChatCase{"llama-f32", false}, ChatCase{"llama-f32", true},
                                           ChatCase{"qwen2-f32", false}, ChatCase{"qwen2-f32", true}),
                         [](const auto& info) {
                           std::string s = info.param.model + (info.param.system ? "_system" : "");
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// ---- the context

size_t count_lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

// A prompt of N tokens with -c below N: exit status 1 and one line naming both numbers, before the weights upload
// (no progress bar). With -c N the same prompt loads (the bar shows) and runs.
TEST(CliContext, PromptLongerThanExplicitContextFailsBeforeLoading) {
  auto gen = test::rng(13);
  const std::string text = random_words(gen, 10 + gen() % 30);
  const std::string model = test::model_path("qwen3-f32");
  const size_t n = tokenizer_of("qwen3-f32").encode(text, true, true).size();
  ASSERT_GE(n, 3u);
  const std::string prompt_file = write_prompt_file(text);
  const size_t random_c = std::uniform_int_distribution<size_t>(1, n - 2)(gen);
  for (size_t c : {n - 1, random_c}) {
    SCOPED_TRACE("-c " + std::to_string(c) + ", prompt of " + std::to_string(n) + " tokens");
    const CliResult r = run_cli("run -m " + model + " -f " + prompt_file + " -n 4 -c " + std::to_string(c));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("the prompt has " + std::to_string(n) + " tokens"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("context of " + std::to_string(c) + " "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(" weights "), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const CliResult ok = run_cli("run -m " + model + " -f " + prompt_file + " --temp 0 -n 1 -c " + std::to_string(n));
  std::remove(prompt_file.c_str());
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_NE(ok.err.find(" weights "), std::string::npos) << ok.err;
  EXPECT_NE(ok.err.find("(context " + std::to_string(n) + ")"), std::string::npos) << ok.err;
}

// --chat counts the template's tokens too: a user message that fits -c alone fails once the template is around it.
TEST(CliContext, ChatTemplateTokensCountAgainstExplicitContext) {
  auto gen = test::rng(14);
  const std::string user = random_words(gen, 3 + gen() % 10);
  const Tokenizer tok = tokenizer_of("qwen2-f32");
  const size_t n_plain = tok.encode(user, true, true).size();
  const size_t n_chat = tok.encode(rendered_by_hand("qwen2-f32", "", user), false, true).size();
  ASSERT_GT(n_chat, n_plain);
  const CliResult r =
      run_cli("run -m " + test::model_path("qwen2-f32") + " --chat -p '" + user + "' -c " + std::to_string(n_plain));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("the prompt has " + std::to_string(n_chat) + " tokens"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" weights "), std::string::npos) << r.err;
}

// Without -c the context is the model's (256 for the test models): a longer prompt still fails, with the same line,
// once the default is known.
TEST(CliContext, PromptLongerThanDefaultContextFails) {
  auto gen = test::rng(15);
  const std::string text = random_words(gen, 300 + gen() % 100);
  const size_t n = tokenizer_of("llama-f32").encode(text, true, true).size();
  const GgufFile f = GgufFile::open(test::model_path("llama-f32"));
  const uint32_t n_ctx_train = f.get_u32("llama.context_length");
  ASSERT_GT(n, n_ctx_train);
  const std::string prompt_file = write_prompt_file(text);
  const CliResult r = run_cli("run -m " + test::model_path("llama-f32") + " -f " + prompt_file + " -n 4");
  std::remove(prompt_file.c_str());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("wgllm: error: the prompt has " + std::to_string(n) + " tokens, more than the context of " +
                       std::to_string(n_ctx_train) + " "),
            std::string::npos)
      << r.err;
}

// -c past the model's training context runs, and the context line says so.
TEST(CliContext, ContextPastTrainingIsAllowedAndSaid) {
  const GgufFile f = GgufFile::open(test::model_path("qwen2-f32"));
  const uint32_t n_ctx_train = f.get_u32("qwen2.context_length");
  const uint32_t c = n_ctx_train + 1 + uint32_t(test::rng(16)() % 200);
  const CliResult r =
      run_cli("run -m " + test::model_path("qwen2-f32") + " -p 'ROMEO:' --temp 0 -n 1 -c " + std::to_string(c));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(
      r.err.find("(context " + std::to_string(c) + ", past the model's trained " + std::to_string(n_ctx_train) + ")"),
      std::string::npos)
      << r.err;
}

// -c takes a non-negative count: a negative one is a usage error before anything loads.
TEST(CliContext, NegativeContextIsRejected) {
  const CliResult r = run_cli("run -m " + test::model_path("qwen2-f32") + " -p 'ROMEO:' -n 1 -c -5");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--ctx-size = -5"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" weights "), std::string::npos) << r.err;
}

// ---- the library side of the early check

// before_upload sees the tokenizer and the file's half of ModelInfo; a throw from it stops the load before any
// weight moves (no progress call).
TEST(ModelLoad, BeforeUploadRunsFirstAndCanStopTheLoad) {
  const std::string path = test::model_path("qwen2-f32");
  int progress_calls = 0, hook_calls = 0;
  struct Stop {};
  LoadOptions o;
  o.n_ctx = 77;
  o.progress = [&](uint64_t, uint64_t) { ++progress_calls; };
  o.before_upload = [&](const Model& m) {
    ++hook_calls;
    EXPECT_EQ(progress_calls, 0);
    EXPECT_EQ(m.info().arch, "qwen2");
    EXPECT_EQ(m.info().n_ctx, 77u);
    EXPECT_TRUE(m.info().adapter.empty());
    EXPECT_EQ(m.encode("<|im_start|>", false),
              std::vector<int32_t>{tokenizer_of("qwen2-f32").token_id("<|im_start|>")});
    EXPECT_THROW(Session{m}, InvalidArgument);
    throw Stop{};
  };
  EXPECT_THROW(Model::load(path, o), Stop);
  EXPECT_EQ(hook_calls, 1);
  EXPECT_EQ(progress_calls, 0);

  o.before_upload = [&](const Model&) { ++hook_calls; };
  const Model m = Model::load(path, o);
  EXPECT_EQ(hook_calls, 2);
  EXPECT_GT(progress_calls, 0);
  EXPECT_FALSE(m.info().adapter.empty());
  EXPECT_EQ(m.info().n_ctx, 77u);
  EXPECT_EQ(Session(m).n_ctx(), 77u);
}

// A malformed or impossible forced matmul tile ($WGLLM_MATMUL_TILE) fails the load, naming the tile, before any
// weight uploads.
TEST(ModelLoad, BadMatmulTileFailsTheLoad) {
  LoadOptions o;
  int progress_calls = 0;
  o.progress = [&](uint64_t, uint64_t) { ++progress_calls; };
  for (const char* tile : {"32x64", "64x64xf32", "256x256"}) {
    o.matmul_tile = tile;
    try {
      (void)Model::load(test::model_path("llama-f32"), o);
      ADD_FAILURE() << tile << " loaded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(tile), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(progress_calls, 0);
  o.matmul_tile = "128x64";
  EXPECT_NO_THROW((void)Model::load(test::model_path("llama-f32"), o));
}

// Likewise a malformed or impossible forced attention kernel ($WGLLM_ATTENTION).
TEST(ModelLoad, BadAttentionVariantFailsTheLoad) {
  LoadOptions o;
  int progress_calls = 0;
  o.progress = [&](uint64_t, uint64_t) { ++progress_calls; };
  for (const char* variant : {"f64", "64x32xf16", "1024x64x8xf16"}) {
    o.attention_prefill = variant;
    try {
      (void)Model::load(test::model_path("llama-f32"), o);
      ADD_FAILURE() << variant << " loaded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(variant), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(progress_calls, 0);
  o.attention_prefill = "f32";
  EXPECT_NO_THROW((void)Model::load(test::model_path("llama-f32"), o));
}

}  // namespace
}  // namespace wgllm

// The built `wgllm` against llama.cpp on the same GGUF files: greedy generation (`wgllm run --temp 0 --json` against
// tools/llama_oracle.cpp, which reports llama.cpp's greedy ids and its own top-two logit gap at every step) and
// perplexity (`wgllm perplexity --json` against llama-perplexity's computation, run by llama_oracle) on
// tests/data/tinyshakespeare.txt. Every expected value comes from llama.cpp, run here (tools/llamacpp.sh builds it;
// scripts/test.sh runs that first).
//
// The files: the built-in tiny Shakespeare model (trained, F16, byte-level BPE, no BOS), a random Q8_0 llama with a
// SentencePiece vocabulary (BOS added) and Gemma 3 270M Q4_K_M, the real target (skipped until wgllm runs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cli_util.h"
#include "external.h"
#include "model_util.h"

namespace wgllm {
namespace {

struct OracleModel {
  std::string name;
  std::function<std::optional<std::string>()> path;  // the file wgllm runs; nothing: it is absent
  // The least share of the greedy tokens compared before flips end the prompts: a trained model's top two are far
  // apart; a random one's are often within 0.1 (its early near-ties end prompts early, which is allowed).
  double min_compared = 0.5;
  // The file llama.cpp runs, when not the same: the same model with its weights dequantised to F32, so that llama.cpp
  // computes it in f32. On a K-quant/Q5_0 file its CPU path rounds activations to 8 bits for the dot products, which
  // on Gemma 3 270M moves perplexity by 0.7-1.4 % and flips greedy choices with top-two gaps above 0.1 — where the
  // float64 reference forward sides with wgllm (measured: PERF.md).
  std::function<std::optional<std::string>()> oracle_path = nullptr;
  // Perplexity chunks of 512 tokens: Gemma 3 270M's prompt processing runs at about 12 tok/s on lavapipe and its
  // F32 twin is llama.cpp's slowest file here, so it gets two.
  int ppl_chunks = 4;
};
std::ostream& operator<<(std::ostream& o, const OracleModel& m) { return o << m.name; }

std::vector<OracleModel> oracle_models() {
  return {
      {"shakespeare_tiny_f16",
       [] { return std::optional(std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf"); }},
      {"llama_spm_f16", [] { return std::optional(test::model_path("llama-spm-f16")); }, 0.0},
      {"llama_spm_q8_0", [] { return std::optional(test::model_path("llama-spm-q8_0")); }, 0.0},
      {"gemma3_270m_q4_k_m", [] { return test::gemma_file(); }, 0.5, [] { return test::gemma_f32_file(); }, 2},
      // transformers' random LFM2s as llama.cpp's converter wrote them (convolution and attention layers)
      {"lfm2_tiny_f32", [] { return std::optional(test::model_path("lfm2-tiny-f32")); }, 0.5},
      {"lfm2_tiny_l4_f32", [] { return std::optional(test::model_path("lfm2-tiny-l4-f32")); }, 0.5},
      // and a random Qwen3-MoE (16 experts, 4 per token)
      {"qwen3moe_tiny_k4_f32", [] { return std::optional(test::model_path("qwen3moe-tiny-k4-f32")); }, 0.5},
      // and a random LFM2-MoE (sigmoid router with a selection bias, a dense first layer)
      {"lfm2moe_tiny_f32", [] { return std::optional(test::model_path("lfm2moe-tiny-f32")); }, 0.5},
      // and a random gpt-oss (sinks, biases, YaRN, the clamped SwiGLU, windows of 6 positions on every other layer)
      {"gpt_oss_tiny_f32", [] { return std::optional(test::model_path("gpt-oss-tiny-f32")); }, 0.5},
      // and a random Qwen 3.5 (gated DeltaNet layers among gated attention layers; a key head per two value heads)
      {"qwen35_tiny_f32", [] { return std::optional(test::model_path("qwen35-tiny-f32")); }, 0.5},
      // and random Gemma 4s (per-layer embeddings, KV shared by the last layers, v = k on the global layers)
      {"gemma4_tiny_f32", [] { return std::optional(test::model_path("gemma4-tiny-f32")); }, 0.5},
      {"gemma4_tiny_kv_f32", [] { return std::optional(test::model_path("gemma4-tiny-kv-f32")); }, 0.5},
      // and make_model.py's Gemma 4 with the released models' global heads of 512
      {"gemma4_h512_f32", [] { return std::optional(test::model_path("gemma4-h512-f32")); }, 0.5},
  };
}

std::string shakespeare() {
  std::ifstream in(std::string(WGLLM_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt", std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string temp_file(const std::string& tag, const std::string& text) {
  const std::string path = ::testing::TempDir() + "wgllm_llamacpp_" + tag + "_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// stdout of a command line (stderr to `err_path` when given, else discarded), and its exit status.
std::pair<int, std::string> shell(const std::string& cmd, const std::string& err_path = "/dev/null") {
  FILE* p = popen((cmd + " 2>" + err_path).c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class LlamaCpp : public ::testing::TestWithParam<OracleModel> {};

// 7 short prompts and one past Gemma's 512-token sliding window, 32 greedy tokens each (or up to end of generation).
// A different id is allowed only where llama.cpp's own top-two gap is below 0.1 (its CPU path rounds activations to
// 8 bits for quantised dot products; a near-tie may go either way): that prompt is not compared further.
TEST_P(LlamaCpp, GreedyMatchesOracle) {
  const auto oracle = test::llama_oracle();
  WGLLM_REQUIRE_EXTERNAL(oracle, "llama_oracle (tools/llamacpp.sh)");
  const auto path = GetParam().path();
  WGLLM_REQUIRE_EXTERNAL(path, "the model file");
  const auto oracle_path = GetParam().oracle_path ? GetParam().oracle_path() : path;
  WGLLM_REQUIRE_EXTERNAL(oracle_path, "the F32 twin of the model file (tools/fetch_gemma.sh --f32)");
  const std::string text = shakespeare();
  std::vector<std::string> prompts = {
      "ROMEO:",
      "First Citizen:\nBefore we proceed any further, hear me speak.",
      "The quick brown fox jumps over the lazy dog. Then",
      "KING RICHARD II:\nO that I were as great\nAs is my grief",
      "    def main():\n        return 42\n",
      "Once upon a time, in a land far away, there lived",
      "What light through yonder window breaks? It is the east, and",
      text.substr(0, 2600),  // > 512 tokens with every vocabulary here
  };
  constexpr int kTokens = 32, kCtx = 2048;
  constexpr float kNearTie = 0.1f;
  int flips = 0, compared = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    const std::string file = temp_file("prompt", prompts[p]);
    const std::string n = " -n " + std::to_string(kTokens) + " -c " + std::to_string(kCtx);
    const auto [o_status, o_out] = shell(*oracle + " greedy -m " + *oracle_path + " -f " + file + n);
    ASSERT_EQ(o_status, 0) << "llama_oracle failed on " << *path;
    const CliResult w = run_cli("run -m " + *path + " -f " + file + n + " --temp 0 --json");
    std::remove(file.c_str());
    ASSERT_EQ(w.status, 0) << w.err;
    const auto o = nlohmann::json::parse(o_out);
    const auto j = nlohmann::json::parse(w.out);
    const auto want_prompt = o["prompt_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), want_prompt) << "the prompt's tokens differ";
    if (p + 1 == prompts.size()) {
      EXPECT_GT(want_prompt.size(), 512u) << "the long prompt must pass the window";
    }
    const auto want = o["greedy_ids"].get<std::vector<int32_t>>();
    const auto gap = o["top2_gap"].get<std::vector<float>>();
    const auto got = j["generated_ids"].get<std::vector<int32_t>>();
    size_t k = 0;
    for (; k < want.size() && k < got.size(); ++k) {
      if (got[k] == want[k]) continue;
      ASSERT_LT(gap[k], kNearTie) << "step " << k << ": wgllm chose " << got[k] << ", llama.cpp " << want[k]
                                  << " with a top-two gap of " << gap[k];
      ++flips;
      std::cout << "[ flip     ] prompt " << p << " step " << k << ": " << got[k] << " vs " << want[k] << " (gap "
                << gap[k] << ")\n";
      break;
    }
    compared += int(k);
    if (k == want.size() || k == got.size()) {
      EXPECT_EQ(got.size(), want.size()) << "one stopped early";
    }
  }
  std::cout << "[ greedy   ] " << GetParam().name << ": " << compared << " tokens equal, " << flips
            << " near-tie flip(s) over " << prompts.size() << " prompts\n";
  RecordProperty("flips", flips);
  EXPECT_GE(compared, GetParam().min_compared * double(prompts.size() * kTokens)) << "too few tokens compared";
}

// 4 (Gemma: 2) chunks of 512 tokens: the final estimate and every chunk's running value within 0.5 % of
// llama-perplexity's (as llama_oracle computes them; equal to llama-perplexity's printed values).
TEST_P(LlamaCpp, PerplexityMatchesLlamaPerplexity) {
  const auto oracle = test::llama_oracle();
  WGLLM_REQUIRE_EXTERNAL(oracle, "llama_oracle (tools/llamacpp.sh)");
  const auto path = GetParam().path();
  WGLLM_REQUIRE_EXTERNAL(path, "the model file");
  const auto oracle_path = GetParam().oracle_path ? GetParam().oracle_path() : path;
  WGLLM_REQUIRE_EXTERNAL(oracle_path, "the F32 twin of the model file (tools/fetch_gemma.sh --f32)");
  const std::string text = std::string(WGLLM_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt";
  const int n_chunks = GetParam().ppl_chunks;
  const std::string args = " -f " + text + " -c 512 --chunks " + std::to_string(n_chunks);
  // llama-perplexity's own numbers, computed as it computes them by llama_oracle: llama-perplexity itself logs through
  // a thread that its exit does not wait for, and on a busy machine its final estimate is now and then never printed.
  const std::string err = ::testing::TempDir() + "wgllm_llama_perplexity_" + std::to_string(getpid());
  const auto [status, out] = shell(*oracle + " perplexity -m " + *oracle_path + args, err);
  std::ifstream in(err);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(err.c_str());
  ASSERT_EQ(status, 0) << log;
  const auto ref = nlohmann::json::parse(out);
  ASSERT_EQ(ref["n_chunks"], n_chunks) << out;
  const auto want_chunks = ref["chunks"].get<std::vector<double>>();
  ASSERT_EQ(want_chunks.size(), size_t(n_chunks)) << out;
  const double want = ref["ppl"].get<double>(), want_err = ref["uncertainty"].get<double>();

  const CliResult w = run_cli("perplexity -m " + *path + args + " --json");
  ASSERT_EQ(w.status, 0) << w.err;
  const auto j = nlohmann::json::parse(w.out);
  ASSERT_EQ(j["n_chunks"], n_chunks);
  for (size_t c = 0; c < want_chunks.size(); ++c)
    EXPECT_NEAR(j["chunks"][c]["ppl"].get<double>() / want_chunks[c], 1.0, 0.005) << "chunk " << c + 1;
  const double got = j["ppl"].get<double>();
  EXPECT_NEAR(got / want, 1.0, 0.005) << "wgllm " << got << ", llama.cpp " << want;
  EXPECT_NEAR(j["uncertainty"].get<double>() / want_err, 1.0, 0.05);
  std::cout << "[ ppl      ] " << GetParam().name << ": wgllm " << got << " +/- " << j["uncertainty"].get<double>()
            << ", llama.cpp " << want << " +/- " << want_err << " (" << j["timings"]["tokens_per_s"].get<double>()
            << " tok/s)\n";
}

INSTANTIATE_TEST_SUITE_P(Files, LlamaCpp, ::testing::ValuesIn(oracle_models()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace wgllm

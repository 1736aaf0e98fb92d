// Every file the tooling writes loads, unmodified, in llama.cpp and generates: the test-model matrix of
// tools/make_test_models.py (each architecture and weight type, the byte-level BPE and SentencePiece tokenizers,
// llama3 RoPE scaling as a rope_freqs tensor, tied and mixed weights), make_model.py's remaining tokenizer and
// architecture combinations, and the built-in default model. llama.cpp refuses what it does not know (a "gpt2"
// pre-tokenizer, a "llama3" rope.scaling.type), so a file only wgllm can read fails here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "external.h"
#include "model_util.h"

namespace wgllm {
namespace {

struct Outcome {
  int status = -1;
  std::string out;
};

Outcome run(const std::string& cmd) {
  Outcome r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

// llama-completion: load the file, generate 4 tokens greedily from a prompt (random weights may end the text at once
// with EOS), print the prompt and the text, exit 0. It exits 1 on a file it refuses.
void expect_runs_in_llamacpp(const std::string& bin, const std::string& model) {
  const std::string log = ::testing::TempDir() + "wgllm_llamacpp_log_" + std::to_string(getpid());
  // Seen rarely under load: llama-completion exits 0 having printed nothing, the same file echoing the prompt on the
  // next run; a run that fails or never echoes it in three tries is a refusal.
  Outcome r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = run(bin + "/llama-completion -m " + model +
            " -p 'ROMEO: hello' -n 4 -no-cnv --temp 0 -t 2 -c 128 --no-warmup 2>" + log + " </dev/null");
    if (r.status != 0 || r.out.find("ROMEO: hello") != std::string::npos) break;
  }
  std::string err;
  if (r.status != 0) {
    const Outcome tail = run("tail -c 2000 " + log);
    err = tail.out;
  }
  std::remove(log.c_str());
  EXPECT_EQ(r.status, 0) << model << ": llama.cpp failed:\n" << err;
  EXPECT_NE(r.out.find("ROMEO: hello"), std::string::npos) << model << ": the prompt is not echoed in:\n" << r.out;
}

TEST(LlamaCppLoads, TestModelMatrix) {
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(test::models_dir()))
    if (e.path().extension() == ".gguf") files.push_back(e.path().string());
  ASSERT_GE(files.size(), 20u) << "the test models in " << test::models_dir();
  for (const std::string& f : files) expect_runs_in_llamacpp(*bin, f);
}

TEST(LlamaCppLoads, MakeModelTokenizersAndArchitectures) {
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  const std::string dir = ::testing::TempDir() + "wgllm_llamacpp_loads_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string python = std::string(WGLLM_SOURCE_DIR) + "/.venv/bin/python";
  if (!std::filesystem::exists(python)) GTEST_SKIP() << "the tools' venv is absent: " << python;
  for (const char* arch : {"llama", "qwen2", "qwen3", "lfm2", "gemma4"}) {
    for (const char* tok : {"bpe", "spm", "synthetic"}) {
      const std::string out = dir + "/" + arch + "-" + tok + ".gguf";
      const Outcome made = run(python + " " + WGLLM_SOURCE_DIR + "/tools/make_model.py --arch " + arch +
                               " --type q8_0 --seed 5 --tokenizer " + tok + " --out " + out + " 2>&1");
      ASSERT_EQ(made.status, 0) << made.out;
      expect_runs_in_llamacpp(*bin, out);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LlamaCppLoads, DefaultModel) {
  const auto bin = test::llamacpp_bin();
  WGLLM_REQUIRE_EXTERNAL(bin, "the llama.cpp build");
  expect_runs_in_llamacpp(*bin, std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf");
}

}  // namespace
}  // namespace wgllm

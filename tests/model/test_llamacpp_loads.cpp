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

// llama_oracle (our tool over libllama; llama-completion logs through a thread its exit does not wait for, and on a
// busy machine now and then prints nothing): load the file, tokenize a prompt and generate up to 4 tokens greedily
// (random weights may end at once with EOS), print the ids, exit 0. It exits 1 on a file llama.cpp refuses; its -v log
// says why.
void expect_runs_in_llamacpp(const std::string& oracle, const std::string& model) {
  const std::string log = ::testing::TempDir() + "wgllm_llamacpp_log_" + std::to_string(getpid());
  const Outcome r = run(oracle + " greedy -v -m " + model + " -p 'ROMEO: hello' -n 4 -c 128 2>" + log + " </dev/null");
  std::string err;
  if (r.status != 0) {
    const Outcome tail = run("tail -c 2000 " + log);
    err = tail.out;
  }
  std::remove(log.c_str());
  EXPECT_EQ(r.status, 0) << model << ": llama.cpp failed:\n" << err;
  EXPECT_NE(r.out.find("\"greedy_ids\":["), std::string::npos) << model << ": no greedy ids in:\n" << r.out;
}

TEST(LlamaCppLoads, TestModelMatrix) {
  const auto oracle = test::llama_oracle();
  WGLLM_REQUIRE_EXTERNAL(oracle, "llama_oracle (tools/llamacpp.sh)");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(test::models_dir()))
    if (e.path().extension() == ".gguf") files.push_back(e.path().string());
  ASSERT_GE(files.size(), 20u) << "the test models in " << test::models_dir();
  for (const std::string& f : files) expect_runs_in_llamacpp(*oracle, f);
}

TEST(LlamaCppLoads, MakeModelTokenizersAndArchitectures) {
  const auto oracle = test::llama_oracle();
  WGLLM_REQUIRE_EXTERNAL(oracle, "llama_oracle (tools/llamacpp.sh)");
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
      expect_runs_in_llamacpp(*oracle, out);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LlamaCppLoads, DefaultModel) {
  const auto oracle = test::llama_oracle();
  WGLLM_REQUIRE_EXTERNAL(oracle, "llama_oracle (tools/llamacpp.sh)");
  expect_runs_in_llamacpp(*oracle, std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf");
}

}  // namespace
}  // namespace wgllm

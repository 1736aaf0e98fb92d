// `wgllm inspect` shows every file the parser accepts, tensors of types wgllm cannot run included; only `run`
// refuses such a file, with one line naming the tensor and its type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_util.h"
#include "external.h"
#include "gguf_builder.h"

namespace wgllm {
namespace {

std::string write_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const auto path =
      std::filesystem::temp_directory_path() / ("wgllm_cli_inspect_" + std::to_string(getpid()) + "_" + name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path.string();
}

size_t count_lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(CliInspect, ShowsTypesItCannotRunAndRunRefusesThem) {
  test::GgufBuilder g = test::tiny_model("llama");
  g.tensor("extra.iq2.weight", {256, 2}, 16 /* IQ2_XXS */).tensor("extra.q4k.weight", {512, 3}, 12);
  const std::string path = write_file("iq2.gguf", g.build());
  const CliResult shown = run_cli("inspect --tensors " + path);
  EXPECT_EQ(shown.status, 0) << shown.err;
  EXPECT_NE(shown.out.find("extra.iq2.weight"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("  IQ2_XXS      1         0.00  (a type wgllm cannot run)\n"), std::string::npos)
      << shown.out;
  EXPECT_NE(shown.out.find("  Q4_K         1         0.00\n"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("note: wgllm cannot run this file"), std::string::npos) << shown.out;

  const CliResult run = run_cli("run -m " + path + " -p hi -n 1");
  EXPECT_EQ(run.status, 1);
  EXPECT_EQ(count_lines(run.err), 1u) << run.err;
  EXPECT_NE(run.err.find("tensor 'extra.iq2.weight' has type IQ2_XXS, which wgllm cannot run"), std::string::npos)
      << run.err;
  std::filesystem::remove(path);
}

// An architecture wgllm does not run is shown with a note, not an error.
TEST(CliInspect, UnknownArchitectureIsANote) {
  test::GgufBuilder g = test::tiny_model("llama");
  g.set("general.architecture", test::GVal::str("mamba"));
  const std::string path = write_file("mamba.gguf", g.build());
  const CliResult r = run_cli("inspect " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("architecture   mamba"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: wgllm cannot run this file: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'mamba'"), std::string::npos) << r.out;
  std::filesystem::remove(path);
}

// The real Gemma 3 270M Q4_K_M file: every tensor type listed, whether or not its architecture runs yet.
TEST(CliInspect, RealGemmaFile) {
  const auto gemma = test::gemma_file();
  WGLLM_REQUIRE_EXTERNAL(gemma, "the Gemma 3 270M file");
  const CliResult r = run_cli("inspect " + *gemma);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("architecture   gemma3"), std::string::npos) << r.out;
  for (const char* line :
       {"F32        109", "Q4_K        27", "Q5_0        81", "Q6_K         9", "Q8_0        10", "total      236"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  EXPECT_EQ(r.out.find("cannot run)"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace wgllm

namespace wgllm {
namespace {

// A Gemma 4 file: its local heads, KV heads per layer, the layers reading another's KV cache, per-layer embeddings.
TEST(CliInspect, Gemma4Layout) {
  const CliResult r = run_cli("inspect " + std::string(WGLLM_SOURCE_DIR) + "/tests/data/models/gemma4-tiny-f32.gguf");
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* line : {"  n_head         4 (kv 2, head_dim 32)\n", "  layers         LLALLA (",
                           "  local heads    head_dim 16, rope dims 16 (the global layers': above)\n",
                           "  kv heads       2,2,2,2,2,2 (per layer)\n", "  ffn            48,48,48,96,96,96 (per layer)\n",
                           "  shared kv      3 <- 1, 4 <- 1, 5 <- 2 (layer <- the layer whose KV cache it reads)\n",
                           "  per-layer emb  16 per token and layer\n"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
}

// -m FILE, as every other command takes the model, shows the same as the positional FILE; neither is an error.
TEST(CliInspect, TakesDashMLikeTheOtherCommands) {
  const std::string file = std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf";
  const CliResult positional = run_cli("inspect " + file + " --metadata");
  const CliResult dash_m = run_cli("inspect -m " + file + " --metadata");
  EXPECT_EQ(positional.status, 0) << positional.err;
  EXPECT_EQ(dash_m.status, 0) << dash_m.err;
  EXPECT_EQ(dash_m.out, positional.out);
  EXPECT_NE(dash_m.out.find("architecture   llama"), std::string::npos);
  const CliResult none = run_cli("inspect");
  EXPECT_EQ(none.status, 1);
  EXPECT_EQ(none.err, "wgllm: error: no file: pass -m FILE (or FILE)\n");
}

}  // namespace
}  // namespace wgllm

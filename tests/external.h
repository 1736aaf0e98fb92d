// What the tests compare real files with, found outside the source tree: the llama.cpp oracle built by
// tools/llamacpp.sh and the real Gemma 3 270M Q4_K_M file fetched by tools/fetch_gemma.sh (scripts/test.sh runs
// both first). Each returns nothing when absent; a test that needs it then skips, naming the command that provides it.
#pragma once
#include <cstdio>
#include <optional>
#include <string>

namespace wgllm::test {

namespace detail {
// The first line `tools/<script> <arg>` prints, or nothing when it fails (it builds or fetches nothing with these
// args).
inline std::optional<std::string> ask_tool(const std::string& script_and_arg) {
  const std::string cmd = std::string(WGLLM_SOURCE_DIR) + "/tools/" + script_and_arg + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return std::nullopt;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty()) return std::nullopt;
  return out;
}
}  // namespace detail

// The llama.cpp bin directory (llama-tokenize, llama-completion, llama-perplexity, ...).
inline std::optional<std::string> llamacpp_bin() { return detail::ask_tool("llamacpp.sh --bin"); }
// The unpacked llama.cpp source (vendor/llama.cpp of the sdist: models/ggml-vocab-*.gguf, convert_hf_to_gguf.py).
inline std::optional<std::string> llamacpp_src() { return detail::ask_tool("llamacpp.sh --src-path"); }
// llama_oracle (tools/llama_oracle.cpp) built from this tree's source against that build.
inline std::optional<std::string> llama_oracle() { return detail::ask_tool("llamacpp.sh --oracle"); }
// The Gemma 3 270M Q4_K_M file.
inline std::optional<std::string> gemma_file() { return detail::ask_tool("fetch_gemma.sh --path"); }
// Its F32 twin (every weight dequantised by llama-quantize): the same model, which llama.cpp's CPU path computes in
// f32 (on the Q4_K_M file it rounds activations to 8 bits for the dot products).
inline std::optional<std::string> gemma_f32_file() { return detail::ask_tool("fetch_gemma.sh --f32-path"); }

}  // namespace wgllm::test

// Skips the test with the reason when `opt` (one of the above) is empty.
#define WGLLM_REQUIRE_EXTERNAL(opt, what)                                      \
  if (!(opt))                                                                  \
  GTEST_SKIP() << what                                                         \
               << " is absent: run scripts/test.sh (or tools/llamacpp.sh and " \
                  "tools/fetch_gemma.sh) first"

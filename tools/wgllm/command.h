// Sub-commands of the `wgllm` CLI register themselves here; main.cpp dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "wgllm/wgllm.h"

namespace wgllm::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds the sub-command's options to `app`; returns the action run when it is chosen (exit code).
  std::function<std::function<int()>(CLI::App& app)> setup;
};

std::vector<Command>& commands();

// Shared by run and bench (cmd_run.cpp): the model of -m, or the default model when path is empty (with the
// developer aids $WGLLM_KERNEL_DIR and $WGLLM_DUMP_SHADERS unless the options set them); a progress bar
// for LoadOptions::progress; the memory the model and its KV cache take, on stderr.
Model load_model(const std::string& path, const LoadOptions& options);
std::function<void(uint64_t, uint64_t)> progress_bar();
void print_memory(const Model& model);

// Shared by run and perplexity (cmd_run.cpp): the text of a regular file ("-": standard input), at most `limit`
// bytes (an InvalidArgument past it, saying a context of n_ctx tokens, or any context when 0, cannot hold it).
std::string read_prompt_file(const std::string& path, uint64_t limit, uint32_t n_ctx);

// Shared by template, run and serve (cmd_template.cpp): the whole of a regular file, `what` naming it in errors.
std::string read_file(const std::string& path, const char* what);

// --prompt-digits (LoadOptions::prompt_digits), for the commands that load a model.
inline void add_prompt_digits(CLI::App& app, std::optional<uint32_t>& digits) {
  app.add_option("--prompt-digits", digits,
                 "prompt products of Q4_K, Q6_K and Q8_0 weights on packed int8 dot products, x as N 8-bit digits per "
                 "element (3: within 2^-23 of each 32-element block's largest, 2: 2^-15, 1: llama.cpp's 8-bit "
                 "activations, fastest; 0: f32 products; default: 3 on GPUs from 16 tokens, 0 on CPU adapters; "
                 "$WGLLM_PROMPT_DIGITS)")
      ->check(CLI::Range(0, 3))
      ->group("Advanced");
}

// A flag pair's value (add_flag("--x,!--no-x", int)): 1 on, -1 off, 0 unset (the library's default).
inline std::optional<bool> tri_state(int flag) { return flag ? std::optional<bool>(flag > 0) : std::nullopt; }

struct Register {
  explicit Register(Command c) { commands().push_back(std::move(c)); }
};

}  // namespace wgllm::cli

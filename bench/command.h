// Sub-commands of wgllm-bench (kernels.cpp, ops.cpp) register themselves here; main.cpp dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gpu/context.h"
#include "gpu/shaders.h"

namespace wgllm::bench {

struct Command {
  std::string name;
  std::string description;
  // Adds the sub-command's options to `app`; returns the action run when it is chosen (exit code).
  std::function<std::function<int()>(CLI::App& app)> setup;
};

std::vector<Command>& commands();

struct Register {
  explicit Register(Command c) { commands().push_back(std::move(c)); }
};

// The benchmarks' own shaders (stream.wgsl, and tests/gpu/elementwise.wgsl for the dispatch-overhead run),
// embedded into this binary by cmake/embed_shaders.cmake.
std::span<const gpu::EmbeddedShader> bench_shaders();

// Options for a benchmark's context: `adapter`, the benchmarks' shaders and the developer aids
// $WGLLM_KERNEL_DIR and $WGLLM_DUMP_SHADERS.
gpu::ContextOptions context_options(const std::string& adapter);

}  // namespace wgllm::bench

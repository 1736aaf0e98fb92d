// Sub-commands of the `wgllm` CLI register themselves here; main.cpp dispatches.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace wgllm::cli {

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

}  // namespace wgllm::cli

// wgllm-bench: kernel benchmarks on the engine's internals (the user CLI's `wgllm bench` times whole models).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>

#include "command.h"
#include "wgllm/error.h"

namespace wgllm::bench {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

gpu::ContextOptions context_options(const std::string& adapter) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  return {.adapter = adapter,
          .attention_prefill = env("WGLLM_ATTENTION"),
          .extra_shaders = bench_shaders(),
          .kernel_dir = env("WGLLM_KERNEL_DIR"),
          .dump_shaders_dir = env("WGLLM_DUMP_SHADERS"),
          .shader_checks = env("WGLLM_SHADER_CHECKS") == "1"};
}

}  // namespace wgllm::bench

int main(int argc, char** argv) {
  CLI::App app{"wgllm-bench: benchmarks of wgllm's GPU kernels"};
  app.require_subcommand(1);
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& cmd : wgllm::bench::commands()) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.description);
    actions[sub] = cmd.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const wgllm::Error& e) {
    std::fprintf(stderr, "wgllm-bench: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wgllm-bench: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}

// wgllm: the command-line front end. Each sub-command lives in its own cmd_*.cpp.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "command.h"
#include "wgllm/error.h"

namespace wgllm::cli {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace wgllm::cli

int main(int argc, char** argv) {
  CLI::App app{"wgllm: LLM inference on WebGPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "wgllm 0.1.0");
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& cmd : wgllm::cli::commands()) {
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
      if (sub->parsed()) {
        const int status = action();
        // Output that could not be written (a full disk, a closed pipe) is an error, whatever the command.
        if (std::fflush(stdout) != 0 || std::ferror(stdout))
          throw wgllm::Error(std::string("cannot write to standard output: ") + std::strerror(errno ? errno : EIO));
        return status;
      }
  } catch (const wgllm::Error& e) {
    std::fprintf(stderr, "wgllm: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wgllm: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}

// Running the built `wgllm` in the CLI tests: exit status, stdout and stderr of one command line.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace wgllm {

struct CliResult {
  int status = -1;  // exit status; -1 when it did not exit normally
  std::string out, err;
};

// Runs `<before> wgllm <args>` through the shell (args may redirect; before may be `timeout 60` or `printf x |`):
// stdout through a pipe, stderr through a file.
inline CliResult run_cli(const std::string& args, const std::string& before = "") {
  const std::string err_path = ::testing::TempDir() + "wgllm_cli_err_" + std::to_string(getpid());
  const std::string cmd = before + " " + WGLLM_CLI + " " + args + " 2>" + err_path;
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) r.out.append(buf, n);
  const int st = pclose(pipe);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(err_path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  r.err = s.str();
  std::remove(err_path.c_str());
  return r;
}

}  // namespace wgllm

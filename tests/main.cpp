#include <gtest/gtest.h>

#include "test_shaders.h"
#include "test_util.h"

namespace wgllm::test {
namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

gpu::ContextOptions context_options() {
  return {.adapter = env("WGLLM_ADAPTER"),
          .extra_shaders = test_shaders(),
          .kernel_dir = env("WGLLM_KERNEL_DIR"),
          .dump_shaders_dir = env("WGLLM_DUMP_SHADERS"),
          .shader_checks = env("WGLLM_SHADER_CHECKS") == "1"};
}

gpu::Context& context() {
  static gpu::Context ctx(context_options());
  return ctx;
}

uint64_t seed() {
  static const uint64_t s = []() -> uint64_t {
    if (const char* env = std::getenv("WGLLM_TEST_SEED")) return std::stoull(env);
    return static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  }();
  return s;
}
}  // namespace wgllm::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Fresh random inputs every run; the seed is printed so a failure can be replayed.
  std::printf("random seed: %llu (WGLLM_TEST_SEED=... to replay)\n", (unsigned long long)wgllm::test::seed());
  return RUN_ALL_TESTS();
}

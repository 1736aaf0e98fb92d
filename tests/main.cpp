#include <gtest/gtest.h>

#include "test_util.h"

namespace wgllm::test {
gpu::Context& context() {
  static gpu::Context ctx({.adapter = std::getenv("WGLLM_ADAPTER") ? std::getenv("WGLLM_ADAPTER") : ""});
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

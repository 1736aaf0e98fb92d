// The tests' own shaders (tests/gpu/*.wgsl), embedded into the test binary and handed to its contexts.
#pragma once
#include <span>

#include "gpu/shaders.h"

namespace wgllm::test {

std::span<const gpu::EmbeddedShader> test_shaders();

}  // namespace wgllm::test

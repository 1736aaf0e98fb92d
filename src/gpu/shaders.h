// WGSL sources embedded into the binary at build time (cmake/embed_shaders.cmake).
#pragma once
#include <span>
#include <string_view>

namespace wgllm::gpu {

struct EmbeddedShader {
  std::string_view name;    // file name, e.g. "attention.wgsl"
  std::string_view source;  // WGSL text
};

// The library's kernels: every src/kernels/*.wgsl.
std::span<const EmbeddedShader> embedded_shaders();

// Source of the shader file `name`; throws wgllm::ShaderError when there is none.
std::string_view shader_source(std::string_view name);

}  // namespace wgllm::gpu

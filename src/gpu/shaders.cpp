#include "gpu/shaders.h"

#include <string>

#include "wgllm/error.h"

namespace wgllm::gpu {

std::string_view shader_source(std::string_view name) {
  for (const auto& s : embedded_shaders())
    if (s.name == name) return s.source;
  throw ShaderError("no embedded shader named '" + std::string(name) + "' (is it under src/kernels/?)");
}

}  // namespace wgllm::gpu

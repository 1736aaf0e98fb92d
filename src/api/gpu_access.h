// Beyond the library API, for the engine's own tools: the GPU context a loaded model runs on (wgllm bench
// --profile attaches a gpu::Profiler to it). Not part of include/wgllm/: the gpu:: types are internal.
#pragma once
#include "gpu/context.h"
#include "wgllm/wgllm.h"

namespace wgllm {

// The model's context; throws InvalidArgument for a model whose weights are not uploaded yet (before_upload).
gpu::Context& gpu_context(const Model& model);

}  // namespace wgllm

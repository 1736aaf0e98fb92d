// The tiny default model compiled into the library: models/default/shakespeare-tiny.gguf, a llama-architecture
// model trained on tiny Shakespeare by tools/train_default_model.py (see models/default/README.md).
#pragma once
#include <cstdint>
#include <span>

namespace wgllm {

// The GGUF file's bytes (32-byte aligned, valid for the whole program), e.g. for GgufFile::from_bytes.
std::span<const uint8_t> default_model_gguf();

}  // namespace wgllm

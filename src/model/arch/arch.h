// Layer programs: what a layer of each architecture uploads and which blocks (model/blocks.h) it runs, in what
// order. One file per architecture family under model/arch/, registered here: its program declared below and
// returned by layer_program for its Arch values. Everything else of the forward (the embedding, the logits, the
// session's buffers, steps and per-sequence state) is shared.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/transformer.h"
#include "wgllm/error.h"

namespace wgllm {

struct Uploader;
struct LayerStep;

struct LayerProgram {
  // Layer `layer`'s weights (blk.<layer>.*), uploaded through up in the order given (the progress callback's).
  GpuLayer (*upload)(Uploader& up, const ModelConfig& c, uint32_t layer);
  // The layer's dispatches for one step (s.n tokens at s.pos), added to s.batch.
  void (*encode)(const LayerStep& s);
};

extern const LayerProgram kLlamaLayers;     // arch/llama.cpp: llama, qwen2, qwen3
extern const LayerProgram kQwen3MoeLayers;  // arch/qwen3moe.cpp
extern const LayerProgram kGemma3Layers;  // arch/gemma3.cpp
extern const LayerProgram kLfm2Layers;    // arch/lfm2.cpp: lfm2, lfm2moe
extern const LayerProgram kGptOssLayers;  // arch/gpt_oss.cpp
extern const LayerProgram kQwen35Layers;  // arch/qwen35.cpp
extern const LayerProgram kGemma4Layers;  // arch/gemma4.cpp

inline const LayerProgram& layer_program(Arch arch) {
  switch (arch) {
    case Arch::Llama:
    case Arch::Qwen2:
    case Arch::Qwen3: return kLlamaLayers;
    case Arch::Qwen3Moe: return kQwen3MoeLayers;
    case Arch::Gemma3: return kGemma3Layers;
    case Arch::Lfm2:
    case Arch::Lfm2Moe: return kLfm2Layers;
    case Arch::GptOss: return kGptOssLayers;
    case Arch::Qwen35: return kQwen35Layers;
    case Arch::Gemma4: return kGemma4Layers;
  }
  throw ModelError("no layer program for architecture " + std::to_string(int(arch)));
}

}  // namespace wgllm

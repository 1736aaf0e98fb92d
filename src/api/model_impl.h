// What a Model holds (the GPU context, the weights, the tokenizer), for the library's own sources in src/api/:
// Model::Impl is private to them through ModelAccess. Not part of include/wgllm/.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gpu/context.h"
#include "model/transformer.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "wgllm/wgllm.h"

namespace wgllm {

struct Model::Impl {
  std::unique_ptr<gpu::Context> ctx;  // empty until the weights are uploaded (before_upload sees none)
  ModelConfig config;                 // parsed once, before the upload
  GpuModel gpu;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatFormat> chat;  // the file's template (or LoadOptions::chat_template), parsed once
  std::vector<int32_t> eog;        // end-of-generation ids
  ModelInfo info;
  uint32_t ubatch = 512;
  std::optional<uint32_t> layers_per_submit;
  std::optional<bool> choose_on_gpu;  // LoadOptions::choose_on_gpu

  const Tokenizer& tok() const {
    if (!tokenizer) throw ModelError("the model has no tokenizer (tokenizer.ggml.* metadata)");
    return *tokenizer;
  }
  const ChatFormat& chat_format() const {
    tok();
    return *chat;
  }
};

class ModelAccess {
 public:
  using Impl = Model::Impl;
  static Impl& impl(const Model& model) { return *model.impl_; }
};

// The model's GPU context; throws InvalidArgument for a model whose weights are not uploaded yet (before_upload).
gpu::Context& gpu_context(const Model& model);

}  // namespace wgllm

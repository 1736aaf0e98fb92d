// The library's side of wgllm/chat.h: a ChatRequest's JSON parsed into what the tokenizer's chat code renders.
#pragma once
#include "tokenizer/chat.h"
#include "wgllm/chat.h"

namespace wgllm {

// Throws InvalidArgument naming the field that is not JSON of its shape, or a date that is not YYYY-MM-DD.
ChatInput chat_input(const ChatRequest& r);

}  // namespace wgllm

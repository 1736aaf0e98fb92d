// Chat prompts: the few chat-template families in use, recognised from the GGUF's Jinja source and rendered
// exactly as their Jinja templates render.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace wgllm {

enum class ChatTemplate {
  Llama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (Meta Llama 3 Instruct)
  ChatML,  // <|im_start|>role\ncontent<|im_end|>\n (Qwen, SmolLM, ...)
  Llama2,  // [INST] ... [/INST] with <<SYS>> (Llama 2 chat; Mistral-style [INST] templates)
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Recognises a template by its markers; throws Error "unknown chat template (...)" otherwise.
ChatTemplate detect_chat_template(std::string_view jinja);

// A rendered chat prompt and where the messages' contents sit in it. Encode it with add_special = false,
// parse_special = true and plain = content: the template's own markers become control tokens (BOS is part of the
// text), while a control token's text typed into a message stays text (a user cannot forge a turn).
struct ChatPrompt {
  std::string text;
  std::vector<TextRange> content;
};

// The prompt; apply_chat_template gives its text alone.
// Llama3: bos_text before the first message, contents trimmed of surrounding whitespace.
// ChatML: no BOS, contents as given. Llama2: bos_text before every user turn, eos_text after every assistant
// turn, a leading system message folded into the first user turn, contents trimmed; roles must alternate
// user/assistant (InvalidArgument otherwise); add_generation_prompt changes nothing (the prompt ends in [/INST]).
ChatPrompt render_chat(ChatTemplate tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                       std::string_view bos_text, std::string_view eos_text = "");
std::string apply_chat_template(ChatTemplate tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                std::string_view bos_text, std::string_view eos_text = "");

}  // namespace wgllm
